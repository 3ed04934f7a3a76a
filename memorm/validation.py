"""Input checks, run before anything is written.

Every public call goes through these before its first statement, so bad input
raises [`memorm.errors.ValidationError`][memorm.errors.ValidationError] with a message that names the
field, and the database is never touched.  Both engines get the same rules,
even where one of them would have accepted the value (SQLite stores NUL bytes,
NaN and 64-bit integers in 32-bit columns; Postgres refuses them).

The limits (documented in `docs/concepts.md`, "Limits"):

* integers stored in or compared with 32-bit columns (`token_count`,
  `max_tokens`, `expected_version`): `INT32_MIN` to `INT32_MAX`;
* counts and offsets (`offset`, `keep_last`): 0 to `MAX_COUNT`,
  which leaves room for `offset + limit` in a 64-bit SQL integer;
* seq cursors (`before_seq`, `after_seq`, `delete_after`'s `seq`): any
  64-bit integer; a seq is 32-bit, so a cursor past either end selects all or nothing;
* timestamps, given or computed (`created_at + ttl`): `MIN_TIME` to
  `MAX_TIME`, a day inside Python's `datetime` range, so any accepted
  instant converts to any time zone, and Postgres never stores ±infinity;
* vectors: 1 to 16,000 finite numbers within float32;
* names in unique indexes (agent names, session keys, embedding model names):
  at most `MAX_NAME` characters, which fit a Postgres index entry.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import date, datetime, time, timedelta, timezone
from typing import Any

from memorm.errors import ValidationError

__all__ = [
    "INT32_MAX",
    "INT32_MIN",
    "INT64_MAX",
    "INT64_MIN",
    "MAX_COUNT",
    "MAX_DATE",
    "MAX_JSON_DEPTH",
    "MAX_NAME",
    "MAX_TIME",
    "MIN_DATE",
    "MIN_TIME",
    "as_instant",
    "as_uuid",
    "check_aware",
    "check_duration",
    "check_fields",
    "check_flag",
    "check_int",
    "check_json",
    "check_json_object",
    "check_limit",
    "check_list",
    "check_name",
    "check_text",
    "check_vector",
    "later",
    "shown",
]

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1  # Postgres integer: seq, token_count, version
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # Postgres bigint, SQLite's integers
MAX_COUNT = 2**62  # offsets and counts: offset + limit (+ a margin) stays within 64 bits
MIN_DATE, MAX_DATE = date(1, 1, 2), date(9999, 12, 30)
MIN_TIME = datetime.combine(MIN_DATE, time.min, tzinfo=timezone.utc)
MAX_TIME = datetime.combine(MAX_DATE, time.max, tzinfo=timezone.utc)
MAX_JSON_DEPTH = 64
MAX_PAGE = 1000
MAX_NAME = 512  # characters: 4 bytes each in UTF-8 still fit a Postgres btree entry (~2,700 bytes)
MAX_DIMENSIONS = 16000
# The longest vector whose distances to any other stay finite in float32, in which
# pgvector sums (|a - b|^2 <= (2 * length)^2 <= float32's largest value).
MAX_VECTOR_LENGTH = 9.2e18
FLOAT32_MAX = 3.4028234663852886e38  # vectors are stored as float32 (pgvector's too)
_HUGE = 10**40  # integers shown by their size in messages (repr of 10**5000 raises)


def shown(value: object, width: int = 80) -> str:
    """A short `repr` of `value` for an error message; never raises."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= _HUGE:
        return f"an integer of {value.bit_length()} bits"
    try:
        text = repr(value)
    except Exception:  # a hostile __repr__, or an int past Python's digit limit
        text = f"a {type(value).__name__}"
    return text if len(text) <= width else text[: width - 1] + "…"


def check_int(value: object, field: str, *, minimum: int = INT32_MIN, maximum: int = INT32_MAX) -> int:
    """An `int` (not a bool) from `minimum` to `maximum`; 32-bit by default."""
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise ValidationError(
            f"{field}: expected an integer from {minimum:,} to {maximum:,}, got {shown(value)}"
        )
    return value


def check_flag(value: object, field: str) -> bool:
    """A `bool`: `if array:` would raise for a numpy array, and `"no"` would mean yes."""
    if not isinstance(value, bool):
        raise ValidationError(f"{field}: expected True or False, got {type(value).__name__}")
    return value


def check_list(value: object, field: str, what: str) -> list[Any]:
    """The items of a list, tuple or other iterable (not a string, bytes or a dict)."""
    if isinstance(value, (str, bytes, bytearray, Mapping)) or not isinstance(value, Iterable):
        raise ValidationError(f"{field}: expected a list of {what}, got {type(value).__name__}")
    return list(value)


def as_uuid(value: object, field: str = "id") -> uuid.UUID:
    """`value` as a UUID; strings in any standard spelling are accepted."""
    if isinstance(value, uuid.UUID):
        return value
    if isinstance(value, str):
        try:
            return uuid.UUID(value)
        except ValueError:
            pass
    raise ValidationError(f"{field}: expected a UUID, got {shown(value)}")


