"""The gateway's settings: the data plane's (``regions/dataplane/options.py``, which the
endpoint picker shares) and its own: where it listens, how it forwards
(``ProxyConfig``), how long it drains, and its app's (``AppConfig``: warm first,
stream continuation)."""

from __future__ import annotations

from dataclasses import dataclass, field

from regions.dataplane.options import DataPlaneOptions, completed
from regions.gateway.app import AppConfig
from regions.gateway.proxy import ProxyConfig


@dataclass(frozen=True)
class GatewayOptions(DataPlaneOptions):
    app: AppConfig
    listen: str = "127.0.0.1:0"
    proxy: ProxyConfig = field(default_factory=ProxyConfig)
    grace_s: float = 5.0
    # the data plane's own key for the replicas (vLLM's --api-key): warm-first replays
    # send it, never a user's credentials (regions/dataplane/replay_headers.py)
    replay_api_key: str | None = field(default=None, repr=False)


def completed_app(options: GatewayOptions) -> AppConfig:
    """The app's settings, completed from the topology (``completed``)."""
    return completed(options.app, options.topology)
