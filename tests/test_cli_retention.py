"""``memorm purge`` and ``memorm forget``, run in-process on both engines.

``main`` runs its own event loop, so these tests are plain functions that
build and read their data with ``asyncio.run``; what remains is read back
through the Python API.  On Postgres each test gets a throwaway database (a
URL cannot carry a search_path).
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from cli_run import drawn_progress, memorm, run, usage_error

from memorm import Database, retention
from memorm.types import utcnow

Snapshot = dict[str, list[Any]]


async def _upgrade(url: str) -> None:
    async with Database(url) as db:
        await db.upgrade()  # creates the vector extension on Postgres, as create_all does not


@pytest.fixture
def url(plain_url: str) -> str:
    run(_upgrade(plain_url))
    return plain_url


async def _snapshot(url: str, tenant: str = "default") -> Snapshot:
    """Every agent's sessions (with their messages' contents) and passages, read with the Python API."""
    found: Snapshot = {}
    async with Database(url) as db, db.unit_of_work(tenant, read_only=True) as uow:
        for agent in (await uow.agents.list(limit=100)).items:
            for chat in (await uow.sessions.list(agent.id, limit=100)).items:
                messages = await uow.messages.window(chat.id, limit=100)
                found[f"{agent.name}/{chat.title}"] = [m.content for m in messages]
            passages = (await uow.passages.list(agent.id, limit=100)).items
            found[f"{agent.name} passages"] = [p.text for p in passages]
    return found


def snapshot(url: str, tenant: str = "default") -> Snapshot:
    return run(_snapshot(url, tenant))


# -- memorm purge ----------------------------------------------------------------

OLD = timedelta(days=40)  # before a 30d cutoff
RECENT = timedelta(days=1)  # after it

HISTORY: Snapshot = {
    "sam/gone": ["old hi", "", "recent answer", "recent hi"],  # expired
    "sam/kept": ["old q", "old a", "recent q", "recent a"],
    "sam/later": ["recent only"],  # expires tomorrow
    "sam passages": ["old fact", "old fact 2", "recent fact"],
    "ada/chat": ["ada old q", "ada old a", "ada recent q", "ada recent a"],
    "ada passages": ["ada old fact", "ada recent fact"],
}


async def _history(url: str, tenant: str = "default") -> None:
    """Two agents' sessions and passages, some older than 30 days, one session expired (in `tenant`).

    The expired session's old assistant message calls a tool answered
    recently: purging old history takes that answer too (3 of its messages).
    """
    now = utcnow()
    call = {"id": "call_1", "type": "function", "function": {"name": "look", "arguments": "{}"}}

    def message(role: str, content: str, age: timedelta, **extra: Any) -> dict[str, Any]:
        return {"role": role, "content": content, "created_at": now - age, **extra}

    def chat(prefix: str = "") -> list[dict[str, Any]]:
        return [
            message("user", f"{prefix}old q", OLD),
            message("assistant", f"{prefix}old a", OLD),
            message("user", f"{prefix}recent q", RECENT),
            message("assistant", f"{prefix}recent a", RECENT),
        ]

    def facts(prefix: str, texts: dict[str, timedelta]) -> list[dict[str, Any]]:
        return [
            {"text": f"{prefix}{text}", "embedding": [1.0, 0.0], "created_at": now - age}
            for text, age in texts.items()
        ]

    async with Database(url) as db, db.unit_of_work(tenant) as uow:
        sam = await uow.agents.create("sam")
        ada = await uow.agents.create("ada")
        gone = await uow.sessions.create(sam.id, title="gone", ttl=60)
        await uow.sessions.touch(gone.id, ttl=60, now=now - timedelta(hours=2))
        await uow.messages.append(
            gone.id,
            [
                message("user", "old hi", OLD),
                message("assistant", "", OLD, tool_calls=[call]),
                message("tool", "recent answer", RECENT, tool_call_id="call_1"),
                message("user", "recent hi", RECENT),
            ],
        )
        kept = await uow.sessions.create(sam.id, title="kept")
        await uow.messages.append(kept.id, chat())
        later = await uow.sessions.create(sam.id, title="later", ttl=timedelta(days=1))
        await uow.messages.append(later.id, [message("user", "recent only", RECENT)])
        await uow.passages.add_many(
            sam.id, facts("", {"old fact": OLD, "old fact 2": OLD, "recent fact": RECENT})
        )
        talk = await uow.sessions.create(ada.id, title="chat")
        await uow.messages.append(talk.id, chat("ada "))
        await uow.passages.add_many(ada.id, facts("ada ", {"old fact": OLD, "recent fact": RECENT}))


@pytest.fixture
def history(url: str) -> str:
    run(_history(url))
    assert snapshot(url) == HISTORY
    return url


def without(*removed: str, **replaced: list[Any]) -> Snapshot:
    """HISTORY less some sessions and with some entries replaced."""
    return {k: replaced.get(k, v) for k, v in HISTORY.items() if k not in removed}


AFTER_EXPIRED = without("sam/gone")
AFTER_OLD = without(
    **{
        "sam/gone": ["recent hi"],  # the tool answer went with the call it answered
        "sam/kept": ["recent q", "recent a"],
        "sam passages": ["recent fact"],
        "ada/chat": ["ada recent q", "ada recent a"],
        "ada passages": ["ada recent fact"],
    }
)
PURGES = {
    "--expired": (["removed 1 sessions", "removed 4 messages"], AFTER_EXPIRED),
    "--older-than 30d": (["removed 7 messages", "removed 3 passages"], AFTER_OLD),
    "--older-than 30d --agent ada": (
        ["removed 2 messages", "removed 1 passages"],
        without(**{"ada/chat": ["ada recent q", "ada recent a"], "ada passages": ["ada recent fact"]}),
    ),
    # Expired sessions go first, so their 3 old messages count once, not twice.
    "--expired --older-than 30d": (
        ["removed 1 sessions", "removed 8 messages", "removed 3 passages"],
        {k: v for k, v in AFTER_OLD.items() if k != "sam/gone"},
    ),
}


async def _refill(url: str, tenant: str = "default") -> None:
    """Back to HISTORY: every agent deleted (with all it has), then the history made again."""
    async with Database(url) as db, db.unit_of_work(tenant) as uow:
        for agent in (await uow.agents.list(limit=100)).items:
            await uow.agents.delete(agent.id)
    await _history(url, tenant)


def test_each_purge_removes_exactly_what_its_dry_run_counts(
    history: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for options, (lines, remaining) in PURGES.items():
        code, out, err = memorm(capsys, "purge", *options.split(), "--dry-run", "--url", history)
        assert (code, err) == (0, ""), options
        assert out.splitlines() == [line.replace("removed", "would remove") for line in lines], options
        assert snapshot(history) == HISTORY, options

        code, out, err = memorm(capsys, "purge", *options.split(), "--url", history)
        assert (code, err) == (0, ""), options
        assert out.splitlines() == lines, options
        assert snapshot(history) == remaining, options
        run(_refill(history))


def doubled(lines: list[str]) -> list[str]:
    """The summary of the same purge over two tenants holding the same rows."""
    return [re.sub(r"[0-9]+", lambda number: str(2 * int(number.group())), line) for line in lines]


def test_purge_with_tenant_purges_that_tenant_and_without_it_every_tenant(
    history: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run(_history(history, "acme"))  # the same rows in a second tenant
    for options, (lines, remaining) in PURGES.items():
        code, out, err = memorm(capsys, "purge", *options.split(), "--tenant", "acme", "--url", history)
        assert (code, err) == (0, ""), options
        assert out.splitlines() == lines, options
        assert snapshot(history, "acme") == remaining, options
        assert snapshot(history) == HISTORY, options
        run(_refill(history, "acme"))

        code, out, _ = memorm(capsys, "purge", *options.split(), "--dry-run", "--url", history)
        assert out.splitlines() == [line.replace("removed", "would remove") for line in doubled(lines)]
        code, out, err = memorm(capsys, "purge", *options.split(), "--url", history)
        assert (code, err) == (0, ""), options
        assert out.splitlines() == doubled(lines), options  # --agent ada: each tenant's ada
        assert snapshot(history, "acme") == snapshot(history) == remaining, options
        run(_refill(history, "acme"))
        run(_refill(history))
    argv = ["purge", "--older-than", "30d", "--agent", "ada", "--tenant", "nobody", "--url", history]
    assert memorm(capsys, *argv)[2] == "memorm: error: no agent named 'ada'\n"  # in that tenant
    err = usage_error(capsys, "purge", "--expired", "--tenant", "", "--url", history)
    assert "argument --tenant: must not be empty" in err
    assert snapshot(history) == snapshot(history, "acme") == HISTORY


BAD_DURATIONS = [
    "30",  # no unit
    "d",  # no number
    "30x",
    "30D",
    "0d",
    "-5d",
    "1.5h",
    "30 d",
    " 30d",
    "30d\n",
    "\u0661\u0662d",  # Arabic-Indic digits: int() would take them
    "99999999999w",  # past what timedelta holds
    "1001000d",  # past 1,000 years
]


def test_purge_refusals_change_nothing(history: str, capsys: pytest.CaptureFixture[str]) -> None:
    for dry_run in ([], ["--dry-run"]):  # an unknown agent: one line, exit 1
        argv = ["purge", "--older-than", "30d", "--agent", "bob", *dry_run, "--url", history]
        code, out, err = memorm(capsys, *argv)
        assert (code, out) == (1, "")
        assert err == "memorm: error: no agent named 'bob'\n"
    for bad in BAD_DURATIONS:  # usage errors: exit 2
        err = usage_error(capsys, "purge", f"--older-than={bad}", "--url", history)
        assert "argument --older-than: expected" in err, bad
    assert "--expired, --older-than" in usage_error(capsys, "purge", "--url", history)
    assert "--agent" in usage_error(capsys, "purge", "--expired", "--agent", "sam", "--url", history)
    assert "--agent" in usage_error(
        capsys, "purge", "--expired", "--older-than", "30d", "--agent", "sam", "--url", history
    )
    for batch in ("0", "100001", "ten", "-1"):
        assert "--batch" in usage_error(capsys, "purge", "--expired", f"--batch={batch}", "--url", history)
    assert snapshot(history) == HISTORY


def test_purge_accepts_every_unit(history: str, capsys: pytest.CaptureFixture[str]) -> None:
    # Two days to a week back: between the recent rows (a day old) and the old ones (40 days).
    for span in ("172800s", "2880m", "48h", "2d", "1w"):
        code, out, _ = memorm(capsys, "purge", "--older-than", span, "--dry-run", "--url", history)
        assert code == 0
        assert out.splitlines() == ["would remove 7 messages", "would remove 3 passages"], span
    code, out, _ = memorm(capsys, "purge", "--older-than", "12h", "--dry-run", "--url", history)
    assert out.splitlines() == ["would remove 13 messages", "would remove 5 passages"]


def test_purge_reports_progress_per_task(
    history: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    bars = drawn_progress(monkeypatch)
    argv = ["purge", "--expired", "--older-than", "30d", "--batch", "1", "--url", history]
    assert memorm(capsys, *argv)[0] == 0  # one row per batch: the bars add the batches up
    tasks = {task.description: (task.completed, task.total) for task in bars[0].tasks}
    assert tasks == {
        "expired sessions": (1, 1),
        "expired messages": (4, 4),
        "old messages": (4, 4),
        "old passages": (3, 3),
    }


# -- memorm forget ---------------------------------------------------------------

PEOPLE: Snapshot = {
    "u42-bot/bot chat": ["bot hello", "bot bye"],  # the agent's meta is user_id u42
    "shared/u42 chat": ["a", "b", "c"],  # the session's meta is user_id u42
    "shared/u7 chat": ["u7 speaks", "u42 speaks", "u7 in french", "u7 in english"],
    "shared passages": ["u42 fact", "u7 fact", "int 42", "string 42", "vip true", "vip string"],
    "u42-bot passages": ["bot fact"],
}


async def _people(url: str, tenant: str = "default") -> None:
    def said(content: str, **meta: Any) -> dict[str, Any]:
        return {"role": "user", "content": content, "meta": meta}

    async with Database(url) as db, db.unit_of_work(tenant) as uow:
        bot = await uow.agents.create("u42-bot", meta={"user_id": "u42"})
        shared = await uow.agents.create("shared")
        bot_chat = await uow.sessions.create(bot.id, title="bot chat")
        await uow.messages.append(bot_chat.id, [said("bot hello"), said("bot bye")])
        await uow.passages.add(bot.id, "bot fact", [1.0, 0.0])
        mine = await uow.sessions.create(shared.id, title="u42 chat", meta={"user_id": "u42"})
        await uow.messages.append(mine.id, [said("a"), said("b"), said("c")])
        theirs = await uow.sessions.create(shared.id, title="u7 chat", meta={"user_id": "u7"})
        await uow.messages.append(
            theirs.id,
            [
                said("u7 speaks", user_id="u7"),
                said("u42 speaks", user_id="u42"),
                said("u7 in french", user_id="u7", lang="fr"),
                said("u7 in english", user_id="u7", lang="en"),
            ],
        )
        for text, meta in [
            ("u42 fact", {"user_id": "u42"}),
            ("u7 fact", {"user_id": "u7"}),
            ("int 42", {"n": 42}),
            ("string 42", {"n": "42"}),
            ("vip true", {"vip": True}),
            ("vip string", {"vip": "true"}),
        ]:
            await uow.passages.add(shared.id, text, [0.0, 1.0], meta=meta)


@pytest.fixture
def people(url: str) -> str:
    run(_people(url))
    assert snapshot(url) == PEOPLE
    return url


def counts(agents: int = 0, sessions: int = 0, messages: int = 0, passages: int = 0) -> list[str]:
    return [
        f"removed {agents} agents",
        f"removed {sessions} sessions",
        f"removed {messages} messages",
        f"removed {passages} passages",
    ]


def test_forget_dry_run_counts_then_forget_erases_every_row_whose_meta_matches(
    people: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # The bot with its session, 2 messages and passage; the u42 session with 3; 1 message; 1 passage.
    lines = counts(agents=1, sessions=2, messages=6, passages=2)
    code, out, err = memorm(capsys, "forget", "--meta", "user_id=u42", "--dry-run", "--url", people)
    assert (code, err) == (0, "")
    assert out.splitlines() == [line.replace("removed", "would remove") for line in lines]
    assert snapshot(people) == PEOPLE

    code, out, err = memorm(capsys, "forget", "--meta", "user_id=u42", "--url", people)
    assert (code, err) == (0, "")
    assert out.splitlines() == lines
    assert snapshot(people) == {
        "shared/u7 chat": ["u7 speaks", "u7 in french", "u7 in english"],
        "shared passages": ["u7 fact", "int 42", "string 42", "vip true", "vip string"],
    }


def test_forget_with_tenant_forgets_in_that_tenant_and_without_it_in_every_tenant(
    people: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run(_people(people, "acme"))
    lines = counts(agents=1, sessions=2, messages=6, passages=2)
    code, out, _ = memorm(capsys, "forget", "--meta", "user_id=u42", "--dry-run", "--url", people)
    assert code == 0
    assert out.splitlines() == [line.replace("removed", "would remove") for line in doubled(lines)]
    code, out, err = memorm(capsys, "forget", "--meta", "user_id=u42", "--tenant", "acme", "--url", people)
    assert (code, err) == (0, "")
    assert out.splitlines() == lines
    forgotten = {
        "shared/u7 chat": ["u7 speaks", "u7 in french", "u7 in english"],
        "shared passages": ["u7 fact", "int 42", "string 42", "vip true", "vip string"],
    }
    assert snapshot(people, "acme") == forgotten
    assert snapshot(people) == PEOPLE
    code, out, _ = memorm(capsys, "forget", "--meta", "user_id=u7", "--url", people)  # both tenants' u7
    assert (code, out.splitlines()) == (0, counts(sessions=2, messages=3 + 4, passages=2))
    facts = ["int 42", "string 42", "vip true", "vip string"]
    assert snapshot(people, "acme") == {"shared passages": facts}
    assert snapshot(people) == {
        "u42-bot/bot chat": PEOPLE["u42-bot/bot chat"],
        "shared/u42 chat": PEOPLE["shared/u42 chat"],
        "shared passages": ["u42 fact", *facts],
        "u42-bot passages": PEOPLE["u42-bot passages"],
    }


def test_forget_matches_typed_json_and_strings_apart(people: str, capsys: pytest.CaptureFixture[str]) -> None:
    passages = PEOPLE["shared passages"]
    for condition, gone in [
        ("n:=42", "int 42"),
        ("n=42", "string 42"),
        ("vip:=true", "vip true"),
        ("vip=true", "vip string"),
    ]:
        code, out, _ = memorm(capsys, "forget", "--meta", condition, "--url", people)
        assert (code, out.splitlines()) == (0, counts(passages=1)), condition
        passages = [text for text in passages if text != gone]
        assert snapshot(people)["shared passages"] == passages, condition
    code, out, _ = memorm(capsys, "forget", "--meta", 'user_id:="u7"', "--meta", "lang=fr", "--url", people)
    assert (code, out.splitlines()) == (0, counts(messages=1))  # all conditions must match
    assert snapshot(people)["shared/u7 chat"] == ["u7 speaks", "u42 speaks", "u7 in english"]


def test_forget_scrubs_unless_told_not_to_and_purge_only_when_told(
    people: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    scrubs: list[bool] = []

    async def scrub(self: object, *, reindex: bool = False) -> None:
        scrubs.append(reindex)

    monkeypatch.setattr(Database, "scrub", scrub)  # `memorm purge --scrub`
    monkeypatch.setattr(retention, "scrub_database", scrub)  # what `forget` runs after it
    for argv, scrubbed in [
        (["forget", "--meta", "n:=42", "--no-scrub"], []),
        (["forget", "--meta", "n=42"], [False]),
        (["forget", "--meta", "vip=true", "--dry-run"], []),
        (["forget", "--meta", "vip:=true", "--reindex"], [True]),
        (["forget", "--meta", "vip:=true"], []),  # nothing left to remove: nothing to scrub
        (["purge", "--expired", "--older-than", "30d"], []),
        (["purge", "--expired", "--scrub"], [False]),
        (["purge", "--expired", "--scrub", "--dry-run"], []),
    ]:
        before = len(scrubs)
        assert memorm(capsys, *argv, "--url", people)[0] == 0
        assert scrubs[before:] == scrubbed, argv


BAD_META = [
    "user_id",  # no operator
    "=u42",  # no key
    "user id=u42",  # not a meta key
    "user.id=u42",
    "created_at=2024",  # a column
    "n:=",  # not JSON
    "n:=4 2",
    "n:=forty",
    "n:=NaN",
    "n:=1e400",  # infinite
    "n:=18446744073709551616",  # past 64 bits
    "n:=[1, 2]",  # only scalars
    'n:={"a": 1}',
    "k=nul\x00",
]


def test_forget_refuses_bad_meta_syntax_with_usage_errors(
    people: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for bad in BAD_META:
        assert "--meta" in usage_error(capsys, "forget", "--meta", bad, "--url", people), bad
    assert "given twice" in usage_error(capsys, "forget", "--meta", "n=1", "--meta", "n:=1", "--url", people)
    assert "--meta" in usage_error(capsys, "forget", "--url", people)  # required
    assert snapshot(people) == PEOPLE


def test_forget_refuses_meta_json_nested_past_pythons_parser_with_a_usage_error(
    people: str, capsys: pytest.CaptureFixture[str]
) -> None:
    deep = "n:=" + "[" * 100_000 + "]" * 100_000  # json.loads recursed until RecursionError
    assert "nested that deep" in usage_error(capsys, "forget", "--meta", deep, "--url", people)
    assert snapshot(people) == PEOPLE
