"""SessionStore on the in-memory store: races, re-pins, shared bucket leases, expiry,
and the background re-pin after a failover (behaviour only; figures are in
``bench/sessions.py``)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.core.decide import decide
from controlplane.kernel.clock import FakeClock
from controlplane.kernel.codec import decode, encode
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import (
    AuditEntry,
    FailoverPlan,
    FailoverProgress,
    RegionRecord,
    RegionState,
    Routing,
)
from controlplane.kernel.session_store import InvalidSessionId, SessionStore, _Repin
from controlplane.kernel.sessions import NoRegionServing, PinAction, SessionPin, resolve
from controlplane.kernel.snapshot_reader import read_snapshot
from controlplane.kernel.store.memory import MemoryStore
from controlplane.kernel.store.port import Compare, KeyValue, Op, TxnResult
from controlplane.orchestrator import Orchestrator
from controlplane.prewarm import NoPrefixData
from tests.unit.world import topology

REGIONS = ("us-east", "us-west", "us-central", "eu-west")
NORMAL = {r: Routing(targets={r: 1.0}) for r in REGIONS}
EAST_DOWN = {**NORMAL, "us-east": Routing(targets={"us-west": 0.6, "us-central": 0.4}, epoch=1)}
EAST_BACK = {**NORMAL, "us-east": Routing(targets={"us-east": 1.0}, epoch=2)}
T0 = 60.0 * 20_000  # the start of a 60 s bucket, so that tests know where buckets end


class RacyStore(MemoryStore):
    """Yields to the loop before each read and transaction, so that concurrent callers
    interleave as they do over a network; records transaction sizes; runs ``before_txn``
    (once) before the first transaction with at least ``hook_min_ops`` ops."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock=clock.now)
        self.txn_sizes: list[int] = []
        self.lost: list[str] = []  # first key of each transaction whose compare failed
        self.before_txn: Callable[[], Awaitable[None]] | None = None
        self.hook_min_ops = 2

    async def get(self, key: str) -> KeyValue | None:
        await asyncio.sleep(0)
        return await super().get(key)

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        await asyncio.sleep(0)
        if self.before_txn is not None and len(success) >= self.hook_min_ops:
            hook, self.before_txn = self.before_txn, None
            await hook()
        self.txn_sizes.append(len(success))
        result = await super().txn(compares, success, failure)
        if not result.succeeded and success:
            self.lost.append(success[0].key)
        return result


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def store(clock: FakeClock) -> RacyStore:
    return RacyStore(clock)


def sessions(store: MemoryStore, clock: FakeClock, keys: Keys, writer: str = "gw1") -> SessionStore:
    return SessionStore(store, keys, regions=REGIONS, clock=clock, writer=writer)


async def stored(store: MemoryStore, keys: Keys, sid: str) -> tuple[SessionPin, KeyValue]:
    kv = await MemoryStore.get(store, keys.session(sid))
    assert kv is not None, sid
    return decode(SessionPin, kv.value), kv


async def test_two_gateways_racing_for_a_new_session_agree(
    store: RacyStore, clock: FakeClock, keys: Keys
) -> None:
    later = FakeClock(T0 + 5)  # the second gateway's pin would differ in pinned_at
    gw1, gw2 = sessions(store, clock, keys, "gw1"), sessions(store, later, keys, "gw2")
    a, b = await asyncio.gather(
        gw1.resolve("chat-1", "us-east", NORMAL), gw2.resolve("chat-1", "us-east", NORMAL)
    )
    assert a.pin == b.pin and a.region == b.region == "us-east"
    assert sorted([a.action, b.action]) == sorted([PinAction.CREATE, PinAction.KEEP])
    pin, kv = await stored(store, keys, "chat-1")
    assert pin == a.pin and kv.version == 1  # written once
    assert store.lost.count(keys.session("chat-1")) == 1  # the loser's create did race
    # Both gateways attach to the one lease of the bucket.
    assert gw1.leases.granted + gw2.leases.granted == 1


async def test_repin_is_a_cas_and_racing_repins_move_once(
    store: RacyStore, clock: FakeClock, keys: Keys
) -> None:
    gw1, gw2 = sessions(store, clock, keys, "gw1"), sessions(store, clock, keys, "gw2")
    created = await gw1.resolve("s1", "us-east", NORMAL)
    assert created.action is PinAction.CREATE
    clock.advance(10)
    a, b = await asyncio.gather(
        gw1.resolve("s1", "us-east", EAST_DOWN), gw2.resolve("s1", "us-east", EAST_DOWN)
    )
    assert a.region == b.region and a.region in ("us-west", "us-central")
    assert sorted([a.action, b.action]) == sorted([PinAction.REPIN, PinAction.KEEP])
    pin, kv = await stored(store, keys, "s1")
    assert pin.moves == 1 and pin.epoch == 1 and pin.home == "us-east" and kv.version == 2
    assert store.lost == [keys.session("s1")]  # the loser's CAS failed; it re-read


