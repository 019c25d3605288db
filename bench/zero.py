"""``python -m bench zero``: a pool at zero receives requests (scale to zero, issue 32).

One local lab (chaos/lab/deployment.py: one etcd member, two regions, one control-plane
process, a gateway per region), each region's agent running a simulator **warm pool**
(1 ACTIVE, 1 WARM) that follows the leader's ``scale/<unit>``; the topology's
``scaling:`` adds ``min_active: 0`` and ``idle_to_zero_s`` (``--idle-s``), so an idle
pool drains to zero. Then, for ``us-east``:

1. **gateway**: once the pool is at zero (the leader asks 0 ACTIVE and ``pools/us-east``
   lists none), ``--settle-s`` later and every replica asleep (``/is_sleeping``: a
   wake, not the resume of a drained IDLE replica), ``--requests`` streaming
   completions at once into the region's gateway: the first asks the leader to wake the
   pool and every one is held until a replica serves (or refused 503 with Retry-After
   after the hold). ``first_token_s_gateway``: the slowest first token of them, from
   its send.
2. **picker**: the pool back at zero, the same through a ``tectonic-epp`` (endpoint
   picker) of the region. With an ``envoy`` binary (``.venv/bin/envoy``, else on
   ``PATH``; ``--no-envoy`` skips it), through a real Envoy on the shipped config
   (``deploy/envoy/envoy.yaml``, ``chaos/lab/envoy.py``): request into Envoy, the
   picker holds its ext_proc exchange while the pool wakes, Envoy forwards to the
   endpoint it names. Envoy's clusters are STATIC and a warm pool's simulators take
   their ports when launched, so before the rounds the bench learns the pool's replica
   URLs from the pool itself: the ACTIVE ones in ``pools/us-east`` and the WARM ones by
   borrowing them (``controlplane/kernel/pool/loans.py``: lent, named in
   ``pools/us-east``, returned at once). Without Envoy, the bench speaks Envoy's side
   of ext_proc (header-only) to the picker and sends the completion to the endpoint it
   names. ``first_token_s_picker``: the slowest first token, from the request's send
   (Envoy) or the pick's start (ext_proc); ``picker_path`` says which path was used,
   and the Envoy path adds Envoy's counters (``envoy_picked``: requests forwarded to
   the picked endpoint; ``envoy_failed_open``: exchanges Envoy gave up on, past its
   ext_proc message timeout, and sent round robin instead); ``woken_by``: who
   wrote each round's wake request (the gateway, then the picker).
3. ``wake_s``: each wake's duration, from the wake request (``wake/us-east``, its
   time) to the pool's publication of its first ACTIVE replica (``pools/us-east``,
   its time; both wall clocks of this host); the larger of the two wakes.
4. ``refused``: requests of both rounds answered 503 (Retry-After) while the pool woke:
   0 when every one was served within the hold.

``never_failed_over``: no region left NORMAL in the whole run (a pool at zero is asleep,
not down). The timings are the lab's compressed ones (``chaos/lab/spec.py``).
``asleep_before``: how many of the pool's replicas answered ``/is_sleeping`` true just
before each round (the requests woke a sleeping replica); ``activation_p95_s``: the
pool's own measure of its wakes (``pools/us-east``: ``/wake_up``, the prefix-cache reset
and the check, as the agent timed them), the engine's part of ``wake_s``.

``--vllm``: us-east's warm pool runs two **real vLLM servers** (the CPU build in
``.venv-vllm`` with the tiny model, launcher kind ``vllm``; ``WarmPoolSpec.vllm_units``),
us-west keeps simulators, so that ``wake_s`` and the first tokens include a real vLLM
sleep-mode wake. On CPU that wake is the dev-mode ``/sleep`` level 1 undone (scheduling
resumed, the prefix cache reset); ``--enable-sleep-mode`` is refused there, so no
weights leave or come back (docs/vllm-cpu.md): a GPU's wake, which reloads the weights
into GPU memory, is longer and is not measured here.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from bench._common import BenchError, Reporter, main
from bench._stream import streamed_completion
from chaos.lab.deployment import LocalDeployment
from chaos.lab.envoy import EnvoyProc, EnvoySpec, envoy_binary, start_envoy, stats
from chaos.lab.epp_ask import ask_picker
from chaos.lab.procs import Proc, start_picker
from chaos.lab.run import running_lab
from chaos.lab.spec import DeploymentSpec, WarmPoolSpec
from chaos.lab.vllm_cpu import SETUP_HINT, vllm_available
from controlplane.kernel.codec import decode
from controlplane.kernel.model import RegionRecord, RegionState
from controlplane.kernel.pool.loans import (
    LoanNotReturned,
    LoanRefused,
    borrow_together,
    read_members,
)
from controlplane.kernel.pool.scale import ScaleRecord, WakeRequest
from controlplane.kernel.store.etcd import EtcdStore
from controlplane.kernel.store.settings import EtcdConfig
from regions.pool.processes import free_port

UNIT = "us-east"
REGIONS = ("us-east", "us-west")
DESTINATION = "x-gateway-destination-endpoint"
# Envoy's counters (deploy/envoy/envoy.yaml): forwarded to the picked endpoint, and
# exchanges given up on (the picker later than message_timeout: sent round robin)
PICKED = "cluster.tectonic_picked.upstream_rq_total"
FAILED_OPEN = "http.tectonic_inference.ext_proc.failure_mode_allowed"
SLEEP_WITHIN_S = 30.0  # after --settle-s, for every replica of the pool at zero to sleep


def spec_of(idle_s: float, vllm: bool = False) -> DeploymentSpec:
    """Two regions of 1 ACTIVE + 1 WARM simulators each (``vllm``: real vLLM CPU servers
    in us-east's pool); an idle pool sleeps after ``idle_s`` (at zero it keeps its WARM
    replica: a wake, not a launch)."""
    pool = WarmPoolSpec(
        active=1,
        warm=1,
        size=2,
        active_min_s=2.0,
        idle_min_s=1.0,
        scaled_idle_min_s=1.0,  # the scaler sizes it: a drained replica sleeps after 1 s
        vllm_units=(UNIT,) if vllm else (),
    )
    return DeploymentSpec(
        regions=REGIONS,
        controlplanes=1,
        warm_pool=pool,
        scaling_overrides=(("min_active", 0), ("idle_to_zero_s", idle_s), ("burst_warm", 1)),
    )


SERVERS = {
    False: "simulator (instant /wake_up)",
    True: "vllm CPU build (dev-mode sleep level 1: no weights offloaded, not a GPU's wake)",
}


@dataclass
class ZeroLab:
    """What a bench or a test reads of a scale-to-zero lab, from etcd."""

    dep: LocalDeployment
    store: EtcdStore

    async def scale(self, unit: str = UNIT) -> ScaleRecord | None:
        kv = await self.store.get(self.dep.keys.scale(unit))
        return None if kv is None else decode(ScaleRecord, kv.value, kv.key)

    async def at_zero(self, unit: str = UNIT) -> bool:
        """The leader asks 0 ACTIVE and the agent publishes none."""
        rec, members = await self.scale(unit), await read_members(self.store, self.dep.keys, unit)
        return rec is not None and rec.asleep and members is not None and not members.active

    async def awake(self, unit: str = UNIT) -> bool:
        members = await read_members(self.store, self.dep.keys, unit)
        return members is not None and bool(members.active)

    async def wake_s(self, unit: str = UNIT) -> float | None:
        """From the last wake request to the publication of an ACTIVE replica."""
        kv = await self.store.get(self.dep.keys.wake(unit))
        members = await read_members(self.store, self.dep.keys, unit)
        if kv is None or members is None or not members.active:
            return None
        return members.at - decode(WakeRequest, kv.value, kv.key).at

    async def activation_p95_s(self, unit: str = UNIT) -> float | None:
        """The pool's own p95 of its last wakes, as its agent publishes it."""
        members = await read_members(self.store, self.dep.keys, unit)
        return None if members is None else members.activation_p95_s

    async def woken_by(self, unit: str = UNIT) -> str:
        """Who wrote the last wake request (a gateway or a picker), "" none."""
        kv = await self.store.get(self.dep.keys.wake(unit))
        return "" if kv is None else decode(WakeRequest, kv.value, kv.key).by

    async def replica_urls(self, size: int, within: float = 60.0) -> tuple[str, ...]:
        """Every replica of the pool (``size`` of them), as ``host:port``: the ACTIVE ones
        it publishes, and the WARM ones borrowed (lent, named, returned at once). A
        replica IDLE now is lendable once it sleeps: asked again until all are known."""
        found: list[str] = []
        deadline = time.monotonic() + within
        while True:
            members = await read_members(self.store, self.dep.keys, UNIT)
            if members is not None:
                _add(found, (*members.active, *members.lent.values()))
            if len(found) >= size:
                return tuple(found)
            with contextlib.suppress(LoanRefused, LoanNotReturned):
                async with borrow_together(
                    self.store,
                    self.dep.keys,
                    UNIT,
                    borrower="bench-zero",
                    wanted=(None,) * (size - len(found)),
                    at_least=1,
                    purpose="bench zero: the pool's replica URLs, for Envoy's cluster",
                    timeout_s=10.0,
                ) as got:
                    _add(found, got.urls)
            if len(found) >= size:
                return tuple(found)
            if time.monotonic() > deadline:
                raise BenchError(f"only {len(found)} of {UNIT}'s {size} replicas found")
            await asyncio.sleep(0.5)

    async def states(self) -> dict[str, RegionState]:
        out = {}
        for unit in self.dep.spec.units:
            kv = await self.store.get(self.dep.keys.region_state(unit))
            out[unit] = (
                RegionState.NORMAL if kv is None else decode(RegionRecord, kv.value, kv.key).state
            )
        return out


