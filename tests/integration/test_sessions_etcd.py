"""Sticky sessions on a real etcd: races, expiry, the gRPC API of a real control-plane
replica, and the sessions bench's output. That a failover re-pins nothing in the
background, and that idle sessions come home after recovery, is
``tests/integration/test_sessions_come_home.py``."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from contextlib import aclosing
from pathlib import Path
from typing import Any

import grpc
import pytest
from aetcd import rpc
from hypothesis import given
from hypothesis import strategies as st
from tectonic_api.v1 import controlplane_pb2 as pb

from chaos.lab.local_etcd import EtcdServer
from controlplane.kernel.clock import Clock, FakeClock, SystemClock
from controlplane.kernel.config import Topology
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import Routing
from controlplane.kernel.sessions.resolve import PinAction
from controlplane.kernel.sessions.store import SessionStore
from controlplane.kernel.store.etcd import EtcdStore, _txn_request
from controlplane.kernel.store.port import (
    Compare,
    CompareOp,
    CompareTarget,
    Delete,
    EventType,
    Op,
    Put,
    Store,
)
from tests.integration.cp_harness import fast_topology, running_replica

pytestmark = pytest.mark.etcd

REGIONS = ("us-east", "us-west", "us-central")
NORMAL = {r: Routing(targets={r: 1.0}) for r in REGIONS}


def store_for(
    store: Store, keys: Keys, writer: str = "gw", clock: Clock | None = None, **kw: int
) -> SessionStore:
    clock = clock or SystemClock()
    return SessionStore(store, keys, regions=REGIONS, clock=clock, writer=writer, **kw)


async def test_racing_gateways_agree_on_a_new_session(etcd_store: EtcdStore, keys: Keys) -> None:
    # One frozen clock: the races fall in one lease bucket (60 s) however long they take.
    # On the system clock a run that straddled a bucket's end re-attached a session to
    # the next bucket's lease on a later use (a second write, version 2), as it should.
    clock = FakeClock(time.time())
    gws = [store_for(etcd_store, keys, f"gw{i}", clock) for i in range(4)]
    results = await asyncio.gather(
        *(gws[i % 4].resolve(f"race-{j}", "us-east", NORMAL) for j in range(20) for i in range(8))
    )
    for j in range(20):
        mine = results[j * 8 : (j + 1) * 8]
        assert len({r.pin for r in mine}) == 1
        assert [r.action for r in mine].count(PinAction.CREATE) == 1
        kv = await etcd_store.get(keys.session(f"race-{j}"))
        assert kv is not None and kv.version == 1
    leases = {kv.lease for kv in (await etcd_store.get_prefix(keys.sessions_prefix())).kvs}
    assert len(leases) == 1  # four gateways, one bucket, one lease


async def test_sessions_expire_with_their_bucket_lease(etcd_store: EtcdStore, keys: Keys) -> None:
    gw = store_for(etcd_store, keys, ttl_s=1, bucket_s=1)  # lease TTL 2 s
    await gw.resolve("short-lived", "us-west", NORMAL)
    got = await gw.get("short-lived")
    assert got is not None
    key = keys.session("short-lived")
    async with (
        asyncio.timeout(15),
        aclosing(etcd_store.watch_prefix(key, start_revision=got[1] + 1)) as events,
    ):
        async for ev in events:
            if ev.kv.key == key and ev.type is EventType.DELETE:
                break
    assert await gw.get("short-lived") is None


@pytest.fixture
def topology(etcd: EtcdServer) -> Topology:
    return fast_topology(etcd.endpoints, f"t{uuid.uuid4().hex[:8]}")


async def test_get_and_pin_session_over_grpc(topology: Topology) -> None:
    async with running_replica(topology) as run:
        s = run.stub
        missing = await s.GetSession(pb.GetSessionRequest(session_id="nobody"))
        assert not missing.found and missing.session_id == "nobody"

        async def code_of(call: object) -> grpc.StatusCode:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await call  # type: ignore[misc]
            return e.value.code()

        bad = [
            s.GetSession(pb.GetSessionRequest(session_id="a/b")),
            s.GetSession(pb.GetSessionRequest(session_id="")),
            s.PinSession(pb.PinSessionRequest(session_id="s1", region="mars", reason="x")),
            s.PinSession(
                pb.PinSessionRequest(session_id="s1", region="west", home="x", reason="x")
            ),
            s.PinSession(pb.PinSessionRequest(session_id="s1", region="west")),  # no reason
            s.PinSession(pb.PinSessionRequest(session_id="x" * 300, region="west", reason="x")),
        ]
        for call in bad:
            assert await code_of(call) == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.aio.AioRpcError, match="printable ASCII"):
            await s.GetSession(pb.GetSessionRequest(session_id="a/b"))

        info = await s.PinSession(
            pb.PinSessionRequest(
                session_id="s1", region="west", home="east", reason="VIP test", actor="alice"
            )
        )
        assert (info.found, info.home, info.region, info.moves) == (True, "east", "west", 0)
        moved = await s.PinSession(
            pb.PinSessionRequest(session_id="s1", region="central", reason="drain west")
        )
        assert (moved.home, moved.region, moved.moves) == ("east", "central", 1)
        got = await s.GetSession(pb.GetSessionRequest(session_id="s1"))
        assert got == moved
        hist = await s.GetHistory(pb.HistoryRequest(limit=100))
        pins = [(e.actor, e.reason, e.region) for e in hist.events if e.action == "session_pin"]
        assert pins == [("alice", "VIP test", "west"), ("operator", "drain west", "central")]


def test_the_sessions_bench_prints_a_well_formed_headline() -> None:
    """Shape only: whether the goals are met is for the bench on a quiet machine."""
    script = (
        "import argparse, sys; from bench import sessions; p = argparse.ArgumentParser(); "
        "sessions.add_arguments(p); sys.exit(sessions.run(p.parse_args(sys.argv[1:])))"
    )
    args = ["--sessions-large", "3000", "--switches", "10"]
    proc = subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [json.loads(line) for line in proc.stdout.strip().splitlines()]
    kinds = [(x.get("kind"), x.get("phase")) for x in lines[:-1]]
    assert kinds == [
        ("load", None),
        ("load", None),
        *[("switch", "after_bulk_load")] * 2,
        *[("switch", "settled")] * 2,
    ]
    out = lines[-1]
    assert out["bench"] == "sessions" and out["sessions_large"] == 3000
    for key in ("switch_ms_p99_1k", "switch_ms_p99_1m", "switch_ratio"):
        assert isinstance(out[key], int | float) and out[key] > 0, key
    assert set(out["switch_after_bulk_load"]) == {"ms_p99_1k", "ms_p99_1m", "ratio"}
    assert out["etcd_gogc"] is None  # etcd's own GC setting unless --etcd-gogc
    # etcd's own cost, from its /metrics: its CPU counter moves in 10 ms ticks, so a
    # small run may read 0; allocation and the client's CPU are fine-grained.
    for line in lines[2:6]:
        assert line["etcd_alloc_kib_per_switch"] > 0 and line["etcd_cpu_ms_per_switch"] >= 0
    assert set(out["met"]) == set(out["goals"]) == {"switch_ratio"}
    assert not [k for k in out if "repin" in k]  # the background re-pin is gone (issue 27)


# ---- the adapter's TxnRequest (bulk writers send up to 128 guarded puts per transaction) ----
keys_st = st.text(st.characters(codec="utf-8"), max_size=12)
int64 = st.integers(-(2**63), 2**63 - 1)
compares = st.one_of(
    st.builds(
        Compare,
        keys_st,
        st.sampled_from([t for t in CompareTarget if t is not CompareTarget.VALUE]),
        st.sampled_from(CompareOp),
        int64,
    ),
    st.builds(
        Compare,
        keys_st,
        st.just(CompareTarget.VALUE),
        st.sampled_from(CompareOp),
        st.binary(max_size=8),
    ),
)
ops = st.one_of(
    st.builds(Put, keys_st, st.binary(max_size=8), st.one_of(st.just(0), int64)),
    st.builds(Delete, keys_st),
)


def _reference_request(cs: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op]) -> Any:
    """The TxnRequest as the protobuf constructors build it, field by field."""
    targets = {
        CompareTarget.VERSION: ("version", rpc.Compare.VERSION),
        CompareTarget.CREATE: ("create_revision", rpc.Compare.CREATE),
        CompareTarget.MOD: ("mod_revision", rpc.Compare.MOD),
        CompareTarget.VALUE: ("value", rpc.Compare.VALUE),
    }
    results = {
        CompareOp.EQ: rpc.Compare.EQUAL,
        CompareOp.NE: rpc.Compare.NOT_EQUAL,
        CompareOp.LT: rpc.Compare.LESS,
        CompareOp.GT: rpc.Compare.GREATER,
    }

    def compare(c: Compare) -> Any:
        field, target = targets[c.target]
        key = c.key.encode("utf-8", "surrogateescape")
        return rpc.Compare(key=key, target=target, result=results[c.op], **{field: c.value})

    def op(o: Op) -> Any:
        key = o.key.encode("utf-8", "surrogateescape")
        if isinstance(o, Put):
            return rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=o.value, lease=o.lease))
        return rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=key))

    return rpc.TxnRequest(
        compare=[compare(c) for c in cs],
        success=[op(o) for o in success],
        failure=[op(o) for o in failure],
    )


@given(st.lists(compares, max_size=4), st.lists(ops, max_size=4), st.lists(ops, max_size=4))
def test_the_txn_request_is_what_protobuf_builds(
    cs: list[Compare], success: list[Op], failure: list[Op]
) -> None:
    built = _txn_request(cs, success, failure)
    reference = _reference_request(cs, success, failure)
    assert built == reference
    assert built.SerializeToString(deterministic=True) == reference.SerializeToString(
        deterministic=True
    )
