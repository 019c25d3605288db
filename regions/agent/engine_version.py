"""Which engine the region's replicas run: vLLM's ``GET /version``, read by the agent and
sent with its health reports, so that the leader can tell a capacity probe of another
engine from a fresh one (``controlplane.kernel.capacity.record.resolve``).

An engine changes only when a replica restarts, so a replica's version is read when it
is first seen up, again when it comes back after being down (a restart may bring a new
image), and otherwise every ``refresh_s``: not on every probe round. :class:`EngineVersions`
decides (pure, callers pass ``now``); :func:`refresh_versions` reads the ones due.

The region's version is its up replicas' one version; while they differ (a rolling
upgrade) it names each, sorted ("0.8.5, 0.9.0"), which no probe matches: the probe was
of one engine, and the region is not all of it. A replica that never answered
``/version`` (an engine without it) does not count; none known: "" (not judged).

With the version, on the same schedule (a configuration too changes only with a
restart), each replica's **serving configuration** is read: ``/v1/models`` (model,
``max_model_len``), ``vllm:cache_config_info`` on ``/metrics`` (the KV cache) and, in
vLLM's dev mode, ``/server_info`` (``max_num_seqs``, which vLLM exports nowhere else);
each part best effort (what does not answer is left out, and not judged). The region's
is its up replicas' fingerprints merged (``controlplane.kernel.capacity.serving``): a
probe under another configuration is stale too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import aiohttp

from controlplane.kernel.capacity.record import MAX_ENGINE_VERSION, clean_engine_version
from controlplane.kernel.capacity.serving import (
    MAX_FINGERPRINT,
    clean_fingerprint,
    merge_fingerprints,
    models_entry,
    serving_config,
)
from regions.agent.probe_vllm import ReplicaProbe
from regions.dataplane.replay_headers import replay_headers

DEFAULT_REFRESH_S = 300.0
RETRY_S = 30.0  # after a failed read: not every round (a slow /version holds the round)


@dataclass
class EngineVersions:
    """The last read version of each replica, and when to read it again."""

    refresh_s: float = DEFAULT_REFRESH_S
    retry_s: float = RETRY_S
    _known: dict[str, str] = field(default_factory=dict)  # url -> version ("" none)
    _read_at: dict[str, float] = field(default_factory=dict)
    _serving: dict[str, str] = field(default_factory=dict)  # url -> fingerprint ("" none)

    def due(self, probes: Iterable[ReplicaProbe], now: float) -> list[str]:
        """The up replicas whose version to read now. A replica seen down, or no longer
        probed (parked WARM, relaunched), is forgotten, so that it is read again when it
        is back: a restart may bring a new image."""
        probes = list(probes)
        probed = {p.url for p in probes}
        for url in [u for u in self._read_at if u not in probed]:
            self._known.pop(url, None)
            self._serving.pop(url, None)
            del self._read_at[url]
        out = []
        for p in probes:
            if not p.up:
                self._known.pop(p.url, None)
                self._serving.pop(p.url, None)
                self._read_at.pop(p.url, None)
            elif p.url not in self._read_at or now - self._read_at[p.url] >= self.refresh_s:
                out.append(p.url)
        return out

    def record(
        self, url: str, version: str | None, now: float, serving: str = "", *, whole: bool = True
    ) -> None:
        """What ``url`` answered: its version (None: it could not be read; tried again
        after ``retry_s``, its last known version and configuration kept meanwhile)
        and its serving configuration's fingerprint ("" unknown; not ``whole``: a part
        did not answer, kept, and read again after ``retry_s``)."""
        if version is None:
            self._read_at[url] = now - self.refresh_s + self.retry_s
            return
        self._known[url] = version[:MAX_ENGINE_VERSION]
        self._serving[url] = clean_fingerprint(serving)
        self._read_at[url] = now if whole else now - self.refresh_s + self.retry_s

    def region_version(self, probes: Iterable[ReplicaProbe]) -> str:
        """The engine the up replicas run (see the module doc); "" when none is known."""
        seen = sorted({v for p in probes if p.up and (v := self._known.get(p.url))})
        return ", ".join(seen)[:MAX_ENGINE_VERSION]

    def region_serving(self, probes: Iterable[ReplicaProbe]) -> str:
        """The up replicas' serving configuration, merged (a key on which they differ
        names each value); "" when none is known."""
        fps = [fp for p in probes if p.up and (fp := self._serving.get(p.url))]
        return merge_fingerprints(fps)[:MAX_FINGERPRINT]


async def read_version(
    session: aiohttp.ClientSession, base_url: str, request_timeout: float
) -> str | None:
    """The replica's ``/version`` ("" for an engine that has none: a 404, or an answer
    without a version); None when it could not be read now (timeout, refused, 5xx)."""
    try:
        limit = aiohttp.ClientTimeout(total=request_timeout)
        async with session.get(base_url.rstrip("/") + "/version", timeout=limit) as resp:
            if resp.status == 404:
                return ""
            if resp.status != 200:
                return None
            body = await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
        return None
    version = body.get("version") if isinstance(body, dict) else None
    # The control plane refuses a report whose version is not printable: a control
    # character in an engine's answer must not cost the region its health votes.
    return "" if version is None else clean_engine_version(version)


async def _get(
    session: aiohttp.ClientSession,
    url: str,
    request_timeout: float,
    *,
    as_json: bool,
    api_key: str | None = None,
) -> tuple[bool, object]:
    """Whether the endpoint answered (a 4xx is an answer: it has nothing to say; a
    timeout, a refusal or a 5xx is not), and the body of a 200 (JSON or text);
    ``api_key``: the data plane's own, sent as ``Authorization: Bearer``."""
    headers = dict(replay_headers((), api_key=api_key))
    try:
        limit = aiohttp.ClientTimeout(total=request_timeout)
        async with session.get(url, timeout=limit, headers=headers) as resp:
            if resp.status != 200:
                return resp.status < 500, None
            return True, await (resp.json(content_type=None) if as_json else resp.text())
    except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
        return False, None


