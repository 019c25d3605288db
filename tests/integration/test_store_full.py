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

The lab and what the test sees of it: tests/integration/store_full_helpers.py.

What is judged is states, answers and alerts, each polled for a window many times what
it takes (the alert's minute is the rule's own), so scripts/test.sh runs this module
beside the benches' smoke tests (OUTCOMES_ONLY there): add nothing that times or judges
a latency.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import grpc
import pytest
import yaml
from tectonic_api.v1 import controlplane_pb2 as pb
from tectonic_api.v1 import controlplane_pb2_grpc as pb_grpc

from chaos.lab.deployment import LocalDeployment
from chaos.lab.procs import until
from chaos.lab.spec import DeploymentSpec
from controlplane.kernel.store.etcd import EtcdStore
from controlplane.kernel.store.port import StoreFull
from controlplane.kernel.store.settings import EtcdConfig
from tests.integration.store_full_helpers import (
    QUOTA_BYTES,
    Client,
    Replicas,
    control_plane_logs,
    describe,
    describe_http,
    etcdctl,
    etcdctl_binary,
    lab_on_small_etcd,
    pin_of,
    settle,
    states,
    workdirs,
)
from tests.integration.test_prometheus_lab import RULES, Prom, prometheus, prometheus_binary

pytestmark = [pytest.mark.slow, pytest.mark.etcd, pytest.mark.timeout(300)]

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
UNKNOWN = pb.REGION_STATE_UNKNOWN
NORMAL = pb.NORMAL


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
