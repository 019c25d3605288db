"""A data plane's settings, the gateway's and the endpoint picker's alike: how each
request is taken (``RequestConfig``: home region, session header, body cap, routing
prefix length, actuators, zones) and what the core keeps of the cluster
(``DataPlaneOptions``: where etcd is, how long pins are cached and trusted, the replica
balancer's load bound, the health reports, the prefix tracking, admission control).
The gateway's own (listen address, forwarding, warm first, stream continuation)
extend them in ``regions/gateway/options.py`` and ``regions/gateway/app.py``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TypeVar

from controlplane.kernel.config import Topology
from controlplane.kernel.prefix.tracker import TrackerConfig
from controlplane.kernel.store.settings import EtcdConfig
from regions.dataplane.actuators import ActuatorConfig
from regions.dataplane.admission_gate import AdmissionOptions
from regions.dataplane.prefix_export import ExportOptions, tracker_config
from regions.dataplane.replica_load import DEFAULT_POLL_S
from regions.dataplane.replicas import DEFAULT_LOAD_FACTOR


@dataclass(frozen=True)
class RequestConfig:
    home: str
    session_header: str = "x-session-id"
    max_body_bytes: int = 1 << 20
    # prompt characters that pick the replica; None: the topology's prefixes.routing_chars
    # (``completed`` fills it in and refuses another value)
    prefix_chars: int | None = None
    retry_after_s: int = 1
    actuators: ActuatorConfig = field(default_factory=ActuatorConfig)
    # region -> residency zone (from the topology; for a model pool, its zone and pool):
    # where a request may spill when its region answers nothing; empty: never spill
    zones: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class DataPlaneOptions:
    topology: Topology
    app: RequestConfig
    etcd_endpoints: tuple[str, ...] = ()  # () = the topology's
    etcd_timeout_s: float = 0.5  # per etcd request; the store retries within 2x this
    store_timeout_s: float = 1.0  # how long a request waits for etcd before fail-static
    revalidate_s: float = 300.0  # re-read a cached pin this often (also extends its TTL)
    max_pins: int = 100_000
    load_factor: float = DEFAULT_LOAD_FACTOR  # bounds replicas whose slots are unknown
    # requests a replica runs at once, for all or per URL (others learned); None: learned
    replica_slots: int | Mapping[str, int] | None = None
    replica_poll_s: float = DEFAULT_POLL_S  # read replicas' running/waiting; 0: never
    session_ttl_s: int = 3600
    control_planes: tuple[str, ...] = ()  # report region health as a GATEWAY observer
    observer_id: str = ""  # default: <kind>:<home>:<port>; also names the prefix export
    report_interval_s: float = 1.0
    prefix_tracking: bool = True  # count prompt prefixes and export them for pre-warm
    tracker: TrackerConfig | None = None  # None: from the topology's ``prefixes``
    prefix_export: ExportOptions | None = None  # None: from the topology's ``prefixes``
    # this zone's payload keys (docs/residency.md): replay payloads leave sealed
    payload_keys: str | None = None
    # per-replica in-flight limits steered by first-token time (admission_gate.py); off
    # unless enabled
    admission: AdmissionOptions = field(default_factory=AdmissionOptions)
    # scale to zero (wake.py): how long a request for a pool at zero is held while it
    # wakes when the pool has measured no wake yet, and the most whatever it measured
    wake_hold_s: float = 30.0
    wake_hold_max_s: float = 60.0

    def etcd(self) -> EtcdConfig:
        endpoints = self.etcd_endpoints or self.topology.etcd.endpoints
        # The topology's etcd TLS / auth settings carry over; only these two are flags.
        return self.topology.etcd.model_copy(
            update={"endpoints": tuple(endpoints), "request_timeout_s": self.etcd_timeout_s}
        )

    def tracker_config(self) -> TrackerConfig:
        return self.tracker or tracker_config(self.topology.prefixes)

    def export_options(self) -> ExportOptions:
        return self.prefix_export or ExportOptions.from_topology(
            self.topology.prefixes, self.payload_keys
        )


Config = TypeVar("Config", bound=RequestConfig)


def completed(app_config: Config, topo: Topology) -> Config:
    """The request settings, completed from the topology: its prefix length (which must
    agree), its zones and the context cap's characters per token."""
    chars = topo.prefixes.routing_chars
    if app_config.prefix_chars not in (None, chars):
        # The agents' pre-warm replays each prefix where this value sends it.
        raise ValueError(
            f"prefix_chars {app_config.prefix_chars} disagrees with the topology's "
            f"prefixes.routing_chars ({chars}), which every gateway and the agents' "
            "pre-warm use"
        )
    app_config = replace(app_config, prefix_chars=chars)
    if not app_config.zones:  # the topology's zones (and pools) bound where requests spill
        app_config = replace(app_config, zones=topo.spill_groups())
    if app_config.actuators.chars_per_token is None:
        # The context cap estimates tokens with the prefix proxy's calibrated ratio.
        ratio = topo.prefixes.chars_per_token
        actuators = replace(app_config.actuators, chars_per_token=ratio)
        app_config = replace(app_config, actuators=actuators)
    return app_config
