"""Which etcd revision the leader compacts to, pure (docs/etcd.md, "Compaction").

etcd keeps every old value until its history is compacted; nothing else frees that
space, and at the quota etcd refuses every write (NOSPACE). The leader samples the
store's revision every ``interval_s`` and compacts to the newest sample at least
``retention_s`` old: every watcher that is less than ``retention_s`` behind resumes
where it was; one further behind gets "compacted" and relists (re-reads its prefix,
then watches from the read's revision), which every watch in Tectonic does.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass
class RevisionWindow:
    """Samples of (time, revision), oldest first, kept for ``retention_s`` and one more:
    ``target(now)`` is the revision the store had ``retention_s`` ago (or later)."""

    retention_s: float
    _samples: deque[tuple[float, int]] = field(default_factory=deque)
    compacted: int = 0  # the revision last compacted to (0: none yet)

    def observe(self, now: float, revision: int) -> None:
        """The store was at ``revision`` at ``now``. Older samples are dropped once a
        newer one is old enough to take their place."""
        if self._samples and (revision < self._samples[-1][1] or now < self._samples[-1][0]):
            # A store restored from a backup, or a clock stepped back: start over rather
            # than compact to a revision read from another history.
            self._samples.clear()
            self.compacted = 0
        self._samples.append((now, revision))
        while len(self._samples) > 1 and now - self._samples[1][0] >= self.retention_s:
            self._samples.popleft()

    def target(self, now: float) -> int | None:
        """The revision to compact to now, or None: no sample is ``retention_s`` old yet,
        or the newest such is not past what was compacted already."""
        if not self._samples:
            return None
        at, revision = self._samples[0]
        if now - at < self.retention_s or revision <= self.compacted:
            return None
        return revision

    def done(self, revision: int) -> None:
        self.compacted = max(self.compacted, revision)
