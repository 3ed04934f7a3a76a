"""What row-level security costs on the chat path (Postgres).

The same data, the same memorm calls, through two roles of one database:

* without RLS: the superuser the benchmarks connect as, which Postgres
  exempts from row-level security (memorm then sets no tenant and reads
  without a transaction), so only the repositories' tenant filter runs;
* with RLS: an application role made by `memorm.tenants.create_role`,
  subject to the policies: every transaction first sets `memorm.tenant`,
  and reads run in a transaction to hold it.

Each operation alternates the two sides call by call.  The rows report
the RLS side against the superuser side ("raw" column) with a target of
1.10 (the tenancy issue's goal: at most 10% added); append and window also
get a row against the raw asyncpg driver doing the same work.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Sequence

import asyncpg
from sqlalchemy.engine import make_url

from benchmarks.chat_data import make_messages
from benchmarks.chat_memorm import Operation, chat_operations, reading
from benchmarks.raw.chat import RawPostgres
from benchmarks.report import Row
from benchmarks.stores import POSTGRES_URL, asyncpg_dsn, store
from benchmarks.timing import Samples, timed
from memorm import Database
from memorm.tenants import create_role

NAME = "tenancy"
RLS_TARGET = 1.10
HISTORY = 2_000  # messages in the session searched and windowed
PASSAGES = 2_000
DIM = 128
RARE = "zephyrine"  # in 1 message of HISTORY; "common" words are in most
BULK = 1_000  # messages per bulk append (COPY for the exempt role; INSERTs under RLS)


def _vector(rng: random.Random) -> list[float]:
    return [rng.uniform(-1.0, 1.0) for _ in range(DIM)]


async def _fill(db: Database, rng: random.Random) -> tuple[uuid.UUID, uuid.UUID]:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("bench")
        chat = await uow.sessions.create(agent.id)
        messages = make_messages(HISTORY)
        messages[HISTORY // 2] = {"role": "user", "content": f"a {RARE} in the history"}
        await uow.messages.append(chat.id, messages)
        await uow.passages.add_many(
            agent.id,
            [{"text": f"passage {i} common words", "embedding": _vector(rng)} for i in range(PASSAGES)],
        )
    return agent.id, chat.id


def _operations(agent: uuid.UUID, chat: uuid.UUID, rng: random.Random) -> dict[str, Operation]:
    batch = make_messages(BULK)

    async def append_bulk(db: Database) -> None:  # dicts built anew each time, as a caller does
        async with db.unit_of_work() as uow:
            await uow.messages.append(chat, [dict(message) for message in batch])

    return {
        **chat_operations(agent, chat, _vector(rng)),
        f"text search, rare word ({RARE})": lambda db: reading(db, lambda u: u.messages.search(agent, RARE)),
        # last: it grows the history the others read
        f"append {BULK:,} messages (one uow)": append_bulk,
    }


async def run(engines: Sequence[str], *, quick: bool = False) -> list[Row]:
    if "postgres" not in engines:
        return []  # row-level security is Postgres'
    reps = 40 if quick else 300
    rng = random.Random(7)
    rows: list[Row] = []
    async with store("postgres") as where:
        owner = where.database()
        await owner.create_all()
        role = f"memorm_bench_{uuid.uuid4().hex[:8]}"
        await create_role(owner, role)
        app = Database(make_url(POSTGRES_URL).set(username=role), **where.options)
        raw = RawPostgres(await where.raw_postgres())
        try:
            agent, chat = await _fill(app, rng)  # written through the policies
            operations = _operations(agent, chat, rng)
            for name, operation in operations.items():
                with_rls, without = Samples(), Samples()
                for _ in range(5):  # warm-up: pools, prepared statements
                    await operation(app)
                    await operation(owner)
                turns = max(5, reps // 20) if name.startswith(f"append {BULK:,}") else reps
                for turn in range(turns):
                    first, second = ((app, with_rls), (owner, without))[:: 1 if turn % 2 else -1]
                    await timed(lambda d=first[0], op=operation: op(d), first[1])
                    await timed(lambda d=second[0], op=operation: op(d), second[1])
                rows.append(
                    Row(
                        NAME,
                        "postgres",
                        f"{name}: with RLS vs without",
                        with_rls,
                        without,
                        target=RLS_TARGET,
                        note="raw column: the same memorm call as a role exempt from RLS",
                    )
                )
                if name in ("append one message (uow)", "window 50 (read-only uow)"):
                    baseline = Samples()
                    message = {"role": "user", "content": "one more common message"}
                    for _ in range(reps):
                        if name.startswith("append one"):
                            await timed(lambda m=message: raw.append_one(chat, m), baseline)
                        else:
                            await timed(lambda: raw.window(chat, 50), baseline)
                    rows.append(
                        Row(NAME, "postgres", f"{name}: with RLS vs raw asyncpg", with_rls, baseline, rows=1)
                    )
        finally:
            await raw.close()
            await app.dispose()
            await owner.dispose()
            admin = await asyncpg.connect(asyncpg_dsn())
            try:
                await admin.execute(f'DROP SCHEMA IF EXISTS "{where.schema}" CASCADE')
                await admin.execute(f'DROP OWNED BY "{role}"')
                await admin.execute(f'DROP ROLE IF EXISTS "{role}"')
            finally:
                await admin.close()
    return rows
