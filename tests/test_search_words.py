"""Full-text search finds every word of a message, the same words on both engines (issue #12).

Words are normalised by memorm (NFKC, case folding, NFKC; runs of letters,
digits and combining marks), never by an engine's tokenizer or the database's
locale.  :mod:`fts_oracle` says what must match, worked out independently.
"""

from __future__ import annotations

import unicodedata
import uuid

import asyncpg
import pytest
import sqlalchemy as sa
from conftest import POSTGRES_URL, asyncpg_dsn
from fts_oracle import oracle_matches, oracle_words
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.engine import make_url

from memorm import Database, Message
from memorm.search.normalize import MAX_INDEX_BYTES

pytestmark = pytest.mark.anyio

EMBEDDING = [1.0, 0.0]


async def _agent(db: Database, texts: list[str]) -> uuid.UUID:
    """A new agent with one message and one passage per text."""
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create(f"a-{uuid.uuid4().hex[:12]}")
        chat = await uow.sessions.create(agent.id)
        if texts:
            await uow.messages.append(chat.id, [{"role": "user", "content": text} for text in texts])
            await uow.passages.add_many(agent.id, [{"text": text, "embedding": EMBEDDING} for text in texts])
    return agent.id


async def _found(db: Database, agent: uuid.UUID, query: str) -> tuple[set[str], set[str]]:
    """The texts a search for ``query`` finds among the agent's messages, and among its passages."""
    async with db.unit_of_work(read_only=True) as uow:
        messages = await uow.messages.search(agent, query, limit=1000)
        passages = await uow.passages.search_text(agent, query, limit=1000)
    assert messages.total == len(messages.items)
    assert passages.total == len(passages.items)
    return {m.content for m in messages}, {p.text for p in passages}


async def _assert_finds(db: Database, agent: uuid.UUID, query: str, expected: set[str]) -> None:
    assert await _found(db, agent, query) == (expected, expected), query


# -- the cases of the issue ------------------------------------------------------


async def test_istanbul_is_found_however_it_is_cased(db: Database) -> None:
    texts = ["İstanbul'da buluşalım", "ISTANBUL airport"]  # noqa: RUF001 (Turkish)
    agent = await _agent(db, texts)
    for query in ["İstanbul", "İSTANBUL", "i̇stanbul", "İSTANBUL'DA"]:
        await _assert_finds(db, agent, query, {texts[0]})
    for query in ["istanbul", "Istanbul"]:  # a dotless capital I folds to a plain i
        await _assert_finds(db, agent, query, {texts[1]})


async def test_nfd_and_nfc_cafe_find_each_other(db: Database) -> None:
    nfc, nfd = "café au lait", unicodedata.normalize("NFD", "CAFÉ noir")
    assert nfd != unicodedata.normalize("NFC", nfd)
    agent = await _agent(db, [nfc, nfd, "cafe sans accent"])
    for query in ["café", unicodedata.normalize("NFD", "café"), "CAFÉ", "Cafe\u0301"]:
        await _assert_finds(db, agent, query, {nfc, nfd})
    await _assert_finds(db, agent, "cafe", {"cafe sans accent"})  # accents count


async def test_greek_capitals_match_small_letters_and_final_sigma(db: Database) -> None:
    texts = ["ΟΔΟΣ ΑΘΗΝΑΣ", "μια οδος", "ὀδός ancient", "Straße"]
    agent = await _agent(db, texts)
    for query in ["ΟΔΟΣ", "οδος", "οδοσ", "Οδος"]:
        await _assert_finds(db, agent, query, {"ΟΔΟΣ ΑΘΗΝΑΣ", "μια οδος"})
    await _assert_finds(db, agent, "ὈΔΌΣ", {"ὀδός ancient"})  # breathing and accent count
    await _assert_finds(db, agent, "STRASSE", {"Straße"})  # full case folding


async def test_a_word_after_the_first_100000_characters_is_found(db: Database) -> None:
    text = "lorem ipsum " * 10_000 + "needle at the end " + "ΤΈΛΟΣ"
    assert text.index("needle") > 100_000
    agent = await _agent(db, [text, "short lorem"])
    await _assert_finds(db, agent, "needle", {text})
    await _assert_finds(db, agent, "τέλος", {text})
    await _assert_finds(db, agent, "lorem", {text, "short lorem"})


