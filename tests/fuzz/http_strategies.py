"""Request strategies for the HTTP fuzzing (tests/fuzz/test_fuzz_http.py): bodies from
the real request shapes (``SEED_BODIES``), mutated, random JSON of every type (huge
numbers, NaN, lone surrogates, deep nesting), invalid UTF-8, no JSON at all; session and
priority headers; query strings with known and unknown names, encoded or raw.
"""

from __future__ import annotations

import copy
import json
import urllib.parse
from collections.abc import Sequence

from hypothesis import strategies as st

from tests.fuzz.mutations import keys_of, mutated, paths

MODEL = "tiny"
GOOD_COMPLETION = {"model": MODEL, "prompt": "Say hi", "max_tokens": 2}


HUGE_INTS = st.sampled_from([2**31, 2**63, 2**64 + 1, -(2**63) - 1, 10**400])
WEIRD_STRINGS = st.sampled_from(
    [
        "",
        " ",
        MODEL,
        "TINY",
        "tiny ",
        "nope",
        "\x00",
        "\u202e",
        "🦀",
        "\ud800",
        "\udfff",
        "a" * 10_000,
        "\\",
        '"',
        "null",
        "user",
        "system",
        "assistant",
        "tool",
        "text",
        "image_url",
        "auto",
        "none",
        "x" * 257,
        "a/b",
    ]
)
# Text with lone UTF-16 surrogates: valid JSON ("\ud800"), but no Unicode text.
SURROGATE_TEXT = st.lists(
    st.sampled_from(["a", " ", "é", "\ud800", "\udc00", "\udfff", "🦀"]), min_size=1, max_size=8
).map("".join)
SCALARS = st.one_of(
    st.none(),
    SURROGATE_TEXT,
    st.booleans(),
    st.integers(-5, 20),
    st.integers(),
    HUGE_INTS,
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    WEIRD_STRINGS,
)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda c: st.lists(c, max_size=5) | st.dictionaries(st.text(max_size=12), c, max_size=5),
    max_leaves=15,
)
SEED_BODIES: list[dict[str, object]] = [
    GOOD_COMPLETION,
    {"model": MODEL, "prompt": ["a b c", "d e"], "max_tokens": 3, "n": 2, "user": "sess-1"},
    {
        "model": MODEL,
        "prompt": [1, 2, 3, 4],
        "max_tokens": 1,
        "stream": True,
        "stream_options": {"include_usage": True},
        "cache_salt": "s1",
    },
    {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "Be terse."},
            {"role": "user", "content": "hi " * 100},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": [{"type": "text", "text": "and?"}]},
        ],
        "max_tokens": 3,
        "stream": False,
    },
    {
        "model": MODEL,
        "messages": [{"role": "user", "content": "weather?"}],
        "stream": True,
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
        "parallel_tool_calls": True,
        "max_completion_tokens": 2,
    },
]
BODY_KEYS = sorted({k for b in SEED_BODIES for k in keys_of(b)} | {"tool_choice", "temperature"})


def _at(doc: object, path: tuple[object, ...]) -> object:
    for part in path:
        doc = doc[part]  # type: ignore[index]
    return doc


def _dumps(doc: object) -> bytes:
    return json.dumps(doc, allow_nan=True).encode("utf-8", "surrogatepass")


CHAT_PATH, COMPLETIONS_PATH = "/v1/chat/completions", "/v1/completions"


