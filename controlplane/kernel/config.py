"""Topology and timing configuration, validated at load (docs/architecture.md §7.5);
the ``timing:`` section's model is ``kernel.timing``'s.

A bad file fails at start with one message per problem, each naming the field
(``regions[1].zone``) and what to do about it.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Annotated, Self

import yaml
from pydantic import Field, PrivateAttr, ValidationError, model_validator

from controlplane.kernel.capacity.record import CapacityPolicy
from controlplane.kernel.model import Frozen
from controlplane.kernel.pool.cost import CostPolicy
from controlplane.kernel.pool.scale import ScalingPolicy
from controlplane.kernel.prefix.identity import FingerprintParams
from controlplane.kernel.region_config import REGION_NAME as REGION_NAME
from controlplane.kernel.region_config import DegradedWhen as DegradedWhen
from controlplane.kernel.region_config import PoolConfig as PoolConfig
from controlplane.kernel.region_config import PoolUnit, pool_units
from controlplane.kernel.region_config import RegionConfig as RegionConfig
from controlplane.kernel.security import SecurityConfig
from controlplane.kernel.store.settings import EtcdConfig
from controlplane.kernel.timing import TimingConfig


class ConfigError(ValueError):
    """Invalid configuration; the message names each bad field and the fix."""


class RecoveryConfig(Frozen):
    """Graduated recovery (docs/architecture.md §3). With a degradation ladder file, its
    ``recovery`` section and ``baseline`` set the pace and the guard
    (``ladder_file.recovery_config``)."""

    step_percent: Annotated[
        float, Field(gt=0, le=100, description="new-session weight moved home per step")
    ] = 10.0
    step_interval_s: Annotated[float, Field(ge=0, description="time between steps")] = 10.0
    # Traffic guard: during RECOVERED, a breach of any threshold below steps the home
    # weight back one increment and pauses until the signals are calm for one interval.
    # None: that signal is not guarded; the first-token guard needs a baseline (without a
    # ladder file: none, so only the error rate is guarded by default).
    guard_ttft_p99_over_baseline: Annotated[
        float | None,
        Field(
            gt=1,
            le=100,
            description="guard: a first-token p99 above this x the baseline steps the home "
            "weight back one increment and pauses; needs a baseline (the ladder file's, "
            "or baseline_ttft_p99_s)",
        ),
    ] = 1.5
    guard_error_rate_over: Annotated[
        float | None, Field(gt=0, lt=1, description="guard: the same for the 5xx share")
    ] = 0.02
    guard_auth_error_rate_over: Annotated[
        float | None, Field(gt=0, lt=1, description="guard: the same for the 401/403 share")
    ] = None
    guard_headroom_under: Annotated[
        float | None,
        Field(
            gt=0,
            lt=1,
            description="guard: the same when headroom (1 - load / capacity) falls under this",
        ),
    ] = None
    guard_queue_depth_over: Annotated[
        float | None, Field(gt=0, description="guard: the same for the region's waiting requests")
    ] = None
    baseline_ttft_p99_s: Annotated[
        float | None,
        Field(gt=0, le=60, description="the guard's first-token baseline when no ladder gives one"),
    ] = None
    baseline_per_region: Annotated[
        dict[str, Annotated[float, Field(gt=0, le=60)]],
        Field(description="the same baseline per region name, over baseline_ttft_p99_s"),
    ] = Field(default_factory=dict)
    # Before the first step, replay the region's own catalog (prefixes/<r>) on it, within
    # prewarm.budget_s: this share of its shared prefixes (1.0: as many as the budget and
    # its KV capacity allow; its replicas are idle then).
    prewarm: Annotated[
        bool,
        Field(
            description="before the first step, replay the region's own prefix catalog "
            "on it, within prewarm.budget_s"
        ),
    ] = True
    prewarm_top_fraction: Annotated[
        float,
        Field(
            gt=0,
            le=1,
            description="the share of its catalog to replay (1.0: as much as the budget "
            "and its KV capacity allow; its replicas are idle then)",
        ),
    ] = 1.0

    @property
    def steps(self) -> int:
        return max(1, round(100 / self.step_percent))

    def baseline_for(self, region: str) -> float | None:
        return self.baseline_per_region.get(region, self.baseline_ttft_p99_s)


class PrewarmConfig(Frozen):
    """What a failover replays on its targets before traffic moves (docs/architecture.md
    §4)."""

    budget_s: Annotated[
        float, Field(gt=0, le=600, description="time a failover's pre-warm may take")
    ] = 30.0
    top_fraction: Annotated[
        float,
        Field(gt=0, lt=1, description="share of the source's shared prefixes to replay"),
    ] = 0.01
    verify: Annotated[
        int, Field(ge=0, le=256, description="warmed prefixes re-sent to read vLLM's hits")
    ] = 8


class PrefixesConfig(Frozen):
    """Prefix counting and the leader's per-region catalog (docs/architecture.md §4). Gateways and
    the leader read this one section, so their fingerprints and K agree: the leader
    skips an export counted with other values."""

    block_size: Annotated[
        int, Field(ge=1, le=4096, description="vLLM's KV block size: 16 on GPU, 128 on CPU")
    ] = 16
    chars_per_token: Annotated[
        float, Field(gt=0.5, le=64, description="the character proxy's ratio (calibrated)")
    ] = 4.0
    level_tokens: Annotated[
        int, Field(ge=1, description="count a prompt every this many tokens")
    ] = 256
    min_sessions: Annotated[
        int, Field(ge=1, le=64, description="K: distinct sessions before a prefix may leave")
    ] = 3
    export_interval_s: Annotated[
        float,
        Field(
            gt=0,
            le=300,
            description="gateways write their export this often (on a lease of 3 x this)",
        ),
    ] = 10.0
    # etcd refuses requests over 1.5 MiB; leave room for the key and the txn around it.
    export_max_bytes: Annotated[
        int,
        Field(
            ge=4096,
            le=1_400_000,
            description="an export is cut to this, its lowest-ranked payloads first",
        ),
    ] = 512 * 1024
    aggregate_interval_s: Annotated[
        float,
        Field(gt=0, le=3600, description="the leader merges exports into catalogs this often"),
    ] = 10.0
    max_entries: Annotated[int, Field(ge=1, le=4096, description="catalog size per region")] = 256
    # Which replica of a region serves a prompt is a hash of its first routing_chars
    # characters; gateways route by it and agents pre-warm by it, so all use this value.
    routing_chars: Annotated[
        int,
        Field(
            ge=1,
            le=65536,
            description="prompt characters whose hash picks a region's replica: gateways "
            "route by it and agents pre-warm by it",
        ),
    ] = 256
    max_catalog_bytes: Annotated[
        int, Field(ge=4096, le=1_400_000, description="a catalog is cut to this")
    ] = 1024 * 1024
    sealed_payloads: Annotated[
        bool,
        Field(
            description="replay payloads leave gateways sealed with their zone's data key "
            "and are opened only by an agent of that zone (docs/residency.md): gateways "
            "refuse to start without --payload-keys and the leader keeps no payload in clear",
        ),
    ] = False
    replay_strip_headers: Annotated[
        tuple[str, ...],
        Field(
            max_length=64,
            description="request headers a replay never carries, besides Authorization, "
            "Proxy-Authorization, Cookie and X-Api-Key (any case): gateways keep the "
            "prompts they replay warm first without them; replays authenticate with the "
            "data plane's own key (vLLM's --api-key), never a user's",
        ),
    ] = ()

    @model_validator(mode="after")
    def _levels(self) -> Self:
        """level_tokens is a multiple of block_size: a prefix is counted at whole blocks."""
        if self.level_tokens % self.block_size:
            raise ValueError(
                f"level_tokens ({self.level_tokens}) must be a multiple of block_size "
                f"({self.block_size}): a prefix is counted at whole blocks"
            )
        return self

    @property
    def params(self) -> FingerprintParams:
        return FingerprintParams(
            block_size=self.block_size,
            chars_per_token=self.chars_per_token,
            level_tokens=self.level_tokens,
        )


class Topology(Frozen):
    """The topology file: one per deployment, read by the control plane and the
    gateways (and by the agents and the drill service for their etcd settings)."""

    cluster: Annotated[
        str,
        Field(pattern=REGION_NAME, description="deployment name; etcd prefix /tectonic/<cluster>/"),
    ] = "default"
    etcd: Annotated[EtcdConfig, Field(description="how to reach etcd")] = EtcdConfig()
    regions: Annotated[
        tuple[RegionConfig, ...], Field(min_length=1, description="the regions, one entry each")
    ]
    timing: Annotated[
        TimingConfig, Field(description="health, reconcile loop and leadership timing")
    ] = TimingConfig()
    recovery: Annotated[
        RecoveryConfig,
        Field(
            description="graduated recovery; with a ladder file, its recovery: section "
            "sets the pace instead"
        ),
    ] = RecoveryConfig()
    prewarm: Annotated[PrewarmConfig, Field(description="the pre-warm of failover targets")] = (
        PrewarmConfig()
    )
    # The degradation ladder file (runbooks/degradation.yaml), relative to the topology
    # file; None: no ladder, degraded regions keep every feature.
    degradation_ladder: Annotated[
        str | None,
        Field(
            description="the ladder file (runbooks/degradation.yaml), relative to the "
            "topology file; the leader walks it for DEGRADED regions and short failover "
            "targets (format: runbooks/README.md). Unset: no ladder, degraded regions "
            "keep every feature"
        ),
    ] = None
    prefixes: Annotated[
        PrefixesConfig,
        Field(description="prefix counting and the per-region catalogs of pre-warm"),
    ] = PrefixesConfig()
    capacity: Annotated[
        CapacityPolicy,
        Field(
            description="when a capacity probe's measurement may be used (older than "
            "max_age_s it is stale: the typed capacity_rps is used, and alerted), and the "
            "capacity-utilisation (CBU) thresholds of status, alerts and the ladder "
            "(docs/capacity.md)"
        ),
    ] = CapacityPolicy()
    # The leader's scaler (docs/scaling.md); None: it sizes no pool.
    scaling: Annotated[
        ScalingPolicy | None,
        Field(
            description="the leader sizes each pool ahead of its forecast load "
            "(docs/scaling.md); unset: off, a pool keeps the size its agent's pool file gives"
        ),
    ] = None
    # What pools cost and may spend (docs/scaling.md, "Cost"); None: no budget binds.
    cost: Annotated[
        CostPolicy | None,
        Field(
            description="prices per replica-hour and budgets per pool, zone and fleet that "
            'the scaler keeps to (docs/scaling.md, "Cost"); unset: nothing priced'
        ),
    ] = None
    # TLS, tokens and limits (controlplane/SECURITY.md); None: security off.
    security: Annotated[
        SecurityConfig | None,
        Field(description="TLS, tokens, roles and limits (controlplane/SECURITY.md); unset: off"),
    ] = None

    # Each pool's failover unit (docs/models.md): what it is part of, by unit name.
    _pools: dict[str, PoolUnit] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _references(self) -> Self:
        """Region names are unique; failover_to names known regions, never its own.
        Then a region with pools is replaced by its pools' failover units; cost: names
        only those units and the regions' zones."""
        names = [r.name for r in self.regions]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"region names must be unique; repeated: {dupes}")
        for r in self.regions:
            unknown = [t for t in r.failover_to if t not in names]
            if unknown:
                raise ValueError(
                    f"region {r.name!r}: failover_to names unknown regions {unknown}; "
                    f"known regions are {names}"
                )
            if r.name in r.failover_to:
                raise ValueError(f"region {r.name!r}: failover_to must not list itself")
        if any(r.pools for r in self.regions):
            units, self._pools = pool_units(self.regions)
            # the model is frozen to its users; this is its own validation finishing
            object.__setattr__(self, "regions", units)
        if self.cost is not None:
            self.cost.check_names(
                tuple(r.name for r in self.regions), tuple({r.zone for r in self.regions})
            )
        return self

    def region(self, name: str) -> RegionConfig:
        """A failover unit by name: a region without pools, or ``<region>.<pool>``."""
        try:
            return self._index()[1][name]
        except KeyError:
            raise KeyError(name) from None

    @property
    def names(self) -> tuple[str, ...]:
        """The failover units' names: regions without pools and each pool's unit."""
        return self._index()[2]

    def _index(self) -> tuple[tuple[RegionConfig, ...], dict[str, RegionConfig], tuple[str, ...]]:
        """The units by name and their names, built once per ``regions`` tuple: a tick
        and every ReportHealth look units up, and a scan was O(units) each (issue 35).
        Kept in ``__dict__`` (not a field: dumps, equality and hashing skip it) and
        keyed by the tuple's identity, so a ``model_copy`` with other regions rebuilds."""
        cached = self.__dict__.get("_unit_index")
        if cached is None or cached[0] is not self.regions:
            by_name = {r.name: r for r in self.regions}
            cached = (self.regions, by_name, tuple(by_name))
            self.__dict__["_unit_index"] = cached
        return cached

    @property
    def pooled(self) -> bool:
        return bool(self._pools)

    def pool_of(self, unit: str) -> PoolUnit | None:
        """What the unit ``unit`` is a pool of; None for a region without pools."""
        return self._pools.get(unit)

    def family(self, unit: str) -> str:
        """The pool's name of ``unit`` ("" for a region without pools): units fail over
        only to units of their family, which serve the same models."""
        pool = self._pools.get(unit)
        return pool.pool if pool else ""

    def site(self, unit: str) -> str:
        """The region ``unit`` belongs to, as the topology file names it."""
        pool = self._pools.get(unit)
        return pool.region if pool else unit

    @property
    def sites(self) -> tuple[str, ...]:
        """The regions as the topology file names them, in its order."""
        return tuple(dict.fromkeys(self.site(r.name) for r in self.regions))

    def units_of(self, site: str) -> tuple[str, ...]:
        """The failover units of the region ``site``: itself without pools, else its pools'."""
        return tuple(r.name for r in self.regions if self.site(r.name) == site)

    def unit_for(self, site: str, model: str) -> str | None:
        """The unit of region ``site`` that answers ``model``: the region itself when it
        has no pools (it answers whatever a request names), else the pool listing the
        model; None when no pool of it does."""
        for unit in self.units_of(site):
            pool = self._pools.get(unit)
            if pool is None or model in pool.models:
                return unit
        return None

    def pool_models(self) -> dict[str, str]:
        """Each pool's unit -> its base model (its first name), the ``model`` label of its
        series; empty without pools."""
        return {unit: pool.models[0] for unit, pool in self._pools.items()}

    def spill_groups(self) -> dict[str, str]:
        """Unit -> where a request may spill when its unit answers nothing: its zone,
        and for a pool its family too (another region's pool of the same models)."""
        return {
            r.name: f"{r.zone}/{f}" if (f := self.family(r.name)) else r.zone for r in self.regions
        }

    def families(self) -> dict[str, tuple[str, ...]]:
        """Each family (a pool's name; "" for the regions without pools) and its units,
        in the topology's order."""
        out: dict[str, list[str]] = {}
        for r in self.regions:
            out.setdefault(self.family(r.name), []).append(r.name)
        return {f: tuple(units) for f, units in out.items()}

    def family_of_model(self, model: str) -> str | None:
        """The family that answers ``model``: the pools listing it, else the regions
        without pools (they answer whatever a request names); None: nothing does."""
        for pool in self._pools.values():
            if model in pool.models:
                return pool.pool
        return "" if any(r.name not in self._pools for r in self.regions) else None

    def models_of(self, site: str) -> tuple[str, ...] | None:
        """The model names the region ``site`` answers; None for a region without pools
        (whatever its replicas serve)."""
        units = self.units_of(site)
        pools = [self._pools[u] for u in units if u in self._pools]
        if len(pools) < len(units):
            return None
        return tuple(m for p in pools for m in p.models)


