"""Text of audit and event ``details``: every value a string any client can parse.

A structured value (a mapping or a list) is JSON text with sorted keys, so it starts
with ``{`` or ``[``; a scalar stays a plain string (numbers in decimal, booleans
``true``/``false``). Never a Python repr: a Node or Go client reads these from
``WatchEvents``, ``GetHistory`` and the audit log in etcd.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping

from controlplane.kernel.model import Routing


def _finite(value: object) -> object:
    """Non-finite floats as the strings stored records use ("Infinity", "NaN"):
    JSON has no such numbers, and JavaScript's JSON.parse refuses Python's."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, Mapping):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def json_text(value: object) -> str:
    """``value`` (mappings, lists, scalars) as compact JSON text with sorted keys."""
    return json.dumps(_finite(value), sort_keys=True, separators=(",", ":"), allow_nan=False)


def json_list(items: Iterable[str]) -> str:
    return json_text(list(items))


def flag(value: bool) -> str:
    return "true" if value else "false"


def routing_text(routes: Mapping[str, Routing]) -> str:
    """``{region: {target: weight}}`` as one JSON text (the ``routing`` detail)."""
    return json_text({r: dict(v.targets) for r, v in routes.items()})


def routing_details(routes: Mapping[str, Routing]) -> dict[str, str]:
    """One detail per changed routing key: ``region -> JSON {target: weight}`` (the
    ``routing_switch`` event), so the details decode to ``{region: {target: weight}}``."""
    return {r: json_text(dict(v.targets)) for r, v in sorted(routes.items())}
