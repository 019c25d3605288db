"""One contract for the Store port, run against MemoryStore and a real etcd (EtcdStore).

Whatever passes here for etcd must pass for the in-memory store too, which is what
makes the in-memory store a faithful stand-in in unit tests. This file holds reads and
writes, compare-and-set and transactions, paged reads, leases and alarms; watches,
compaction and reads at a revision are test_store_contract_watches.py, outages
test_store_contract_outages.py.
"""

from __future__ import annotations

import asyncio
import itertools

import pytest

from controlplane.kernel.store.port import (
    MAX_TXN_OPS,
    Compare,
    CompareOp,
    CompareTarget,
    Delete,
    KeyValue,
    LeaseNotFound,
    Put,
    Store,
    StoreError,
    StoreUnavailable,
)
from tests.store_contract_helpers import (  # noqa: F401 - fixtures h, *_harness: found by name
    Harness,
    etcd_harness,
    eventually,
    fixture_h,
    memory_harness,
)


async def bulk_put(store: Store, items: list[tuple[str, bytes]]) -> None:
    """Write in txns of MAX_TXN_OPS puts, a few in flight (how bulk writes go)."""
    batches = [items[i : i + MAX_TXN_OPS] for i in range(0, len(items), MAX_TXN_OPS)]
    sem = asyncio.Semaphore(8)

    async def one(batch: list[tuple[str, bytes]]) -> None:
        async with sem:
            result = await store.txn([], [Put(k, v) for k, v in batch])
            assert result.succeeded

    async with asyncio.TaskGroup() as tg:
        for batch in batches:
            tg.create_task(one(batch))


# ---- basic reads and writes --------------------------------------------------------


async def test_put_get_delete_track_revisions(h: Harness) -> None:
    s, key = h.store, h.k("a")
    assert await s.get(key) is None
    r1 = await s.put(key, b"one")
    kv = await s.get(key)
    assert kv == KeyValue(key, b"one", mod_revision=r1, create_revision=r1, version=1)
    r2 = await s.put(key, b"two")
    assert r2 > r1
    kv = await s.get(key)
    assert kv == KeyValue(key, b"two", mod_revision=r2, create_revision=r1, version=2)
    assert await s.delete(key) is True
    assert await s.get(key) is None
    assert await s.delete(key) is False
    # Deleting nothing is not a write: the revision stays.
    r3 = await s.put(h.k("other"), b"x")
    assert (await s.txn([], [Delete(key)])).revision == r3
    r4 = await s.put(key, b"again")
    kv = await s.get(key)
    assert kv is not None and (kv.create_revision, kv.version) == (r4, 1)


async def test_get_prefix_is_sorted_and_scoped(h: Harness) -> None:
    names = ["b", "a/2", "a/10", "c"]
    for n in names:
        await h.store.put(h.k(n), n.encode())
    await h.store.put(h.prefix[:-1] + "x", b"outside")  # shares the prefix minus "/"
    page = await h.store.get_prefix(h.prefix)
    assert [kv.key for kv in page.kvs] == [h.k(n) for n in sorted(names)]
    assert page.revision >= max(kv.mod_revision for kv in page.kvs)
    assert (await h.store.get_prefix(h.k("a/"))).kvs == page.kvs[:2]
    assert (await h.store.get_prefix(h.k("none/"))).kvs == []


# ---- compare-and-set ---------------------------------------------------------------


async def test_concurrent_creates_exactly_one_wins(h: Harness) -> None:
    for round_ in range(20):
        key = h.k(f"race/{round_}")
        results = await asyncio.gather(*(h.store.create(key, f"{i}".encode()) for i in range(4)))
        assert sum(results) == 1
        kv = await h.store.get(key)
        assert kv is not None and kv.value == str(results.index(True)).encode()


async def test_create_only_when_absent(h: Harness) -> None:
    key = h.k("c")
    assert await h.store.create(key, b"1") is True
    assert await h.store.create(key, b"2") is False
    kv = await h.store.get(key)
    assert kv is not None and kv.value == b"1"


async def test_cas_on_mod_revision(h: Harness) -> None:
    key = h.k("cas")
    assert await h.store.cas(key, b"v1", 0) is True  # 0 = must be absent
    assert await h.store.cas(key, b"nope", 0) is False
    kv = await h.store.get(key)
    assert kv is not None
    assert await h.store.cas(key, b"v2", kv.mod_revision) is True
    assert await h.store.cas(key, b"stale", kv.mod_revision) is False
    kv2 = await h.store.get(key)
    assert kv2 is not None and kv2.value == b"v2" and kv2.version == 2


