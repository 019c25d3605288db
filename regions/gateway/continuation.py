"""Continuing a stream whose replica failed after the first byte (docs/reliability.md).

The relay (``proxy.py``) records what a streamed completion has sent the client (a
:class:`Transcript`). When the upstream breaks (reset, EOF before ``[DONE]``, vLLM's
in-band error event), the gateway asks another replica to go on from there:

* chat: the conversation plus the partial assistant message, with vLLM's
  ``continue_final_message: true`` and ``add_generation_prompt: false``;
* completions: the prompt plus the text already sent;
* ``max_tokens`` (``max_completion_tokens``, ``min_tokens``) less what was generated;
  model, ``cache_salt``, sampling parameters and seed as the client sent them.

The continuation's events are spliced into the client's stream (:class:`Splice`): the
original ``id`` and ``created``, no second role delta, one ``[DONE]``, and the usage of
both parts (see :func:`Splice.usage`). What this guarantees: with greedy decoding and
the same weights the continued text is the uncut generation's (as long as the text
re-tokenizes to the tokens generated, which byte-level BPE does not always do); with
sampling it is a valid continuation, not the same one.

Only where it is safe (:func:`refusal`, :meth:`Partial.refusal`): one choice, no tool
calls, no structured output, no ``echo``/``suffix``, a single text prompt; a stream
that carried tool calls or reasoning deltas is left cut. The tokens generated before
the cut are counted by the replica that continues (vLLM's ``/tokenize`` of the text;
an event can carry several tokens when vLLM's API server falls behind its engine, and
with speculative decoding), else, if it cannot tokenize, as the content-bearing events
received.

Memory per stream: the raw events since the last fold (at most ``FOLD_BYTES``) plus the
text generated so far. A fold (when that buffer fills, and at the cut) scans the raw
events with a few regular expressions instead of parsing each event.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field

from regions.dataplane.requests import Endpoint

Json = dict[str, object]

FOLD_BYTES = 64 * 1024
DONE = b"data: [DONE]\n\n"
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # vLLM's (and OpenAI's) default for /v1/completions
# vLLM's in-band error event (``create_streaming_error_response``): checked on every
# chunk of a stream that may be continued, before it is written.
INBAND_ERROR = b'data: {"error"'
_EVENT_END = re.compile(rb"\r?\n\r?\n")
# Request fields that constrain decoding: a continuation could not honour them exactly.
_STRUCTURED = (
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "structured_outputs",
)


@dataclass(frozen=True, slots=True)
class ContinuationConfig:
    enabled: bool = True
    max_continuations: int = 2  # per request
    deadline_s: float = 30.0  # from the cut: no continuation starts after it
    header: str = "x-tectonic-continue"  # "off" turns it off for one request


@dataclass(slots=True)
class Continuer:
    """What the relay needs to continue one request's stream: its endpoint and body as
    sent, and how to move its session to another region when its own has no replica
    left (``next_region``: the region's name, or None when none of the zone serves)."""

    endpoint: Endpoint
    body: bytes
    next_region: Callable[[str], Awaitable[str | None]]
    config: ContinuationConfig


class Broken(Exception):
    """A continuation's upstream failed: in-band error or a stream that ended early."""


def refusal(endpoint: Endpoint, data: Mapping[str, object]) -> str | None:
    """Why this request's stream cannot be continued token-exactly; None when it can."""
    if data.get("n") not in (None, 1) or data.get("best_of") not in (None, 1):
        return "more than one choice"
    if any(data.get(k) is not None for k in _STRUCTURED):
        return "structured output"
    if endpoint is Endpoint.CHAT:
        if data.get("tools") or data.get("functions"):
            return "tool calls"
        fmt = data.get("response_format")
        if isinstance(fmt, Mapping) and fmt.get("type") not in (None, "text"):
            return "structured output"
        if data.get("continue_final_message"):
            return "the request continues a message itself"
        if not isinstance(data.get("messages"), list):
            return "no messages"
        return None
    if data.get("echo") or data.get("suffix"):
        return "echo or suffix"
    prompt = data.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        return "not a single text prompt"
    return None


@dataclass(slots=True)
class Partial:
    """What the client has received of one streamed completion."""

    id: str | None = None
    created: object = None
    text: list[str] = field(default_factory=list)
    tokens: int = 0  # content-bearing events
    role_sent: bool = False
    finished: bool = False  # a finish_reason was sent: the answer is whole
    done: bool = False  # ``[DONE]`` was sent
    unsafe: str = ""  # why what was sent cannot be continued

    def refusal(self) -> str | None:
        if self.unsafe:
            return self.unsafe
        if self.id is None:
            return "no event reached the client"
        return None


# What a fold looks for in the raw events, without parsing each one (a stream of 512
# tokens is ~110 KB of events: json.loads of each, or a regular expression tried at
# every byte, would add a quarter to the gateway's CPU per stream; these take ~0.5 ms).
# A JSON string cannot hold an unescaped quote, so nothing here matches inside one.
_STRING = rb'("[^"\\]*(?:\\.[^"\\]*)*")'
_PIECE = {
    Endpoint.CHAT: re.compile(rb'"content": ?' + _STRING),
    Endpoint.COMPLETIONS: re.compile(rb'"text": ?' + _STRING),
}
_ID = re.compile(rb'"id": ?' + _STRING)
_CREATED = re.compile(rb'"created": ?(\d+)')
_TOOLS = re.compile(rb'"(?:tool_calls|function_call)": ?[\[{]\s*[^\]\s}]')
_REASONING = re.compile(rb'"reasoning(?:_content)?": ?"[^"]')


def last_event_end(data: bytes) -> int:
    """Where the last complete SSE event of ``data`` ends (0: none has)."""
    lf, crlf = data.rfind(b"\n\n"), data.rfind(b"\n\r\n")
    return max(lf + 2 if lf >= 0 else 0, crlf + 3 if crlf >= 0 else 0)


def _has(body: bytes, key: bytes, value: bytes) -> bool:
    """Whether ``"key":value`` is in ``body`` (compact or with a space: vLLM's pydantic
    JSON is compact, Python's json.dumps is not)."""
    return b'"%s":%s' % (key, value) in body or b'"%s": %s' % (key, value) in body


def _unsafe(body: bytes) -> str:
    """Why events already sent forbid a continuation; "" when nothing does."""
    if (b'"tool_calls"' in body or b'"function_call"' in body) and _TOOLS.search(body):
        return "it carried tool calls"
    if b'"reasoning' in body and _REASONING.search(body):
        return "it carried reasoning"
    if body.count(b'"index"') > body.count(b'"index":0') + body.count(b'"index": 0'):
        return "more than one choice"
    if INBAND_ERROR in body:
        return "an error event reached the client"
    return ""


class Transcript:
    """The events written to the client, folded into a :class:`Partial` in batches."""

    def __init__(self, endpoint: Endpoint) -> None:
        self._piece = _PIECE[endpoint]
        self._raw: list[bytes] = []
        self._size = 0
        self._tail = b""
        self._partial = Partial()

    def add(self, chunk: bytes) -> None:
        self._raw.append(chunk)
        self._size += len(chunk)
        if self._size > FOLD_BYTES:
            self._fold()

    def partial(self) -> Partial:
        self._fold()
        if self._tail.strip():
            self._partial.unsafe = "half an event reached the client"
        return self._partial

    def _fold(self) -> None:
        data = self._tail + b"".join(self._raw)
        self._raw, self._size = [], 0
        end = last_event_end(data)
        if end == 0:
            self._tail = data
            return
        body, self._tail = data[:end], data[end:]
        p = self._partial
        if p.id is None and (m := _ID.search(body)):
            p.id = json.loads(m.group(1))
            created = _CREATED.search(body)
            p.created = int(created.group(1)) if created else None
        pieces = self._piece.findall(body)
        if pieces:
            texts = [t for t in json.loads(b"[" + b",".join(pieces) + b"]") if t]
            p.text += texts
            p.tokens += len(texts)
        p.role_sent = p.role_sent or _has(body, b"role", b'"')
        p.finished = p.finished or _has(body, b"finish_reason", b'"')
        p.done = p.done or b"data: [DONE]" in body
        p.unsafe = p.unsafe or _unsafe(body)


def split_events(data: bytes) -> tuple[list[bytes], bytes]:
    """The ``data:`` payloads of the complete SSE events in ``data``, and the rest."""
    parts = _EVENT_END.split(data)
    rest = parts.pop()
    out = []
    for part in parts:
        lines = [ln[5:].lstrip() for ln in part.splitlines() if ln.startswith(b"data:")]
        if lines:
            out.append(b"\n".join(lines))
    return out, rest


def loads_object(payload: bytes) -> Json | None:
    """``payload`` parsed, when it is a JSON object; else None."""
    try:
        event = json.loads(payload)
    except ValueError:
        return None
    return event if isinstance(event, dict) else None


def continuation_body(
    endpoint: Endpoint, data: Mapping[str, object], partial: Partial, generated: int
) -> bytes:
    """The request that asks another replica to go on from ``partial``, of which
    ``generated`` tokens were generated."""
    body = dict(data)
    text = "".join(partial.text)
    if endpoint is Endpoint.CHAT:
        messages = list(data["messages"])  # type: ignore[call-overload]
        body["messages"] = [*messages, {"role": "assistant", "content": text}]
        body["continue_final_message"] = True
        body["add_generation_prompt"] = False
    else:
        prompt = data["prompt"]  # refusal() checked: a string, or a list of one
        first = prompt[0] if isinstance(prompt, list) else prompt
        body["prompt"] = f"{first}{text}"
        body.setdefault("max_tokens", COMPLETIONS_DEFAULT_MAX_TOKENS)
    for name in ("max_tokens", "max_completion_tokens", "min_tokens"):
        if isinstance(n := body.get(name), int) and not isinstance(n, bool):
            body[name] = max(0 if name == "min_tokens" else 1, n - generated)
    body["stream"] = True
    options = data.get("stream_options")
    body["stream_options"] = {
        **(options if isinstance(options, dict) else {}),
        "include_usage": True,
    }
    return json.dumps(body).encode()


def wants_usage(data: Mapping[str, object]) -> bool:
    options = data.get("stream_options")
    return isinstance(options, dict) and bool(options.get("include_usage"))


class Splice:
    """Rewrites a continuation's events into the client's stream."""

    def __init__(self, partial: Partial, want_usage: bool, generated: int) -> None:
        self.partial, self.want_usage = partial, want_usage
        self.before = generated  # tokens generated before this continuation
        self._tail = b""
        self.done = False

    def feed(self, chunk: bytes) -> Iterator[bytes]:
        """The bytes to write for ``chunk`` of the continuation; raises Broken on its
        in-band error event."""
        events, self._tail = split_events(self._tail + chunk)
        for payload in events:
            if payload == b"[DONE]":
                self.done = True
                yield DONE
                continue
            event = loads_object(payload)
            if event is None or "error" in event:
                raise Broken("the continuation's replica failed (in-band error)")
            out = self.event(event)
            if out is not None:
                yield b"data: " + json.dumps(out).encode() + b"\n\n"

    def event(self, event: Json) -> Json | None:
        """One continuation event as the client's stream has it; None: dropped."""
        event["id"] = self.partial.id
        if self.partial.created is not None:
            event["created"] = self.partial.created
        choices = event.get("choices")
        kept = []
        for c in choices if isinstance(choices, list) else ():
            delta = c.get("delta") if isinstance(c, dict) else None
            if isinstance(delta, dict) and self.partial.role_sent:
                delta.pop("role", None)
                if _empty_choice(c, delta):
                    continue  # the role chunk a stream starts with: sent already
            kept.append(c)
        usage = event.get("usage")
        if isinstance(usage, dict):
            if not self.want_usage:
                if not kept:
                    return None  # asked for by the gateway only
                event["usage"] = None
            else:
                event["usage"] = self.usage(usage)
        elif isinstance(choices, list) and not kept:
            return None
        if isinstance(choices, list):
            event["choices"] = kept
        return event

    def usage(self, usage: Mapping[str, object]) -> Json:
        """Both parts: the continuation's prompt held the text already generated, which
        counts as completion tokens here; the total is the continuation's."""
        out = dict(usage)
        before = self.before
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if isinstance(prompt, int) and isinstance(completion, int):
            out["prompt_tokens"] = max(0, prompt - before)
            out["completion_tokens"] = completion + min(before, prompt)
        return out


def _empty_choice(choice: Mapping[str, object], delta: Mapping[str, object]) -> bool:
    return (
        not delta.get("content")
        and choice.get("finish_reason") is None
        and not choice.get("logprobs")
        and not any(v for k, v in delta.items() if k != "content")
    )
