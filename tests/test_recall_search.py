"""Recall memory, finding old messages by their words: full-text search, on both engines alike."""

from __future__ import annotations

import random
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from fts_oracle import oracle_matches, oracle_words
from hypothesis import given
from hypothesis import strategies as st

from memorm import Database, Message, NotFoundError, Page, ValidationError

pytestmark = pytest.mark.anyio

VOCAB = ["apple", "banana", "cherry", "delta", "echo", "fox", "golf", "hotel"]
UTC = timezone.utc
T0 = datetime(2024, 5, 1, 8, 0, tzinfo=UTC)


def words(text: str) -> list[str]:
    """Distinct words as both engines match them (docs/recall.md, "What a word is")."""
    return list(dict.fromkeys(oracle_words(text)))


matches = oracle_matches


async def search_all(db: Database, agent: uuid.UUID, query: str, **scope: object) -> Page[Message]:
    async with db.unit_of_work(read_only=True) as uow:
        return await uow.messages.search(agent, query, limit=1000, **scope)


async def make_agent(db: Database, name: str, sessions: int = 1) -> tuple[uuid.UUID, list[uuid.UUID]]:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create(name)
        chats = [(await uow.sessions.create(agent.id)).id for _ in range(sessions)]
    return agent.id, chats


async def seed_corpus(db: Database) -> tuple[uuid.UUID, list[uuid.UUID], list[Message]]:
    """Agent ``reader``: two sessions of random vocabulary messages; a neighbour has the same words."""
    rng = random.Random(20240501)
    agent, chats = await make_agent(db, "reader", sessions=2)
    _, (other,) = await make_agent(db, "neighbour")
    stored: list[Message] = []
    async with db.unit_of_work() as uow:
        for i in range(60):
            text = " ".join(rng.choices(VOCAB, k=rng.randint(1, 5)))
            role = rng.choice(["user", "assistant", "tool"])
            message = {"role": role, "content": text, "created_at": T0 + timedelta(minutes=i)}
            stored += await uow.messages.append(chats[1 if i % 3 == 0 else 0], message)
        await uow.messages.append(other, [{"role": "user", "content": " ".join(VOCAB)}] * 5)
    return agent, chats, stored


QUERIES = ["apple", "APPLE Banana", "banana apple", "cherry delta echo", "golf, hotel!", "zulu", "apple zulu"]


@pytest.mark.parametrize("scope", ["agent", "session", "roles", "session+roles"])
async def test_search_total_and_rows_equal_every_match(db: Database, scope: str) -> None:
    agent, chats, stored = await seed_corpus(db)
    options: dict[str, object] = {}
    if "session" in scope:
        options["session_id"] = chats[1]
    if "roles" in scope:
        options["roles"] = ["user", "tool"]
    for query in QUERIES:
        expected = {
            m.id
            for m in stored
            if matches(m.content, query)
            and m.session_id == options.get("session_id", m.session_id)
            and m.role in options.get("roles", [m.role])
        }
        page = await search_all(db, agent, query, **options)
        assert page.total == len(expected), query
        assert {m.id for m in page} == expected, query
    assert (await search_all(db, agent, "apple")).total > 5  # the corpus really exercises paging


async def test_search_pages_are_disjoint_stable_and_cover_every_match(db: Database) -> None:
    agent, _, stored = await seed_corpus(db)
    full = [m.id for m in await search_all(db, agent, "apple")]
    for _ in range(2):  # the same order every time
        pages: list[Page[Message]] = []
        async with db.unit_of_work(read_only=True) as uow:
            for offset in range(0, len(full) + 4, 4):
                pages.append(await uow.messages.search(agent, "apple", limit=4, offset=offset))
        paged = [m.id for page in pages for m in page]
        assert paged == full
        assert len(set(paged)) == len(paged)
        assert {page.total for page in pages} == {len(full)}
        assert [page.has_more for page in pages] == [4 * (i + 1) < len(full) for i in range(len(pages))]
    # Equal scores (same text) order newest first.
    by_id = {m.id: m for m in stored}
    for text in {by_id[i].content for i in full}:
        same = [by_id[i].created_at for i in full if by_id[i].content == text]
        assert same == sorted(same, reverse=True), text


