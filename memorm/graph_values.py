"""What stored LangGraph values may name, checked without running any of them.

LangGraph's serializer (`JsonPlusSerializer`) writes an object msgpack has
no form for as an extension naming a module, a callable in it and the
arguments to call it with; its reader imports and calls that name.  So
whoever can write graph state (a row of the database, a line of an export,
a LangGraph checkpoint database being imported) could make the process that
loads it call `os.system`.  memorm reads each value first, building
nothing (with LangGraph's own msgpack reader, whose hook sees every
extension LangGraph's would; without LangGraph, with `memorm.msgpack_read`),
and refuses ([`UnsafeValueError`][memorm.errors.UnsafeValueError]) one that
names anything but:

* `SAFE_TYPES`: the types LangGraph's graphs store (LangChain's messages
  and documents, `Send`, `Command`, `Interrupt`, datetimes, UUIDs, sets…),
  LangGraph's own strict list (`LANGGRAPH_STRICT_MSGPACK`);
* the types a caller allows (`allowed_types`): a graph's own pydantic
  models, dataclasses, enums, named tuples.

Values from before LangGraph used msgpack (kind `"json"`) are held to the same
list, and the LangChain objects in them must be chat messages.  Pickle is
refused.  The other kinds pass: they name nothing (`"null"`, `"bytes"`,
memorm's `"empty"`), or are encrypted (`"msgpack+aes"`: the saver's
`EncryptedSerializer` decrypts them, and its inner `StrictSerializer`
checks them then), or are a custom serializer's, which only it reads.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from types import ModuleType
from typing import Any

from memorm.errors import UnsafeValueError, ValidationError
from memorm.msgpack_read import Ext, MalformedError, read
from memorm.validation import shown

__all__ = ["SAFE_METHODS", "SAFE_TYPES", "AllowedType", "allowed_types", "check_value"]

_ormsgpack: ModuleType | None
try:
    import ormsgpack as _ormsgpack  # LangGraph's msgpack: there whenever LangGraph is
except ImportError:  # pragma: no cover (memorm without its langgraph extra)
    _ormsgpack = None

AllowedType = type | tuple[str, str] | str
"""A type to allow: the class, its `(module, name)`, or `"module.Name"`."""

Allowed = frozenset[tuple[str, str]]

# LangGraph's SAFE_MSGPACK_TYPES (langgraph-checkpoint 4.3), as a list to read: a test holds them equal.
SAFE_TYPES: frozenset[tuple[str, str]] = frozenset(
    {
        ("datetime", "datetime"),
        ("datetime", "date"),
        ("datetime", "time"),
        ("datetime", "timedelta"),
        ("datetime", "timezone"),
        ("uuid", "UUID"),
        ("decimal", "Decimal"),
        ("builtins", "set"),
        ("builtins", "frozenset"),
        ("collections", "deque"),
        ("ipaddress", "IPv4Address"),
        ("ipaddress", "IPv4Interface"),
        ("ipaddress", "IPv4Network"),
        ("ipaddress", "IPv6Address"),
        ("ipaddress", "IPv6Interface"),
        ("ipaddress", "IPv6Network"),
        ("pathlib", "Path"),
        ("pathlib", "PosixPath"),
        ("pathlib", "WindowsPath"),
        ("pathlib._local", "Path"),  # Python 3.13
        ("pathlib._local", "PosixPath"),
        ("pathlib._local", "WindowsPath"),
        ("zoneinfo", "ZoneInfo"),
        ("re", "compile"),
        ("langchain_core.messages.base", "BaseMessage"),
        ("langchain_core.messages.base", "BaseMessageChunk"),
        ("langchain_core.messages.human", "HumanMessage"),
        ("langchain_core.messages.human", "HumanMessageChunk"),
        ("langchain_core.messages.ai", "AIMessage"),
        ("langchain_core.messages.ai", "AIMessageChunk"),
        ("langchain_core.messages.system", "SystemMessage"),
        ("langchain_core.messages.system", "SystemMessageChunk"),
        ("langchain_core.messages.chat", "ChatMessage"),
        ("langchain_core.messages.chat", "ChatMessageChunk"),
        ("langchain_core.messages.tool", "ToolMessage"),
        ("langchain_core.messages.tool", "ToolMessageChunk"),
        ("langchain_core.messages.function", "FunctionMessage"),
        ("langchain_core.messages.function", "FunctionMessageChunk"),
        ("langchain_core.messages.modifier", "RemoveMessage"),
        ("langchain_core.documents.base", "Document"),
        ("langgraph.types", "Send"),
        ("langgraph.types", "TimeoutPolicy"),
        ("langgraph.types", "Interrupt"),
        ("langgraph.types", "Command"),
        ("langgraph.types", "StateSnapshot"),
        ("langgraph.types", "PregelTask"),
        ("langgraph.types", "Overwrite"),
        ("langgraph.store.base", "Item"),
        ("langgraph.store.base", "GetOp"),
    }
)
"""The `(module, name)`s LangGraph's graphs store: what LangGraph's strict mode builds."""

SAFE_METHODS: frozenset[tuple[str, str, str]] = frozenset({("datetime", "datetime", "fromisoformat")})
"""The `(module, name, method)`s a value may call (how LangGraph stores a datetime)."""

# LangGraph's extension codes (`langgraph.checkpoint.serde.jsonplus`).
_BUILT = {0, 1, 2, 4, 5}  # [module, name, args…]: a call of module.name
_METHOD = 3  # [module, name, arg, method]: a call of module.name.method
_ARRAY = 6  # a numpy array: dtype, shape, order, bytes; names nothing itself
_SNAPSHOT = 7  # a DeltaChannel's snapshot: a msgpack value

_LANGCHAIN_MESSAGES = frozenset(
    name for module, name in SAFE_TYPES if module.startswith("langchain_core.messages")
)
_HINT = "allow a type of your own with allowed_types=, or --allow-type MODULE.NAME on the import commands"


def allowed_types(
    types: Iterable[AllowedType] | None, field: str = "allowed_types"
) -> frozenset[tuple[str, str]]:
    """`SAFE_TYPES` and `types`, as `(module, name)` pairs.

    Args:
        types: classes, `(module, name)` pairs or `"module.Name"` strings
            (the name a refused value's message shows).

    Raises:
        ValidationError: an entry is none of these.
    """
    if types is None:
        return SAFE_TYPES
    if isinstance(types, (str, bytes)) or not isinstance(types, Iterable):
        raise ValidationError(f"{field}: expected a list of types, got {shown(types)}")
    found = set(SAFE_TYPES)
    for index, item in enumerate(types):
        found.add(_pair(item, f"{field}[{index}]"))
    return frozenset(found)


def _pair(item: object, field: str) -> tuple[str, str]:
    if isinstance(item, type):
        return item.__module__, item.__name__
    if isinstance(item, str):
        module, _, name = item.rpartition(".")
        pair: object = (module, name)
    else:
        pair = tuple(item) if isinstance(item, (tuple, list)) else None
    if (
        isinstance(pair, tuple)
        and len(pair) == 2
        and all(isinstance(part, str) and part and "\x00" not in part for part in pair)
    ):
        return pair[0], pair[1]
    raise ValidationError(
        f"{field}: expected a class, a (module, name) pair or 'module.Name', got {shown(item)}"
    )


def check_value(kind: object, data: object, allowed: frozenset[tuple[str, str]] = SAFE_TYPES) -> None:
    """Refuse a stored value (`kind`, `data`: what `dumps_typed` gave) that names what `allowed` lacks.

    Reads the value without importing or calling anything; `allowed` is
    `SAFE_TYPES` or what `allowed_types` made.

    Raises:
        UnsafeValueError: the value names a callable not allowed, or is a pickle.
        ValidationError: the value is not what its kind says (no msgpack, no JSON).
    """
    if not isinstance(kind, str):
        raise ValidationError(f"value type: expected a string, got {shown(kind)}")
    base = kind.split("+", 1)[0]
    if base == "pickle":
        raise UnsafeValueError("a pickle, which memorm never loads (unpickling runs code)")
    if "+" in kind or base not in ("msgpack", "json"):
        return  # names nothing, or encrypted (checked once decrypted), or a custom serializer's
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ValidationError(f"a {kind} value must be bytes, got {shown(data)}")
    if base == "json":
        _check_json(bytes(data), allowed)
        return
    if _ormsgpack is None:
        _check_msgpack_here(data, allowed)
    else:
        _check_msgpack(_ormsgpack, data, allowed)


def _refused(dotted: str) -> UnsafeValueError:
    return UnsafeValueError(
        f"it names {dotted}, neither a type LangGraph's graphs store nor one allowed, "
        f"so memorm will not call it ({_HINT})"
    )


def _check_msgpack(reader: ModuleType, data: bytes | bytearray | memoryview, allowed: Allowed) -> None:
    """Check with the very reader LangGraph loads with, so both see the same extensions.

    The hook is called for every extension, however deep, before the value
    holding it is complete; it builds nothing and returns None.
    """
    refused: list[ValidationError] = []

    def hook(code: int, payload: bytes) -> None:
        # LangGraph reads every payload with its hook, even of types that name nothing (arrays).
        found = reader.unpackb(payload, ext_hook=hook, option=reader.OPT_NON_STR_KEYS)
        try:
            _named(code, found, allowed)
        except ValidationError as error:
            refused.append(error)  # ormsgpack raises its own ValueError in place of a hook's
            raise

    try:
        reader.unpackb(data, ext_hook=hook, option=reader.OPT_NON_STR_KEYS)
    except ValueError as error:  # ormsgpack's MsgpackDecodeError is one
        if refused:
            raise refused[0] from None
        raise ValidationError(f"not the msgpack its type says: {error}") from None
    except RecursionError:
        raise ValidationError("not the msgpack its type says: nested too deeply") from None


def _check_msgpack_here(data: bytes | bytearray | memoryview, allowed: Allowed) -> None:
    """The same check without ormsgpack (memorm without LangGraph), with `memorm.msgpack_read`."""
    # A stack, not recursion: the reader bounds the nesting of one payload, this the payloads in payloads.
    try:
        stack: list[tuple[Any, int]] = [(read(data), 0)]
        while stack:
            value, level = stack.pop()
            if isinstance(value, Ext):
                payload = read(value.data, level + 1)
                _named(value.code, payload, allowed)
                stack.append((payload, level + 1))
            elif isinstance(value, list):
                stack += ((item, level) for item in value)
            elif isinstance(value, tuple):  # a map's (key, value)
                stack += ((value[0], level), (value[1], level))
    except MalformedError as error:
        raise ValidationError(f"not the msgpack its type says: {error}") from None


def _named(code: int, payload: Any, allowed: Allowed) -> None:
    """Refuse an extension whose payload (read; what it holds is checked apart) names what is not allowed."""
    if code in (_ARRAY, _SNAPSHOT):
        return  # a numpy array's dtype, shape and bytes; a snapshot's value: names nothing themselves
    if code not in _BUILT and code != _METHOD:
        raise UnsafeValueError(f"it holds a msgpack extension of type {code}, which LangGraph does not write")
    named = (0, 1, 3) if code == _METHOD else (0, 1)
    if not (
        isinstance(payload, list)
        and len(payload) >= max(3, *named)
        and all(isinstance(payload[at], str) for at in named)
    ):
        raise ValidationError(f"a msgpack extension of type {code} that LangGraph would not write")
    module, name = payload[0], payload[1]
    if code == _METHOD:
        if (module, name, payload[3]) not in SAFE_METHODS:
            raise _refused(f"{module}.{name}.{payload[3]}")
    elif (module, name) not in allowed:
        raise _refused(f"{module}.{name}")


def _check_json(data: bytes, allowed: frozenset[tuple[str, str]]) -> None:
    """LangChain's `lc` envelopes in a `"json"` value: lc 2 names a callable, lc 1 a LangChain class."""
    try:
        stack: list[Any] = [json.loads(data)]
    except (ValueError, RecursionError):
        raise ValidationError("not the JSON its type says") from None
    while stack:
        value = stack.pop()
        if isinstance(value, list):
            stack += value
        elif isinstance(value, dict):
            _envelope(value, allowed)
            stack += value.values()


def _envelope(value: dict[str, Any], allowed: frozenset[tuple[str, str]]) -> None:
    """Refuse what LangGraph's reviver (and LangChain's, under it) would build, unless allowed."""
    lc, kind, ids = value.get("lc"), value.get("type"), value.get("id")
    if lc == 2 and kind == "constructor" and ids is not None:
        if not (isinstance(ids, list) and len(ids) >= 2 and all(isinstance(part, str) for part in ids)):
            raise ValidationError(f"a LangChain envelope whose id is {shown(ids)}")
        if (".".join(ids[:-1]), ids[-1]) not in allowed:
            raise _refused(".".join(ids))
    elif lc == 1 and kind in ("constructor", "secret", "not_implemented"):
        if kind != "constructor":
            raise UnsafeValueError(
                f"it holds a LangChain {kind} envelope, which LangGraph's graphs do not store"
            )
        names = ids if isinstance(ids, list) and all(isinstance(part, str) for part in ids) else None
        if (
            not names
            or names[0] not in ("langchain", "langchain_core")
            or names[-1] not in _LANGCHAIN_MESSAGES
        ):
            # LangGraph hands these to LangChain's reviver, which builds any LangChain class: messages only.
            raise _refused(f"the LangChain object {shown(ids)}")
