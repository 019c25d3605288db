"""etcd with a small quota under a lab's traffic (issue 27), on real processes
(``chaos.lab.run.running_lab``: one etcd member, three regions of two simulators + an
agent + a gateway each, two control-plane replicas, chat sessions through the gateways).

etcd keeps every old value until its history is compacted, and at its quota raises
NOSPACE and refuses every write. Here its quota is ``QUOTA`` and the leader compacts
every ``INTERVAL_S`` to ``RETENTION_S`` behind the head: the lab's traffic runs until
etcd has been written more than twice the quota (counted from etcd itself, by a watch
of the deployment's whole prefix summing value sizes, ``bench.store.WriteTally``), and
etcd never raises an alarm, its database stays under the quota, and a region blacked
out afterwards (its simulators SIGKILLed) is still failed over: the leader's status
shows it FAILING_OVER.

The quota is small because the lab writes little: about 20 kB/s in all (the gateways'
prefix exports every 1 s, the leader's catalogs and health every 1 s, the health
reports) against etcd's database that, uncompacted, grows about 2 MB a minute
(``python -m bench store``). Twice a 16 MiB quota would take half an hour; twice 512
KiB takes about a minute, while a lab start holds ~0.07 MB and the database peaked at
~0.29 MB with 4 s of history kept (without compaction the same lab reached a 1 MiB
quota in 30 s). etcd takes any quota (64 KiB starts);
``etcd_server_quota_backend_bytes`` is checked to be the one set. Figures are printed
as ``FIGURE`` lines (``pytest -s``).

What is judged is etcd's alarms and size and a region's state, waited for in a window
many times what it takes; so scripts/test.sh runs this module two at a time with other
outcome-only labs (OUTCOMES_PAIRED there): add nothing that times or judges a latency.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from pathlib import Path

import aiohttp
import pytest

from bench.store import ETCD_DB, ETCD_QUOTA, WriteTally, metric_values, scrape
from chaos.drills.traffic import Traffic
from chaos.lab.deployment import LocalDeployment
from chaos.lab.procs import until
from chaos.lab.run import running_lab
from chaos.lab.spec import DeploymentSpec
from controlplane.kernel.store.etcd import EtcdStore
from controlplane.kernel.store.settings import EtcdConfig

pytestmark = [pytest.mark.slow, pytest.mark.etcd, pytest.mark.timeout(300)]

QUOTA = 1 << 19  # bytes: etcd's --quota-backend-bytes
RETENTION_S = 4.0  # the topology's etcd.compact_retention_s
INTERVAL_S = 1.0  # etcd.compact_interval_s
WRITE_FACTOR = 2  # write more than this many quotas' worth
# The lab never stops writing (~20 kB/s): this many samples a second apart without a
# written byte is a stall, not a slow machine. The whole run is bounded by the timeout.
STALL_SAMPLES = 30
VICTIM = "us-east"


def figure(name: str, value: object) -> None:
    print(f"FIGURE {name} = {value}")


async def etcd_figure(http: aiohttp.ClientSession, dep: LocalDeployment, name: str) -> float:
    values = metric_values(await scrape(http, f"http://{dep.etcd_endpoints[0]}"), name)
    assert values, f"etcd exports no {name}"
    return values[0]


async def leader_status(http: aiohttp.ClientSession, dep: LocalDeployment) -> dict[str, object]:
    """The leading replica's ``/v1/status`` ({} when no replica says it leads)."""
    for port in dep.cp_http_ports.values():
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with http.get(f"http://127.0.0.1:{port}/v1/status") as r:
                if r.status == 200:
                    status: dict[str, object] = await r.json()
                    if status.get("responder_is_leader"):
                        return status
    return {}


def region_state(status: dict[str, object], region: str) -> str:
    regions = status.get("regions")
    assert isinstance(regions, list)
    return next(str(r["state"]) for r in regions if r["name"] == region)


async def test_twice_the_quota_written_no_nospace_and_a_blackout_still_fails_over() -> None:
    spec = DeploymentSpec(
        etcd_flags=(f"--quota-backend-bytes={QUOTA}",),
        compact_retention_s=RETENTION_S,
        compact_interval_s=INTERVAL_S,
    )
    workdir = Path(tempfile.mkdtemp(prefix="tectonic-etcd-quota-"))
    t_start = time.monotonic()
    async with (
        running_lab(spec, workdir, say=lambda m: None) as dep,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http,
    ):
        store = EtcdStore(EtcdConfig(endpoints=dep.etcd_endpoints))
        await store.connect()
        traffic = Traffic(dep.gateway_urls, interval_s=0.5, stream_share=0.5)
        traffic.add(30, list(dep.spec.regions))
        watch: asyncio.Task[None] | None = None
        try:
            assert await etcd_figure(http, dep, ETCD_QUOTA) == QUOTA  # etcd took it
            db_at_start = await etcd_figure(http, dep, ETCD_DB)
            figure("db_bytes_after_lab_start", int(db_at_start))
            start = (await store.get_prefix(dep.keys.leader())).revision
            tally = WriteTally(dep.keys.root, start)
            watch = asyncio.create_task(tally.follow(store))
            await traffic.start()
            t0 = time.monotonic()
            db_max = db_at_start
            still, last = 0, tally.total
            while tally.total <= WRITE_FACTOR * QUOTA:
                still = still + 1 if tally.total == last else 0
                last = tally.total
                assert still < STALL_SAMPLES, (
                    f"the lab stopped writing at {tally.total} bytes (need {WRITE_FACTOR * QUOTA})"
                )
                await asyncio.sleep(1.0)
                db_max = max(db_max, await etcd_figure(http, dep, ETCD_DB))
                alarms = await store.alarms()
                assert alarms == [], (
                    f"etcd raised {alarms} {time.monotonic() - t0:.0f} s in, after "
                    f"{tally.total} bytes written; its database: {int(db_max)} bytes"
                )
            written_s = time.monotonic() - t0
            figure("quota_bytes", QUOTA)
            figure("written_bytes", tally.total)
            figure("written_in_s", round(written_s, 1))
            figure("write_rate_bytes_per_s", round(tally.total / written_s))
            figure("written_by_key", dict(tally.bytes_by_segment))
            figure("db_bytes_max", int(db_max))
            assert tally.gaps == []  # every write was seen
            assert db_max < QUOTA
            assert await etcd_figure(http, dep, "etcd_debugging_mvcc_compact_revision") > start

            # A region blacked out now still fails over: etcd takes the leader's writes.
            ok_before = traffic.ok
            t_kill = time.monotonic()
            await asyncio.to_thread(dep.stop_servers, VICTIM)

            async def failing_over() -> bool:
                status = await leader_status(http, dep)
                return bool(status) and region_state(status, VICTIM) == "FAILING_OVER"

            await until(failing_over, within=30.0, every=0.25, what=f"{VICTIM} FAILING_OVER")
            figure("failing_over_after_kill_s", round(time.monotonic() - t_kill, 1))
            store_view = (await leader_status(http, dep))["store"]
            assert isinstance(store_view, dict) and store_view["writable"] is True, store_view
            assert await store.alarms() == []
            assert traffic.ok > ok_before  # the data plane kept answering
        finally:
            await traffic.stop()
            if watch is not None:
                watch.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watch
            await store.close()
    figure("test_s", round(time.monotonic() - t_start, 1))