async def test_search_ranks_a_short_match_above_a_newer_long_one(db: Database) -> None:
    agent, (chat,) = await make_agent(db, "ranker")
    padding = " ".join(f"filler{i}" for i in range(60))
    async with db.unit_of_work() as uow:
        await uow.messages.append(
            chat,
            [
                {"role": "user", "content": "kiwi", "created_at": T0},
                {"role": "user", "content": f"kiwi {padding}", "created_at": T0 + timedelta(hours=1)},
            ],
        )
    assert [m.content for m in await search_all(db, agent, "kiwi")] == ["kiwi", f"kiwi {padding}"]


async def test_search_scopes_and_rejects_bad_arguments(db: Database) -> None:
    agent, _, _ = await seed_corpus(db)
    neighbour, (other,) = await make_agent(db, "stranger")
    async with db.unit_of_work(read_only=True) as uow:
        assert (await uow.messages.search(neighbour, "apple")).total == 0  # a different agent's words
        for bad in [{"limit": 0}, {"limit": 1001}, {"offset": -1}, {"roles": ["bot"]}]:
            with pytest.raises(ValidationError):
                await uow.messages.search(agent, "apple", **bad)
        with pytest.raises(ValidationError):
            await uow.messages.search(agent, "apple\x00")
        with pytest.raises(NotFoundError):
            await uow.messages.search(uuid.uuid4(), "apple")
        with pytest.raises(NotFoundError):
            await uow.messages.search(agent, "apple", session_id=other)  # the stranger's session
        with pytest.raises(NotFoundError):
            await uow.messages.search(agent, "apple", session_id=uuid.uuid4())
        past_end = await uow.messages.search(agent, "apple", offset=500)
    assert past_end.items == []
    assert past_end.total == (await search_all(db, agent, "apple")).total


async def test_search_follows_trim_delete_rewind_and_system_changes(db: Database) -> None:
    agent, (chat,) = await make_agent(db, "editor")
    async with db.unit_of_work() as uow:
        await uow.messages.append(
            chat,
            [{"role": "system", "content": "alpha rules"}]
            + [{"role": "user", "content": f"note{i} zebra"} for i in range(8)],
        )
    async with db.unit_of_work() as uow:
        await uow.messages.trim(chat, keep_last=6)  # drops note0, note1
        await uow.messages.delete((await uow.messages.window(chat, after_seq=4, limit=1))[0].id)  # note3
        await uow.messages.delete_after(chat, 8)  # drops note7 (seq 9)
        await uow.messages.replace_system(chat, "omega rules")
        await uow.messages.prepend(chat, {"role": "assistant", "content": "summary zebra"})
    found = await search_all(db, agent, "zebra")
    assert sorted(m.content for m in found) == sorted(
        ["summary zebra", "note2 zebra", "note4 zebra", "note5 zebra", "note6 zebra"]
    )
    assert found.total == 5
    for gone in ["note0", "note1", "note3", "note7", "alpha"]:
        assert (await search_all(db, agent, gone)).total == 0, gone
    assert [m.content for m in await search_all(db, agent, "omega")] == ["omega rules"]
    assert (await search_all(db, agent, "rules")).total == 1


