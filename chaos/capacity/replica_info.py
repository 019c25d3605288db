"""What the capacity probe reads of its replica before loading it: the model to ask
for, the engine's version, the context it takes (``max_model_len``) and its serving
configuration (``controlplane.kernel.capacity.serving``), which the record keeps so that
a region serving with another is judged stale.

- ``GET /version``: vLLM's version ("" when it does not answer);
- ``GET /v1/models``: the model (the first unless given) and its ``max_model_len``;
- ``GET /metrics``: ``vllm:cache_config_info`` (block size, GPU blocks, ...);
- ``GET /server_info?config_format=json`` (vLLM's dev mode): ``max_num_seqs``, which
  vLLM exports nowhere else; unknown without dev mode.

Everything but the model is best effort.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import aiohttp

from chaos.capacity.verdicts import AbortCause, ProbeAborted
from controlplane.kernel.capacity.record import clean_engine_version
from controlplane.kernel.capacity.serving import ServingConfig, models_entry, serving_config

_ERRORS = (aiohttp.ClientError, TimeoutError, OSError, ValueError)


@dataclass(frozen=True, slots=True)
class ReplicaInfo:
    model: str
    engine_version: str  # "" when /version does not answer
    max_model_len: int | None  # None: /v1/models does not say
    serving: ServingConfig

    @property
    def fingerprint(self) -> str:
        return self.serving.fingerprint()


async def _json(http: aiohttp.ClientSession, url: str, timeout_s: float) -> object:
    """A 200 answer's JSON body, else None."""
    try:
        async with http.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            return await r.json(content_type=None) if r.status == 200 else None
    except _ERRORS:
        return None


async def _text(http: aiohttp.ClientSession, url: str, timeout_s: float) -> str:
    try:
        async with http.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            return await r.text() if r.status == 200 else ""
    except _ERRORS:
        return ""


async def read_replica(
    http: aiohttp.ClientSession, url: str, model: str | None = None, timeout_s: float = 10.0
) -> ReplicaInfo:
    """The replica at ``url`` (see the module doc), each read within ``timeout_s``;
    raises :class:`ProbeAborted` (UNREADABLE) when no model is given and
    ``/v1/models`` names none."""
    base = url.rstrip("/")
    version, models, metrics, info = await asyncio.gather(
        _json(http, base + "/version", timeout_s),
        _json(http, base + "/v1/models", timeout_s),
        _text(http, base + "/metrics", timeout_s),
        _json(http, base + "/server_info?config_format=json", timeout_s),
    )
    raw_version = version.get("version", "") if isinstance(version, dict) else ""
    # A given model that /v1/models does not list: its context is not known.
    entry = models_entry(models, model)
    if entry is None and model is None:
        raise ProbeAborted(AbortCause.UNREADABLE, None, f"{url}/v1/models: no model")
    name = model if model is not None else entry[0]  # type: ignore[index]
    max_len = entry[1] if entry is not None else None
    return ReplicaInfo(
        model=name,
        engine_version=clean_engine_version(raw_version),
        max_model_len=max_len,
        serving=serving_config(name, max_len, metrics, info),
    )
