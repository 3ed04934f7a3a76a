"""Retention scenario 3: ``uow.agents.forget`` of one person among many, and ``db.scrub()`` after it."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import numpy as np

from benchmarks.raw.retention import RawSQLite, open_raw
from benchmarks.report import Row, format_seconds
from benchmarks.retention_data import (
    GROUP_MESSAGES,
    NAME,
    NOW,
    SCRUB_NOTE,
    SHARED_PASSAGES,
    SHARED_SESSION_MESSAGES,
    SHARED_SESSIONS,
    Builder,
    Size,
    unit_vectors,
)
from benchmarks.retention_timing import Profile, rounds
from benchmarks.stores import store
from benchmarks.timing import Samples, timed
from memorm.retention import Removed


async def bench_forget(engine: str, size: Size) -> list[Row]:
    builder = Builder(seed=3)
    vectors = np.random.default_rng(3)
    target = size.people // 2
    user = f"u{target}"
    start = NOW - timedelta(days=90)
    person_messages = size.person_sessions * size.person_per_session
    expected = Removed(
        agents=1,
        sessions=size.person_sessions + SHARED_SESSIONS,
        messages=person_messages + SHARED_SESSIONS * SHARED_SESSION_MESSAGES + GROUP_MESSAGES,
        passages=size.person_passages + SHARED_PASSAGES,
    )
    async with store(engine) as where:
        db = where.database()
        await db.create_all()
        raw = await open_raw(where)
        try:
            shared = builder.agent("bench-shared", start)
            group = builder.session(shared["id"], start, size.people * GROUP_MESSAGES)
            await raw.load("agents", [shared])
            await raw.load("embedding_models", [builder.model(shared["id"], start)])
            await raw.load("sessions", [group])
            for person in range(size.people):
                stage = person == target
                tag = {"user_id": f"u{person}"}
                at = start + timedelta(minutes=person)
                agent = builder.agent(f"person-{person}", at, tag)
                await raw.load("agents", [agent], stage=stage)
                await raw.load("embedding_models", [builder.model(agent["id"], at)], stage=stage)
                chats = [
                    builder.session(agent["id"], at, size.person_per_session)
                    for _ in range(size.person_sessions)
                ]
                await raw.load("sessions", chats, stage=stage)
                messages = [
                    m
                    for chat in chats
                    for m in builder.chat(chat, size.person_per_session, timedelta(seconds=30))
                ]
                await raw.load("messages", messages, stage=stage)
                await raw.load(
                    "archival_passages",
                    [
                        builder.passage(agent["id"], at, vector)
                        for vector in unit_vectors(vectors, size.person_passages)
                    ],
                    stage=stage,
                )
                # What the shared agent holds about the person.
                tagged = [
                    builder.session(shared["id"], at, SHARED_SESSION_MESSAGES, meta=tag)
                    for _ in range(SHARED_SESSIONS)
                ]
                await raw.load("sessions", tagged, stage=stage)
                about = [
                    m
                    for chat in tagged
                    for m in builder.chat(chat, SHARED_SESSION_MESSAGES, timedelta(seconds=30))
                ]
                about += [
                    builder.message(
                        group, person * GROUP_MESSAGES + n + 1, at + timedelta(seconds=n), meta=tag
                    )
                    for n in range(GROUP_MESSAGES)
                ]
                await raw.load("messages", about, stage=stage)
                await raw.load(
                    "archival_passages",
                    [
                        builder.passage(shared["id"], at, vector, meta=tag)
                        for vector in unit_vectors(vectors, SHARED_PASSAGES)
                    ],
                    stage=stage,
                )
            await raw.restore()
            total_messages = await raw.value("SELECT count(*) FROM messages")
            total_passages = await raw.value("SELECT count(*) FROM archival_passages")
            async with db.unit_of_work(read_only=True) as uow:
                counted = await uow.agents.forget({"user_id": user}, dry_run=True)
            assert counted == expected, (counted, expected)

            parts = {name: Samples() for name in ("deletes", "messages_fts", "archival_passages_fts")}
            scrub = Samples()
            profile = Profile(db)

            async def memorm_forget() -> Removed:
                async with db.unit_of_work() as uow:
                    return await uow.agents.forget({"user_id": user})

            async def check(name: str, removed: Any) -> None:
                assert removed == expected, (name, removed, expected)
                if name == "memorm":
                    await timed(db.scrub, scrub)
                left = await raw.value("SELECT count(*) FROM messages")
                assert left == total_messages - expected.messages, (name, left)
                left = await raw.value("SELECT count(*) FROM archival_passages")
                assert left == total_passages - expected.passages, (name, left)

            samples = await rounds(
                [("memorm", profile.wrap(memorm_forget)), ("raw", lambda: raw.forget(user, parts))],
                size.forget_reps,
                raw.restore,
                check,
            )
            if isinstance(raw, RawSQLite):
                fts_size = await raw.value("SELECT sum(length(block)) FROM messages_fts_data")
            else:
                fts_size = None
        finally:
            await raw.close()
            await db.dispose()
    memorm, plain = samples["memorm"], samples["raw"]
    scope = f"of {size.people} ({total_messages:,} msgs, {total_passages:,} passages in all)"
    rows = [
        Row(
            NAME,
            engine,
            f"forget one person {scope}",
            memorm,
            plain,
            rows=expected.total,
            note=(
                f"removed {expected.as_dict()}; "
                f"raw statements alone {format_seconds(parts['deletes'].median)}"
                + ("; raw includes both FTS5 optimizes" if engine == "sqlite" else "")
                + f"; {profile.note()}"
            ),
        )
    ]
    if engine == "sqlite":
        rows += [
            Row(
                NAME,
                engine,
                f"  of which FTS5 optimize messages_fts ({total_messages:,} rows; raw SQL)",
                raw=parts["messages_fts"],
                note=f"messages_fts_data {fts_size / 2**20:.0f} MiB after the run" if fts_size else "",
            ),
            Row(
                NAME,
                engine,
                f"  of which FTS5 optimize archival_passages_fts ({total_passages:,} rows; raw SQL)",
                raw=parts["archival_passages_fts"],
            ),
        ]
    rows.append(
        Row(
            NAME,
            engine,
            "db.scrub() after memorm's forget",
            scrub,
            note=SCRUB_NOTE[engine],
        )
    )
    return rows
