"""The simulator's aiohttp middlewares: errors answered in vLLM's shape, and vLLM's
``http_requests_total`` counted per answer."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import hdrs, web
from aiohttp.typedefs import Middleware

from regions.simulator.metrics import EngineStats
from regions.simulator.protocol import ApiError, dumps

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# vLLM's instrumentator leaves its probe endpoints out of http_requests_total; /_sim/* is ours.
_UNCOUNTED = frozenset({"/metrics", "/health", "/load", "/ping", "/version", "/server_info"})


def json_response(body: object, status: int = 200) -> web.Response:
    return web.json_response(body, status=status, dumps=dumps)


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """An :class:`ApiError`, an unknown route or a wrong method as vLLM answers them."""
    try:
        return await handler(request)
    except ApiError as e:
        return json_response(e.body, status=e.code)
    except web.HTTPNotFound:
        return json_response({"detail": "Not Found"}, status=404)
    except web.HTTPMethodNotAllowed as e:
        resp = json_response({"detail": "Method Not Allowed"}, status=405)
        resp.headers[hdrs.ALLOW] = ", ".join(sorted(e.allowed_methods))
        return resp


def counting(stats: EngineStats) -> Middleware:
    """vLLM's ``http_requests_total{handler,method,status}``: one count per answer, the
    handler as its route template ("none" when no route matched), the status grouped."""

    def count(request: web.Request, status: int) -> None:
        resource = request.match_info.route.resource
        path = "none" if resource is None else resource.canonical
        if path in _UNCOUNTED or path.startswith("/_sim/"):
            return
        key = (path, request.method, f"{status // 100}xx")
        stats.http_requests[key] = stats.http_requests.get(key, 0) + 1

    @web.middleware
    async def counted(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            resp = await handler(request)
        except web.HTTPException as e:
            count(request, e.status)
            raise
        except Exception:
            count(request, 500)  # aiohttp answers an unhandled error with a 500
            raise
        count(request, resp.status)
        return resp

    return counted
