"""A failover and its graduated recovery, on the leader's real cycle (fake clock,
in-memory store), start no session re-pin and write no session (issue 27).

Sessions are re-pinned by the gateway that serves their next request
(docs/architecture.md §2). One that sends nothing during the failover keeps its pin
to its home, so it is answered by home again from the recovery's first step on; a
background re-pin used to move it to a target it had never been served by.
"""

from __future__ import annotations

import asyncio

import pytest

from controlplane.cluster import Cluster
from controlplane.core.actions import Job, JobKind
from controlplane.kernel.clock import FakeClock
from controlplane.kernel.codec import decode
from controlplane.kernel.model import Health, Intent, IntentKind, Routing
from controlplane.kernel.sessions.resolve import PinAction, SessionPin, resolve
from controlplane.kernel.sessions.store import SessionStore
from controlplane.kernel.store.port import KeyValue
from controlplane.orchestrator import Orchestrator
from tests.unit.world import World

REGIONS = ("us-east", "us-west", "us-central", "eu-west")
HOMES = ("us-east", "us-west", "us-central")
# What a leader may start in the background; nothing of it writes a session.
NOT_SESSIONS = {JobKind.FAILOVER_PREWARM, JobKind.RECOVERY_PREWARM, JobKind.PREFIX_AGGREGATE}


def run(w: World, ticks: int, health: dict[str, Health] | None = None) -> None:
    for _ in range(ticks):
        for r in REGIONS:
            w.all_report(r, (health or {}).get(r, Health.HEALTHY))
        w.tick()


def intent(w: World, kind: IntentKind) -> None:
    i = Intent(id=kind.value, kind=kind, region="us-east", reason="t", actor="a", created_at=w.now)
    w.intents[i.id] = i


def with_sessions(w: World, monkeypatch: pytest.MonkeyPatch) -> tuple[list[Job], list[KeyValue]]:
    """60 sessions pinned as a gateway pins them (20 homed in each of three regions),
    and the world's leader given a session store, as ``controlplane/server.py`` gives it
    one. Returns the list every job the leader starts is recorded in (those of the tick
    and those its writes start), and the pins as stored."""
    sessions = SessionStore(
        w.store, w.keys, regions=w.topo.names, clock=FakeClock(w.now), writer="gw"
    )

    async def seed() -> list[KeyValue]:
        for i in range(60):
            await sessions.resolve(f"s{i:03d}", HOMES[i % 3], {})  # no routing yet: home
        return (await w.store.get_prefix(w.keys.sessions_prefix())).kvs

    pins = asyncio.run(seed())
    old = w.orchestrator
    w.orchestrator = Orchestrator(
        Cluster(w.store, w.keys, w.topo, old.clock), list, old.prewarmer, "cp-test"
    )
    started: list[Job] = []
    start = w.orchestrator.executor.start

    def record(job: Job) -> None:
        started.append(job)
        start(job)

    monkeypatch.setattr(w.orchestrator.executor, "start", record)
    return started, pins


def recover(w: World) -> dict[str, Routing]:
    """Healthy ticks until us-east is NORMAL again; the routings after the tick of its
    first recovery step (home's weight above 0 for the first time)."""
    first: dict[str, Routing] = {}
    for _ in range(40):
        run(w, 1)
        home = w.targets("us-east").get("us-east", 0.0)
        if not first and home > 0.0:
            first = {r: routing for r, (routing, _) in w.routing.items()}
        if w.state("us-east") == "NORMAL":
            break
    assert w.state("us-east") == "NORMAL" and w.targets("us-east") == {"us-east": 1.0}
    return first


@pytest.mark.parametrize("how", ["automatic, hard down", "manual, warm first"])
def test_a_failover_and_its_recovery_start_no_repin_and_write_no_session(
    how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = World()
    started, pins = with_sessions(w, monkeypatch)
    run(w, 3)
    if how.startswith("automatic"):
        run(w, 3, {"us-east": Health.UNHEALTHY})
    else:
        intent(w, IntentKind.FAILOVER)
        run(w, 1)
    assert w.state("us-east") == "FAILING_OVER"
    assert w.targets("us-east").get("us-east", 0.0) == 0.0  # switched away
    rec = w.records["us-east"][0]
    assert rec.failover is not None and rec.failover.plan.warm_first is how.startswith("manual")
    if how.startswith("manual"):
        intent(w, IntentKind.RECOVER)  # an automatic one recovers after its dwell
    first_step = recover(w)
    assert first_step["us-east"].targets.get("us-east") == 0.25  # graduated: 25 % steps

    # Decided: no tick asked for anything but pre-warms and aggregations ...
    decided = {j.kind for r in w.results for j in r.jobs}
    assert JobKind.FAILOVER_PREWARM in decided and decided <= NOT_SESSIONS
    # ... and the leader started nothing else either (before: a re-pin after each switch).
    assert {j.kind for j in started} <= NOT_SESSIONS, [j.describe() for j in started]
    actions = [a.action for a in w.audit]
    assert "routing_switch" in actions and "sessions_repinned" not in actions
    after = asyncio.run(w.store.get_prefix(w.keys.sessions_prefix())).kvs
    assert [(kv.key, kv.mod_revision) for kv in after] == [
        (kv.key, kv.mod_revision) for kv in pins
    ]  # not one session written

    # Idle through it all, us-east's sessions are still pinned home, and home answers
    # them from the recovery's first step on, whatever its weight.
    east = [decode(SessionPin, kv.value) for kv in after]
    east = [p for p in east if p.home == "us-east"]
    assert len(east) == 20 and all(p.region == "us-east" and p.moves == 0 for p in east)
    for kv in after:
        pin = decode(SessionPin, kv.value)
        res = resolve(pin, kv.key.rsplit("/", 1)[1], pin.home, first_step, w.now)
        assert (res.action, res.region) == (PinAction.KEEP, pin.home)
