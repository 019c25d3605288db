"""etcd driven into its NOSPACE alarm on purpose, under a whole lab: nothing pretends.

A lab (etcd, three regions of one simulator and an agent each, two control-plane
replicas, a gateway per region; chaos.lab.deployment) runs on an etcd with a small
``--quota-backend-bytes``, and Debian's ``prometheus`` scrapes all of it every second
with the shipped runbooks/alerts/tectonic-alerts.yaml loaded as it is: the test waits
out the alert's ``for: 1m`` instead of shortening it. Six chat sessions, two homed in
each region, are pinned and served, each through its home region's gateway. Then a
filler writes 1 MiB values under a key outside the cluster's prefix until etcd answers
StoreFull and raises NOSPACE, and the test checks that nothing shows the stored states
as current:

* both replicas, over gRPC GetStatus and HTTP /v1/status: every region UNKNOWN with
  ``stored_state`` the stored NORMAL, ``store.writable`` false, its reason and alarms
  naming NOSPACE;
* Prometheus: ``tectonic_store_writable`` 0 on both replicas, the leader's
  ``tectonic_region_state`` UNKNOWN for every region (no other state at 1), and
  ``TectonicStoreRefusingWrites`` firing for both once its minute has passed;
* sessions: each answered by the region it is pinned to; a blacked-out region's
  sessions (its simulator SIGKILLed) refused with 503, not answered elsewhere, the
  blackout not failed over (routing in etcd untouched) and UNKNOWN on both replicas;
  once the lease bucket of the fill has ended (the next bucket's session lease is a
  write etcd refuses), every session sent to a gateway that never saw it is answered
  by its pinned region or refused, and no session is ever answered by two regions.

Recovery as runbooks/etcd-space.md does it (delete the filler, compact, ``etcdctl
defrag``, ``etcdctl alarm disarm``): both replicas show real states and a writable
store again, the blackout is failed over now (FAILING_OVER, the state a region keeps
while failed over), the alert stops firing, and the blacked-out region's sessions are
served elsewhere with the move recorded in etcd.

Preconditions (the lab's steady state, the fill, the recovery's commands) fail at once;
the behaviours under test are collected and reported together at the end, each with
what was seen, and the control planes' logs.

A missing ``prometheus`` or ``etcdctl`` fails the test in CI and skips it elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
import yaml
from tectonic_api.v1 import controlplane_pb2 as pb
from tectonic_api.v1 import controlplane_pb2_grpc as pb_grpc

from chaos.lab.deployment import LocalDeployment
from chaos.lab.local_etcd import EtcdServer
from chaos.lab.procs import until
from chaos.lab.spec import DeploymentSpec
from controlplane.kernel.codec import decode
from controlplane.kernel.sessions.resolve import SessionPin
from controlplane.kernel.store.etcd import EtcdStore
from controlplane.kernel.store.port import StoreFull
from controlplane.kernel.store.settings import EtcdConfig
from tests.integration.test_prometheus_lab import RULES, Prom, prometheus, prometheus_binary

pytestmark = [pytest.mark.slow, pytest.mark.etcd, pytest.mark.timeout(300)]

QUOTA_BYTES = 32 * 1024 * 1024  # far above what the lab writes in two minutes
FILLER_PREFIX = "/tectonic-test-filler/"  # outside every cluster's /tectonic/<cluster>/
FILLER_VALUE_BYTES = 1024 * 1024  # under etcd's 1.5 MiB request limit
ALERT = "TectonicStoreRefusingWrites"
ALERT_EXPR = "tectonic_store_writable == 0"
ALERT_FOR_S = 60
BLACKOUT = "us-east"
SESSIONS_PER_REGION = 2
# SessionStore's bucket_s (its default; the gateway's CLI keeps it): a session used in
# a later bucket than its pin's lease is re-attached to that bucket's lease, which the
# first process to use a session in the bucket grants and records: writes.
BUCKET_S = 60
SESSION_HEADER = "x-session-id"
REGION_HEADER = "x-tectonic-region"
MODEL = "tiny"  # what the lab's simulators serve
UNKNOWN = pb.REGION_STATE_UNKNOWN
NORMAL = pb.NORMAL


def etcdctl_binary() -> str:
    path = shutil.which("etcdctl")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("etcdctl is missing: scripts/setup.sh installs etcd-client")
        pytest.skip("etcdctl is not installed (apt-get install etcd-client)")
    return path


# ---- the lab, on an etcd with a small quota ------------------------------------------


@contextlib.asynccontextmanager
async def lab_on_small_etcd(spec: DeploymentSpec, workdir: Path) -> AsyncIterator[LocalDeployment]:
    """chaos.lab.run.running_lab's starts, in its order, with etcd's quota at
    QUOTA_BYTES (``running_lab`` starts etcd with the lab's own flags only)."""
    dep = LocalDeployment(spec, workdir)
    try:
        server = EtcdServer(extra_flags=(f"--quota-backend-bytes={QUOTA_BYTES}",))
        dep.etcd = await asyncio.to_thread(server.start)
        dep.write_topology()
        await asyncio.gather(*(asyncio.to_thread(dep.start_region, r) for r in spec.regions))
        for rid in dep.cp_ports:
            await asyncio.to_thread(dep.start_controlplane, rid)
        await asyncio.gather(*(asyncio.to_thread(dep.start_data_plane, r) for r in spec.regions))
        yield dep
    finally:
        await asyncio.to_thread(dep.stop)


# ---- what the test sees of the lab ---------------------------------------------------


@dataclass(frozen=True)
class Answer:
    status: int
    region: str  # x-tectonic-region of a 200 ("" otherwise)
    text: str

    def __str__(self) -> str:
        return f"HTTP {self.status} {self.region or ''} {self.text[:100]!r}"


@dataclass
class Client:
    """Chat requests through the lab's gateways; remembers every region that answered
    a session with a 200 (``served``)."""

    http: aiohttp.ClientSession
    gateways: dict[str, str]
    served: defaultdict[str, list[str]]

    async def chat(self, session: str, via: str) -> Answer:
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": f"{session} asks: any news?"}],
            "max_tokens": 4,
        }
        url = self.gateways[via] + "/v1/chat/completions"
        async with self.http.post(url, json=body, headers={SESSION_HEADER: session}) as r:
            text = await r.text()
            region = r.headers.get(REGION_HEADER, "") if r.status == 200 else ""
        if r.status == 200:
            assert region, f"{session} via {via}: 200 without {REGION_HEADER}"
            self.served[session].append(region)
        return Answer(r.status, region, text)


