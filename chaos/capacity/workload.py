"""The probe's requests, shaped like a region's own traffic (pure, seeded).

A :class:`Workload` is a ``WorkloadProfile`` (prompt lengths from their p50 and p90,
output tokens, the share of requests that start with a shared prefix) plus what the
warm workload's shared prefixes look like (how many, how long). Two workloads come
out of it with the same prompt lengths request by request:

- **cold**: every prompt unique from its first word (a nonce), so nothing hits;
- **warm**: a share of the prompts start with one of the few shared prefixes (cut to
  fit a short prompt), then a nonce; the rest are unique as in the cold workload.

Prompts are words of at most four letters, about one token each (one each on the
simulator's tokenizer, one or two on a BPE one); the hit rate a probe reports is read
from the replica's counters, never from these estimates.

A replica takes no prompt longer than its context (``max_model_len``, from its
``/v1/models``) leaves for the output: :func:`fit_context` lowers the workload's
``max_prompt_tokens`` (and a longer shared prefix) to fit, with a margin for the
estimate (a BPE tokenizer splits some words, a real chat template adds more than
:data:`TEMPLATE_TOKENS`). Only the lengths past the cap change: the same draws, the
same requests otherwise, the same stream for the same cap.

Everything is a function of a seed, and request ``i`` and arrival ``i`` are the same
at every rate (common random numbers: arrivals are unit exponential gaps scaled by
1/rate). Steps of one probe then differ only by their rate, and a model of the
replica can be fed exactly the requests the probe sent (``python -m bench capacity``).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace

from controlplane.kernel.capacity.record import WorkloadProfile
from controlplane.kernel.prefix.catalog import PrefixCatalog

# What a chat template adds around one user message (the simulator's: BOS, role
# markers and the generation prompt); real templates add about as much or more.
TEMPLATE_TOKENS = 8
NONCE_WORDS = 3  # leading words that make a prompt (or a shared prompt's rest) unique
# What fit_context leaves of the context for the estimate's error: a share of it, and
# some tokens more (a long chat template, a system prompt).
CONTEXT_HEADROOM = 0.1
CONTEXT_MARGIN_TOKENS = 64
_Z90 = statistics.NormalDist().inv_cdf(0.9)
_BASE36 = "0123456789abcdefghijklmnopqrstuvwxyz"
# Short common words: one token on most tokenizers with their leading space.
WORDS = (
    "the", "of", "and", "to", "in", "is", "for", "on", "that", "by", "this", "with",
    "you", "it", "not", "or", "be", "are", "from", "at", "as", "your", "all", "have",
    "new", "more", "an", "was", "we", "will", "home", "can", "us", "able", "if", "page",
    "my", "has", "free", "but", "our", "one", "do", "no", "time", "they", "site", "he",
    "up", "may", "what", "news", "out", "use", "any", "see", "only", "so", "his", "when",
    "here", "who", "web", "also", "now", "help", "get", "view", "am", "been", "how",
    "were", "me", "some", "its", "like", "than", "find", "date", "back", "top", "had",
    "list", "name", "just", "over", "year", "day", "into", "two", "next", "used", "go",
    "work", "last", "most", "data", "make", "them", "post", "city", "add", "such",
)  # fmt: skip

DEFAULT_PROFILE = WorkloadProfile(
    prompt_tokens_p50=512,
    prompt_tokens_p90=2048,
    output_tokens=128,
    shared_prefix_share=0.6,
    source="default",
)


@dataclass(frozen=True, slots=True)
class Workload:
    """A profile and the warm workload's shared prefixes: ``prefixes`` of them, each
    ``prefix_tokens`` long (a prompt too short for one gets its first words)."""

    profile: WorkloadProfile
    prefix_tokens: int
    prefixes: int = 4
    min_prompt_tokens: int = TEMPLATE_TOKENS + NONCE_WORDS + 1
    max_prompt_tokens: int = 8192

    def __post_init__(self) -> None:
        if self.prefix_tokens < 1 or not 1 <= self.prefixes <= 999:
            raise ValueError("prefix_tokens >= 1 and 1 <= prefixes <= 999 are required")
        if not self.min_prompt_tokens <= self.max_prompt_tokens:
            raise ValueError("min_prompt_tokens must not exceed max_prompt_tokens")


def context_cap(
    max_model_len: int,
    output_tokens: int,
    headroom: float = CONTEXT_HEADROOM,
    margin_tokens: int = CONTEXT_MARGIN_TOKENS,
) -> int:
    """The longest prompt (the workload's estimate, template included) that leaves
    ``output_tokens`` of a ``max_model_len`` context, less the margins: ``(max_model_len
    - output_tokens - margin_tokens) * (1 - headroom)``, rounded down."""
    if max_model_len < 1 or output_tokens < 0 or not 0 <= headroom < 1 or margin_tokens < 0:
        raise ValueError("max_model_len >= 1, output_tokens >= 0, 0 <= headroom < 1 required")
    return math.floor((max_model_len - output_tokens - margin_tokens) * (1 - headroom))


def fit_context(
    workload: Workload,
    max_model_len: int | None,
    headroom: float = CONTEXT_HEADROOM,
    margin_tokens: int = CONTEXT_MARGIN_TOKENS,
) -> Workload:
    """The workload with every prompt short enough that prompt and output fit a
    replica's ``max_model_len`` (:func:`context_cap`): ``max_prompt_tokens`` lowered
    to the cap (and recorded in the profile), a shared prefix too long for it cut
    (with its nonce and question it must fit as well). Unchanged when the cap is
    above the workload's own bound, or ``max_model_len`` is None (not reported).
    Raises ValueError when not even the shortest prompt fits with the output."""
    if max_model_len is None:
        return workload
    cap = context_cap(max_model_len, workload.profile.output_tokens, headroom, margin_tokens)
    if cap < workload.min_prompt_tokens:
        raise ValueError(
            f"a context of {max_model_len} tokens leaves no room for a prompt of "
            f"{workload.min_prompt_tokens} and {workload.profile.output_tokens} output tokens"
        )
    if cap >= workload.max_prompt_tokens:
        return workload
    prefix = min(workload.prefix_tokens, max(1, cap - TEMPLATE_TOKENS - NONCE_WORDS - 1))
    profile = workload.profile.model_copy(update={"max_prompt_tokens": cap})
    return replace(workload, profile=profile, prefix_tokens=prefix, max_prompt_tokens=cap)


def default_workload(profile: WorkloadProfile = DEFAULT_PROFILE) -> Workload:
    """A workload for a profile that says nothing of its prefixes: four shared prefixes
    of 3/4 of the median prompt (a long system prompt and a short question)."""
    return Workload(profile, prefix_tokens=max(1, round(0.75 * profile.prompt_tokens_p50)))


def _deepest(catalog: PrefixCatalog) -> list[tuple[int, int]]:
    """(tokens, count) of the catalog's deepest shared prefixes: entries with a payload
    that no other entry names as its ancestor (the shallower levels of one prompt)."""
    with_payload = [e for e in catalog.entries if e.payload is not None]
    ancestors = {a for e in with_payload for a in e.payload.ancestors}  # type: ignore[union-attr]
    return [
        (e.payload.tokens, e.count)  # type: ignore[union-attr]
        for e in with_payload
        if e.key not in ancestors and e.count > 0
    ]


def _weighted_median(values: Sequence[tuple[int, int]]) -> int:
    weights: Counter[int] = Counter()
    for v, w in values:
        weights[v] += w
    half = sum(weights.values()) / 2
    seen = 0
    for v in sorted(weights):
        seen += weights[v]
        if seen >= half:
            return v
    raise ValueError("no values")


def workload_from_catalog(
    catalog: PrefixCatalog | None, base: WorkloadProfile = DEFAULT_PROFILE, max_prefixes: int = 8
) -> Workload:
    """The probe's workload for a region from its prefix catalog (``prefixes/<region>``,
    what the leader merges from the gateways' exports), or :func:`default_workload` of
    ``base`` when there is none or it has no payloads yet.

    The catalog carries the shared prefixes (their length in tokens, their counts), so
    the warm workload uses as many of them as it holds (at most ``max_prefixes``) at
    their count-weighted median length. It counts neither all prompts nor their lengths,
    so the shared share and the prompt lengths come from ``base`` (the median prompt
    is made long enough to hold the prefix and a question)."""
    deepest = _deepest(catalog) if catalog is not None else []
    if not deepest:
        return default_workload(base)
    prefix_tokens = _weighted_median(deepest)
    p50 = max(base.prompt_tokens_p50, round(prefix_tokens * 4 / 3))
    profile = base.model_copy(
        update={
            "prompt_tokens_p50": p50,
            "prompt_tokens_p90": max(base.prompt_tokens_p90, p50),
            "source": "exports",
        }
    )
    return Workload(profile, prefix_tokens=prefix_tokens, prefixes=min(len(deepest), max_prefixes))


# ---- arrivals and requests --------------------------------------------------------------


def arrivals(rate_rps: float, duration_s: float, seed: int) -> list[float]:
    """Poisson arrival offsets (seconds) at ``rate_rps`` within ``duration_s``: the same
    unit exponential gaps for every rate, scaled by 1/rate."""
    if rate_rps <= 0 or duration_s <= 0:
        raise ValueError("rate and duration must be positive")
    rng = random.Random(seed)
    out: list[float] = []
    t = 0.0
    while True:
        t += rng.expovariate(1.0) / rate_rps
        if t >= duration_s:
            return out
        out.append(t)


@dataclass(frozen=True, slots=True)
class ProbeRequest:
    """One chat completion of the probe: ``content`` is the user message."""

    index: int
    prompt_tokens: int  # what the workload aimed at (template included): an estimate
    prefix: int | None  # the shared prefix it starts with; None: unique from the start
    prefix_words: int  # how many of that prefix's words it carries (0 when unique)
    content: str
    max_tokens: int

    def body(self, model: str) -> bytes:
        """The streaming request, with usage at the end and a fixed output length."""
        return json.dumps(
            {
                "model": model,
                "messages": [{"role": "user", "content": self.content}],
                "max_tokens": self.max_tokens,
                "ignore_eos": True,  # vLLM: the output is as long as the profile says
                "temperature": 0,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
        ).encode()


def prompt_length(profile: WorkloadProfile, u: float, workload: Workload) -> int:
    """The prompt length at quantile ``u`` of a log-normal with the profile's p50 and
    p90 (a constant when they are equal), within the workload's bounds."""
    p50 = profile.prompt_tokens_p50
    p90 = max(profile.prompt_tokens_p90, p50)
    sigma = math.log(p90 / p50) / _Z90
    u = min(max(u, 1e-9), 1 - 1e-9)
    tokens = round(p50 * math.exp(sigma * statistics.NormalDist().inv_cdf(u)))
    return min(workload.max_prompt_tokens, max(workload.min_prompt_tokens, tokens))


def prefix_words(k: int, seed: int, words: int) -> list[str]:
    """Shared prefix ``k``'s words: its number first, so prefixes differ from their
    first block on."""
    rng = random.Random(f"prefix:{seed}:{k}")
    return [f"p{k:03d}", *rng.choices(WORDS, k=max(0, words - 1))]


def nonce(tag: str, index: int) -> list[str]:
    """Words no other request carries: a digit then base-36 characters, four each."""
    value = int.from_bytes(hashlib.blake2b(f"{tag}:{index}".encode(), digest_size=12).digest())
    out = []
    for _ in range(NONCE_WORDS):
        chars = [_BASE36[value % 10]]
        value //= 10
        for _ in range(3):
            chars.append(_BASE36[value % 36])
            value //= 36
        out.append("".join(chars))
    return out


def _filler(index: int, words: int) -> list[str]:
    start = index * 7
    return [WORDS[(start + j) % len(WORDS)] for j in range(words)]


def requests(
    workload: Workload, count: int, *, warm: bool, seed: int, tag: str
) -> list[ProbeRequest]:
    """The first ``count`` requests of the workload (cold, or warm with shared
    prefixes). Request ``i`` has the same length (and, warm, the same prefix) for every
    ``count`` and ``tag``; ``tag`` only changes the nonces, so that cold prompts of two
    steps never share a block."""
    profile = workload.profile
    rng = random.Random(seed)
    prefix_cache: dict[int, list[str]] = {}
    out = []
    for i in range(count):
        # Draw the same numbers cold and warm, so both have the same lengths.
        u_len, u_share, k = rng.random(), rng.random(), rng.randrange(workload.prefixes)
        tokens = prompt_length(profile, u_len, workload)
        words = max(1, tokens - TEMPLATE_TOKENS)
        shared = warm and u_share < profile.shared_prefix_share
        head: list[str] = []
        if shared:
            if k not in prefix_cache:
                prefix_cache[k] = prefix_words(k, seed, workload.prefix_tokens)
            room = max(0, words - NONCE_WORDS - 1)  # keep a unique question after it
            head = prefix_cache[k][:room]
        rest = nonce(tag, i)[: max(0, words - len(head))]
        filler = _filler(i, words - len(head) - len(rest))
        out.append(
            ProbeRequest(
                index=i,
                prompt_tokens=tokens,
                prefix=k if head else None,
                prefix_words=len(head),
                content=" ".join(head + rest + filler),
                max_tokens=profile.output_tokens,
            )
        )
    return out


def warmup_requests(workload: Workload, *, seed: int, tag: str) -> list[ProbeRequest]:
    """One request per shared prefix, carrying all of it: what the warm probe sends
    first, so that its steps meet the prefixes cached (as the region's traffic keeps
    them) rather than one cold start each."""
    out = []
    for k in range(workload.prefixes):
        words = [*prefix_words(k, seed, workload.prefix_tokens), *nonce(tag, k), WORDS[0]]
        out.append(
            ProbeRequest(
                index=k,
                prompt_tokens=len(words) + TEMPLATE_TOKENS,
                prefix=k,
                prefix_words=workload.prefix_tokens,
                content=" ".join(words),
                max_tokens=1,
            )
        )
    return out
