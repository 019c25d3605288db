"""Which characters of an OpenAI-style request route it: the first ``chars`` characters
of its prompt. The gateway keys its replica ring by them and the region agent's
pre-warm must pick the same replica for the same prompt, so both read them here.
"""

from __future__ import annotations


class BadRequest(Exception):
    """A request refused before it is forwarded (4xx): the gateway answers with it."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param


def first_prompt(prompt: object) -> object:
    """A batch is routed (and counted) by its first prompt."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], list | str):
        return prompt[0]
    return prompt


def completion_prefix(prompt: object, chars: int) -> str:
    """The first ``chars`` characters of a completion prompt (text, token ids, or a
    batch of either: its first prompt)."""
    if prompt is None:
        raise BadRequest("'prompt' is required", param="prompt")
    prompt = first_prompt(prompt)
    if isinstance(prompt, str):
        return prompt[:chars]
    if isinstance(prompt, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in prompt
    ):
        # Token ids: their decimal text is a faithful, cheap prefix identity.
        out: list[str] = []
        size = 0
        for t in prompt:
            if size >= chars:
                break
            s = str(t)
            out.append(s)
            size += len(s) + 1
        return " ".join(out)[:chars]
    raise BadRequest(
        "'prompt' must be a string, a list of token ids, or a list of either", param="prompt"
    )


def chat_prefix(messages: object, chars: int) -> str:
    """The first ``chars`` characters of the conversation as ``role\\ncontent\\n`` lines."""
    return chat_text(chat_messages(messages), chars)


def chat_messages(messages: object) -> tuple[tuple[str, str], ...]:
    """Validated ``(role, text content)`` pairs of a chat request."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' is required and must be a non-empty list", param="messages")
    out: list[tuple[str, str]] = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(role := m.get("role"), str):
            raise BadRequest(
                f"messages[{i}] must be an object with a string 'role'", param="messages"
            )
        out.append((role, _content_text(m.get("content"))))
    return tuple(out)


def chat_text(messages: tuple[tuple[str, str], ...], chars: int) -> str:
    parts: list[str] = []
    size = 0
    for role, content in messages:
        if size >= chars:
            break
        parts.append(f"{role}\n{content}\n")
        size += len(parts[-1])
    return "".join(parts)[:chars]


def _content_text(content: object) -> str:
    """A message's text: the content, or its text parts (images and other parts left
    out) joined by newlines, as vLLM joins them for a string-content chat template."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(p.get("text", ""))
            for p in content
            if isinstance(p, dict) and p.get("type", "text") == "text"
        )
    return ""
