"""The checks `MemormStore` makes before any statement: its arguments, and each operation of a batch.

A batch is checked whole first (`check_op`): bad namespaces raise
`InvalidNamespace`, both memorm's `ValidationError` and LangGraph's
`InvalidNamespaceError`; other bad input `ValidationError`.  A put comes
out as a `CheckedPut`: the item to store with the texts to embed, or the
key to delete.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import date, datetime, time
from typing import cast

from memorm.compat._extras import missing_extra

try:
    from langchain_core.embeddings import Embeddings
    from langgraph.store.base import (
        GetOp,
        InvalidNamespaceError,
        ListNamespacesOp,
        MatchCondition,
        PutOp,
        SearchOp,
        TTLConfig,
        ensure_embeddings,
        get_text_at_path,
        tokenize_path,
    )
except ImportError as error:
    raise missing_extra(__name__, "langgraph", error) from error

from memorm.errors import ValidationError
from memorm.repositories.store_items import MAX_KEY_BYTES, NewItem, check_minutes
from memorm.search.filters import check_value_filter
from memorm.search.store_shapes import DISTANCES
from memorm.search.vector_index import check_build_options
from memorm.validation import MAX_DIMENSIONS, MAX_PAGE, check_json_object, check_text

__all__ = ["CheckedOp", "CheckedPut", "InvalidNamespace", "StoreIndex", "check_op", "check_ttl_config"]


class InvalidNamespace(ValidationError, InvalidNamespaceError):
    """A namespace LangGraph refuses: memorm's `ValidationError` and LangGraph's `InvalidNamespaceError`."""


def _labels(namespace: object, field: str) -> tuple[str, ...]:
    if not isinstance(namespace, (tuple, list)):
        raise InvalidNamespace(f"{field}: expected a tuple of labels, got {type(namespace).__name__}")
    for label in namespace:
        if not isinstance(label, str):
            raise InvalidNamespace(
                f"{field}: a label is a string, got {type(label).__name__} in {namespace!r}"
            )
        if not label or "." in label or "\x00" in label:
            raise InvalidNamespace(
                f"{field}: labels are non-empty, without '.' or NUL; got {label!r} in {namespace!r}"
            )
        check_text(label, field)
    joined = ".".join(namespace)
    if len(joined.encode()) > MAX_KEY_BYTES:
        raise InvalidNamespace(f"{field}: a namespace is at most {MAX_KEY_BYTES} bytes joined")
    return tuple(namespace)


def _key(key: object) -> str:
    if not isinstance(key, str):
        raise ValidationError(f"key: expected a string, got {type(key).__name__}")
    check_text(key, "key")
    if len(key.encode()) > MAX_KEY_BYTES:
        raise ValidationError(f"key: at most {MAX_KEY_BYTES} bytes")
    return key


def _count(value: object, field: str, *, minimum: int, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise ValidationError(f"{field}: expected an integer from {minimum} to {maximum}, got {value!r:.80}")
    return int(value)


def check_ttl_config(ttl: object) -> TTLConfig | None:
    """The store's `ttl` argument, checked: LangGraph's `TTLConfig`, or None."""
    if ttl is None:
        return None
    if not isinstance(ttl, Mapping):
        raise ValidationError(f"ttl: expected a TTLConfig dict, got {type(ttl).__name__}")
    known = {"default_ttl", "refresh_on_read", "sweep_interval_minutes", "omit_expired"}
    unknown = set(ttl) - known
    if unknown:
        raise ValidationError(f"ttl: unknown keys {sorted(map(str, unknown))}")
    config = cast("TTLConfig", dict(ttl))
    check_minutes(config.get("default_ttl"), "ttl.default_ttl")
    check_minutes(config.get("sweep_interval_minutes"), "ttl.sweep_interval_minutes")
    for flag in ("refresh_on_read", "omit_expired"):
        if not isinstance(config.get(flag, False), bool):
            raise ValidationError(f"ttl.{flag}: expected a bool")
    return config


class StoreIndex:
    """A checked `IndexConfig`: dimensions, embeddings, fields (tokenized) and distance."""

    def __init__(self, index: object) -> None:
        if not isinstance(index, Mapping):
            raise ValidationError(f"index: expected an IndexConfig dict, got {type(index).__name__}")
        self.dims = _count(index.get("dims"), "index.dims", minimum=1, maximum=MAX_DIMENSIONS)
        if index.get("embed") is None:
            raise ValidationError(
                "index.embed: expected Embeddings, an embedding function or a provider string"
            )
        try:
            embeddings = ensure_embeddings(index["embed"])
        except (ValueError, TypeError, ImportError) as error:
            raise ValidationError(f"index.embed: {error}") from error
        self.embeddings: Embeddings = embeddings
        fields = index.get("fields") or ["$"]
        if isinstance(fields, str) or not isinstance(fields, Sequence):
            raise ValidationError("index.fields: expected a list of field paths")
        self.fields = [(path, _field_path(path, "index.fields")) for path in fields]
        distance = index.get("distance_type", "cosine")
        if distance not in DISTANCES:
            raise ValidationError(f"index.distance_type: expected one of {', '.join(DISTANCES)}")
        self.distance: str = distance
        self.approximate, self.build = _ann_index(index.get("ann_index_config"))


_HNSW_DEFAULTS = {"m": 16, "ef_construction": 64}  # pgvector's, and `MemormStore.setup`'s


def _ann_index(config: object) -> tuple[bool, dict[str, int]]:
    """`ann_index_config` (`PostgresIndexConfig`'s), honoured or refused: whether `setup` builds
    an HNSW index, and its build options.

    `kind` "hnsw" (the default, with `m` and `ef_construction`) or "flat" (no index:
    every search exact).  `vector_type` "vector", or "halfvec", which memorm keeps as
    float32 too (as precise or more, twice the bytes; its indexes reach 2,000
    dimensions, not halfvec's 4,000).  What memorm does not build ("ivfflat",
    "bit" vectors, other keys) is refused, not ignored.
    """
    if config is None:
        return True, dict(_HNSW_DEFAULTS)
    field = "index.ann_index_config"
    if not isinstance(config, Mapping):
        raise ValidationError(f"{field}: expected a dict, got {type(config).__name__}")
    unknown = sorted(str(key) for key in config if key not in ("kind", "vector_type", "m", "ef_construction"))
    if unknown:
        raise ValidationError(f"{field}: unknown or unsupported keys {unknown} (memorm builds HNSW only)")
    if config.get("vector_type", "vector") not in ("vector", "halfvec"):
        raise ValidationError(
            f"{field}.vector_type: memorm keeps float32 vectors ('vector' or 'halfvec'), "
            f"not {config['vector_type']!r:.40}"
        )
    kind = config.get("kind", "hnsw")
    if kind == "flat":
        if "m" in config or "ef_construction" in config:
            raise ValidationError(f"{field}: m and ef_construction are HNSW's options, not a flat index's")
        return False, {}
    if kind != "hnsw":
        raise ValidationError(f"{field}.kind: expected 'hnsw' or 'flat' (memorm builds no {kind!r:.40})")
    options = {**_HNSW_DEFAULTS, **{key: config[key] for key in _HNSW_DEFAULTS if key in config}}
    try:
        m, ef_construction = check_build_options(options["m"], options["ef_construction"])
    except ValidationError as error:
        raise ValidationError(f"{field}: {error}") from None
    return True, {"m": m, "ef_construction": ef_construction}


def as_langgraph_writes(value: object) -> object:
    """`value` with its datetimes, dates, times and UUIDs as the strings LangGraph's SQLite store writes.

    That store writes values with orjson, which gives these as ISO 8601 text
    (as `isoformat()`) and UUIDs as their canonical text; read back, they are
    strings.  Anything else is left for the JSON check to refuse.
    """
    if isinstance(value, (datetime, date, time)):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, Mapping):
        return {key: as_langgraph_writes(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [as_langgraph_writes(item) for item in value]
    return value


def _field_path(path: object, field: str) -> str | list[str]:
    if not isinstance(path, str) or not path:
        raise ValidationError(f"{field}: a field path is a non-empty string, got {path!r:.80}")
    check_text(path, field)
    if path == "$":
        return path
    try:
        return tokenize_path(path)
    except (ValueError, IndexError) as error:
        raise ValidationError(f"{field}: {path!r} is not a field path: {error}") from error


class CheckedPut:
    """A checked PutOp: an item to store (with the texts to embed), or a key to delete."""

    __slots__ = ("item", "texts")

    def __init__(self, item: NewItem | tuple[str, str], texts: dict[str, str]) -> None:
        self.item = item
        self.texts = texts


CheckedOp = GetOp | SearchOp | ListNamespacesOp | CheckedPut  # an operation, checked (a put as `CheckedPut`)


def check_op(op: object, position: int, index: StoreIndex | None) -> CheckedOp:
    """`op`, the `position`-th of a batch, checked (a put as `CheckedPut`, its texts per `index`)."""
    where = f"ops[{position}]"
    if isinstance(op, GetOp):
        _labels(op.namespace, f"{where}.namespace")
        _key(op.key)
        if not isinstance(op.refresh_ttl, bool):
            raise ValidationError(f"{where}.refresh_ttl: expected a bool")
        return op
    if isinstance(op, PutOp):
        return _check_put(op, where, index)
    if isinstance(op, SearchOp):
        _labels(op.namespace_prefix, f"{where}.namespace_prefix")
        if op.filter is not None:
            check_value_filter(op.filter, f"{where}.filter")
        _count(op.limit, f"{where}.limit", minimum=0, maximum=MAX_PAGE)
        _count(op.offset, f"{where}.offset", minimum=0, maximum=2**62)
        if op.query is not None:
            check_text(op.query, f"{where}.query")
        if not isinstance(op.refresh_ttl, bool):
            raise ValidationError(f"{where}.refresh_ttl: expected a bool")
        return op
    if isinstance(op, ListNamespacesOp):
        for condition in op.match_conditions or ():
            if not isinstance(condition, MatchCondition) or condition.match_type not in (
                "prefix",
                "suffix",
            ):
                raise ValidationError(f"{where}.match_conditions: expected prefix or suffix MatchConditions")
            path = (condition.path,) if isinstance(condition.path, str) else condition.path
            _labels(path, f"{where}.match_conditions")
        if op.max_depth is not None:
            _count(op.max_depth, f"{where}.max_depth", minimum=1, maximum=2**31)
        _count(op.limit, f"{where}.limit", minimum=0, maximum=MAX_PAGE * 10)
        _count(op.offset, f"{where}.offset", minimum=0, maximum=2**62)
        return op
    raise ValidationError(f"{where}: unknown operation {type(op).__name__}")


def _check_put(op: PutOp, where: str, index: StoreIndex | None) -> CheckedPut:
    namespace = _labels(op.namespace, f"{where}.namespace")
    if not namespace:
        raise InvalidNamespace(f"{where}.namespace: a namespace has at least one label")
    joined, key = ".".join(namespace), _key(op.key)
    if op.value is None:
        return CheckedPut((joined, key), {})
    given = dict(op.value) if isinstance(op.value, Mapping) else op.value
    try:
        value = check_json_object(given, f"{where}.value")
    except ValidationError:  # perhaps only datetimes or UUIDs, which LangGraph's SQLite store takes
        value = check_json_object(as_langgraph_writes(given), f"{where}.value")
    ttl = check_minutes(op.ttl, f"{where}.ttl")
    texts: dict[str, str] = {}
    if index is not None and op.index is not False:
        if op.index is None:
            paths = index.fields
        elif isinstance(op.index, list):
            paths = [(path, _field_path(path, f"{where}.index")) for path in op.index]
        else:
            raise ValidationError(f"{where}.index: expected False, None or a list of field paths")
        for path, tokens in paths:
            found = get_text_at_path(value, tokens)
            for number, text in enumerate(found):
                texts[f"{path}.{number}" if len(found) > 1 else path] = text
    return CheckedPut(NewItem(joined, key, value, ttl), texts)
