"""Topology and timing configuration, validated at load (docs/architecture.md §7.5);
the ``timing:`` section's model is ``kernel.timing``'s.

A bad file fails at start with one message per problem, each naming the field
(``regions[1].zone``) and what to do about it.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from pathlib import Path
from typing import Annotated, Self

import yaml
from pydantic import Field, ValidationError, model_validator

from controlplane.kernel.capacity.bearing import CapacitySLO
from controlplane.kernel.capacity.record import CapacityPolicy
from controlplane.kernel.model import Frozen
from controlplane.kernel.prefix.identity import FingerprintParams
from controlplane.kernel.security import SecurityConfig
from controlplane.kernel.store.settings import HOST_PORT, EtcdConfig
from controlplane.kernel.timing import TimingConfig

REGION_NAME = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"


class ConfigError(ValueError):
    """Invalid configuration; the message names each bad field and the fix."""


class DegradedWhen(Frozen):
    """A region's DEGRADED thresholds: its agent calls the region DEGRADED while any is
    exceeded (besides a replica down). Each unset one is not judged. They live in the
    topology so that every agent of a cluster judges by the same numbers; the control
    plane hands each agent its region's in the answer to every report."""

    queue_over: Annotated[
        int | None, Field(ge=0, description="waiting requests of all the region's replicas")
    ] = None
    # Over the window between two probes. The p99 (seconds) is read from vLLM's TTFT
    # histogram, so it is only as fine as its buckets (..., 0.5, 0.75, 1, 2.5 s); 2560 s
    # is its top finite one. The error rate: the share of API answers that are 5xx.
    ttft_p99_over_s: Annotated[
        float | None,
        Field(
            gt=0,
            lt=2560,
            description="first-token p99 in seconds between two probes, read from vLLM's "
            "TTFT histogram (so only as fine as its buckets)",
        ),
    ] = None
    error_rate_over: Annotated[
        float | None,
        Field(ge=0, lt=1, description="share of API answers that are 5xx between two probes"),
    ] = None

    def describe(self) -> str:
        """The thresholds as an operator reads them ("ttft p99 over 5s, error rate
        over 5%"); "none" when every one is unset."""
        parts = []
        if self.queue_over is not None:
            parts.append(f"queue over {self.queue_over}")
        if self.ttft_p99_over_s is not None:
            parts.append(f"ttft p99 over {self.ttft_p99_over_s:g}s")
        if self.error_rate_over is not None:
            parts.append(f"error rate over {self.error_rate_over * 100:g}%")
        return ", ".join(parts) or "none"


class RegionConfig(Frozen):
    """One region: where its agent and vLLM servers are, its residency zone, what it
    bears, and where its traffic goes when it fails."""

    name: Annotated[str, Field(pattern=REGION_NAME, description="DNS-style region name")]
    zone: Annotated[
        str, Field(min_length=1, description="Residency zone; traffic never leaves it unforced")
    ]
    agent: Annotated[
        str, Field(pattern=HOST_PORT, description="host:port of the region agent's gRPC server")
    ]
    capacity_rps: Annotated[
        float,
        Field(
            gt=0,
            description="Safe throughput under SLO, after the factor of safety: what "
            "failovers plan on until a capacity probe measures the region, and again when "
            "that measurement is stale",
        ),
    ]
    failover_to: Annotated[
        tuple[str, ...],
        Field(description="Preferred targets; empty means every region of the same zone"),
    ] = ()
    replicas: Annotated[
        tuple[str, ...],
        Field(
            description="Base URLs of the region's vLLM servers (or its regional load "
            "balancer) that gateways forward to"
        ),
    ] = ()
    degraded_when: Annotated[
        DegradedWhen,
        Field(description="the thresholds over which the region's agent calls it DEGRADED"),
    ] = DegradedWhen()
    # Bearing capacity (docs/capacity.md): the SLA a capacity probe holds the region to,
    # and the factor of safety its allowed load keeps under the measured ultimate one
    # (1.5 for a forgiving service, 3 for a critical one).
    slo: Annotated[
        CapacitySLO,
        Field(
            description="the SLA a capacity probe holds the region to (docs/capacity.md): "
            "first-token p99 in seconds, error share, and the probe's criteria"
        ),
    ] = CapacitySLO(ttft_p99_s=2.0)
    factor_of_safety: Annotated[
        float,
        Field(
            ge=1,
            le=10,
            description="allowed load = the measured ultimate load / this (1.5 for a "
            "forgiving service, 3 for a critical one)",
        ),
    ] = 2.0
    entry: Annotated[
        str | None,
        Field(
            pattern=HOST_PORT,
            description="host:port of the region's data-plane entry (its Envoy or gateway): "
            "where endpoint pickers of other regions send the sessions pinned here; "
            "unset: to its replicas directly",
        ),
    ] = None

    @model_validator(mode="after")
    def _replica_urls(self) -> Self:
        """Each replica is a base URL: http(s)://host[:port], no path."""
        bad = [u for u in self.replicas if not re.match(r"^https?://[^/\s]+$", u)]
        if bad:
            raise ValueError(f"replicas must be base URLs like http://host:8000, got {bad}")
        return self


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
    # TLS, tokens and limits (controlplane/SECURITY.md); None: security off.
    security: Annotated[
        SecurityConfig | None,
        Field(description="TLS, tokens, roles and limits (controlplane/SECURITY.md); unset: off"),
    ] = None

    @model_validator(mode="after")
    def _references(self) -> Self:
        """Region names are unique; failover_to names known regions, never its own."""
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
        return self

    def region(self, name: str) -> RegionConfig:
        for r in self.regions:
            if r.name == name:
                return r
        raise KeyError(name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.regions)


def describe_errors(err: ValidationError, tags: Collection[str] = ()) -> str:
    """One line per problem, naming the field as the file spells it (``regions[2].zone``).
    ``tags``: the tags of discriminated unions, which pydantic adds to the path."""
    lines = []
    for e in err.errors():
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
        return yaml.safe_load(text)
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
