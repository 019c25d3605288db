"""The region agent's warm pool: its config file, and publishing it to ``pools/<region>``.

``tectonic-agent --pool-config pool.yaml --etcd HOST:PORT --cluster NAME`` (instead of
``--replica``) makes the agent run a :class:`~regions.pool.manager.WarmPool`: it starts
the pool before serving, probes the pool's ACTIVE replicas each tick, reconciles the
pool in a loop of its own (a launch takes minutes and must never hold up probing),
serves it as the ``ReplicaSet`` that ``RegionAgent.Prewarm`` wakes, and publishes
:class:`~controlplane.kernel.pool.members.PoolMembers` to ``pools/<region>`` so that
gateways route only to ACTIVE replicas (a WARM one sleeps and would hang requests).

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

Publication is a plain put (no lease: the replicas outlive the agent), at start and
whenever the ACTIVE set, the WARM count or the loans' answers change, from a background
task that retries with backoff while etcd is unreachable.

Loans: the agent follows ``pool-loans/<region>/`` (:mod:`regions.agent.pool_lender`) and
lends WARM standby out of rotation to a borrower such as the capacity probe; what is lent
and what is refused go into ``pools/<region>`` (``lent``, ``loan_refusals``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    Field,
    JsonValue,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from controlplane.kernel.codec import encode
from controlplane.kernel.config import (
    REGION_NAME,
    ConfigError,
    describe_errors,
    read_yaml,
)
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import Frozen
from controlplane.kernel.pool.members import PoolMembers
from controlplane.kernel.store.etcd import EtcdStore
from controlplane.kernel.store.port import Store, StoreError
from controlplane.kernel.store.settings import HOST_PORT, EtcdConfig
from regions.agent.pool_lender import PoolLender
from regions.agent.spec_decode_actuator import SpecDecodeActuator
from regions.pool.client import ReplicaError
from regions.pool.launchers import (
    Launcher,
    SimulatorLauncher,
    StaticEndpoints,
    VllmLauncher,
    VllmSpec,
    check_speculative_config,
)
from regions.pool.manager import OnActivation, OnState, PoolSnapshot, WarmPool
from regions.pool.sizing import BurstProfile
from regions.pool.states import DwellPolicy, PoolConfig

log = logging.getLogger("tectonic.agent.pool")
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


class AgentPool:
    """One agent's warm pool and its publication. ``start`` before serving, ``run`` as a
    supervised task, ``stop`` last."""

    def __init__(
        self,
        region: str,
        config: AgentPoolConfig,
        *,
        etcd: Sequence[str],
        cluster: str,
        interval_s: float,
        store: Store | None = None,
        etcd_timeout_s: float = 2.0,
        etcd_settings: EtcdConfig | None = None,
        retry_s: float = 0.2,
        max_retry_s: float = 5.0,
        wall_clock: Callable[[], float] = time.time,
        on_activation: OnActivation | None = None,  # the agent's metrics
        launcher: Launcher | None = None,  # instead of the config's (kubernetes: the agent's)
        on_state: OnState | None = None,  # every state change (the pod labels)
        outlives_agent: bool = False,  # stop() leaves the replicas running
    ) -> None:
        self.region, self.config = region, config
        self.launcher = launcher or config.launcher.build()
        self.outlives_agent = outlives_agent
        self.pool = WarmPool(
            self.launcher,
            config.pool_config(),
            burst=config.burst,
            on_change=self._changed,
            on_activation=on_activation,
            on_state=on_state,
            dead_after=config.dead_after,
            probe_timeout_s=config.probe_timeout_s,
            request_timeout_s=config.request_timeout_s,
        )
        # TLS / users from etcd_settings; the endpoints are the agent's --etcd
        settings = (etcd_settings or EtcdConfig()).model_copy(
            update={"endpoints": tuple(etcd), "request_timeout_s": etcd_timeout_s}
        )
        self.store: Store = store or EtcdStore(settings)
        self._own_store = store is None
        keys = Keys(cluster)
        self.key = keys.pool(region)
        self.agent_id = f"agent:{region}"
        self.published: PoolMembers | None = None  # the last value etcd took
        self.interval_s = config.reconcile_interval_s or interval_s
        self._retry = (retry_s, max_retry_s)
        self._wall_clock = wall_clock
        self._dirty = asyncio.Event()  # something to publish; the publisher waits on it
        self._kick = asyncio.Event()  # reconcile now (a new variant to roll to)
        # Degradation step 1 acts here, with a launcher that has a speculative_config.
        self.spec_decode: SpecDecodeActuator | None = None
        if self.launcher.variants:
            self.spec_decode = SpecDecodeActuator(
                region,
                self.pool,
                self.store,
                keys,
                interval_s=self.interval_s,
                on_switch=self._kick.set,
                retry_s=retry_s,
            )
        # Loans of WARM standby out of rotation (the capacity probe's replica).
        self.lender = PoolLender(
            region, self.pool, self.store, keys, interval_s=self.interval_s, retry_s=retry_s
        )

    # -- what the agent calls ----------------------------------------------------------
    async def start(self, agent_id: str) -> None:
        """Launch / adopt the replicas and wake ``active`` of them (before serving)."""
        self.agent_id = agent_id
        size = self.pool.snapshot().size
        if size is not None and not size.too_small and size.feasible:
            log.info("warm pool of %s sized for its burst: %s", self.region, size.reason)
        # (a pool too small for its burst is logged as a warning by WarmPool.start)
        if self.spec_decode is not None:  # launch what the ladder wants, not roll to it
            await self.spec_decode.prime()
        await self.pool.start()
        self._dirty.set()  # publish at start, whether or not the ACTIVE set changed
        snap = self.pool.snapshot()
        log.info(
            "warm pool of %s started: ACTIVE %s, %d WARM%s; publishing to %s",
            self.region,
            ", ".join(self.pool.active()) or "(none)",
            self.pool.warm_count(),
            "".join(f"; {n}" for n in snap.notes),
            self.key,
        )

    def active(self) -> list[str]:
        return self.pool.active()

    def signals(self) -> dict[str, float]:
        """``replicas_warm``: activatable without a launch; ``pool_shortfall``: ACTIVE
        replicas the pool wants and cannot reach yet."""
        signals = {
            "replicas_warm": float(self.pool.warm_count()),
            "pool_shortfall": float(self.pool.snapshot().shortfall),
        }
        if self.spec_decode is not None:
            signals |= self.spec_decode.signals()
        return signals

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._reconcile_loop(), name=f"pool:{self.region}")
            tg.create_task(self._publish_loop(), name=f"pool-publish:{self.region}")
            tg.create_task(self.lender.run(), name=f"pool-lender:{self.region}")
            if self.spec_decode is not None:
                tg.create_task(self.spec_decode.run(), name=f"spec-decode:{self.region}")

    async def stop(self, publish_timeout_s: float = 2.0) -> None:
        """Stop the pool; managed replicas are gone after it, so publish that (bounded:
        a dead etcd must not hold up shutdown). Static ones keep their entry, and so do
        replicas that outlive the agent (a kubernetes pool's pods, left running)."""
        await self.pool.stop()
        gone = self.launcher.managed and not self.outlives_agent
        if gone and self.published is not None:
            try:
                async with asyncio.timeout(publish_timeout_s):
                    await self._publish()
            except (StoreError, TimeoutError) as e:
                log.warning("could not publish the stopped pool to %s: %s", self.key, e)
        if self._own_store:
            await self.store.close()

    # -- loops -------------------------------------------------------------------------
    def _changed(self, snapshot: PoolSnapshot) -> None:
        self._dirty.set()  # called inside the pool: only flag it, the publisher writes

    def members(self) -> PoolMembers:
        return PoolMembers(
            region=self.region,
            active=tuple(self.pool.active()),
            warm=self.pool.warm_count(),
            at=self._wall_clock(),
            agent=self.agent_id,
            lent=self.pool.lent(),
            loan_refusals=self.pool.loan_refusals(),
        )

    async def _publish(self) -> None:
        members = self.members()  # the pool as it is now, not as it was when flagged
        await self.store.put(self.key, encode(members))
        if self.published is None or self.published.active != members.active:
            log.info(
                "published %s: ACTIVE %s, %d WARM",
                self.key,
                ", ".join(members.active) or "(none)",
                members.warm,
            )
        was_lent = {} if self.published is None else self.published.lent
        if was_lent != members.lent:
            log.info(
                "published %s: lent %s",
                self.key,
                ", ".join(f"{u} (loan {k})" for k, u in members.lent.items()) or "(none)",
            )
        self.published = members

    async def _publish_loop(self) -> None:
        first, most = self._retry
        delay, failing = first, False
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            try:
                await self._publish()
            except StoreError as e:  # temporary or not, the next try may work: keep going
                if not failing:
                    log.warning(
                        "cannot publish %s (%s); retrying in the background, "
                        "gateways keep the last published members",
                        self.key,
                        e,
                    )
                failing = True
                self._dirty.set()
                await asyncio.sleep(delay)
                delay = min(delay * 2, most)
                continue
            if failing:
                log.info("publishing %s works again", self.key)
            delay, failing = first, False

    async def _reconcile_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            self._kick.clear()  # a kick during this reconcile calls for the next one now
            try:
                await self.pool.reconcile()
            except ReplicaError as e:  # the pool is being stopped under us
                log.warning("warm pool reconcile of %s failed: %s", self.region, e)
            if self.published is not None and self.pool.warm_count() != self.published.warm:
                self._dirty.set()  # launches and stops change WARM without an ACTIVE change
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, started + self.interval_s - loop.time())):
                    await self._kick.wait()
