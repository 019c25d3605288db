"""Loans in the warm pool's planner (regions.pool.lending: WARM --lend--> LENT --return-->
WARM), pure with a plain float ``now``; and what the agent publishes about them
(``PoolMembers.lent`` / ``loan_refusals``) and the borrower's refusals before it writes
anything (controlplane.kernel.pool.loans.early_refusal)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.kernel.codec import decode, encode
from controlplane.kernel.pool.loans import PoolLoan, early_refusal, early_refusals
from controlplane.kernel.pool.members import PoolMembers
from regions.pool.planner import Plan, plan
from regions.pool.states import (
    ACTIVE,
    COLD,
    EDGES,
    IDLE,
    LENT,
    WARM,
    DwellPolicy,
    PoolTarget,
    Replica,
    ReplicaState,
    cancelled,
    died,
    is_stale,
    refusal,
    transition,
)

T0 = 1_000_000.0
D = DwellPolicy()
Loans = Mapping[str, str | None]


def rep(
    name: str,
    state: ReplicaState,
    ago: float = 0.0,
    *,
    loan: str | None = None,
    variant: str | None = None,
    busy: bool = False,
) -> Replica:
    url = None if state is COLD else f"http://{name}"
    return Replica(
        name=name, url=url, state=state, since=T0 - ago, loan=loan, variant=variant, busy=busy
    )


def moves(p: Plan) -> list[tuple[str, str, str | None]]:
    return [(a.kind, a.replica, a.loan) for a in p.actions]


def apply(replicas: Sequence[Replica], p: Plan, now: float) -> list[Replica]:
    """What the manager does when every action succeeds."""
    by = {r.name: r for r in replicas}
    for a in p.actions:
        if a.kind == "cancel":
            by[a.replica] = cancelled(by[a.replica])
            continue
        url = f"http://{a.replica}" if a.kind == "launch" else None
        by[a.replica] = transition(by[a.replica], a.to, now, D, url, retiring=a.retire, loan=a.loan)
    return list(by.values())


STEADY = [rep("a", ACTIVE, 500), rep("w_old", WARM, 900), rep("w_new", WARM, 100)]
ONE_UP = PoolTarget(active=1, warm=2)


# -- the edges ---------------------------------------------------------------------------
def test_lend_and_return_are_the_only_edges_into_and_out_of_lent() -> None:
    assert EDGES[(WARM, LENT)] == "lend" and EDGES[(LENT, WARM)] == "return"
    assert {e for e in EDGES if LENT in e} == {(WARM, LENT), (LENT, WARM)}
    for src in (ACTIVE, IDLE, COLD):
        assert refusal(rep("r", src), LENT, T0 + 1e6, D) is not None


def test_a_loan_rides_on_the_replica_until_it_leaves_lent() -> None:
    lent = transition(rep("w", WARM), LENT, T0 + 1, D, loan="l1")
    assert (lent.state, lent.loan, lent.since) == (LENT, "l1", T0 + 1)
    back = transition(lent, WARM, T0 + 2, D)
    assert (back.state, back.loan) == (WARM, None)
    assert died(lent, T0 + 3).loan is None


# -- lending -----------------------------------------------------------------------------
def test_a_loan_for_any_replica_takes_the_longest_warm_one_and_never_an_active_one() -> None:
    p = plan(STEADY, ONE_UP, T0, D, {"l1": None})
    assert moves(p) == [("lend", "w_old", "l1")]
    assert p.actions[0].to is LENT and p.loan_refusals == {}
    after = apply(STEADY, p, T0)
    assert [r.state for r in after] == [ACTIVE, LENT, WARM]


def test_a_named_warm_replica_is_lent_and_the_next_loan_takes_another() -> None:
    p = plan(STEADY, ONE_UP, T0, D, {"l1": "http://w_new/", "l2": None})
    assert moves(p) == [("lend", "w_new", "l1"), ("lend", "w_old", "l2")]


def test_scale_up_comes_first_lending_takes_only_what_it_leaves() -> None:
    p = plan(STEADY, PoolTarget(active=2, warm=1), T0, D, {"l1": None})
    assert moves(p) == [("wake", "w_old", None), ("lend", "w_new", "l1")]
    p = plan(STEADY, PoolTarget(active=3, warm=0), T0, D, {"l1": None})
    assert [a.kind for a in p.actions] == ["wake", "wake"]
    assert p.loan_refusals["l1"].startswith("no WARM replica to lend")
    assert "2 WARM being woken into rotation" in p.loan_refusals["l1"]


POOL = [
    rep("a", ACTIVE, 500),
    rep("i", IDLE, 50),
    rep("w", WARM, 900),
    rep("s", WARM, 900, variant="old"),
    rep("l", LENT, 30, loan="mine"),
    Replica(name="c", state=COLD, url="http://c", since=T0, managed=False),
]
REFUSED = {
    "http://a": "http://a (a) is ACTIVE: in rotation; only a WARM replica out of rotation is lent",
    "http://i": "http://i (i) is IDLE: in rotation; only a WARM replica out of rotation is lent",
    "http://l": "http://l (l) is LENT: lent already (loan mine)",
    "http://c": "http://c (c) is COLD: not running",
    "http://s": "http://s (s) is WARM: runs old, being retired (new wanted)",
    "http://nope:8000": (
        "http://nope:8000 is not a replica of this pool "
        "(its replicas: http://a, http://c, http://i, http://l, http://s, http://w)"
    ),
}


@pytest.mark.parametrize("url", list(REFUSED))
def test_a_named_replica_that_cannot_be_lent_is_refused_with_the_reason(url: str) -> None:
    target = PoolTarget(active=1, warm=1, variant="new")
    p = plan(POOL, target, T0, D, {"mine": None, "theirs": url})
    assert p.loan_refusals == {"theirs": REFUSED[url]}
    assert not p.of("lend")  # and nothing else is lent for it


def test_a_named_replica_being_woken_into_rotation_is_refused() -> None:
    pool = [rep("a", ACTIVE, 500), rep("w", WARM, 900)]
    p = plan(pool, PoolTarget(active=2, warm=0), T0, D, {"l1": "http://w"})
    assert moves(p) == [("wake", "w", None)]
    assert p.loan_refusals == {
        "l1": "http://w (w) is WARM: being woken into rotation (ACTIVE target 2)"
    }


def test_two_loans_naming_one_replica_get_it_once() -> None:
    p = plan(STEADY, ONE_UP, T0, D, {"l1": "http://w_new", "l2": "http://w_new"})
    assert moves(p) == [("lend", "w_new", "l1")]
    assert p.loan_refusals == {
        "l2": "http://w_new (w_new) is named by another loan, lent in this plan"
    }


def test_no_warm_replica_left_says_what_the_pool_holds() -> None:
    pool = [rep("a", ACTIVE), rep("l", LENT, loan="l0"), rep("c", COLD, busy=True)]
    p = plan(pool, PoolTarget(active=1, warm=1), T0, D, {"l0": None, "l1": None})
    assert p.loan_refusals == {
        "l1": "no WARM replica to lend (the pool has 1 COLD, 1 ACTIVE, 1 LENT); 1 launching"
    }


def test_a_served_loan_is_not_served_again() -> None:
    pool = apply(STEADY, plan(STEADY, ONE_UP, T0, D, {"l1": None}), T0)
    again = plan(pool, ONE_UP, T0 + 1, D, {"l1": None})
    assert not again.of("lend", "return") and again.loan_refusals == {}


# -- returning, and what LENT is not ----------------------------------------------------
def test_a_lent_replica_whose_loan_is_gone_is_returned_at_once() -> None:
    pool = [rep("a", ACTIVE, 500), rep("l", LENT, 1, loan="l1"), rep("w", WARM, 900)]
    p = plan(pool, PoolTarget(active=1, warm=1), T0, D, {})
    assert moves(p) == [("return", "l", "l1")]
    assert p.actions[0].reason == "loan l1 ended"
    assert [r.state for r in apply(pool, p, T0)] == [ACTIVE, WARM, WARM]


def test_unknown_loans_neither_lend_nor_return() -> None:
    pool = [rep("a", ACTIVE, 500), rep("l", LENT, 1, loan="l1"), rep("w", WARM, 900)]
    p = plan(pool, PoolTarget(active=1, warm=1), T0, D)  # loans=None: not read yet
    assert not p.of("lend", "return")


def test_a_lent_replica_is_never_woken_drained_stopped_or_counted_as_standby() -> None:
    lent = rep("l", LENT, 5000, loan="l1")
    # ACTIVE short and nothing but the LENT one to wake: launch instead
    p = plan([lent, rep("c", COLD)], PoolTarget(active=1, warm=0), T0, D, {"l1": None})
    assert moves(p) == [("launch", "c", None)] and p.shortfall == 1
    # standby wanted: the LENT one does not count, a COLD slot is launched
    p = plan([rep("a", ACTIVE), lent, rep("c", COLD)], ONE_UP, T0, D, {"l1": None})
    assert moves(p) == [("launch", "c", None)]
    assert "1 LENT out of rotation, not standby: l for loan l1" in p.notes
    # nothing to stop or drain although the targets are zero
    p = plan([lent], PoolTarget(active=0, warm=0), T0, D, {"l1": None})
    assert p.actions == ()


# -- properties over random pools and loans -----------------------------------------------
URLS = [f"http://r{i}" for i in range(8)] + ["http://elsewhere"]


@st.composite
def pools_and_loans(draw: st.DrawFn) -> tuple[list[Replica], dict[str, str | None]]:
    specs = draw(
        st.lists(
            st.tuples(
                st.sampled_from(list(ReplicaState)),
                st.sampled_from([0.0, 10.0, 200.0, 2000.0]),
                st.booleans(),
                st.sampled_from([None, "a", "b"]),
            ),
            max_size=8,
        )
    )
    replicas = [
        rep(
            f"r{i}", s, ago, busy=busy and s is COLD, variant=v, loan=f"L{i}" if s is LENT else None
        )
        for i, (s, ago, busy, v) in enumerate(specs)
    ]
    lent_ids = [r.loan for r in replicas if r.loan is not None]
    keep = draw(st.lists(st.sampled_from(lent_ids), unique=True)) if lent_ids else []
    new = draw(st.dictionaries(st.sampled_from(["n1", "n2", "n3"]), st.sampled_from([None, *URLS])))
    return replicas, {**{k: None for k in keep}, **new}


targets = st.builds(
    PoolTarget,
    active=st.integers(0, 5),
    warm=st.integers(0, 5),
    variant=st.sampled_from([None, "a", "b"]),
)


@settings(max_examples=400, deadline=None)
@given(pools_and_loans(), targets)
def test_loans_take_only_free_warm_standby_and_never_cost_the_active_target(
    case: tuple[list[Replica], dict[str, str | None]], target: PoolTarget
) -> None:
    pool, loans = case
    by = {r.name: r for r in pool}
    p = plan(pool, target, T0, D, loans)
    without = plan(pool, target, T0, D, {k: v for k, v in loans.items() if k.startswith("L")})
    lent = p.of("lend")
    for a in lent:
        r = by[a.replica]
        assert r.state is WARM and not r.busy and not is_stale(r, target)
    # scale-up is the same with or without the new loans: lending never takes its replicas
    assert p.of("wake", "resume") == without.of("wake", "resume")
    assert p.shortfall == without.shortfall
    # every new loan is lent or refused, once; a served one is neither
    served = {r.loan for r in pool if r.state is LENT}
    pending = {k for k in loans if k not in served}
    assert {a.loan for a in lent} | set(p.loan_refusals) == pending
    assert not {a.loan for a in lent} & set(p.loan_refusals)
    assert len({a.replica for a in lent}) == len(lent)
    # exactly the LENT replicas whose loan is gone come back
    returned = {a.replica for a in p.of("return")}
    assert returned == {r.name for r in pool if r.state is LENT and r.loan not in loans}
    # no other move touches a LENT replica, and every move is an allowed edge
    assert all(a.kind == "return" for a in p.actions if by[a.replica].state is LENT)
    assert len({a.replica for a in p.actions}) == len(p.actions)
    after = apply(pool, p, T0)
    assert sum(r.state is ACTIVE for r in after) == sum(
        r.state is ACTIVE for r in apply(pool, without, T0)
    )


# -- what the agent publishes, what the borrower refuses ----------------------------------
OLD = b'{"region":"eu","active":["http://a"],"warm":1,"at":1.0,"agent":"agent:eu@h"}'


def test_a_pools_value_from_before_loans_still_reads() -> None:
    m = decode(PoolMembers, OLD)
    assert (m.active, m.lent, m.loan_refusals) == (("http://a",), {}, {})


def test_nothing_lent_is_written_in_the_old_shape_and_loans_round_trip() -> None:
    m = decode(PoolMembers, OLD)
    assert encode(m) == OLD  # an older reader (unknown fields refused) still reads it
    busy = m.model_copy(update={"lent": {"l1": "http://w"}, "loan_refusals": {"l2": "no"}})
    assert decode(PoolMembers, encode(busy)) == busy


def test_the_borrower_refuses_before_writing_what_pools_already_says() -> None:
    m = decode(PoolMembers, OLD).model_copy(update={"lent": {"l0": "http://w"}})
    assert early_refusal("eu", m, None) is None
    assert early_refusal("eu", m, "http://b") is None  # the agent knows more
    absent = early_refusal("eu", None, None)
    assert absent is not None and "pools/eu is absent" in absent
    active = early_refusal("eu", m, "http://a/")
    assert active is not None and "ACTIVE in pools/eu: in rotation" in active
    lent = early_refusal("eu", m, "http://w")
    assert lent is not None and "lent already" in lent


def test_loans_taken_together_are_refused_early_for_any_of_them() -> None:
    m = decode(PoolMembers, OLD).model_copy(update={"lent": {"l0": "http://w"}})
    assert early_refusals("eu", m, [None, None]) is None  # the agent lends or refuses each
    assert early_refusals("eu", m, ["http://b", None]) is None
    twice = early_refusals("eu", m, ["http://b/", "http://b"])
    assert twice is not None and "http://b named twice" in twice
    active = early_refusals("eu", m, [None, "http://a"])
    assert active is not None and "ACTIVE in pools/eu" in active
    absent = early_refusals("eu", None, [None, None])
    assert absent is not None and "pools/eu is absent" in absent


def test_a_loan_id_is_one_key_segment() -> None:
    assert PoolLoan(loan_id="ab12", borrower="probe", since=1.0).replica is None
    with pytest.raises(ValueError):
        PoolLoan(loan_id="a/b", borrower="probe", since=1.0)
