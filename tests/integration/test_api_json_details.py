"""Every event and audit detail is text a non-Python client parses: a real replica on a
real etcd runs failovers and recoveries, and every detail of every event is read back
three ways (WatchEvents, GetHistory, the raw audit entries in etcd) and parsed as JSON
would be by a Node client."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import uuid
from collections.abc import Mapping

import pytest
from tectonic_api.v1 import controlplane_pb2 as pb
from tectonic_api.v1 import controlplane_pb2_grpc as pb_grpc

from controlplane.kernel.config import Topology
from controlplane.kernel.keys import Keys
from controlplane.kernel.store.etcd import EtcdStore
from tests.integration.cp_harness import REGIONS, fast_topology, region, running_replica, until

pytestmark = pytest.mark.etcd

# A Python dict or list repr: a single-quoted string where JSON has its double quotes.
PY_REPR = re.compile(r"[{\[,:]\s*'|'\s*[:,}\]]")


@pytest.fixture
def topology(etcd: object) -> Topology:
    return fast_topology(etcd.endpoints, f"j{uuid.uuid4().hex[:8]}")  # type: ignore[attr-defined]


def check_details(where: str, action: str, details: Mapping[str, str]) -> None:
    for key, value in details.items():
        assert isinstance(value, str), (where, action, key, value)
        assert not PY_REPR.search(value), f"{where}: {action}.{key} is a Python repr: {value}"
        if value[:1] in "{[":
            json.loads(value)  # raises: not JSON
    if action == "routing_switch":
        routes = {r: json.loads(v) for r, v in details.items()}
        assert routes and set(routes) <= set(REGIONS), (where, details)
        for targets in routes.values():
            assert isinstance(targets, dict) and set(targets) <= set(REGIONS), (where, details)
            assert all(isinstance(w, float | int) for w in targets.values()), (where, details)


async def fail_over_and_back(s: pb_grpc.ControlPlaneStub) -> None:
    """An automatic failover of east (down) and its graduated recovery, then an operator's
    failover of west (to central) and its recovery."""
    await until(
        lambda st: region(st, "east").failover_steps_done == "switch,prewarm",
        s,
        {"east": pb.UNHEALTHY},
    )
    await until(lambda st: region(st, "east").state == pb.NORMAL, s, {})
    resp = await s.RequestFailover(
        pb.FailoverRequest(region="west", to=["central"], reason="drain west", actor="alice")
    )
    assert resp.accepted
    await until(lambda st: region(st, "west").failover_steps_done == "prewarm,switch", s, {})
    await s.RequestRecovery(pb.RecoveryRequest(region="west", reason="done", actor="alice"))
    await until(lambda st: region(st, "west").state == pb.NORMAL, s, {})


async def raw_audit(topology: Topology) -> dict[str, dict[str, object]]:
    """The audit entries as etcd holds them, parsed as plain JSON (no pydantic)."""
    keys = Keys(topology.cluster)
    store = EtcdStore(topology.etcd)
    await store.connect()
    try:
        page = await store.get_prefix(keys.audit_prefix())
    finally:
        await store.close()
    return {kv.key.removeprefix(keys.audit_prefix()): json.loads(kv.value) for kv in page.kvs}


async def test_every_detail_of_a_failover_is_json_a_node_client_parses(
    topology: Topology,
) -> None:
    async with running_replica(topology) as run:
        s = run.stub
        await until(
            lambda st: st.responder_is_leader and all(r.health == pb.HEALTHY for r in st.regions),
            s,
            {},
        )
        streamed: list[pb.Event] = []

        async def watch() -> None:
            async for ev in s.WatchEvents(pb.WatchEventsRequest()):
                streamed.append(ev)

        watcher = asyncio.create_task(watch())
        await asyncio.sleep(0.5)  # subscribed before anything happens
        await fail_over_and_back(s)
        history = list((await s.GetHistory(pb.HistoryRequest(limit=1000))).events)
        # The leader's first tick published the cluster spec, before the stream began.
        after = {e.id for e in history if e.action != "spec_published"}
        async with asyncio.timeout(10):  # the stream catches up with the history
            while True:
                if not after - {e.id for e in streamed}:
                    break
                await asyncio.sleep(0.1)
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        audit = await raw_audit(topology)

    for ev in streamed:
        check_details("WatchEvents", ev.action, ev.details)
    for ev in history:
        check_details("GetHistory", ev.action, ev.details)
    for key, entry in audit.items():
        details = entry["details"]
        assert isinstance(details, dict), key
        check_details(f"etcd {key}", str(entry["action"]), details)

    # The structured values are there, and read as what they mean.
    by_action: dict[str, list[pb.Event]] = {}
    for ev in history:
        by_action.setdefault(ev.action, []).append(ev)
    assert {e.id for e in history} <= set(audit)
    switches = {e.region: e for e in by_action["routing_switch"]}
    east = json.loads(switches["east"].details["east"])
    assert set(east) == {"west", "central"} and abs(sum(east.values()) - 1) < 1e-6
    assert json.loads(switches["west"].details["west"]) == {"central": 1.0}
    [intent] = [e for e in by_action["intent_failover"] if e.region == "west"]
    assert json.loads(intent.details["to"]) == ["central"] and intent.details["force"] == "false"
    steps = by_action["recovery_step"]
    assert steps and all(set(json.loads(e.details["routing"])) == {e.region} for e in steps)
    complete = [e for e in by_action["transition"] if e.details["trigger"] == "complete"]
    assert {e.region for e in complete} == {"east", "west"}
    for e in complete:
        assert json.loads(e.details["routing"]) == {e.region: {e.region: 1.0}}
