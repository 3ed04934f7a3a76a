"""One exported row, checked as the public API checks its input, before an import writes anything.

The rules are the API's own functions (`memorm.validation` and the
repositories' input checks), applied to the columns the API takes from
callers; the columns it assigns itself (counters, sequence numbers, the
agent of a message) get the storage rules every column has: not null where
the schema says so, integers that fit their column, text without NUL or
lone surrogates, finite JSON.  Checks that need other rows (a message's
agent is its session's, a vector has its model's shape) live in
`memorm.transfer.references`.  A graph-state value (LangGraph's
serialized checkpoints, writes and channel values) must name no callable
but the types its check allows (`memorm.graph_values`): a file must not
make the process that loads it run code.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

import sqlalchemy as sa

from memorm.errors import UnsafeValueError, ValidationError
from memorm.graph_values import SAFE_TYPES, check_value
from memorm.models import fields
from memorm.repositories.agents import _check_core_memory, _check_retention
from memorm.repositories.checkpoints import check_state_key
from memorm.repositories.message_input import _GIVEN, check_message
from memorm.repositories.passage_checks import check_half as _check_half
from memorm.repositories.passage_checks import check_model_name as _check_model_name
from memorm.repositories.passage_checks import check_shape as _check_shape
from memorm.repositories.sessions import _check_key
from memorm.repositories.store_items import MAX_KEY_BYTES, check_minutes
from memorm.tenancy import check_tenant
from memorm.transfer.rows import column_names
from memorm.types import JSONType, VectorType
from memorm.validation import check_int, check_json, check_json_object, check_name, check_text, check_vector

__all__ = ["check_row", "vector_of"]

Values = dict[str, Any]
Rule = Callable[[Any, str], object]


def _fits(bits: int) -> Rule:
    def check(value: Any, name: str) -> None:
        check_int(value, name, minimum=-(2 ** (bits - 1)), maximum=2 ** (bits - 1) - 1)

    return check


def _text(length: int | None) -> Rule:
    def check(value: Any, name: str) -> None:
        check_text(value, name)
        if length is not None and len(value) > length:
            raise ValidationError(f"{name}: longer than {length} characters")

    return check


def _rule(kind: sa.types.TypeEngine[Any]) -> Rule | None:
    """The storage rule of a column type (None: the codec's decoding was the check)."""
    if isinstance(kind, sa.Integer):  # BigInteger is one too
        return _fits(64 if isinstance(kind, sa.BigInteger) else 32)
    if isinstance(kind, sa.String):  # Text too
        return _text(kind.length)
    if isinstance(kind, JSONType):
        return check_json
    if isinstance(kind, VectorType):
        return check_vector
    return None


@cache
def _rules(table: sa.Table) -> tuple[tuple[str, bool, Rule | None], ...]:
    # Derived columns (full-text search words) are not in a file: memorm computes them on insert.
    return tuple((column.name, bool(column.nullable), _rule(column.type)) for column in fields(table))


def _storage(table: sa.Table, values: Values) -> None:
    """What every column needs to be stored alike on both engines."""
    for name, nullable, rule in _rules(table):
        value = values[name]
        if value is None:
            if not nullable:
                raise ValidationError(f"{name}: must not be null")
        elif rule is not None:
            rule(value, name)


def _agent(values: Values) -> None:
    check_name(values["name"], "name")
    _check_core_memory(values["core_memory"])
    check_json_object(values["llm_config"], "llm_config")
    _check_retention(values["retention"])
    check_int(values["version"], "version", minimum=1)
    check_int(values["archive_version"], "archive_version", minimum=0)


def _model(values: Values) -> None:
    _check_model_name(values["name"])
    _check_shape(values["dim"], values["precision"])


def _session(values: Values) -> None:
    if values["key"] is not None:
        _check_key(values["key"])
    check_int(values["next_seq"], "next_seq", minimum=1)


def _message(values: Values) -> None:
    try:
        check_message({name: values[name] for name in _GIVEN}, 0)
    except ValidationError as error:  # its fields are named for a batch: messages[0].role
        raise ValidationError(str(error).removeprefix("messages[0].")) from None


def vector_of(values: Values) -> tuple[list[float], bool]:
    """A passage row's vector, and whether it is the half-precision column that holds it."""
    full, half = values["embedding"], values["embedding_half"]
    if (full is None) == (half is None):
        raise ValidationError("embedding: exactly one of embedding and embedding_half holds the vector")
    return (full, False) if half is None else (half, True)


def _passage(values: Values) -> None:
    _check_model_name(values["embedding_model"])
    vector, half = vector_of(values)
    if half:
        _check_half([vector])
    check_int(values["embedding_dim"], "embedding_dim", minimum=1)


_STATE_KEYS = ("checkpoint_ns", "checkpoint_id", "parent_checkpoint_id", "task_id", "channel", "version")


def _graph_state(values: Values) -> None:
    """A graph-state row: opaque values (bytes, as decoded); its keys as `MemormSaver` takes them.

    A key SQLite holds but Postgres would refuse (longer than a btree entry
    may be) is refused on both, so an export moves to either engine.
    """
    if values["value"] is not None and not isinstance(values["value"], bytes):
        raise ValidationError("value: expected bytes")
    for name in _STATE_KEYS:
        if values.get(name) is not None:
            check_state_key(values[name], name)


def _graph_value(values: Values, allowed: frozenset[tuple[str, str]]) -> None:
    """What a graph-state value names, read without building it (see `memorm.graph_values`)."""
    try:
        check_value(values["value_type"], values["value"], allowed)
    except UnsafeValueError as error:
        raise UnsafeValueError(f"value: {error}") from None
    except ValidationError as error:
        raise ValidationError(f"value: {error}") from None


def _store_key(values: Values) -> None:
    """An item's (or a vector's) namespace and key, as `MemormStore` takes them.

    The namespace is LangGraph's labels joined by ".": each non-empty.
    """
    namespace, key = values["namespace"], values["key"]
    if "" in namespace.split("."):
        raise ValidationError(f"namespace: labels are non-empty, joined by '.'; got {namespace!r:.80}")
    if len(namespace.encode()) > MAX_KEY_BYTES:
        raise ValidationError(f"namespace: at most {MAX_KEY_BYTES} bytes")
    if len(key.encode()) > MAX_KEY_BYTES:
        raise ValidationError(f"key: at most {MAX_KEY_BYTES} bytes")


def _store_item(values: Values) -> None:
    _store_key(values)
    check_json_object(values["value"], "value")
    check_minutes(values["ttl_minutes"], "ttl_minutes")
    if (values["expires_at"] is None) != (values["ttl_minutes"] is None):
        raise ValidationError("expires_at: an item expires if and only if it has ttl_minutes")


def _store_vector(values: Values) -> None:
    _store_key(values)
    if not values["field"]:
        raise ValidationError("field: expected a field path, got ''")


_CHECKS: dict[str, Callable[[Values], None]] = {
    "agents": _agent,
    "embedding_models": _model,
    "sessions": _session,
    "messages": _message,
    "archival_passages": _passage,
    "graph_checkpoints": _graph_state,
    "graph_writes": _graph_state,
    "graph_blobs": _graph_state,
    "graph_store_items": _store_item,
    "graph_store_vectors": _store_vector,
}
_GRAPH_VALUES = frozenset({"graph_checkpoints", "graph_writes", "graph_blobs"})


def check_row(
    table: sa.Table, row: tuple[Any, ...], *, graph_types: frozenset[tuple[str, str]] = SAFE_TYPES
) -> Values:
    """`row` of `table` as a dict by column, checked; `ValidationError` names the column.

    Args:
        graph_types: the `(module, name)`s a graph-state value may name
            (`memorm.graph_values.allowed_types`).

    Raises:
        ValidationError: `table.column: problem` (an `UnsafeValueError`
            for a graph-state value naming a callable not allowed).
    """
    values = dict(zip(column_names(table), row, strict=True))
    try:
        _storage(table, values)
        check_tenant(values["tenant"])
        if "meta" in values:  # every table but graph_writes, graph_blobs and the store's
            check_json_object(values["meta"], "meta")
        _CHECKS[table.name](values)
        if table.name in _GRAPH_VALUES:
            _graph_value(values, graph_types)
    except ValidationError as error:
        kind = UnsafeValueError if isinstance(error, UnsafeValueError) else ValidationError
        raise kind(f"{table.name}.{error}") from None
    return values
