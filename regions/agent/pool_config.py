"""The region agent's ``--pool-config`` file (and ``--pool-launcher``): what its warm
pool runs, validated before anything starts; and where the agent's replicas come from
(static ``--replica``, a pool, or ``--discovery kubernetes``: exactly one). The running
pool is :mod:`regions.agent.warm_pool`.

The file (every field but ``launcher`` is optional; see regions/pool/README.md)::

    launcher: {kind: simulator, model: tiny, block_size: 16}   # | vllm | static | kubernetes
    # kind kubernetes: {workload: deployment/NAME (or statefulset/NAME), ready_timeout_s,
    # stop_timeout_s, pod_labels: true}: the pods of that workload, found by the agent's
    # --discovery kubernetes (regions/kube/launcher.py); --pool-launcher kubernetes
    # --kube-workload deployment/NAME says the same on the command line
    # launcher.speculative_config: vLLM's --speculative-config (simulator, vllm); with it
    # the agent follows degradation/<region>'s speculative_decoding flag by rolling the
    # pool between replicas with and without it (regions/agent/spec_decode_actuator.py)
    active: 1            # replicas awake and routed
    warm: 1              # replicas asleep, ready to wake
    size: 3              # managed slots (default active + warm); extras stay COLD
    dwell: {warm_min_s: 300, idle_min_s: 1800, active_min_s: 120}
    burst: {burst_rps: 100, replica_rps: 30, cold_start_s: 120, activation_s: 8,
            budget_s: 30}  # only for the sizing report logged at start
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    Field,
    JsonValue,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from controlplane.kernel.config import (
    REGION_NAME,
    ConfigError,
    describe_errors,
    read_yaml,
)
from controlplane.kernel.model import Frozen
from controlplane.kernel.pool.sizing import BurstProfile
from controlplane.kernel.store.settings import HOST_PORT
from regions.pool.launchers import (
    Launcher,
    SimulatorLauncher,
    StaticEndpoints,
    VllmLauncher,
    VllmSpec,
    check_speculative_config,
)
from regions.pool.states import DwellPolicy, PoolConfig

_URL = re.compile(r"^https?://[^/\s]+$")


class SimulatorLauncherConfig(Frozen):
    """``python -m regions.simulator`` processes (tests, demo)."""

    kind: Literal["simulator"]
    model: str = "tiny"
    block_size: int = Field(16, ge=1)
    extra_args: tuple[str, ...] = ()
    ready_timeout_s: float = Field(20.0, gt=0)
    speculative_config: dict[str, JsonValue] | None = None  # as vLLM's, see VllmSpec

    @field_validator("speculative_config")
    @classmethod
    def _speculative(cls, config: dict[str, JsonValue] | None) -> dict[str, JsonValue] | None:
        return check_speculative_config(config)

    def build(self) -> Launcher:
        return SimulatorLauncher(
            model=self.model,
            block_size=self.block_size,
            extra_args=self.extra_args,
            ready_timeout_s=self.ready_timeout_s,
            speculative_config=self.speculative_config,
        )


class VllmLauncherConfig(VllmSpec):
    """Real vLLM servers: every :class:`VllmSpec` field, plus ``kind``."""

    kind: Literal["vllm"]

    def build(self) -> Launcher:
        return VllmLauncher(VllmSpec.model_validate(self.model_dump(exclude={"kind"})))


class StaticLauncherConfig(Frozen):
    """Replicas someone else runs: woken, slept and routed, never started or stopped."""

    kind: Literal["static"]
    urls: tuple[str, ...] = Field((), validate_default=True)  # so that none says why

    @field_validator("urls")
    @classmethod
    def _urls(cls, urls: tuple[str, ...]) -> tuple[str, ...]:
        if not urls:
            raise ValueError(
                "a static pool needs urls: the base URLs of the replicas "
                "it wakes and sleeps, e.g. [http://10.0.0.5:8000]"
            )
        bad = [u for u in urls if not _URL.match(u.rstrip("/"))]
        if bad:
            raise ValueError(f"urls must be base URLs like http://host:8000, got {bad}")
        if len({u.rstrip("/") for u in urls}) != len(urls):
            raise ValueError(f"urls must be distinct, got {list(urls)}")
        return urls

    def build(self) -> Launcher:
        return StaticEndpoints(self.urls)


class KubernetesLauncherConfig(Frozen):
    """The pods of a Deployment or StatefulSet (regions/kube/launcher.py): the agent
    builds it with its ``--discovery kubernetes``, which finds them."""

    kind: Literal["kubernetes"]
    workload: str  # deployment/NAME or statefulset/NAME, in --kube-namespace
    ready_timeout_s: float = Field(900.0, gt=0)  # scheduling, image pull, model load
    stop_timeout_s: float = Field(120.0, gt=0)
    pod_labels: bool = True  # tectonic.io/pool-state=active|warm|idle on each pod
    # advisory: Tectonic scales nothing itself; it publishes its desired replicas for an
    # HPA or KEDA to act on (docs/scaling.md)
    advisory: bool = False

    @field_validator("workload")
    @classmethod
    def _workload(cls, workload: str) -> str:
        from regions.kube.workload import Workload  # pure; the client loads only when used

        Workload.parse(workload, "default")
        return workload

    def build(self) -> Launcher:
        raise ConfigError(
            "a kubernetes launcher finds its pods through the agent's EndpointSlice "
            "discovery: run the agent with --discovery kubernetes --kube-namespace NS "
            "--kube-service SVC"
        )


LauncherConfig = Annotated[
    SimulatorLauncherConfig | VllmLauncherConfig | StaticLauncherConfig | KubernetesLauncherConfig,
    Field(discriminator="kind"),
]


class AgentPoolConfig(Frozen):
    """The ``--pool-config`` file. Field order matters: validators read earlier fields."""

    active: int = Field(1, ge=0)
    warm: int = Field(1, ge=0)
    size: int | None = Field(None, ge=0)
    launcher: LauncherConfig
    dwell: DwellPolicy = DwellPolicy()
    burst: BurstProfile | None = None  # for the sizing report logged at start
    reconcile_interval_s: float | None = Field(None, gt=0)  # None: the agent's interval
    dead_after: int = Field(2, ge=1)  # failed probes in a row before a replica is COLD
    probe_timeout_s: float = Field(2.0, gt=0)
    request_timeout_s: float = Field(30.0, gt=0)  # sleep / wake: a GPU wake reloads weights

    @field_validator("size")
    @classmethod
    def _size(cls, size: int | None, info: ValidationInfo) -> int | None:
        active, warm = info.data.get("active"), info.data.get("warm")
        if size is not None and active is not None and warm is not None and size < active + warm:
            raise ValueError(
                f"size {size} < active {active} + warm {warm}: the pool cannot hold its own targets"
            )
        return size

    @field_validator("launcher")
    @classmethod
    def _static_fits(cls, launcher: LauncherConfig, info: ValidationInfo) -> LauncherConfig:
        if not isinstance(launcher, StaticLauncherConfig):
            return launcher
        n, size = len(launcher.urls), info.data.get("size")
        active, warm = info.data.get("active", 0), info.data.get("warm", 0)
        if n < active + warm:
            raise ValueError(f"{n} static url(s) cannot hold active {active} + warm {warm}")
        if size is not None and size != n:
            raise ValueError(
                f"size {size} != {n} static urls: a static pool's size is its "
                "url count (leave size out)"
            )
        return launcher

    @field_validator("launcher")
    @classmethod
    def _slot_to_roll(cls, launcher: LauncherConfig, info: ValidationInfo) -> LauncherConfig:
        """Switching speculative decoding replaces replicas one at a time, each
        replacement up and ACTIVE before an old one leaves: that needs a slot beyond
        the ACTIVE target."""
        if not isinstance(launcher, SimulatorLauncherConfig | VllmLauncherConfig):
            return launcher  # no variants to roll between
        if not launcher.speculative_config:
            return launcher
        active, warm, size = (info.data.get(k) for k in ("active", "warm", "size"))
        if active is None or warm is None:
            return launcher  # reported on its own field
        slots = active + warm if size is None else size
        if slots < active + 1:
            raise ValueError(
                f"with speculative_config the pool needs a slot beyond its {active} ACTIVE "
                f"to roll replicas between the variants (has {slots}): give warm >= 1 or "
                f"size >= {active + 1}"
            )
        return launcher

    def pool_config(self) -> PoolConfig:
        return PoolConfig(active=self.active, warm=self.warm, size=self.size, dwell=self.dwell)


def parse_pool_config(data: object, source: str = "<pool config>") -> AgentPoolConfig:
    try:
        return AgentPoolConfig.model_validate(data)
    except ValidationError as e:
        # the union's tags (launcher.static.urls)
        launchers = ("simulator", "vllm", "static", "kubernetes")
        raise ConfigError(f"{source} is invalid:\n{describe_errors(e, launchers)}") from None


def load_pool_config(
    path: str | Path | None, launcher: dict[str, object] | None = None
) -> AgentPoolConfig:
    """The ``--pool-config`` file; ``launcher`` (``--pool-launcher``) supplies the file's
    ``launcher:``, which it must then leave out. No file: the defaults and ``launcher``."""
    if path is None:
        if launcher is None:
            raise ConfigError("a pool needs --pool-config FILE or --pool-launcher")
        return parse_pool_config({"launcher": launcher}, "--pool-launcher")
    data = read_yaml(path, "pool config")
    if launcher is not None:
        if not isinstance(data, dict):
            return parse_pool_config(data, str(path))  # says what the file should be
        if "launcher" in data:
            raise ConfigError(
                f"{path} has a launcher: and --pool-launcher gives one too: keep one of them"
            )
        data = {**data, "launcher": launcher}
    return parse_pool_config(data, str(path))


def check_replica_source(
    replicas: Sequence[str],
    pool: AgentPoolConfig | None,
    etcd: Sequence[str],
    cluster: str | None,
    *,
    discovery: bool = False,
) -> None:
    """The agent's replicas come from exactly one place; a pool must be publishable.
    ``discovery``: a Service's EndpointSlices (``--discovery kubernetes``), alone or
    feeding a pool of kind kubernetes."""
    if replicas and pool is not None:
        raise ValueError(
            "give either static replicas (--replica) or a pool (--pool-config), not both"
        )
    if replicas and discovery:
        raise ValueError(
            "give either static replicas (--replica) or --discovery kubernetes, not both"
        )
    kube_pool = pool is not None and isinstance(pool.launcher, KubernetesLauncherConfig)
    if kube_pool and not discovery:
        raise ValueError(
            "a pool of kind kubernetes finds its pods through --discovery kubernetes "
            "(with --kube-namespace and --kube-service)"
        )
    if pool is not None and discovery and not kube_pool:
        raise ValueError(
            "--discovery kubernetes with a pool needs the pool's launcher to be kind "
            "kubernetes (--pool-launcher kubernetes --kube-workload deployment/NAME): "
            f"a {pool.launcher.kind} pool would not use what it discovers"
        )
    if not replicas and pool is None and not discovery:
        raise ValueError(
            "no replicas: give --replica URL (repeatable), --pool-config FILE or "
            "--discovery kubernetes"
        )
    if pool is None:
        if etcd or cluster:
            raise ValueError(
                "--etcd/--cluster only serve to publish a pool: give "
                "--pool-config (or --pool-launcher), or leave them out"
            )
        return
    if not etcd or not cluster:
        raise ValueError(
            "a pool needs --etcd and --cluster: gateways learn its ACTIVE "
            "replicas from pools/<region> in etcd, and route to sleeping "
            "replicas without it"
        )
    if bad := [e for e in etcd if not re.match(HOST_PORT, e)]:
        raise ValueError(f"etcd endpoints must be host:port, got {bad}")
    if not re.match(REGION_NAME, cluster):
        raise ValueError(f"cluster {cluster!r} is not a valid name (the topology's cluster)")