def check_text(value: object, field: str, *, optional: bool = False) -> str | None:
    """A `str` with no NUL characters and no lone surrogates."""
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


def check_name(value: object, field: str, *, blank: bool = False) -> str:
    """A name in a unique index: non-blank (with `blank`, non-empty), at most 512 characters."""
    checked = check_text(value, field) or ""
    if not (checked if blank else checked.strip()):
        raise ValidationError(f"{field}: must not be {'empty' if blank else 'blank'}")
    if len(checked) > MAX_NAME:
        raise ValidationError(
            f"{field}: {len(checked):,} characters, more than the {MAX_NAME} a name may have"
        )
    return checked


def check_json(value: object, field: str) -> None:
    """A JSON value: dicts with string keys, lists, strings, finite numbers, bools, None."""
    if not _plain_json(value, 0):  # the common case, checked without naming every field on the way
        _check_json(value, field, 0)  # finds what is wrong, and says where; or passes a subclass


def _check_json(value: object, field: str, _depth: int) -> None:
    if _depth > MAX_JSON_DEPTH:
        raise ValidationError(f"{field}: nested deeper than {MAX_JSON_DEPTH} levels")
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, str):
        check_text(value, field)
    elif isinstance(value, int):
        # jsonb numbers are numerics, but JSON readers commonly choke past 2**63.
        if not INT64_MIN <= value <= INT64_MAX:
            raise ValidationError(f"{field}: {shown(value, 40)} does not fit in 64 bits")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValidationError(f"{field}: {value} is not a JSON number")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValidationError(f"{field}: keys must be strings, got {shown(key, 40)}")
            check_text(key, f"{field} key")
            _check_json(item, f"{field}.{key}", _depth + 1)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _check_json(item, f"{field}[{index}]", _depth + 1)
    else:
        raise ValidationError(f"{field}: {type(value).__name__} is not JSON")


def _plain_json(value: object, depth: int) -> bool:
    """Whether `value` is plainly valid JSON (built-in types only); False leaves it to `check_json`.

    The same rules as `check_json`'s, without the field names it builds for
    its messages on the way down, and with scalars checked inline in the
    loop over their container (a call per container, not per value).
    """
    if type(value) is dict:
        for key in value:
            if type(key) is not str or "\x00" in key or not (key.isascii() or _encodes(key)):
                return False
        return (depth < MAX_JSON_DEPTH or not value) and _plain_values(value.values(), depth + 1)
    if type(value) is list or type(value) is tuple:
        return (depth < MAX_JSON_DEPTH or not value) and _plain_values(value, depth + 1)
    return type(value) in _SCALARS and _plain_values((value,), depth)


def _plain_values(values: Iterable[object], depth: int) -> bool:
    for item in values:
        if type(item) is str:
            if "\x00" in item or not (item.isascii() or _encodes(item)):
                return False
        elif type(item) is int:
            if not INT64_MIN <= item <= INT64_MAX:
                return False
        elif type(item) is float:
            if not math.isfinite(item):
                return False
        elif (
            item is not None
            and type(item) is not bool
            and not (type(item) in _CONTAINERS and _plain_json(item, depth))
        ):
            return False
    return True


_SCALARS = frozenset((str, int, float, bool, type(None)))
_CONTAINERS = frozenset((dict, list, tuple))


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_fields(given: Mapping[str, Any], known: frozenset[str], where: str) -> Mapping[str, Any]:
    """`given` (a dict of a row's fields), if it names none but `known`."""
    if not known.issuperset(given):
        unknown = set(given) - known
        raise ValidationError(f"{where}: unknown fields {', '.join(sorted(map(str, unknown)))}")
    return given


def check_json_object(value: object, field: str, *, keep: bool = False) -> dict[str, Any]:
    """A JSON object (dict); `None` becomes `{}`.

    A copy, unless `keep`: then a plain dict is returned as given, as a
    row object built with it keeps it (`Message(meta=d).meta is d`).
    """
    if keep and type(value) is dict:
        check_json(value, field)
        return value
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValidationError(f"{field}: expected a dict, got {type(value).__name__}")
    check_json(value, field)
    return dict(value)


def check_aware(value: object, field: str) -> datetime:
    """A timezone-aware datetime from `MIN_TIME` to `MAX_TIME` (compared in UTC)."""
    if not isinstance(value, datetime):
        raise ValidationError(f"{field}: expected a datetime, got {type(value).__name__}")
    try:
        naive = value.tzinfo is not timezone.utc and value.utcoffset() is None
        # Aware comparisons never overflow, even where converting to UTC would.
        inside = naive or MIN_TIME <= value <= MAX_TIME
    except (ValueError, TypeError, OverflowError) as error:  # a tzinfo returning nonsense
        raise ValidationError(f"{field}: its tzinfo gives no usable UTC offset ({error})") from None
    if naive:
        raise ValidationError(f"{field}: naive datetime {value!r}; give it a timezone")
    if not inside:
        raise ValidationError(f"{field}: {value.isoformat()} is outside {_RANGE}")
    return value


