"""LeaseKeeper and grant_and_put on the in-memory store, driven by a manual clock."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import pytest

from controlplane.kernel.leases import LeaseKeeper, LeaseLost, Sleep, grant_and_put
from controlplane.kernel.store.memory import ManualClock, MemoryStore
from controlplane.kernel.store.port import Compare, Op, StoreError, TxnResult

TTL = 3  # margin 0.6 s, refresh every 1 s, retry every 0.3 s


class Stop(Exception):
    """Raised from a check to end keep_alive() in a test."""


def fake_sleep(clock: ManualClock) -> Sleep:
    """A sleep that moves the manual clock instead of waiting."""

    async def sleep(seconds: float) -> None:
        clock.advance(max(0.0, seconds))
        await asyncio.sleep(0)

    return sleep


def keeper(store: MemoryStore, clock: ManualClock) -> LeaseKeeper:
    return LeaseKeeper(store, TTL, clock=clock, sleep=fake_sleep(clock))


class SlowRefresh(MemoryStore):
    """Its refreshes take ``delay`` seconds on the clock before the server acts."""

    def __init__(self, clock: ManualClock, delay: float) -> None:
        super().__init__(clock=clock)
        self.clock, self.delay = clock, delay

    async def refresh_lease(self, lease_id: int) -> int:
        self.clock.advance(self.delay)
        return await super().refresh_lease(lease_id)


async def test_grant_sets_the_deadline_from_when_the_request_left() -> None:
    clock = ManualClock()
    store = MemoryStore(clock=clock)
    k = keeper(store, clock)
    assert k.id == 0 and not k.valid and k.valid_for_s == 0.0
    lease = await k.grant()
    assert k.id == lease and store.lease_deadline(lease) == clock() + TTL
    assert k.sent == clock() and k.deadline == pytest.approx(clock() + TTL - TTL / 5)
    assert k.valid and k.valid_for_s == pytest.approx(TTL - TTL / 5)


async def test_the_deadline_counts_from_the_send_not_the_answer() -> None:
    clock = ManualClock()
    store = SlowRefresh(clock, delay=0.5)
    k = keeper(store, clock)
    await k.grant()
    sent = clock()
    await k.refresh()
    # The server extended the lease at sent + 0.5; we may only count from sent.
    assert store.lease_deadline(k.id) == pytest.approx(sent + 0.5 + TTL)
    assert k.sent == sent and k.deadline == pytest.approx(sent + TTL - TTL / 5)


async def test_ensure_refreshes_then_grants_anew_once_the_lease_expired() -> None:
    clock = ManualClock()
    store = MemoryStore(clock=clock)
    k = keeper(store, clock)
    gone: list[int] = []
    assert await k.ensure(gone.append)  # none held: granted
    first = k.id
    clock.advance(2)
    assert not await k.ensure(gone.append)  # refreshed: same lease, deadline moved
    assert k.id == first and k.deadline == pytest.approx(clock() + TTL - TTL / 5)
    clock.advance(TTL + 0.1)  # no refresh for longer than the ttl: the server expired it
    assert await k.ensure(gone.append)
    assert gone == [first] and k.id not in (0, first)


async def test_keep_alive_refreshes_every_third_of_the_ttl() -> None:
    clock = ManualClock()
    store = MemoryStore(clock=clock)
    k = keeper(store, clock)
    lease = await k.grant()
    start = clock()
    deadlines: list[float] = []

    def check() -> None:
        deadlines.append(k.deadline)
        if len(deadlines) >= 8:  # four waits and four refreshes
            raise Stop

    with pytest.raises(Stop):
        await k.keep_alive(check)
    assert clock() == pytest.approx(start + 4 * TTL / 3)
    assert store.lease_deadline(lease) == pytest.approx(start + 4 * TTL / 3 + TTL)
    # The check after each refresh still sees the old deadline: it runs before it moves.
    assert deadlines[1] == pytest.approx(start + TTL - TTL / 5)
    assert deadlines[2] == pytest.approx(start + TTL / 3 + TTL - TTL / 5)
    assert k.valid


async def test_keep_alive_gives_up_at_the_local_deadline_before_the_server_expires(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock()
    store = MemoryStore(clock=clock)
    k = keeper(store, clock)
    lease = await k.grant()
    server_expiry = store.lease_deadline(lease)
    assert server_expiry is not None
    store.set_available(False)  # every keep-alive fails from now on
    caplog.set_level(logging.WARNING, logger="tectonic.leases")
    with pytest.raises(LeaseLost) as lost:
        await k.keep_alive()
    assert not lost.value.gone and "keepalive failed for 2.4s" in str(lost.value)
    assert k.deadline <= clock() < server_expiry  # given up before the server could expire it
    assert "keep-alive of lease" in caplog.text
    store.set_available(True)
    assert store.lease_deadline(lease) is not None  # still alive there, briefly


async def test_keep_alive_ends_when_the_lease_is_revoked() -> None:
    clock = ManualClock()
    store = MemoryStore(clock=clock)
    k = keeper(store, clock)
    lease = await k.grant()
    await store.revoke_lease(lease)  # e.g. an operator cleared it
    with pytest.raises(LeaseLost) as lost:
        await k.keep_alive()
    assert lost.value.gone and lost.value.lease == lease and "revoked" in str(lost.value)
    assert k.id == 0 and not k.valid


async def test_keep_alive_ends_when_the_lease_expired_meanwhile() -> None:
    clock = ManualClock()
    store = MemoryStore(clock=clock)
    k = keeper(store, clock)
    await k.grant()
    clock.advance(TTL)  # the loop stalled past the deadline: nothing is sent
    with pytest.raises(LeaseLost) as lost:
        await k.keep_alive()
    assert not lost.value.gone


async def test_revoke_deletes_the_leases_keys_and_logs_an_unreachable_store(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = MemoryStore(clock=ManualClock())
    k = LeaseKeeper(store, TTL)
    lease = await k.grant()
    await store.put("/k", b"v", lease=lease)
    await k.revoke()
    assert k.id == 0 and await store.get("/k") is None
    await k.revoke()  # nothing held: nothing to do

    await k.grant()
    store.set_available(False)
    caplog.set_level(logging.WARNING, logger="tectonic.leases")
    await k.revoke()  # StoreUnavailable is ignored by default: the lease expires alone
    assert "could not revoke lease" in caplog.text and k.id == 0
    store.set_available(True)

    await k.grant()
    await store.close()
    with pytest.raises(StoreError):
        await k.revoke()  # a permanent error is the caller's unless ignored
    assert k.id == 0


async def test_revoke_can_ignore_every_store_error() -> None:
    store = MemoryStore(clock=ManualClock())
    k = LeaseKeeper(store, TTL)
    await k.grant()
    await store.close()
    await k.revoke(ignore=(StoreError,))
    assert k.id == 0


class Recording(MemoryStore):
    """Remembers the leases it granted; ``fail_txn`` makes every txn fail."""

    def __init__(self, *, fail_txn: bool = False) -> None:
        super().__init__(clock=ManualClock())
        self.granted: list[int] = []
        self.fail_txn = fail_txn

    async def grant_lease(self, ttl: int) -> int:
        self.granted.append(await super().grant_lease(ttl))
        return self.granted[-1]

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        if self.fail_txn:
            raise StoreError("too many ops")
        return await super().txn(compares, success, failure)


async def test_grant_and_put_records_on_a_lease_or_revokes_it() -> None:
    store = Recording()
    absent = [Compare.absent("/k")]
    lease = await grant_and_put(store, TTL, absent, "/k", lambda i: b"%d" % i)
    kv = await store.get("/k")
    assert lease and kv is not None and kv.lease == lease and kv.value == b"%d" % lease

    assert await grant_and_put(store, TTL, absent, "/k", lambda i: b"x") == 0
    loser = store.granted[-1]
    assert loser != lease and store.lease_deadline(loser) is None  # revoked
    assert store.lease_deadline(lease) is not None


async def test_grant_and_put_revokes_the_lease_when_the_txn_raises() -> None:
    store = Recording(fail_txn=True)
    with pytest.raises(StoreError):
        await grant_and_put(store, TTL, [], "/k", lambda i: b"x")
    assert len(store.granted) == 1 and store.lease_deadline(store.granted[0]) is None
