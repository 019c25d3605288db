"""The hook through which the pre-warm tracker sees every request's prompt prefix.

The gateway calls ``observe`` once per proxied request, on the hot path, before
forwarding: an implementation must be cheap and must not block or raise (count into
an in-memory sketch; ship it elsewhere from a background task).
"""

from __future__ import annotations

from typing import Protocol


class PrefixObserver(Protocol):
    def observe(self, region: str, session_id: str, prompt_prefix: str) -> None:
        """``region`` serves the request; ``session_id`` may be "" for sessionless
        requests; ``prompt_prefix`` is the prompt's first characters (as hashed for
        replica choice)."""
        ...


class NoopObserver:
    """The default: observes nothing."""

    def observe(self, region: str, session_id: str, prompt_prefix: str) -> None:
        return None
