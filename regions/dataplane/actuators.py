"""The gateway's degradation actuators (docs/architecture.md §5): pure functions of one parsed
request and the feature flags of the region that serves it. No I/O.

In the order they run (the cheapest refusal first):

* **Shedding** (``shed_priority_below``): a request's priority is the integer in the
  ``x-priority`` header (configurable; absent or not an integer: ``default_priority``,
  0). While the flag is set, a lower priority gets 503 with ``Retry-After``; with the
  flag unset nothing is ever shed.
* **Context cap** (``max_context_tokens``): the gateway has no tokenizer, so a prompt's
  tokens are an *estimate*: ``ceil(chars / chars_per_token)`` per text (the topology's
  calibrated ``prefixes.chars_per_token``) plus ``message_overhead_tokens`` per chat
  message for the template's role markers; token-id prompts are counted exactly. Only
  the prompt counts (tool schemas and images are left out; ``max_tokens`` is not
  added: vLLM caps the output at what the context leaves). Over the cap:
  ``reject`` answers 400 (vLLM's error shape) saying the region is degraded, the cap
  and what to do; ``truncate`` drops the oldest whole turns of a chat (a user message
  and the assistant/tool messages after it, so tool results never lose their call)
  until the estimate fits, keeping every system/developer message and the last user
  turn with what follows it; if that still does not fit, 400. A completion prompt is
  never truncated, only rejected: cutting text or token ids blindly can split a
  document, a few-shot example or an instruction, which is worse than a clear error.
* **Parallel tool calls off** (``parallel_tool_calls`` false): a chat request with
  ``tools`` is forwarded with ``parallel_tool_calls: false``.

The forwarded body is the client's bytes, untouched, unless an actuator changed
something; only then is it re-serialized. The body is parsed again only while the
serving region's flags need it (the hot path of an undegraded region does nothing).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from controlplane.kernel.ladder.record import FeatureFlags
from regions.dataplane.admission_limit import DEFAULT_BATCH_VALUES
from regions.dataplane.prompts import BadRequest, chat_messages
from regions.dataplane.requests import Endpoint, ProxyRequest

DEFAULT_CHARS_PER_TOKEN = 4.0
KEPT_ROLES = frozenset({"system", "developer"})  # never dropped by truncation


class Action(StrEnum):
    """What an actuator did to a request: the ``action`` label of the gateway's
    ``tectonic_gateway_degraded_total``."""

    SHED = "shed"
    CONTEXT_REJECTED = "context_rejected"
    CONTEXT_TRUNCATED = "context_truncated"
    PARALLEL_TOOL_CALLS_OFF = "parallel_tool_calls_off"


@dataclass(frozen=True)
class ActuatorConfig:
    chars_per_token: float | None = None  # None: the topology's prefixes.chars_per_token
    message_overhead_tokens: int = 4  # role markers a chat template adds per message
    priority_header: str = "x-priority"
    default_priority: int = 0  # a request without (a valid) priority header
    shed_retry_after_s: int = 5  # longer than a failover retry: headroom comes back slowly

    @property
    def ratio(self) -> float:
        return self.chars_per_token or DEFAULT_CHARS_PER_TOKEN


@dataclass(frozen=True, slots=True)
class Refusal:
    """Answer the client with this instead of forwarding."""

    status: int
    message: str
    action: Action
    param: str | None = None
    retry_after_s: int | None = None


@dataclass(frozen=True, slots=True)
class Actuated:
    """Forward ``body``: the request's own bytes unless ``actions`` changed it."""

    body: bytes
    actions: tuple[Action, ...] = ()

    @property
    def truncated(self) -> bool:
        return Action.CONTEXT_TRUNCATED in self.actions


def degrades_requests(flags: FeatureFlags) -> bool:
    """Whether any gateway actuator is on (speculative decoding is the agent's)."""
    return (
        flags.max_context_tokens is not None
        or not flags.parallel_tool_calls
        or flags.shed_priority_below is not None
    )


BATCH_PRIORITY = -1  # ``x-priority: batch`` (or ``low``): below every unmarked request


def priority(header: str | None, default: int) -> int:
    """The request's priority: an integer, or ``batch`` / ``low`` (``BATCH_PRIORITY``, so
    a shedding step with ``below_priority: 0`` sheds batch traffic and nothing else);
    a missing or malformed header is the default, so that a client's unrelated header
    never turns into errors only while a region is degraded."""
    if header is None:
        return default
    value = header.strip()
    if value.lower() in DEFAULT_BATCH_VALUES:  # the names admission control reads
        return BATCH_PRIORITY
    try:
        return int(value)
    except ValueError:
        return default


def estimate_tokens(chars: int, chars_per_token: float) -> int:
    return math.ceil(chars / chars_per_token)


def shed(region: str, flags: FeatureFlags, prio: int, config: ActuatorConfig) -> Refusal | None:
    """Priority shedding, the one actuator that needs nothing of the request but its
    priority (``prio``: from :func:`priority`)."""
    below = flags.shed_priority_below
    if below is None or prio >= below:
        return None
    return Refusal(
        503,
        f"Region {region} is degraded and short of headroom: it is shedding requests "
        f"of priority below {below}, and this one has priority {prio} (header "
        f"{config.priority_header}). Retry after {config.shed_retry_after_s} s.",
        Action.SHED,
        retry_after_s=config.shed_retry_after_s,
    )


