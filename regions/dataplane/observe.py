"""The hook through which the pre-warm tracker sees every request's prompt.

A data plane (the gateway, the endpoint picker) calls ``observe`` once per request, on
the hot path, before it is forwarded: an implementation must be cheap and must not
block or raise (count into an in-memory sketch; ship it elsewhere from a background
task, as ``regions.dataplane.prefix_export`` does). ``NoopObserver`` stands in when
prefix tracking is off."""

from __future__ import annotations

from typing import Protocol

from controlplane.kernel.prefix.identity import PromptRequest
from controlplane.kernel.prefix.tracker import PrefixTracker


class PrefixObserver(Protocol):
    def observe(self, region: str, session_id: str, request: PromptRequest) -> None:
        """``region`` serves the request; ``session_id`` may be "" for sessionless
        requests; ``request`` is the whole prompt (model, text, token ids or chat
        messages, ``cache_salt``) as parsed from the body."""
        ...


class NoopObserver:
    """Observes nothing (prefix tracking turned off)."""

    def observe(self, region: str, session_id: str, request: PromptRequest) -> None:
        return None


class TrackerObserver:
    """Feeds a ``PrefixTracker``: its own ``observe`` takes a bare text prefix of an
    assumed model; the gateway has the whole request."""

    __slots__ = ("tracker",)

    def __init__(self, tracker: PrefixTracker) -> None:
        self.tracker = tracker

    def observe(self, region: str, session_id: str, request: PromptRequest) -> None:
        self.tracker.observe_request(region, session_id, request)
