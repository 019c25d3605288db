"""``python -m bench prefixes``: the pre-warm prefix tracker on a Zipf workload.

Everything runs in this one process (no deployment is needed):

* **workload**: ``--prefixes`` distinct shared prefixes (system prompts, few-shot
  templates, documents), each ``128..prompt_tokens - 128`` tokens long (uniform), picked
  with Zipf(``--zipf``) popularity; every prompt is its prefix plus a unique suffix up
  to ``--prompt-tokens`` (2,048). ``--mode text`` (default, what a gateway sees): text
  of ``chars_per_token`` characters a token, cut by the character proxy;
  ``--mode tokens``: token-id prompts, cut into token blocks. Sessions are drawn from
  ``--sessions``. The prompts are dealt round-robin to ``--gateways`` trackers (one
  region), whose exports a leader tracker then merges.
* ``prompts_per_s``: prompts / the seconds spent in ``PrefixTracker.observe`` (the
  gateway's hot path: fingerprint every level, update the sketch, admit and count
  sessions), single process, single thread; prompt generation is not timed.
* ``recall_top1pct``: the keys the prompts were counted under are also counted
  exactly (a dict, untimed). The top 1 % is ``ceil(0.01 * shared keys)``, where a
  shared key is one seen at least twice (a key seen once is a prompt's unique
  suffix, nothing to pre-warm). Recall = the share of the merged sketch's top-1 %
  whose exact count reaches the k-th largest exact count (ties count as hits).
* ``sketch_bytes``: the largest serialized sketch (frequent items + HLL), over the
  gateways and the merged leader; payloads are not included (``export_bytes`` is the
  whole export, with them).


One JSON object per gateway and one for the leader go to stdout, then the headline;
progress goes to stderr.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from bench._common import at_least
from controlplane.kernel.prefix.identity import FingerprintParams, PromptRequest, levels
from controlplane.kernel.prefix.tracker import PrefixTracker, TrackerConfig

REGION = "bench"
MODEL = "bench-model"
BATCH = 1000


@dataclass(frozen=True)
class Goals:
    prompts_per_s: float = 2000.0  # at least, one core
    recall_top1pct: float = 0.95  # at least
    sketch_bytes: float = 100_000.0  # at most


GOALS = Goals()
AT_LEAST = ("prompts_per_s", "recall_top1pct")


@dataclass(frozen=True)
class Options:
    prompts: int = 50_000
    prefixes: int = 10_000
    zipf: float = 1.1
    prompt_tokens: int = 2048
    mode: str = "text"
    block_size: int = 16
    chars_per_token: float = 4.0
    level_tokens: int = 256
    lg_map_size: int = 12
    doorkeeper_lg_bits: int = 22
    gateways: int = 2
    sessions: int = 20_000
    seed: int = 1
    quiet: bool = False


class Workload:
    """Deterministic prompts: prefix ``i``'s content comes from seed ``(seed, i)``."""

    def __init__(self, o: Options) -> None:
        self.o = o
        self.rng = np.random.default_rng(o.seed)
        ranks = np.arange(1, o.prefixes + 1, dtype=np.float64)
        p = ranks**-o.zipf
        self.p = p / p.sum()
        low, high = 128, max(129, o.prompt_tokens - 128)
        self.shared_tokens = self.rng.integers(low, high, size=o.prefixes)
        vocab_rng = np.random.default_rng(o.seed + 1)
        letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
        self.vocab = np.array(
            ["".join(vocab_rng.choice(letters, size=n)) for n in vocab_rng.integers(2, 8, 5000)]
        )
        # the unique suffixes are cut from one long text at random places
        self.filler = self._text(vocab_rng, o.prompt_tokens * 8 * 16)
        self.prefix_text = functools.lru_cache(maxsize=4096)(self._prefix_text)
        self.prefix_ids = functools.lru_cache(maxsize=4096)(self._prefix_ids)

    def _text(self, rng: np.random.Generator, chars: int) -> str:
        words = rng.choice(self.vocab, size=chars // 3 + 1)
        return " ".join(words.tolist())[:chars]

    def _prefix_text(self, i: int) -> str:
        chars = int(self.shared_tokens[i] * self.o.chars_per_token)
        return self._text(np.random.default_rng((self.o.seed, i)), chars)

    def _prefix_ids(self, i: int) -> tuple[int, ...]:
        rng = np.random.default_rng((self.o.seed, i))
        return tuple(rng.integers(100, 32_000, size=int(self.shared_tokens[i])).tolist())

    def batch(self, start: int, n: int) -> list[tuple[str, PromptRequest]]:
        """Prompts ``start .. start + n - 1`` as (session, request)."""
        o = self.o
        picks = self.rng.choice(o.prefixes, size=n, p=self.p)
        sessions = self.rng.integers(0, o.sessions, size=n)
        out = []
        for j, (i, s) in enumerate(zip(picks.tolist(), sessions.tolist(), strict=True)):
            serial = start + j
            if o.mode == "tokens":
                head = self.prefix_ids(i)
                fill = self.rng.integers(100, 32_000, size=o.prompt_tokens - len(head) - 1)
                ids = [*head, 1_000_000 + serial, *fill.tolist()]  # the unique marker first
                req = PromptRequest(MODEL, token_ids=ids)
            else:
                head_text = self.prefix_text(i)
                total = int(o.prompt_tokens * o.chars_per_token)
                marker = f"\n#{serial}: "
                room = total - len(head_text) - len(marker)
                at = int(self.rng.integers(0, len(self.filler) - room))
                req = PromptRequest(MODEL, prompt=head_text + marker + self.filler[at : at + room])
            out.append((f"session-{s}", req))
        return out


def _config(o: Options) -> TrackerConfig:
    params = FingerprintParams(
        block_size=o.block_size,
        chars_per_token=o.chars_per_token,
        level_tokens=o.level_tokens,
        max_prefix_tokens=max(o.prompt_tokens, 1),
    )
    return TrackerConfig(
        params=params,
        lg_max_map_size=o.lg_map_size,
        doorkeeper_lg_bits=o.doorkeeper_lg_bits,
        model=MODEL,
    )


def recall(ranked: Sequence[str], exact: Counter[str], k: int) -> float:
    """Share of ``ranked[:k]`` whose exact count reaches the k-th largest exact count."""
    if k == 0:
        return 1.0
    counts = sorted(exact.values(), reverse=True)
    kth = counts[k - 1]
    return sum(1 for key in ranked[:k] if exact[key] >= kth) / k


def measure(
    o: Options, line: Callable[[dict[str, object]], None], say: Callable[[str], None]
) -> dict[str, object]:
    config = _config(o)
    params = config.params
    work = Workload(o)
    gateways = [PrefixTracker(config) for _ in range(o.gateways)]
    observe_s = [0.0] * o.gateways
    counts = [0] * o.gateways
    exact: Counter[str] = Counter()
    fingerprint_s = 0.0
    done = 0
    while done < o.prompts:
        batch = work.batch(done, min(BATCH, o.prompts - done))
        for g, tracker in enumerate(gateways):  # timed: the hot path only
            mine = batch[g :: o.gateways]
            t0 = time.perf_counter()
            for session, req in mine:
                tracker.observe_request(REGION, session, req)
            observe_s[g] += time.perf_counter() - t0
            counts[g] += len(mine)
        t0 = time.perf_counter()
        for _, req in batch:  # the same keys, counted exactly
            exact.update(lv.key for lv in levels(req, params))
        fingerprint_s += time.perf_counter() - t0
        done += len(batch)
        if done % (10 * BATCH) == 0:
            say(f"{done:,} prompts")
    if any(t.errors for t in gateways):
        raise RuntimeError(f"observations failed: {[t.errors for t in gateways]}")
    exports = [t.export() for t in gateways]
    for g, t in enumerate(gateways):
        line(
            {
                "phase": "gateway",
                "gateway": g,
                "prompts": counts[g],
                "observe_s": round(observe_s[g], 3),
                "prompts_per_s": round(counts[g] / observe_s[g], 1),
                "sketch_bytes": t.sketch_bytes(REGION),
                "export_bytes": len(exports[g]),
            }
        )
    leader = PrefixTracker(config)
    t0 = time.perf_counter()
    for blob in exports:
        leader.merge(blob)
    merge_s = time.perf_counter() - t0
    shared = Counter({k: c for k, c in exact.items() if c >= 2})
    k = math.ceil(0.01 * len(shared))
    ranked = [item[0] for item in leader.ranked(REGION)]
    top_true = {key for key, _ in shared.most_common(k)}
    with_payload = sum(1 for key in top_true if (e := leader.entry(REGION, key)) and e[0])
    figures = {
        "prompts_per_s": round(sum(counts) / sum(observe_s), 1),
        "recall_top1pct": round(recall(ranked, shared, k), 4),
        "sketch_bytes": max(
            [t.sketch_bytes(REGION) for t in gateways] + [leader.sketch_bytes(REGION)]
        ),
    }
    line(
        {
            "phase": "leader",
            "merged": o.gateways,
            "merge_s": round(merge_s, 3),
            "keys_distinct": len(exact),
            "keys_shared": len(shared),
            "keys_shared_estimate": leader.shared_prefixes(REGION),
            "top1pct": k,
            "top1pct_min_count": shared.most_common(k)[-1][1] if k else 0,
            "recall_top1pct": figures["recall_top1pct"],
            "payloads_top1pct": round(with_payload / k, 4) if k else 1.0,
            "sketch_bytes": leader.sketch_bytes(REGION),
            "fingerprint_only_per_s": round(o.prompts / fingerprint_s, 1),
        }
    )
    goals = asdict(GOALS)
    met = {
        name: (figures[name] >= goal if name in AT_LEAST else figures[name] <= goal)
        for name, goal in goals.items()
    }
    return {
        "bench": "prefixes",
        **figures,
        "goals": goals,
        "met": met,
        "options": {key: v for key, v in asdict(o).items() if key != "quiet"},
    }


def _at_least(low: int) -> Callable[[str], int]:
    return at_least(low, "count")


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = Options()
    p.add_argument("--prompts", type=_at_least(100), default=d.prompts, help="default 50,000")
    p.add_argument(
        "--prefixes", type=_at_least(100), default=d.prefixes, help="distinct shared prefixes"
    )
    p.add_argument("--zipf", type=float, default=d.zipf, help="Zipf exponent (default 1.1)")
    p.add_argument("--prompt-tokens", type=_at_least(512), default=d.prompt_tokens)
    p.add_argument(
        "--mode",
        choices=("text", "tokens"),
        default=d.mode,
        help="text prompts through the character proxy, or token-id prompts",
    )
    p.add_argument(
        "--block-size",
        type=_at_least(1),
        default=d.block_size,
        help="vLLM block size: 16 (GPU, default) or 128 (CPU build)",
    )
    p.add_argument("--chars-per-token", type=float, default=d.chars_per_token)
    p.add_argument(
        "--level-tokens",
        type=_at_least(1),
        default=d.level_tokens,
        help="count a prompt every this many tokens (default 256)",
    )
    p.add_argument(
        "--lg-map-size",
        type=int,
        choices=range(6, 17),
        default=d.lg_map_size,
        metavar="6-16",
        help="log2 of the sketch's map size (default 12)",
    )
    p.add_argument(
        "--doorkeeper-lg-bits",
        type=int,
        choices=[0, *range(16, 27)],
        default=d.doorkeeper_lg_bits,
        metavar="0|16-26",
        help="log2 of the doorkeeper filter's bits (default 22); 0 turns it off",
    )
    p.add_argument(
        "--gateways",
        type=_at_least(1),
        default=d.gateways,
        help="trackers the prompts are dealt to; the leader merges them",
    )
    p.add_argument("--sessions", type=_at_least(1), default=d.sessions)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--quiet", action="store_true", help="print only the final JSON line")


def run(args: argparse.Namespace) -> int:
    if args.zipf <= 0 or args.chars_per_token <= 0.5:
        print("error: --zipf must be > 0 and --chars-per-token > 0.5", file=sys.stderr)
        return 2
    o = Options(
        prompts=args.prompts,
        prefixes=args.prefixes,
        zipf=args.zipf,
        prompt_tokens=args.prompt_tokens,
        mode=args.mode,
        block_size=args.block_size,
        chars_per_token=args.chars_per_token,
        level_tokens=args.level_tokens,
        lg_map_size=args.lg_map_size,
        doorkeeper_lg_bits=args.doorkeeper_lg_bits,
        gateways=args.gateways,
        sessions=args.sessions,
        seed=args.seed,
        quiet=args.quiet,
    )

    def line(obj: dict[str, object]) -> None:
        if not o.quiet:
            print(json.dumps(obj), flush=True)

    def say(text: str) -> None:
        if not o.quiet:
            print(text, file=sys.stderr, flush=True)

    try:
        result = measure(o, line, say)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps(result), flush=True)
    return 0