_RANGE = f"the range memorm stores, {MIN_DATE} 00:00 to {MAX_DATE} 23:59:59.999999 UTC"


def later(instant: datetime, span: timedelta, field: str) -> datetime:
    """`instant + span`, a checked instant plus a checked span; it must stay in range too."""
    try:
        result = instant + span
    except OverflowError:
        result = None
    if result is None or not MIN_TIME <= result <= MAX_TIME:
        raise ValidationError(f"{field}: {instant.isoformat()} + {span} is outside {_RANGE}")
    return result


def as_instant(value: object, field: str, *, end: bool) -> tuple[datetime, bool]:
    """A datetime bound, and whether it is inclusive.  A date `end` covers that whole day (UTC).

    Dates are held to the timestamp range too: `MIN_DATE` to `MAX_DATE`.
    """
    if isinstance(value, datetime):
        return check_aware(value, field), True
    if isinstance(value, date):
        if not MIN_DATE <= value <= MAX_DATE:
            raise ValidationError(f"{field}: {value.isoformat()} is outside {_RANGE}")
        start = datetime.combine(value, time.min, tzinfo=timezone.utc)
        if not end:
            return start, True
        # The next midnight, exclusive; past the last day, the last instant, inclusive.
        return (MAX_TIME, True) if value == MAX_DATE else (start + timedelta(days=1), False)
    raise ValidationError(f"{field}: expected a datetime or a date, got {type(value).__name__}")


MAX_DURATION = timedelta(days=365 * 1000)


def check_duration(value: object, field: str) -> timedelta:
    """A positive span of time: a `timedelta` or a number of seconds, up to 1,000 years."""
    if isinstance(value, timedelta):
        span = value
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        # Compared before any conversion: math.isfinite(10**400) would overflow.
        if not 0 < value <= MAX_DURATION.total_seconds():  # also false for NaN
            raise ValidationError(f"{field}: expected a positive number of seconds, got {shown(value)}")
        span = timedelta(seconds=value)
    else:
        raise ValidationError(f"{field}: expected a timedelta or seconds, got {type(value).__name__}")
    if not timedelta(0) < span <= MAX_DURATION:
        raise ValidationError(f"{field}: expected a positive span of at most 1,000 years, got {span}")
    return span


def check_limit(limit: object, offset: object = 0, *, maximum: int = MAX_PAGE) -> None:
    """A page size in 1..maximum and an offset in 0..`MAX_COUNT`."""
    check_int(limit, "limit", minimum=1, maximum=maximum)
    check_int(offset, "offset", minimum=0, maximum=MAX_COUNT)


def check_vector(value: object, field: str = "embedding") -> list[float]:
    """A sequence of 1 to 16,000 finite numbers within float32, as a list of floats.

    A list of floats is returned as given, not copied (as a row object built
    with it keeps it); anything else becomes a new list.
    """
    # The common case, cheaply: a list of floats of a storable length.  hypot
    # (in C, and immune to overflow) is NaN or infinite for NaN and infinities,
    # which fall through to the checks below.
    if (
        type(value) is list
        and 0 < len(value) <= MAX_DIMENSIONS
        and list(map(type, value)).count(float) == len(value)  # in C, unlike a loop over the items
        and math.hypot(*value) <= MAX_VECTOR_LENGTH
    ):
        return value
    items: list[Any]
    if callable(getattr(value, "tolist", None)):  # numpy arrays
        items = value.tolist()  # type: ignore[attr-defined]
        if not isinstance(items, list):
            raise ValidationError(f"{field}: expected a one-dimensional vector")
    elif isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        items = list(value)
    else:
        raise ValidationError(f"{field}: expected a sequence of floats")
    if not items:
        raise ValidationError(f"{field}: empty vector")
    if len(items) > MAX_DIMENSIONS:
        raise ValidationError(f"{field}: {len(items)} dimensions is more than 16,000")
    try:
        floats = [float(x) for x in items if not isinstance(x, (bool, str, bytes))]
    except (TypeError, ValueError, OverflowError):  # OverflowError: an int past float's range
        raise ValidationError(f"{field}: values must be numbers within float32") from None
    if len(floats) != len(items):
        raise ValidationError(f"{field}: values must be numbers")
    if not all(-FLOAT32_MAX <= x <= FLOAT32_MAX for x in floats):  # also false for NaN
        raise ValidationError(f"{field}: NaN, infinity and values beyond float32 cannot be stored")
    if not math.hypot(*floats) <= MAX_VECTOR_LENGTH:
        raise ValidationError(
            f"{field}: a vector longer than {MAX_VECTOR_LENGTH:.3g} cannot be stored "
            "(distances to it would overflow float32, in which pgvector computes them)"
        )
    return floats
