"""failoverctl readiness / prefixes / drill, end to end: the installed CLI against a real
control-plane replica (real gRPC, real etcd) and, for drills, a real drill service
running a dry-run drill in a real lab. Values the leader or the drill runner would
write (a failed verdict, a prefix catalog) are written to etcd as they would write
them; everything else goes through the CLI."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import pytest

from chaos.drills.requests import scenario_infos
from chaos.drills.scenario import find_scenario, load_all
from chaos.drills.schedule import load_schedule
from chaos.drills.service import DrillService
from chaos.lab.run import run_in_lab
from controlplane.kernel.clock import SystemClock
from controlplane.kernel.codec import encode
from controlplane.kernel.config import Topology
from controlplane.kernel.drills import DrillSummary
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import Readiness
from controlplane.kernel.prefix.catalog import CatalogEntry, PrefixCatalog
from controlplane.kernel.prefix.identity import FingerprintParams, PromptKind
from controlplane.kernel.prefix.prewarm import ChatMessage, ReplayPayload
from controlplane.kernel.store.etcd import EtcdStore
from tests.integration.cp_harness import fast_topology, running_replica
from tests.integration.test_failoverctl import ctl

pytestmark = pytest.mark.etcd
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def topology(etcd: object) -> Topology:
    return fast_topology(etcd.endpoints, f"c{uuid.uuid4().hex[:8]}")  # type: ignore[attr-defined]


async def test_readiness_shows_verdicts_and_an_override_unbars_with_an_audited_reason(
    topology: Topology,
) -> None:
    keys = Keys(topology.cluster)
    async with running_replica(topology) as run:
        code, out, _ = await ctl(run.target, "readiness")
        assert code == 0 and "never drilled" in out
        code, _, err = await ctl(run.target, "readiness", "override", "east", "-r", "x", "-y")
        assert code == 1 and "has no drill verdict" in err  # nothing to override
        # the drill runner's verdict: failed, so east is barred
        failed = Readiness(passed=False, drill="d-42-region-blackout-east", at=1.0)
        await run.replica.store.put(keys.readiness("east"), encode(failed))
        code, out, _ = await ctl(run.target, "readiness", "--json")
        rows = {r["region"]: r for r in json.loads(out)}
        assert code == 0 and rows["east"]["barred"] is True and not rows["west"].get("has_verdict")
        code, out, _ = await ctl(run.target, "readiness")
        assert "FAILED: barred" in out and "d-42-region-blackout-east" in out

        code, _, err = await ctl(run.target, "readiness", "override", "east", "-y")
        assert code == 2 and "--reason" in err  # a reason is required
        code, _, err = await ctl(run.target, "readiness", "override", "mars", "-r", "x", "-y")
        assert code == 2 and "unknown region" in err
        code, out, _ = await ctl(
            run.target, "readiness", "override", "east", "-r", "INC-7 harness bug", "-y", "--json"
        )
        assert code == 0
        assert json.loads(out)["override_actor"] == "oncall@test" and not json.loads(out)["barred"]
        code, _, err = await ctl(run.target, "readiness", "override", "east", "-r", "again", "-y")
        assert code == 1 and "already overridden" in err
        code, out, _ = await ctl(run.target, "history", "--region", "east", "--json")
        audit = [e for e in json.loads(out) if e["action"] == "readiness_override"]
        assert audit and audit[-1]["actor"] == "oncall@test"
        assert audit[-1]["reason"] == "INC-7 harness bug"


async def test_prefixes_top_lists_the_leaders_catalog(topology: Topology) -> None:
    keys = Keys(topology.cluster)
    async with running_replica(topology) as run:
        code, out, _ = await ctl(run.target, "prefixes", "top", "east")
        assert code == 0 and "no prefix catalog yet" in out
        system = "You are the billing assistant. Answer briefly. " * 4
        payload = ReplayPayload(
            key="ab" * 8,
            kind=PromptKind.CHAT,
            model="tiny",
            messages=(ChatMessage(role="system", content=system),),
            blocks=2,
            block_size=16,
            tokens=32,
            tokens_exact=False,
        )
        catalog = PrefixCatalog(
            region="east",
            at=1.0,
            params=FingerprintParams(),
            min_sessions=3,
            shared_prefixes=2,
            gateways=2,
            entries=(
                CatalogEntry(key="ab" * 8, count=120, sessions=3, payload=payload),
                CatalogEntry(key="cd" * 8, count=40, sessions=1),
            ),
        )
        await run.replica.store.put(keys.prefixes("east"), encode(catalog))
        code, out, _ = await ctl(run.target, "prefixes", "top", "east", "--json")
        data = json.loads(out)
        assert code == 0 and data["found"] and data["gateways"] == 2
        assert [e["count"] for e in data["entries"]] == [120, 40]
        assert data["entries"][0]["may_leave"] and not data["entries"][1]["may_leave"]
        assert data["entries"][0]["preview"].startswith("system: You are the billing")
        code, out, _ = await ctl(run.target, "prefixes", "top", "east", "--limit", "1")
        assert code == 0 and "billing" in out and "cdcd" not in out
        code, _, err = await ctl(run.target, "prefixes", "top", "mars")
        assert code == 2 and "unknown region" in err


@pytest.mark.slow
async def test_drill_run_goes_through_the_drill_service_and_lands_in_the_history(
    topology: Topology, tmp_path: Path
) -> None:
    keys = Keys(topology.cluster)
    async with running_replica(topology) as run:
        code, _, err = await ctl(run.target, "drill", "run", "region-blackout", "-r", "t", "-y")
        assert code == 1 and "no drill service" in err  # refused: nobody would run it

        async def dry_lab(name: str, region: str | None, *, dry_run: bool = False):  # type: ignore[no-untyped-def]
            return await run_in_lab(
                find_scenario(name),
                region,
                dry_run=dry_run,
                reports=tmp_path,
                sessions=6,
                say=lambda m: None,
            )

        scenarios = load_all()
        store = EtcdStore(topology.etcd)
        await store.connect()
        service = DrillService(
            store,
            keys,
            load_schedule(REPO / "chaos" / "schedule.yaml"),
            dry_lab,
            SystemClock(),
            tick_s=0.5,
            scenarios=scenario_infos(scenarios),
            default_regions={s.name: s.region for s in scenarios},
        )
        serving = asyncio.create_task(service.serve())
        try:
            code, out, _ = await ctl(run.target, "drill", "schedule", "--json")
            while code == 0 and out.strip() == "[]":  # the first tick publishes
                await asyncio.sleep(0.2)
                code, out, _ = await ctl(run.target, "drill", "schedule", "--json")
            assert code == 0 and {u["scenario"] for u in json.loads(out)} >= {"region-blackout"}

            code, _, err = await ctl(run.target, "drill", "run", "no-such", "-r", "t", "-y")
            assert code == 2 and "unknown scenario" in err and "region-blackout" in err
            code, out, err = await ctl(
                run.target, "drill", "run", "region-blackout", "--dry-run", "-r", "CI", "--json"
            )
            assert code == 0, err
            ran = json.loads(out)
            assert ran["scenario"] == "region-blackout" and ran["dry_run"] and ran["passed"]
            assert ran["trigger"] == "request" and ran["request_id"]

            code, out, _ = await ctl(run.target, "drill", "list", "--json")
            listed = json.loads(out)
            assert code == 0 and listed["runs"][0]["id"] == ran["id"]
            assert {s["name"] for s in listed["scenarios"]} == {s.name for s in scenarios}
            assert not listed.get("pending")
            code, out, _ = await ctl(run.target, "drill", "show", ran["id"])
            assert code == 0 and "PASS (dry run)" in out and "report:" in out
            assert Path(out.split("report:")[1].strip()).is_file()  # noqa: ASYNC240
            code, _, err = await ctl(run.target, "drill", "show", "nope")
            assert code == 2 and "no drill 'nope'" in err
            code, out, _ = await ctl(run.target, "history", "--json")
            actions = [e["action"] for e in json.loads(out)]
            assert "drill_requested" in actions and "drill_run" in actions
            rows = (await store.get_prefix(keys.drill_history_prefix())).kvs
            assert DrillSummary.model_validate_json(rows[-1].value).request_id == ran["request_id"]
        finally:
            serving.cancel()
            await asyncio.gather(serving, return_exceptions=True)
            await store.close()
