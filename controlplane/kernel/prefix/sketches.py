"""Typed wrappers over the Apache DataSketches sketches the prefix tracker uses.

``datasketches`` ships no type hints: the Protocols here name the part of each sketch
the tracker calls, and the functions build, merge, serialize and read them, so
``controlplane.kernel.prefix.tracker`` deals only in these types.

* **frequent items** (``frequent_strings_sketch``, Misra-Gries with a bounded map):
  which keys are heavy hitters, with lower and upper bounds on their counts;
* **distinct keys** (``update_tuple_sketch`` with a sum policy, ``2**lg_k`` keys): a
  sample of the distinct keys with their exact counts, for :func:`shared_estimate`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol, cast

import datasketches  # type: ignore[import-untyped]

FrequentItem = tuple[str, int, int, int]  # key, estimate, lower bound, upper bound


class FrequentSketch(Protocol):
    """The part of ``datasketches.frequent_strings_sketch`` used here."""

    @property
    def total_weight(self) -> int: ...

    @property
    def num_active_items(self) -> int: ...

    def update(self, item: str, weight: int = 1) -> None: ...

    def get_estimate(self, item: str) -> int: ...

    def get_lower_bound(self, item: str) -> int: ...

    def get_upper_bound(self, item: str) -> int: ...

    def get_frequent_items(self, err_type: object, threshold: int = 0) -> list[FrequentItem]: ...

    def merge(self, other: FrequentSketch) -> None: ...

    def serialize(self) -> bytes: ...


class DistinctSketch(Protocol):
    """``datasketches.update_tuple_sketch`` / ``compact_tuple_sketch`` with a sum policy."""

    def update(self, item: str, summary: int) -> None: ...

    def get_estimate(self) -> float: ...

    def __iter__(self) -> Iterator[tuple[int, int]]: ...  # (hash, summed count)

    def serialize(self, serde: object) -> bytes: ...  # compact sketches only


# with threshold 0, get_frequent_items answers every key the sketch tracks
ALL_ITEMS = datasketches.frequent_items_error_type.NO_FALSE_NEGATIVES


def frequent(lg_max_map_size: int) -> FrequentSketch:
    return cast(FrequentSketch, datasketches.frequent_strings_sketch(lg_max_map_size))


def frequent_from(data: bytes) -> FrequentSketch:
    return cast(FrequentSketch, datasketches.frequent_strings_sketch.deserialize(data))


_SUM = datasketches.AccumulatorPolicy()
_COUNTS_SERDE = datasketches.PyLongsSerDe()


def distinct(lg_k: int) -> DistinctSketch:
    return cast(DistinctSketch, datasketches.update_tuple_sketch(_SUM, lg_k))


def distinct_union(lg_k: int, parts: Sequence[DistinctSketch]) -> DistinctSketch:
    """The union of tuple sketches (counts of common keys summed), trimmed to ``2**lg_k``
    keys; the result is a compact sketch: it can be merged and read, not updated."""
    u = datasketches.tuple_union(_SUM, lg_k)
    for p in parts:
        u.update(p)
    return cast(DistinctSketch, u.get_result())


def distinct_bytes(lg_k: int, sketch: DistinctSketch) -> bytes:
    compact = distinct_union(lg_k, [sketch])
    return compact.serialize(_COUNTS_SERDE)


def distinct_from(data: bytes) -> DistinctSketch:
    return cast(
        DistinctSketch, datasketches.compact_tuple_sketch.deserialize(data, serde=_COUNTS_SERDE)
    )


def shared_estimate(sketch: DistinctSketch, at_least: int) -> float:
    """Distinct keys counted at least ``at_least`` times: the sketch's distinct estimate
    times the share of its sampled keys with such a count (a sampled key's count is
    exact: it was sampled from its first sighting on)."""
    counts = [c for _, c in sketch]
    if not counts:
        return 0.0
    return sketch.get_estimate() * sum(c >= at_least for c in counts) / len(counts)
