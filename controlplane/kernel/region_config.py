"""A region of the topology and the model pools it holds (docs/models.md).

A region without ``pools`` is one pool answering whatever model a request names, as
before pools existed. A region with ``pools`` holds one pool per served model (its
names: a base model and its adapters); each pool is a failover unit of its own, named
``<region>.<pool>`` (``Topology`` turns each into a ``RegionConfig`` of that name, so
the control plane judges, fails over and recovers pools as it does regions).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any, Self

from pydantic import Field, model_validator

from controlplane.kernel.capacity.bearing import CapacitySLO
from controlplane.kernel.model import Frozen
from controlplane.kernel.store.settings import HOST_PORT

REGION_NAME = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
# A model name as vLLM serves it (--served-model-name, a LoRA adapter's name): no
# whitespace; Hugging Face ids carry '/', '.', ':' and '-'.
MODEL_NAME = r"^[^\s]{1,256}$"
# What a region with pools derives and must not be given: each pool has its own.
POOL_OWNED = ("agent", "capacity_rps", "replicas")


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


class PoolConfig(Frozen):
    """One model's pool in a region: the names it answers, its agent and replicas, what
    it bears. Unset thresholds, SLO and factor of safety are the region's."""

    name: Annotated[
        str,
        Field(
            pattern=REGION_NAME,
            description="DNS-style pool name; pools of one name in several regions serve "
            "the same models and fail over to each other",
        ),
    ]
    models: Annotated[
        tuple[Annotated[str, Field(pattern=MODEL_NAME)], ...],
        Field(
            min_length=1,
            description="the model names the pool answers (a request's model): its base "
            "model and its LoRA adapters' names, as vLLM serves them",
        ),
    ]
    agent: Annotated[
        str, Field(pattern=HOST_PORT, description="host:port of the pool agent's gRPC server")
    ]
    capacity_rps: Annotated[
        float,
        Field(gt=0, description="the pool's safe throughput until a capacity probe measures it"),
    ]
    replicas: Annotated[
        tuple[str, ...],
        Field(description="base URLs of the pool's vLLM servers that gateways forward to"),
    ] = ()
    degraded_when: Annotated[
        DegradedWhen | None,
        Field(description="the pool's DEGRADED thresholds; unset: the region's"),
    ] = None
    slo: Annotated[
        CapacitySLO | None,
        Field(description="the SLA a capacity probe holds the pool to; unset: the region's"),
    ] = None
    factor_of_safety: Annotated[
        float | None,
        Field(ge=1, le=10, description="the pool's factor of safety; unset: the region's"),
    ] = None

    @model_validator(mode="after")
    def _replica_urls(self) -> Self:
        _check_urls(self.replicas)
        return self


def _check_urls(replicas: tuple[str, ...]) -> None:
    """Each replica is a base URL: http(s)://host[:port], no path."""
    bad = [u for u in replicas if not re.match(r"^https?://[^/\s]+$", u)]
    if bad:
        raise ValueError(f"replicas must be base URLs like http://host:8000, got {bad}")