async def read_serving(
    session: aiohttp.ClientSession,
    base_url: str,
    request_timeout: float,
    api_key: str | None = None,
) -> tuple[str, bool]:
    """The replica's serving configuration's fingerprint (see the module doc), each
    part best effort ("" when nothing answered), and whether every part answered
    (vLLM's first ``/server_info`` collects its environment: it may take seconds).
    ``/v1/models`` is read with ``api_key`` (the data plane's own: vLLM's ``--api-key``
    guards ``/v1/*``, not ``/metrics`` nor ``/server_info``)."""
    base = base_url.rstrip("/")
    (m_ok, models), (x_ok, metrics), (i_ok, info) = await asyncio.gather(
        _get(session, base + "/v1/models", request_timeout, as_json=True, api_key=api_key),
        _get(session, base + "/metrics", request_timeout, as_json=False),
        _get(session, base + "/server_info?config_format=json", request_timeout, as_json=True),
    )
    entry = models_entry(models)
    model, max_len = entry if entry is not None else ("", None)
    text = metrics if isinstance(metrics, str) else ""
    return serving_config(model, max_len, text, info).fingerprint(), m_ok and x_ok and i_ok


async def read_engine(
    session: aiohttp.ClientSession,
    base_url: str,
    request_timeout: float,
    api_key: str | None = None,
) -> tuple[str | None, str, bool]:
    """The replica's version (:func:`read_version`) and serving configuration
    (:func:`read_serving`, and whether it is whole), read at once."""
    version, (serving, whole) = await asyncio.gather(
        read_version(session, base_url, request_timeout),
        read_serving(session, base_url, request_timeout, api_key),
    )
    return version, serving, whole


async def refresh_versions(
    versions: EngineVersions,
    session: aiohttp.ClientSession,
    probes: Sequence[ReplicaProbe],
    now: float,
    request_timeout: float,
    api_key: str | None = None,
) -> None:
    """Read the versions (and serving configurations) that are due (at once), and
    record them; ``api_key``: the data plane's own (``--replay-api-key-file``)."""
    due = versions.due(probes, now)
    if not due:
        return
    answers = await asyncio.gather(
        *(read_engine(session, u, request_timeout, api_key) for u in due)
    )
    for url, (version, serving, whole) in zip(due, answers, strict=True):
        versions.record(url, version, now, serving, whole=whole)
