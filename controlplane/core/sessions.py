"""Sticky-session resolution, pure (DESIGN.md §2): which region serves a session.

A session is pinned at ``sessions/<id>`` to ``{home, region, epoch, pinned_at}``.
``home`` is where it started; ``region`` where it is served. Routing is followed
through ``routing/<home>``, so a failover costs one write, and sessions re-pin
lazily:

* a pinned session stays on its region as long as that region serves its own
  traffic (``routing/<region>`` still sends some of it to itself);
* only when its region stops serving is it re-pinned, to a region chosen from
  ``routing/<home>`` — once; it then stays there, and never bounces back when its old
  region recovers (recovery only steers *new* sessions home);
* choices are a deterministic weighted hash of the session id, so two gateways that
  race for a new session pick the same region even before the create-if-absent
  transaction settles it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from enum import StrEnum

from controlplane.core.model import Frozen, Routing


class SessionPin(Frozen):
    home: str
    region: str
    epoch: int  # routing epoch of ``home`` when the pin was (re)written
    pinned_at: float
    moves: int = 0


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
    return routings.get(region) or Routing(targets={region: 1.0})


def serving(routings: Mapping[str, Routing], region: str) -> bool:
    """A region serves while its own routing still sends some of its traffic to itself."""
    return routing_of(routings, region).targets.get(region, 0.0) > 0.0


def _unit(session_id: str) -> float:
    h = hashlib.blake2b(session_id.encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2**64


def pick_region(routings: Mapping[str, Routing], home: str, session_id: str) -> str:
    """Weighted, deterministic choice among the serving targets of ``routing/<home>``."""
    targets = sorted(
        (r, w)
        for r, w in routing_of(routings, home).targets.items()
        if w > 0 and serving(routings, r)
    )
    total = sum(w for _, w in targets)
    if not targets or total <= 0:
        raise NoRegionServing(f"no region serves sessions homed in {home}")
    x = _unit(session_id) * total
    for region, w in targets:
        x -= w
        if x < 0:
            return region
    return targets[-1][0]


def resolve(
    pin: SessionPin | None,
    session_id: str,
    home: str,
    routings: Mapping[str, Routing],
    now: float,
) -> Resolution:
    """Where ``session_id`` is served, and what (if anything) to write about it."""
    if pin is not None and serving(routings, pin.region):
        return Resolution(region=pin.region, action=PinAction.KEEP, pin=pin)
    start = pin.home if pin is not None else home
    region = pick_region(routings, start, session_id)
    epoch = routing_of(routings, start).epoch
    if pin is None:
        new = SessionPin(home=start, region=region, epoch=epoch, pinned_at=now)
        return Resolution(region=region, action=PinAction.CREATE, pin=new)
    moved = pin.model_copy(
        update={"region": region, "epoch": epoch, "pinned_at": now, "moves": pin.moves + 1}
    )
    return Resolution(region=region, action=PinAction.REPIN, pin=moved)
