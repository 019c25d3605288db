"""A request's way in, one implementation for the gateway and the endpoint picker:
validate what routing needs, take its session key (a configurable header, else the
body's ``user``), resolve its region (pins and routing from etcd through the
resolver's cache), and apply that region's degradation actuators (``actuators.py``).

What comes out is the request as it will be sent (the actuators may have changed its
body), its session, region and ring key; or the refusal to answer instead.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Protocol

from controlplane.kernel.ladder.record import FeatureFlags
from controlplane.kernel.sessions.resolve import WarmCheck
from controlplane.kernel.sessions.store import validate_session_id
from regions.dataplane.actuators import ActuatorConfig, Refusal, actuate, priority, shed
from regions.dataplane.metrics import DataPlaneMetrics
from regions.dataplane.models import ModelRoutes, OneFamily, families
from regions.dataplane.requests import Endpoint, ProxyRequest, parse
from regions.dataplane.ring import prefix_key


class Resolver(Protocol):
    async def region_for(self, session_id: str, warm: WarmCheck | None = None) -> str: ...

    def region_for_sessionless(self, key: str) -> str: ...


@dataclass(frozen=True, slots=True)
class Admitted:
    req: ProxyRequest
    session: str  # "" without one
    region: str
    key: int  # the ring key: the prompt prefix's hash


@dataclass(frozen=True, slots=True)
class Refused:
    region: str  # whose actuator refused it
    refusal: Refusal


class Admission:
    """``admit`` raises BadRequest (UnknownModel: a model no pool answers, a 404),
    InvalidSessionId and NoRegionServing for the caller
    to answer in its own terms; an actuator's refusal is returned (``Refused``)."""

    def __init__(
        self,
        resolver: Resolver | ModelRoutes[Resolver] | OneFamily[Resolver],
        metrics: DataPlaneMetrics,
        flags: Callable[[str], FeatureFlags],
        *,
        chars: int,
        session_header: str = "x-session-id",
        actuators: ActuatorConfig | None = None,
    ) -> None:
        # per model family (models.py): a lone resolver routes every model
        self.routes = families(resolver)
        self.metrics = metrics
        self.flags = flags
        self.chars = chars
        self.session_header = session_header
        self.actuators = actuators or ActuatorConfig()

    def session_of(self, headers: Mapping[str, str], user: str = "") -> str:
        """The session key: the header, else the body's ``user``; validated."""
        session = headers.get(self.session_header) or user
        if session:
            validate_session_id(session)
        return session

    def shed(self, region: str, headers: Mapping[str, str]) -> Refusal | None:
        """Priority shedding alone, for a request whose body is not read."""
        cfg = self.actuators
        prio = priority(headers.get(cfg.priority_header), cfg.default_priority)
        return shed(region, self.flags(region), prio, cfg)

    async def admit(
        self,
        endpoint: Endpoint,
        body: bytes,
        headers: Mapping[str, str],
        warm: Callable[[int], WarmCheck] | None = None,
    ) -> Admitted | Refused:
        """``warm``: builds the warm check of a session's request from its ring key
        (the gateway's warm first; None: off)."""
        chars = self.chars
        req = parse(endpoint, body, chars)
        key = prefix_key(req.prefix, chars)
        session = self.session_of(headers, req.user)
        resolver = self.routes.for_model(req.model)  # UnknownModel: vLLM's 404
        if session:
            region = await resolver.region_for(session, warm(key) if warm else None)
        else:
            region = resolver.region_for_sessionless(req.prefix)
        # The serving region's flags: it is that region that is short of capacity.
        cfg = self.actuators
        prio = priority(headers.get(cfg.priority_header), cfg.default_priority)
        acted = actuate(req, region, self.flags(region), prio, cfg)
        if isinstance(acted, Refusal):
            return Refused(region, acted)
        for action in acted.actions:
            self.metrics.degrade(region, action)
        if acted.truncated:  # the prompt changed: count and route the one sent
            req = parse(endpoint, acted.body, chars)
            key = prefix_key(req.prefix, chars)
        elif acted.body is not req.body:
            req = replace(req, body=acted.body)
        return Admitted(req, session, region, key)
