"""What the hostile-input tests share: row hashes, one-call attempts, the base rows, the tally.

Not a test module: imported as ``reliability.hostile_kit``.  Counts of inputs
tried, accepted and rejected per category go to
``.bench/reliability-hostile-<engine>.json`` (every hostile module adds to one file).
"""

from __future__ import annotations

import hashlib
import json
import uuid
import weakref
from collections.abc import Awaitable, Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from memorm import Database
from memorm.errors import MemormError
from memorm.uow import UnitOfWork

__all__ = [
    "MAX_TIME",
    "MIN_TIME",
    "Call",
    "Outcome",
    "Sweep",
    "assert_readable",
    "assert_unwritten",
    "attempt",
    "base_rows",
    "record",
    "report_counts",
    "rows_hash",
    "snapshot",
    "try_in_open_unit",
]

Call = Callable[[UnitOfWork], Awaitable[Any]]

BENCH = Path(__file__).resolve().parents[2] / ".bench"
TABLES = ("agents", "sessions", "messages", "archival_passages", "embedding_models")
COUNTS: dict[str, dict[str, dict[str, int]]] = {}
# The first and last instants memorm stores (docs/concepts.md, "Limits").
MIN_TIME = datetime(1, 1, 2, tzinfo=timezone.utc)
MAX_TIME = datetime(9999, 12, 30, 23, 59, 59, 999999, tzinfo=timezone.utc)
_BASES: weakref.WeakKeyDictionary[Database, dict[str, Any]] = weakref.WeakKeyDictionary()


def record(engine: str, category: str, outcome: str) -> None:
    counts = COUNTS.setdefault(engine, {}).setdefault(category, {"tried": 0, "ok": 0, "rejected": 0})
    counts["tried"] += 1
    counts[outcome] += 1


@pytest.fixture(autouse=True)
def report_counts(engine: str) -> Iterator[None]:
    """Rewrite the engine's tally after every test (import it into each hostile test module)."""
    yield
    BENCH.mkdir(exist_ok=True)
    counts = COUNTS.get(engine, {})
    total = {key: sum(c[key] for c in counts.values()) for key in ("tried", "ok", "rejected")}
    path = BENCH / f"reliability-hostile-{engine}.json"
    path.write_text(json.dumps({"engine": engine, "total": total, "categories": counts}, indent=2) + "\n")


async def snapshot(db: Database) -> str:
    """A hash of every committed row of memorm's tables."""
    async with db.unit_of_work(read_only=True) as uow:
        return await rows_hash(uow.session)