HOSTILE_CORPUS = [
    "please do not drop table messages",
    "hello and world",
    "near hello world",
    "say hello",
    "not or and",
    "café au lait",
    "東京タワー is tall",
    "ÄPFEL und birnen",
    "c++ and c# code",
    "the case of the snake",
]
HOSTILE = [
    '"hello"',
    '"hello',
    'hello"world',
    "hello AND world",
    "hello OR world",
    "NOT hello",
    "NEAR(hello world)",
    "NEAR(hello world, 2)",
    "hel*",
    "hello*",
    "content:hello",
    "messages_fts:hello",
    "^hello",
    "(hello)",
    "((",
    "'; DROP TABLE messages; --",
    "hello' OR '1'='1",
    "",
    "   \t\n ",
    "?!.,;:-*^()[]{}",
    "-hello",
    "+hello",
    "{content}: hello",
    "hello & world | !x",
    "'hello':*",
    "CAFÉ",
    "東京タワー",
    "äpfel",
    "🙂 hello 🙂",
    "\\",
    "%_%",
    "snake_case",
    "hello " * 5000,
    "x" * 5000,
    " ".join(f"w{i}" for i in range(200)),
]


async def test_hostile_queries_are_searched_as_plain_words(db: Database) -> None:
    agent, (chat,) = await make_agent(db, "target")
    async with db.unit_of_work() as uow:
        await uow.messages.append(chat, [{"role": "user", "content": text} for text in HOSTILE_CORPUS])
    async with db.unit_of_work(read_only=True) as uow:
        for query in HOSTILE:
            page = await uow.messages.search(agent, query, limit=3)
            expected = [text for text in HOSTILE_CORPUS if matches(text, query)]
            assert page.total == len(expected), query[:40]
            assert {m.content for m in page} <= set(expected)
            assert len(page.items) == min(3, len(expected))
        assert await uow.messages.count(chat) == len(HOSTILE_CORPUS)  # and nothing was dropped


async def test_search_finds_words_inside_emails_hosts_numbers_and_paths(db: Database) -> None:
    # Postgres' own parser keeps ``a@b.com``, ``docs.example.org`` and ``3.14`` as single tokens.
    agent, (chat,) = await make_agent(db, "finder")
    text = "mail ada@example.com, see docs.example.org about version 3.14 in /usr/local/bin"
    async with db.unit_of_work() as uow:
        await uow.messages.append(chat, {"role": "user", "content": text})
    for query in ["ada", "ada@example.com", "example", "docs.example.org", "3.14", "usr local", "version"]:
        assert (await search_all(db, agent, query)).total == 1, query


@given(query=st.text(max_size=200))
async def test_arbitrary_text_never_breaks_search(db: Database, query: str) -> None:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.get_by_name("fuzz")
        if agent is None:
            agent = await uow.agents.create("fuzz")
            chat = await uow.sessions.create(agent.id)
            await uow.messages.append(chat.id, [{"role": "user", "content": text} for text in HOSTILE_CORPUS])
    async with db.unit_of_work(read_only=True) as uow:
        if "\x00" in query:
            with pytest.raises(ValidationError):
                await uow.messages.search(agent.id, query)
            return
        page = await uow.messages.search(agent.id, query, limit=5)
    assert 0 <= len(page.items) <= 5
    assert page.total >= len(page.items)
    assert {m.agent_id for m in page} <= {agent.id}
    if not words(query):
        assert page.total == 0


NOISE = ['"', "AND", "OR", "NOT", "NEAR", "*", ":", "^", "(", ")", "'", "-", "+", ";", "--", "{", "}"]


@given(parts=st.lists(st.sampled_from(VOCAB[:4] + NOISE), max_size=8), glue=st.sampled_from([" ", "", "\t"]))
async def test_vocabulary_queries_wrapped_in_operators_count_exactly(
    db: Database, parts: list[str], glue: str
) -> None:
    corpus = [" ".join(VOCAB[i : i + k]) for i in range(4) for k in (1, 2, 3)] + ["and or not near"]
    async with db.unit_of_work() as uow:
        agent = await uow.agents.get_by_name("ops")
        if agent is None:
            agent = await uow.agents.create("ops")
            chat = await uow.sessions.create(agent.id)
            await uow.messages.append(chat.id, [{"role": "user", "content": text} for text in corpus])
    query = glue.join(parts)
    page = await search_all(db, agent.id, query)
    assert page.total == sum(matches(text, query) for text in corpus), query