async def asleep_count(http: aiohttp.ClientSession, servers: tuple[str, ...]) -> int:
    """How many of ``servers`` (host:port) answer ``/is_sleeping`` true."""

    async def one(hp: str) -> bool:
        try:
            async with http.get(f"http://{hp}/is_sleeping") as r:
                return r.status == 200 and bool((await r.json()).get("is_sleeping"))
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return False

    return sum(await asyncio.gather(*(one(hp) for hp in servers)))


async def settle(http: aiohttp.ClientSession, servers: tuple[str, ...], settle_s: float) -> int:
    """After the pool reached zero: ``settle_s``, then until every replica sleeps (its
    drained one IDLE -> WARM), so that the requests wake a sleeping replica rather than
    resume an idle one. Returns how many sleep."""
    await asyncio.sleep(settle_s)
    deadline = time.monotonic() + SLEEP_WITHIN_S
    while (asleep := await asleep_count(http, servers)) < len(servers):
        if time.monotonic() > deadline:
            raise BenchError(
                f"only {asleep} of {UNIT}'s {len(servers)} replicas asleep "
                f"{settle_s + SLEEP_WITHIN_S:g} s after it reached zero"
            )
        await asyncio.sleep(0.2)
    return asleep


def _add(found: list[str], urls: tuple[str, ...]) -> None:
    for url in urls:
        hp = url.removeprefix("http://")
        if hp not in found:
            found.append(hp)


