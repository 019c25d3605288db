"""The gateway follows the cluster spec (``spec``, ``controlplane/kernel/cluster_spec.py``)
while it runs, not only at start.

A new leader with another topology publishes another spec. A gateway whose topology
then disagrees (the same comparison as at start: :func:`disagreements` over the
sections it uses) would count prefixes the leader skips, or route warmed prefixes to
cold replicas, so :meth:`SpecWatch.run` logs one ERROR naming each setting and raises
:class:`SpecDisagreement`; the gateway drains as on SIGTERM and its process exits 2,
for its supervisor to restart it on the new topology.

The watch is only a hint: each event, each reconnect and each ``resync_s`` re-reads
the key and judges what it read, once per revision of it. A spec that agrees (the
same one rewritten, or only settings this gateway does not use changed), a deleted or
unreadable spec, or etcd being unreachable never stops the gateway: it serves on with
the topology it has (warnings say what it could not check).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection

from controlplane.kernel.cluster_spec import ClusterSpec, SpecDisagreement, disagreements
from controlplane.kernel.codec import CorruptValue, decode
from controlplane.kernel.keys import Keys
from controlplane.kernel.store.port import KeyValue, Store, StoreError

log = logging.getLogger("tectonic.gateway.spec")


class SpecWatch:
    """Judges the spec in etcd against this gateway's own (``mine``) on ``sections``:
    :meth:`check` once (at start), :meth:`run` from then on."""

    def __init__(
        self,
        store: Store,
        keys: Keys,
        mine: ClusterSpec,
        sections: Collection[str],
        *,
        retry_s: float = 0.2,
        max_retry_s: float = 2.0,
        resync_s: float = 30.0,
    ) -> None:
        self._store, self._key, self._mine, self._sections = store, keys.spec(), mine, sections
        self._retry_s, self._max_retry_s, self._resync_s = retry_s, max_retry_s, resync_s
        self.revision = 0  # etcd revision of the last read: the watch starts after it
        self._judged: int | None = None  # mod revision of the spec last judged; 0: none
        self._connected = True  # for one warning per etcd outage

    async def check(self) -> None:
        """Read the spec and judge it, unless this revision of it was judged already.
        Raises SpecDisagreement (naming each setting), and StoreError when etcd cannot
        be read (warned once per outage); a missing or unreadable spec only warns."""
        try:
            kv = await self._read()
        except StoreError as e:
            self._warn_lost(e)
            raise
        self._connected = True
        mod_revision = kv.mod_revision if kv is not None else 0
        if mod_revision == self._judged:
            return  # e.g. a resync, or a re-read after etcd came back
        first = self._judged is None
        if kv is None:
            self._warn_absent(first)
        else:
            self._judge(kv)
        self._judged = mod_revision

    async def run(self) -> None:
        """Follow the spec until it disagrees: then log one ERROR and raise
        SpecDisagreement. Never ends otherwise; etcd lost is retried with backoff."""
        delay = self._retry_s
        while True:
            try:
                await self.check()
                delay = self._retry_s
                await self._until_written()
                continue
            except SpecDisagreement as e:
                log.error(
                    "%s\nstopping (drain as on SIGTERM, exit 2) so that this gateway's "
                    "supervisor restarts it on the new topology",
                    e,
                )
                raise
            except StoreError as e:  # unavailable, or the watch's revision was compacted
                self._warn_lost(e)  # once: a read that failed warned already
            await asyncio.sleep(delay)
            delay = min(delay * 2, self._max_retry_s)

    async def _read(self) -> KeyValue | None:
        """The spec's key and the revision read at: a prefix read, because only it
        returns etcd's revision, which the watch resumes after (the key's own mod
        revision may be long compacted)."""
        page = await self._store.get_prefix(self._key)
        self.revision = page.revision
        return next((kv for kv in page.kvs if kv.key == self._key), None)

    def _judge(self, kv: KeyValue) -> None:
        try:
            published = decode(ClusterSpec, kv.value, kv.key)
        except CorruptValue as e:
            log.warning("cluster spec not checked, it cannot be read: %s", e)
            return
        problems = disagreements(self._mine, published, self._sections)
        if problems:
            raise SpecDisagreement(self._key, problems)
        log.info(
            "cluster spec at %s (revision %d) agrees with this topology's %s settings",
            self._key,
            kv.mod_revision,
            " and ".join(self._sections),
        )

    async def _until_written(self) -> None:
        """Until an event on the spec's key after the last read, or ``resync_s``."""
        events = self._store.watch_prefix(self._key, start_revision=self.revision + 1)
        try:
            async with asyncio.timeout(self._resync_s):
                async for event in events:
                    if event.kv.key == self._key:  # the prefix also covers longer keys
                        return
        except TimeoutError:
            return
        finally:
            await events.aclose()  # type: ignore[attr-defined]

    def _warn_absent(self, first: bool) -> None:
        if first:
            log.warning(
                "no cluster spec at %s yet (no control-plane leader has run): this "
                "topology's %s settings are not checked",
                self._key,
                " and ".join(self._sections),
            )
        else:
            log.warning(
                "cluster spec at %s deleted: serving on with this topology, unchecked "
                "until a leader publishes one",
                self._key,
            )

    def _warn_lost(self, error: StoreError) -> None:
        if self._connected:
            log.warning(
                "cluster spec not checked, etcd cannot be read (%s): serving with this "
                "topology, checking it once etcd answers",
                error,
            )
        self._connected = False
