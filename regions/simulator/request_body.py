"""Reading a request as vLLM does: the JSON body validated into its model, a chat
rendered with the template, a completion's prompt as token ids, and how long the
simulated model writes when nothing limits it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from regions.simulator.protocol import ApiError, ChatMessage, ChatRequest, CompletionRequest
from regions.simulator.tokenizer import Tokenizer, render_chat

M = TypeVar("M", bound=BaseModel)
# Without a limit the simulated model ends a chat message by itself after this many words.
_NATURAL_WORDS = 16


async def parse_body(request: web.Request, model: type[M]) -> M:
    """The body as ``model``; a 400 in vLLM's shape when it is not."""
    try:
        data = await request.json()
        json.dumps(data, ensure_ascii=False).encode()  # no lone surrogates: our tokenizer
        return model.model_validate(data)  # cannot encode them (nor can vLLM's HF one)
    except UnicodeEncodeError as e:
        raise ApiError(
            f"Invalid JSON body: a string holds a lone UTF-16 surrogate ({e.reason})",
            "BadRequestError",
            400,
        ) from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(f"Invalid JSON body: {e}", "BadRequestError", 400) from e
    except RecursionError as e:
        raise ApiError("Invalid JSON body: nested too deeply", "BadRequestError", 400) from e
    except web.RequestPayloadError as e:  # e.g. a Content-Encoding the body does not have
        raise ApiError(f"Cannot read the body: {e}", "BadRequestError", 400) from e
    except ValidationError as e:
        raise ApiError(str(e), "BadRequestError", 400) from e


def render_messages(
    messages: Sequence[ChatMessage], *, add_generation_prompt: bool, continue_final_message: bool
) -> str:
    try:
        return render_chat(
            [(m.role, m.text()) for m in messages],
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
        )
    except ValueError as e:  # the template refuses the two flags together, as vLLM's does
        raise ApiError(str(e), "BadRequestError", 400) from e


def natural_length(req: ChatRequest) -> int:
    """The tokens (one word each) the simulated model writes before it stops by itself: a
    continued message gets what it lacks of the usual length (at least one), so a reply
    cut and continued ends where the uncut one does."""
    begun = len(req.messages[-1].text().split()) if req.continue_final_message else 0
    return max(1, _NATURAL_WORDS - begun)


@dataclass(frozen=True)
class Prompt:
    ids: list[int]
    text: str  # what the model continues; a token-id prompt's decoded text
    from_text: bool  # given as text (vLLM's context-length error counts it differently)


def completion_prompt(req: CompletionRequest, tok: Tokenizer) -> Prompt:
    """A completion's one prompt, text or token ids; a 400 for an empty one or several
    (the simulator takes one per request)."""
    p = req.prompt
    if isinstance(p, list) and p and isinstance(p[0], list | str):
        if len(p) != 1:
            raise ApiError(
                "The simulator takes one prompt per request.", "BadRequestError", 400, "prompt"
            )
        p = p[0]
    if isinstance(p, str):
        ids, text = tok.encode(p, add_special_tokens=req.add_special_tokens), p
    else:
        ids = [int(t) for t in p if isinstance(t, int)]
        text = tok.decode(ids)
    if not ids:
        raise ApiError("Prompt cannot be empty", "BadRequestError", 400, "prompt")
    return Prompt(ids, text, from_text=isinstance(p, str))
