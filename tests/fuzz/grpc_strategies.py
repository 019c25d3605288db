"""Request strategies for the gRPC fuzzing (tests/fuzz/test_fuzz_grpc.py): messages of
any type generated from its proto descriptor (huge, unicode and control-character
strings, negative / NaN / infinite numbers, unknown enum values, long repeated and map
fields), mixed with values that pass the first checks (region names, a scenario the
drill catalog lists, a valid replay payload) so that the fuzzing reaches the deeper
ones; raw bytes, valid protobuf wire format or not; and a padding message of any size.
"""

from __future__ import annotations

import json
import math
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import strategies as st

from controlplane.kernel.prefix.identity import PromptKind
from controlplane.kernel.prefix.prewarm import ReplayPayload
from tests.integration.cp_harness import REGIONS

SCENARIOS = ("region-blackout", "latency-injection")


# ---- values that reach the deeper checks, and strategies from the descriptors --------------


def replay_payload(i: int = 0, model: str = "tiny") -> ReplayPayload:
    return ReplayPayload(
        key=f"k{i:03d}",
        kind=PromptKind.TEXT,
        model=model,
        prompt=f"tenant {i} " + "rule " * 40,
        blocks=2,
        block_size=16,
        tokens=32,
        tokens_exact=False,
    )


WORDS = st.sampled_from(
    [
        *REGIONS,
        *SCENARIOS,
        "",
        " ",
        "\t",
        "mars",
        "EAST",
        " east",
        "east\n",
        "east/..",
        "agent:east",
        "gateway:g1",
        "probe:controlplane",
        "fuzz",
        "alice",
        "operator",
        "s-1",
        "sess-42",
        "a/b",
        "../x",
        "%2F",
        "x" * 64,
        "x" * 65,
        "x" * 128,
        "x" * 129,
        "x" * 256,
        "x" * 257,
        "x" * 1024,
        "x" * 1025,
        "\x00",
        "\x7f",
        "\x1b[2J",
        "\u202e",
        "🦀",
        "Zürich",
        "'; DROP",
        "{region}",
        "nan",
        "-1",
    ]
)
TEXT = st.one_of(
    WORDS,
    WORDS,  # twice as likely: most of the fuzzing should get past the first check
    st.text(max_size=30),
    st.text(alphabet=st.characters(codec="utf-8"), max_size=300),
    st.integers(0, 100_000).map(lambda n: "y" * n),  # around the request size limit
)
JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
    max_leaves=10,
)
PAYLOAD_FIELDS = sorted(replay_payload().model_dump(mode="json"))


@st.composite
def payload_bytes(draw: st.DrawFn) -> bytes:
    """A replay payload for Prewarm: valid, mutated, JSON of anything, or no JSON at all."""
    kind = draw(st.sampled_from(["valid", "mutated", "json", "binary"]))
    if kind == "binary":
        return draw(st.binary(max_size=200))
    if kind == "json":
        return json.dumps(draw(JSONISH)).encode()
    data = replay_payload(draw(st.integers(0, 999)), draw(st.sampled_from(["tiny", "nope"])))
    doc = data.model_dump(mode="json")
    if kind == "mutated":
        key = draw(st.sampled_from(PAYLOAD_FIELDS))
        if draw(st.booleans()):
            doc.pop(key)
        else:
            doc[key] = draw(JSONISH)
    return json.dumps(doc).encode()


UINT32 = st.one_of(
    st.sampled_from([0, 1, 2, 16, 20, 50, 256, 257, 500, 501, 1000, 1001, 2**31, 2**32 - 1]),
    st.integers(0, 2**32 - 1),
)
DOUBLE = st.one_of(
    st.sampled_from([0.0, -0.0, 1.0, 30.0, 600.0, 600.0001, -1.0, 1e308, math.nan, math.inf]),
    st.floats(allow_nan=True, allow_infinity=True),
)
_T = FieldDescriptor


REGION_NAMES = st.sampled_from(REGIONS)
# Values that pass a field's first check, by field name: three times as likely as TEXT,
# so that most calls reach the checks after it.
HINTS: dict[str, st.SearchStrategy[str]] = {
    "region": REGION_NAMES,
    "source": REGION_NAMES,
    "home": REGION_NAMES,
    "to": REGION_NAMES,
    "reason": st.sampled_from(["drill", "maintenance window", "fuzz"]),
    "actor": st.sampled_from(["alice", "fuzz", ""]),
    "session_id": st.text(
        st.characters(min_codepoint=0x20, max_codepoint=0x7E, exclude_characters="/"),
        min_size=1,
        max_size=40,
    ),
    "observer": st.sampled_from(["agent:east", "gateway:g1", "probe:controlplane", "x@y"]),
    "scenario": st.sampled_from(SCENARIOS),
    "failover_id": st.text("abcdef0123456789-", min_size=1, max_size=40),
    "intent_id": st.text("abcdef0123456789", min_size=12, max_size=12),
}