class RegionConfig(Frozen):
    """One region: where its agent and vLLM servers are, its residency zone, what it
    bears, and where its traffic goes when it fails."""

    name: Annotated[str, Field(pattern=REGION_NAME, description="DNS-style region name")]
    zone: Annotated[
        str, Field(min_length=1, description="Residency zone; traffic never leaves it unforced")
    ]
    agent: Annotated[
        str,
        Field(
            pattern=HOST_PORT,
            description="host:port of the region agent's gRPC server (not given with "
            "pools: each pool has its own)",
        ),
    ]
    capacity_rps: Annotated[
        float,
        Field(
            gt=0,
            description="Safe throughput under SLO, after the factor of safety: what "
            "failovers plan on until a capacity probe measures the region, and again when "
            "that measurement is stale (not given with pools: each pool has its own)",
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
            "balancer) that gateways forward to (not given with pools: each pool's own)"
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

    pools: Annotated[
        tuple[PoolConfig, ...],
        Field(
            description="one pool per served model (docs/models.md); each its own agent, "
            "replicas and capacity, failed over on its own. Unset: the region is one pool "
            "answering whatever model a request names. With pools, the region's agent, "
            "capacity_rps and replicas are not given"
        ),
    ] = ()

    @model_validator(mode="before")
    @classmethod
    def _pooled(cls, data: Any) -> Any:
        """A region with pools takes its agent, capacity and replicas from them: given
        at the region too, they are refused (which would win?)."""
        if not isinstance(data, dict) or not data.get("pools"):
            return data
        given = [k for k in POOL_OWNED if k in data]
        if given:
            raise ValueError(
                f"a region with pools takes {', '.join(given)} from each pool: "
                "move them into regions[].pools[]"
            )
        # never used (the region is replaced by its pools' units): any valid value
        # does, so that a mistake in a pool is said once, at the pool
        pools = data["pools"] if isinstance(data["pools"], list | tuple) else ()
        agents = [p["agent"] for p in pools if isinstance(p, dict) and "agent" in p]
        rates = [p.get("capacity_rps") for p in pools if isinstance(p, dict)]
        numeric = [r for r in rates if isinstance(r, int | float) and r > 0]
        return {
            **data,
            "agent": agents[0] if agents and isinstance(agents[0], str) else "pooled:0",
            "capacity_rps": sum(numeric) or 1.0,
        }

    @model_validator(mode="after")
    def _replica_urls(self) -> Self:
        _check_urls(self.replicas)
        names = [p.name for p in self.pools]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"pool names must be unique in a region; repeated: {dupes}")
        models = [m for p in self.pools for m in p.models]
        twice = sorted({m for m in models if models.count(m) > 1})
        if twice:
            raise ValueError(f"a model is answered by one pool of a region; in several: {twice}")
        return self


@dataclass(frozen=True, slots=True)
class PoolUnit:
    """What a pool's failover unit is part of: its region (as the file names it), its
    pool's name (the family: pools of one name fail over to each other) and the
    model names it answers."""

    region: str
    pool: str
    models: tuple[str, ...]


def unit_name(region: str, pool: str) -> str:
    return f"{region}.{pool}"


def pool_units(
    regions: tuple[RegionConfig, ...],
) -> tuple[tuple[RegionConfig, ...], dict[str, PoolUnit]]:
    """The failover units of ``regions``: a region without pools as it is, each pool of
    the others as a region named ``<region>.<pool>`` with the pool's agent, capacity
    and replicas and, where the pool leaves them unset, the region's thresholds, SLO
    and factor of safety; its ``failover_to`` the named regions' pools of its name.
    Raises ValueError for a ``failover_to`` that leaves a unit no such pool, and for
    pools of one name that answer different models."""
    by_name = {r.name: r for r in regions}
    served: dict[str, tuple[str, ...]] = {}
    for r in regions:
        for p in r.pools:
            seen = served.setdefault(p.name, p.models)
            if set(seen) != set(p.models):
                raise ValueError(
                    f"pools named {p.name!r} answer different models ({sorted(seen)} and "
                    f"{sorted(p.models)} in region {r.name!r}): pools of one name fail over "
                    "to each other, so they must serve the same models"
                )
    units: list[RegionConfig] = []
    info: dict[str, PoolUnit] = {}
    for r in regions:
        if not r.pools:
            pooled = [t for t in r.failover_to if by_name[t].pools]
            if pooled:
                raise ValueError(
                    f"region {r.name!r} (no pools: any model) fails over to {pooled}, which "
                    "hold model pools: name regions without pools, or give it pools"
                )
            units.append(r)
            continue
        for p in r.pools:
            targets = tuple(
                unit_name(t, p.name)
                for t in r.failover_to
                if any(q.name == p.name for q in by_name[t].pools)
            )
            # none listed: the unit's targets would be its zone's (an empty failover_to);
            # refused where that would name a region the file left out
            elsewhere = [
                o.name
                for o in regions
                if o.name != r.name and o.zone == r.zone and any(q.name == p.name for q in o.pools)
            ]
            if r.failover_to and not targets and elsewhere:
                raise ValueError(
                    f"region {r.name!r}: failover_to {list(r.failover_to)} holds no pool "
                    f"{p.name!r}, but {elsewhere} of its zone do: name one of them"
                )
            name = unit_name(r.name, p.name)
            units.append(
                r.model_copy(
                    update={
                        "name": name,
                        "agent": p.agent,
                        "capacity_rps": p.capacity_rps,
                        "replicas": p.replicas,
                        "failover_to": targets,
                        "degraded_when": p.degraded_when or r.degraded_when,
                        "slo": p.slo or r.slo,
                        "factor_of_safety": p.factor_of_safety or r.factor_of_safety,
                        "pools": (),
                    }
                )
            )
            info[name] = PoolUnit(r.name, p.name, p.models)
    return tuple(units), info
