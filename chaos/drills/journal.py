"""A drill's journal, as it is written: one JSON line per action, on disk before the next.

The runner (chaos/drills/runner.py) writes it; chaos/drills/report.py reads it back.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from chaos.drills.result import JournalEntry


class Journal:
    """Append-only: each entry is written and flushed to disk before the next action."""

    def __init__(self, path: Path, started: float, mono0: float) -> None:
        self.path, self.started, self.mono0 = path, started, mono0
        self.entries: list[JournalEntry] = []
        self.phase = "start"
        path.parent.mkdir(parents=True, exist_ok=True)
        self._f = path.open("a", encoding="utf-8")

    def write(self, kind: str, action: str = "", ok: bool = True, **detail: object) -> None:
        entry = JournalEntry(
            at=time.time(),
            t=round(time.monotonic() - self.mono0, 3),
            phase=self.phase,
            kind=kind,
            action=action,
            detail={k: str(v) for k, v in detail.items()},
            ok=ok,
        )
        self.entries.append(entry)
        self._f.write(entry.model_dump_json() + "\n")
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()