def describe_errors(err: ValidationError, tags: Collection[str] = ()) -> str:
    """One line per problem, naming the field as the file spells it (``regions[2].zone``).
    ``tags``: the tags of discriminated unions, which pydantic adds to the path."""
    lines = []
    errors = err.errors()
    # a list whose items all failed also reports being too short: said by its items
    failed = {e["loc"] for e in errors}
    for e in errors:
        if e["type"] == "too_short" and any(
            loc[: len(e["loc"])] == e["loc"] and len(loc) > len(e["loc"]) for loc in failed
        ):
            continue
        loc = ""
        for part in e["loc"]:
            if part in tags:
                continue
            loc += f"[{part}]" if isinstance(part, int) else (f".{part}" if loc else str(part))
        msg = e["msg"].removeprefix("Value error, ")
        lines.append(f"  {loc or '(top level)'}: {msg}")
    return "\n".join(lines)


def parse_topology(data: object, source: str = "<topology>") -> Topology:
    try:
        return Topology.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"{source} is invalid:\n{describe_errors(e)}") from None


_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_yaml(path: str | Path, what: str) -> object:
    """A YAML file's data; ConfigError saying which ``what`` file could not be read or
    parsed, and why."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read {what} {p}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{p} is not UTF-8 text (byte {e.start}): is it a {what}?") from None
    try:
        # libyaml's parser where PyYAML was built with it: 7x faster on a 512-region
        # topology (150 ms -> 21 ms), what every gateway and replica loads at start
        return yaml.load(text, Loader=_SAFE_LOADER)
    except yaml.YAMLError as e:
        raise ConfigError(f"{p} is not valid YAML: {e}") from None
    except RecursionError:
        raise ConfigError(f"{p} is not valid YAML: nested too deeply") from None
    except (ValueError, TypeError, AttributeError, IndexError) as e:
        # PyYAML's constructors let these out for values it cannot build, e.g. the date
        # 2026-02-30 or an empty ``!!int``: a mistake in the file all the same.
        raise ConfigError(
            f"{p} is not valid YAML: a value cannot be read ({e}); quote it if it is text"
        ) from None


def load_etcd(path: str | Path) -> EtcdConfig | None:
    """The ``etcd:`` section of a YAML file (a topology file works): endpoints, TLS and
    users, for processes that reach etcd without the whole topology; None without one."""
    data = read_yaml(path, "etcd settings file")
    if not isinstance(data, dict) or data.get("etcd") is None:
        return None
    try:
        return EtcdConfig.model_validate(data["etcd"])
    except ValidationError as e:
        raise ConfigError(f"{path} is invalid:\n{describe_errors(e)}") from None


def load_topology(path: str | Path) -> Topology:
    return parse_topology(read_yaml(path, "topology file"), str(path))
