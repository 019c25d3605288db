"""The cluster spec: the settings every process of a deployment must agree on, in etcd
(``spec``, docs/architecture.md §2).

Each process reads them from its own topology file, so two files can drift apart. The
control-plane leader publishes what its topology (and ladder) says, in its cycle
(``controlplane/core/decide.py``); a gateway reads it at start and refuses to serve
with a topology that disagrees, instead of counting prefixes the leader skips or
routing warmed prefixes to a cold replica, and watches it while it runs (a new leader
with another topology: it drains and exits for its supervisor to restart it).

What is in it: the regions, their zones and their DEGRADED thresholds (which the
control plane also hands each agent, in the answer to its reports); the ``prefixes``
settings that change a fingerprint, K or the replica a prompt goes to; and the
recovery pace in effect. What
is not: anything a process may set for itself (listen addresses, timeouts, export
interval and size), which stay local.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from pydantic import Field

from controlplane.kernel.codec import decode
from controlplane.kernel.config import DegradedWhen, Topology
from controlplane.kernel.keys import Keys
from controlplane.kernel.ladder.file import recovery_config
from controlplane.kernel.ladder.model import Ladder
from controlplane.kernel.model import Frozen
from controlplane.kernel.store.port import Store

SECTIONS = ("regions", "thresholds", "prefixes", "recovery")
NONE = "(none)"


class SpecRegion(Frozen):
    name: str
    zone: str
    # A spec published before thresholds lived in the topology has none.
    degraded_when: DegradedWhen = DegradedWhen()
    # A model pool's names (docs/models.md): gateways route a request's model by them.
    # Written only for pools, so a spec without any reads as before pools existed.
    models: tuple[str, ...] = Field((), exclude_if=lambda v: not v)


class SpecPrefixes(Frozen):
    """The ``prefixes`` settings that change a fingerprint, K or the replica a prompt
    goes to; not the export and catalog sizes, which only bound resources."""

    block_size: int
    chars_per_token: float
    level_tokens: int
    min_sessions: int
    routing_chars: int


class SpecRecovery(Frozen):
    step_percent: float
    step_interval_s: float


class ClusterSpec(Frozen):
    regions: tuple[SpecRegion, ...]
    prefixes: SpecPrefixes
    recovery: SpecRecovery


class SpecDisagreement(ValueError):
    """This process's topology disagrees with the cluster spec in etcd."""

    def __init__(self, key: str, problems: Sequence[str]) -> None:
        self.problems = tuple(problems)
        super().__init__(
            f"this topology disagrees with the cluster spec in etcd ({key}), which the "
            "control-plane leader published from its topology:\n"
            + "\n".join(f"  {p}" for p in problems)
            + "\nmake the topology files agree (a new leader publishes its own)"
        )


def cluster_spec(topology: Topology, ladder: Ladder | None = None) -> ClusterSpec:
    """What ``topology`` (with its degradation ladder, when it names one) says the
    deployment must agree on. With a ladder, its recovery pace is the one in effect."""
    recovery = topology.recovery if ladder is None else recovery_config(ladder, topology.recovery)
    p = topology.prefixes
    return ClusterSpec(
        regions=tuple(
            SpecRegion(
                name=r.name,
                zone=r.zone,
                degraded_when=r.degraded_when,
                models=pool.models if (pool := topology.pool_of(r.name)) else (),
            )
            for r in topology.regions
        ),
        prefixes=SpecPrefixes(
            block_size=p.block_size,
            chars_per_token=p.chars_per_token,
            level_tokens=p.level_tokens,
            min_sessions=p.min_sessions,
            routing_chars=p.routing_chars,
        ),
        recovery=SpecRecovery(
            step_percent=recovery.step_percent, step_interval_s=recovery.step_interval_s
        ),
    )


def _text(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def settings(spec: ClusterSpec | None, sections: Collection[str] = SECTIONS) -> dict[str, str]:
    """Each setting as the topology names it (``prefixes.min_sessions``) and its value
    as text; the regions as one setting, their order included (it is the topology's);
    each region's thresholds that are set (``regions.eu.degraded_when.queue_over``),
    under the section ``thresholds``."""
    if spec is None:
        return {}
    out: dict[str, str] = {}
    if "regions" in sections:
        out["regions"] = ", ".join(f"{r.name} (zone {r.zone})" for r in spec.regions)
        for r in spec.regions:
            if r.models:
                out[f"regions.{r.name}.models"] = ", ".join(r.models)
    if "thresholds" in sections:
        for r in spec.regions:
            for name, value in r.degraded_when.model_dump(exclude_none=True).items():
                out[f"regions.{r.name}.degraded_when.{name}"] = _text(value)
    for section in ("prefixes", "recovery"):
        if section in sections:
            for name, value in getattr(spec, section).model_dump().items():
                out[f"{section}.{name}"] = _text(value)
    return out


def changes(
    new: ClusterSpec | None, old: ClusterSpec | None, sections: Collection[str] = SECTIONS
) -> dict[str, tuple[str, str]]:
    """``setting -> (new, old)`` for each setting that differs; ``(none)`` where a
    spec is missing, or a threshold unset."""
    a, b = settings(new, sections), settings(old, sections)
    return {
        k: (a.get(k, NONE), b.get(k, NONE))
        for k in (*a, *(k for k in b if k not in a))
        if a.get(k) != b.get(k)
    }


def disagreements(
    local: ClusterSpec, published: ClusterSpec, sections: Collection[str] = SECTIONS
) -> list[str]:
    """One line per setting that differs, with both values; empty when they agree.
    ``sections``: the parts this process uses (a gateway has no recovery pace)."""
    return [
        f"{k}: this process's topology says {mine}, the cluster spec in etcd says {theirs}"
        for k, (mine, theirs) in changes(local, published, sections).items()
    ]


async def read_spec(store: Store, keys: Keys) -> tuple[ClusterSpec | None, int]:
    """The spec in etcd and its mod revision; (None, 0) when there is none. Raises
    CorruptValue when the value is not a spec."""
    kv = await store.get(keys.spec())
    if kv is None:
        return None, 0
    return decode(ClusterSpec, kv.value, kv.key), kv.mod_revision
