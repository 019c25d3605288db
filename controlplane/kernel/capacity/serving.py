"""What a replica serves with, beyond its engine version: the serving configuration a
capacity probe measured under, and what the region's agent reads its replicas run now
(pure: the readers are ``chaos/capacity/replica_info.py`` and
``regions/agent/engine_version.py``).

Where each figure comes from (vLLM 0.32; the simulator answers the same):

- ``model`` and ``max_model_len``: ``GET /v1/models`` (each model's ``max_model_len``);
- the KV cache: ``vllm:cache_config_info`` on ``/metrics``, a gauge whose labels are
  vLLM's ``CacheConfig`` (``block_size``, ``num_gpu_blocks``, ``cache_dtype``,
  ``enable_prefix_caching``, ...): the ones in :data:`CACHE_KEYS` are kept;
- ``max_num_seqs`` and ``max_num_batched_tokens`` (the scheduler's slots and token
  budget): vLLM exports no scheduler config on ``/metrics``; they are read from its
  dev-mode ``GET /server_info?config_format=json`` (``VLLM_SERVER_DEV_MODE=1``, which the
  agent's warm pools need anyway: ``vllm_config.scheduler_config``). Without dev mode
  they are unknown, and not judged.

A configuration is compared as its **fingerprint**, ``key=value`` pairs joined by ``;``
in a fixed order, unknown keys left out. A region's fingerprint merges its replicas':
a key on which they differ carries each value, sorted, joined by ``|`` (which no
probe's single value matches). Two fingerprints differ where a key both know has
another value: a key one side does not know is not judged, as an engine nobody knows
is not.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Annotated, Any

from pydantic import Field

from controlplane.kernel.model import Frozen

MAX_FINGERPRINT = 1024  # characters; the control plane refuses longer ones
CACHE_INFO = "vllm:cache_config_info"
# The cache labels that bear on capacity: how many tokens the KV cache holds and how.
CACHE_KEYS = (
    "block_size",
    "num_gpu_blocks",
    "cache_dtype",
    "enable_prefix_caching",
    "kv_offloading_size",
)
_ORDER = ("model", "max_model_len", "max_num_seqs", "max_num_batched_tokens", *CACHE_KEYS)
_UNSET = frozenset({"", "None", "none", "null"})
_BAD = re.compile(r"[;=|]")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def _clean(value: object) -> str:
    text = "".join(c for c in str(value) if c.isprintable()).strip()
    return _BAD.sub("_", text)


class ServingConfig(Frozen):
    """One replica's serving configuration (None / empty: not reported)."""

    model: str = ""
    max_model_len: Annotated[int | None, Field(ge=1)] = None
    max_num_seqs: Annotated[int | None, Field(ge=1)] = None  # slots: /server_info (dev mode)
    max_num_batched_tokens: Annotated[int | None, Field(ge=1)] = None
    cache: dict[str, str] = Field(default_factory=dict)  # CACHE_KEYS of cache_config_info

    def items(self) -> dict[str, str]:
        """The known figures, by key, in the fingerprint's order."""
        raw: dict[str, object] = {
            "model": self.model,
            "max_model_len": self.max_model_len,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            **{k: self.cache.get(k) for k in CACHE_KEYS},
        }
        out = {k: _clean(v) for k, v in raw.items() if v is not None}
        return {k: v for k, v in out.items() if v not in _UNSET}

    def fingerprint(self) -> str:
        return _join(self.items())


def _join(items: Mapping[str, str]) -> str:
    keys = [k for k in _ORDER if k in items] + sorted(k for k in items if k not in _ORDER)
    out = ""
    for k in keys:  # whole entries only: a cut one would read as another value
        entry = f"{k}={items[k]}"
        if len(out) + len(entry) + 1 > MAX_FINGERPRINT:
            break
        out = f"{out};{entry}" if out else entry
    return out


def parse_fingerprint(fingerprint: str) -> dict[str, str]:
    """A fingerprint's figures, by key (entries without ``=`` are ignored)."""
    out = {}
    for entry in fingerprint.split(";"):
        key, sep, value = entry.partition("=")
        if sep and key.strip():
            out[key.strip()] = value.strip()
    return out


