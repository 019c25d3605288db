"""vLLM's Prometheus metrics, rendered in the text format ``prometheus_client`` writes.

Names, types, help texts, label names (``model_name``, ``engine``) and histogram
buckets follow vLLM's V1 ``PrometheusStatLogger``; labels are sorted and floats are
written the way ``prometheus_client`` writes them (``1.0``, ``+Inf``), and every
counter and histogram has its ``_created`` gauge, so a scraper cannot tell the
simulator from the real server by format.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")  # vLLM 0.32's label set
SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")
Samples = Sequence[tuple[Mapping[str, str], float]]


def go_float(value: float) -> str:
    """Format a float like ``prometheus_client.utils.floatToGoString``."""
    d = float(value)
    if d == math.inf:
        return "+Inf"
    if d == -math.inf:
        return "-Inf"
    if math.isnan(d):
        return "NaN"
    s = repr(d)
    dot = s.find(".")
    if d > 0 and dot > 6:
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+0{dot - 1}"
    return s


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    esc = (
        (k, v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\""))
        for k, v in sorted(labels.items())
    )
    return "{" + ",".join(f'{k}="{v}"' for k, v in esc) + "}"


@dataclass
class Histogram:
    buckets: Sequence[float]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.n += 1


class Exposition:
    """Accumulates metric families into Prometheus text (version 0.0.4)."""

    def __init__(self, created: float) -> None:
        self._lines: list[str] = []
        self._created = created

    def _family(self, name: str, kind: str, doc: str) -> None:
        self._lines.append(f"# HELP {name} {doc}")
        self._lines.append(f"# TYPE {name} {kind}")

    def _created_gauge(self, name: str, doc: str, labels: Mapping[str, str]) -> None:
        self._family(f"{name}_created", "gauge", doc)
        self._lines.append(f"{name}_created{_labels(labels)} {go_float(self._created)}")

    def gauge(self, name: str, doc: str, samples: Samples) -> None:
        self._family(name, "gauge", doc)
        self._lines.extend(f"{name}{_labels(lb)} {go_float(v)}" for lb, v in samples)

    def counter(self, name: str, doc: str, samples: Samples) -> None:
        self._family(f"{name}_total", "counter", doc)
        self._lines.extend(f"{name}_total{_labels(lb)} {go_float(v)}" for lb, v in samples)
        if not samples:
            return  # like prometheus_client: a labelled counter not used yet has no _created
        self._family(f"{name}_created", "gauge", doc)
        self._lines.extend(
            f"{name}_created{_labels(lb)} {go_float(self._created)}" for lb, _ in samples
        )

    def histogram(self, name: str, doc: str, labels: Mapping[str, str], h: Histogram) -> None:
        self._family(name, "histogram", doc)
        cumulative = 0
        for bound, count in zip([*h.buckets, math.inf], h.counts, strict=True):
            cumulative += count
            lb = {**labels, "le": go_float(bound)}
            self._lines.append(f"{name}_bucket{_labels(lb)} {go_float(cumulative)}")
        self._lines.append(f"{name}_count{_labels(labels)} {go_float(h.n)}")
        self._lines.append(f"{name}_sum{_labels(labels)} {go_float(h.total)}")
        self._created_gauge(name, doc, labels)

    def text(self) -> str:
        return "\n".join(self._lines) + "\n"


@dataclass
class SpecDecodeStats:
    """vLLM's ``SpecDecodingStats``, counted per decode step: each step verifies one
    draft of ``num_spec_tokens`` tokens, accepts the first ``accepted_per_draft`` of them
    and adds the bonus token, so it yields ``accepted_per_draft + 1`` tokens."""

    num_spec_tokens: int
    accepted_per_draft: int
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.accepted_per_pos = [0] * self.num_spec_tokens

    @property
    def tokens_per_step(self) -> int:
        return self.accepted_per_draft + 1

    def observe_decode_token(self, index: int) -> None:
        """The ``index``-th decode token of a request (0 = the first after prefill):
        the first of each step opens a draft, the next ones are its accepted tokens."""
        pos = index % self.tokens_per_step
        if pos == 0:
            self.drafts += 1
            self.draft_tokens += self.num_spec_tokens
        else:
            self.accepted += 1
            self.accepted_per_pos[pos - 1] += 1


@dataclass
class EngineStats:
    """What the simulated engine counts; rendered by :func:`render_metrics`."""

    created: float = field(default_factory=time.time)
    prompt_tokens: int = 0
    generation_tokens: int = 0
    finished: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FINISH_REASONS, 0))
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    queue_time: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    # The FastAPI instrumentator's http_requests_total: (handler, method, "2xx"...) -> count
    http_requests: dict[tuple[str, str, str], int] = field(default_factory=dict)
    spec_decode: SpecDecodeStats | None = None  # with --speculative-config only, like vLLM


@dataclass(frozen=True)
class Snapshot:
    running: int
    waiting: int
    kv_cache_usage: float
    prefix_queries: int
    prefix_hits: int
    sleep_level: int | None  # None while awake
    cache_info: Mapping[str, str]


def render_metrics(model: str, stats: EngineStats, snap: Snapshot) -> str:
    """The ``/metrics`` page, its families in vLLM's order: the scheduler and its cache
    now, the requests so far, the sleep state, the cache config, speculative decoding
    (with a speculative config) and the HTTP server's own counter."""
    base = {"model_name": model, "engine": "0"}
    out = Exposition(stats.created)
    _scheduler(out, base, snap)
    _requests(out, base, stats)
    _sleep_state(out, base, snap.sleep_level)
    out.gauge(
        "vllm:cache_config_info",
        "Information of the LLMEngine CacheConfig",
        [({**snap.cache_info, "engine": "0"}, 1.0)],
    )
    if stats.spec_decode is not None:
        _spec_decode(out, base, stats.spec_decode)
    out.counter(
        "http_requests",
        "Total number of requests by method, status and handler.",
        [
            ({"handler": h, "method": m, "status": st}, n)
            for (h, m, st), n in stats.http_requests.items()
        ],
    )
    return out.text()


