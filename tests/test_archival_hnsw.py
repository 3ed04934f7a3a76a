"""HNSW indexes on Postgres: built by ensure_index, used by search, accurate enough.

Postgres only (SQLite searches exactly and ``ensure_index`` is a no-op there):
the module parametrises the ``engine`` fixture with the postgres param alone,
so these tests carry the ``postgres`` mark and count in CI.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.lowlevel
import numpy as np
import pytest
import sqlalchemy as sa
from archival_reference import reference
from sqlalchemy import event

from memorm import Agent, Database, UnitOfWork, ValidationError
from memorm.testing import capture_statements

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.parametrize("engine", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True),
]

DIM = 384


def _unit_vectors(seed: int, n: int, dim: int = DIM) -> np.ndarray:
    vectors = np.random.default_rng(seed).standard_normal((n, dim))
    return (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)


def _exact_cosine(vectors: np.ndarray, ids: list[uuid.UUID], query: np.ndarray, k: int) -> list[uuid.UUID]:
    return [passage_id for passage_id, _ in reference(vectors, ids, query, "cosine", k)]


async def _load(db: Database, vectors: np.ndarray, *, batch: int = 5_000) -> tuple[Agent, list[uuid.UUID]]:
    """One agent holding ``vectors`` (model "m"), beside another agent holding 50 of them."""
    ids: list[uuid.UUID] = []
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("sam")
        neighbour = await uow.agents.create("max")
        for start in range(0, len(vectors), batch):
            chunk = vectors[start : start + batch]
            added = await uow.passages.add_many(
                agent.id, [{"text": "t", "embedding": v, "embedding_model": "m"} for v in chunk]
            )
            ids += [p.id for p in added]
        await uow.passages.add_many(
            neighbour.id, [{"text": "t", "embedding": v, "embedding_model": "m"} for v in vectors[:50]]
        )
    return agent, ids


async def _analyze(db: Database) -> None:
    # Autovacuum would analyze the table sooner or later; doing it now makes the plans deterministic.
    async with db.unit_of_work() as uow:
        await uow.session.execute(sa.text("ANALYZE archival_passages"))


def _capture(db: Database) -> Any:
    """The statements (and their parameters) sent to the driver inside the block."""
    return capture_statements(db)


async def _search_plan(uow: UnitOfWork, agent: Agent, query: np.ndarray, **options: Any) -> str:
    """EXPLAIN of the very statement search sends, with its parameters and session settings."""
    with _capture(uow.backend) as sent:
        await uow.passages.search(agent.id, query, k=10, embedding_model="m", **options)
    [(statement, parameters)] = [(s, p) for s, p in sent if "ORDER BY distance" in s]
    driver = (await (await uow.session.connection()).get_raw_connection()).driver_connection
    rows = await driver.fetch(f"EXPLAIN {statement}", *parameters)
    return "\n".join(row[0] for row in rows)


async def _hnsw_indexes(uow: UnitOfWork) -> dict[str, str]:
    rows = await uow.session.execute(
        sa.text(
            "SELECT indexname, indexdef FROM pg_indexes "
            "WHERE schemaname = current_schema() AND indexdef LIKE '%USING hnsw%'"
        )
    )
    return {name: definition for name, definition in rows}


async def test_ensure_index_builds_one_partial_hnsw_index_per_shape_and_metric(db: Database) -> None:
    shapes = [("cosine", "float32"), ("l2", "float32"), ("inner_product", "float32"), ("cosine", "float16")]
    async with db.unit_of_work() as uow:
        names = [await uow.passages.ensure_index("m", DIM, m, precision=p) for m, p in shapes]
        again = [await uow.passages.ensure_index("m", DIM, m, precision=p) for m, p in shapes]
        definitions = await _hnsw_indexes(uow)
    assert again == names
    assert len(set(names)) == 4
    assert set(definitions) == set(names)
    for name, ops in zip(
        names, ["vector_cosine_ops", "vector_l2_ops", "vector_ip_ops", "halfvec_cosine_ops"], strict=True
    ):
        assert ops in definitions[name]
        assert "embedding_model = 'm'::text" in definitions[name]
        assert f"embedding_dim = {DIM}" in definitions[name]


@pytest.mark.single_node  # a query plan of the one server (on Citus: tests/test_citus.py)
async def test_search_uses_the_hnsw_index_after_ensure_index(db: Database) -> None:
    vectors = _unit_vectors(1, 5_000)
    agent, _ = await _load(db, vectors)
    async with db.unit_of_work() as uow:
        name = await uow.passages.ensure_index("m", DIM, "cosine")
    await _analyze(db)
    async with db.unit_of_work(read_only=True) as uow:
        plan = await _search_plan(uow, agent, vectors[7])
    assert f"Index Scan using {name}" in plan, plan


@pytest.mark.single_node  # its plain EXPLAIN fails on a Citus worker (tests/test_citus.py covers it)
async def test_filtered_search_through_the_index_still_returns_k_matches(db: Database) -> None:
    vectors = _unit_vectors(4, 5_000)
    rare = [i % 100 < 7 for i in range(len(vectors))]  # 350 rows, 7%: most index candidates fail
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("sam")
        added = await uow.passages.add_many(
            agent.id,
            [
                {"text": "t", "embedding": v, "embedding_model": "m", "meta": {"rare": r}}
                for v, r in zip(vectors, rare, strict=True)
            ],
        )
        name = await uow.passages.ensure_index("m", DIM, "cosine")
    await _analyze(db)
    keep = np.array(rare)
    rare_ids = [p.id for p, r in zip(added, rare, strict=True) if r]
    async with db.unit_of_work(read_only=True) as uow:
        plan = await _search_plan(uow, agent, vectors[0], where={"rare": True})
        recalls = []
        for query in _unit_vectors(5, 10):
            hits = await uow.passages.search(
                agent.id, query, k=20, embedding_model="m", where={"rare": True}, ef_search=100
            )
            assert len(hits) == 20
            assert all(hit.passage.meta == {"rare": True} for hit in hits)
            exact = set(_exact_cosine(vectors[keep], rare_ids, query, 20))
            recalls.append(len(exact & {hit.passage.id for hit in hits}) / 20)
    assert f"Index Scan using {name}" in plan, plan
    assert np.mean(recalls) >= 0.9, recalls


@pytest.mark.single_node  # a query plan of the one server (on Citus: tests/test_citus.py)
async def test_without_a_matching_index_search_is_an_exact_scan(db: Database) -> None:
    vectors = _unit_vectors(2, 1_000)
    agent, ids = await _load(db, vectors)
    async with db.unit_of_work() as uow:
        await uow.passages.ensure_index("m", DIM, "l2")  # another metric's index cannot serve cosine
    await _analyze(db)
    queries = _unit_vectors(3, 5)
    async with db.unit_of_work(read_only=True) as uow:
        plan = await _search_plan(uow, agent, queries[0])
        for query in queries:
            hits = await uow.passages.search(agent.id, query, k=10, embedding_model="m")
            assert [hit.passage.id for hit in hits] == _exact_cosine(vectors, ids, query, 10)
    assert "hnsw" not in plan, plan
    assert "Sort" in plan, plan


def _clustered(seed: int, n: int, clusters: int) -> tuple[np.ndarray, np.ndarray]:
    """Unit vectors from a mixture of Gaussian clusters, and queries drawn near the centres."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((clusters, DIM))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    points = centres[rng.integers(clusters, size=n)] + rng.standard_normal((n, DIM)) / np.sqrt(DIM)
    points /= np.linalg.norm(points, axis=1, keepdims=True)
    near = centres[rng.choice(clusters, size=50, replace=False)]
    queries = near + 0.3 * rng.standard_normal((50, DIM)) / np.sqrt(DIM)
    return points.astype(np.float32), queries.astype(np.float32)