def merge_fingerprints(fingerprints: Iterable[str]) -> str:
    """A region's fingerprint from its replicas' (see the module doc); "" none known."""
    values: dict[str, set[str]] = {}
    for fp in fingerprints:
        for k, v in parse_fingerprint(fp).items():
            for one in v.split("|"):
                values.setdefault(k, set()).add(one)
    return _join({k: "|".join(sorted(vs)) for k, vs in values.items()})


def differences(measured: str, now: str) -> list[str]:
    """Where the configuration ``now`` differs from the ``measured`` one, as
    ``"key measured -> now"``, over the keys both know (in the fingerprint's order)."""
    a, b = parse_fingerprint(measured), parse_fingerprint(now)
    keys = [k for k in _ORDER if k in a] + sorted(k for k in a if k not in _ORDER)
    return [f"{k} {a[k]} -> {b[k]}" for k in keys if k in b and a[k] != b[k]]


def clean_fingerprint(raw: object) -> str:
    """A fingerprint as Tectonic stores and compares it: printable, at most
    :data:`MAX_FINGERPRINT` characters (whole entries)."""
    text = "".join(c for c in str(raw) if c.isprintable()).strip()
    return _join({k: v.replace(";", "_") for k, v in parse_fingerprint(text).items() if k})


# ---- reading what a replica says ---------------------------------------------------------


def models_entry(body: object, model: str | None = None) -> tuple[str, int | None] | None:
    """``/v1/models``: the model (``model``'s entry, else the first) and its
    ``max_model_len`` (None when not reported); None when it lists no model (or not
    ``model``)."""
    data = body.get("data") if isinstance(body, dict) else None
    entries = [e for e in data or () if isinstance(e, dict) and "id" in e]
    if model is not None:
        entries = [e for e in entries if str(e["id"]) == model]
    if not entries:
        return None
    entry = entries[0]
    raw = entry.get("max_model_len")
    length = raw if isinstance(raw, int) and not isinstance(raw, bool) and raw > 0 else None
    return str(entry["id"]), length


def cache_info(metrics_text: str) -> dict[str, str]:
    """The :data:`CACHE_KEYS` labels of ``vllm:cache_config_info`` (its first sample:
    engine 0 under data parallelism); {} when it is not exported."""
    for line in metrics_text.splitlines():
        if line.startswith(CACHE_INFO + "{"):
            labels = dict(_LABEL.findall(line[len(CACHE_INFO) :].split("}", 1)[0]))
            return {k: labels[k] for k in CACHE_KEYS if labels.get(k, "") not in _UNSET}
    return {}


_SCHED_TEXT = re.compile(r"\b(max_num_seqs|max_num_batched_tokens)\s*[=:]\s*(\d+)")


def scheduler_info(body: object) -> dict[str, int]:
    """``max_num_seqs`` and ``max_num_batched_tokens`` from vLLM's ``/server_info``
    (``vllm_config.scheduler_config`` when JSON, else found in its text form); {} when
    it says neither."""
    config: Any = body.get("vllm_config") if isinstance(body, dict) else None
    out: dict[str, int] = {}
    if isinstance(config, dict):
        sched = config.get("scheduler_config")
        if isinstance(sched, dict):
            for k in ("max_num_seqs", "max_num_batched_tokens"):
                v = sched.get(k)
                if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                    out[k] = v
        return out
    text = config if isinstance(config, str) else json.dumps(body) if body is not None else ""
    for k, v in _SCHED_TEXT.findall(text):
        if int(v) > 0:
            out.setdefault(k, int(v))
    return out


def serving_config(
    model: str,
    max_model_len: int | None,
    metrics_text: str = "",
    server_info: object = None,
) -> ServingConfig:
    """A replica's configuration from what it answered (see the module doc)."""
    sched = scheduler_info(server_info)
    return ServingConfig(
        model=model,
        max_model_len=max_model_len,
        max_num_seqs=sched.get("max_num_seqs"),
        max_num_batched_tokens=sched.get("max_num_batched_tokens"),
        cache=cache_info(metrics_text),
    )
