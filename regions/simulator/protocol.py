"""Request models and response shapes of vLLM's OpenAI-compatible API.

Requests accept (and ignore) the many sampling fields vLLM takes; only the ones the
simulator acts on are typed. Errors use vLLM's current shape:
``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Json = dict[str, object]


class _Request(BaseModel):
    model_config = ConfigDict(extra="allow")


class StreamOptions(BaseModel):
    include_usage: bool | None = True
    continuous_usage_stats: bool | None = False


class CompletionRequest(_Request):
    model: str | None = None
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)
    n: int = Field(1, ge=1, le=16)
    stream: bool = False
    stream_options: StreamOptions | None = None
    cache_salt: str | None = None
    add_special_tokens: bool = True


class TextPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str = "text"
    text: str = ""


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content if p.type == "text")


class ChatRequest(_Request):
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    n: int = Field(1, ge=1, le=16)
    stream: bool = False
    stream_options: StreamOptions | None = None
    cache_salt: str | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False


class TokenizeRequest(_Request):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    return_token_strs: bool = False


class DetokenizeRequest(_Request):
    model: str | None = None
    tokens: list[int]


ErrorType = Literal[
    "BadRequestError",
    "Bad Request",  # FastAPI's request validation (e.g. a bad query parameter)
    "NotFoundError",
    "InternalServerError",
    "ServiceUnavailableError",
]


def error_body(message: str, err_type: ErrorType, code: int, param: str | None = None) -> Json:
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


class ApiError(Exception):
    """An error answered with vLLM's error body and ``code`` as the HTTP status."""

    def __init__(self, message: str, err_type: ErrorType, code: int, param: str | None = None):
        super().__init__(message)
        self.body = error_body(message, err_type, code, param)
        self.code = code


def check_generation_prompt(req: ChatRequest | TokenizeRequest) -> None:
    """vLLM's request validator: both flags *sent* as true are refused on parsing. With
    ``add_generation_prompt`` left at its default (true) the chat template refuses them
    later, with transformers' message (``render_chat``)."""
    sent = "add_generation_prompt" in req.model_fields_set
    if req.continue_final_message and req.add_generation_prompt and sent:
        raise ApiError(
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
            "BadRequestError",
            400,
        )


def dumps(obj: object) -> str:
    """Compact JSON, like FastAPI's JSONResponse."""
    return json.dumps(obj, separators=(",", ":"))


def new_id(prefix: str, request_id: str | None = None) -> str:
    """An answer's id: as vLLM makes it, the client's ``X-Request-Id`` when it sent one."""
    return f"{prefix}-{request_id if request_id is not None else uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def usage(prompt: int, completion: int, cached: int | None) -> Json:
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": None if cached is None else {"cached_tokens": cached},
    }


def models_body(model: str, max_model_len: int, created: int) -> Json:
    permission: Json = {
        "id": new_id("modelperm"),
        "object": "model_permission",
        "created": created,
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }
    card: Json = {
        "id": model,
        "object": "model",
        "created": created,
        "owned_by": "vllm",
        "root": model,
        "parent": None,
        "max_model_len": max_model_len,
        "permission": [permission],
    }
    return {"object": "list", "data": [card]}


def completion_choice(index: int, text: str, finish: str | None) -> Json:
    return {
        "index": index,
        "text": text,
        "logprobs": None,
        "finish_reason": finish,
        "stop_reason": None,
    }


def chat_choice(index: int, text: str, finish: str | None) -> Json:
    message: Json = {
        "role": "assistant",
        "content": text,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        "tool_calls": [],
        "reasoning_content": None,
    }
    return {
        "index": index,
        "message": message,
        "logprobs": None,
        "finish_reason": finish,
        "stop_reason": None,
    }


def chat_delta(index: int, delta: Json, finish: str | None) -> Json:
    return {
        "index": index,
        "delta": delta,
        "logprobs": None,
        "finish_reason": finish,
        "stop_reason": None,
    }
