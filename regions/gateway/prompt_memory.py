"""The prompts a region answered, kept by its gateway to warm that region when it returns.

A region that fails over comes back with restarted, empty prefix caches. The control
plane's recovery pre-warm replays home's catalog, which holds only prompts seen from K
sessions (the rule for prompts that *leave* a region, docs/architecture.md §4) and only as many
as its size caps allow: the head of a long tail. The gateway saw every prompt it sent
to the region. ``PromptMemory`` keeps, per region, the last request body per replica
ring key (the prompt's first characters) with how often it was answered there, bounded
in bytes; when the region serves again, ``WarmUps`` replays the most asked ones there
(``max_tokens: 1``). The bodies never leave the gateway's memory, and are replayed only
in the region that answered them. The headers are kept without the user's credentials
(``Authorization``, ``Cookie``... and the topology's ``prefixes.replay_strip_headers``:
``regions.dataplane.replay_headers``): a replay authenticates with the data plane's own
key, never a user's.

Eviction is a clock: the oldest entry goes unless it was asked again since it was
last passed over, which halves its count and moves it to the back; so a popular
prompt stays while one-off prompts churn through.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from regions.dataplane.replay_headers import replay_headers, strip_names

DEFAULT_MAX_BYTES = 8 << 20  # per region: ~800 prompts of 10 KB


@dataclass(slots=True)
class Remembered:
    path: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    hits: int = 1
    size: int = field(init=False)  # bytes held, counted once (eviction reads it often)

    def __post_init__(self) -> None:
        self.size = len(self.body) + len(self.path) + sum(len(k) + len(v) for k, v in self.headers)


class PromptMemory:
    """``strip_headers``: header names kept out of memory besides the credentials
    (``regions.dataplane.replay_headers.CREDENTIAL_HEADERS``), any case."""

    def __init__(
        self, max_bytes: int = DEFAULT_MAX_BYTES, strip_headers: Iterable[str] = ()
    ) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be at least 1, got {max_bytes}")
        self.max_bytes = max_bytes
        self.strip_headers = strip_names(strip_headers)
        self._prompts: dict[str, OrderedDict[int, Remembered]] = {}
        self._bytes: dict[str, int] = {}

    def answered(
        self,
        region: str,
        key: int,
        path: str,
        headers: Sequence[tuple[str, str]],
        body: bytes,
    ) -> None:
        """``region`` answered a request for ``key`` (the hot path of a known prompt is
        a counter; ``headers`` are copied only for a new one, without credentials)."""
        prompts = self._prompts.get(region)
        if prompts is None:
            prompts = self._prompts[region] = OrderedDict()
        known = prompts.get(key)
        if known is not None:
            known.hits += 1
            return
        entry = Remembered(path, tuple(replay_headers(headers, self.strip_headers)), body)
        if entry.size > self.max_bytes:
            return
        prompts[key] = entry
        self._bytes[region] = self._bytes.get(region, 0) + entry.size
        while self._bytes[region] > self.max_bytes:
            old_key, old = prompts.popitem(last=False)
            if old.hits > 1 and old_key != key:
                old.hits //= 2  # a second chance, at half its count
                prompts[old_key] = old
            else:
                self._bytes[region] -= old.size

    def ranked(self, region: str, limit: int) -> list[tuple[int, Remembered]]:
        """The ``limit`` most answered prompts of ``region``, most answered first."""
        prompts = self._prompts.get(region)
        if prompts is None:
            return []
        return sorted(prompts.items(), key=lambda kv: -kv[1].hits)[:limit]

    def knows(self, key: int) -> bool:
        """Some region answered a prompt with this key: a prompt that comes back."""
        return any(key in prompts for prompts in self._prompts.values())

    def regions(self) -> list[str]:
        return list(self._prompts)

    def count(self, region: str) -> int:
        return len(self._prompts.get(region, ()))

    def size(self, region: str) -> int:
        return self._bytes.get(region, 0)
