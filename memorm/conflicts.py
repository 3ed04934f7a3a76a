"""What a taken unique value means, in words, the same on both engines.

The database says which constraint a write broke (Postgres by name, SQLite
by its columns); `conflict_message` turns that into a sentence about the
application's objects (`an agent named 'sam' exists`) instead of the
driver's (`duplicate key value violates unique constraint "uq_agents_name"`).
A caller that knows the values written names them; the translation of a
bare driver error, which may not know them, says what kind of value it was.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache
from typing import Any

import sqlalchemy as sa

__all__ = ["conflict_message", "unique_key_of", "unique_keys"]

Key = tuple[str, tuple[str, ...]]  # (table, columns) of a unique constraint or index

# (table, columns) -> (with the values, without them)
_SAID: dict[Key, tuple[str, str]] = {
    ("agents", ("name",)): ("an agent named {name!r} exists", "an agent with this name exists"),
    ("agent_names", ("name",)): ("an agent named {name!r} exists", "an agent with this name exists"),
    ("sessions", ("agent_id", "key")): (
        "agent {agent_id} has a session with key {key!r}",
        "the agent has a session with this key",
    ),
    ("embedding_models", ("agent_id", "name")): (
        "agent {agent_id} has an embedding model named {name!r}",
        "the agent has an embedding model with this name",
    ),
    ("messages", ("agent_id", "session_id", "seq")): (
        "session {session_id} has a message numbered {seq}",
        "the session has a message with this number",
    ),
}
_NOUNS = {
    "agents": "an agent",
    "sessions": "a session",
    "messages": "a message",
    "archival_passages": "an archival passage",
    "embedding_models": "an embedding model",
}
_SQLITE_UNIQUE = re.compile(r"UNIQUE constraint failed: (\w+)\.(\w+(?:, \w+\.\w+)*)")
_PG_UNIQUE = re.compile(r'violates unique constraint "([^"]+)"')
_SHARD_ID = re.compile(r"_\d+$")


def unique_keys(table: sa.Table) -> list[tuple[str, ...]]:
    """The column tuples `table` keeps unique: its primary key, unique constraints and indexes."""
    keys = [tuple(column.name for column in table.primary_key.columns)]
    for constraint in table.constraints:
        if isinstance(constraint, sa.UniqueConstraint):
            keys.append(tuple(column.name for column in constraint.columns))
    for index in table.indexes:
        if index.unique:
            keys.append(tuple(column.name for column in index.columns))
    return keys


@cache
def _by_name() -> dict[str, Key]:
    """Postgres constraint and index names (memorm's naming convention) -> their key."""
    from memorm.models import metadata

    names: dict[str, Key] = {}
    for table in metadata.sorted_tables:
        primary, *others = unique_keys(table)
        names[f"pk_{table.name}"] = (table.name, primary)
        for columns in others:
            joined = "_".join(columns)
            for prefix in ("uq", "ix"):
                names[f"{prefix}_{table.name}_{joined}"] = (table.name, columns)
    return names


def unique_key_of(error: BaseException) -> Key | None:
    """The unique constraint a driver's error says was broken, if it says so.

    Its columns leave out `tenant`, which every key has: a conflict is always
    within the unit of work's tenant.
    """
    found = _named_key(error)
    if found is None:
        return None
    table, columns = found
    return table, tuple(column for column in columns if column != "tenant")


def _named_key(error: BaseException) -> Key | None:
    seen: BaseException | None = error
    for _ in range(4):  # memorm's error <- SQLAlchemy's <- the DB-API adapter's <- the driver's
        if seen is None:
            return None
        name = getattr(seen, "constraint_name", None)  # asyncpg
        if not isinstance(name, str):  # Citus relays a worker's error in words only
            relayed = _PG_UNIQUE.search(str(seen))
            name = relayed.group(1) if relayed is not None else None
        if isinstance(name, str):
            # On Citus the constraint of a shard is named after the table's, plus the shard's id.
            return _by_name().get(name) or _by_name().get(_SHARD_ID.sub("", name))
        found = _SQLITE_UNIQUE.search(str(seen))
        if found is not None:
            table, columns = found.groups()
            return table, tuple(column.rsplit(".", 1)[-1] for column in columns.split(", "))
        seen = getattr(seen, "orig", None) or seen.__cause__
    return None


def conflict_message(key: Key | None, values: Mapping[str, Any] | None = None) -> str:
    """The sentence for a taken `key`; it names the `values` when they are given."""
    if key is None:
        return "a unique value is already taken"
    table, columns = key[0], tuple(column for column in key[1] if column != "tenant")
    key = (table, columns)
    if columns in (("id",), ("id", "agent_id")):  # an agent's rows are keyed by (id, agent_id)
        noun = _NOUNS.get(table, f"a row of {table}")
        return f"{noun} with id {values['id']} exists" if values else f"{noun} with this id exists"
    with_values, without = _SAID.get(key, (None, f"a unique value of {table} is already taken"))
    if values and with_values is not None:
        return with_values.format(**values)
    return without
