"""Append-only audit log keys: ``audit/<microseconds>-<writer>-<sequence>``.

Keys sort by time, and a writer never reuses one, so entries written in the same
transaction as the change they describe never overwrite each other.
"""

from __future__ import annotations

import itertools

from controlplane.kernel.codec import encode
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import AuditEntry
from controlplane.kernel.store.port import Put


class AuditLog:
    def __init__(self, keys: Keys, writer: str) -> None:
        self.keys, self.writer = keys, writer
        self._seq = itertools.count()

    def op(self, entry: AuditEntry) -> Put:
        """The put that appends ``entry``; include it in the transaction of the change."""
        sid = f"{int(entry.at * 1e6):017d}-{self.writer}-{next(self._seq):06d}"
        return Put(self.keys.audit(sid), encode(entry))