@dataclass
class Replicas:
    """Both control-plane replicas, over gRPC and over HTTP. A replica that exited or
    does not answer is a string saying so in place of its status."""

    dep: LocalDeployment
    stubs: dict[str, pb_grpc.ControlPlaneStub]
    http_urls: dict[str, str]
    http: aiohttp.ClientSession

    def exited(self, rid: str) -> str:
        proc = self.dep.cps.get(rid)
        if proc is not None and proc.alive():
            return ""
        lines = proc.log(20_000).splitlines() if proc is not None else []
        errors = [ln.strip(" |") for ln in lines if re.match(r"[\s|]*[\w.]+(Error|Full):", ln)]
        return f"{rid} exited ({errors[-1] if errors else 'no error in its log'})"

    async def grpc_status(self) -> dict[str, pb.StatusResponse | str]:
        out: dict[str, pb.StatusResponse | str] = {}
        for rid, stub in self.stubs.items():
            try:
                out[rid] = await stub.GetStatus(pb.GetStatusRequest(), timeout=5)
            except grpc.aio.AioRpcError as e:
                out[rid] = self.exited(rid) or f"{rid} GetStatus: {e.code().name} {e.details()}"
        return out

    async def http_status(self) -> dict[str, dict[str, Any] | str]:
        out: dict[str, dict[str, Any] | str] = {}
        for rid, url in self.http_urls.items():
            try:
                async with self.http.get(url + "/v1/status") as r:
                    if r.status != 200:
                        out[rid] = f"{rid} /v1/status: HTTP {r.status} {await r.text()}"
                        continue
                    out[rid] = await r.json()
            except aiohttp.ClientError as e:
                out[rid] = self.exited(rid) or f"{rid} /v1/status: {e!r}"
        return out


