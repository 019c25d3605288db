"""Parsing and validating the OpenAI-style request bodies the gateway forwards.

The gateway reads just enough of a body to route it: the model (required, so that a
typo fails here with a clear message rather than deep in a region), ``stream``, the
``user`` field (the session key when no session header is sent), the prompt's first
characters (the replica-choice key) and the whole prompt as a ``PromptRequest`` for
the pre-warm tracker (built from the one parse: references into it, no copies).
The body itself is forwarded byte for byte. Errors use vLLM's shape:
``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import cast

from controlplane.kernel.prefix.identity import PromptRequest
from regions.dataplane.prompts import (
    BadRequest,
    chat_messages,
    chat_prefix,
    chat_text,
    completion_prefix,
    first_prompt,
)

Json = dict[str, object]


class Endpoint(StrEnum):
    COMPLETIONS = "/v1/completions"
    CHAT = "/v1/chat/completions"


# vLLM's tokenizer endpoints: forwarded as they are (``tokenizer_prefix`` keys them).
TOKENIZER_PATHS = ("/tokenize", "/detokenize")


@dataclass(frozen=True, slots=True)
class ProxyRequest:
    endpoint: Endpoint
    body: bytes
    model: str
    stream: bool
    prefix: str  # the prompt's first characters, for replica choice
    user: str  # the ``user`` field, "" when absent
    prompt: PromptRequest  # the whole prompt, for the pre-warm tracker


def error_body(message: str, err_type: str, code: int, param: str | None = None) -> Json:
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


def error_type(status: int) -> str:
    """vLLM's error type names for the statuses the gateway produces itself."""
    return {
        404: "NotFoundError",
        413: "RequestEntityTooLarge",
        429: "RateLimitError",
        503: "ServiceUnavailableError",
    }.get(status, "BadRequestError" if status < 500 else "InternalServerError")


def parse(endpoint: Endpoint, body: bytes, prefix_chars: int) -> ProxyRequest:
    """Validate ``body`` for ``endpoint``; raises BadRequest with a message naming the field."""
    data = _object(body)
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' is required and must be a non-empty string", param="model")
    stream = data.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise BadRequest("'stream' must be a boolean", param="stream")
    user = data.get("user", "")
    if user is None:
        user = ""
    if not isinstance(user, str):
        raise BadRequest("'user' must be a string", param="user")
    # vLLM validates cache_salt itself; the tracker only keys by it when it is a string.
    salt = raw_salt if isinstance(raw_salt := data.get("cache_salt"), str) else None
    # LoRA: vLLM picks an adapter by the model name, so the model alone keys the cache.
    prompt: PromptRequest
    if endpoint is Endpoint.CHAT:
        messages = chat_messages(data.get("messages"))
        prefix = chat_text(messages, prefix_chars)
        prompt = PromptRequest(model, messages=messages, cache_salt=salt)
    else:
        raw = first_prompt(data.get("prompt"))
        prefix = completion_prefix(raw, prefix_chars)  # also validates it
        if isinstance(raw, str):
            prompt = PromptRequest(model, prompt=raw, cache_salt=salt)
        else:
            ids = cast("list[int]", raw)  # completion_prefix checked it
            prompt = PromptRequest(model, token_ids=ids, cache_salt=salt)
    return ProxyRequest(endpoint, body, model, stream, prefix, user, prompt)


def tokenizer_prefix(body: bytes, chars: int) -> str:
    """The routing key of a ``/tokenize`` or ``/detokenize`` body: the first ``chars``
    characters of its messages, prompt or token ids; "" for a body that is none of
    those (the replica answers it with vLLM's own validation error)."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError included
        return ""
    if not isinstance(data, dict):
        return ""
    try:
        if data.get("messages") is not None:
            return chat_prefix(data["messages"], chars)
        return completion_prefix(data.get("prompt", data.get("tokens")), chars)
    except BadRequest:
        return ""


def tokenizer_model(body: bytes) -> str | None:
    """The ``model`` a ``/tokenize`` or ``/detokenize`` body names (vLLM's is optional);
    None without one, or for a body that is not a JSON object."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return None
    model = data.get("model") if isinstance(data, dict) else None
    return model if isinstance(model, str) and model else None


def _object(body: bytes) -> Mapping[str, object]:
    if not body:
        raise BadRequest("the request body is empty; send a JSON object")
    try:
        if body[0] == 0x7B and len(body) > 1 and body[1]:  # "{" then not UTF-16/32
            # What json.loads does with such bytes (its encoding sniffing says UTF-8),
            # without the sniffing and argument handling around it.
            data = _DECODE(body.decode("utf-8", "surrogatepass"))
        else:
            data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadRequest(f"Invalid JSON body: {e}") from e
    except RecursionError as e:
        raise BadRequest("Invalid JSON body: nested too deeply") from e
    if not isinstance(data, dict):
        raise BadRequest(f"the request body must be a JSON object, not {type(data).__name__}")
    if _SURROGATE_ESCAPE.search(body) and not _unicode(data):
        raise BadRequest(
            "Invalid JSON body: a string holds a lone UTF-16 surrogate (a \\ud800-\\udfff "
            "escape without its pair), which is no text"
        )
    return data


_DECODE = json.JSONDecoder().decode  # what json.loads uses without keyword arguments

# Only a \u escape can put a surrogate in a JSON string (UTF-8 has none): the cheap test
# on the raw bytes, before the exact one on the parsed body.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _unicode(data: object) -> bool:
    try:
        json.dumps(data, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return False
    return True
