"""The agent's reading of its replicas' engine (regions/agent/engine_version.py): when a
replica's ``/version`` is read (pure, fake clock), the region's version from them, and
the HTTP read against a real aiohttp server answering as vLLM does, or not."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from controlplane.kernel.capacity.record import clean_engine_version
from controlplane.kernel.model import Health, ObserverKind
from controlplane.reports import BadReport, validate_report
from regions.agent.engine_version import EngineVersions, read_version, refresh_versions
from regions.agent.probe_vllm import ReplicaProbe
from tests.unit.world import topology


def up(url: str) -> ReplicaProbe:
    return ReplicaProbe(url=url, up=True)


def down(url: str) -> ReplicaProbe:
    return ReplicaProbe(url=url, up=False, reason="connection refused")


def test_a_version_is_read_when_first_up_after_a_restart_and_every_refresh() -> None:
    v = EngineVersions(refresh_s=300)
    assert v.due([up("a"), up("b"), down("c")], now=0) == ["a", "b"]
    v.record("a", "0.11.0", now=0)
    v.record("b", None, now=0)  # not readable now: tried again after retry_s, not each round
    assert v.due([up("a"), up("b")], now=1) == []
    assert v.due([up("a"), up("b")], now=30) == ["b"]
    v.record("b", "0.11.0", now=30)
    assert v.due([up("a"), up("b")], now=299) == []
    assert v.due([up("a"), up("b")], now=300) == ["a"]
    # Down, then up again: read again at once (a restart may bring another image).
    assert v.due([up("a"), down("b")], now=301) == ["a"]
    assert v.due([up("a"), up("b")], now=302) == ["a", "b"]


def test_a_replica_no_longer_probed_is_read_again_when_it_is_back() -> None:
    """Parked WARM, or relaunched by the pool at the same URL: not probed meanwhile, so
    never seen down, and maybe on a new image when it is back."""
    v = EngineVersions(refresh_s=300)
    v.record("a", "0.11.0", now=0)
    v.record("b", "0.10.0", now=0)
    assert v.due([up("a")], now=10) == []  # b left the probes
    assert v.due([up("a"), up("b")], now=20) == ["b"]
    v.record("b", None, now=20)  # not readable yet: its old version is gone, not kept
    assert v.region_version([up("a"), up("b")]) == "0.11.0"


def test_the_regions_version_is_its_up_replicas_and_names_each_while_they_differ() -> None:
    v = EngineVersions()
    assert v.region_version([up("a")]) == ""  # none known: not judged
    v.record("a", "0.11.0", now=0)
    v.record("b", "0.11.0", now=0)
    v.record("c", "", now=0)  # an engine without /version does not count
    assert v.region_version([up("a"), up("b"), up("c")]) == "0.11.0"
    v.record("b", "0.12.0", now=1)
    assert v.region_version([up("a"), up("b")]) == "0.11.0, 0.12.0"  # a rolling upgrade
    assert v.region_version([down("a"), up("b")]) == "0.12.0"  # a down one does not serve


@pytest.fixture
async def server() -> AsyncIterator[str]:
    async def version(request: web.Request) -> web.Response:
        return web.json_response({"version": " 0.11.0 "})

    async def broken(request: web.Request) -> web.Response:
        return web.Response(status=503)

    async def odd(request: web.Request) -> web.Response:
        return web.json_response(["not", "an", "object"])

    async def controls(request: web.Request) -> web.Response:
        return web.json_response({"version": "0.11\t0\n" + "9" * 200})

    apps = {"/a": version, "/b": broken, "/c": odd, "/d": controls}
    app = web.Application()
    for prefix, handler in apps.items():
        app.router.add_get(prefix + "/version", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_reading_a_replicas_version_over_http(server: str) -> None:
    async with aiohttp.ClientSession() as http:
        assert await read_version(http, server + "/a/", 1.0) == "0.11.0"
        assert await read_version(http, server + "/b", 1.0) is None  # try again later
        assert await read_version(http, server + "/c", 1.0) == ""  # answers, says nothing
        assert await read_version(http, server + "/none", 1.0) == ""  # 404: has none
        assert await read_version(http, "http://127.0.0.1:9", 1.0) is None  # refused
        # What the control plane would refuse (and with it the whole report) is cleaned.
        odd = await read_version(http, server + "/d", 1.0)
        assert odd == ("0.110" + "9" * 200)[:128]
        assert validate(odd).engine_version == odd  # type: ignore[attr-defined]
        # ... as the probe cleans what it records, so that one engine matches itself
        assert clean_engine_version("0.11\t0\n" + "9" * 200) == odd
        v = EngineVersions()
        probes = [up(server + "/a"), up(server + "/b")]
        await refresh_versions(v, http, probes, now=0.0, request_timeout=1.0)
        assert v.region_version(probes) == "0.11.0"
        assert v.due(probes, now=30.0) == [server + "/b"]


def validate(version: str) -> object:
    return validate_report(
        topology(),
        region="us-east",
        observer="agent:us-east",
        kind=ObserverKind.AGENT,
        health=Health.HEALTHY,
        signals={},
        detail="",
        now=1.0,
        engine_version=version,
    )


def test_the_control_plane_refuses_an_engine_version_it_cannot_store() -> None:
    report = validate
    assert report("0.11.0").engine_version == "0.11.0"  # type: ignore[attr-defined]
    for bad in ("v" * 129, "0.11\n0"):
        with pytest.raises(BadReport, match="engine_version"):
            report(bad)