async def pin_of(store: EtcdStore, dep: LocalDeployment, session: str) -> str:
    """The region etcd pins ``session`` to."""
    kv = await store.get(dep.keys.session(session))
    assert kv is not None, f"session {session} has no pin in etcd"
    return decode(SessionPin, kv.value, kv.key).region


def states(st: pb.StatusResponse) -> dict[str, tuple[int, int]]:
    """region -> (state, stored_state)"""
    return {r.name: (r.state, r.stored_state) for r in st.regions}


def describe(st: pb.StatusResponse) -> str:
    regions = ", ".join(
        f"{r.name} {pb.RegionState.Name(r.state)}/{pb.RegionState.Name(r.stored_state)} "
        f"{pb.Health.Name(r.health)}"
        for r in st.regions
    )
    return (
        f"gRPC {st.responder} (leader {st.responder_is_leader}): writable "
        f"{st.store.writable} {st.store.reason!r} alarms {list(st.store.alarms)}; {regions}"
    )


def describe_http(rid: str, body: dict[str, Any]) -> str:
    regions = ", ".join(
        f"{r['name']} {r['state']}/{r['stored_state']} {r['health']}" for r in body["regions"]
    )
    return f"HTTP {rid}: store {body['store']}; {regions}"


async def settle(check: Callable[[], Awaitable[str]], *, within: float, every: float = 0.5) -> str:
    """Poll ``check`` until it returns "" (holds) or ``within`` passes; its last
    complaint ("" if it held)."""
    last = ""

    async def holds() -> bool:
        nonlocal last
        last = await check()
        return not last

    with contextlib.suppress(AssertionError):
        await until(holds, within=within, every=every)
    return last


def control_plane_logs(dep: LocalDeployment) -> str:
    """Each replica's last warnings and errors, and its log's last line."""
    out = []
    for rid, proc in dep.cps.items():
        if proc is None:
            continue
        lines = proc.log(1 << 30).splitlines()
        # warnings and errors, not the traceback each health report refused logs
        kept = [
            ln
            for ln in lines
            if ln[:2].isdigit()
            and re.search(r" (WARNING|ERROR|CRITICAL) |tectonic\.election", ln)
            and "raised by servicer" not in ln
        ]
        out.append(f"--- {rid} ({'running' if proc.alive() else 'exited'}):")
        out += kept[-20:] + [ln for ln in lines[-1:] if ln not in kept[-1:]]
    return "\n".join(out)