@pytest.mark.parametrize(
    ("target", "op", "value", "expected"),
    [
        (CompareTarget.VALUE, CompareOp.EQ, b"m", True),
        (CompareTarget.VALUE, CompareOp.EQ, b"x", False),
        (CompareTarget.VALUE, CompareOp.NE, b"x", True),
        (CompareTarget.VALUE, CompareOp.NE, b"m", False),
        (CompareTarget.VALUE, CompareOp.LT, b"n", True),
        (CompareTarget.VALUE, CompareOp.LT, b"a", False),
        (CompareTarget.VALUE, CompareOp.GT, b"a", True),
        (CompareTarget.VALUE, CompareOp.GT, b"z", False),
        (CompareTarget.VERSION, CompareOp.EQ, 2, True),
        (CompareTarget.VERSION, CompareOp.NE, 2, False),
        (CompareTarget.VERSION, CompareOp.LT, 3, True),
        (CompareTarget.VERSION, CompareOp.GT, 2, False),
        (CompareTarget.MOD, CompareOp.EQ, "mod", True),
        (CompareTarget.MOD, CompareOp.NE, "mod", False),
        (CompareTarget.MOD, CompareOp.LT, "mod+1", True),
        (CompareTarget.MOD, CompareOp.GT, "mod", False),
        (CompareTarget.CREATE, CompareOp.EQ, "create", True),
        (CompareTarget.CREATE, CompareOp.EQ, 0, False),
        (CompareTarget.CREATE, CompareOp.LT, "mod", True),
        (CompareTarget.CREATE, CompareOp.GT, 0, True),
    ],
)
async def test_txn_compare_kinds(
    h: Harness, target: CompareTarget, op: CompareOp, value: int | bytes | str, expected: bool
) -> None:
    key = h.k("cmp")
    create = await h.store.put(key, b"first")
    mod = await h.store.put(key, b"m")  # version 2, mod > create
    revs = {"mod": mod, "mod+1": mod + 1, "create": create}
    v = revs[value] if isinstance(value, str) else value
    result = await h.store.txn(
        [Compare(key, target, op, v)], [Put(h.k("ok"), b"s")], [Put(h.k("ok"), b"f")]
    )
    assert result.succeeded is expected
    kv = await h.store.get(h.k("ok"))
    assert kv is not None and kv.value == (b"s" if expected else b"f")
    assert result.revision == kv.mod_revision


async def test_compares_on_absent_key(h: Harness) -> None:
    key = h.k("absent")
    ok = [Put(h.k("ok"), b"1")]
    assert (await h.store.txn([Compare.absent(key)], ok)).succeeded
    assert (await h.store.txn([Compare.mod_revision(key, 0)], ok)).succeeded
    assert (await h.store.txn([Compare(key, CompareTarget.VERSION, CompareOp.EQ, 0)], ok)).succeeded
    # etcd: a value compare on a missing key is false whatever the operator.
    for op in CompareOp:
        assert not (await h.store.txn([Compare(key, CompareTarget.VALUE, op, b"x")], ok)).succeeded


async def test_txn_is_atomic_at_one_revision(h: Harness) -> None:
    a, b, c = h.k("a"), h.k("b"), h.k("c")
    await h.store.put(c, b"gone soon")
    before = await h.store.put(a, b"0")
    result = await h.store.txn(
        [Compare.mod_revision(a, before)], [Put(a, b"1"), Put(b, b"1"), Delete(c)]
    )
    assert result.succeeded and result.revision == before + 1
    kva, kvb = await h.store.get(a), await h.store.get(b)
    assert kva is not None and kvb is not None
    assert kva.mod_revision == kvb.mod_revision == result.revision
    assert await h.store.get(c) is None
    # Failed compares with an empty failure branch write nothing.
    failed = await h.store.txn([Compare.mod_revision(a, before)], [Put(a, b"2")])
    assert not failed.succeeded and failed.revision == result.revision


async def test_txn_op_limits(h: Harness) -> None:
    ops = [Put(h.k(f"n/{i:03d}"), b"x") for i in range(MAX_TXN_OPS + 1)]
    with pytest.raises(StoreError) as err:
        await h.store.txn([], ops)
    assert not isinstance(err.value, StoreUnavailable)  # permanent: do not retry
    assert (await h.store.get_prefix(h.k("n/"))).kvs == []
    assert (await h.store.txn([], ops[:MAX_TXN_OPS])).succeeded
    assert len((await h.store.get_prefix(h.k("n/"))).kvs) == MAX_TXN_OPS
    with pytest.raises(StoreError):
        await h.store.txn([], [Put(h.k("dup"), b"1"), Put(h.k("dup"), b"2")])


# ---- pagination --------------------------------------------------------------------


