"""An open-loop load generator: requests sent at their planned times, whatever the
server does (a closed loop would slow down with the server and hide its queue).

One event loop, one task per request, every body serialized beforehand; the
connection pool is unbounded (a bounded pool would turn the open loop into a closed
one). The generator shares its cores with the server under test, so it measures
itself: each request's **lag** (how late it was sent after its planned time) comes
back with its result, and a step whose generator fell behind shows it.

A request is **ok** when a 200 stream carried ``data: [DONE]`` and no in-band error;
an **error** is any other status (500s and 429 above all), an in-band error event, a
stream cut before ``[DONE]`` or a refused connection, except a 400 refusing a request
too long for the model's context: a **workload** error (the probe's fault, not load;
``results.context_error``); a **timeout** is a request not
done within the request-level timeout (the client cuts it). First-token time is
from the send to the first chunk with content. Tokens (prompt from the final usage
chunk, else the request's estimate; generated: chunks with content) are counted for
every request that got a first token, failed or not: the wasted-work share.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp

from chaos.capacity.results import Outcome, RequestResult, context_error

# The results live in ``chaos.capacity.results`` (pure); named here too, where callers
# of the generator find them.
__all__ = ["CHAT_PATH", "LoadGenerator", "Outcome", "Planned", "RequestResult"]

CHAT_PATH = "/v1/chat/completions"
_HEADERS = {"Content-Type": "application/json", "Accept": "text/event-stream"}
_DATA = b"data: "
_DONE = b"data: [DONE]"
_EMPTY = re.compile(rb'"content":\s*""')  # a chunk without text (compact or spaced JSON)


@dataclass(frozen=True, slots=True)
class Planned:
    """One request to send ``at_s`` seconds after the run starts."""

    at_s: float
    url: str  # the replica's base URL
    body: bytes
    prompt_tokens: int  # the workload's estimate, used when no usage comes back


@dataclass(slots=True)
class _Stream:
    first_token_s: float | None = None
    generated: int = 0
    prompt_tokens: int | None = None
    cached: int | None = None
    done: bool = False
    error: str = ""

    def read(self, line: bytes, now: float) -> None:
        """One SSE line of a chat completion stream."""
        if not line.startswith(_DATA):
            return
        if line.startswith(_DONE):
            self.done = True
            return
        if self.first_token_s is not None and b'"usage"' not in line and b'"error"' not in line:
            # past the first token only the count matters: no JSON parse per token
            self.generated += b'"content"' in line and not _EMPTY.search(line)
            return
        try:
            chunk = json.loads(line[len(_DATA) :])
        except ValueError:
            self.error = self.error or "a stream chunk is not JSON"
            return
        if not isinstance(chunk, dict):
            return
        if "error" in chunk:  # vLLM's in-band error, then [DONE]
            err = chunk["error"]
            self.error = str(err.get("message", err) if isinstance(err, dict) else err)
            return
        for choice in chunk.get("choices") or ():
            if (choice.get("delta") or {}).get("content"):
                self.generated += 1
                if self.first_token_s is None:
                    self.first_token_s = now
                break
        usage = chunk.get("usage")
        if isinstance(usage, dict) and "prompt_tokens" in usage:
            self.prompt_tokens = int(usage["prompt_tokens"])
            details = usage.get("prompt_tokens_details") or {}
            if (cached := details.get("cached_tokens")) is not None:
                self.cached = int(cached)


class LoadGenerator:
    """Sends :class:`Planned` requests on one ``aiohttp`` session (its own unless
    given one: the pool must be unbounded)."""

    def __init__(self, request_timeout_s: float, http: aiohttp.ClientSession | None = None):
        if request_timeout_s <= 0:
            raise ValueError("the request timeout must be positive")
        self.request_timeout_s = request_timeout_s
        self._http = http
        self._own = http is None

    async def __aenter__(self) -> LoadGenerator:
        if self._http is None:
            connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=None)
            self._http = aiohttp.ClientSession(connector=connector)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._own and self._http is not None:
            await self._http.close()
            self._http = None

    @property
    def http(self) -> aiohttp.ClientSession:
        if self._http is None:
            raise RuntimeError("use the load generator as an async context manager")
        return self._http

    async def run(self, plan: Sequence[Planned]) -> list[RequestResult]:
        """Send every request at its time (in ``at_s`` order) and wait for them all;
        results in the plan's order."""
        loop = asyncio.get_running_loop()
        order = sorted(range(len(plan)), key=lambda i: plan[i].at_s)
        start = loop.time() + 0.005  # a little lead: the first send is not late by design
        tasks: dict[int, asyncio.Task[RequestResult]] = {}
        for i in order:
            p = plan[i]
            delay = start + p.at_s - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks[i] = asyncio.create_task(self._one(p, start))
        try:
            return list(await asyncio.gather(*(tasks[i] for i in range(len(plan)))))
        finally:
            for t in tasks.values():
                t.cancel()

    async def _one(self, p: Planned, start: float) -> RequestResult:
        loop = asyncio.get_running_loop()
        sent = loop.time()
        stream = _Stream()
        status = 0
        outcome, detail = Outcome.ERROR, ""
        try:
            async with asyncio.timeout(self.request_timeout_s):
                async with self.http.post(p.url + CHAT_PATH, data=p.body, headers=_HEADERS) as r:
                    status = r.status
                    if status != 200:
                        text = await r.text()
                        detail = f"HTTP {status}: {text[:200]}"
                        if context_error(status, text):
                            outcome = Outcome.WORKLOAD
                    else:
                        async for line in r.content:
                            stream.read(line, loop.time())
                        outcome, detail = _judge(stream)
        except TimeoutError:
            outcome, detail = Outcome.TIMEOUT, f"no answer within {self.request_timeout_s:g} s"
        except (aiohttp.ClientError, OSError) as e:
            detail = f"{type(e).__name__}: {e}"[:200]
        done = loop.time()
        first = stream.first_token_s
        prompt = 0
        if first is not None:  # prefill happened: its tokens were spent
            prompt = stream.prompt_tokens if stream.prompt_tokens is not None else p.prompt_tokens
        return RequestResult(
            planned_s=p.at_s,
            sent_s=sent - start,
            first_token_s=None if first is None else first - start,
            done_s=done - start,
            outcome=outcome,
            status=status,
            detail=detail,
            prompt_tokens=prompt,
            generated_tokens=stream.generated,
            cached_tokens=stream.cached,
            url=p.url,
        )


def _judge(stream: _Stream) -> tuple[Outcome, str]:
    if stream.error:
        return Outcome.ERROR, f"in-band error: {stream.error[:200]}"
    if not stream.done:
        return Outcome.ERROR, "the stream ended without [DONE]"
    if stream.first_token_s is None:
        return Outcome.ERROR, "the stream carried no content"
    return Outcome.OK, ""
