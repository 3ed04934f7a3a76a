"""The statements of an append, compiled once, and which of them this engine runs.

An append takes numbers from the session's `next_seq` counter (one `UPDATE …
RETURNING`, `ALLOCATE`) and inserts the numbered rows.  On Postgres on one
server a single message goes in one statement instead (`append_one`), the
counter's UPDATE feeding the INSERT (`memorm.repositories.session_locks.writes_in_one_statement`).  Ids the
caller chose are checked by the counter's UPDATE itself (`allocate_checking`),
through the unique index on `(tenant, id)`, except on a distributed database,
which has no such index (`claims_ids_first`).

Every statement here is built once and sent on the driver connection
(`memorm.driver.fetch`): the chat path's speed rests on that.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from memorm.link import Link
from memorm.models import MESSAGES, SEARCH_WORDS, SESSIONS
from memorm.repositories.message_queries import _COLUMNS, _FIELDS
from memorm.types.lists import UUIDList, in_list

__all__ = [
    "ALLOCATE",
    "ALLOCATE_ROUTED",
    "FROM_COUNTER",
    "STORED_WITH",
    "allocate_checking",
    "append_one",
    "claims_ids_first",
]

ALLOCATE = (
    sa.update(SESSIONS)
    .where(SESSIONS.c.tenant == sa.bindparam("of_tenant"), SESSIONS.c.id == sa.bindparam("session_id"))
    .values(next_seq=SESSIONS.c.next_seq + sa.bindparam("count"), updated_at=sa.bindparam("now"))
    .returning(SESSIONS.c.agent_id, SESSIONS.c.next_seq)
)
ALLOCATE_ROUTED = ALLOCATE.where(SESSIONS.c.agent_id == sa.bindparam("of_agent"))  # the agent known
FROM_COUNTER = ("agent_id", "seq")  # a folded append's columns that come from the session's counter
_ONE_ID = MESSAGES.c.id == sa.bindparam("id", type_=MESSAGES.c.id.type)
_IDS = in_list(MESSAGES.c.id, sa.bindparam("ids", type_=UUIDList()))  # any number, one parameter


def claims_ids_first(link: Link) -> bool:
    """Whether ids the caller chose are locked and looked up before an append: a distributed database.

    Its tables cannot hold the unique index on `(tenant, id)` that the
    counter's check (`_not_stored`) probes elsewhere; there `append` takes
    the ids' locks and reads every shard first (`memorm.repositories.id_claims`).
    """
    return link.state.distributed


def _not_stored(ids: sa.ColumnElement[bool]) -> sa.ColumnElement[bool]:
    """No stored message has one of the `ids` (`_ONE_ID`, `_IDS`): a condition of the counter's UPDATE.

    A retried batch is found here, by the statement that would number its
    messages: the counter stays, nothing is written, and `append` reads what
    is stored (the rare path).  No extra round trip: a probe of the unique
    index on `(tenant, id)`, so another agent's message with the same id
    stops the counter too, and `append` then refuses the id.  SQLite's
    planner always takes that index here; Postgres' generic plan for a table
    not yet analyzed may scan the tenant's rows of an index ending in `id`
    instead (until autovacuum's ANALYZE), which is why a single message
    whose id the caller chose goes through `_append_one_claimed` on
    Postgres.  Not on
    a distributed database, which has no such index: there `append` locks
    and looks up the ids first (`memorm.repositories.id_claims`).
    """
    return ~sa.exists().where(MESSAGES.c.tenant == sa.bindparam("of_tenant"), ids)


@cache
def allocate_checking(*, routed: bool, many: bool) -> sa.Update:
    """`ALLOCATE` (or routed) that moves the counter only while none of the ids (`id` or `ids`) is stored."""
    statement = ALLOCATE_ROUTED if routed else ALLOCATE
    return statement.where(_not_stored(_IDS if many else _ONE_ID))


# The stored messages with one of the `ids`, any agent's: by the unique index on (tenant, id)
# (on a distributed database, a read of every shard).
STORED_WITH = sa.select(*_FIELDS).where(MESSAGES.c.tenant == sa.bindparam("of_tenant"), _IDS)


def append_one(*, checked: bool, routed: bool) -> sa.Executable:
    """The one-statement append of one message (Postgres on one server: `writes_in_one_statement`).

    `checked`: the caller chose the message's id, and a stored one (a retry)
    is left alone (`_append_one_claimed`); else `_append_one`.  `routed`: the
    session's agent is known (a parameter, `of_agent`).
    """
    return (_append_one_claimed if checked else _append_one)(routed=routed)


def _from_counter(counter: sa.CTE, seq: sa.ColumnElement[Any]) -> tuple[list[str], list[Any]]:
    """The columns of a one-statement append, and their values: the agent and `seq` from `counter`."""
    names = [*_COLUMNS, SEARCH_WORDS]
    values = [
        counter.c.agent_id
        if name == "agent_id"
        else seq
        if name == "seq"
        else sa.bindparam(name, type_=MESSAGES.c[name].type)
        for name in names
    ]
    return names, values


@cache
def _append_one(*, routed: bool) -> sa.Insert:
    """One message appended in one statement (Postgres): the counter's UPDATE feeds the INSERT.

    `INSERT … SELECT` from a data-modifying CTE: the session's `next_seq`
    moves and the message takes the number, in one round trip instead of
    two.  No session, no row: `RETURNING` comes back empty.
    """
    counter = sa.update(SESSIONS).where(
        SESSIONS.c.tenant == sa.bindparam("of_tenant"), SESSIONS.c.id == sa.bindparam("session_id")
    )
    if routed:
        counter = counter.where(SESSIONS.c.agent_id == sa.bindparam("of_agent"))
    taken = (
        counter.values(next_seq=SESSIONS.c.next_seq + 1, updated_at=sa.bindparam("updated_at"))
        .returning(SESSIONS.c.agent_id, SESSIONS.c.next_seq)
        .cte("taken")
    )
    names, values = _from_counter(taken, taken.c.next_seq - 1)
    return (
        sa.insert(MESSAGES)
        .from_select(names, sa.select(*values).select_from(taken))
        .returning(MESSAGES.c.agent_id, MESSAGES.c.seq)
    )


@cache
def _append_one_claimed(*, routed: bool) -> sa.Select[Any]:
    """`_append_one` for a message whose id the caller chose: a stored one (a retry) is left alone.

    The session row is locked first (`FOR NO KEY UPDATE`, as the counter's
    UPDATE locks it), the INSERT skips a taken id (`ON CONFLICT (tenant, id)
    DO NOTHING`: any agent's), and the counter moves only for a row inserted,
    so a retry writes nothing and `RETURNING` comes back empty (as for no
    session).
    The conflict is found by the primary key itself, as an INSERT always
    checks it: no query plan to go wrong, and a retry waiting on the first
    attempt's lock sees its message once that commits.
    """
    head = sa.select(SESSIONS.c.agent_id, SESSIONS.c.next_seq).where(
        SESSIONS.c.tenant == sa.bindparam("of_tenant"), SESSIONS.c.id == sa.bindparam("session_id")
    )
    if routed:
        head = head.where(SESSIONS.c.agent_id == sa.bindparam("of_agent"))
    locked = head.with_for_update(key_share=True).cte("head")  # key_share: FOR NO KEY UPDATE
    names, values = _from_counter(locked, locked.c.next_seq)
    stored = (
        postgresql.insert(MESSAGES)  # only ever run on Postgres (data-modifying CTEs)
        .from_select(names, sa.select(*values).select_from(locked))
        .on_conflict_do_nothing(index_elements=["tenant", "id"])  # the unique index: one id, one message
        .returning(MESSAGES.c.agent_id, MESSAGES.c.seq)
        .cte("stored")
    )
    counter = (
        sa.update(SESSIONS)
        .where(
            SESSIONS.c.tenant == sa.bindparam("of_tenant"),
            SESSIONS.c.id == sa.bindparam("session_id"),
            SESSIONS.c.agent_id == stored.c.agent_id,
        )
        .values(next_seq=SESSIONS.c.next_seq + 1, updated_at=sa.bindparam("updated_at"))
        .cte("counter")
    )
    return sa.select(stored.c.agent_id, stored.c.seq).add_cte(counter)
