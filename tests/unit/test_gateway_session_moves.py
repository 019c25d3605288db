"""Gateways telling each other about sessions they moved off a region
(regions.dataplane.session_moves): two boards on one MemoryStore, each with its watch."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from controlplane.kernel.codec import decode
from controlplane.kernel.keys import Keys
from controlplane.kernel.sessions.resolve import SessionMoves
from controlplane.kernel.store.memory import MemoryStore
from regions.dataplane.session_moves import SessionMovesBoard


@contextlib.asynccontextmanager
async def running(*boards: SessionMovesBoard) -> AsyncIterator[None]:
    tasks = [asyncio.create_task(b.run()) for b in boards]
    try:
        await asyncio.gather(*(b.watch.loaded.wait() for b in boards))
        yield
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t


async def until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():  # noqa: ASYNC110 - polling plain lists is the point
            await asyncio.sleep(0.005)


async def stored(store: MemoryStore, keys: Keys, region: str) -> SessionMoves | None:
    kv = await store.get(keys.session_moves(region))
    return None if kv is None else decode(SessionMoves, kv.value, kv.key)


async def test_a_burst_of_moves_is_one_notice_heard_by_the_others_only(keys: Keys) -> None:
    store = MemoryStore()
    heard: dict[str, list[str]] = {"a": [], "b": []}
    a = SessionMovesBoard(store, keys, heard["a"].append, gateway_id="a", flush_s=0.05)
    b = SessionMovesBoard(store, keys, heard["b"].append, gateway_id="b", flush_s=0.05)
    async with running(a, b):
        revision = (await store.get_prefix(keys.session_moves_prefix())).revision
        for _ in range(3):
            a.moved("us-east")
        await until(lambda: heard["b"] == ["us-east"])
        notice = await stored(store, keys, "us-east")
        assert notice is not None and notice.by == "a" and notice.moved == 3
        # one write for the burst
        assert (await store.get_prefix(keys.session_moves_prefix())).revision == revision + 1
        a.moved("us-east")  # a later move: a new notice (its count changed the value)
        await until(lambda: heard["b"] == ["us-east", "us-east"])
        b.moved("eu-west")
        await until(lambda: heard["a"] == ["eu-west"])
    assert heard["a"] == ["eu-west"]  # a never reacts to its own notices
    # A gateway that starts later has nothing cached yet: the notices it finds in its
    # first read are not news to it.
    late: list[str] = []
    c = SessionMovesBoard(store, keys, late.append, gateway_id="c", flush_s=0.05)
    async with running(c):
        assert c.watch.values.keys() == {"us-east", "eu-west"} and late == []


async def test_a_notice_that_cannot_be_written_is_written_later(keys: Keys) -> None:
    store = MemoryStore()
    heard: list[str] = []
    a = SessionMovesBoard(store, keys, lambda r: None, gateway_id="a", flush_s=0.02)
    b = SessionMovesBoard(store, keys, heard.append, gateway_id="b", flush_s=0.02)
    async with running(b):
        store.set_available(False)
        a.moved("us-east")
        await a.flush()  # fails: kept for later
        store.set_available(True)
        assert await stored(store, keys, "us-east") is None
        await a.flush()
        await until(lambda: heard == ["us-east"])
        await a.flush()  # nothing left to write
        notice = await stored(store, keys, "us-east")
        assert notice is not None and notice.moved == 1
