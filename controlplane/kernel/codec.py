"""JSON codec for values stored in etcd: every value is one of the core models."""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


class CorruptValue(ValueError):
    """A stored value does not parse as the model its key promises."""


def encode(model: BaseModel) -> bytes:
    return model.model_dump_json(exclude_defaults=False).encode()


def decode(cls: type[M], raw: bytes, key: str = "") -> M:
    try:
        return cls.model_validate_json(raw)
    except ValidationError as e:
        raise CorruptValue(f"value at {key or '?'} is not a valid {cls.__name__}: {e}") from e