async def etcdctl(binary: str, endpoints: tuple[str, ...], *args: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        binary,
        f"--endpoints={','.join(endpoints)}",
        *args,
        env={**os.environ, "ETCDCTL_API": "3"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await proc.communicate()
    text = out.decode(errors="replace")
    assert proc.returncode == 0, f"etcdctl {' '.join(args)} exited {proc.returncode}: {text}"
    return text


def workdirs(tmp_path: Path) -> tuple[Path, Path]:
    """The lab's and Prometheus's."""
    lab, prom = tmp_path / "lab", tmp_path / "prom"
    lab.mkdir()
    prom.mkdir()
    return lab, prom


# ---- the test ------------------------------------------------------------------------


async def test_a_full_etcd_shows_every_region_unknown_pages_and_moves_no_session(
    tmp_path: Path,
) -> None:
    prometheus_binary()  # before starting a lab for nothing
    ctl = etcdctl_binary()
    shipped = next(
        rule
        for group in yaml.safe_load(RULES.read_text())["groups"]
        for rule in group["rules"]
        if rule.get("alert") == ALERT
    )
    # Loaded as shipped: the waits below are sized for this `for`.
    assert (shipped["expr"].strip(), shipped["for"]) == (ALERT_EXPR, "1m")

    spec = DeploymentSpec(replicas_per_region=1)
    lab_dir, prom_dir = workdirs(tmp_path)
    async with (
        lab_on_small_etcd(spec, lab_dir) as dep,
        EtcdStore(EtcdConfig(endpoints=dep.etcd_endpoints, request_timeout_s=5.0)) as store,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http,
    ):
        channels = {
            rid: grpc.aio.insecure_channel(f"127.0.0.1:{port}")
            for rid, port in dep.cp_ports.items()
        }
        stubs = {
            rid: pb_grpc.ControlPlaneStub(ch)  # type: ignore[no-untyped-call]
            for rid, ch in channels.items()
        }
        http_urls = {rid: f"http://127.0.0.1:{p}" for rid, p in dep.cp_http_ports.items()}
        replicas = Replicas(dep, stubs, http_urls, http)
        client = Client(http, dep.gateway_urls, defaultdict(list))
        try:
            async with prometheus(dep, prom_dir) as prom:
                try:
                    problems = await full_and_back(dep, store, replicas, client, prom, ctl)
                except AssertionError as e:
                    raise AssertionError(f"{e}\n{control_plane_logs(dep)}") from None
            logs = control_plane_logs(dep)  # before the lab stops
        finally:
            for ch in channels.values():
                await ch.close()
    assert not problems, (
        "while etcd refused writes, or after:\n* " + "\n* ".join(problems) + f"\n{logs}"
    )


async def full_and_back(
    dep: LocalDeployment,
    store: EtcdStore,
    replicas: Replicas,
    client: Client,
    prom: Prom,
    ctl: str,
) -> list[str]:
    """Asserts the preconditions; returns what went wrong in the behaviours tested."""
    problems: list[str] = []
    regions = dep.spec.regions
    cp_instances = set(dep.metrics_targets()["controlplane"])

    async def expect(what: str, check: Callable[[], Awaitable[str]], within: float) -> None:
        if last := await settle(check, within=within):
            problems.append(f"{what} (within {within:.0f} s); last seen: {last}")

    # ---- steady state: every region NORMAL, sessions pinned where they started --------
    async def steady() -> str:
        sts = (await replicas.grpc_status()).values()
        bad = [
            st if isinstance(st, str) else describe(st)
            for st in sts
            if isinstance(st, str)
            or not st.store.writable
            or list(st.store.alarms)
            or set(states(st).values()) != {(NORMAL, NORMAL)}
        ]
        if not any(not isinstance(st, str) and st.responder_is_leader for st in sts):
            bad.append("no replica leads yet")
        return "; ".join(bad)

    last = await settle(steady, within=60)
    assert not last, f"the lab never settled: {last}"
    sessions = {f"full-{r}-{i}": r for r in regions for i in range(SESSIONS_PER_REGION)}
    for s, home in sessions.items():  # only ever through its home's gateway until later
        got = await client.chat(s, via=home)
        assert (got.status, got.region) == (200, home), f"{s} via {home}: {got}"
        assert await pin_of(store, dep, s) == home
    routing_before = (await store.get_prefix(dep.keys.routing_prefix())).kvs

    async def writable_metric_is(value: int) -> str:
        got = await prom.query(f"tectonic_store_writable == {value}")
        seen = {s["metric"]["instance"] for s in got}
        return "" if seen == cp_instances else f"{value} on {sorted(seen)}"

    last = await settle(lambda: writable_metric_is(1), within=30)
    assert not last, f"tectonic_store_writable before the fill: {last}"
    assert not await prom.alerts(ALERT, "firing") and not await prom.alerts(ALERT, "pending")

    # ---- fill etcd until it refuses writes -------------------------------------------
    filler: list[str] = []
    value = os.urandom(FILLER_VALUE_BYTES)
    with pytest.raises(StoreFull):
        for i in range(4 * QUOTA_BYTES // FILLER_VALUE_BYTES):
            key = f"{FILLER_PREFIX}{i:04d}"
            await store.put(key, value)
            filler.append(key)
    full_at = time.time()
    full_bucket = int(full_at // BUCKET_S)
    assert filler and await store.alarms() == ["NOSPACE"]
    with pytest.raises(StoreFull):  # any write, however small
        await store.put(FILLER_PREFIX + "small", b"x")

    # ---- status: every region UNKNOWN, the store not writable, over gRPC and HTTP ----
    async def refusing() -> str:
        bad = []
        for st in (await replicas.grpc_status()).values():
            if isinstance(st, str):
                bad.append(st)
            elif (
                st.store.writable
                or "NOSPACE" not in st.store.reason
                or list(st.store.alarms) != ["NOSPACE"]
                or not full_at - 10 <= st.store.since <= time.time()
                or set(states(st)) != set(regions)
                or set(states(st).values()) != {(UNKNOWN, NORMAL)}
                or {r.health for r in st.regions} != {pb.UNKNOWN}  # stale verdicts too
            ):
                bad.append(describe(st))
        for rid, body in (await replicas.http_status()).items():
            if isinstance(body, str):
                bad.append(body)
                continue
            shown = {(r["state"], r["stored_state"], r["health"]) for r in body["regions"]}
            store_view = body["store"]
            if (
                store_view["writable"] is not False
                or "NOSPACE" not in store_view["reason"]
                or store_view["alarms"] != ["NOSPACE"]
                or shown != {("UNKNOWN", "NORMAL", "UNKNOWN")}
            ):
                bad.append(describe_http(rid, body))
        return "; ".join(dict.fromkeys(bad))

    await expect("status shows every region UNKNOWN, the store not writable", refusing, 15)

    # ---- metrics: writable 0 on both replicas, every region UNKNOWN -------------------
    await expect("tectonic_store_writable 0 on both replicas", lambda: writable_metric_is(0), 15)

    async def unknown_metric() -> str:
        unknown = await prom.query('tectonic_region_state{state="UNKNOWN"} == 1')
        other = await prom.query('tectonic_region_state{state!="UNKNOWN"} == 1')
        shown = {s["metric"]["region"] for s in unknown}
        if shown != set(regions) or other:
            return f"UNKNOWN for {sorted(shown)}; other states at 1: {other}"
        return ""

    await expect("tectonic_region_state UNKNOWN for every region", unknown_metric, 15)

    # ---- sessions: each answered by the region it is pinned to ------------------------
    for s, home in sessions.items():
        got = await client.chat(s, via=home)
        if (got.status, got.region) != (200, home):
            problems.append(f"{s} (pinned to {home}) via its gateway, etcd full: {got}")

    # ---- a blackout while etcd is full: refused, not moved, not failed over ------------
    assert dep.stop_servers(BLACKOUT)

    async def agent_sees_blackout() -> bool:
        expr = f'tectonic_agent_region_health{{region="{BLACKOUT}", verdict="UNHEALTHY"}} == 1'
        return bool(await prom.query(expr))

    await until(agent_sees_blackout, within=30, every=0.5, what=f"{BLACKOUT}'s agent: UNHEALTHY")
    await asyncio.sleep(3)  # leader ticks that would fail it over, could they write
    blacked = [s for s, home in sessions.items() if home == BLACKOUT]
    others = [s for s, home in sessions.items() if home != BLACKOUT]
    for s in blacked:
        got = await client.chat(s, via=BLACKOUT)
        if got.status != 503:
            problems.append(f"{s} (pinned to blacked-out {BLACKOUT}), etcd full: {got}")
    for s in others:
        got = await client.chat(s, via=sessions[s])
        if (got.status, got.region) != (200, sessions[s]):
            problems.append(f"{s} (pinned to {sessions[s]}) during the blackout: {got}")
    if (await store.get_prefix(dep.keys.routing_prefix())).kvs != routing_before:
        problems.append(f"routing in etcd changed while etcd was full, {BLACKOUT} blacked out")
    await expect(f"status with {BLACKOUT} blacked out, etcd full", refusing, 5)

    # ---- a later lease bucket: every session at a gateway that never saw it ----------
    await asyncio.sleep(max(0.0, (full_bucket + 1) * BUCKET_S - time.time()) + 0.5)
    assert int(time.time() // BUCKET_S) > full_bucket
    assert await store.alarms() == ["NOSPACE"]
    # blacked-out us-east's to us-west; us-west's to us-central; us-central's to us-west
    stranger = {BLACKOUT: regions[1], regions[1]: regions[2], regions[2]: regions[1]}
    for s, home in sessions.items():
        via = stranger[home]
        got = await client.chat(s, via=via)
        pinned = await pin_of(store, dep, s)
        if pinned != home:
            problems.append(f"{s} re-pinned {home} -> {pinned} while etcd was full")
        if not (got.status == 503 or (got.status, got.region) == (200, home)):
            problems.append(f"{s} (pinned to {home}) via {via}'s gateway, etcd full: {got}")
    answered_by_two = {s: sorted(set(r)) for s, r in client.served.items() if len(set(r)) > 1}
    if answered_by_two:
        problems.append(f"sessions answered by two regions while etcd was full: {answered_by_two}")

    # ---- the page: TectonicStoreRefusingWrites fires for both replicas ----------------
    async def firing() -> str:
        seen = {a["labels"]["instance"] for a in await prom.alerts(ALERT, "firing")}
        return "" if seen == cp_instances else f"firing for {sorted(seen)}"

    # its `for` runs from the first evaluation after the fill, a scrape or two after it
    await expect(
        f"{ALERT} firing for both replicas", firing, full_at + ALERT_FOR_S + 30 - time.time()
    )
    rule = next(r for r in await prom.rules() if r["name"] == ALERT)
    assert (rule["query"], rule["duration"], rule["health"]) == (ALERT_EXPR, ALERT_FOR_S, "ok")
    if (await prom.alerts(ALERT, "firing")) and time.time() - full_at < ALERT_FOR_S:
        problems.append(f"{ALERT} fired before its `for: 1m`")
    await expect("status after a minute of refusals", refusing, 5)

    # ---- recovery: delete the filler, compact, defragment, disarm ----------------------
    for key in filler:
        assert await store.delete(key)
    await store.compact((await store.get_prefix(FILLER_PREFIX)).revision)
    await etcdctl(ctl, dep.etcd_endpoints, "defrag")
    await etcdctl(ctl, dep.etcd_endpoints, "alarm", "disarm")
    assert await store.alarms() == []
    assert "NOSPACE" not in await etcdctl(ctl, dep.etcd_endpoints, "alarm", "list")

    async def writable_again() -> str:
        bad = []
        for st in (await replicas.grpc_status()).values():
            if isinstance(st, str):
                bad.append(st)
                continue
            shown = states(st)
            if (
                not st.store.writable
                or st.store.reason
                or list(st.store.alarms)
                or any(state != stored for state, stored in shown.values())
                or shown[BLACKOUT][0] != pb.FAILING_OVER
                or any(shown[r] != (NORMAL, NORMAL) for r in regions if r != BLACKOUT)
            ):
                bad.append(describe(st))
        for rid, body in (await replicas.http_status()).items():
            if isinstance(body, str):
                bad.append(body)
            elif body["store"]["writable"] is not True or any(
                r["state"] != r["stored_state"] for r in body["regions"]
            ):
                bad.append(describe_http(rid, body))
        return "; ".join(dict.fromkeys(bad))

    await expect(f"real states again, {BLACKOUT} failed over now", writable_again, 30)
    await expect("tectonic_store_writable 1 again", lambda: writable_metric_is(1), 15)

    async def resolved() -> str:
        alerts = await prom.alerts(ALERT, "firing")
        return f"still firing: {[a['labels'] for a in alerts]}" if alerts else ""

    await expect(f"{ALERT} resolved", resolved, 15)

    # The blacked-out region's sessions move now, and etcd records where to.
    for s in blacked:
        got = await client.chat(s, via=BLACKOUT)
        if got.status != 200 or got.region == BLACKOUT:
            problems.append(f"{s} after recovery, {BLACKOUT} still down: {got}")
        elif (pinned := await pin_of(store, dep, s)) != got.region:
            problems.append(f"{s} served by {got.region} after recovery, pinned to {pinned}")
    for s in others:
        got = await client.chat(s, via=sessions[s])
        if (got.status, got.region) != (200, sessions[s]):
            problems.append(f"{s} (pinned to {sessions[s]}) after recovery: {got}")
    return problems
