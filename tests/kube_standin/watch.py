"""List and watch, as the stand-in API server answers them (tests/kube_standin/): lists
with a ``resourceVersion``; watches as chunked JSON lines from any version or a given
one, with BOOKMARK events, ``timeoutSeconds``, a compacted version answered with an
ERROR event of code 410 (or an HTTP 410), and streams a test can drop or cut mid-line.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

from aiohttp import web
from kubernetes_asyncio.client import (
    V1EndpointSliceList,
    V1ListMeta,
    V1ObjectMeta,
    V1PodList,
    V1Status,
    V1WatchEvent,
)

from tests.kube_standin.core import StandInCore
from tests.kube_standin.records import Watcher


class ListAndWatch(StandInCore):
    """The list and watch handlers of EndpointSlices and Pods, and the open streams."""

    def _drop(self, w: Watcher) -> None:
        """Cut ``w``'s connection now (its stream loop wakes on the sentinel)."""
        w.dropped.set()
        _cut(w.request)
        w.queue.put_nowait((-1, "", {}))

    # -- list and watch ------------------------------------------------------------------
    async def _list_slices(self, request: web.Request) -> web.StreamResponse:
        ns, selector = request.match_info["ns"], request.query.get("labelSelector", "")
        current = [o for o in self.slices.values() if self._matches(ns, selector, o)]
        if _watching(request):
            return await self._watch(request, "endpointslices", ns, selector, current)
        items = [self._model(o, "V1EndpointSlice") for o in current]
        meta = V1ListMeta(resource_version=str(self._rv))
        return self._answer(
            V1EndpointSliceList(
                api_version="discovery.k8s.io/v1",
                kind="EndpointSliceList",
                items=items,
                metadata=meta,
            )
        )

    async def _list_pods(self, request: web.Request) -> web.StreamResponse:
        ns, selector = request.match_info["ns"], request.query.get("labelSelector", "")
        current = [self._pod_json(p) for p in self.pods.values()]
        current = [o for o in current if self._matches(ns, selector, o)]
        if _watching(request):
            return await self._watch(request, "pods", ns, selector, current)
        items = [p.model for p in self.pods.values() if self._pod_json(p) in current]
        meta = V1ListMeta(resource_version=str(self._rv))
        return self._answer(V1PodList(api_version="v1", kind="PodList", items=items, metadata=meta))

    async def _watch(
        self,
        request: web.Request,
        resource: str,
        namespace: str,
        selector: str,
        current: list[dict[str, Any]],
    ) -> web.StreamResponse:
        since_text = request.query.get("resourceVersion", "")
        since = int(since_text) if since_text not in ("", "0") else None
        gone = since is not None and since < self._compacted[resource]
        if gone and self.gone_as_status:
            return self._status(410, "Expired", f"too old resource version: {since}")
        w = Watcher(resource, namespace, selector, asyncio.Queue(), request)
        if since is None:  # "any version": the current state first, as ADDED
            for obj in current:
                w.queue.put_nowait((int(obj["metadata"]["resourceVersion"]), "ADDED", obj))
        elif not gone:
            for rv, kind, obj in self._history[resource]:
                if rv > since and self._matches(namespace, selector, obj):
                    w.queue.put_nowait((rv, kind, obj))
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        self._note(request, 200, early=True)
        if gone:
            await self._send_error(response, since or 0)
            return response
        self._watchers.add(w)
        try:
            await self._stream(w, response, _timeout(request), _bookmarks(request))
        except ConnectionResetError:
            pass  # the client went away
        finally:
            self._watchers.discard(w)
        return response

    async def _stream(
        self, w: Watcher, response: web.StreamResponse, timeout_s: float, bookmarks: bool
    ) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if w.dropped.is_set():
                _cut(w.request)
                return
            wait = min(self.bookmark_s, max(0.0, deadline - time.monotonic()))
            try:
                _rv, kind, obj = await asyncio.wait_for(w.queue.get(), wait)
            except TimeoutError:
                if bookmarks and not w.dropped.is_set():
                    await self._send_bookmark(w, response)
                continue
            if w.dropped.is_set():
                return
            line = self._event_line(kind, obj)
            if w.cut_next:
                await response.write(line[: len(line) // 2])
                _cut(w.request)
                return
            await response.write(line)
        with contextlib.suppress(ConnectionResetError):
            await response.write_eof()

    def _event_line(self, kind: str, obj: dict[str, Any]) -> bytes:
        event = self._json(V1WatchEvent(type=kind, object=obj))
        return json.dumps(event).encode() + b"\n"

    async def _send_bookmark(self, w: Watcher, response: web.StreamResponse) -> None:
        meta = self._json(V1ObjectMeta(resource_version=str(self._rv)))
        kind, api = (
            ("Pod", "v1") if w.resource == "pods" else ("EndpointSlice", "discovery.k8s.io/v1")
        )
        obj = {"kind": kind, "apiVersion": api, "metadata": meta}  # a bookmark: no spec
        await response.write(self._event_line("BOOKMARK", obj))

    async def _send_error(self, response: web.StreamResponse, since: int) -> None:
        status = V1Status(
            api_version="v1",
            kind="Status",
            status="Failure",
            code=410,
            reason="Expired",
            message=f"too old resource version: {since} ({self._rv})",
            metadata=V1ListMeta(),
        )
        await response.write(self._event_line("ERROR", self._json(status)))
        await response.write_eof()


def _watching(request: web.Request) -> bool:
    return request.query.get("watch", "").lower() in ("true", "1")  # True or true


def _bookmarks(request: web.Request) -> bool:
    return request.query.get("allowWatchBookmarks", "").lower() in ("true", "1")


def _timeout(request: web.Request) -> float:
    return float(request.query.get("timeoutSeconds", "1800"))


def _cut(request: web.Request) -> None:
    """Drop the connection under the stream (no last chunk: the client sees it cut)."""
    if request.transport is not None:
        request.transport.close()