def _scalar(f: FieldDescriptor, tame: bool) -> st.SearchStrategy[Any]:
    """Values of one field. ``tame``: ones that pass its first check, where this file
    knows it (``HINTS``); NaN and infinities stay in, they are numbers all the same."""
    if f.type == _T.TYPE_STRING:
        hint = HINTS.get(f.name)
        if tame:
            return hint if hint is not None else st.text(max_size=20)
        return TEXT if hint is None else st.one_of(hint, TEXT)
    if f.type == _T.TYPE_BYTES:
        return payload_bytes() if f.name == "payloads" else st.binary(max_size=300)
    if f.type == _T.TYPE_BOOL:
        return st.booleans()
    if f.type in (_T.TYPE_DOUBLE, _T.TYPE_FLOAT):
        return DOUBLE
    if f.type in (_T.TYPE_UINT32, _T.TYPE_FIXED32):
        return st.integers(0, 30) if tame else UINT32
    if f.type in (_T.TYPE_UINT64, _T.TYPE_FIXED64):
        return st.integers(0, 30) if tame else st.integers(0, 2**64 - 1) | UINT32
    if f.type in (_T.TYPE_INT32, _T.TYPE_SINT32, _T.TYPE_SFIXED32):
        return st.integers(-(2**31), 2**31 - 1)
    if f.type in (_T.TYPE_INT64, _T.TYPE_SINT64, _T.TYPE_SFIXED64):
        return st.integers(-(2**63), 2**63 - 1)
    if f.type == _T.TYPE_ENUM:  # proto3 enums are open: unknown numbers are kept
        # 0 (UNSPECIFIED) comes as "unset", and from the integers.
        known = st.sampled_from([v.number for v in f.enum_type.values if v.number])
        return known if tame else known | st.integers(-(2**31), 2**31 - 1)
    if f.type == _T.TYPE_MESSAGE:
        return message_strategy(f.message_type)
    raise NotImplementedError(f"no strategy for {f.full_name} (type {f.type})")


def _field(f: FieldDescriptor, tame: bool) -> st.SearchStrategy[Any]:
    if f.message_type is not None and f.message_type.GetOptions().map_entry:
        key, value = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
        small = st.dictionaries(_scalar(key, tame), _scalar(value, tame), max_size=6)
        if tame:
            return small
        big = st.integers(60, 300).map(lambda n: {f"k{i}": 0 for i in range(n)})
        return small | big  # over any per-request bound
    if f.is_repeated:
        item = _scalar(f, tame)
        if tame:
            return st.lists(item, max_size=4)
        many = st.integers(100, 3000).map(
            lambda n: ["east"] * n if f.type == _T.TYPE_STRING else [b"{}"] * n
        )
        return st.lists(item, max_size=6) | st.lists(item, min_size=15, max_size=40) | many
    return _scalar(f, tame)


def message_strategy(desc: Descriptor) -> st.SearchStrategy[Message]:
    """Messages of type ``desc``: tame ones (each field likely to pass its first check,
    so the calls reach the later ones) or wild ones (any value the field's type allows);
    each field set or left out. Raises NotImplementedError for a field type it cannot
    generate."""
    cls = GetMessageClass(desc)

    def build(tame: bool) -> st.SearchStrategy[Message]:
        fields = {f.name: _field(f, tame) for f in desc.fields}
        if not tame:  # each field set three times in four
            fields = {name: st.one_of(v, v, v, st.none()) for name, v in fields.items()}
        return st.fixed_dictionaries(fields).map(
            lambda kw: cls(**{k: v for k, v in kw.items() if v is not None})
        )

    return st.one_of(build(tame=True), build(tame=False))


# ---- raw bytes ----------------------------------------------------------------------------


def _wire_field(number: int, wire: int, body: bytes) -> bytes:
    def varint(n: int) -> bytes:
        out = bytearray()
        while True:
            b, n = n & 0x7F, n >> 7
            out.append(b | (0x80 if n else 0))
            if not n:
                return bytes(out)

    tag = varint(number << 3 | wire)
    if wire == 2:
        return tag + varint(len(body)) + body
    return tag + body


WIRE = st.lists(
    st.tuples(st.integers(1, 20), st.sampled_from([0, 1, 2, 5]), st.binary(max_size=40)).map(
        lambda t: _wire_field(
            t[0], t[1], {0: b"\x01", 1: b"\x00" * 8, 2: t[2], 5: b"\x00" * 4}[t[1]]
        )
    ),
    max_size=8,
).map(b"".join)  # valid wire format: known field numbers with any wire type, unknown ones
RAW = st.one_of(st.binary(max_size=400), WIRE)


def padding(size: int) -> bytes:
    """A ``size``-byte message of any type: one unknown length-delimited field."""
    overhead = len(_wire_field(99, 2, b"x" * size)) - size
    msg = _wire_field(99, 2, b"x" * (size - overhead))
    return msg if len(msg) == size else _wire_field(99, 2, b"x" * (size - overhead + 1))
