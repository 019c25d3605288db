"""etcd's gRPC errors as the Store port's: temporary or permanent, applied or not.

``EtcdStore`` retries by these classes, so the translation decides what a caller sees:
UNAVAILABLE / DEADLINE_EXCEEDED / CANCELLED / UNKNOWN → StoreUnavailable; lease not
found → LeaseNotFound; no space (the NOSPACE alarm) → StoreFull; the rest (invalid
argument, too many ops, compacted, ...) → StoreError. A compare-and-set is resent only
after ``NotApplied``: the failure proves the request never reached raft.
"""

from __future__ import annotations

import aetcd.exceptions
import grpc

from controlplane.kernel.store.port import (
    LeaseNotFound,
    RevisionCompacted,
    StoreError,
    StoreFull,
    StoreUnavailable,
)

# Messages of gRPC / etcd errors raised before the request reached raft: retrying a
# compare-and-set after one of these cannot apply it twice.
_NOT_APPLIED_MARKERS = (
    "failed to connect to all addresses",
    "connections to all backends failing",
    "Connection refused",
    "etcdserver: no leader",
    "etcdserver: too many requests",
    "etcdserver: not capable",
    "etcdserver: unhealthy cluster",
)
# gRPC core's own words when the transport failed under a call (measured: a watch's
# first write while its etcd member was being killed): no etcd answer at all, so it is
# temporary like UNAVAILABLE. etcd's own INTERNAL errors carry other details.
_TRANSPORT_FAILED = "Internal error from Core"


class NotApplied(StoreUnavailable):
    """Temporary, and the request certainly did not take effect: safe to resend."""


class Compacted(RevisionCompacted):
    """The revision asked for was compacted away."""


def translate(e: BaseException, what: str) -> StoreError:
    """Map an aetcd / gRPC error to the port's errors (temporary vs permanent)."""
    if isinstance(e, grpc.aio.AioRpcError):
        code, details = e.code(), e.details() or ""
        msg = f"etcd {what}: {code.name}: {details}"
        if "lease not found" in details:
            return LeaseNotFound(msg)
        if "compacted" in details:
            return Compacted(msg)
        if "database space exceeded" in details:
            return StoreFull(msg)
        if any(marker in details for marker in _NOT_APPLIED_MARKERS):
            return NotApplied(msg)
        if code in (
            grpc.StatusCode.UNAVAILABLE,
            grpc.StatusCode.DEADLINE_EXCEEDED,
            grpc.StatusCode.CANCELLED,
            # etcd answers UNKNOWN "context deadline exceeded" when our deadline ran out
            # on its side (measured: a member without quorum); etcd's own permanent
            # errors all carry specific codes.
            grpc.StatusCode.UNKNOWN,
        ) or (code is grpc.StatusCode.INTERNAL and details == _TRANSPORT_FAILED):
            return StoreUnavailable(msg)
        return StoreError(msg)
    if isinstance(
        e, aetcd.exceptions.ConnectionFailedError | aetcd.exceptions.ConnectionTimeoutError
    ):
        return StoreUnavailable(f"etcd {what}: {e}")
    return StoreError(f"etcd {what}: {e!r}")
