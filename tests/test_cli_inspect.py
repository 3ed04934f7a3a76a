"""``memorm check``, ``memorm stats`` and ``memorm import-memgpt``, run in-process on both engines.

``main`` runs its own event loop, so these tests are plain functions; data is
built and read back with ``asyncio.run`` helpers.  On Postgres each test gets
a throwaway database (a URL cannot carry a search_path).
"""

from __future__ import annotations

import re
import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from cli_run import memorm, run

from memorm import Database
from memorm.cli import main
from memorm.embeddings import HashingEmbedder
from memorm.legacy.memgpt import SESSION_KEY

SAMPLE = Path(__file__).resolve().parent / "data" / "memgpt"
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def url(plain_url: str) -> str:
    """An empty database that exists (check and stats refuse a SQLite file that does not)."""
    if plain_url.startswith("sqlite:///"):
        Path(plain_url.removeprefix("sqlite:///")).touch()
    return plain_url


@pytest.fixture
def upgraded(url: str, capsys: pytest.CaptureFixture[str]) -> str:
    assert memorm(capsys, "db", "upgrade", "--url", url)[0] == 0
    return url


async def _sql(url: str, *statements: str) -> None:
    async with Database(url) as db, db.engine.begin() as connection:
        for statement in statements:
            await connection.execute(sa.text(statement))


async def _counts(url: str) -> dict[str, int]:
    async with Database(url) as db, db.engine.connect() as connection:
        tables = ("agents", "sessions", "messages", "archival_passages")
        return {t: int(await connection.scalar(sa.text(f"SELECT count(*) FROM {t}")) or 0) for t in tables}


# -- memorm check ----------------------------------------------------------------