async def rows_hash(session: AsyncSession) -> str:
    """A hash of every row of memorm's tables as ``session`` sees them (its own writes included)."""
    digest = hashlib.sha256()
    for table in TABLES:
        rows = (await session.execute(sa.text(f"SELECT * FROM {table} ORDER BY id"))).all()
        digest.update(repr(rows).encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


async def assert_unwritten(db: Database, uow: UnitOfWork, what: str) -> None:
    """``uow`` wrote nothing: the rows it sees are the committed ones, so committing changes nothing.

    Another connection reads the committed rows (nothing else writes meanwhile).
    """
    assert await rows_hash(uow.session) == await snapshot(db), f"{what}: rejected, yet rows changed"


async def attempt(
    db: Database,
    engine: str,
    category: str,
    call: Call,
    *,
    read_only: bool = False,
) -> tuple[bool, Any]:
    """Run ``call`` in its own unit of work: (True, result), or (False, None) after a clean rejection.

    A rejection is caught inside the unit of work, which then commits, as a
    caller that carries on would; what it would commit must change no row.
    A rejection before any statement (the session never began a
    transaction) cannot have written anything, and costs no row hash.
    """
    async with db.unit_of_work(read_only=read_only) as uow:
        outcome = await try_in_open_unit(uow, call)
        if outcome.rejected and uow.session.in_transaction():
            await assert_unwritten(db, uow, category)
    record(engine, category, "rejected" if outcome.rejected else "ok")
    return (False, None) if outcome.rejected else (True, outcome.result)


class Outcome:
    """What one call did: its result, or the memorm error it raised."""

    def __init__(self, result: Any = None, error: MemormError | None = None) -> None:
        self.result = result
        self.error = error

    @property
    def rejected(self) -> bool:
        return self.error is not None


async def try_in_open_unit(uow: UnitOfWork, call: Call) -> Outcome:
    """Run ``call`` in ``uow``; a rejection must come from memorm's checks, leaving ``uow`` usable.

    Anything but a ``MemormError`` propagates (the test fails).  A rejection
    the database made (the unit of work failed) means a check came too late.
    """
    try:
        return Outcome(result=await call(uow))
    except MemormError as error:
        late = uow.link.state.failed
        assert late is None, f"rejected by the database, not by memorm's checks: {late!r}"
        return Outcome(error=error)


class Sweep:
    """Many calls, each as a careful caller makes it: a rejection caught, the unit of work carried on.

    Calls share one unit of work while they are rejected.  A rejection
    before any statement leaves it untouched (its session has not even begun
    a transaction), so thousands of them cost no round trip.  After one that
    ran statements, either the rows it sees must be the committed ones
    (``verify_each``), or the unit of work commits and the caller compares
    row hashes around a batch of calls.  A success is rolled back and the
    next call gets a fresh unit of work (no repository cache holding what was
    undone) — unless ``keep_successes``, for calls that must change nothing:
    then one unit of work serves them all, and ``commit(unwritten=True)``
    checks that together they wrote nothing.
    """

    def __init__(
        self, db: Database, engine: str, *, verify_each: bool = True, keep_successes: bool = False
    ) -> None:
        self.db = db
        self.engine = engine
        self.verify_each = verify_each
        self.keep_successes = keep_successes
        self.uow: UnitOfWork | None = None

    async def run(self, category: str, call: Call) -> Outcome:
        if self.uow is None:
            self.uow = self.db.unit_of_work()
            await self.uow.__aenter__()
        try:
            outcome = await try_in_open_unit(self.uow, call)
            touched = self.uow.session.in_transaction()
            if outcome.rejected and touched and self.verify_each and not self.keep_successes:
                await assert_unwritten(self.db, self.uow, category)
        except BaseException as error:  # the test fails: roll back, so the teardown is not blocked
            await self._close(error)
            raise
        record(self.engine, category, "rejected" if outcome.rejected else "ok")
        if self.keep_successes:
            return outcome
        if not outcome.rejected:
            await self._close(RuntimeError("a success is undone"))
        elif touched and not self.verify_each:
            await self.commit()  # what the rejection wrote (nothing, the caller checks) is kept
        return outcome

    async def commit(self, *, unwritten: bool = False) -> None:
        """Commit the open unit of work, if any; with ``unwritten``, first check it wrote nothing."""
        if unwritten and self.uow is not None and self.uow.session.in_transaction():
            try:
                await assert_unwritten(self.db, self.uow, "these calls")
            except BaseException as error:
                await self._close(error)
                raise
        await self._close(None)

    async def _close(self, error: BaseException | None) -> None:
        uow, self.uow = self.uow, None
        if uow is not None:
            await uow.__aexit__(None if error is None else type(error), error, None)


async def base_rows(db: Database) -> dict[str, Any]:
    """One agent with a system message and a user message, and passages of a float32 and a float16 model.

    Made on first use and remembered per database, so examples of a property
    do not look them up again.
    """
    known = _BASES.get(db)
    if known is not None:
        return known
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("base", meta={"tag": "base"})
        await uow.passages.define_model(agent.id, "default", 3)
        await uow.passages.define_model(agent.id, "half", 3, precision="float16")
        chat = await uow.sessions.create(agent.id, key="base")
        system, message = await uow.messages.append(
            chat.id, [{"role": "system", "content": ""}, {"role": "user", "content": "hello world"}]
        )
        passage = await uow.passages.add(agent.id, "hello world", [1.0, 0.5, 0.25])
    _BASES[db] = base = {
        "agent": agent.id,
        "session": chat.id,
        "system": system.id,
        "message": message.id,
        "passage": passage.id,
        "day": message.created_at.date(),  # of both base messages (one unit of work, one clock reading)
        "unknown": uuid.UUID(int=7),
    }
    return base


async def assert_readable(db: Database, base: dict[str, Any]) -> None:
    """The base session and archive still read back whole: window, context, get, searches, between."""
    async with db.unit_of_work(read_only=True) as uow:
        window = await uow.messages.window(base["session"], limit=1000)
        assert [m.id for m in window[:2]] == [base["system"], base["message"]], window
        context = await uow.messages.context(base["session"], max_tokens=10**6)
        assert context[0].id == base["system"], context
        assert (await uow.messages.get(base["message"])).content == "hello world"
        assert (await uow.messages.search(base["agent"], "hello")).total >= 1
        assert (await uow.messages.between(base["agent"], MIN_TIME, MAX_TIME)).total == len(window)
        assert (await uow.sessions.get(base["session"])).id == base["session"]
        assert (await uow.passages.get(base["passage"])).text == "hello world"
        hits = await uow.passages.search(base["agent"], [1.0, 0.5, 0.25], k=1)
        assert hits[0].passage.id == base["passage"]
        assert (await uow.passages.list(base["agent"], limit=1000)).items