@pytest.mark.long
async def test_hnsw_recall_at_10_is_at_least_95_percent_on_clustered_vectors(db: Database) -> None:
    vectors, queries = _clustered(20_000, 20_000, 200)
    agent, ids = await _load(db, vectors, batch=5_000)
    async with db.unit_of_work() as uow:
        name = await uow.passages.ensure_index("m", DIM, "cosine")
        assert await uow.passages.count(agent.id, embedding_model="m") == 20_000
    await _analyze(db)
    recalls = []
    async with db.unit_of_work(read_only=True) as uow:
        # Approximate for real: an exact scan would pass any recall bar.
        assert f"Index Scan using {name}" in await _search_plan(uow, agent, queries[0], ef_search=100)
        for query in queries:
            hits = await uow.passages.search(agent.id, query, k=10, embedding_model="m", ef_search=100)
            assert len(hits) == 10
            exact = set(_exact_cosine(vectors, ids, query, 10))
            recalls.append(len(exact & {hit.passage.id for hit in hits}) / 10)
    assert np.mean(recalls) >= 0.95, recalls


async def test_build_options_spliced_into_the_ddl_are_refused_and_a_later_build_still_runs(
    db: Database,
) -> None:
    # The payload: once "WITH (m = 16) WHERE (false) --" reached the
    # catalog, every later ensure_index found the (empty) index and did nothing.
    async with db.unit_of_work() as uow:
        with _capture(db) as sent:
            with pytest.raises(ValidationError):
                await uow.passages.ensure_index("m", DIM, "cosine", m="16) WHERE (false) --")  # type: ignore[arg-type]
            with pytest.raises(ValidationError):
                await uow.passages.ensure_index(
                    "m",
                    DIM,
                    "cosine",
                    ef_construction="64) WHERE (false) --",  # type: ignore[arg-type]
                )
        assert sent == []  # refused before any statement
        assert await _hnsw_indexes(uow) == {}
    async with db.unit_of_work() as uow:
        name = await uow.passages.ensure_index("m", DIM, "cosine", m=24, ef_construction=100)
        definitions = await _hnsw_indexes(uow)
        again = await uow.passages.ensure_index("m", DIM, "cosine", m=24, ef_construction=100)
    assert again == name
    assert list(definitions) == [name]
    assert definitions[name].endswith(
        f"USING hnsw (((embedding)::vector({DIM})) vector_cosine_ops) "
        "WITH (m='24', ef_construction='100') "
        f"WHERE ((embedding_model = 'm'::text) AND (embedding_dim = {DIM}))"
    )