def test_check_passes_on_a_freshly_upgraded_database(
    upgraded: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = memorm(capsys, "check", "--url", upgraded)
    assert (code, err) == (0, "")
    assert "matches memorm's models" in out


def test_check_fails_naming_a_column_added_behind_memorms_back(
    upgraded: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run(_sql(upgraded, "ALTER TABLE agents ADD COLUMN nickname TEXT"))
    code, _, err = memorm(capsys, "check", "--url", upgraded)
    assert code == 1
    assert "drifted" in err
    assert "the database has column agents.nickname, which memorm's models do not" in err


def test_check_fails_naming_a_column_dropped_behind_memorms_back(
    upgraded: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run(_sql(upgraded, "ALTER TABLE sessions DROP COLUMN title"))
    code, _, err = memorm(capsys, "check", "--url", upgraded)
    assert code == 1
    assert "column sessions.title is missing from the database" in err


def test_check_ignores_the_hnsw_indexes_built_at_run_time(
    upgraded: str, capsys: pytest.CaptureFixture[str]
) -> None:
    async def index() -> None:
        async with Database(upgraded) as db:
            async with db.unit_of_work() as uow:
                agent = await uow.agents.create("sam")
                await uow.passages.add(agent.id, "a fact", HashingEmbedder(dim=8).embed_one("a fact"))
            if db.dialect == "postgresql":
                async with db.unit_of_work() as uow:
                    await uow.passages.ensure_index("default", 8)

    run(index())
    code, _out, err = memorm(capsys, "check", "--url", upgraded)
    assert (code, err) == (0, ""), err


def test_check_on_an_unmigrated_database_says_run_upgrade(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _out, err = memorm(capsys, "check", "--url", url)
    assert code == 1
    assert "has no memorm schema" in err
    assert "run `memorm db upgrade`" in err
    assert len(err.strip().splitlines()) == 1

    assert memorm(capsys, "db", "upgrade", "0003", "--url", url)[0] == 0
    code, _, err = memorm(capsys, "check", "--url", url)
    assert code == 1
    assert "is at revision 0003" in err
    assert "run `memorm db upgrade`" in err


# -- memorm stats ----------------------------------------------------------------


async def _chats(url: str, tenant: str = "default") -> None:
    async with Database(url) as db, db.unit_of_work(tenant) as uow:
        sam = await uow.agents.create("sam")
        ada = await uow.agents.create("ada")
        short = await uow.sessions.create(sam.id, title="short chat")
        long = await uow.sessions.create(ada.id, title="long chat")
        await uow.sessions.create(ada.id)  # empty, untitled
        gone = await uow.sessions.create(ada.id, title="expired chat")
        await uow.sessions.touch(gone.id, ttl=1, now=datetime(2020, 1, 1, tzinfo=timezone.utc))
        await uow.messages.append(short.id, [{"role": "user", "content": f"hi {n}"} for n in range(3)])
        await uow.messages.append(long.id, [{"role": "user", "content": f"hello {n}"} for n in range(7)])
        await uow.passages.add(sam.id, "a fact", [1.0, 0.0, 0.0])
        await uow.passages.add(sam.id, "another", [0.0, 1.0, 0.0])


def _row(out: str, *cells: str) -> bool:
    pattern = r"\s*│\s*".join(re.escape(cell) for cell in cells)
    return re.search(rf"│\s*{pattern}\s*│", out) is not None


def test_stats_counts_rows_and_ranks_sessions(upgraded: str, capsys: pytest.CaptureFixture[str]) -> None:
    run(_chats(upgraded))
    code, out, err = memorm(capsys, "stats", "--url", upgraded)
    assert (code, err) == (0, "")
    for table, count in {"agents": 2, "sessions": 4, "messages": 10, "archival_passages": 2}.items():
        assert _row(out, table, str(count)), out
    assert "sessions past their expiry, awaiting `memorm purge --expired`: 1" in out
    assert _row(out, "embedding_models", "1")
    assert out.index("long chat") < out.index("short chat")  # largest first
    assert re.search(r"│ ada\s+│ long chat\s+│ [0-9a-f-]{36} │\s+7 │", out), out
    assert re.search(r"│ ada\s+│ -\s+│ [0-9a-f-]{36} │\s+0 │", out), out
    size = re.search(r"size on disk \(.*\): .* \((\d+) bytes\)", out)
    assert size is not None
    assert int(size.group(1)) > 0


def test_stats_with_tenant_reports_that_tenant_and_without_it_every_tenant(
    upgraded: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run(_chats(upgraded))
    run(_chats(upgraded, "acme"))  # the same agents, sessions and messages under other ids

    async def more() -> None:  # and one more session for acme, the largest
        async with Database(upgraded) as db, db.unit_of_work("acme") as uow:
            ada = await uow.agents.get_by_name("ada")
            assert ada is not None
            chat = await uow.sessions.create(ada.id, title="acme's own")
            await uow.messages.append(chat.id, [{"role": "user", "content": f"yo {n}"} for n in range(9)])

    run(more())
    code, out, err = memorm(capsys, "stats", "--tenant", "acme", "--url", upgraded)
    assert (code, err) == (0, "")
    assert "tenant 'acme'" in out.splitlines()[1]
    for table, count in {"agents": 2, "sessions": 5, "messages": 19, "archival_passages": 2}.items():
        assert _row(out, table, str(count)), out
    assert "awaiting `memorm purge --expired --tenant acme`: 1" in out
    assert re.search(r"│ ada\s+│ acme's own\s+│ [0-9a-f-]{36} │\s+9 │", out), out  # no tenant column
    assert "default" not in out

    code, out, err = memorm(capsys, "stats", "--url", upgraded)
    assert (code, err) == (0, "")
    assert out.splitlines()[1] == "every tenant (2)"
    for table, count in {"agents": 4, "sessions": 9, "messages": 29, "archival_passages": 4}.items():
        assert _row(out, table, str(count)), out
    assert "awaiting `memorm purge --expired`: 2" in out
    assert re.search(r"│ acme\s+│ ada\s+│ acme's own\s+│ [0-9a-f-]{36} │\s+9 │", out), out
    assert re.search(r"│ default\s+│ ada\s+│ long chat\s+│ [0-9a-f-]{36} │\s+7 │", out), out
    assert re.search(r"│ acme\s+│ ada\s+│ long chat\s+│ [0-9a-f-]{36} │\s+7 │", out), out


def test_stats_of_a_tenant_without_rows_says_it_holds_none(
    upgraded: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run(_chats(upgraded))  # the default tenant's rows: the database is not empty
    code, out, err = memorm(capsys, "stats", "--tenant", "nosuch", "--url", upgraded)
    assert (code, err) == (0, "")
    assert out.splitlines()[1:] == [
        "tenant 'nosuch' holds no rows (`memorm tenant list` names the tenants that do)"
    ]
    assert "rows per table" not in out  # no table of zeros to read as an answer
    code, out, err = memorm(capsys, "stats", "--tenant", "default", "--url", upgraded)
    assert (code, err) == (0, "")
    assert "holds no rows" not in out
    assert _row(out, "agents", "2"), out


def test_stats_on_an_unmigrated_database_says_run_upgrade(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _out, err = memorm(capsys, "stats", "--url", url)
    assert code == 1
    assert "memorm db upgrade" in err


# -- memorm import-memgpt --------------------------------------------------------


async def _imported(url: str) -> dict[str, Any]:
    async with Database(url) as db, db.unit_of_work(read_only=True) as uow:
        found: dict[str, Any] = {}
        for name in ("sam", "ada"):
            agent = await uow.agents.get_by_name(name)
            assert agent is not None
            chat = await uow.sessions.get_by_key(agent.id, SESSION_KEY)
            assert chat is not None
            query = HashingEmbedder().embed_one("favourite thai green curry")
            hits = await uow.passages.search(agent.id, query, k=1, embedding_model="hashing-384")
            found[name] = {
                "agent": agent,
                "messages": await uow.messages.window(chat.id, limit=100),
                "passages": await uow.passages.count(agent.id),
                "top": hits[0].passage.text if hits else None,
            }
        return found


def test_import_memgpt_imports_agents_messages_and_passages(
    upgraded: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = memorm(capsys, "import-memgpt", str(SAMPLE), "--url", upgraded)
    assert (code, err) == (0, "")
    assert "imported agent 'sam': 9 messages in one session, 3 archival passages" in out
    assert "imported agent 'ada': 3 messages in one session, 1 archival passages" in out
    assert "re-embed" in out
    assert run(_counts(upgraded)) == {"agents": 2, "sessions": 2, "messages": 12, "archival_passages": 4}

    found = run(_imported(upgraded))
    sam = found["sam"]
    assert sam["agent"].system.startswith("You are Sam")
    assert sam["agent"].core_memory == {
        "persona": "I am Sam. I am curious, upbeat and I remember what people tell me.",
        "human": "Name: Chad. Likes hiking and Thai food.",
    }
    assert sam["agent"].llm_config == {"model": "gpt-4", "context_window": 8192}
    assert sam["agent"].meta["memgpt"]["preset"] == "memgpt_chat"
    messages = sam["messages"]
    assert [m.role for m in messages] == [
        "system", "user", "assistant", "tool", "assistant", "user", "assistant", "user", "assistant"
    ]  # fmt: skip
    assert messages[2].tool_calls[0]["function"]["name"] == "core_memory_append"
    assert messages[3].tool_call_id == "call_1"
    assert messages[5].content == "Mostly in the Alps, near Chamonix."  # content parts joined
    assert messages[0].created_at == datetime(2024, 3, 1, 9, 0, tzinfo=timezone.utc)
    assert messages[6].created_at == datetime(2024, 3, 1, 9, 1, 2, tzinfo=timezone.utc)  # naive: UTC
    assert messages[8].created_at == datetime(2024, 3, 2, 17, 30, 3, tzinfo=timezone.utc)
    assert sam["passages"] == 3
    assert sam["top"] == "Chad's favourite Thai dish is green curry, extra spicy."
    assert found["ada"]["agent"].core_memory["human"] == "Name: Grace. A compiler engineer."
    assert [m.content for m in found["ada"]["messages"]][-1] == "Thanks, file that away."


def test_import_memgpt_twice_adds_nothing(upgraded: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert memorm(capsys, "import-memgpt", str(SAMPLE), "--url", upgraded)[0] == 0
    before = run(_counts(upgraded))
    code, out, _ = memorm(capsys, "import-memgpt", str(SAMPLE), "--url", upgraded)
    assert code == 0
    assert "skipped agent 'sam': an agent of that name exists" in out
    assert "skipped agent 'ada'" in out
    assert run(_counts(upgraded)) == before


def test_import_memgpt_of_one_agent(upgraded: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = memorm(capsys, "import-memgpt", str(SAMPLE), "--agent", "ada", "--url", upgraded)
    assert code == 0
    assert "sam" not in out
    assert run(_counts(upgraded))["agents"] == 1


def test_import_memgpt_refuses_a_directory_with_a_pickle(
    upgraded: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    legacy = tmp_path / "legacy"
    shutil.copytree(SAMPLE, legacy)
    (legacy / "sam" / "agent_state.pkl").write_bytes(b"not to be loaded")
    code, _out, err = memorm(capsys, "import-memgpt", str(legacy), "--url", upgraded)
    assert code == 1
    assert "agent_state.pkl" in err
    assert "never loads it" in err
    assert len(err.strip().splitlines()) == 1
    assert run(_counts(upgraded))["agents"] == 0


def test_import_memgpt_refuses_other_non_json_state(
    upgraded: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    legacy = tmp_path / "legacy"
    shutil.copytree(SAMPLE, legacy)
    (legacy / "ada" / "memory.db").write_bytes(b"")
    code, _, err = memorm(capsys, "import-memgpt", str(legacy), "--url", upgraded)
    assert code == 1
    assert "memory.db" in err
    assert "unexpected file" in err
    assert run(_counts(upgraded))["agents"] == 0


def test_import_memgpt_rejects_bad_json_before_writing(
    upgraded: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    legacy = tmp_path / "legacy"
    shutil.copytree(SAMPLE, legacy)
    (legacy / "sam" / "messages.json").write_text('[{"role": "wizard", "content": "hi"}]')
    code, _, err = memorm(capsys, "import-memgpt", str(legacy), "--url", upgraded)
    assert code == 1
    assert "messages.json" in err
    assert "wizard" in err
    assert run(_counts(upgraded))["agents"] == 0  # ada comes first, and was not imported either


def test_nothing_in_memorm_imports_pickle() -> None:
    sources = (ROOT / "memorm").rglob("*.py")
    offenders = [p for p in sources if re.search(r"^\s*(import|from)\s+c?pickle\b", p.read_text(), re.M)]
    assert offenders == []


# -- unreachable databases -------------------------------------------------------


@pytest.mark.parametrize("command", ["check", "stats"])
def test_an_unreachable_server_is_one_line_without_the_password(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = memorm(capsys, command, "--url", "postgresql://root:s3cret@127.0.0.1:1/memorm")
    assert code == 1
    assert out == ""
    assert err.startswith(
        "memorm: error: cannot reach the database at postgresql+asyncpg://root:***@127.0.0.1:1/"
    )
    assert len(err.strip().splitlines()) == 1
    assert "s3cret" not in err


def test_import_into_an_unreachable_server_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    url = "postgresql://root:s3cret@127.0.0.1:1/memorm"
    code, _, err = memorm(capsys, "import-memgpt", str(SAMPLE), "--url", url)
    assert code == 1
    assert "cannot reach the database at" in err
    assert len(err.strip().splitlines()) == 1


def test_debug_shows_the_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(Exception, match="cannot reach the database"):
        main(["--debug", "check", "--url", "postgresql://root@127.0.0.1:1/memorm"])


def test_db_check_is_the_same_check(upgraded: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert memorm(capsys, "db", "check", "--url", upgraded)[0] == 0
    run(_sql(upgraded, "ALTER TABLE agents ADD COLUMN nickname TEXT"))
    code, _, err = memorm(capsys, "db", "check", "--url", upgraded)
    assert code == 1
    assert "agents.nickname" in err


def test_import_memgpt_refuses_json_nested_past_pythons_parser_in_one_line(
    upgraded: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    legacy = tmp_path / "legacy"
    shutil.copytree(SAMPLE, legacy)
    (legacy / "sam" / "config.json").write_text("[" * 100_000 + "]" * 100_000)  # a RecursionError
    code, _out, err = memorm(capsys, "import-memgpt", str(legacy), "--url", upgraded)
    assert code == 1
    assert err.startswith("memorm: error: ")
    assert "config.json: JSON nested too deeply" in err
    assert len(err.strip().splitlines()) == 1
    assert run(_counts(upgraded))["agents"] == 0