def completion(n: int) -> dict[str, object]:
    return {
        "model": "tiny",
        "prompt": f"wake up, request {n}",
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


@dataclass(frozen=True)
class Round:
    first_tokens: tuple[float, ...]  # of the requests served
    refused: int  # answered 503 while the pool woke


async def through_gateway(http: aiohttp.ClientSession, url: str, n: int) -> Round:
    """``n`` streaming completions at once into the gateway; their first tokens."""

    async def one(i: int) -> float | None:
        try:
            got = await streamed_completion(http, url, completion(i))
        except BenchError as e:
            if "HTTP 503" in str(e):
                return None
            raise
        return got.ttft_s  # from the send, the hold included

    return _round(await asyncio.gather(*(one(i) for i in range(n))))


async def through_envoy(http: aiohttp.ClientSession, url: str, n: int) -> Round:
    """``n`` streaming completions at once into Envoy, whose ext_proc picker holds each
    while the pool wakes; their first tokens, from the send."""
    return await through_gateway(http, url, n)  # the same client: Envoy is the entry


async def through_picker(http: aiohttp.ClientSession, picker: str, n: int) -> Round:
    """``n`` requests as Envoy makes them: a header-only ext_proc exchange with the
    picker (held while the pool wakes), then the completion to the endpoint it names."""

    async def one(i: int) -> float | None:
        t0 = time.perf_counter()
        destination = await pick(picker, f"zero-{i}")
        if destination is None:
            return None
        picked_s = time.perf_counter() - t0  # the hold
        got = await streamed_completion(http, f"http://{destination}", completion(i))
        return picked_s + got.ttft_s

    return _round(await asyncio.gather(*(one(i) for i in range(n))))


def _round(results: list[float | None]) -> Round:
    return Round(tuple(r for r in results if r is not None), sum(r is None for r in results))


async def pick(address: str, session: str) -> str | None:
    """The first endpoint the picker names for a request of ``session``; None when it
    answers 503 (ImmediateResponse) instead."""
    answer = await ask_picker(address, session, "/v1/completions")
    if answer.HasField("immediate_response"):
        if answer.immediate_response.status.code == 503:
            return None
        raise BenchError(f"the picker answered {answer.immediate_response.status.code}")
    mutation = answer.request_headers.response.header_mutation
    for h in mutation.set_headers:
        if h.header.key == DESTINATION:
            return str(h.header.raw_value.decode().split(",")[0])
    raise BenchError("the picker named no destination")


async def wait(pred: Callable[[], Awaitable[bool]], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not await pred():
        if time.monotonic() > deadline:
            raise BenchError(f"{what}: not within {within:g} s")
        await asyncio.sleep(0.1)


@dataclass(frozen=True)
class PickerPath:
    """How the picker round reaches the picker: ``envoy`` (a real Envoy in front of it)
    or, without one, ``address`` spoken to directly over ext_proc."""

    address: str  # the picker's ext_proc host:port
    servers: tuple[str, ...]  # the pool's replicas, host:port
    envoy: EnvoyProc | None = None
    why_not_envoy: str = ""

    def name(self) -> str:
        if self.envoy is not None:
            return "envoy"
        return f"ext_proc direct, no Envoy ({self.why_not_envoy})"


def envoy_missing() -> str:
    """Why no Envoy can run here ("" when one can)."""
    try:
        envoy_binary()
    except RuntimeError as e:
        return str(e)
    return ""


async def bench(args: argparse.Namespace, out: Reporter) -> dict[str, object]:
    if args.vllm and not vllm_available():
        raise BenchError(f"--vllm needs a real vLLM: {SETUP_HINT}")
    workdir = Path(tempfile.mkdtemp(prefix="tectonic-bench-zero-"))
    spec = spec_of(args.idle_s, args.vllm)
    async with running_lab(spec, workdir, say=out.progress) as dep:
        store = EtcdStore(EtcdConfig(endpoints=dep.etcd_endpoints))
        await store.connect()
        lab = ZeroLab(dep, store)
        picker: Proc | None = None
        envoy: EnvoyProc | None = None
        try:
            picker = await asyncio.to_thread(
                start_picker, dep.topology_path, UNIT, control_planes=dep.cp_targets, name="zero"
            )
            address = picker.url.removeprefix("grpc://")
            why = "--no-envoy" if args.no_envoy else envoy_missing()
            assert spec.warm_pool is not None
            servers = await lab.replica_urls(spec.warm_pool.size)
            if not why:
                out.progress(f"{UNIT}'s replicas {', '.join(servers)}: starting Envoy ...")
                envoy_spec = EnvoySpec(
                    listen_port=free_port(),
                    admin_port=free_port(),
                    pickers=[address],
                    servers=servers,
                )
                envoy = await asyncio.to_thread(start_envoy, envoy_spec, workdir, name="envoy-zero")
            path = PickerPath(address, servers, envoy, why)
            return await drive(lab, path, args, out)
        finally:
            if envoy is not None:
                await asyncio.to_thread(envoy.terminate)
            if picker is not None:
                await asyncio.to_thread(picker.terminate)
            await store.close()


async def drive(
    lab: ZeroLab, picker: PickerPath, args: argparse.Namespace, out: Reporter
) -> dict[str, object]:
    states: list[dict[str, RegionState]] = []
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as http:

        async def asleep() -> bool:
            states.append(await lab.states())
            return await lab.at_zero()

        out.progress(f"waiting for {UNIT} to go to zero (idle_to_zero_s {args.idle_s:g}) ...")
        await wait(asleep, args.idle_s + 60, f"{UNIT} at zero")
        asleep_gateway = await settle(http, picker.servers, args.settle_s)
        out.progress(
            f"{UNIT} at zero ({asleep_gateway} of {len(picker.servers)} replicas asleep): "
            f"{args.requests} requests through its gateway ..."
        )
        gateway = await through_gateway(http, lab.dep.gateway_urls[UNIT], args.requests)
        wake_gateway = await lab.wake_s()
        by_gateway = await lab.woken_by()
        out.progress(f"waiting for {UNIT} to go back to zero ...")
        await wait(asleep, args.idle_s + 60, f"{UNIT} back at zero")
        asleep_picker = await settle(http, picker.servers, args.settle_s)
        out.progress(
            f"{UNIT} at zero: {args.requests} requests through its endpoint picker "
            f"({picker.name()}) ..."
        )
        if picker.envoy is not None:
            before = await asyncio.to_thread(stats, picker.envoy.admin_url)
            picked = await through_envoy(http, picker.envoy.url, args.requests)
            after = await asyncio.to_thread(stats, picker.envoy.admin_url)
            counters = {
                "envoy_picked": after.get(PICKED, 0) - before.get(PICKED, 0),
                "envoy_failed_open": after.get(FAILED_OPEN, 0) - before.get(FAILED_OPEN, 0),
            }
        else:
            picked = await through_picker(http, picker.address, args.requests)
            counters = {}
        wake_picker = await lab.wake_s()
        by_picker = await lab.woken_by()
        activation_p95 = await lab.activation_p95_s()
        states.append(await lab.states())
    wakes = [w for w in (wake_gateway, wake_picker) if w is not None]
    return {
        "bench": "zero",
        "server": SERVERS[args.vllm],
        "first_token_s_gateway": _most(gateway.first_tokens),
        "first_token_s_picker": _most(picked.first_tokens),
        "picker_path": picker.name(),
        **counters,
        "wake_s": round(max(wakes), 3) if wakes else None,
        "wake_s_each": [round(w, 3) for w in wakes],
        "woken_by": [by_gateway, by_picker],  # who wrote each round's wake request
        "asleep_before": [asleep_gateway, asleep_picker],  # of the pool's replicas
        "activation_p95_s": None if activation_p95 is None else round(activation_p95, 3),
        "refused": gateway.refused + picked.refused,
        "requests": 2 * args.requests,
        "never_failed_over": all(s is RegionState.NORMAL for st in states for s in st.values()),
        "idle_to_zero_s": args.idle_s,
        "compressed": "lab timings (chaos/lab/spec.py): probes 0.5 s, pool dwell 2 s ACTIVE",
    }


def _most(values: tuple[float, ...]) -> float | None:
    return round(max(values), 3) if values else None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--idle-s", type=float, default=6.0, help="idle_to_zero_s (default 6)")
    p.add_argument(
        "--requests", type=int, default=5, help="requests sent at once at the pool at zero"
    )
    p.add_argument(
        "--settle-s",
        type=float,
        default=3.0,
        help="after the pool reaches zero, before the requests: its drained replica goes "
        "IDLE -> WARM (the lab's IDLE dwell is 1 s), so that the request wakes a sleeping "
        "replica rather than resuming an idle one; then, until every replica answers "
        "/is_sleeping true (at most 30 s more) (default 3)",
    )
    p.add_argument(
        "--no-envoy",
        action="store_true",
        help="the picker round without Envoy, ext_proc spoken to the picker directly "
        "(the default with no envoy binary)",
    )
    p.add_argument(
        "--vllm",
        action="store_true",
        help="us-east's warm pool runs 2 real vLLM servers (the CPU build in .venv-vllm, "
        "~2.3 GB each; us-west keeps simulators): the wake is a real vLLM sleep-mode wake, "
        "on CPU (no weights offloaded, unlike a GPU's)",
    )
    p.add_argument("--quiet", action="store_true", help="only the headline")


def run(args: argparse.Namespace) -> int:
    out = Reporter(args.quiet)
    return main(lambda: asyncio.run(bench(args, out)), (BenchError, OSError))
