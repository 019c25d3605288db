"""Sticky-session resolution, pure (docs/architecture.md §2): which region serves a session.

A session is pinned at ``sessions/<id>`` to ``{home, region, epoch, pinned_at}``.
``home`` is where it started; ``region`` where it is served. Routing is followed
through ``routing/<home>``, so a failover costs one write, and sessions re-pin
lazily:

* a pinned session stays on its region as long as that region serves its own
  traffic (``routing/<region>`` still sends some of it to itself);
* once its region stops serving, the gateway that serves its next request re-pins it
  (nobody re-pins in bulk) to a region chosen from ``routing/<home>`` — once; it then
  stays there, and never bounces back when its old region recovers (recovery steers
  *new* sessions home by weight);
* a session that sent nothing while its region did not serve keeps its pin, so it is
  served by that region again as soon as it serves (a graduated recovery's first
  step): it has nothing cached anywhere else;
* choices are a deterministic weighted hash of the session id, so two gateways that
  race for a new session pick the same region even before the create-if-absent
  transaction settles it (the transaction settles it either way);
* warm first: while a home's traffic is split (graduated recovery), a *new* session
  whose weighted choice is home, where its prompt is not cached yet, may be placed on
  another serving target (``warm_first``); the caller warms home, and later sessions
  of that prompt follow the weights again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from controlplane.kernel.model import Frozen, Routing, default_routing


class SessionPin(Frozen):
    home: str
    region: str
    epoch: int  # routing epoch of ``home`` when the pin was (re)written
    pinned_at: float
    moves: int = 0


class SessionMoves(Frozen):
    """``session-moves/<region>``: the last gateway that moved sessions off ``region``
    before the control plane did (no replica answered: a spill). Every write changes
    it, so every other gateway's watch sees it and re-reads its cached pins of
    ``region`` instead of trusting them for up to ``revalidate_s``."""

    by: str  # the gateway's id
    at: float  # Unix time of the write
    moved: int  # sessions that gateway has moved off the region since it started


class PinAction(StrEnum):
    KEEP = "keep"  # serve on the pinned region; nothing to write
    CREATE = "create"  # a new session: create-if-absent
    REPIN = "repin"  # the pinned region stopped serving: CAS the new pin


class Resolution(Frozen):
    region: str
    action: PinAction
    pin: SessionPin


class NoRegionServing(Exception):
    """No region can take this session now (the gateway answers 503 + Retry-After)."""


def routing_of(routings: Mapping[str, Routing], region: str) -> Routing:
    return routings.get(region) or default_routing(region)


def self_routed(routings: Mapping[str, Routing], region: str) -> bool:
    """A region serves while its own routing still sends some of its traffic to itself."""
    return routing_of(routings, region).targets.get(region, 0.0) > 0.0


def _unit(session_id: str) -> float:
    h = hashlib.blake2b(session_id.encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2**64


@dataclass(frozen=True, slots=True)
class Placement:
    """Where sessions homed in ``home`` are placed under one routing snapshot: the
    serving targets of ``routing/<home>`` with a positive weight, in name order, and
    that routing's epoch. Built by ``placement``."""

    home: str
    epoch: int
    targets: tuple[tuple[str, float], ...]
    total: float

    def pick(self, session_id: str) -> str:
        """Weighted, deterministic choice of a region for ``session_id``."""
        if not self.targets or self.total <= 0:
            raise NoRegionServing(f"no region serves sessions homed in {self.home}")
        x = _unit(session_id) * self.total
        for region, w in self.targets:
            x -= w
            if x < 0:
                return region
        return self.targets[-1][0]

    def pick_among(self, session_id: str, regions: Callable[[str], bool]) -> str | None:
        """The weighted choice for ``session_id`` among the targets ``regions`` accepts
        (None: it accepts none)."""
        kept = tuple((r, w) for r, w in self.targets if regions(r))
        if not kept:
            return None
        return Placement(self.home, self.epoch, kept, sum(w for _, w in kept)).pick(session_id)


WarmCheck = Callable[[str], bool]  # region -> its replicas have this prompt cached


def warm_first(where: Placement, session_id: str, chosen: str, warm: WarmCheck) -> str:
    """Where a new session goes when its weighted pick ``chosen`` may be cold for its
    prompt. Only home is ever steered away from: a split ``routing/<home>`` that
    includes home is a graduated recovery (or a capacity split) bringing traffic back
    to a region whose caches restarted, while the other targets carried that traffic.
    So a session whose pick is home but whose prompt is not warm there goes to the
    other targets (the same weighted hash among them); any other pick, a warm prompt,
    or a routing with one target (steady state, a failover, all at once) keeps
    ``chosen``."""
    if chosen != where.home or len(where.targets) < 2 or warm(chosen):
        return chosen
    return where.pick_among(session_id, lambda r: r != chosen) or chosen


def placement(routings: Mapping[str, Routing], home: str) -> Placement:
    routing = routing_of(routings, home)
    targets = tuple(
        sorted((r, w) for r, w in routing.targets.items() if w > 0 and self_routed(routings, r))
    )
    return Placement(home, routing.epoch, targets, sum(w for _, w in targets))


def pick_region(routings: Mapping[str, Routing], home: str, session_id: str) -> str:
    """Weighted, deterministic choice among the serving targets of ``routing/<home>``."""
    return placement(routings, home).pick(session_id)


def spill_region(
    routings: Mapping[str, Routing],
    zones: Mapping[str, str],
    failed: str,
    key: str,
) -> str | None:
    """Where a request goes whose region answered nothing (every replica unreachable
    before the first byte), before the control plane has failed that region over: a
    serving region of the same zone, chosen by ``key`` (the session id) so that every
    gateway makes the same choice. None when there is none."""
    zone = zones.get(failed)
    candidates = sorted(
        r for r, z in zones.items() if z == zone and r != failed and self_routed(routings, r)
    )
    if not candidates:
        return None
    return candidates[int(_unit(key) * len(candidates)) % len(candidates)]


def repinned(pin: SessionPin, region: str, epoch: int, now: float) -> SessionPin:
    """``pin`` moved to ``region`` at ``now`` under its home's routing ``epoch``: the
    home is kept and the move counted."""
    return SessionPin(home=pin.home, region=region, epoch=epoch, pinned_at=now, moves=pin.moves + 1)


def resolve(
    pin: SessionPin | None,
    session_id: str,
    home: str,
    routings: Mapping[str, Routing],
    now: float,
    warm: WarmCheck | None = None,
) -> Resolution:
    """Where ``session_id`` is served, and what (if anything) to write about it.
    ``warm``: place a new session warm first (``warm_first``); None: by weight only."""
    if pin is not None and self_routed(routings, pin.region):
        return Resolution(region=pin.region, action=PinAction.KEEP, pin=pin)
    where = placement(routings, pin.home if pin is not None else home)
    region = where.pick(session_id)
    if pin is None:
        if warm is not None:
            region = warm_first(where, session_id, region, warm)
        new = SessionPin(home=where.home, region=region, epoch=where.epoch, pinned_at=now)
        return Resolution(region=region, action=PinAction.CREATE, pin=new)
    return Resolution(
        region=region, action=PinAction.REPIN, pin=repinned(pin, region, where.epoch, now)
    )