@pytest.mark.parametrize("model", ["x') OR (true) --", "a\\'b%$1", "naïve\nname"], ids=repr)
async def test_a_model_name_reaches_the_index_predicate_as_one_literal(db: Database, model: str) -> None:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("sam")
        await uow.passages.add_many(
            agent.id, [{"text": "t", "embedding": v, "embedding_model": model} for v in _unit_vectors(6, 50)]
        )
        await uow.passages.add_many(  # another model, named like the start of the payload
            agent.id, [{"text": "t", "embedding": v, "embedding_model": "x"} for v in _unit_vectors(7, 10)]
        )
        name = await uow.passages.ensure_index(model, DIM, "cosine")
        [predicate] = (
            await uow.session.execute(
                sa.text(
                    "SELECT pg_get_expr(indpred, indrelid) FROM pg_index "
                    "WHERE indexrelid = to_regclass(:name)"
                ),
                {"name": name},
            )
        ).scalars()
        # The predicate holds the name itself: it matches that model's rows and no others.
        matched = await uow.session.scalar(
            sa.text(f"SELECT count(*) FROM archival_passages WHERE {predicate}")
        )
        # The search writes the name into its SQL as a literal too (to match the index).
        hits = await uow.passages.search(agent.id, _unit_vectors(7, 1)[0], k=60, embedding_model=model)
    assert matched == 50
    assert len(hits) == 50
    assert {hit.passage.embedding_model for hit in hits} == {model}


async def _small_archive(db: Database) -> Agent:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("sam")
        items = [
            {"text": f"t{i}", "embedding": v, "embedding_model": "m"}
            for i, v in enumerate(_unit_vectors(8, 40))
        ]
        await uow.passages.add_many(agent.id, items)
    return agent


@asynccontextmanager
async def _round_trips(uow: UnitOfWork) -> AsyncIterator[list[str]]:
    """Every statement the unit of work's connection sends inside the block.

    SQLAlchemy's (prepared: its cursor events see them) and those sent on the
    driver directly (BEGIN, SET LOCAL: asyncpg's query logger sees them).
    """
    sent: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        sent.append(statement)

    def logged(query: Any) -> None:
        sent.append(query.query)

    driver = (await (await uow.session.connection()).get_raw_connection()).driver_connection
    event.listen(uow.backend.engine.sync_engine, "before_cursor_execute", record)
    driver.add_query_logger(logged)
    try:
        yield sent
    finally:
        await anyio.lowlevel.checkpoint()  # asyncpg hands logged queries to its loggers with call_soon
        driver.remove_query_logger(logged)
        event.remove(uow.backend.engine.sync_engine, "before_cursor_execute", record)


@pytest.mark.parametrize("read_only", [True, False], ids=["read-only", "writing"])
async def test_a_search_sends_one_statement_with_the_passages_and_their_distances(
    db: Database, read_only: bool
) -> None:
    agent = await _small_archive(db)
    query = _unit_vectors(9, 1)[0]
    async with db.unit_of_work(read_only=True) as uow:  # looks the model up, and caches it on db
        expected = await uow.passages.search(agent.id, query, k=5, embedding_model="m")
    async with db.unit_of_work(read_only=read_only) as uow, _round_trips(uow) as sent:
        hits = await uow.passages.search(agent.id, query, k=5, embedding_model="m")
    # A unit of work whose session was asked for (here, to watch its connection) is in its
    # transaction from then on, read-only too: its BEGIN went before the watching began.
    # On Citus the settings must reach the workers: SET LOCAL in the transaction, one
    # message more.
    assert not [statement for statement in sent if statement.startswith("BEGIN")], sent
    assert len(sent) == (2 if db.distributed else 1), sent
    assert len([statement for statement in sent if "ORDER BY distance" in statement]) == 1
    assert [(hit.passage.id, hit.passage.text, hit.distance) for hit in hits] == [
        (hit.passage.id, hit.passage.text, hit.distance) for hit in expected
    ]
    assert len(hits) == 5
    assert all(len(hit.passage.embedding) == DIM for hit in hits)


