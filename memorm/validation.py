"""Input checks, run before anything is written.

Every public write goes through these, so bad input raises
:class:`memorm.errors.ValidationError` with a message that names the field,
and the database is never touched.  Both engines get the same rules, even where
one of them would have accepted the value (SQLite stores NUL bytes and NaN;
Postgres refuses them in text and jsonb).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

from memorm.errors import ValidationError

__all__ = [
    "MAX_JSON_DEPTH",
    "as_uuid",
    "check_aware",
    "check_duration",
    "check_json",
    "check_json_object",
    "check_limit",
    "check_text",
    "check_vector",
]

MAX_JSON_DEPTH = 64
MAX_PAGE = 1000
_FLOAT_ONLY = {float}
FLOAT32_MAX = 3.4028234663852886e38  # vectors are stored as float32 (pgvector's too)


def as_uuid(value: object, field: str = "id") -> uuid.UUID:
    """``value`` as a UUID; strings in any standard spelling are accepted."""
    if isinstance(value, uuid.UUID):
        return value
    if isinstance(value, str):
        try:
            return uuid.UUID(value)
        except ValueError:
            pass
    raise ValidationError(f"{field}: expected a UUID, got {value!r:.80}")


def check_text(value: object, field: str, *, optional: bool = False) -> str | None:
    """A ``str`` with no NUL characters and no lone surrogates."""
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise ValidationError(f"{field}: expected a string, got {type(value).__name__}")
    if "\x00" in value:
        raise ValidationError(f"{field}: NUL characters cannot be stored")
    if value.isascii():
        return value
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValidationError(f"{field}: not valid unicode ({exc.reason})") from None
    return value


def check_json(value: object, field: str, *, _depth: int = 0) -> None:
    """A JSON value: dicts with string keys, lists, strings, finite numbers, bools, None."""
    if _depth > MAX_JSON_DEPTH:
        raise ValidationError(f"{field}: nested deeper than {MAX_JSON_DEPTH} levels")
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, str):
        check_text(value, field)
    elif isinstance(value, int):
        # jsonb numbers are numerics, but JSON readers commonly choke past 2**63.
        if not -(2**63) <= value < 2**63:
            raise ValidationError(f"{field}: integer {value:.3g} does not fit in 64 bits")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValidationError(f"{field}: {value} is not a JSON number")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValidationError(f"{field}: keys must be strings, got {key!r:.40}")
            check_text(key, f"{field} key")
            check_json(item, f"{field}.{key}", _depth=_depth + 1)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            check_json(item, f"{field}[{index}]", _depth=_depth + 1)
    else:
        raise ValidationError(f"{field}: {type(value).__name__} is not JSON")


def check_json_object(value: object, field: str) -> dict[str, Any]:
    """A JSON object (dict); ``None`` becomes ``{}``."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValidationError(f"{field}: expected a dict, got {type(value).__name__}")
    check_json(value, field)
    return dict(value)


def check_aware(value: object, field: str) -> datetime:
    """A timezone-aware datetime."""
    if not isinstance(value, datetime):
        raise ValidationError(f"{field}: expected a datetime, got {type(value).__name__}")
    if value.tzinfo is timezone.utc:
        return value
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValidationError(f"{field}: naive datetime {value!r}; give it a timezone")
    return value


MAX_DURATION = timedelta(days=365 * 1000)


def check_duration(value: object, field: str) -> timedelta:
    """A positive span of time: a ``timedelta`` or a number of seconds, up to 1,000 years."""
    if isinstance(value, timedelta):
        span = value
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(value) or not 0 < value <= MAX_DURATION.total_seconds():
            raise ValidationError(f"{field}: expected a positive number of seconds, got {value!r}")
        span = timedelta(seconds=value)
    else:
        raise ValidationError(f"{field}: expected a timedelta or seconds, got {type(value).__name__}")
    if not timedelta(0) < span <= MAX_DURATION:
        raise ValidationError(f"{field}: expected a positive span of at most 1,000 years, got {span}")
    return span


def check_limit(limit: object, offset: object = 0, *, maximum: int = MAX_PAGE) -> None:
    """A page size in 1..maximum and a non-negative offset."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= maximum:
        raise ValidationError(f"limit: expected an integer from 1 to {maximum}, got {limit!r}")
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ValidationError(f"offset: expected a non-negative integer, got {offset!r}")


def check_vector(value: object, field: str = "embedding") -> list[float]:
    """A non-empty sequence of finite numbers, as a list of floats."""
    # The common case, cheaply (~7x faster): a list of floats in range; NaN and
    # infinity make the sum non-finite and fall through to the checks below.
    if (
        type(value) is list
        and 0 < len(value) <= 16000
        and set(map(type, value)) == _FLOAT_ONLY  # in C, unlike a generator over the items
        and math.isfinite(math.fsum(value))
        and min(value) >= -FLOAT32_MAX
        and max(value) <= FLOAT32_MAX
    ):
        return list(value)
    items: list[Any]
    if hasattr(value, "tolist"):  # numpy arrays
        items = value.tolist()
        if not isinstance(items, list):
            raise ValidationError(f"{field}: expected a one-dimensional vector")
    elif isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        items = list(value)
    else:
        raise ValidationError(f"{field}: expected a sequence of floats")
    if not items:
        raise ValidationError(f"{field}: empty vector")
    if len(items) > 16000:
        raise ValidationError(f"{field}: {len(items)} dimensions is more than 16,000")
    try:
        floats = [float(x) for x in items if not isinstance(x, (bool, str, bytes))]
    except (TypeError, ValueError):
        raise ValidationError(f"{field}: values must be numbers") from None
    if len(floats) != len(items):
        raise ValidationError(f"{field}: values must be numbers")
    if not all(-FLOAT32_MAX <= x <= FLOAT32_MAX for x in floats):  # also false for NaN
        raise ValidationError(f"{field}: NaN, infinity and values beyond float32 cannot be stored")
    return floats
