"""A tick linear in its pools (issue 35): reports indexed by region once per tick, the
topology's units looked up by name in O(1), a report validated without a scan. The
figures are in the issue's closing report; these tests hold the behaviour: the indexed
fold decides exactly what the full scan decided, and the topology's index follows its
regions.
"""

from __future__ import annotations

import random

import pytest

from controlplane.core.decide import decide
from controlplane.core.health import by_region, evaluation_due, fold_health, fresh_votes
from controlplane.kernel.config import Topology, parse_topology
from controlplane.kernel.model import Health, HealthReport, ObserverKind, RegionHealth
from controlplane.reports import BadReport, validate_report
from tests.unit.world import TIMING, World, topology

HEALTHS = (Health.HEALTHY, Health.DEGRADED, Health.UNHEALTHY)


def scattered_reports(names: tuple[str, ...], now: float, seed: int) -> list[HealthReport]:
    """Every kind of observer, fresh and stale, several reports of one observer, in no
    order: what a snapshot of many regions holds."""
    rng = random.Random(seed)
    out = []
    for _ in range(len(names) * 6):
        region = rng.choice(names)
        kind = rng.choice(list(ObserverKind))
        observer = f"{kind.value}:{rng.choice('abc')}"
        out.append(
            HealthReport(
                region=region,
                observer=observer,
                kind=kind,
                health=rng.choice(HEALTHS),
                received_at=now - rng.uniform(0, 2 * TIMING["report_stale_s"]),
                signals={"load": rng.random()},
            )
        )
    rng.shuffle(out)
    return out


@pytest.mark.parametrize("seed", range(5))
def test_folding_each_regions_own_reports_is_folding_all_of_them(seed: int) -> None:
    topo, now = topology(), 1000.0
    reports = scattered_reports(topo.names, now, seed)
    index = by_region(reports)
    assert sorted(id(r) for rs in index.values() for r in rs) == sorted(
        map(id, reports)
    )  # each once
    for name in topo.names:
        mine = index.get(name, [])
        assert all(r.region == name for r in mine)
        assert fresh_votes(mine, name, now, 3.0) == fresh_votes(reports, name, now, 3.0)
        prev = RegionHealth(region=name, since=0.0, evaluated_at=now - 0.5)
        assert evaluation_due(prev, mine, now, topo.timing) == evaluation_due(
            prev, reports, now, topo.timing
        )
        assert fold_health(prev, mine, now, topo.timing) == fold_health(
            prev, reports, now, topo.timing
        )


def test_a_tick_folds_each_region_on_its_own_reports_only() -> None:
    """decide() over a snapshot whose reports are scattered: every region's health is
    what folding it over all the reports gives (the scan before issue 35)."""
    w = World()
    w.now = 1000.0
    for r in scattered_reports(w.topo.names, w.now, seed=7):
        w.reports[(r.region, r.observer)] = r
    snap = w.snapshot()
    result = decide(snap, w.topo, "cp-test")
    folded = {h.region: h.health for h in result.health}
    assert set(folded) == set(w.topo.names)  # a first tick evaluates every region
    for name, view in snap.regions.items():
        assert folded[name] == fold_health(view.health, snap.reports, snap.now, w.topo.timing)


# ---- the topology's index --------------------------------------------------------------


def test_units_are_found_by_name_and_names_keep_the_files_order() -> None:
    topo = topology()
    assert topo.names == ("us-east", "us-west", "us-central", "eu-west")
    assert all(topo.region(n).name == n for n in topo.names)
    assert topo.names is topo.names  # built once, not a new tuple per call
    with pytest.raises(KeyError, match="mars"):
        topo.region("mars")


def test_the_index_is_invisible_to_dumps_and_equality() -> None:
    used, fresh = topology(), topology()
    used.region("us-east")  # builds the index
    assert used == fresh and fresh == used
    assert used.model_dump() == fresh.model_dump()
    assert "_unit_index" not in used.model_dump_json()


def test_a_copy_with_other_regions_finds_its_own_units() -> None:
    topo = topology()
    topo.region("us-east")
    fewer = topo.model_copy(update={"regions": topo.regions[:2]})
    assert fewer.names == ("us-east", "us-west")
    with pytest.raises(KeyError):
        fewer.region("eu-west")
    assert topo.region("eu-west").zone == "eu"  # the original's index is its own


def test_pools_are_units_of_the_index() -> None:
    topo: Topology = parse_topology(
        {
            "cluster": "t",
            "regions": [
                {
                    "name": "eu",
                    "zone": "eu",
                    "pools": [
                        {"name": p, "models": [m], "agent": a, "capacity_rps": 10}
                        for p, m, a in (
                            ("chat", "m1", "127.0.0.1:2"),
                            ("code", "m2", "127.0.0.1:3"),
                        )
                    ],
                },
            ],
        }
    )
    assert topo.names == ("eu.chat", "eu.code")
    assert topo.region("eu.code").name == "eu.code"
    with pytest.raises(KeyError):
        topo.region("eu")  # a region with pools is its pools' units


def test_a_report_for_an_unknown_region_is_refused_and_the_known_ones_named() -> None:
    topo = topology()
    ok = validate_report(
        topo,
        region="eu-west",
        observer="agent:eu-west",
        kind=ObserverKind.AGENT,
        health=Health.HEALTHY,
        signals={},
        detail="",
        now=1.0,
    )
    assert ok.region == "eu-west"
    with pytest.raises(BadReport, match=r"unknown region 'mars'; known regions: \['us-east'"):
        validate_report(
            topo,
            region="mars",
            observer="agent:mars",
            kind=ObserverKind.AGENT,
            health=Health.HEALTHY,
            signals={},
            detail="",
            now=1.0,
        )
