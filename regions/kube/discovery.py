"""``EndpointSliceDiscovery``: a Service's endpoints, listed once and then watched.

    discovery = EndpointSliceDiscovery(KubeConnection(), "models", "vllm-eu", port_name="http")
    await discovery.start()            # the first list (raises, saying why, if it fails)
    task = asyncio.create_task(discovery.run())   # the watch, for as long as it runs
    discovery.urls()                   # http://ip:port of the routable endpoints
    await discovery.wait_until(lambda eps: len(eps) >= 3, timeout_s=60)
    await discovery.stop()

The protocol is the API server's list-then-watch (docs: "Efficient detection of
changes"): list the slices labelled ``kubernetes.io/service-name=<service>`` and keep
the list's ``resourceVersion``; watch from it with ``allowWatchBookmarks``; every event
(BOOKMARK included: the server says "nothing for you up to here") moves the version on.
A stream that ends (the server's ``timeoutSeconds``, a proxy, a dropped connection, a
line cut in the middle) is resumed from the last version seen, so nothing that happened
meanwhile is missed; a version the server has compacted away answers 410 Gone (as an
HTTP status or an ERROR event in the stream), and then the slices are listed again.
Other failures are retried with backoff, keeping the endpoints last seen: an API server
that is away for a while must not empty a region.

Each change of the folded endpoints (:func:`regions.kube.endpoints.fold_slices`) calls
the listeners (synchronously) and ``on_change`` (awaited), and wakes ``wait_until``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, cast

import aiohttp
from kubernetes_asyncio.client import (
    ApiClient,
    DiscoveryV1Api,
    V1EndpointSlice,
    V1EndpointSliceList,
)
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.client.rest import RESTResponse

from regions.kube.client import KubeConnection
from regions.kube.endpoints import KubeEndpoint, fold_slices, routable_urls, service_selector

log = logging.getLogger("tectonic.kube.discovery")
Endpoints = tuple[KubeEndpoint, ...]
OnChange = Callable[[Endpoints], Awaitable[None]]
Listener = Callable[[Endpoints], None]
REQUEST_TIMEOUT_S = 15.0  # a list; a watch has its own (below)


class DiscoveryError(RuntimeError):
    """The EndpointSlices cannot be read (RBAC, a wrong namespace, no such API...)."""


class _Gone(Exception):
    """410: the version watched from is older than what the server keeps."""


@dataclass
class DiscoveryStats:
    """What the protocol did, for logs and tests."""

    lists: int = 0
    watches: int = 0  # watch requests made (the first one and every resume)
    resumes: int = 0  # streams that ended and were resumed from the last version
    relists: int = 0  # 410 Gone: listed again
    bookmarks: int = 0
    events: int = 0  # ADDED / MODIFIED / DELETED
    errors: int = 0


class EndpointSliceDiscovery:
    """The endpoints of one Service, kept up to date; see the module docstring."""

    def __init__(
        self,
        connection: KubeConnection,
        namespace: str,
        service: str,
        *,
        port_name: str | None = None,
        port: int | None = None,
        on_change: OnChange | None = None,
        watch_timeout_s: int = 300,
        retry_s: float = 0.5,
        max_retry_s: float = 30.0,
    ) -> None:
        if port_name is not None and port is not None:
            raise ValueError("give a port name or a port number, not both")
        self.connection, self.namespace, self.service = connection, namespace, service
        self.port_name, self.port = port_name, port
        self.selector = service_selector(service)
        self.on_change = on_change
        self.watch_timeout_s = watch_timeout_s
        self._retry = (retry_s, max_retry_s)
        self.resource_version = ""
        self.stats = DiscoveryStats()
        self._slices: dict[str, V1EndpointSlice] = {}
        self._endpoints: Endpoints = ()
        self._listeners: list[Listener] = []
        self._changed = asyncio.Event()
        self._listed = False
        self._task: asyncio.Task[None] | None = None

    # -- reading ---------------------------------------------------------------------
    @property
    def endpoints(self) -> Endpoints:
        """Every endpoint (terminating and not-ready ones too), sorted by URL."""
        return self._endpoints

    def urls(self) -> list[str]:
        """Base URLs of the routable endpoints: ready and not terminating."""
        return routable_urls(self._endpoints)

    def endpoint(self, url: str) -> KubeEndpoint | None:
        return next((e for e in self._endpoints if e.url == url), None)

    def add_listener(self, listener: Listener) -> None:
        """Called with the endpoints after each change (keep it short: it runs in the
        watch)."""
        self._listeners.append(listener)

    async def wait_until(
        self, predicate: Callable[[Endpoints], bool], timeout_s: float
    ) -> Endpoints:
        """The endpoints once ``predicate`` holds for them; TimeoutError after
        ``timeout_s``."""
        async with asyncio.timeout(timeout_s):
            while not predicate(self._endpoints):
                changed = self._changed
                await changed.wait()
        return self._endpoints

    # -- running ---------------------------------------------------------------------
    async def start(self) -> None:
        """List once, so that the endpoints are known before anyone uses them; raises
        :class:`DiscoveryError` saying what is wrong when the API refuses."""
        try:
            await self._list()
        except ApiException as e:
            raise DiscoveryError(self._refused(e)) from e
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            raise DiscoveryError(
                f"cannot reach the Kubernetes API to list the EndpointSlices of "
                f"{self.namespace}/{self.service}: {e!r}"
            ) from e
        if not self._slices:
            log.warning(
                "Service %s/%s has no EndpointSlices yet: is the Service there, and does "
                "its selector match the model pods?",
                self.namespace,
                self.service,
            )

    def run_in_background(self) -> asyncio.Task[None]:
        """:meth:`run` as a task of its own (stopped by :meth:`stop`)."""
        if self._task is None:
            self._task = asyncio.create_task(
                self.run(), name=f"endpointslices:{self.namespace}/{self.service}"
            )
        return self._task

    async def run(self) -> None:
        """Watch until cancelled: resume on a stream's end, relist on 410 Gone, back off
        on errors (keeping the endpoints last seen)."""
        first, most = self._retry
        delay = first
        while True:
            try:
                if not self._listed:
                    await self._list()
                    delay = first
                started, events = time.monotonic(), self.stats.events + self.stats.bookmarks
                await self._watch()
                self.stats.resumes += 1
                quick = time.monotonic() - started < 1.0
                if quick and self.stats.events + self.stats.bookmarks == events:
                    await asyncio.sleep(delay)  # a stream that ends at once, again and again
                    delay = min(delay * 2, most)
                else:
                    delay = first
            except _Gone:
                self.stats.relists += 1
                log.info(
                    "EndpointSlices of %s/%s: version %s is gone (410): listing again",
                    self.namespace,
                    self.service,
                    self.resource_version,
                )
                self._listed = False
            except (ApiException, aiohttp.ClientError, OSError, TimeoutError, ValueError) as e:
                self.stats.errors += 1
                log.warning(
                    "EndpointSlices of %s/%s: %s; retrying in %.1fs with the endpoints last seen",
                    self.namespace,
                    self.service,
                    self._refused(e) if isinstance(e, ApiException) else repr(e),
                    delay,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, most)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    # -- the protocol ----------------------------------------------------------------
    async def _api(self) -> DiscoveryV1Api:
        return DiscoveryV1Api(await self.connection.api())

    async def _list(self) -> None:
        api = await self._api()
        slices: dict[str, V1EndpointSlice] = {}
        token: str | None = None
        while True:
            page = await self._page(api, token)
            for s in page.items or ():
                slices[s.metadata.name] = s
            token = page.metadata._continue if page.metadata else None
            if not token:
                break
        self.stats.lists += 1
        self._slices = slices
        self.resource_version = (page.metadata.resource_version if page.metadata else "") or ""
        self._listed = True
        await self._refold()

    async def _page(self, api: DiscoveryV1Api, token: str | None) -> V1EndpointSliceList:
        if token is None:
            return await api.list_namespaced_endpoint_slice(
                self.namespace,
                label_selector=self.selector,
                limit=500,
                _request_timeout=REQUEST_TIMEOUT_S,
            )
        return await api.list_namespaced_endpoint_slice(
            self.namespace,
            label_selector=self.selector,
            limit=500,
            _continue=token,
            _request_timeout=REQUEST_TIMEOUT_S,
        )

    async def _watch(self) -> None:
        """One watch stream, until it ends; raises :class:`_Gone` on 410."""
        api = await self._api()
        self.stats.watches += 1
        raw = await api.list_namespaced_endpoint_slice(
            self.namespace,
            label_selector=self.selector,
            watch=True,
            allow_watch_bookmarks=True,
            resource_version=self.resource_version,
            timeout_seconds=self.watch_timeout_s,
            _preload_content=False,
            _request_timeout=aiohttp.ClientTimeout(
                sock_connect=REQUEST_TIMEOUT_S, sock_read=self.watch_timeout_s + 30
            ),
        )
        response = cast(aiohttp.ClientResponse, raw)  # _preload_content=False: the stream
        if response.status != 200:  # unread, the client raises nothing for a status
            body = await response.text()
            response.release()
            if response.status == 410:
                raise _Gone
            raise ApiException(status=response.status, reason=f"{response.reason}: {body[:200]}")
        try:
            while True:
                try:
                    line = await response.content.readline()
                except aiohttp.ClientPayloadError:
                    return  # the connection dropped mid-chunk: resume
                if not line.endswith(b"\n"):
                    return  # the end of the stream, or a line cut in the middle: resume
                await self._apply(line)
        finally:
            response.release()

    async def _apply(self, line: bytes) -> None:
        try:
            event = json.loads(line)
        except ValueError:
            log.warning("EndpointSlices watch: a line that is not JSON: %r", line[:200])
            return
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise _Gone
            raise ApiException(status=obj.get("code"), reason=obj.get("message"))
        version = ((obj.get("metadata") or {}).get("resourceVersion")) or ""
        if kind == "BOOKMARK":
            self.stats.bookmarks += 1
            self.resource_version = version or self.resource_version
            return
        s = _model(await self.connection.api(), obj, "V1EndpointSlice")
        name = s.metadata.name
        if kind == "DELETED":
            self._slices.pop(name, None)
        elif kind in ("ADDED", "MODIFIED"):
            self._slices[name] = s
        else:
            log.warning("EndpointSlices watch: unknown event type %r", kind)
            return
        self.stats.events += 1
        self.resource_version = version or self.resource_version
        await self._refold()

    async def _refold(self) -> None:
        endpoints = fold_slices(self._slices.values(), port_name=self.port_name, port=self.port)
        if endpoints == self._endpoints:
            return
        self._endpoints = endpoints
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        log.info(
            "Service %s/%s: %d endpoint(s), routable: %s",
            self.namespace,
            self.service,
            len(endpoints),
            ", ".join(self.urls()) or "(none)",
        )
        for listener in self._listeners:
            try:
                listener(endpoints)
            except Exception:  # a consumer's bug must not stop the watch; it is logged
                log.exception("EndpointSlice listener failed")
        if self.on_change is not None:
            try:
                await self.on_change(endpoints)
            except Exception:
                log.exception("EndpointSlice on_change callback failed")

    def _refused(self, e: ApiException) -> str:
        what = f"EndpointSlices of {self.namespace}/{self.service}"
        if e.status in (401, 403):
            return (
                f"the API refused to list/watch the {what} (HTTP {e.status} {e.reason}): the "
                "service account needs list and watch on discovery.k8s.io endpointslices "
                f"in namespace {self.namespace}"
            )
        if e.status == 404:
            return (
                f"the API has no discovery.k8s.io/v1 EndpointSlices (HTTP 404) for the {what}: "
                "Kubernetes 1.21 or later is needed"
            )
        return f"listing the {what} failed: HTTP {e.status} {e.reason}"


def _model(api: ApiClient, raw: dict[str, Any], klass: str) -> Any:
    """A raw object of a watch event as the client's model (as its own Watch does)."""
    return api.deserialize(cast(RESTResponse, SimpleNamespace(data=json.dumps(raw))), klass)