async def test_a_moved_session_never_bounces_back(
    store: RacyStore, clock: FakeClock, keys: Keys
) -> None:
    gw = sessions(store, clock, keys)
    await gw.resolve("s1", "us-east", NORMAL)
    moved = await gw.resolve("s1", "us-east", EAST_DOWN)
    _, before = await stored(store, keys, "s1")
    for routings in (EAST_DOWN, EAST_BACK, NORMAL):
        again = await gw.resolve("s1", "us-east", routings)
        assert again.action is PinAction.KEEP and again.region == moved.region
    pin, kv = await stored(store, keys, "s1")
    assert pin.moves == 1 and kv.mod_revision == before.mod_revision  # KEEP wrote nothing


async def test_one_lease_per_bucket_for_a_thousand_sessions(
    store: RacyStore, clock: FakeClock, keys: Keys
) -> None:
    gw = sessions(store, clock, keys)
    for i in range(1000):
        await gw.resolve(f"s{i}", REGIONS[i % 3], NORMAL)
        clock.advance(0.05)  # 50 s in all: one bucket
    page = await store.get_prefix(keys.sessions_prefix())
    assert len(page.kvs) == 1000
    assert len({kv.lease for kv in page.kvs}) == 1 and page.kvs[0].lease != 0
    assert gw.leases.granted == 1


async def test_sessions_expire_with_their_bucket_unless_used_again(
    store: RacyStore, clock: FakeClock, keys: Keys
) -> None:
    gw = sessions(store, clock, keys)  # ttl 3600 s, buckets of 60 s
    await gw.resolve("used", "us-east", NORMAL)
    await gw.resolve("idle", "us-east", NORMAL)
    _, first = await stored(store, keys, "used")

    clock.advance(1800)  # a later bucket: the next use re-attaches, once
    await gw.resolve("used", "us-east", NORMAL)
    _, touched = await stored(store, keys, "used")
    assert touched.lease != first.lease and touched.value == first.value
    await gw.resolve("used", "us-east", NORMAL)  # same bucket: no second write
    _, again = await stored(store, keys, "used")
    assert again.mod_revision == touched.mod_revision

    clock.advance(3660 - 1800)  # the first bucket's lease ends (ttl + bucket)
    store.expire_leases()
    assert await gw.get("idle") is None
    assert await gw.get("used") is not None
    clock.advance(1800)
    store.expire_leases()
    assert await gw.get("used") is None


async def test_a_vanished_bucket_lease_is_granted_again(
    store: RacyStore, clock: FakeClock, keys: Keys
) -> None:
    gw = sessions(store, clock, keys)
    await gw.resolve("a", "us-east", NORMAL)
    _, kv = await stored(store, keys, "a")
    await store.revoke_lease(kv.lease)  # e.g. revoked by hand; its sessions go with it
    res = await gw.resolve("b", "us-east", NORMAL)
    assert res.action is PinAction.CREATE
    _, b = await stored(store, keys, "b")
    assert b.lease not in (0, kv.lease) and gw.leases.granted == 2


async def test_bad_input_is_refused_with_the_rule(
    store: RacyStore, clock: FakeClock, keys: Keys
) -> None:
    gw = sessions(store, clock, keys)
    for bad in ("", "a/b", "x" * 257, "caf\u00e9", "tab\there"):
        with pytest.raises(InvalidSessionId, match="printable ASCII"):
            await gw.resolve(bad, "us-east", NORMAL)
    await gw.resolve("x" * 256, "us-east", NORMAL)  # the longest allowed
    with pytest.raises(ValueError, match="unknown home region 'mars'; known regions: us-east"):
        await gw.resolve("ok", "mars", NORMAL)
    with pytest.raises(ValueError, match="unknown region region 'mars'"):
        await gw.pin("ok", "mars", actor="alice", reason="test")
    with pytest.raises(ValueError, match="reason"):
        await gw.pin("ok", "us-west", actor="alice", reason=" ")


async def test_operator_pin_is_audited_in_the_same_transaction(
    store: RacyStore, clock: FakeClock, keys: Keys
) -> None:
    gw = sessions(store, clock, keys)
    await gw.resolve("s1", "us-east", NORMAL)
    pin = await gw.pin("s1", "us-west", actor="alice", reason="customer asked")
    assert (pin.home, pin.region, pin.moves) == ("us-east", "us-west", 1)
    new = await gw.pin("s2", "us-central", actor="bob", reason="debug")
    assert (new.home, new.region, new.moves) == ("us-central", "us-central", 0)
    got = await gw.get("s1")
    assert got is not None and got[0] == pin
    audit = (await store.get_prefix(keys.audit_prefix())).kvs
    entries = [decode(AuditEntry, kv.value) for kv in audit]
    assert [(e.action, e.actor, e.reason, e.details["session"]) for e in entries] == [
        ("session_pin", "alice", "customer asked", "s1"),
        ("session_pin", "bob", "debug", "s2"),
    ]
    _, kv = await stored(store, keys, "s1")
    assert audit[0].mod_revision == kv.mod_revision  # one transaction


