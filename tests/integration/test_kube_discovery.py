"""EndpointSlice discovery (regions/kube/discovery.py) and the client (regions/kube/client.py)
against a STAND-IN API server (tests/kube_standin/): an aiohttp server that speaks the
Kubernetes API's wire protocol (list, watch streams with bookmarks, 410 Gone), not a
real kube-apiserver, which cannot run here. The pods behind the slices are real
simulators on 127.0.0.x, so the URLs discovered answer real HTTP.

What is shown: the first list, then a watch from the list's version with bookmarks; a
stream cut in the middle of an event's line is resumed from the last version seen
(bookmarks included) and the endpoint that event carried is not missed; a version the
server has compacted away (410, as an ERROR event or as an HTTP status) makes a relist;
refusals and missing credentials are said plainly."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
from kubernetes_asyncio.config import incluster_config

from chaos.lab.procs import until
from regions.kube import client as kube_client
from regions.kube.client import KubeConfigError, KubeConnection, new_api_client
from regions.kube.discovery import DiscoveryError, Endpoints, EndpointSliceDiscovery
from tests.integration.certs import make_ca
from tests.kube_standin.server import StandIn

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]
NS, APP = "models", {"app": "vllm", "tectonic.io/region": "eu"}
SLICES = f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices"


@pytest.fixture
def standin(tmp_path: Path) -> Iterator[StandIn]:
    s = StandIn(tmp_path, namespace=NS, bookmark_s=0.1).start()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
async def conn(standin: StandIn) -> AsyncIterator[KubeConnection]:
    c = KubeConnection(standin.kubeconfig)
    try:
        yield c
    finally:
        await c.close()


def pod_urls(standin: StandIn) -> list[str]:
    return sorted(p.url for p in standin.pods_of("deployment", "vllm") if p.ready)


def slice_calls(standin: StandIn) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    calls = [c for c in standin.calls if c.path == SLICES]
    return [c.query for c in calls if not c.watch], [c.query for c in calls if c.watch]


async def running(d: EndpointSliceDiscovery) -> asyncio.Task[None]:
    await d.start()
    return d.run_in_background()


async def test_lists_then_watches_from_the_lists_version(
    standin: StandIn, conn: KubeConnection
) -> None:
    await standin.add_workload("deployment", "vllm", 2, APP, service="vllm")
    seen: list[Endpoints] = []

    async def changed(endpoints: Endpoints) -> None:
        seen.append(endpoints)

    d = EndpointSliceDiscovery(conn, NS, "vllm", port_name="http", on_change=changed)
    await running(d)
    try:
        assert d.urls() == pod_urls(standin) and len(d.urls()) == 2
        pods = {p.name for p in standin.pods_of("deployment", "vllm")}
        assert {e.pod for e in d.endpoints} == pods
        assert {(e.zone, e.pod_namespace) for e in d.endpoints} == {("zone-a", NS)}
        async with aiohttp.ClientSession() as http:  # real servers behind the slices
            for url in d.urls():
                async with http.get(url + "/health") as r:
                    assert r.status == 200
        listed_rv = d.resource_version
        await standin.scale("deployment", "vllm", 3)
        await d.wait_until(lambda eps: sum(e.routable for e in eps) == 3, 30)
        assert d.urls() == pod_urls(standin)
        # the new pod was seen not ready first (its endpoint, never its URL, listed)
        assert any(len(eps) == 3 and sum(e.routable for e in eps) == 2 for eps in seen)

        await standin.scale("deployment", "vllm", 2)
        eps = await d.wait_until(lambda eps: any(e.terminating for e in eps), 10)
        draining = next(e for e in eps if e.terminating)
        assert draining.serving and not draining.ready and draining.url not in d.urls()
        await d.wait_until(lambda eps: len(eps) == 2, 10)
        assert d.urls() == pod_urls(standin)

        lists, watches = slice_calls(standin)
        assert lists == [{"labelSelector": "kubernetes.io/service-name=vllm", "limit": "500"}]
        assert watches[0]["resourceVersion"] == listed_rv
        assert watches[0]["allowWatchBookmarks"].lower() == "true"
        assert d.stats.bookmarks > 0 and d.stats.relists == 0
    finally:
        await d.stop()


async def test_a_watch_cut_mid_event_resumes_from_the_last_version_and_misses_nothing(
    standin: StandIn, conn: KubeConnection
) -> None:
    await standin.add_workload("deployment", "vllm", 2, APP, service="vllm")
    d = EndpointSliceDiscovery(conn, NS, "vllm", port_name="http")
    await running(d)
    try:
        listed = d.resource_version
        # changes this watch does not see (pods of another Service) move the version on;
        # only bookmarks tell the watch so
        await standin.add_workload("deployment", "other", 1, {"app": "other"}, process=False)

        async def bookmarked() -> bool:  # polled: a bookmark changes no endpoint
            return d.stats.bookmarks >= 2 and d.resource_version != listed

        await until(bookmarked, within=10, what="bookmarks past the list's version")
        assert await standin.drop_watches(cut_next=True) == 1
        before_cut = d.resource_version  # a bookmark's: newer than the list's
        await standin.scale("deployment", "vllm", 3)  # its event is the one cut in half
        await d.wait_until(lambda eps: sum(e.routable for e in eps) == 3, 30)
        assert d.urls() == pod_urls(standin)

        lists, watches = slice_calls(standin)
        assert len(lists) == 1 and d.stats.relists == 0  # resumed, not listed again
        assert d.stats.resumes >= 1 and len(watches) >= 2
        assert watches[1]["resourceVersion"] == before_cut
        assert int(before_cut) > int(watches[0]["resourceVersion"]) == int(listed)
    finally:
        await d.stop()


@pytest.mark.parametrize("as_status", [False, True], ids=["error-event", "http-410"])
async def test_a_version_compacted_away_answers_410_and_discovery_lists_again(
    tmp_path: Path, as_status: bool
) -> None:
    standin = StandIn(tmp_path, namespace=NS, bookmark_s=30, gone_as_status=as_status).start()
    conn = KubeConnection(standin.kubeconfig)
    try:
        await standin.add_workload("deployment", "vllm", 1, APP, service="vllm")
        d = EndpointSliceDiscovery(conn, NS, "vllm", port_name="http", retry_s=0.05)
        await running(d)
        try:

            async def watching() -> bool:
                return await standin.watchers() == 1

            await until(watching, within=10, what="the watch open")
            seen = d.resource_version
            # no bookmark came (bookmark_s is long): the version held is the list's; the
            # scale happens while nobody watches, then the history is forgotten
            after = await standin.while_disconnected("deployment", "vllm", 2, compact=True)
            await d.wait_until(lambda eps: sum(e.routable for e in eps) == 2, 30)
            assert d.urls() == pod_urls(standin)
            lists, watches = slice_calls(standin)
            assert d.stats.relists >= 1 and len(lists) >= 2
            assert watches[1]["resourceVersion"] == seen  # the resume that met 410
            gone = [c for c in standin.calls if c.path == SLICES and c.watch][1]
            assert gone.status == (410 if as_status else 200)  # 200: the ERROR is in-stream
            assert int(d.resource_version) >= after
        finally:
            await d.stop()
    finally:
        await conn.close()
        standin.stop()


async def test_the_api_refusing_or_no_credentials_is_said_plainly(
    standin: StandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = tmp_path / "bad-kubeconfig"
    bad.write_text(standin.kubeconfig.read_text().replace("stand-in-token", "wrong"))
    c = KubeConnection(bad)
    try:
        with pytest.raises(DiscoveryError, match=r"HTTP 401.*list and watch on discovery"):
            await EndpointSliceDiscovery(c, NS, "vllm").start()
    finally:
        await c.close()

    with pytest.raises(KubeConfigError, match="does not exist"):
        await new_api_client(tmp_path / "nope")
    monkeypatch.delenv(kube_client.SERVICE_HOST_ENV, raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing-a"))
    with pytest.raises(KubeConfigError) as e:
        await new_api_client()
    assert "not in a pod (KUBERNETES_SERVICE_HOST unset)" in str(e.value)
    assert str(tmp_path / "missing-a") in str(e.value)
    monkeypatch.setenv(kube_client.SERVICE_HOST_ENV, "10.0.0.1")
    with pytest.raises(KubeConfigError, match="token is missing"):
        await new_api_client()


async def test_in_a_pod_the_service_account_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    (sa / "token").write_text("pod-token")
    ca = make_ca("kube", tmp_path)
    (sa / "ca.crt").write_bytes(ca.cert.read_bytes())
    monkeypatch.setattr(kube_client, "SERVICE_ACCOUNT_DIR", sa)
    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(sa / "token"))
    monkeypatch.setattr(incluster_config, "SERVICE_CERT_FILENAME", str(sa / "ca.crt"))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    api = await new_api_client()
    try:
        assert api.configuration.host == "https://10.96.0.1:443"
        assert api.configuration.api_key["BearerToken"] == "Bearer pod-token"
    finally:
        await api.close()
