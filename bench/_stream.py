"""One streaming completion, timed from the client: what the benches measure TTFT with."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import aiohttp

from bench._common import BenchError


@dataclass(frozen=True)
class Streamed:
    ttft_s: float  # request sent -> first chunk with text
    region: str  # x-tectonic-region when a gateway answered, else ""
    prompt_tokens: int  # from the final usage chunk (stream_options.include_usage)
    cached_tokens: int  # usage.prompt_tokens_details.cached_tokens, 0 when not reported


async def streamed_completion(
    http: aiohttp.ClientSession,
    url: str,
    body: dict[str, object],
    headers: dict[str, str] | None = None,
) -> Streamed:
    """POST ``body`` (streaming, with usage) to ``url``/v1/completions. Raises BenchError
    on a non-200 answer or a stream without content."""
    ttft: float | None = None
    prompt_tokens = cached = 0
    t0 = time.perf_counter()
    async with http.post(url + "/v1/completions", json=body, headers=headers) as r:
        if r.status != 200:
            raise BenchError(f"{url}: HTTP {r.status}: {(await r.text())[:200]}")
        region = r.headers.get("x-tectonic-region", "")
        async for raw in r.content:
            line = raw.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            choices = chunk.get("choices") or []
            if ttft is None and choices and choices[0].get("text"):
                ttft = time.perf_counter() - t0
            if usage := chunk.get("usage"):
                prompt_tokens = int(usage["prompt_tokens"])
                cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    if ttft is None:
        raise BenchError(f"{url}: a streaming completion brought no content")
    return Streamed(ttft, region, prompt_tokens, cached)
