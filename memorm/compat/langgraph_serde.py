"""LangGraph's serializer held to memorm's rule: no code from data (extra `langgraph`).

LangGraph's `JsonPlusSerializer` keeps an object as the name of a callable
and its arguments, and by default calls whatever name a stored value holds.
[`StrictSerializer`][memorm.compat.langgraph_serde.StrictSerializer], the
default serializer of `MemormSaver` and of `memorm import-langgraph`,
builds only the types LangGraph's graphs store and those you allow, and
refuses a value that names anything else before any of it is built.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any, TypeVar

from memorm.compat._extras import missing_extra

try:
    from langgraph.checkpoint.base import BaseCheckpointSaver
    from langgraph.checkpoint.serde.base import SerializerProtocol
    from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
except ImportError as error:
    raise missing_extra(__name__, "langgraph", error) from error

from memorm import graph_values
from memorm.errors import ValidationError
from memorm.graph_values import AllowedType, check_value

__all__ = ["StrictSerializer", "check_serde", "reading_strictly"]

_Saver = TypeVar("_Saver", bound=BaseCheckpointSaver[Any])


class StrictSerializer(JsonPlusSerializer):
    """LangGraph's `JsonPlusSerializer` that refuses a stored value naming a callable not allowed.

    Writes as LangGraph's does (msgpack).  Reading, it first checks the
    value without building anything (`memorm.graph_values.check_value`):
    one that names a type neither LangGraph's graphs store (messages,
    documents, `Send`, `Command`, `Interrupt`, datetimes, UUIDs, sets…:
    `memorm.graph_values.SAFE_TYPES`) nor `allowed_types` lists raises
    [`UnsafeValueError`][memorm.errors.UnsafeValueError], as does a pickle.
    LangGraph's own strict serializer would hand back such a value's raw
    arguments instead, and the graph would run on them unaware.

    Args:
        allowed_types: your own types that graph state holds (pydantic
            models, dataclasses, enums, named tuples): classes,
            `(module, name)` pairs or `"module.Name"` strings.

    It is a `JsonPlusSerializer`, so LangGraph's allow-list hooks take it:
    `saver.with_allowlist(...)` (which `graph.compile()` calls with the
    state schema's types when `LANGGRAPH_STRICT_MSGPACK=true`) adds to its
    list, and `EncryptedSerializer(cipher, StrictSerializer(...))` checks
    each value once decrypted.

    Example:
        ```python
        from pydantic import BaseModel

        from memorm.compat.langgraph import StrictSerializer


        class Profile(BaseModel):
            name: str


        serde = StrictSerializer(allowed_types=[Profile])
        assert serde.loads_typed(serde.dumps_typed(Profile(name="ann"))) == Profile(name="ann")
        ```
    """

    def __init__(self, *, allowed_types: Iterable[AllowedType] | None = None) -> None:
        self.allowed_types = graph_values.allowed_types(allowed_types)
        names = sorted(self.allowed_types)
        # LangGraph's own allow-list, the same one, under memorm's check: the second lock on the door.
        super().__init__(
            pickle_fallback=False,
            allowed_msgpack_modules=names,
            allowed_json_modules=[(*module.split("."), name) for module, name in names],
        )

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        """The value `dumps_typed` stored as `data`, once checked.

        Raises:
            UnsafeValueError: the value names a callable that is not allowed, or is a pickle.
            ValidationError: `data` is not what its type says.
        """
        if not isinstance(data, tuple) or len(data) != 2:
            raise ValidationError("expected a (type, bytes) pair")
        check_value(data[0], data[1], self.allowed_types)
        return super().loads_typed(data)

    def with_msgpack_allowlist(self, extra_allowlist: Iterable[tuple[str, ...] | type]) -> StrictSerializer:
        """A serializer that also allows `extra_allowlist` (LangGraph's hook; `self` if none is new)."""
        merged = graph_values.allowed_types([*self.allowed_types, *extra_allowlist])  # type: ignore[list-item]
        return self if merged == self.allowed_types else StrictSerializer(allowed_types=merged)

    def __repr__(self) -> str:
        return f"StrictSerializer(allowed_types={len(self.allowed_types)} types)"


def check_serde(serde: SerializerProtocol) -> None:
    """Refuse a serializer a saver is given that would run code from data.

    A pickle fallback, or LangGraph's `JsonPlusSerializer` allowing any
    type (its default, unless `LANGGRAPH_STRICT_MSGPACK=true`), given
    alone or inside an `EncryptedSerializer`.

    Raises:
        ValidationError: naming the way out.
    """
    for inner in (serde, getattr(serde, "serde", None)):
        if getattr(inner, "pickle_fallback", False):
            raise ValidationError(
                "serde: a serializer with a pickle fallback is refused (memorm stores no pickle)"
            )
        permissive = getattr(inner, "_allowed_msgpack_modules", None) is True or (
            getattr(inner, "_allowed_json_modules", None) is True
        )
        if isinstance(inner, JsonPlusSerializer) and permissive:
            raise ValidationError(
                "serde: this JsonPlusSerializer calls any callable a stored value names (LangGraph's "
                "default); use memorm.compat.langgraph.StrictSerializer(allowed_types=[...]), alone "
                "or inside your EncryptedSerializer"
            )


def reading_strictly(saver: _Saver, allowed_types: Iterable[AllowedType] | None = None) -> _Saver:
    """`saver` reading through `StrictSerializer` (with `allowed_types` too): for copying from it.

    A shallow copy whose serializer is a `StrictSerializer` in place of
    LangGraph's `JsonPlusSerializer` (inside its `EncryptedSerializer`, if
    any), as LangGraph's own `with_allowlist` makes one; `saver` itself if
    its serializer is another (one of your own, read as it is).

    Raises:
        ValidationError: `allowed_types` is not a list of types.
    """
    serde = saver.serde
    encrypted = serde if isinstance(serde, EncryptedSerializer) else None
    inner = encrypted.serde if encrypted is not None else serde
    if not isinstance(inner, JsonPlusSerializer):
        return saver
    kept = inner.allowed_types if isinstance(inner, StrictSerializer) else graph_values.SAFE_TYPES
    strict = StrictSerializer(allowed_types=[*kept, *graph_values.allowed_types(allowed_types)])
    reader = copy.copy(saver)
    reader.serde = strict if encrypted is None else EncryptedSerializer(encrypted.cipher, strict)
    return reader