def _scheduler(out: Exposition, base: Mapping[str, str], snap: Snapshot) -> None:
    """The scheduler now: requests running and waiting, the KV cache's use, and the
    prefix cache's counters (what the agent and the capacity probe read)."""
    out.gauge(
        "vllm:num_requests_running",
        "Number of requests in model execution batches.",
        [(base, snap.running)],
    )
    out.gauge(
        "vllm:num_requests_waiting",
        "Number of requests waiting to be processed.",
        [(base, snap.waiting)],
    )
    out.gauge(
        "vllm:kv_cache_usage_perc",
        "KV-cache usage. 1 means 100 percent usage.",
        [(base, snap.kv_cache_usage)],
    )
    out.counter(
        "vllm:prefix_cache_queries",
        "Prefix cache queries, in terms of number of queried tokens.",
        [(base, snap.prefix_queries)],
    )
    out.counter(
        "vllm:prefix_cache_hits",
        "Prefix cache hits, in terms of number of cached tokens.",
        [(base, snap.prefix_hits)],
    )


def _requests(out: Exposition, base: Mapping[str, str], stats: EngineStats) -> None:
    """The requests served so far: tokens, completions by reason, latency histograms."""
    out.counter(
        "vllm:prompt_tokens", "Number of prefill tokens processed.", [(base, stats.prompt_tokens)]
    )
    out.counter(
        "vllm:generation_tokens",
        "Number of generation tokens processed.",
        [(base, stats.generation_tokens)],
    )
    out.counter(
        "vllm:request_success",
        "Count of successfully processed requests.",
        [({**base, "finished_reason": r}, n) for r, n in stats.finished.items()],
    )
    out.histogram(
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        base,
        stats.ttft,
    )
    out.histogram(
        "vllm:e2e_request_latency_seconds",
        "Histogram of e2e request latency in seconds.",
        base,
        stats.e2e,
    )
    out.histogram(
        "vllm:request_queue_time_seconds",
        "Histogram of time spent in WAITING phase for request.",
        base,
        stats.queue_time,
    )


def _sleep_state(out: Exposition, base: Mapping[str, str], level: int | None) -> None:
    """Like vLLM: asleep, awake = 0; level 0 (scheduling paused only) sets no other state."""
    state = "awake" if level is None else {1: SLEEP_STATES[1], 2: SLEEP_STATES[2]}.get(level)
    out.gauge(
        "vllm:engine_sleep_state",
        "Engine sleep state; awake = 0 means engine is sleeping; "
        "awake = 1 means engine is awake; weights_offloaded = 1 means sleep level 1; "
        "discard_all = 1 means sleep level 2.",
        [({**base, "sleep_state": s}, float(s == state)) for s in SLEEP_STATES],
    )


def _spec_decode(out: Exposition, base: Mapping[str, str], sd: SpecDecodeStats) -> None:
    """vLLM's ``SpecDecodingProm`` families (absent without a speculative config)."""
    out.counter(
        "vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", [(base, sd.drafts)]
    )
    out.counter(
        "vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", [(base, sd.draft_tokens)]
    )
    out.counter(
        "vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", [(base, sd.accepted)]
    )
    out.counter(
        "vllm:spec_decode_num_accepted_tokens_per_pos",
        "Accepted tokens per draft position.",
        [({**base, "position": str(i)}, n) for i, n in enumerate(sd.accepted_per_pos)],
    )
