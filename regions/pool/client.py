"""vLLM's dev-mode admin API, as the warm pool uses it (the simulator speaks it too).

- sleep: ``POST /sleep?level=1``, then ``GET /is_sleeping`` must say true;
- wake:  ``POST /wake_up``, then ``POST /reset_prefix_cache`` - after a sleep, old
  prefix-cache entries must not be served - retried while running requests hold blocks
  (``{"success": false}``), then ``GET /is_sleeping`` must say false;
- probe: ``GET /health`` then ``GET /is_sleeping``.

Every failure is a :class:`ReplicaError` with a short reason (library errors are
translated here); cancellation propagates.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import aiohttp
from pydantic import BaseModel, ValidationError

from regions.http_errors import describe_error


class ReplicaError(RuntimeError):
    """A replica did not do what was asked (HTTP error, refused, unreachable)."""


class _Sleeping(BaseModel):
    is_sleeping: bool


class _Reset(BaseModel):
    success: bool = True  # older vLLM answers 200 with an empty body


class ReplicaClient:
    """Admin calls to replicas over one aiohttp session. ``probe_timeout_s`` bounds the
    cheap GETs; ``request_timeout_s`` the sleep/wake calls (a GPU wake reloads weights)."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        *,
        probe_timeout_s: float = 2.0,
        request_timeout_s: float = 30.0,
        reset_timeout_s: float = 5.0,
    ) -> None:
        self.session = session
        self.probe_timeout_s = probe_timeout_s
        self.request_timeout_s = request_timeout_s
        self.reset_timeout_s = reset_timeout_s

    async def _call(
        self,
        method: str,
        url: str,
        path: str,
        *,
        limit_s: float,
        params: Iterable[tuple[str, str]] = (),
    ) -> str:
        limit = aiohttp.ClientTimeout(total=limit_s)
        try:
            async with self.session.request(
                method, url + path, params=list(params), timeout=limit
            ) as resp:
                text = await resp.text()
                if resp.status != 200:
                    raise ReplicaError(f"{method} {url}{path}: HTTP {resp.status} {text[:200]}")
                return text
        except (aiohttp.ClientError, TimeoutError) as e:
            raise ReplicaError(f"{method} {url}{path}: {describe_error(e, limit_s)}") from e

    async def is_sleeping(self, url: str) -> bool:
        text = await self._call("GET", url, "/is_sleeping", limit_s=self.probe_timeout_s)
        try:
            return _Sleeping.model_validate_json(text).is_sleeping
        except ValidationError as e:
            raise ReplicaError(f"{url}/is_sleeping: unexpected answer {text[:200]!r}") from e

    async def healthy(self, url: str) -> bool:
        try:
            await self._call("GET", url, "/health", limit_s=self.probe_timeout_s)
        except ReplicaError:
            return False
        return True

    async def probe(self, url: str) -> bool | None:
        """None when down (or its admin API is missing); else whether it sleeps."""
        if not await self.healthy(url):
            return None
        try:
            return await self.is_sleeping(url)
        except ReplicaError:
            return None

    async def sleep(self, url: str) -> None:
        await self._call(
            "POST", url, "/sleep", params=[("level", "1")], limit_s=self.request_timeout_s
        )
        if not await self.is_sleeping(url):
            raise ReplicaError(f"{url} answered /sleep but is not sleeping")

    async def wake(self, url: str) -> None:
        await self._call("POST", url, "/wake_up", limit_s=self.request_timeout_s)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.reset_timeout_s
        while True:
            text = await self._call(
                "POST", url, "/reset_prefix_cache", limit_s=self.request_timeout_s
            )
            try:
                if not text.strip() or _Reset.model_validate_json(text).success:
                    break
            except ValidationError as e:
                raise ReplicaError(
                    f"{url}/reset_prefix_cache: unexpected answer {text[:200]!r}"
                ) from e
            if loop.time() > deadline:
                raise ReplicaError(
                    f"{url}/reset_prefix_cache kept failing for "
                    f"{self.reset_timeout_s:g} s (requests holding blocks)"
                )
            await asyncio.sleep(0.1)
        if await self.is_sleeping(url):
            raise ReplicaError(f"{url} answered /wake_up but still sleeps")
