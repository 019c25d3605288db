"""JSON codec for values stored in etcd: every value is one of the core models.

A value may carry fields this version does not know: a newer Tectonic wrote it (a
rolling upgrade runs neighbouring versions side by side, and a rollback reads what the
newer one wrote). Those are dropped on read, everything else is checked as strictly as
ever; the models themselves keep refusing unknown fields wherever else they are built
(API requests, config files), where an unknown field is a typo. A command
(``REFUSE_UNKNOWN_ON_READ``: an operator's intent, a drill request) is refused whole
instead: carried out without a field a newer API added (a new safety flag, say), it
would do something else than was asked.

Fields added later are written only while they differ from their default
(``Field(exclude_if=...)``): an older reader meets them only when they are in use.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)
_UNKNOWN_FIELD = "extra_forbidden"


class CorruptValue(ValueError):
    """A stored value does not parse as the model its key promises."""


def encode(model: BaseModel) -> bytes:
    return model.model_dump_json(exclude_defaults=False).encode()


def decode(cls: type[M], raw: bytes, key: str = "") -> M:
    try:
        return cls.model_validate_json(raw)
    except ValidationError as e:
        errors = e.errors()
        unknown = [err["loc"] for err in errors if err["type"] == _UNKNOWN_FIELD]
        # Other errors beside them may follow from them (a tuple's min_length when
        # every element had one): the second validation below judges what is left.
        if not unknown or getattr(cls, "REFUSE_UNKNOWN_ON_READ", False):
            raise CorruptValue(f"value at {key or '?'} is not a valid {cls.__name__}: {e}") from e
    try:
        data = json.loads(raw)
        for loc in unknown:
            _drop(data, loc)
        return cls.model_validate_json(json.dumps(data))
    # A path that is not the raw JSON's (a union member's name in it), or what is left
    # still invalid: corrupt, as read strictly.
    except (ValidationError, KeyError, IndexError, TypeError) as e:
        raise CorruptValue(f"value at {key or '?'} is not a valid {cls.__name__}: {e}") from e


def _drop(data: Any, loc: tuple[int | str, ...]) -> None:
    """Remove the field at ``loc`` (pydantic's error path) from parsed JSON ``data``."""
    *path, name = loc
    for step in path:
        data = data[step]
    del data[name]
