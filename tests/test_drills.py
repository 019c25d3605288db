"""Chaos drills end to end, in a lab of real processes (etcd, simulators, agents,
gateways, two control-plane replicas) with compressed timings.

A healthy system passes the region-blackout drill, and its verdict lands in
``regions/<r>/readiness``; a dry run injects nothing. A system whose ladder is made to
misbehave (its copy of the ladder applies step 2 before step 1) fails the auth 503
storm drill on the degradation order, measured from the leader's audit trail; the
failed region is then barred: the leader moves its traffic away.

What is judged is the drills' verdicts, whose windows (RTO and pre-warm: 30 s) are many
times what a blackout takes, the audited ladder order and states; so scripts/test.sh
runs this module two at a time with other outcome-only labs (OUTCOMES_PAIRED there): add
nothing that times or judges a latency.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from chaos.drills.result import JournalEntry
from chaos.drills.scenario import find_scenario
from chaos.lab.procs import until
from chaos.lab.run import drill_on, running_lab
from chaos.lab.spec import DeploymentSpec
from controlplane.kernel.codec import decode
from controlplane.kernel.model import Readiness, RegionRecord
from controlplane.kernel.store.etcd import EtcdStore
from controlplane.kernel.store.settings import EtcdConfig
from tests.drill_paths import blackout_path

pytestmark = [pytest.mark.slow, pytest.mark.etcd, pytest.mark.timeout(420)]


async def readiness(store: EtcdStore, dep_keys: object, region: str) -> Readiness | None:
    kv = await store.get(dep_keys.readiness(region))  # type: ignore[attr-defined]
    return None if kv is None else decode(Readiness, kv.value, kv.key)


def journal(path: str) -> list[JournalEntry]:
    return [JournalEntry.model_validate_json(line) for line in Path(path).read_text().splitlines()]


async def test_blackout_drill_passes_on_a_healthy_system_and_a_dry_run_touches_nothing(
    tmp_path: Path,
) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="tectonic-test-lab-"))
    async with running_lab(DeploymentSpec(), workdir, say=lambda m: None) as dep:
        store = EtcdStore(EtcdConfig(endpoints=dep.etcd_endpoints))
        await store.connect()
        try:
            scenario = find_scenario("region-blackout")
            pids = [p.pid for p in dep.sims["us-east"] if p is not None]

            dry = await drill_on(
                dep,
                store,
                scenario,
                dry_run=True,
                reports=tmp_path,
                sessions=12,
                say=lambda m: None,
            )
            assert dry.dry_run and dry.passed, dry.criteria
            assert all(p is not None and p.alive() for p in dep.sims["us-east"])
            assert [p.pid for p in dep.sims["us-east"] if p is not None] == pids
            kinds = {(e.kind, e.action) for e in journal(dry.journal_path)}
            assert ("fault", "stop_region") in kinds  # journaled as what it would do ...
            assert all("would" in e.detail for e in journal(dry.journal_path) if e.kind == "fault")
            assert await readiness(store, dep.keys, "us-east") is None  # ... and nothing else

            result = await drill_on(
                dep, store, scenario, reports=tmp_path, sessions=24, say=lambda m: None
            )
            failed = [c for c in result.criteria if not c.passed]
            assert result.passed, failed
            names = {c.name for c in result.criteria}
            assert {"prewarm_attainment", "session_consistency", "rto", "state_path"} <= names
            # measured, not assumed: the path comes from the leader's audit trail
            assert blackout_path(result, "us-east") == ["FAILING_OVER", "RECOVERED", "NORMAL"]
            assert (
                result.figures["requests"] > 100
                and result.figures["prewarm_attained_fraction"] == 1.0
            )
            # the sampled timeline saw us-east routed away and back
            east = [s.regions["us-east"] for s in result.samples if "us-east" in s.regions]
            routed_away = [r for r in east if r.routing.get("us-east", 0.0) == 0.0]
            assert routed_away, "no sample saw us-east's traffic elsewhere"

            entries = journal(result.journal_path)
            assert [e.t for e in entries] == sorted(e.t for e in entries)  # append-only, in order
            faults = [e for e in entries if e.kind == "fault"]
            assert len(faults) == 1 and faults[0].action == "stop_region" and faults[0].ok
            assert set(json.loads(faults[0].detail["killed_pids"].replace("'", '"'))) == set(pids)
            assert any(e.kind == "rollback" and e.action == "start_region" for e in entries)
            assert entries[-1].kind == "verdict" and entries[-1].action == "PASS"

            for region in result.readiness_written:
                r = await readiness(store, dep.keys, region)
                assert r is not None and r.passed and r.drill == result.id
            assert result.readiness_written[0] == "us-east" and len(result.readiness_written) >= 2
            report = Path(result.report_path)
            assert report.exists() and (report.parent / "timeline.png").stat().st_size > 1000  # noqa: ASYNC240
        finally:
            await store.close()


async def test_a_misbehaving_ladder_fails_the_auth_storm_drill_and_bars_the_region(
    tmp_path: Path,
) -> None:
    # The deployment's copy of the ladder swaps steps 1 and 2: the system now switches
    # the context cap on before speculative decoding off. The drill checks the order
    # against runbooks/degradation.yaml, from what the leader audited.
    spec = DeploymentSpec(ladder_reorder=(1, 0, 2))
    workdir = Path(tempfile.mkdtemp(prefix="tectonic-test-lab-"))
    async with running_lab(spec, workdir, say=lambda m: None) as dep:
        store = EtcdStore(EtcdConfig(endpoints=dep.etcd_endpoints))
        await store.connect()
        try:
            result = await drill_on(
                dep,
                store,
                find_scenario("auth-503-storm"),
                reports=tmp_path,
                sessions=24,
                say=lambda m: None,
            )
            assert not result.passed
            order = next(c for c in result.criteria if c.name == "degradation_order")
            assert not order.passed
            assert "context-cap-16k" in order.detail and "speculative-decoding-off" in order.detail
            applied = [
                e.step for e in result.ladder if e.region == "us-east" and e.action == "apply"
            ]
            assert applied[0] == "context-cap-16k"  # what really happened, from the audit log
            r = await readiness(store, dep.keys, "us-east")
            assert r is not None and not r.passed and r.drill == result.id

            async def drained() -> bool:
                kv = await store.get(dep.keys.region_state("us-east"))
                rec = None if kv is None else decode(RegionRecord, kv.value, kv.key)
                return (
                    rec is not None and rec.state.value == "FAILING_OVER" and "barred" in rec.reason
                )

            await until(drained, within=30, every=0.25, what="the barred region drained")
        finally:
            await store.close()