async def test_a_3000_character_word_is_found(db: Database) -> None:
    ascii_word, cyrillic_word = "x" * 2_999 + "y", "ж" * 3_000  # 3,000 and 6,000 bytes
    texts = [f"see {ascii_word} here", f"и {cyrillic_word}", "x" * 254]
    agent = await _agent(db, texts)
    await _assert_finds(db, agent, ascii_word, {texts[0]})
    await _assert_finds(db, agent, ascii_word.upper(), {texts[0]})
    await _assert_finds(db, agent, cyrillic_word.upper(), {texts[1]})
    # The documented limit: words keep their first 255 characters, so another long word
    # starting with the same 255 characters matches too, and a shorter one does not.
    await _assert_finds(db, agent, "x" * 255 + "zzz", {texts[0]})
    await _assert_finds(db, agent, "x" * 254, {"x" * 254})


async def test_text_with_more_distinct_words_than_a_tsvector_holds_is_stored_and_its_head_found(
    db: Database,
) -> None:
    # Distinct words of exactly MAX_INDEX_BYTES (Postgres' tsvector limit): all found.
    fits = " ".join(f"{n:07d}" for n in range(MAX_INDEX_BYTES // 7)) + " " + "z" * (MAX_INDEX_BYTES % 7)
    # Past it the text is stored whole, and the words seen first, up to the limit, are found.
    dump = "tool output: " + " ".join(f"row{n:07d}" for n in range(150_000))  # 1.5 MB of distinct words
    agent = await _agent(db, [fits, dump])
    await _assert_finds(db, agent, "0000000 0149795 zzz", {fits})
    await _assert_finds(db, agent, "tool output row0000000 row0104855", {dump})  # the last that fits
    await _assert_finds(db, agent, "row0104856", set())
    # Updates and the other write paths cut the same way.
    async with db.unit_of_work() as uow:
        chat = (await uow.sessions.list(agent)).items[0]
        await uow.messages.replace_system(chat.id, "first " + dump)  # inserts the system message
        await uow.messages.replace_system(chat.id, "second " + dump)  # updates it
        found = (await uow.passages.search_text(agent, "tool")).items
        await uow.passages.update_text(found[0].id, "edited " + dump, EMBEDDING)
    edited, second = "edited " + dump, "second " + dump
    assert await _found(db, agent, "row0100000") == ({dump, second}, {edited})
    assert await _found(db, agent, "second") == ({second}, set())
    assert await _found(db, agent, "edited") == (set(), {edited})
    assert await _found(db, agent, "row0110000") == (set(), set())
    async with db.unit_of_work(read_only=True) as uow:
        stored = {m.content for m in await uow.messages.window(chat.id)}
    assert stored == {fits, dump, second}


# -- the words are derived data ---------------------------------------------------------


async def test_search_words_are_stored_alike_on_both_engines_and_never_a_field(db: Database) -> None:
    text = "Zoë's CAFÉ, zoë ΟΔΟΣ x_1"
    agent = await _agent(db, [text])
    async with db.unit_of_work(read_only=True) as uow:
        [message] = (await uow.messages.search(agent, "zoë")).items
        [passage] = (await uow.passages.search_text(agent, "zoë")).items
        window = await uow.messages.window(message.session_id)
        stored = [
            (await uow.session.execute(sa.text(f"SELECT search_words FROM {table}"))).scalar_one()
            for table in ("messages", "archival_passages")
        ]
    # Sorted distinct words, read back the same from a tsvector and from text.
    assert stored == ["1 café s x zoë οδοσ"] * 2
    if db.dialect == "postgresql":  # any tsvector reads back as its lexemes
        async with db.engine.connect() as connection:
            other = await connection.exec_driver_sql("SELECT 'b:1,2A a'::tsvector")
            assert other.scalar() == "a b"
    for row in (message, passage, *window):
        assert "search_words" not in row.model_dump()
        assert "search_words" not in vars(row)
    assert "search_words" not in Message.model_fields


async def test_rows_inserted_through_the_orm_get_their_words(db: Database) -> None:
    agent = await _agent(db, [])
    async with db.unit_of_work() as uow:
        chat = (await uow.sessions.list(agent)).items[0]
        uow.session.add(Message(session_id=chat.id, agent_id=agent, seq=1, role="user", content="Ορμή ORM"))
        await uow.session.flush()
    async with db.unit_of_work(read_only=True) as uow:
        assert [m.content for m in await uow.messages.search(agent, "ορμη orm")] == []  # accents count
        assert [m.content for m in await uow.messages.search(agent, "ΟΡΜΉ orm")] == ["Ορμή ORM"]


# -- a Postgres database created with the C locale ---------------------------------


@pytest.mark.postgres
@pytest.mark.parametrize("engine", ["postgres"], indirect=True)
async def test_a_c_locale_postgres_database_finds_non_ascii_words(engine: str) -> None:
    name = f"memorm_c_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(asyncpg_dsn())
    await admin.execute(
        f"CREATE DATABASE \"{name}\" TEMPLATE template0 ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C'"
    )
    try:
        url = make_url(POSTGRES_URL).set(database=name).render_as_string(hide_password=False)
        async with Database(url) as db:
            await db.upgrade()
            async with db.engine.connect() as connection:
                assert (await connection.exec_driver_sql("SHOW lc_ctype")).scalar() == "C"
                # Here the database folds no non-ASCII letter, and its regular
                # expressions see none as a letter (as the old index expression did).
                for sql in ("SELECT lower('ΟΔΟΣ') = 'οδοσ'", "SELECT 'é' ~ '[[:alnum:]]'"):
                    assert (await connection.exec_driver_sql(sql)).scalar() is False, sql
            texts = ["café crème", "東京タワー は 高い", "ΟΔΟΣ", "İstanbul", "naïve żółw"]
            agent = await _agent(db, texts)
            for query, expected in [
                ("CAFÉ", texts[0]),
                ("東京タワー", texts[1]),
                ("οδος", texts[2]),
                ("İSTANBUL", texts[3]),
                ("ŻÓŁW NAÏVE", texts[4]),
            ]:
                await _assert_finds(db, agent, query, {expected})
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


# -- properties ----------------------------------------------------------------------

PROPERTY = settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=40)
NOISE = [
    '"',
    "'",
    "AND",
    "OR",
    "NOT",
    "NEAR",
    "*",
    ":*",
    "&",
    "|",
    "!",
    "<->",
    "(",
    ")",
    "^",
    "-",
    "\\",
    ";--",
]


@PROPERTY
@given(pieces=st.lists(TEXT, min_size=1, max_size=6), glue=st.sampled_from([" ", "\n", "\t", "  "]))
async def test_any_word_of_a_stored_text_finds_it(db: Database, pieces: list[str], glue: str) -> None:
    text = glue.join(pieces)
    agent = await _agent(db, [text])
    # The text's own words, and each piece as written (a search box gets raw text).
    queries = list(dict.fromkeys(oracle_words(text)))[:8] + [p for p in pieces if oracle_words(p)]
    for query in queries:
        assert oracle_matches(text, query)
        await _assert_finds(db, agent, query, {text})


@PROPERTY
@given(
    corpus=st.lists(TEXT, min_size=1, max_size=4),
    parts=st.lists(st.one_of(st.sampled_from(NOISE), TEXT), max_size=5),
    glue=st.sampled_from([" ", ""]),
)
async def test_search_finds_exactly_the_texts_with_every_query_word(
    db: Database, corpus: list[str], parts: list[str], glue: str
) -> None:
    # Query syntax of either engine, SQL and arbitrary text are all just words.
    agent = await _agent(db, corpus)
    query = glue.join(parts)
    expected = {text for text in corpus if oracle_matches(text, query)}
    await _assert_finds(db, agent, query, expected)
    if "\x00" not in query:
        async with db.unit_of_work(read_only=True) as uow:
            assert await uow.messages.count((await uow.sessions.list(agent)).items[0].id) == len(corpus)


@PROPERTY
@given(
    corpus=st.lists(st.lists(st.sampled_from(["kiwi", "fig", "lime", "Ωmega", "ΩMEGA", "x1"]), max_size=6))
)
async def test_both_engines_rank_matches_by_their_count_of_distinct_words(
    db: Database, corpus: list[list[str]]
) -> None:
    # Relevance: fewer distinct words first (bm25 and ts_rank alike), then newest, then id.
    texts = [" ".join(words) for words in corpus]
    agent = await _agent(db, texts)  # in order: later texts are newer
    for query in ["kiwi", "fig lime", "ωMEGA"]:
        hits = [(len(set(oracle_words(t))), -n) for n, t in enumerate(texts) if oracle_matches(t, query)]
        expected = [texts[-n] for _, n in sorted(hits)]
        async with db.unit_of_work(read_only=True) as uow:
            messages = await uow.messages.search(agent, query, limit=1000)
            passages = await uow.passages.search_text(agent, query, limit=1000)
        assert [m.content for m in messages] == expected
        assert [p.text for p in passages] == expected
