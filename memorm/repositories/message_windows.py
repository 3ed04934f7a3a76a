"""Windows of the chat log and the context to send a model: the chat path's hot reads.

`window` pages a session's messages by `seq`; `context` picks the system
message and the newest messages that fit a token budget.  Both are
precompiled statements sent straight to the driver (`memorm.driver.fetch`),
compiled once: the chat path's speed rests on that.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from functools import cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql import ColumnElement

from memorm.driver import fetch
from memorm.errors import ValidationError
from memorm.models import MESSAGES, Message, hydrate_all
from memorm.repositories.message_input import check_roles
from memorm.repositories.message_queries import _COLUMNS, _FIELDS, SEQ_MAX, SEQ_MIN, MessageQueries
from memorm.tokens import MESSAGE_OVERHEAD
from memorm.translate import guarded
from memorm.validation import INT32_MAX, INT64_MAX, INT64_MIN, as_uuid, check_flag, check_int, check_limit

__all__ = ["MessageWindows"]

_SEQ = _COLUMNS.index("seq")
_SESSION_MESSAGES = (  # a session's messages: its tenant, the session and its agent (one shard on Citus)
    MESSAGES.c.tenant == sa.bindparam("tenant"),
    MESSAGES.c.session_id == sa.bindparam("session_id"),
    MESSAGES.c.agent_id == sa.bindparam("agent"),
)
_WINDOW_BACK = (  # the newest `limit` messages up to seq `bound`, newest first
    sa.select(*_FIELDS)
    .where(*_SESSION_MESSAGES, MESSAGES.c.seq <= sa.bindparam("bound"))
    .order_by(MESSAGES.c.seq.desc())
    .limit(sa.bindparam("limit"))
)
_WINDOW_FORWARD = (  # the oldest `limit` messages from seq `bound` on
    sa.select(*_FIELDS)
    .where(*_SESSION_MESSAGES, MESSAGES.c.seq >= sa.bindparam("bound"))
    .order_by(MESSAGES.c.seq)
    .limit(sa.bindparam("limit"))
)
_FIRST_SCAN = 256  # context(): rows whose tokens are summed first (~25k tokens of chat)
# A row's tokens, for budgets; a row stored without a count (by another program) is
# estimated as `memorm.tokens.estimate_tokens` estimates its content.  Integer
# arithmetic on both engines: `/` would be a numeric division on Postgres.
_TOKENS = sa.func.coalesce(
    MESSAGES.c.token_count,
    (sa.func.coalesce(sa.func.length(MESSAGES.c.content), 0) + 3) // 4 + MESSAGE_OVERHEAD,
)
_SYSTEM, _BODY = 0, 1  # context(): which part of the answer a row is


@cache
def _context_statement(*, pinned: bool) -> sa.CompoundSelect[Any] | sa.Select[Any]:
    """`context()` in one statement: the pinned system message and the newest rows that fit.

    Rows come as `(part, *message columns)`, the body newest first (up to
    `cap` of them, whose running token total stays within `budget` less the
    system message's tokens).  Compiled once per variant and prepared by
    the driver, like the windows.
    """
    chat = list(_SESSION_MESSAGES)
    allowed: Any = sa.bindparam("budget", type_=sa.Integer)
    body_where: list[ColumnElement[bool]] = []
    system: sa.Select[Any] | None = None
    if pinned:
        head = (
            sa.select(
                MESSAGES.c.seq, MESSAGES.c.role, sa.func.coalesce(MESSAGES.c.token_count, 0).label("tokens")
            )
            .where(*chat)
            .order_by(MESSAGES.c.seq)
            .limit(1)
            .cte("head")
        )
        found = sa.select(head.c.seq, head.c.tokens).where(head.c.role == "system").cte("pinned")
        pinned_seq = sa.select(found.c.seq).scalar_subquery()
        body_where.append(sa.or_(pinned_seq.is_(None), MESSAGES.c.seq > pinned_seq))
        allowed = allowed - sa.func.coalesce(sa.select(found.c.tokens).scalar_subquery(), 0)
        system = sa.select(sa.literal(_SYSTEM).label("part"), *_FIELDS).where(
            *chat, MESSAGES.c.seq == pinned_seq
        )
    # The running total reads only (seq, tokens) of the newest rows; the kept
    # rows are then read whole by seq, through the session's index.
    newest = (
        sa.select(MESSAGES.c.seq, _TOKENS.label("tokens"))
        .where(*chat, *body_where)
        .order_by(MESSAGES.c.seq.desc())
        .limit(sa.bindparam("cap"))
        .cte("newest")
    )
    running = sa.select(
        newest.c.seq, sa.func.sum(newest.c.tokens).over(order_by=newest.c.seq.desc()).label("running")
    ).cte("running")
    first_kept = sa.select(sa.func.min(running.c.seq)).where(running.c.running <= allowed).scalar_subquery()
    body = sa.select(sa.literal(_BODY).label("part"), *_FIELDS).where(*chat, MESSAGES.c.seq >= first_kept)
    return body if system is None else sa.union_all(system, body)


def _check_cursor(value: object, field: str) -> int:
    return check_int(value, field, minimum=INT64_MIN, maximum=INT64_MAX)


class MessageWindows(MessageQueries):
    """The windows and context reads of [`MessageRepository`][memorm.repositories.MessageRepository]."""

    async def window(
        self,
        session_id: uuid.UUID | str,
        *,
        limit: int = 50,
        before_seq: int | None = None,
        after_seq: int | None = None,
        roles: Iterable[str] | None = None,
    ) -> list[Message]:
        """Up to `limit` messages, oldest first.

        With neither cursor: the newest `limit`.  Cursors are any 64-bit
        integers (seqs themselves are 32-bit).

        Args:
            session_id: the session whose messages to read.
            limit: at most this many messages.
            before_seq: the last `limit` before it (paging back).
            after_seq: the first `limit` after it (paging forward); give one
                cursor at most.
            roles: keep only those roles.
        """
        key = as_uuid(session_id, "session_id")
        check_limit(limit)
        wanted = check_roles(roles)
        if before_seq is not None and after_seq is not None:
            raise ValidationError("window: give before_seq or after_seq, not both")
        forward = after_seq is not None
        if forward:
            bound = _check_cursor(after_seq, "after_seq") + 1
        else:
            bound = SEQ_MAX if before_seq is None else _check_cursor(before_seq, "before_seq") - 1
        if not SEQ_MIN <= bound <= SEQ_MAX:
            # Past the 32-bit seqs: a bound beyond the far end matches every row
            # (so it is clamped); one beyond the near end matches none.
            if (bound > SEQ_MAX) == forward:
                await self._require_session(key)
                return []
            bound = SEQ_MIN if forward else SEQ_MAX
        if wanted is None:  # the hot path: a precompiled statement, straight to the driver
            rows = await self._fetch_window(key, forward=forward, bound=bound, limit=limit)
        else:
            where = [*await self._session_messages(key), MESSAGES.c.role.in_(wanted)]
            if forward:
                rows = await self._select(*where, MESSAGES.c.seq >= bound, order=MESSAGES.c.seq, limit=limit)
            else:
                rows = await self._select(
                    *where, MESSAGES.c.seq <= bound, order=MESSAGES.c.seq.desc(), limit=limit
                )
        if not forward:
            rows.reverse()
        if not rows:
            await self._require_session(key)
        return rows

    async def context(
        self, session_id: uuid.UUID | str, *, max_tokens: int, pinned_system: bool = True
    ) -> list[Message]:
        """The messages to send a model: the system message plus the newest that fit `max_tokens`.

        Chronological.  The system message's tokens count against the budget
        (with `pinned_system=False` it is an ordinary message).  A pinned
        system message is never dropped: when it alone needs more than
        `max_tokens`, it comes back by itself, over the budget.  The window
        never starts with a `tool` answer whose call was cut off.  The cut is
        found in SQL (a running sum of `token_count`); only the kept rows are read.

        The system message is the session's first message when its role is
        `system`; an agent's `system` prompt is not one (see
        [`replace_system`][memorm.repositories.MessageRepository.replace_system]).
        """
        key = as_uuid(session_id, "session_id")
        # A budget in token_count's unit, and as wide: Postgres compares it as a 32-bit integer.
        budget = check_int(max_tokens, "max_tokens", minimum=1, maximum=INT32_MAX)
        check_flag(pinned_system, "pinned_system")
        # One statement (`_context_statement`) answers unless every row it summed
        # fitted: then it runs again over four times the rows, up to one more
        # than the budget (a row has at least one token, but for messages of no
        # tokens, which the stepwise `_context_beyond` takes on).
        agent = await self._agent_of(key)
        cap = min(budget + 1, _FIRST_SCAN)
        params = {
            "tenant": self._required_tenant,
            "session_id": key,
            "agent": agent,
            "budget": budget,
            "cap": cap,
        }
        statement = _context_statement(pinned=pinned_system)
        while True:
            async with guarded(self.link):
                found = await fetch(self.link, statement, params)
            if sum(row[0] == _BODY for row in found) < cap:
                break
            if cap > budget:
                return await self._context_beyond(key, budget, pinned_system, scanned=cap)
            cap = params["cap"] = min(cap * 4, budget + 1)
        found.sort(key=lambda row: (row[0], row[1 + _SEQ]))  # the system message, then oldest first
        messages = hydrate_all(Message, _COLUMNS, found, offset=1)
        system = messages.pop(0) if messages and found[0][0] == _SYSTEM else None
        while messages and messages[0].role == "tool":  # an answer whose call did not fit
            messages.pop(0)
        if system is not None:
            return [system, *messages]
        if not messages and not found:
            await self._require_session(key)
        return messages

    async def _context_beyond(
        self, key: uuid.UUID, budget: int, pinned_system: bool, *, scanned: int
    ) -> list[Message]:
        """`context()` when the newest `scanned` rows all fit (rows of no tokens): step by step."""
        system: Message | None = None
        where = await self._session_messages(key)
        head = await self._fetch_window(key, forward=True, bound=SEQ_MIN, limit=1)
        if not head:
            await self._require_session(key)
            return []
        if pinned_system and head[0].role == "system":
            system = head[0]
            budget -= system.token_count or 0
            where.append(MESSAGES.c.seq > system.seq)
        if budget <= 0:
            return [system] if system is not None else []
        span = await self._budget_span(where, budget, cap=scanned * 2)
        if span is None:
            return [system] if system is not None else []
        first, last, rows = span
        # Bounded on both sides: rows appended meanwhile must not stretch the budget.
        fetched = await self._fetch_window(key, forward=True, bound=first, limit=rows)
        body = [message for message in fetched if message.seq <= last]
        while body and body[0].role == "tool":  # an answer whose call did not fit
            body.pop(0)
        return [system, *body] if system is not None else body

    async def _fetch_window(self, key: uuid.UUID, *, forward: bool, bound: int, limit: int) -> list[Message]:
        """Messages from `bound` on (`forward`) or up to it, `limit` of them, in scan order."""
        agent = await self._agent_of(key)
        params = {
            "tenant": self._required_tenant,
            "session_id": key,
            "agent": agent,
            "bound": bound,
            "limit": limit,
        }
        statement = _WINDOW_FORWARD if forward else _WINDOW_BACK
        async with guarded(self.link):
            found = await fetch(self.link, statement, params)
        return hydrate_all(Message, _COLUMNS, found)

    async def _budget_span(
        self, where: list[ColumnElement[bool]], budget: int, *, cap: int
    ) -> tuple[int, int, int] | None:
        """`(first seq, last seq, rows)` of the newest messages that fit in `budget` tokens, if any.

        The running total is a window function over the newest rows, so one
        row crosses the wire, whatever the history's length.  The scan starts
        with the newest `cap` rows and doubles while every row it read still
        fitted.
        """
        tokens = _TOKENS
        while True:
            newest = (
                sa.select(MESSAGES.c.seq.label("seq"), tokens.label("tokens"))
                .where(*where)
                .order_by(MESSAGES.c.seq.desc())
                .limit(cap)
                .subquery()
            )
            running = sa.select(
                newest.c.seq,
                sa.func.sum(newest.c.tokens).over(order_by=newest.c.seq.desc()).label("running"),
            ).subquery()
            fitted = (
                await self._execute(
                    sa.select(sa.func.min(running.c.seq), sa.func.max(running.c.seq), sa.func.count()).where(
                        running.c.running <= budget
                    )
                )
            ).one()
            first, last, fitting = tuple(fitted)
            if fitting < cap:  # the budget ran out (or the history did) inside the cap
                return None if fitting == 0 else (int(first), int(last), int(fitting))
            cap *= 2