async def seed(gw: SessionStore, n: int) -> None:
    """``n`` sessions homed round-robin in us-east, us-west, us-central."""
    for i in range(n):
        await gw.resolve(f"s{i:05d}", REGIONS[i % 3], NORMAL)


async def test_repin_away_moves_exactly_the_sessions_of_the_failed_region(
    store: RacyStore, clock: FakeClock, keys: Keys
) -> None:
    gw = sessions(store, clock, keys)
    await seed(gw, 1500)
    before = {kv.key: kv for kv in (await store.get_prefix(keys.sessions_prefix())).kvs}
    clock.advance(5)
    store.txn_sizes.clear()

    report = await gw.repin_away("us-east", EAST_DOWN)

    assert (report.scanned, report.moved, report.conflicts) == (1500, 500, 0)
    assert store.txn_sizes and max(store.txn_sizes) <= 128 and sum(store.txn_sizes) == 500
    assert "re-pinned 500 sessions of us-east in" in report.summary()
    for kv in (await store.get_prefix(keys.sessions_prefix())).kvs:
        old = before[kv.key]
        old_pin, pin = decode(SessionPin, old.value), decode(SessionPin, kv.value)
        if old_pin.region != "us-east":
            assert kv.mod_revision == old.mod_revision  # untouched
            continue
        lazy = resolve(old_pin, kv.key.rsplit("/", 1)[1], "us-east", EAST_DOWN, clock.now())
        assert pin == lazy.pin  # the lazy path would have written the same pin
        assert pin.moves == 1 and kv.lease == old.lease  # expiry kept
    # A region that still serves: nothing to do.
    assert (await gw.repin_away("us-west", EAST_DOWN)).moved == 0


async def test_repin_away_honours_a_concurrent_lazy_repin(
    store: RacyStore, clock: FakeClock, keys: Keys
) -> None:
    gw = sessions(store, clock, keys)
    await seed(gw, 600)  # 200 on us-east
    gateway = sessions(store, FakeClock(T0 + 30), keys, "gw2")
    raced = ["s00000", "s00003", "s00006"]  # in the first batch (key order)

    async def gateway_gets_there_first() -> None:
        for sid in raced:
            res = await gateway.resolve(sid, "us-east", EAST_DOWN)
            assert res.action is PinAction.REPIN

    store.before_txn = gateway_gets_there_first
    report = await gw.repin_away("us-east", EAST_DOWN)

    assert (report.moved, report.conflicts) == (197, 3)
    for sid in raced:
        pin, kv = await stored(store, keys, sid)
        assert pin.moves == 1 and pin.pinned_at == T0 + 30 and kv.version == 2  # not rewritten
    page = await store.get_prefix(keys.sessions_prefix())
    pins = [decode(SessionPin, kv.value) for kv in page.kvs]
    assert all(p.region != "us-east" and p.moves <= 1 for p in pins)


async def failing_over(store: RacyStore, clock: FakeClock) -> tuple[Orchestrator, Keys]:
    """300 sessions (100 on us-east) and us-east FAILING_OVER with its switch pending."""
    topo = topology()
    keys = Keys(topo.cluster)
    gw = sessions(store, clock, keys)
    await seed(gw, 300)
    plan = FailoverPlan(
        source="us-east", targets={"us-west": 0.6, "us-central": 0.4}, reason="down", actor="t"
    )
    record = RegionRecord(
        region="us-east",
        state=RegionState.FAILING_OVER,
        epoch=1,
        failover=FailoverProgress(plan=plan, started_at=clock.now()),
    )
    await store.put(keys.region_state("us-east"), encode(record))
    orch = Orchestrator(store, keys, topo, clock, list, NoPrefixData(), "cp-test", sessions=gw)
    return orch, keys


async def leader_tick(orch: Orchestrator) -> None:
    """One tick of the leader's cycle: it writes the pending switch and starts its re-pin."""
    snap = await read_snapshot(orch.store, orch.keys, orch.topology, orch.clock.now())
    await orch.apply(decide(snap, orch.topology, orch.actor, orch.jobs()))