async def test_paged_read_equals_single_read_and_is_one_snapshot(h: Harness) -> None:
    n = 25_000
    names = [h.k(f"p/{i:05d}") for i in range(n)]
    await bulk_put(h.store, [(k, b"v0") for k in names])
    single = await h.store.get_prefix(h.k("p/"), page_size=n + 1)
    paged = await h.store.get_prefix(h.k("p/"), page_size=10_000)
    assert len(single.kvs) == n
    # The etcd is shared by the session's tests: another test's lingering writer may
    # move the store's revision between the two reads (not under this prefix).
    assert paged.kvs == single.kvs and paged.revision >= single.revision

    # Now write while a paged read is in progress: overwrite keys on later pages,
    # add keys after the last one, delete some. The read must show exactly the
    # state at its revision.
    state = {kv.key: kv.value for kv in single.kvs}
    writes: list[tuple[int, str, bytes | None]] = []
    reading = True

    async def writer() -> None:
        for i in itertools.count():
            if not reading:
                return
            key, value = names[-1 - (i * 7) % 15_000], f"w{i}".encode()
            if i % 3 == 1:
                key = h.k(f"p/{n + i:05d}")
            if i % 3 == 2:
                writes.append((await h.store.put(key, value), key, value))
                rev = await h.store.txn([], [Delete(key)])
                writes.append((rev.revision, key, None))
            else:
                writes.append((await h.store.put(key, value), key, value))
            await asyncio.sleep(0)

    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(writer())
        await asyncio.sleep(0.01)
        page = await h.store.get_prefix(h.k("p/"), page_size=10_000)
        reading = False
        await task

    assert any(rev > page.revision for rev, _, _ in writes), "no write happened mid-read"
    for rev, key, value in sorted(writes, key=lambda w: w[0]):
        if rev <= page.revision:
            if value is None:
                state.pop(key, None)
            else:
                state[key] = value
    assert {kv.key: kv.value for kv in page.kvs} == state
    assert [kv.key for kv in page.kvs] == sorted(state)
    assert all(kv.mod_revision <= page.revision for kv in page.kvs)


async def test_reads_larger_than_grpcs_default_4_mib(h: Harness) -> None:
    value = b"x" * 10_000  # 600 x 10 kB = 6 MB in one page
    await bulk_put(h.store, [(h.k(f"big/{i:03d}"), value) for i in range(600)])
    page = await h.store.get_prefix(h.k("big/"))
    assert len(page.kvs) == 600 and all(kv.value == value for kv in page.kvs)


async def test_page_size_must_be_positive(h: Harness) -> None:
    with pytest.raises(StoreError):
        await h.store.get_prefix(h.prefix, page_size=0)


# ---- leases ------------------------------------------------------------------------


async def test_lease_expiry_deletes_its_keys(h: Harness) -> None:
    lease = await h.store.grant_lease(1)
    await h.store.put(h.k("leased"), b"x", lease=lease)
    await h.store.create(h.k("leased2"), b"y", lease=lease)
    await h.store.put(h.k("kept"), b"z")
    kv = await h.store.get(h.k("leased"))
    assert kv is not None and kv.lease == lease
    await h.let_time_pass(1.0)

    async def gone() -> bool:
        return (await h.store.get_prefix(h.prefix)).kvs == [await h.store.get(h.k("kept"))]

    await eventually(gone, "leased keys deleted on expiry")
    await eventually(lambda: _refresh_fails(h.store, lease), "refresh of expired lease fails")


async def _refresh_fails(store: Store, lease: int) -> bool:
    try:
        await store.refresh_lease(lease)
    except LeaseNotFound:
        return True
    return False


async def test_refresh_keeps_lease_alive(h: Harness) -> None:
    lease = await h.store.grant_lease(2)
    await h.store.put(h.k("leased"), b"x", lease=lease)
    for _ in range(3):
        await h.let_time_pass(0.8)
        assert await h.store.refresh_lease(lease) >= 1
    assert await h.store.get(h.k("leased")) is not None  # 2.4 s > ttl, but refreshed


async def test_revoke_deletes_keys_and_is_idempotent(h: Harness) -> None:
    lease = await h.store.grant_lease(30)
    await h.store.put(h.k("a"), b"1", lease=lease)
    await h.store.put(h.k("b"), b"2", lease=lease)
    await h.store.revoke_lease(lease)
    assert (await h.store.get_prefix(h.prefix)).kvs == []
    with pytest.raises(LeaseNotFound):
        await h.store.refresh_lease(lease)
    await h.store.revoke_lease(lease)  # unknown: no error
    with pytest.raises(LeaseNotFound):
        await h.store.put(h.k("c"), b"3", lease=lease)
    with pytest.raises(LeaseNotFound):
        await h.store.txn([], [Put(h.k("c"), b"3", lease)])


# ---- alarms ------------------------------------------------------------------------


async def test_no_alarm_on_a_healthy_store(h: Harness) -> None:
    assert await h.store.alarms() == []
