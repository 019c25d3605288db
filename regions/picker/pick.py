"""The endpoint picker's decision for one request, and what it learns from the answer.

The rules are the gateway's, by the same code (the data plane's, ``regions/dataplane/``):
``Admission`` (session key, region from etcd's pins and routing through the same
cache, the degradation actuators), the same prefix-aware bounded-load
``ReplicaBalancer`` per region, the same spill rule
(``spill_region``) and session move (``SessionResolver.move``, a CAS in etcd). What
differs is who forwards: Envoy, down the ordered list the picker returns.

The list for a session of this picker's own region: its replicas, the chosen one first
(at most ``max_endpoints``), then the entry point of the region the session would spill
to (the zone's next serving region), so that a request whose replicas all refuse before
the first byte is still served. For a session pinned to another region: that region's
entry point (its Envoy or gateway; ``regions[].entry``), marked with ``x-tectonic-via``
so that the picker there serves it without another hop; a region without an entry
point gets its replicas directly, as the gateway forwards to them. The response says
which endpoint served (``served``): a session served by its spill region moves there
for good, once; replicas skipped before it are ejected for a moment, and every answer
is a health vote for the region that gave it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import aiohttp

from controlplane.kernel.sessions.resolve import NoRegionServing, spill_region
from controlplane.kernel.sessions.store import InvalidSessionId
from regions.dataplane.actuators import Action, Refusal
from regions.dataplane.admission import Admission, Admitted, Refused
from regions.dataplane.admission_gate import ADMISSION_OFF, Gates, Grant
from regions.dataplane.admission_gate import Refusal as Overload
from regions.dataplane.failures import ErrorKind
from regions.dataplane.metrics import DataPlaneMetrics
from regions.dataplane.model_list import fetch_union, pools_to_ask
from regions.dataplane.models import MODEL_HEADER, ModelRoutes, families
from regions.dataplane.observe import NoopObserver, PrefixObserver
from regions.dataplane.prompts import BadRequest
from regions.dataplane.replicas import ReplicaBalancer
from regions.dataplane.requests import Endpoint, error_body, error_type
from regions.dataplane.ring import prefix_key
from regions.dataplane.routing_cache import RoutingCache
from regions.dataplane.sessions import SessionResolver
from regions.dataplane.wake import Held, Waker
from regions.picker.extproc import VIA_HEADER, endpoint_of

log = logging.getLogger("tectonic.picker")
Vote = Callable[[str, bool, int], None]  # (region, answered, status): a health vote
ENDPOINTS = {e.value: e for e in Endpoint}


@dataclass(frozen=True)
class PickerConfig:
    home: str  # the region whose Envoy this picker serves
    zones: Mapping[str, str] = field(default_factory=dict)  # where a request may spill
    entries: Mapping[str, str] = field(default_factory=dict)  # region -> entry host:port
    # with model pools (docs/models.md): each pool's unit -> its region, and -> the
    # pool of its family in ``home`` (absent: the unit is a region, ``home`` itself)
    sites: Mapping[str, str] = field(default_factory=dict)
    local: Mapping[str, str] = field(default_factory=dict)
    max_endpoints: int = 3  # replicas of a region in one list: the choice + fallbacks
    spill: bool = True  # end the list with the spill region's entry point
    retry_after_s: int = 1  # on a 503: a failover is usually under way
    eject_s: float = 2.0  # a replica Envoy skipped is chosen last for this long


@dataclass(slots=True)
class Pick:
    """Where one request goes: ``endpoints`` in order, ``regions`` the region of each."""

    region: str  # the session's region (or the one a sessionless request goes to)
    session: str
    endpoints: tuple[str, ...]
    regions: tuple[str, ...]
    headers: tuple[tuple[str, str], ...]  # set on the request besides the destination
    body: bytes | None  # the body to send instead, when an actuator changed it
    started: float
    replicas: dict[str, str]  # endpoint -> replica URL, for ejection
    held: tuple[ReplicaBalancer, str] | None = None  # the in-flight count it took
    spilled_to: str = ""  # the spill region at the end of the list, if any
    grant: tuple[str, Grant] | None = None  # admission control's slot: (region, grant)
    steer: bool = True  # its first token steers the limit (not after Envoy went past one)


@dataclass(frozen=True, slots=True)
class Answer:
    """Answer the client at once instead of routing."""

    status: int
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


class Picker:
    def __init__(
        self,
        config: PickerConfig,
        admission: Admission,
        routing: RoutingCache,
        resolver: SessionResolver | ModelRoutes[SessionResolver],
        balancers: Mapping[str, ReplicaBalancer],
        metrics: DataPlaneMetrics,
        *,
        observer: PrefixObserver | None = None,
        vote: Vote | None = None,
        gates: Gates = ADMISSION_OFF,
        monotonic: Callable[[], float] = time.monotonic,
        waker: Waker | None = None,
    ) -> None:
        self.config = config
        self.waker = waker  # scale to zero (regions/dataplane/wake.py); None: never held
        self.admission = admission
        self.routing = routing
        self.resolvers = families(resolver)  # per model family (regions/dataplane/models.py)
        self._http: aiohttp.ClientSession | None = None  # for /v1/models with model pools
        self.balancers = balancers
        self.metrics = metrics
        self.observer = observer or NoopObserver()
        self._vote = vote
        self.gates = gates  # AdmissionOff: admission control off
        self._monotonic = monotonic

    # ---- the request -----------------------------------------------------------------

    async def pick(
        self,
        headers: Mapping[str, str],
        body: bytes | None,
        subset: frozenset[str] | None,
        *,
        on_hold: Callable[[float], None] | None = None,
    ) -> Pick | Answer:
        """Route one request: ``headers`` by lowercase name (pseudo-headers included),
        ``body`` the whole body, or None in header-only mode; ``subset`` the data
        plane's hint. Never raises for a bad request: that is an Answer. ``on_hold``:
        told the hold's length (seconds) before a request for a pool at zero is held
        while it wakes (``Waker.hold``)."""
        started = self._monotonic()
        try:
            return await self._pick(headers, body, subset, started, on_hold)
        except BadRequest as e:
            return self._refuse(e.status, e.message, e.param)
        except InvalidSessionId as e:
            return self._refuse(400, str(e))
        except NoRegionServing as e:
            return self._unavailable("none", ErrorKind.NO_REGION, str(e))

    async def _pick(
        self,
        headers: Mapping[str, str],
        body: bytes | None,
        subset: frozenset[str] | None,
        started: float,
        on_hold: Callable[[float], None] | None,
    ) -> Pick | Answer:
        path = headers.get(":path", "/").split("?", 1)[0]
        if path == "/v1/models" and self.resolvers.pooled and not headers.get(MODEL_HEADER):
            return await self._model_list()
        endpoint = ENDPOINTS.get(path)
        replacement: bytes | None = None
        if body is not None and endpoint is not None and headers.get(":method") == "POST":
            admitted = await self.admission.admit(endpoint, body, headers)
            if isinstance(admitted, Refused):
                return self._degraded(admitted.region, admitted.refusal)
            self._observe(admitted)
            region, session, key = admitted.region, admitted.session, admitted.key
            if admitted.req.body is not body:
                replacement = admitted.req.body
        else:  # header-only, or no generation: the session and model headers decide
            session = self.admission.session_of(headers)
            resolver = self._header_resolver(headers, generation=endpoint is not None)
            if session:
                region = await resolver.region_for(session)
            else:
                region = resolver.region_for_sessionless(headers.get("x-request-id", path))
            if (refusal := self.admission.shed(region, headers)) is not None:
                return self._degraded(region, refusal)
            key = prefix_key(session or headers.get("x-request-id", path), self.admission.chars)
        held = await self.waker.hold(region, on_hold=on_hold) if self.waker is not None else None
        if held is not None and not held.served:
            return self._waking(region, held)
        pick = self._place(region, session, key, subset, headers, started)
        if isinstance(pick, Answer):
            return pick
        pick.body = replacement
        if pick.held is not None:
            return await self._admit(pick, headers, key, subset)
        return pick

    async def _model_list(self) -> Answer:
        """With model pools, the picker answers ``/v1/models`` itself: the union of one
        serving replica of each pool's list (Envoy would forward it to one pool)."""
        replicas = {u: b.replicas for u, b in self.balancers.items()}
        pools = pools_to_ask(self.resolvers, self.routing.routings, replicas)
        if self._http is None:
            self._http = aiohttp.ClientSession()
        body = await fetch_union(self._http, pools, timeout_s=2.0)
        if body is None:
            return self._unavailable("none", ErrorKind.NO_REPLICA, "no serving replica answered")
        return Answer(200, body, (("content-type", "application/json"),))

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()

    def _header_resolver(self, headers: Mapping[str, str], *, generation: bool) -> SessionResolver:
        """The resolver of a request whose body is not read: by the model its Envoy
        names in ``x-tectonic-model``; with model pools, a generation without one is
        refused (which pool would serve it?), anything else (``/v1/models``) goes to
        the home region's first pool."""
        model = headers.get(MODEL_HEADER, "")
        if model:
            return self.resolvers.for_model(model)
        if self.resolvers.pooled and generation:
            raise BadRequest(
                f"this cluster serves model pools: in header-only mode the {MODEL_HEADER} "
                "header must name the request's model (docs/models.md)",
                param=MODEL_HEADER,
            )
        return self.resolvers.default

    async def _admit(
        self, pick: Pick, headers: Mapping[str, str], key: int, subset: frozenset[str] | None
    ) -> Pick | Answer:
        """Admission control (the data plane's gates,
        ``regions/dataplane/admission_gate.py``): a slot on the chosen replica, else on
        another of its region with room (then first in the list), after waiting at most
        the queue's wait; or 429 with Retry-After. Off (``AdmissionOff``): the pick as
        it is."""
        assert pick.held is not None
        balancer, first = pick.held
        region = pick.regions[0]
        outside = set()
        if subset is not None:  # a waiter must not be given a replica the hint excludes
            outside = {r for r in balancer.replicas if endpoint_of(r) not in subset}
        try:
            entered = await self.gates.enter(
                region, headers, balancer, key, first, outside, self._monotonic()
            )
        except BaseException:  # Envoy gave up on the stream while it waited
            self.release(pick)
            raise
        if entered is None:  # admission is off, or does not cover the region
            return pick
        if isinstance(entered, Overload):
            self.release(pick)
            return self._overloaded(region, entered)
        pick.grant = (region, entered)
        if entered.replica != first:
            balancer.release(first)
            balancer.acquire(entered.replica)
            pick.held = (balancer, entered.replica)
            ep = endpoint_of(entered.replica)
            pick.replicas[ep] = entered.replica
            at = [i for i, e in enumerate(pick.endpoints) if e != ep]
            pick.endpoints = (ep, *(pick.endpoints[i] for i in at))
            pick.regions = (region, *(pick.regions[i] for i in at))
        return pick

    def _observe(self, admitted: Admitted) -> None:
        try:
            self.observer.observe(admitted.region, admitted.session, admitted.req.prompt)
        except Exception:  # an observer bug must not fail requests
            log.exception("prefix observer failed")

    def _place(
        self,
        region: str,
        session: str,
        key: int,
        subset: frozenset[str] | None,
        headers: Mapping[str, str],
        started: float,
    ) -> Pick | Answer:
        cfg = self.config
        home = cfg.home
        via = bool(headers.get(VIA_HEADER))
        if via:  # sent here by another region's picker: served here, no hop
            region = cfg.local.get(region, home)
        here = cfg.sites.get(region, region) == home
        now = self._monotonic()
        endpoints: list[str] = []
        regions: list[str] = []
        replicas: dict[str, str] = {}
        extra: list[tuple[str, str]] = []
        held: tuple[ReplicaBalancer, str] | None = None
        entry = cfg.entries.get(region)
        if not here and entry:
            if _allowed(entry, subset):
                endpoints.append(entry)
                regions.append(region)
                extra.append((VIA_HEADER, home))
        else:
            chosen = self._replicas(region, key, subset, now)
            for replica in chosen:
                ep = endpoint_of(replica)
                endpoints.append(ep)
                regions.append(region)
                replicas[ep] = replica
            if chosen:
                balancer = self.balancers[region]
                balancer.acquire(chosen[0])
                held = (balancer, chosen[0])
        spilled_to = ""
        # A session's spill would be a move the store cannot record while it refuses
        # writes: then Envoy gets no other region to try for it.
        if (
            cfg.spill
            and not via
            and here
            and not (session and self.resolvers.for_unit(region).writes_refused)
        ):
            other = spill_region(self.routing.routings, cfg.zones, region, session or str(key))
            other_entry = cfg.entries.get(other or "")
            if other is not None and other_entry and _allowed(other_entry, subset):
                endpoints.append(other_entry)
                regions.append(other)
                spilled_to = other
                if not extra:
                    extra.append((VIA_HEADER, home))
        if not endpoints:
            return self._unavailable(
                region,
                ErrorKind.NO_REPLICA,
                f"region {region!r} has no replica to route to"
                + (" within the data plane's subset hint" if subset is not None else ""),
            )
        return Pick(
            region,
            session,
            tuple(endpoints),
            tuple(regions),
            tuple(extra),
            None,
            started,
            replicas,
            held,
            spilled_to,
        )

    def _replicas(
        self, region: str, key: int, subset: frozenset[str] | None, now: float
    ) -> list[str]:
        """``region``'s replicas for ``key`` in the balancer's order of preference: the
        bounded-load choice, then each next choice without the ones before it."""
        balancer = self.balancers.get(region)
        if balancer is None:
            return []
        exclude = set()
        if subset is not None:
            exclude = {r for r in balancer.replicas if endpoint_of(r) not in subset}
        out: list[str] = []
        while len(out) < self.config.max_endpoints:
            replica = balancer.choose(key, now=now, exclude=exclude)
            if replica is None:
                break
            out.append(replica)
            exclude.add(replica)
        return out

    # ---- the answer ------------------------------------------------------------------

    async def served(self, pick: Pick, endpoint: str, status: int) -> str:
        """The response headers came: ``endpoint`` served ('' when the data plane did
        not say: then Envoy answered itself, e.g. every endpoint refused). Returns the
        region that answered, for the client's ``x-tectonic-region``."""
        now = self._monotonic()
        try:
            index = pick.endpoints.index(endpoint)
        except ValueError:
            index = -1
        region = pick.regions[index] if index >= 0 else pick.region
        for skipped in pick.endpoints[: max(index, 0)] if index > 0 else ():
            self._skipped(pick, skipped, now)
        if index != 0:
            self._moved(pick, endpoint if index > 0 else "")
        if index < 0:
            self.metrics.error(pick.region, ErrorKind.NO_REPLICA)
            self._record(pick.region, False, status)
        else:
            self.metrics.first_byte(region, now - pick.started)
            self._record(region, status < 500, status)
        self.metrics.request(region, status)
        if index > 0 and pick.spilled_to and region == pick.spilled_to and status < 500:
            self.metrics.spill(pick.region, region)
            if pick.session:
                # Served there already (Envoy chose it); a refused write is logged by the
                # resolver, and spills of sessions stop until the store takes writes.
                with contextlib.suppress(NoRegionServing):
                    await self.resolvers.for_unit(region).move(pick.session, pick.region, region)
        return region

    def _skipped(self, pick: Pick, endpoint: str, now: float) -> None:
        """Envoy went past ``endpoint`` (it refused, reset or answered 5xx before the
        first byte): a failed attempt, and its replica is chosen last for a moment."""
        region = pick.regions[pick.endpoints.index(endpoint)]
        self.metrics.retry(region)
        self._record(region, False, 0)
        replica = pick.replicas.get(endpoint)
        balancer = self.balancers.get(region)
        if replica is not None and balancer is not None and replica in balancer.inflight:
            balancer.eject(replica, now + self.config.eject_s)

    def _moved(self, pick: Pick, endpoint: str) -> None:
        """Envoy went past the first endpoint (to ``endpoint``; '': none served). The
        admission slot and the in-flight count were the first replica's: both move to
        the replica serving when it is of the same region, else end. Its first-token
        time (the failed attempt in it) steers no limit."""
        pick.steer = False
        serving = pick.replicas.get(endpoint, "")
        if pick.grant is not None:
            region, grant = pick.grant
            moved = self.gates.move(region, grant, serving) if serving else None
            if moved is None:
                self.gates.leave(region, grant)
            pick.grant = None if moved is None else (region, moved)
        if pick.held is None:
            return
        balancer, replica = pick.held
        pick.held = None
        balancer.release(replica)
        if serving in balancer.replicas:
            balancer.acquire(serving)
            pick.held = (balancer, serving)

    def first_token(self, pick: Pick) -> None:
        """The answer's first token (its first body chunk, or its headers when Envoy
        does not send bodies): admission control steers the replica's limit by it."""
        if pick.grant is not None and pick.steer:
            region, grant = pick.grant
            self.gates.first_token(region, grant)

    def release(self, pick: Pick) -> None:
        """The request ended (Envoy closes its ext_proc stream then, after the last
        byte of a streamed answer): its in-flight count on the replica it was sent to
        ends, as the gateway's does, and so does its admission slot. Idempotent."""
        if pick.held is not None:
            balancer, replica = pick.held
            pick.held = None
            balancer.release(replica)
        if pick.grant is not None:
            region, grant = pick.grant
            pick.grant = None
            self.gates.leave(region, grant)

    def _record(self, region: str, ok: bool, status: int) -> None:
        if self._vote is not None:
            self._vote(region, ok, status)

    # ---- refusals --------------------------------------------------------------------

    def too_large(self, limit: int) -> Answer:
        return self._refuse(413, f"request body exceeds the limit of {limit} bytes")

    def _refuse(self, status: int, message: str, param: str | None = None) -> Answer:
        self.metrics.error("none", ErrorKind.BAD_REQUEST)
        self.metrics.request("none", status)
        return _answer(status, message, param)

    def _degraded(self, region: str, refusal: Refusal) -> Answer:
        """An actuator refused: counted as degraded, not as an error. A shed request is
        the protocol's 429 (the gateway answers its own clients 503)."""
        status = 429 if refusal.action is Action.SHED else refusal.status
        self.metrics.degrade(region, refusal.action)
        self.metrics.request(region, status)
        headers: tuple[tuple[str, str], ...] = ()
        if refusal.retry_after_s is not None:
            headers = (("retry-after", str(refusal.retry_after_s)),)
        return _answer(status, refusal.message, refusal.param, headers)

    def _overloaded(self, region: str, refusal: Overload) -> Answer:
        """Every replica of the region is at its in-flight limit and the queue had no
        room or time: 429 with Retry-After, as the gateway answers. Not a health vote."""
        self.metrics.request(region, 429)
        retry = str(refusal.retry_after_s)
        message = (
            f"region {region} is at its admission limit ({refusal.reason}, "
            f"{refusal.priority.value} request); retry after {retry} s"
        )
        return _answer(429, message, None, (("retry-after", retry),))

    def _waking(self, region: str, held: Held) -> Answer:
        """Its pool was at zero and did not wake within the hold: 503 with Retry-After
        the measured wake, through Envoy's ImmediateResponse, as the gateway answers.
        Not an error of the region (asleep is not down): no health vote, no spill."""
        self.metrics.request(region, 503)
        retry = str(held.retry_after_s)
        message = f"region {region!r} is waking from zero (held {held.waited_s:.1f} s); retry"
        return _answer(503, message, None, (("retry-after", retry),))

    def _unavailable(self, region: str, kind: ErrorKind, message: str) -> Answer:
        self.metrics.error(region, kind)
        self.metrics.request(region, 503)
        retry = (("retry-after", str(self.config.retry_after_s)),)
        return _answer(503, message, None, retry)


def _allowed(endpoint: str, subset: frozenset[str] | None) -> bool:
    return subset is None or endpoint in subset


def _answer(
    status: int,
    message: str,
    param: str | None = None,
    headers: Sequence[tuple[str, str]] = (),
) -> Answer:
    """vLLM's error object, as the gateway and vLLM answer it."""
    body = json.dumps(error_body(message, error_type(status), status, param)).encode()
    return Answer(status, body, tuple(headers))