def actuate(
    req: ProxyRequest,
    region: str,
    flags: FeatureFlags,
    prio: int,
    config: ActuatorConfig,
) -> Actuated | Refusal:
    """Apply ``region``'s flags to ``req`` (``prio``: from :func:`priority`)."""
    if not degrades_requests(flags):
        return Actuated(req.body)
    if (refused := shed(region, flags, prio, config)) is not None:
        return refused
    cap = flags.max_context_tokens
    tools_off = not flags.parallel_tool_calls and req.endpoint is Endpoint.CHAT
    if cap is None and not tools_off:
        return Actuated(req.body)
    data = _reparse(req.body)
    actions: list[Action] = []
    if cap is not None:
        capped = _cap(req.endpoint, data, region, cap, flags.context_cap_mode, config)
        if isinstance(capped, Refusal):
            return capped
        actions += capped
    if tools_off and _has_tools(data) and data.get("parallel_tool_calls") is not False:
        data["parallel_tool_calls"] = False
        actions.append(Action.PARALLEL_TOOL_CALLS_OFF)
    if not actions:
        return Actuated(req.body)
    body = json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()
    return Actuated(body, tuple(actions))


def _reparse(body: bytes) -> dict[str, object]:
    data = json.loads(body)  # parse() accepted these bytes: a JSON object
    if not isinstance(data, dict):
        raise BadRequest("the request body must be a JSON object")
    return data


def _has_tools(data: Mapping[str, object]) -> bool:
    tools = data.get("tools")
    return isinstance(tools, list) and bool(tools)


def _cap(
    endpoint: Endpoint,
    data: dict[str, object],
    region: str,
    cap: int,
    mode: str,
    config: ActuatorConfig,
) -> list[Action] | Refusal:
    """Under the cap: no action; truncated in place: one; else the refusal."""
    what = f"Region {region} is degraded: its context is capped at {cap} tokens"
    advice = "Shorten the conversation (drop older turns) or retry later, once it has recovered."
    if endpoint is Endpoint.COMPLETIONS:
        tokens = _completion_tokens(data.get("prompt"), config.ratio)
        if tokens <= cap:
            return []
        why = (
            " (a completion prompt is not truncated: it cannot be cut safely)"
            if mode == "truncate"
            else ""
        )
        return _too_long(
            f"{what}, and this prompt is about {tokens} tokens (estimated){why}. Shorten "
            "the prompt or retry later, once the region has recovered.",
            "prompt",
        )
    raw = data.get("messages")
    assert isinstance(raw, list)  # parse() validated the messages
    pairs = chat_messages(raw)
    overhead = config.message_overhead_tokens
    costs = [estimate_tokens(len(text), config.ratio) + overhead for _, text in pairs]
    tokens = sum(costs)
    if tokens <= cap:
        return []
    if mode == "reject":
        return _too_long(
            f"{what}, and this conversation is about {tokens} tokens (estimated). {advice}",
            "messages",
        )
    drop = _oldest_turns(pairs, costs, tokens - cap)
    if drop is None:
        kept = tokens
        if (last := _last_user(pairs)) is not None:
            kept = sum(c for i, c in enumerate(costs) if i >= last or pairs[i][0] in KEPT_ROLES)
        return _too_long(
            f"{what}; even with the older turns dropped, the system prompt and the last "
            f"turn are about {kept} tokens (estimated). {advice}",
            "messages",
        )
    data["messages"] = [m for i, m in enumerate(raw) if i not in drop]
    return [Action.CONTEXT_TRUNCATED]


def _too_long(message: str, param: str) -> Refusal:
    return Refusal(400, message, Action.CONTEXT_REJECTED, param=param)


def _completion_tokens(prompt: object, ratio: float) -> int:
    """The longest prompt of a (batch) completion request: each is capped on its own."""
    if isinstance(prompt, str):
        return estimate_tokens(len(prompt), ratio)
    if isinstance(prompt, list):
        if all(isinstance(p, int) for p in prompt):
            return len(prompt)  # token ids: exact
        return max((_completion_tokens(p, ratio) for p in prompt), default=0)
    return 0


def _last_user(pairs: Sequence[tuple[str, str]]) -> int | None:
    return max((i for i, (role, _) in enumerate(pairs) if role == "user"), default=None)


def _oldest_turns(
    pairs: Sequence[tuple[str, str]], costs: Sequence[int], excess: int
) -> set[int] | None:
    """Indexes of the oldest whole turns before the last user message whose estimate
    covers ``excess``; None when dropping all of them is not enough."""
    last = _last_user(pairs)
    if last is None:
        return None
    turns: list[list[int]] = []
    for i in range(last):
        role = pairs[i][0]
        if role in KEPT_ROLES:
            continue
        if role == "user" or not turns:
            turns.append([])  # a turn starts at a user message (or the first message)
        turns[-1].append(i)
    drop: set[int] = set()
    saved = 0
    for turn in turns:
        if saved >= excess:
            return drop
        drop.update(turn)
        saved += sum(costs[i] for i in turn)
    return drop if saved >= excess else None
