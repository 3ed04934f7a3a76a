"""Retention scenarios 1 and 4: purging expired sessions, and what ``secure_delete`` costs (SQLite)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from benchmarks.raw.retention import RawSQLite, key, open_raw
from benchmarks.report import Row
from benchmarks.retention_data import NAME, NOW, SCRUB_NOTE, Builder, Size
from benchmarks.retention_timing import Profile, rounds
from benchmarks.stores import store
from benchmarks.timing import Samples, timed
from memorm.retention import Removed, purge_expired


async def bench_purge(engine: str, size: Size) -> list[Row]:
    builder = Builder(seed=1)
    expected = Removed(sessions=size.expired, messages=size.expired * size.per_session)
    async with store(engine) as where:
        db = where.database()
        await db.create_all()
        raw = await open_raw(where)
        try:
            start = NOW - timedelta(days=30)
            agent = builder.agent("bench-purge", start)
            await raw.load("agents", [agent])
            live_ids = []
            for index in range(max(size.live, size.expired)):  # live and expired interleaved in time
                at = start + timedelta(minutes=index)
                if index < size.live:
                    lasting = NOW + timedelta(days=30) if index % 2 else None
                    chat = builder.session(agent["id"], at, size.per_session, expires_at=lasting)
                    await raw.load("sessions", [chat])
                    await raw.load("messages", builder.chat(chat, size.per_session, timedelta(seconds=1)))
                    live_ids.append(chat["id"])
                if index < size.expired:
                    gone = NOW - timedelta(minutes=size.expired - index)  # exactly-at-now would expire too
                    chat = builder.session(agent["id"], at, size.per_session, expires_at=gone)
                    await raw.load("sessions", [chat], stage=True)
                    await raw.load(
                        "messages", builder.chat(chat, size.per_session, timedelta(seconds=1)), stage=True
                    )
            await raw.restore()
            async with db.unit_of_work(read_only=True) as uow:
                counted = await uow.sessions.purge_expired(now=NOW, dry_run=True)
                window = await uow.messages.window(live_ids[0], limit=3)
            assert counted == expected, counted
            assert [m.seq for m in window] == [size.per_session - 2, size.per_session - 1, size.per_session]

            live_keys = sorted(key(engine, live) for live in live_ids)

            scrub = Samples()
            profile = Profile(db)

            async def check(name: str, removed: Any) -> None:
                assert removed == expected, (name, removed)
                if name == "memorm":
                    await timed(db.scrub, scrub, collect=True)
                remaining = await raw.column("SELECT id FROM sessions ORDER BY id")
                assert remaining == live_keys, name
                messages = await raw.value("SELECT count(*) FROM messages")
                assert messages == size.live * size.per_session, (name, messages)

            variants: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
                ("memorm", profile.wrap(lambda: purge_expired(db, now=NOW, batch=size.batch))),
                ("raw", lambda: raw.purge(NOW, size.batch)),
            ]
            if isinstance(raw, RawSQLite):
                sqlite_raw = raw

                async def secure_off() -> Removed:
                    await sqlite_raw.secure_delete(False)
                    try:
                        return await sqlite_raw.purge(NOW, size.batch)
                    finally:
                        await sqlite_raw.secure_delete(True)

                await sqlite_raw.secure_delete(True)  # as memorm's connections
                variants.append(("raw secure_delete=OFF", secure_off))
            samples = await rounds(variants, size.purge_reps, raw.restore, check)
        finally:
            await raw.close()
            await db.dispose()
    messages = expected.messages
    batches = -(-size.expired // size.batch)
    memorm, plain = samples["memorm"], samples["raw"]
    rows = [
        Row(
            NAME,
            engine,
            f"purge_expired: {size.expired} expired x {size.per_session} msgs among "
            f"{size.live} live sessions (batch={size.batch})",
            memorm,
            plain,
            rows=messages,
            note=(
                f"{messages:,} messages in {batches} batches + 1 empty one, one transaction each; "
                f"memorm {messages / memorm.median:,.0f} msgs/s, raw {messages / plain.median:,.0f} msgs/s; "
                f"memorm adds a dry-run count; {profile.note()}"
            ),
        )
    ]
    rows.append(
        Row(
            NAME,
            engine,
            "db.scrub() after memorm's purge",
            scrub,
            note=SCRUB_NOTE[engine],
        )
    )
    if "raw secure_delete=OFF" in samples:
        off = samples["raw secure_delete=OFF"]
        rows.append(
            Row(
                NAME,
                engine,
                "raw purge above, secure_delete ON (memorm column) vs OFF (raw column)",
                plain,
                off,
                rows=messages,
                note=f"secure_delete costs {plain.median / off.median - 1:+.0%} on this delete",
            )
        )
    return rows
