"""Checks of archival memory's input: model names and shapes, float16 ranges, passages to add.

Shared by the passage repository's reads and writes and by whole-database
copies (`memorm.transfer.checks`), so a value refused in one is refused in all.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from memorm.errors import ValidationError
from memorm.ids import uuid7
from memorm.models import ArchivalPassage
from memorm.validation import (
    as_uuid,
    check_aware,
    check_fields,
    check_int,
    check_json_object,
    check_name,
    check_text,
    check_vector,
    shown,
)

__all__ = [
    "FLOAT16_MAX",
    "PassageInput",
    "check_half",
    "check_item",
    "check_model_dim",
    "check_model_name",
    "check_shape",
]

_PRECISIONS = ("float32", "float16")
_ITEM_FIELDS = frozenset(("text", "embedding", "meta", "embedding_model", "id", "created_at"))
FLOAT16_MAX = 65504.0

PassageInput = ArchivalPassage | Mapping[str, Any]


def check_model_name(name: object) -> str:
    """An embedding model's name, checked as other names are."""
    return check_name(name, "embedding_model")


def check_shape(dim: object, precision: object) -> None:
    """An embedding model's shape: 1 to 16,000 dimensions, stored at one of `_PRECISIONS`."""
    check_int(dim, "dim", minimum=1, maximum=16000)
    _check_precision(precision)


def check_half(vectors: Iterable[Sequence[float]]) -> None:
    """Values a float16 model can store (larger ones would become infinity)."""
    for vector in vectors:
        if max(map(abs, vector), default=0.0) > FLOAT16_MAX:
            raise ValidationError(f"embedding: a float16 model stores values up to {FLOAT16_MAX:g}")


def check_model_dim(name: str, stored: int, given: int) -> None:
    """A `given`-d vector fits model `name`, which stores `stored`-d ones; else `ValidationError`."""
    if stored != given:
        raise ValidationError(f"embedding: model {name!r} stores {stored}-d vectors, got {given}")


def _check_precision(precision: object) -> str:
    if not isinstance(precision, str) or precision not in _PRECISIONS:
        raise ValidationError(f"precision: {shown(precision)} is not one of {', '.join(_PRECISIONS)}")
    return precision


def check_item(item: object, index: int) -> dict[str, Any]:
    """The checked fields of one passage to add; the repository adds its owner, agent and times."""
    where = f"items[{index}]"
    if isinstance(item, ArchivalPassage):
        given: Mapping[str, Any] = {
            "text": item.text,
            "embedding": item.vector,
            "embedding_model": item.embedding_model,
            "meta": item.meta,
            "id": item.id,
            "created_at": item.created_at,
        }
    elif isinstance(item, Mapping):
        given = check_fields(item, _ITEM_FIELDS, where)
    else:
        raise ValidationError(f"{where}: expected a dict or an ArchivalPassage, got {type(item).__name__}")
    created_at = given.get("created_at")
    if created_at is not None:
        check_aware(created_at, f"{where}.created_at")
    passage_id = given.get("id")
    return {
        "id": uuid7() if passage_id is None else as_uuid(passage_id, f"{where}.id"),
        "created_at": created_at,
        "meta": check_json_object(given.get("meta"), f"{where}.meta", keep=True),
        "text": check_text(given.get("text"), f"{where}.text"),
        "embedding": check_vector(given.get("embedding"), f"{where}.embedding"),
        "embedding_half": None,
        "embedding_model": check_model_name(given.get("embedding_model", "default")),
    }
