"""The dashboard (/) in a real browser: headless Chromium, driven over the DevTools
protocol, shows a failover live (state, event list, routing) without a reload; a real
replica on a real etcd, the failover driven over gRPC by reports. scripts/setup.sh
installs Chromium; without it the test fails in CI and is skipped elsewhere."""

from __future__ import annotations

import base64
import os
import uuid
from pathlib import Path

import pytest
from tectonic_api.v1 import controlplane_pb2 as pb

from chaos.lab.procs import until as poll
from controlplane.kernel.config import Topology
from tests.integration.cp_harness import (
    fast_topology,
    region,
    reporting,
    running_replica,
    until,
)
from tests.integration.http_api_helpers import CHROMIUM, chromium_page


@pytest.fixture
def topology(etcd: object) -> Topology:
    return fast_topology(etcd.endpoints, f"t{uuid.uuid4().hex[:8]}")  # type: ignore[attr-defined]


@pytest.mark.etcd
async def test_dashboard_shows_a_failover_live(topology: Topology, tmp_path: Path) -> None:
    if CHROMIUM is None:
        if os.environ.get("CI"):  # CI installs it (scripts/setup.sh): never skip there
            pytest.fail("chromium is missing: scripts/setup.sh installs it")
        pytest.skip("no chromium: scripts/setup.sh installs it")
    async with running_replica(topology, http_listen="127.0.0.1:0") as run:
        await until(
            lambda s: s.responder_is_leader and all(r.health == pb.HEALTHY for r in s.regions),
            run.stub,
            {},
        )
        url = f"http://127.0.0.1:{run.replica.http_port}/"
        async with chromium_page(url, str(tmp_path / "profile")) as page:

            async def shows(expression: str) -> bool:
                return bool(await page.js(expression))

            state = "document.querySelector('tr[data-region=east] td:nth-child(2)')?.textContent"
            await poll(lambda: shows(f"{state} === 'NORMAL'"), within=20, what="east NORMAL")
            await poll(
                lambda: shows("document.getElementById('conn').textContent === 'live'"),
                within=10,
                what="event stream live",
            )
            # The page is open; the failover must reach it without a reload.
            async with reporting(run.stub, {"east": pb.UNHEALTHY}) as health:
                await until(
                    lambda s: region(s, "east").failover_steps_done == "switch,prewarm",
                    run.stub,
                    health,
                )
                await poll(
                    lambda: shows(f"{state} === 'FAILING_OVER'"), within=15, what="east shown"
                )
                await poll(
                    lambda: shows(
                        "[...document.querySelectorAll('#events td')]"
                        ".some(td => td.textContent.startsWith('NORMAL → FAILING_OVER'))"
                    ),
                    within=10,
                    what="the transition in the event list",
                )
                routing = await page.js(
                    "document.querySelector('tr[data-region=east] td:nth-child(4)').textContent"
                )
                assert "west" in routing and "central" in routing
                shot = await page.call("Page.captureScreenshot", format="png")
        png = base64.b64decode(shot["data"])
        assert png.startswith(b"\x89PNG") and len(png) > 10_000
        (tmp_path / "dashboard.png").write_bytes(png)