@st.composite
def json_body(draw: st.DrawFn, path: str = "") -> bytes:
    """A request body: a real shape for ``path`` (any path's if "") mutated up to three
    times (or not at all), any JSON, or bytes that are no JSON."""
    kind = draw(st.sampled_from(["mutated", "mutated", "text", "json", "junk", "deep"]))
    if kind in ("mutated", "text"):
        shapes = SEED_BODIES
        if path in (CHAT_PATH, COMPLETIONS_PATH):
            shapes = [b for b in SEED_BODIES if ("messages" in b) == (path == CHAT_PATH)]
        doc: object = copy.deepcopy(draw(st.sampled_from(shapes)))
        if kind == "text":  # one of its strings replaced: where encoding bugs live
            where = draw(st.sampled_from([p for p in paths(doc) if isinstance(_at(doc, p), str)]))
            parent = _at(doc, where[:-1])
            parent[where[-1]] = draw(SURROGATE_TEXT | WEIRD_STRINGS | st.text())  # type: ignore[index]
            return _dumps(doc)
        for _ in range(draw(st.integers(0, 3))):
            doc = draw(mutated(doc, JSON_VALUES, BODY_KEYS))
        return _dumps(doc)
    if kind == "json":
        return _dumps(draw(JSON_VALUES))
    if kind == "deep":
        n = draw(st.integers(1, 150_000))  # under 1 MiB: size has its own tests
        inner = draw(st.sampled_from(["[", '{"a":']))
        close = "]" if inner == "[" else "}"
        return f'{{"model": "{MODEL}", "prompt": {inner * n}1{close * n}}}'.encode()
    return draw(
        st.one_of(
            st.binary(max_size=200),
            st.binary(min_size=1, max_size=20).map(
                lambda b: b'{"model": "tiny", "prompt": "' + b"\xff" + b + b'"}'
            ),  # invalid UTF-8 inside JSON
            st.text(max_size=100).map(str.encode),
            st.sampled_from(
                [b"", b"{", b"[]", b"null", b"NaN", b'{"model": NaN}', b"\xef\xbb\xbf{}"]
            ),
        )
    )


SESSION_IDS = st.one_of(
    st.text(
        st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters="/"),
        min_size=1,
        max_size=40,
    ),
    st.sampled_from(["a/b", "x" * 257, " ", "sess 1", "é", "\x7f", "_gateway_probe"]),
    st.binary(min_size=1, max_size=20)
    .map(lambda b: bytes(c for c in b if c >= 0x20 and c != 0x7F) or b"z")
    .map(lambda b: b.decode("latin-1")),
)
PRIORITIES = st.one_of(
    st.integers(-(10**6), 10**6).map(str),
    st.sampled_from(["", " 3 ", "-6", "1e3", "0x10", "٣", "9" * 5000, "NaN", "high", "-"]),
)


def _header_value(text: str) -> bytes:
    """``text`` as a header value HTTP allows (visible ASCII, space, obs-text): control
    characters are the parser's business (test_gateway_survives_protocol_level_...)."""
    raw = text.encode("latin-1", "replace")
    return bytes(c for c in raw if 0x20 <= c < 0x7F or c >= 0x80).strip()


@st.composite
def gateway_headers(draw: st.DrawFn) -> list[tuple[str, bytes]]:
    headers: list[tuple[str, bytes]] = []
    if draw(st.booleans()):
        headers.append(("Content-Type", b"application/json"))
    if draw(st.booleans()):
        headers.append(("x-session-id", _header_value(draw(SESSION_IDS))))
    if draw(st.booleans()):
        headers.append(("x-priority", _header_value(draw(PRIORITIES))))
    if draw(st.integers(0, 4)) == 0:
        name = draw(st.sampled_from(["Accept", "User-Agent", "X-Forwarded-For", "Authorization"]))
        headers.append((name, _header_value(draw(st.text(max_size=40)))))
    return headers


PRINTABLE = st.characters(min_codepoint=0x21, max_codepoint=0x7E)
QUERY_VALUES = st.one_of(
    st.text(max_size=20),
    st.integers(-(10**20), 10**20).map(str),
    st.sampled_from(
        [
            "",
            "east",
            "west",
            "mars",
            "0",
            "1",
            "1000",
            "1001",
            "-1",
            "abc",
            "1e3",
            "x" * 3000,
            "%ff",
            "%",
            "%zz",
            "true",
            "false",
            "\x00",
        ]
    ),
)


@st.composite
def query_string(draw: st.DrawFn, names: Sequence[str]) -> str:
    """``?...``: known and unknown names, repeated, encoded or raw (invalid escapes)."""
    pairs = draw(
        st.lists(
            st.tuples(st.sampled_from(names) | st.text(PRINTABLE, max_size=8), QUERY_VALUES),
            max_size=4,
        )
    )
    if not pairs:
        return ""
    if draw(st.booleans()):
        return "?" + urllib.parse.urlencode(pairs)
    raw = "&".join(f"{k}={v}" for k, v in pairs)
    return "?" + "".join(c if 0x21 <= ord(c) <= 0x7E else urllib.parse.quote(c) for c in raw)