async def test_a_switch_by_the_orchestrator_repins_in_the_background(
    store: RacyStore, clock: FakeClock
) -> None:
    orch, keys = await failing_over(store, clock)
    await leader_tick(orch)
    audit: list[AuditEntry] = []
    async with asyncio.timeout(10):
        while not any(a.action == "sessions_repinned" for a in audit):
            await asyncio.sleep(0.01)
            page = await store.get_prefix(keys.audit_prefix())
            audit = [decode(AuditEntry, kv.value) for kv in page.kvs]
    done = next(a for a in audit if a.action == "sessions_repinned")
    assert done.region == "us-east" and done.details["moved"] == "100"
    pins = [decode(SessionPin, kv.value) for kv in await _sessions(store, keys)]
    assert sum(p.moves for p in pins) == 100 and all(p.region != "us-east" for p in pins)
    await orch.stop_failovers()


async def _sessions(store: MemoryStore, keys: Keys) -> list[KeyValue]:
    return (await store.get_prefix(keys.sessions_prefix())).kvs


async def test_losing_leadership_cancels_the_background_repin(
    store: RacyStore, clock: FakeClock
) -> None:
    orch, keys = await failing_over(store, clock)
    started, never = asyncio.Event(), asyncio.Event()

    async def stall() -> None:  # the first re-pin batch waits until cancelled
        started.set()
        await never.wait()

    store.hook_min_ops = 100  # a re-pin batch, not the switch (5 ops)
    store.before_txn = stall
    await leader_tick(orch)
    async with asyncio.timeout(10):
        await started.wait()
    await orch.stop_failovers()  # what the loop does when leadership is lost

    audit = [
        decode(AuditEntry, kv.value) for kv in (await store.get_prefix(keys.audit_prefix())).kvs
    ]
    assert "routing_switch" in [a.action for a in audit]
    assert "sessions_repinned" not in [a.action for a in audit]
    pins = [decode(SessionPin, kv.value) for kv in await _sessions(store, keys)]
    assert sum(p.region == "us-east" for p in pins) == 100  # nothing moved


# ---- the background re-pin's fast path decides what the lazy path decides --------------
session_ids = st.text(
    st.characters(min_codepoint=0x20, max_codepoint=0x7E, blacklist_characters="/"),
    min_size=1,
    max_size=24,
)
weights = st.one_of(st.just(0.0), st.floats(min_value=0.01, max_value=5.0))
# Mostly no routing (the region serves itself), sometimes any routing at all.
some_routing = st.one_of(
    st.none(),
    st.none(),
    st.builds(
        Routing,
        targets=st.dictionaries(st.sampled_from(REGIONS), weights, max_size=4),
        epoch=st.integers(0, 9),
    ),
)
CORRUPT = [b"", b"{", b'{"home":"us-east"}', b'{"region":"us-east",}', b"\xff"]


@settings(max_examples=300)
@given(st.data())
def test_the_repin_fast_path_writes_exactly_what_resolve_would(data: st.DataObject) -> None:
    """``repin_away`` decides per session without ``resolve`` (placements built once per
    home, each distinct new pin encoded once); whatever it writes must be byte for byte
    what the lazy path writes, and it must skip exactly what it should."""
    source = data.draw(st.sampled_from(REGIONS))
    others = [r for r in REGIONS if r != source]
    drawn = {r: data.draw(some_routing) for r in REGIONS}
    routings = {r: routing for r, routing in drawn.items() if routing is not None}
    # ``source`` has failed over: its routing no longer sends its traffic to itself.
    away = data.draw(st.dictionaries(st.sampled_from(others), weights, min_size=1, max_size=3))
    routings[source] = Routing(targets=away, epoch=data.draw(st.integers(0, 9)))
    near_source = st.one_of(st.just(source), st.sampled_from(REGIONS))
    pins = st.builds(
        SessionPin,
        home=near_source,
        region=near_source,
        epoch=st.integers(0, 9),
        pinned_at=st.floats(0, 2e9),
        moves=st.integers(0, 3),
    )
    values = st.one_of(*[pins.map(encode)] * 4, st.sampled_from(CORRUPT))
    items = data.draw(st.lists(st.tuples(session_ids, values), min_size=1, max_size=40))
    now = data.draw(st.floats(0, 2e9))
    keys = Keys("prop")
    store = SessionStore(MemoryStore(), keys, regions=REGIONS, clock=FakeClock(now))
    job = _Repin(store, source, routings, now, batch=128)
    unplaced = 0
    for i, (sid, value) in enumerate(items):
        kv = KeyValue(keys.session(sid), value, mod_revision=i + 1, create_revision=1, version=1)
        want: bytes | None = None
        try:
            pin: SessionPin | None = SessionPin.model_validate_json(value)
        except ValueError:
            pin = None  # corrupt: left for the lazy path to overwrite
        if pin is not None and pin.region == source:
            try:
                lazy = resolve(pin, sid, pin.home, routings, now)
                assert lazy.action is PinAction.REPIN
                want = encode(lazy.pin)
            except NoRegionServing:
                unplaced += 1
        assert job._new_value(kv) == want, (sid, value)
    assert job.unplaced == unplaced
