"""Structural mutations of a parsed document (YAML or JSON data: dicts, lists, scalars),
shared by the file and HTTP-body fuzzing: drop a key or an item, replace a value with
one of another type, duplicate an item, add a key, copy one node over another."""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence

from hypothesis import strategies as st

Path = tuple[object, ...]
OPS = ("delete", "replace", "retype", "duplicate", "add", "swap")


def paths(node: object, here: Path = ()) -> Iterator[Path]:
    """Every node's path, the root's (``()``) first."""
    yield here
    if isinstance(node, dict):
        for k, v in node.items():
            yield from paths(v, (*here, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from paths(v, (*here, i))


def keys_of(node: object) -> Iterator[str]:
    """Every mapping key in ``node``, at any depth."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield str(k)
            yield from keys_of(v)
    elif isinstance(node, list):
        for v in node:
            yield from keys_of(v)


def _get(doc: object, path: Path) -> object:
    for part in path:
        doc = doc[part]  # type: ignore[index]
    return doc


def _set(doc: object, path: Path, value: object) -> object:
    """``doc`` with the node at ``path`` replaced (the root too)."""
    if not path:
        return value
    parent = _get(doc, path[:-1])
    parent[path[-1]] = value  # type: ignore[index]
    return doc


def _retyped(value: object) -> list[object]:
    """The same value, spelled as other types."""
    options: list[object] = [str(value), [value], {"value": value}, None, ""]
    if isinstance(value, bool | int | float):
        options += [-value, value * 10**9, float("nan"), str(value) + "s"]
    if isinstance(value, str):
        options += [value.upper(), value * 50, len(value), value + "\x00"]
    if isinstance(value, list):
        options += [value[0] if value else 0, value * 3, {str(i): v for i, v in enumerate(value)}]
    if isinstance(value, dict):
        options += [
            list(value.values()),
            list(value),
            {str(k).upper(): v for k, v in value.items()},
        ]
    return options


@st.composite
def mutated(
    draw: st.DrawFn,
    doc: object,
    values: st.SearchStrategy[object],
    known_keys: Sequence[str],
) -> object:
    """``doc`` (not changed) with one mutation; new values from ``values``, added keys
    often from ``known_keys`` (a key a loader knows, in the wrong place)."""
    doc = copy.deepcopy(doc)
    every = list(paths(doc))
    path = draw(st.sampled_from(every))
    node = _get(doc, path)
    op = draw(st.sampled_from(OPS))
    if op == "delete" and path:
        parent = _get(doc, path[:-1])
        del parent[path[-1]]  # type: ignore[attr-defined]
        return doc
    if op == "duplicate" and isinstance(node, list) and node:
        i = draw(st.integers(0, len(node) - 1))
        node.insert(i, copy.deepcopy(node[i]))
        return doc
    if op == "add" and isinstance(node, dict):
        key = draw(st.sampled_from(known_keys) | st.text(max_size=12))
        node[key] = draw(values)
        return doc
    if op == "swap":
        other = _get(doc, draw(st.sampled_from(every)))
        return _set(doc, path, copy.deepcopy(other))
    if op == "retype":
        return _set(doc, path, draw(st.sampled_from(_retyped(node))))
    return _set(doc, path, draw(values))
