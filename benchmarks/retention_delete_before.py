"""Retention scenario 2: ``uow.messages.delete_before``, the older half of one agent's messages."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from benchmarks.raw.retention import open_raw
from benchmarks.report import Row, format_seconds
from benchmarks.retention_data import NAME, NOW, Builder, Size
from benchmarks.retention_timing import Profile, rounds
from benchmarks.stores import store
from benchmarks.timing import Samples


async def bench_delete_before(engine: str, size: Size) -> list[Row]:
    builder = Builder(seed=2)
    sessions, per = size.age_sessions, size.age_per_session
    half = per // 2
    start = NOW - timedelta(days=60)
    cutoff = start + timedelta(seconds=half * sessions)  # messages 0 .. half-1 of each session are older
    expected = sessions * half + 2 * sessions  # plus the two orphaned tool answers per session
    assert half % 25 == 0, "the cutoff must fall between tool-call blocks"
    async with store(engine) as where:
        db = where.database()
        await db.create_all()
        raw = await open_raw(where)
        try:
            agent = builder.agent("bench-age", start - timedelta(days=1))
            await raw.load("agents", [agent])
            for index in range(sessions):
                chat = builder.session(agent["id"], start - timedelta(hours=1), per)
                await raw.load("sessions", [chat])
                messages = []
                for k in range(per):
                    at = start + timedelta(seconds=k * sessions + index)  # sessions interleaved in time
                    seq = k + 1
                    block = k - k % 25 + 7  # a tool call at 7 mod 25, its two answers at 8 and 9
                    if k == half - 1 or k == block:
                        messages.append(builder.message(chat, seq, at, call=f"call_{index}_{k}"))
                    elif k in (half, half + 1):  # answers to the call just before the cutoff
                        messages.append(builder.message(chat, seq, at, answers=f"call_{index}_{half - 1}"))
                    elif k in (block + 1, block + 2):
                        messages.append(builder.message(chat, seq, at, answers=f"call_{index}_{block}"))
                    else:
                        messages.append(builder.message(chat, seq, at))
                await raw.load("messages", messages, stage=True)
            await raw.restore()
            async with db.unit_of_work(read_only=True) as uow:
                counted = await uow.messages.delete_before(agent["id"], cutoff, dry_run=True)
            assert counted == expected, (counted, expected)

            survivors: dict[str, list[Any]] = {}
            parts = {"plain": Samples()}
            profile = Profile(db)

            async def check(name: str, deleted: Any) -> None:
                assert deleted == expected, (name, deleted, expected)
                if name not in survivors:  # the messages each side kept, compared after the rounds
                    survivors[name] = await raw.column("SELECT id FROM messages ORDER BY id")
                    assert len(survivors[name]) == sessions * per - expected, name

            async def memorm_delete() -> int:
                async with db.unit_of_work() as uow:
                    return await uow.messages.delete_before(agent["id"], cutoff)

            samples = await rounds(
                [
                    ("memorm", profile.wrap(memorm_delete)),
                    ("raw", lambda: raw.delete_before(agent["id"], cutoff, parts)),
                ],
                size.age_reps,
                raw.restore,
                check,
            )
            assert survivors["memorm"] == survivors["raw"], "memorm and raw kept different messages"
        finally:
            await raw.close()
            await db.dispose()
    memorm, plain = samples["memorm"], samples["raw"]
    return [
        Row(
            NAME,
            engine,
            f"delete_before: older half of one agent's {sessions * per:,} msgs ({sessions} sessions)",
            memorm,
            plain,
            rows=expected,
            note=(
                f"{expected:,} deleted ({2 * sessions} of them newer tool answers to deleted calls); "
                f"memorm {expected / memorm.median:,.0f} msgs/s, raw {expected / plain.median:,.0f} msgs/s; "
                f"the raw plain DELETE alone {format_seconds(parts['plain'].median)}; {profile.note()}"
            ),
        )
    ]