async def _setting(uow: UnitOfWork, name: str) -> str:
    return str(await uow.session.scalar(sa.text(f"SHOW {name}")))


@pytest.mark.single_node  # on Citus the settings are sent with every search (tests/test_citus.py)
async def test_an_ef_search_given_to_one_search_never_reaches_another(store: Any) -> None:
    db = store.database(pool_size=1, max_overflow=0)  # every unit of work on the one connection
    try:
        await db.create_all()
        agent = await _small_archive(db)
        query = _unit_vectors(9, 1)[0]
        async with db.unit_of_work(read_only=True) as uow:
            assert await _setting(uow, "hnsw.ef_search") == "40"  # set up with the connection
            assert await _setting(uow, "hnsw.iterative_scan") == "strict_order"
        for read_only, commit in ((True, True), (False, True), (False, False)):
            async with db.unit_of_work(read_only=read_only) as uow:
                await uow.passages.search(agent.id, query, k=3, embedding_model="m", ef_search=123)
                assert await _setting(uow, "hnsw.ef_search") == "123"
                await uow.passages.search(agent.id, query, k=3, embedding_model="m")  # the default again
                assert await _setting(uow, "hnsw.ef_search") == "40"
                await uow.passages.search(agent.id, query, k=3, embedding_model="m", ef_search=77)
                if not commit:
                    await uow.rollback()
            async with db.unit_of_work(read_only=True) as uow:
                assert await _setting(uow, "hnsw.ef_search") == "40", (read_only, commit)
    finally:
        await db.dispose()


@pytest.mark.single_node
async def test_the_callers_server_settings_win_over_the_connections_hnsw_defaults(store: Any) -> None:
    settings = {**store.options["connect_args"]["server_settings"], "hnsw.ef_search": "64"}
    db = store.database(connect_args={"server_settings": settings})
    try:
        await db.create_all()
        async with db.unit_of_work(read_only=True) as uow:
            assert await _setting(uow, "hnsw.ef_search") == "64"
            assert await _setting(uow, "hnsw.iterative_scan") == "strict_order"
    finally:
        await db.dispose()


@pytest.mark.single_node  # the plans of a distributed query are the coordinator's and the workers'
async def test_a_first_page_is_planned_once_and_later_pages_share_one_statement(db: Database) -> None:
    """A first page's limits are literals, so Postgres settles on one (generic) plan for its
    prepared statement instead of planning each search anew; pages past the first keep their
    limits as parameters, so paging prepares no statement per offset."""
    agent = await _small_archive(db)
    queries = _unit_vectors(10, 12)
    async with db.unit_of_work(read_only=True) as uow:
        with _capture(db) as sent:
            firsts = [await uow.passages.search(agent.id, q, k=5, embedding_model="m") for q in queries]
            later = [
                await uow.passages.search(agent.id, queries[0], k=5, offset=o, embedding_model="m")
                for o in (5, 10)
            ]
        plans = await uow.link.driver.fetch(
            "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements "
            "WHERE statement LIKE '%ORDER BY distance%'"
        )
    searches = [statement for statement, _ in sent if "ORDER BY distance" in statement]
    first, *_ = searches
    assert "LIMIT 21" in first  # k and the tie margin, as literals
    assert "LIMIT $" not in first
    assert set(searches[: len(queries)]) == {first}
    assert searches[-2] == searches[-1] != first  # one statement for every later page
    assert "LIMIT $" in searches[-1]
    [(_, generic, custom)] = [row for row in plans if row["statement"] == first]
    assert custom <= 5 < generic + custom  # Postgres's five custom plans, then one generic plan
    assert generic == len(queries) - custom
    # Paging gives the ranking the first page continues.
    whole = await _first_page(db, agent, queries[0], 15)
    assert [hit.passage.id for hits in (firsts[0], *later) for hit in hits] == whole


async def _first_page(db: Database, agent: Agent, query: np.ndarray, k: int) -> list[uuid.UUID]:
    async with db.unit_of_work(read_only=True) as uow:
        return [
            hit.passage.id for hit in await uow.passages.search(agent.id, query, k=k, embedding_model="m")
        ]
