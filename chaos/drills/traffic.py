"""Synthetic traffic for the demo and the drills: chat sessions through the gateways,
and what each one saw.

Every session sends one short chat completion at a time through the gateway of its
home region, about every ``interval_s``, with its id in ``x-session-id``; groups of
sessions share a system prompt, so prompt prefixes repeat (what prefix-aware hashing
and the replicas' prefix caches are for). A share of the requests (``stream_share``)
stream a longer answer: a replica killed mid-stream is what the gateway's stream
continuation is for, and a stream that ends with an in-band error or without
``[DONE]`` counts as a failed request. Each answer's ``x-tectonic-region`` header
says which region served it, and each session keeps a log of (time, region) per
request: the drills judge stickiness from it (chaos/drills/measure.py).

Every request, the sessions' and a surge's, is also kept in ``requests`` with when it
was sent and how long its first byte took: the scaler's drills judge the first-token
latency a surge saw from it. A surge (``Traffic.surge``) adds open-loop, seeded Poisson
arrivals into one region's gateway on top of its sessions: the offered load rises from
the sessions' base rate to ``rate`` times it, is held, and falls back (the shape of
``surge_rps``). Open loop, because a closed loop slows down with the system it loads
and would hide the very queueing a surge is for.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import aiohttp

SESSION_HEADER = "x-session-id"
REGION_HEADER = "x-tectonic-region"
MODEL = "tiny"  # what chaos.lab.procs.start_simulator serves
TOPICS = (
    "billing questions for a cloud storage product",
    "a travel agency planning trips across Europe",
    "technical support for home Wi-Fi routers",
    "a cooking assistant for quick weeknight dinners",
    "an internal helpdesk for laptop and VPN issues",
    "a tutor for high-school algebra",
)


def system_prompt(group: int) -> str:
    """A long-ish system prompt shared by every session of ``group``: the repeated
    prefix (longer than the gateway's 256 prefix characters)."""
    topic = TOPICS[group % len(TOPICS)]
    return (
        f"You are assistant #{group} for {topic}. Answer briefly and politely, in plain "
        "language, without markdown. If a question is outside your remit, say so and "
        "suggest where the user could ask instead. Never invent account numbers, prices "
        "or policies; when unsure, say that you are unsure. Keep every answer under "
        "three sentences unless the user explicitly asks for more detail."
    )


@dataclass
class Session:
    sid: str
    home: str  # the gateway it talks to: where a new session starts
    gateway: str  # base URL of that gateway
    system: str
    model: str = MODEL  # with model pools: one session id talks to each model apart
    # with model pools: its model's pool in its home region, where it starts
    home_unit: str = ""
    served: list[str] = field(default_factory=list)  # region of each answered request
    sent: int = 0
    failing: bool = False  # its last request failed
    # every request: (monotonic time of the answer, serving region or "" if it failed)
    log: list[tuple[float, str]] = field(default_factory=list)

    @property
    def conversation(self) -> str:
        """The session's conversation with its model: what must stay in one region at
        a time (its id alone without model pools)."""
        return self.sid if self.model == MODEL else f"{self.sid}/{self.model}"

    @property
    def region(self) -> str:
        """The region that answered last ('-' before any answer)."""
        return self.served[-1] if self.served else "-"

    @property
    def moves(self) -> int:
        return sum(1 for a, b in zip(self.served, self.served[1:], strict=False) if a != b)


@dataclass(frozen=True)
class Sent:
    """One request: when it was sent (monotonic), the region whose gateway it went in
    by, and the seconds to its answer's first byte (None: it failed). A streamed
    answer's first byte is its first token; an unstreamed one's, the whole answer."""

    t: float
    home: str
    first_byte_s: float | None


@dataclass(frozen=True)
class Failure:
    t: float  # monotonic
    sid: str
    home: str
    reason: str


class Traffic:
    """The bounded load: ``Traffic.add`` sessions, ``start`` them, ``stop`` at the end."""

    def __init__(
        self,
        gateways: Mapping[str, str],
        *,
        interval_s: float = 0.5,
        group_size: int = 5,
        timeout_s: float = 5.0,
        seed: int = 7,
        prompt_repeat: int = 1,
        stream_share: float = 0.0,
        stream_tokens: int = 24,
    ) -> None:
        if not 0.0 <= stream_share <= 1.0:
            raise ValueError(f"stream_share must be within [0, 1], got {stream_share}")
        self.gateways = dict(gateways)  # home region -> gateway URL
        self.interval_s = interval_s
        self.stream_share = stream_share
        self.stream_tokens = stream_tokens  # max_tokens of a streamed answer
        self.group_size = group_size
        # Real vLLM on CPU caches 128-token blocks: a longer shared prompt fills one.
        self.prompt_repeat = prompt_repeat
        self.timeout_s = timeout_s
        self.sessions: list[Session] = []
        self.ok = 0
        self.failures: list[Failure] = []
        self.requests: list[Sent] = []
        self.seed = seed
        self._rng = random.Random(seed)
        self._http: aiohttp.ClientSession | None = None
        self._tasks: list[asyncio.Task[None]] = []

    # ---- sessions ------------------------------------------------------------------------
    def add(
        self,
        count: int,
        homes: Sequence[str],
        prefix: str = "s",
        models: Sequence[str] = (MODEL,),
        pools: Mapping[str, str] | None = None,
    ) -> list[Session]:
        """``count`` new sessions, homes round-robin over ``homes``, each talking to
        every one of ``models`` (one conversation each, under the same session id);
        started at once if the traffic runs already. ``pools``: model -> the name of
        the pool that serves it in every region (model pools, docs/models.md)."""
        new = []
        for i in range(count):
            n = len({x.sid for x in self.sessions})
            home = homes[i % len(homes)]
            # a group's sessions share a home, so its prompt is shared inside one region
            k = len({x.sid for x in self.sessions if x.home == home})
            system = " ".join(
                [system_prompt((k // self.group_size) * len(homes) + homes.index(home))]
                * self.prompt_repeat
            )
            for model in models:
                s = Session(
                    sid=f"{prefix}-{n:03d}-{home}",
                    home=home,
                    gateway=self.gateways[home],
                    system=system,
                    model=model,
                    home_unit=f"{home}.{pools[model]}" if pools and model in pools else home,
                )
                self.sessions.append(s)
                new.append(s)
                if self._http is not None:
                    self._tasks.append(asyncio.create_task(self._loop(s)))
        return new

    async def start(self) -> None:
        self._http = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=self.timeout_s),
        )
        self._tasks = [asyncio.create_task(self._loop(s)) for s in self.sessions]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def _loop(self, s: Session) -> None:
        await asyncio.sleep(self._rng.uniform(0, self.interval_s))  # spread the starts
        while True:
            await self.send(s)
            await asyncio.sleep(self.interval_s * self._rng.uniform(0.8, 1.2))

    async def send(self, s: Session) -> None:
        """One chat turn of ``s``; records the serving region or why it failed."""
        assert self._http is not None
        s.sent += 1
        stream = self._rng.random() < self.stream_share
        body: dict[str, object] = {
            "model": s.model,
            "messages": [
                {"role": "system", "content": s.system},
                {"role": "user", "content": f"Question {s.sent} from {s.sid}: any news?"},
            ],
            "max_tokens": self.stream_tokens if stream else 4,
        }
        if stream:
            body["stream"] = True
        url = s.gateway + "/v1/chat/completions"
        sent = time.monotonic()
        try:
            async with self._http.post(url, json=body, headers={SESSION_HEADER: s.sid}) as r:
                first = await r.content.readany()
                first_byte_s = time.monotonic() - sent
                payload = first + await r.read()
                region = r.headers.get(REGION_HEADER, "")
                cut = stream_cut(payload) if stream and r.status == 200 else ""
                if r.status == 200 and region and not cut:
                    s.served.append(region)
                    s.log.append((time.monotonic(), region))
                    s.failing = False
                    self.ok += 1
                    self.requests.append(Sent(sent, s.home, first_byte_s))
                    return
                if r.status != 200:
                    reason = f"HTTP {r.status} {_message(payload)}"
                elif cut:
                    reason = f"stream cut: {cut}"
                else:
                    reason = f"200 without {REGION_HEADER}"
        except (aiohttp.ClientError, TimeoutError) as e:
            reason = type(e).__name__
        s.failing = True
        s.log.append((time.monotonic(), ""))
        self.failures.append(Failure(time.monotonic(), s.sid, s.home, reason))
        self.requests.append(Sent(sent, s.home, None))

    # ---- a surge -------------------------------------------------------------------------
    def base_rps(self, home: str) -> float:
        """The sessions' nominal offered load into ``home``'s gateway, requests/s: one
        request per session every ``interval_s``."""
        return sum(1 for s in self.sessions if s.home == home) / self.interval_s

    async def surge(
        self, home: str, rate: float, ramp_s: float, hold_s: float, *, sessions: int = 24
    ) -> int:
        """Offer ``home``'s gateway ``rate`` times its base load at the peak (the shape
        of ``surge_rps``), the extra as seeded Poisson arrivals, each a request of one of
        ``sessions`` surge sessions (their own ids: a session's requests may overlap,
        and none of them is judged for stickiness). Returns the requests sent."""
        if self._http is None:
            raise RuntimeError("the traffic is not running: start it before a surge")
        base = self.base_rps(home)
        if base <= 0:
            raise RuntimeError(f"no session is homed in {home}: nothing to surge from")
        peak = base * (rate - 1)  # the most extra arrivals/s, at the top
        rng = random.Random(f"{self.seed}-surge-{home}")
        pool = [
            Session(
                sid=f"surge-{i:03d}-{home}",
                home=home,
                gateway=self.gateways[home],
                system=system_prompt(i % len(TOPICS)),
            )
            for i in range(sessions)
        ]
        start, at, n = time.monotonic(), 0.0, 0
        tasks: set[asyncio.Task[None]] = set()
        try:
            while True:
                at += rng.expovariate(peak)
                if at >= 2 * ramp_s + hold_s:
                    break
                extra = surge_rps(base, rate, ramp_s, hold_s, at) - base
                if rng.random() * peak >= extra:  # thinning: fewer arrivals off the top
                    continue
                session = pool[rng.randrange(sessions)]
                await asyncio.sleep(max(0.0, start + at - time.monotonic()))
                n += 1
                task = asyncio.create_task(self.send(session))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            for task in tasks:
                task.cancel()
        return n

    # ---- the live view -------------------------------------------------------------------
    def serving(self, sessions: Iterable[Session] | None = None) -> dict[str, int]:
        """Sessions per region that answered their last request."""
        counts = Counter(s.region for s in (self.sessions if sessions is None else sessions))
        return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

    def distribution(self) -> str:
        """Sessions per serving region, those whose last request failed apart."""
        ok = [s for s in self.sessions if not s.failing]
        spread = ", ".join(f"{r} {n}" for r, n in self.serving(ok).items())
        failing = len(self.sessions) - len(ok)
        return spread + (f" (failing now: {failing})" if failing else "")

    def line(self) -> str:
        """The live view's traffic line ('' before any session exists)."""
        if not self.sessions:
            return ""
        return (
            f"traffic: {self.ok} requests ok / {len(self.failures)} failed; "
            f"sessions by serving region: {self.distribution()}"
        )

    def answered(self, at_least: int, sessions: Iterable[Session] | None = None) -> bool:
        """Every session (of ``sessions``) got at least ``at_least`` answers."""
        group = self.sessions if sessions is None else sessions
        return all(len(s.served) >= at_least for s in group)


def surge_rps(base: float, rate: float, ramp_s: float, hold_s: float, t: float) -> float:
    """The offered load ``t`` seconds into a surge: ``base`` rising linearly to
    ``rate`` x ``base`` over ``ramp_s``, held ``hold_s``, falling back over ``ramp_s``;
    ``base`` before and after."""
    top = base * rate
    end = 2 * ramp_s + hold_s
    if t <= 0 or t >= end:
        return base
    if t < ramp_s:
        return base + (top - base) * t / ramp_s
    if t <= ramp_s + hold_s:
        return top
    return base + (top - base) * (end - t) / ramp_s if ramp_s else base


def stream_cut(payload: bytes) -> str:
    """Why a streamed answer is not whole ('' when it is): an in-band error event (what
    a gateway sends when a stream breaks and is not continued), or no ``[DONE]``."""
    done = False
    for event in payload.split(b"\n\n"):
        data = event.strip().removeprefix(b"data:").strip()
        if data == b"[DONE]":
            done = True
        elif data.startswith(b"{") and b'"error"' in data:
            with contextlib.suppress(ValueError):
                error = json.loads(data).get("error")
                if error:
                    return _no_address(str(error.get("message", error)))[:120]
    return "" if done else "no [DONE]"


def _message(payload: bytes) -> str:
    """The OpenAI-style error message of a refused request, shortened."""
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        return _no_address(str(json.loads(payload)["error"]["message"]))[:120]
    return _no_address(payload[:120].decode(errors="replace"))


def _no_address(text: str) -> str:
    """Without replica addresses, so that one cause reads as one reason."""
    return re.sub(r"\s*\(?'?127\.0\.0\.1'?(?:, |:)\d+\)?", "", text)
