"""MemormStore: LangGraph's long-term store on memorm: tenants, agents, TTL, semantic search, graphs."""

from __future__ import annotations

import asyncio
import logging
import math
import operator
import re
import uuid
from datetime import date, datetime, time, timedelta, timezone
from pathlib import Path
from typing import Annotated, Any

import anyio
import pytest
import sqlalchemy as sa
from hypothesis import example, given
from hypothesis import strategies as st
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.store.base import BaseStore, GetOp, InvalidNamespaceError, PutOp, SearchOp
from langgraph.store.sqlite import SqliteStore
from probes import count_sqlite_hops
from typing_extensions import TypedDict

from memorm import Database, NotFoundError, ValidationError
from memorm.compat.langgraph import AsyncMemormStore, BlockingCallError, MemormSaver, MemormStore
from memorm.errors import ConflictError
from memorm.models import STORE_ITEMS, STORE_VECTORS
from memorm.search import store_vectors
from memorm.testing import capture_statements
from memorm.types import utcnow

pytestmark = pytest.mark.anyio

DIMS = 4
# A tiny deterministic embedding: each word a unit axis, so scores are known exactly.
_AXES = {"cat": 0, "dog": 1, "fish": 2, "bird": 3}


def embed(texts: list[str]) -> list[list[float]]:
    vectors = []
    for text in texts:
        vector = [0.0] * DIMS
        for word in text.lower().replace('"', " ").replace("{", " ").replace("}", " ").split():
            if word.strip(":,") in _AXES:
                vector[_AXES[word.strip(":,")]] += 1.0
        vectors.append(vector if any(vector) else [0.1] * DIMS)
    return vectors


async def _agent(db: Database, name: str = "memory") -> uuid.UUID:
    async with db.unit_of_work() as uow:
        return (await uow.agents.create(name)).id


async def _rows(db: Database, table: sa.Table) -> int:
    async with db.unit_of_work(read_only=True) as uow:
        return int(await uow.session.scalar(sa.select(sa.func.count()).select_from(table)) or 0)


async def test_put_get_search_delete_round_trip(db: Database) -> None:
    store = MemormStore(db, agent=await _agent(db))
    await store.aput(("users", "42"), "food", {"likes": "pizza", "n": 3})
    item = await store.aget(("users", "42"), "food")
    assert item is not None
    assert item.value == {"likes": "pizza", "n": 3}
    assert item.namespace == ("users", "42")
    assert item.key == "food"
    await store.aput(("users", "42"), "food", {"likes": "sushi", "n": 5})
    again = await store.aget(("users", "42"), "food")
    assert again is not None
    assert again.value["likes"] == "sushi"
    assert again.created_at == item.created_at
    assert again.updated_at > item.updated_at
    await store.aput(("users", "420"), "food", {"likes": "tea", "n": 1})
    await store.aput(("users", "4"), "food", {"likes": "soup", "n": 9})
    # ("users", "42") does not contain ("users", "420") nor ("users", "4").
    assert [i.value["likes"] for i in await store.asearch(("users", "42"))] == ["sushi"]
    assert len(await store.asearch(("users",))) == 3
    found = await store.asearch(("users",), filter={"n": {"$gte": 3, "$lt": 9}})
    assert [i.value["likes"] for i in found] == ["sushi"]
    assert {i.value["likes"] for i in await store.asearch(("users",), filter={"n": {"$ne": 5}})} == {
        "tea",
        "soup",
    }
    assert await store.alist_namespaces(prefix=("users",)) == [
        ("users", "4"),
        ("users", "42"),
        ("users", "420"),
    ]
    assert await store.alist_namespaces(max_depth=1) == [("users",)]
    await store.adelete(("users", "42"), "food")
    assert await store.aget(("users", "42"), "food") is None


async def test_datetimes_and_uuids_in_a_value_are_stored_as_langgraphs_sqlite_store_stores_them(
    db: Database,
) -> None:
    when = datetime(2026, 12, 7, 6, 45, 5, 123456, tzinfo=timezone.utc)
    value = {
        "when": when,
        "naive": datetime(2026, 1, 2, 3, 4, 5),
        "days": [date(2026, 1, 2), time(9, 30)],
        "id": uuid.UUID("12345678-1234-5678-1234-567812345678"),
        "plain": {"n": 1, "at": (when,)},
    }
    store = MemormStore(db, agent=await _agent(db))
    await store.aput(("dates",), "k", value)
    item = await store.aget(("dates",), "k")
    assert item is not None

    def langgraphs() -> Any:
        with SqliteStore.from_conn_string(":memory:") as theirs:
            theirs.setup()
            theirs.put(("dates",), "k", value)
            return theirs.get(("dates",), "k")

    assert item.value == (await anyio.to_thread.run_sync(langgraphs)).value
    assert item.value["when"] == "2026-12-07T06:45:05.123456+00:00"
    assert item.value["plain"] == {"n": 1, "at": ["2026-12-07T06:45:05.123456+00:00"]}
    with pytest.raises(ValidationError, match="is not a JSON number"):  # converted, still checked
        await store.aput(("dates",), "bad", {"when": when, "x": math.nan})
    with pytest.raises(ValidationError, match="set is not JSON"):
        await store.aput(("dates",), "bad", {"when": when, "x": {1}})
    assert await store.aget(("dates",), "bad") is None


async def test_an_aput_is_one_call_that_commits_itself_and_replaces_the_items_embeddings(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lone `aput`: on SQLite one hop (BEGIN, delete, inserts, COMMIT); on Postgres one statement.

    On Citus, or under row-level security, Postgres sends the delete and the inserts
    in a transaction.
    """
    store = MemormStore(db, agent=await _agent(db), index={"dims": DIMS, "embed": embed, "fields": ["a"]})
    await store.aput(("zoo",), "pet", {"a": "cat"})
    hops = count_sqlite_hops(monkeypatch)
    with capture_statements(db) as sent:
        await store.aput(("zoo",), "pet", {"b": "no text to embed"})
    kinds = [sql.split()[0].upper() for sql, _ in sent]
    if db.dialect == "sqlite":
        assert kinds == ["BEGIN", "DELETE", "INSERT", "COMMIT"]
        assert len(hops) == 1
    elif db.bypasses_rls and not db.distributed:
        assert kinds == ["WITH"]  # the old embeddings' delete rides along the item's upsert
    else:
        assert kinds.count("BEGIN") == kinds.count("COMMIT") == 1
    assert await _rows(db, STORE_VECTORS) == 0  # "cat"'s embedding went with the value it embedded
    with capture_statements(db) as sent:  # with an embedding
        await store.aput(("zoo",), "pet", {"a": "dog"})
    kinds = [sql.split()[0].upper() for sql, _ in sent]
    if db.dialect == "sqlite":
        assert kinds == ["BEGIN", "DELETE", "INSERT", "INSERT", "COMMIT"]
    elif db.bypasses_rls and not db.distributed:
        assert kinds == ["WITH"]  # the item's upsert and the old embeddings' delete ride along
    else:
        assert kinds.count("BEGIN") == kinds.count("COMMIT") == 1
    assert await _rows(db, STORE_VECTORS) == 1
    assert [item.key for item in await store.asearch(("zoo",), query="dog")] == ["pet"]
    gone = MemormStore(db, agent=uuid.uuid4())
    with pytest.raises(NotFoundError, match="no agent"):
        await gone.aput(("zoo",), "pet", {"a": "cat"})


async def test_filters_compare_values_of_the_same_json_type(db: Database) -> None:
    store = MemormStore(db, agent=await _agent(db))
    values = {
        "one": {"n": 1, "s": "apple"},
        "half": {"n": 2.5, "s": "banana"},
        "text": {"n": "3", "s": "cherry"},
        "bool": {"n": True},
        "none": {"n": None},
        "list": {"n": [1], "tags": ["a", "b"]},
        "missing": {"other": 1},
    }
    for key, value in values.items():
        await store.aput(("f",), key, value)

    async def keys(where: dict[str, Any]) -> set[str]:
        return {item.key for item in await store.asearch(("f",), filter=where, limit=100)}

    assert await keys({"n": {"$gt": 0}}) == {"one", "half"}  # not "3", not True
    assert await keys({"n": {"$gte": 1, "$lt": 2.5}}) == {"one"}
    assert await keys({"n": {"$lte": "3"}}) == {"text"}
    assert await keys({"s": {"$gt": "apple"}}) == {"half", "text"}
    assert await keys({"n": 1}) == {"one"}  # True is not 1
    assert await keys({"n": {"$eq": True}}) == {"bool"}
    assert await keys({"n": None}) == {"none"}
    assert await keys({"n": {"$ne": 1}}) == set(values) - {"one"}  # a missing key is "not 1"
    assert await keys({"tags": ["a", "b"]}) == {"list"}
    assert await keys({"n": [1]}) == {"list"}
    with pytest.raises(ValidationError):  # checked before the batch runs: its put never happens
        await store.abatch([PutOp(("f",), "new", {"n": 9}), SearchOp(("f",), filter={"n": {"$in": [1]}})])
    assert await store.aget(("f",), "new") is None


FILTERED = {  # items for the filter property: every JSON type under "n", strings under "s"
    "i1": {"n": 1, "s": "a"},
    "i2": {"n": 2, "s": "b"},
    "f1": {"n": 1.0, "s": "apple"},
    "f25": {"n": 2.5, "s": "3"},
    "neg": {"n": -3, "s": "c"},
    "s3": {"n": "3"},
    "sa": {"n": "a", "s": "a"},
    "t": {"n": True, "s": "b"},
    "f": {"n": False},
    "null": {"n": None, "s": None},
    "list": {"n": [1, 2], "s": ["a"]},
    "obj": {"n": {"k": 1}},
    "none": {"other": 0},
    "json-text": {"n": "[1,2]", "s": '{"k":1}'},  # strings that read like the list's and object's JSON
}
_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.sampled_from([1.0, 2.5]),
    st.sampled_from(["a", "b", "3", "[1,2]", '{"k":1}']),
)
_ORDERED = st.one_of(st.integers(-4, 4), st.sampled_from([1.5, 2.5, "3", "a", "apple", "b", "c"]))
_CONDITIONS = st.one_of(
    _SCALARS,
    st.sampled_from([[1, 2], ["a"], {"k": 1}]),
    st.dictionaries(st.sampled_from(["$eq", "$ne"]), _SCALARS, min_size=1, max_size=2),
    st.dictionaries(st.sampled_from(["$gt", "$gte", "$lt", "$lte"]), _ORDERED, min_size=1, max_size=2),
)


def _json_equal(have: Any, want: Any) -> bool:
    """JSON equality: values of one JSON type (True is not 1; 1 is 1.0)."""

    def kind(value: Any) -> str:
        if isinstance(value, bool) or value is None:
            return repr(value)
        return "number" if isinstance(value, (int, float)) else type(value).__name__

    return kind(have) == kind(want) and have == want


def _holds(value: dict[str, Any], where: dict[str, Any]) -> bool:
    """The store's filter semantics, in Python: the oracle."""
    compare = {"$gt": operator.gt, "$gte": operator.ge, "$lt": operator.lt, "$lte": operator.le}
    for key, condition in where.items():
        tests = (
            condition.items()
            if isinstance(condition, dict) and "$" in "".join(condition)
            else [("$eq", condition)]
        )
        for name, operand in tests:
            present, have = key in value, value.get(key)
            if name == "$eq" and not (present and _json_equal(have, operand)):
                return False
            if name == "$ne" and present and _json_equal(have, operand):
                return False
            if name in compare:
                number = not isinstance(operand, str)
                same = (
                    isinstance(have, (int, float)) and not isinstance(have, bool)
                    if number
                    else isinstance(have, str)
                )
                if not (present and same and compare[name](have, operand)):
                    return False
    return True


@given(where=st.dictionaries(st.sampled_from(["n", "s"]), _CONDITIONS, min_size=1, max_size=2))
async def test_filters_find_what_the_python_oracle_finds(db: Database, where: dict[str, Any]) -> None:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.get_by_name("filters")
        made = agent is None
        if agent is None:
            agent = await uow.agents.create("filters")
    store = MemormStore(db, agent=agent.id)
    if made:
        for key, value in FILTERED.items():
            await store.aput(("f",), key, value)
    found = {item.key for item in await store.asearch(("f",), filter=where, limit=100)}
    assert found == {key for key, value in FILTERED.items() if _holds(value, where)}


async def test_searches_of_one_filter_shape_send_one_statement_text(db: Database) -> None:
    store = MemormStore(db, agent=await _agent(db))
    await store.aput(("p", "q"), "k", {"color": "red", "size": 3})
    with capture_statements(db) as sent:
        assert len(await store.asearch(("p",), filter={"color": "red"})) == 1
        assert await store.asearch(("p",), filter={"shape": "round"}) == []
        assert len(await store.asearch(("p", "q"), filter={"size": {"$gt": 2}})) == 1
    first, second, third = (sql for sql, _ in sent if "graph_store_items" in sql)  # (not the tenant's)
    assert first == second  # built and compiled once for this shape, whatever the keys and values
    assert third != first


async def test_two_tenants_stores_never_see_each_other(db: Database) -> None:
    acme, globex = db.for_tenant("acme"), db.for_tenant("globex")
    acme_store = MemormStore(acme, agent=await _agent(acme))
    globex_agent = await _agent(globex)
    globex_store = MemormStore(globex, agent=globex_agent)
    await acme_store.aput(("shared",), "k", {"owner": "acme"})
    await globex_store.aput(("shared",), "k", {"owner": "globex"})
    acme_item = await acme_store.aget(("shared",), "k")
    assert acme_item is not None
    assert acme_item.value == {"owner": "acme"}
    assert [i.value["owner"] for i in await globex_store.asearch(())] == ["globex"]
    assert await globex_store.alist_namespaces() == [("shared",)]
    # Another tenant's agent id is an unknown agent: nothing to read, and nothing to write.
    intruder = MemormStore(acme, agent=globex_agent)
    assert await intruder.aget(("shared",), "k") is None
    assert await intruder.asearch(()) == []
    with pytest.raises(Exception, match="no agent"):
        await intruder.aput(("shared",), "x", {"v": 1})
    await db.delete_tenant("acme")
    assert await acme_store.asearch(()) == []
    globex_item = await globex_store.aget(("shared",), "k")
    assert globex_item is not None
    assert globex_item.value == {"owner": "globex"}


async def test_deleting_the_agent_deletes_its_items_and_vectors(db: Database) -> None:
    index = {"dims": DIMS, "embed": embed, "fields": ["text"]}
    gone, kept = await _agent(db, "gone"), await _agent(db, "kept")
    for agent in (gone, kept):
        await MemormStore(db, agent=agent, index=index).aput(("notes",), "k", {"text": "cat"})
    assert await _rows(db, STORE_VECTORS) == 2
    async with db.unit_of_work() as uow:
        await uow.agents.delete(gone)
    assert await _rows(db, STORE_ITEMS) == 1
    assert await _rows(db, STORE_VECTORS) == 1
    assert await MemormStore(db, agent=kept).aget(("notes",), "k") is not None


async def _backdate(db: Database, key: str, minutes: float) -> None:
    """Move an item's expiry `minutes` into the past (as if that much time went by)."""
    async with db.unit_of_work() as uow:
        await uow.session.execute(
            sa.update(STORE_ITEMS)
            .where(STORE_ITEMS.c.key == key)
            .values(expires_at=utcnow() - timedelta(minutes=minutes))
        )


async def test_expired_items_are_read_until_swept_unless_omit_expired(db: Database) -> None:
    # LangGraph's default (omit_expired False): an expired item stays until a sweep deletes it.
    agent = await _agent(db)
    store = MemormStore(db, agent=agent, ttl={"default_ttl": 10, "refresh_on_read": False})
    await store.aput(("ttl",), "old", {"v": 1})
    await store.aput(("ttl",), "forever", {"v": 2}, ttl=None)
    await store.aput(("other",), "old2", {"v": 3})
    await _backdate(db, "old", 1)
    await _backdate(db, "old2", 1)
    late = await _expires(db, "old")
    assert (await store.aget(("ttl",), "old")) is not None  # expired, not yet swept
    assert sorted(i.key for i in await store.asearch(("ttl",))) == ["forever", "old"]
    assert await store.alist_namespaces() == [("other",), ("ttl",)]
    assert await _expires(db, "old") == late  # read without refresh
    # omit_expired: reads skip them, and a read that refreshes does not bring them back.
    omitting = MemormStore(db, agent=agent, ttl={"default_ttl": 10, "omit_expired": True})
    assert await omitting.aget(("ttl",), "old", refresh_ttl=True) is None
    assert [i.key for i in await omitting.asearch(("ttl",), refresh_ttl=True)] == ["forever"]
    assert await omitting.alist_namespaces() == [("ttl",)]
    assert await _expires(db, "old") == late
    # Without omit_expired, a read that refreshes does (as LangGraph's stores).
    assert await store.aget(("ttl",), "old", refresh_ttl=True) is not None
    assert await _expires(db, "old") - utcnow() > timedelta(minutes=9)
    assert await _rows(db, STORE_ITEMS) == 3
    assert await store.asweep_ttl() == 1  # old2
    assert await _rows(db, STORE_ITEMS) == 2
    assert await anyio.to_thread.run_sync(store.sweep_ttl) == 0
    assert await store.alist_namespaces() == [("ttl",)]


_FAST = 0.002  # minutes between sweeps (0.12 s) in the sweeper tests


async def _swept(db: Database, left: int) -> None:
    """Wait (10 s at most) until the items left are `left`."""
    with anyio.fail_after(10):
        while await _rows(db, STORE_ITEMS) != left:  # noqa: ASYNC110 (the sweeper signals nothing: poll)
            await anyio.sleep(0.02)


async def test_the_async_sweeper_deletes_expired_items_until_stopped(db: Database) -> None:
    store = MemormStore(db, agent=await _agent(db), ttl={"default_ttl": 10, "sweep_interval_minutes": _FAST})
    await store.aput(("ttl",), "old", {"v": 1})
    await store.aput(("ttl",), "new", {"v": 2})
    task = await store.astart_ttl_sweeper()
    assert await store.astart_ttl_sweeper() is task  # one sweeper a store
    with pytest.raises(ConflictError, match="astart_ttl_sweeper"):
        store.start_ttl_sweeper()
    await _backdate(db, "old", 1)
    await _swept(db, 1)
    assert await store.astop_ttl_sweeper(timeout=5)
    assert task.cancelled()
    await _backdate(db, "new", 1)
    await anyio.sleep(_FAST * 60 * 3)  # stopped: nothing more is swept
    assert await _rows(db, STORE_ITEMS) == 1
    assert await store.astop_ttl_sweeper()  # again: nothing to stop
    again = await store.astart_ttl_sweeper(sweep_interval_minutes=_FAST)
    await _swept(db, 0)
    again.cancel()  # the task itself may be cancelled too
    assert await store.astop_ttl_sweeper(timeout=5)


async def test_the_sync_sweeper_runs_on_memorms_sync_loop_until_stopped_or_cancelled(db: Database) -> None:
    store = MemormStore(db, agent=await _agent(db), ttl={"default_ttl": 10})
    await store.aput(("ttl",), "old", {"v": 1})
    await store.aput(("ttl",), "new", {"v": 2})
    await _backdate(db, "old", 1)
    future = await anyio.to_thread.run_sync(store.start_ttl_sweeper, _FAST)
    assert store.start_ttl_sweeper() is future
    with pytest.raises(ConflictError, match="start_ttl_sweeper"):
        await store.astart_ttl_sweeper()
    await _swept(db, 1)  # the sweeper runs on while this loop awaits
    assert await anyio.to_thread.run_sync(store.stop_ttl_sweeper, 5)
    assert future.cancelled()
    # Cancelling its future stops it as well.
    future = await anyio.to_thread.run_sync(store.start_ttl_sweeper, _FAST)
    await _backdate(db, "new", 1)
    await _swept(db, 0)
    future.cancel()
    assert await store.astop_ttl_sweeper(timeout=5)
    assert store.stop_ttl_sweeper()


async def test_awaiting_the_sync_sweepers_future_stops_it_and_names_the_coroutine(db: Database) -> None:
    # Code written for AsyncPostgresStore awaits start_ttl_sweeper(): MemormStore's is sync.
    store = MemormStore(db, agent=await _agent(db), ttl={"default_ttl": 10})
    await store.aput(("ttl",), "old", {"v": 1})
    future = store.start_ttl_sweeper(_FAST)
    with pytest.raises(BlockingCallError, match=r"astart_ttl_sweeper\(\).*AsyncMemormStore"):
        await future
    assert future.cancelled()
    assert await store.astop_ttl_sweeper(timeout=5)  # nothing left running...
    await _backdate(db, "old", 1)
    await anyio.sleep(_FAST * 60 * 3)
    assert await _rows(db, STORE_ITEMS) == 1  # ...and nothing swept
    task = await store.astart_ttl_sweeper(_FAST)  # no sync sweeper in the way
    await _swept(db, 0)
    assert await store.astop_ttl_sweeper(timeout=5)
    assert task.cancelled()


async def test_the_async_store_awaits_setup_and_its_sweeper_as_langgraphs_async_store(db: Database) -> None:
    store = AsyncMemormStore(
        db, agent=await _agent(db), ttl={"default_ttl": 10, "sweep_interval_minutes": _FAST}
    )
    await store.setup()
    await store.aput(("ttl",), "old", {"v": 1})
    task = await store.start_ttl_sweeper()
    assert isinstance(task, asyncio.Task)
    await _backdate(db, "old", 1)
    await _swept(db, 0)
    assert await store.stop_ttl_sweeper(timeout=5)
    assert task.cancelled()
    with pytest.raises(BlockingCallError, match=r"await MemormStore.asetup\(\)"):
        MemormStore(db, agent=store.agent_id).setup()  # the sync store's on a running loop


async def test_a_failed_sweep_is_logged_and_the_next_one_runs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    empty = Database(f"sqlite+aiosqlite:///{tmp_path / 'not-upgraded.db'}")  # no tables: every sweep fails
    store = MemormStore(empty, agent=uuid.uuid4(), ttl={"default_ttl": 10, "sweep_interval_minutes": _FAST})
    with caplog.at_level(logging.WARNING, logger="memorm.compat.langgraph_store"):
        task = await store.astart_ttl_sweeper()
        with anyio.fail_after(10):
            while len(caplog.records) < 2:  # noqa: ASYNC110 (the sweeper signals nothing: poll)
                await anyio.sleep(0.02)
        assert not task.done()  # it carries on
        assert await store.astop_ttl_sweeper(timeout=5)
    assert all("a TTL sweep failed" in record.getMessage() for record in caplog.records)
    assert "memorm db upgrade" in caplog.records[0].getMessage()  # the SchemaError's words
    await empty.dispose()


async def test_without_a_ttl_config_there_is_no_sweeper(db: Database) -> None:
    store = MemormStore(db, agent=await _agent(db))
    future = store.start_ttl_sweeper()
    assert future.done()
    assert future.result() is None
    task = await store.astart_ttl_sweeper()
    await task
    assert store.stop_ttl_sweeper()
    assert await store.astop_ttl_sweeper()
    with pytest.raises(ValidationError, match="sweep_interval_minutes"):
        store.start_ttl_sweeper(-1)
    with pytest.raises(ValidationError, match="omit_expired"):
        MemormStore(db, agent=store.agent_id, ttl={"omit_expired": "yes"})


async def test_sync_methods_refuse_a_running_loops_thread_unless_allowed(db: Database) -> None:
    store = MemormStore(db, agent=await _agent(db))
    calls = [
        lambda: store.put(("loop",), "k", {"v": 1}),
        lambda: store.get(("loop",), "k"),
        lambda: store.search(("loop",)),
        lambda: store.list_namespaces(),
        lambda: store.batch([GetOp(("loop",), "k")]),
        store.sweep_ttl,
        store.setup,
    ]
    for call in calls:
        with pytest.raises(BlockingCallError, match="would block") as refused:
            call()
        assert isinstance(refused.value, asyncio.InvalidStateError)
    assert await _rows(db, STORE_ITEMS) == 0
    # From a worker thread they run; with allow_blocking, here too (blocking this loop a moment).
    await anyio.to_thread.run_sync(lambda: store.put(("loop",), "k", {"v": 1}))
    blocking = MemormStore(db, agent=store.agent_id, allow_blocking=True)
    found = blocking.get(("loop",), "k")
    assert found is not None
    assert found.value == {"v": 1}


async def _expires(db: Database, key: str) -> Any:
    async with db.unit_of_work(read_only=True) as uow:
        return await uow.session.scalar(sa.select(STORE_ITEMS.c.expires_at).where(STORE_ITEMS.c.key == key))


async def test_reads_refresh_the_ttl_unless_told_not_to(db: Database) -> None:
    store = MemormStore(db, agent=await _agent(db), ttl={"default_ttl": 10})
    await store.aput(("ttl",), "k", {"v": 1})
    await _backdate(db, "k", -1)  # expires in a minute
    soon = await _expires(db, "k")
    assert await store.aget(("ttl",), "k", refresh_ttl=False) is not None
    assert await _expires(db, "k") == soon
    assert await store.aget(("ttl",), "k") is not None  # refresh_on_read defaults to True
    refreshed = await _expires(db, "k")
    assert refreshed - soon > timedelta(minutes=8)
    await _backdate(db, "k", -1)
    assert len(await store.asearch(("ttl",))) == 1
    assert await _expires(db, "k") - utcnow() > timedelta(minutes=9)
    # A store that does not refresh on read leaves it.
    still = MemormStore(db, agent=store.agent_id, ttl={"default_ttl": 10, "refresh_on_read": False})
    await _backdate(db, "k", -1)
    soon = await _expires(db, "k")
    assert await still.aget(("ttl",), "k") is not None
    assert await _expires(db, "k") == soon
    assert await still.aget(("ttl",), "k", refresh_ttl=True) is not None  # unless asked to
    assert await _expires(db, "k") > soon


async def test_reads_of_items_without_a_ttl_write_nothing(db: Database) -> None:
    store = MemormStore(db, agent=await _agent(db))  # no ttl config: items never expire
    await store.aput(("plain",), "k", {"v": 1})
    with capture_statements(db) as sent:
        assert await store.aget(("plain",), "k") is not None
        assert len(await store.asearch(("plain",))) == 1
    assert [sql for sql, _ in sent if sql.lstrip().upper().startswith(("UPDATE", "INSERT", "DELETE"))] == []
    await store.aput(("plain",), "t", {"v": 2}, ttl=5)
    with capture_statements(db) as sent:  # with a TTL, a read moves it: one UPDATE
        assert await store.aget(("plain",), "t") is not None
    assert len([sql for sql, _ in sent if sql.lstrip().upper().startswith("UPDATE")]) == 1


async def test_vector_search_ranks_by_the_best_field(db: Database) -> None:
    store = MemormStore(
        db, agent=await _agent(db), index={"dims": DIMS, "embed": embed, "fields": ["a", "b"]}
    )
    await store.aput(("zoo",), "cat-dog", {"a": "cat", "b": "dog"})
    await store.aput(("zoo",), "fish", {"a": "fish", "b": "fish"})
    await store.aput(("zoo",), "bird-cat", {"a": "bird bird", "b": "cat cat cat", "kind": "x"})
    await store.aput(("zoo",), "plain", {"a": "cat"}, index=False)
    await store.aput(("elsewhere",), "cat", {"a": "cat"})
    found = await store.asearch(("zoo",), query="cat")
    # Each item scores its best field; equal scores in (namespace, key) order; unindexed items follow.
    assert [i.key for i in found] == ["bird-cat", "cat-dog", "fish", "plain"]
    assert [i.score for i in found] == [pytest.approx(1.0), pytest.approx(1.0), pytest.approx(0.0), None]

    async def page(limit: int, offset: int) -> list[str]:
        return [i.key for i in await store.asearch(("zoo",), query="cat", limit=limit, offset=offset)]

    assert await page(3, 0) == ["bird-cat", "cat-dog", "fish"]
    assert await page(2, 2) == ["fish", "plain"]
    assert await page(10, 3) == ["plain"]
    assert await page(10, 4) == []
    birds = await store.asearch(("zoo",), query="bird")
    assert birds[0].key == "bird-cat"
    assert birds[0].score == pytest.approx(1.0)
    assert [i.key for i in await store.asearch(("zoo",), query="cat", filter={"kind": "x"})] == ["bird-cat"]
    page = await store.asearch(("zoo",), query="fish", limit=1, offset=0)
    assert [i.key for i in page] == ["fish"]
    assert page[0].score == pytest.approx(1.0)
    assert [i.key for i in await store.asearch(("zoo",), query="cat", limit=2, offset=1)] == [
        "cat-dog",
        "fish",
    ]
    # Updating an item replaces its vectors.
    await store.aput(("zoo",), "fish", {"a": "dog"})
    assert [i.key for i in await store.asearch(("zoo",), query="dog", limit=2)] == ["cat-dog", "fish"]
    fish = await store.asearch(("zoo",), query="fish")
    assert [i.score for i in fish] == [pytest.approx(0.0)] * 3 + [None]  # "plain" has no embedding
    with capture_statements(db, "graph_store_") as sent:  # a full page: one statement on Postgres
        found = await store.asearch(("zoo",), query="dog", limit=2, filter={"a": {"$ne": "x"}})
    assert [(i.key, i.value) for i in found] == [
        ("cat-dog", {"a": "cat", "b": "dog"}),
        ("fish", {"a": "dog"}),
    ]
    assert len(sent) == (2 if db.dialect == "sqlite" else 1)  # SQLite: the vectors, then their items


def _parsed(texts: list[str]) -> list[list[float]]:
    """An embedding that reads a vector written out: "1 0 -2" is [1.0, 0.0, -2.0]."""
    return [[float(number) for number in text.split()] for text in texts]


_SMALL_VECTOR = st.lists(st.integers(-2, 2), min_size=3, max_size=3).map(lambda v: " ".join(map(str, v)))
_SCORED_ITEM = st.tuples(
    st.sampled_from([("a",), ("a", "b"), ("ab",), ("b",)]),
    st.sampled_from([f"k{n}" for n in range(10)]),
    st.dictionaries(st.sampled_from(["f0", "f1", "f2"]), _SMALL_VECTOR, max_size=3),
)


@example(  # the two best items in the first batch, before the last row of the batch
    items=[(("a",), f"k{n}", {"f0": f"{6 - n} 0 0"}) for n in range(7)],
    query="1 0 0",
    distance="inner_product",
    prefix=(),
    limit=2,
    offset=0,
    batch=5,
)
@given(
    items=st.lists(_SCORED_ITEM, max_size=20),
    query=_SMALL_VECTOR,
    distance=st.sampled_from(["inner_product", "l2"]),
    prefix=st.sampled_from([(), ("a",), ("b",)]),
    limit=st.integers(1, 6),
    offset=st.integers(0, 4),
    batch=st.integers(1, 5),
)
async def test_vector_search_pages_what_the_python_oracle_ranks(
    db: Database,
    items: list[tuple[tuple[str, ...], str, dict[str, str]]],
    query: str,
    distance: str,
    prefix: tuple[str, ...],
    limit: int,
    offset: int,
    batch: int,
) -> None:
    # Small integer vectors score exactly on both engines, so ties are real ties, broken by
    # (namespace, key). SQLite reads the vectors `batch` at a time: an item's fields and the
    # best items cross batches.
    index = {"dims": 3, "embed": _parsed, "fields": ["f0", "f1", "f2"], "distance_type": distance}
    store = MemormStore(db, agent=await _agent(db, f"ranked-{uuid.uuid4()}"), index=index)  # type: ignore[arg-type]
    await store.abatch([PutOp(namespace, key, value) for namespace, key, value in items])
    stored = {(namespace, key): value for namespace, key, value in items}  # the last put of a key wins
    target = _parsed([query])[0]

    def score(text: str) -> float:
        vector = _parsed([text])[0]
        if distance == "inner_product":
            return float(sum(a * b for a, b in zip(vector, target, strict=True)))
        return -math.sqrt(sum((a - b) ** 2 for a, b in zip(vector, target, strict=True)))

    under = {(ns, key): value for (ns, key), value in stored.items() if ns[: len(prefix)] == prefix}
    scored = sorted(
        ((-max(map(score, value.values())), ".".join(ns), key) for (ns, key), value in under.items() if value)
    )
    unscored = [key for (ns, key), value in under.items() if not value]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(store_vectors, "BATCH", batch)
        found = await store.asearch(prefix, query=query, limit=limit, offset=offset)
    ranked = [(".".join(item.namespace), item.key) for item in found if item.score is not None]
    assert ranked == [(ns, key) for _, ns, key in scored][offset : offset + limit]
    assert [item.score for item in found][: len(ranked)] == pytest.approx(
        [-negated for negated, _, _ in scored][offset : offset + len(ranked)]
    )
    assert len(found) == min(limit, max(0, len(scored) + len(unscored) - offset))


def _hashed(texts: list[str], dims: int = 16) -> list[list[float]]:
    """A deterministic embedding of many shapes: each word adds a signed unit on a hashed axis."""
    import hashlib

    vectors = []
    for text in texts:
        vector = [0.0] * dims
        for word in text.split():
            digest = hashlib.sha256(word.encode()).digest()
            vector[digest[0] % dims] += 1.0 if digest[1] & 1 else -1.0
        vectors.append(vector if any(vector) else [1.0] + [0.0] * (dims - 1))
    return vectors


async def _plan(db: Database, statement: str, parameters: Any) -> str:
    async with db.unit_of_work(read_only=True) as uow:
        driver = (await (await uow.session.connection()).get_raw_connection()).driver_connection
        rows = await driver.fetch(f"EXPLAIN {statement}", *parameters)
    return "\n".join(row[0] for row in rows)


@pytest.mark.single_node  # its plain EXPLAIN of the statement is one server's
@pytest.mark.owner  # CREATE INDEX and ANALYZE: the tables' owner's
async def test_setup_builds_an_hnsw_index_that_searches_by_query_use(db: Database) -> None:
    words = [
        "alpha",
        "beta",
        "gamma",
        "delta",
        "epsilon",
        "zeta",
        "eta",
        "theta",
        "iota",
        "kappa",
        "lambda",
        "mu",
    ]
    index = {"dims": 16, "embed": _hashed, "fields": ["text"]}
    store = MemormStore(db, agent=await _agent(db), index=index)
    texts = [
        " ".join(words[(i * 7 + j) % len(words)] for j in range(i % 4 + 1)) + f" n{i}" for i in range(300)
    ]
    await store.abatch(
        [PutOp(("docs",), f"d{i}", {"text": text, "kind": i % 30}) for i, text in enumerate(texts)]
    )
    query = "gamma delta"
    exact = [(item.key, item.score) for item in await store.asearch(("docs",), query=query, limit=10)]
    await store.asetup()
    await store.asetup()  # idempotent
    if db.dialect == "postgresql":  # as autovacuum would, sooner or later: the plan below is then stable
        async with db.unit_of_work() as uow:
            await uow.session.execute(sa.text("ANALYZE graph_store_items, graph_store_vectors"))
    with capture_statements(db) as sent:
        found = [(item.key, item.score) for item in await store.asearch(("docs",), query=query, limit=10)]
    # HNSW is approximate; on 300 vectors with pgvector's defaults it finds the exact answer.
    assert [key for key, _ in found] == [key for key, _ in exact]
    assert all(math.isclose(a, b, abs_tol=1e-5) for (_, a), (_, b) in zip(found, exact, strict=True))
    if db.dialect == "postgresql":
        [(statement, parameters)] = [(q, p) for q, p in sent if " AS near" in q]
        plan = await _plan(db, statement, parameters)
        assert "Index Scan using ix_graph_store_vectors_hnsw_16_cosine" in plan, plan
        async with db.unit_of_work(read_only=True) as uow:
            assert await uow.graph_store.has_index(16, "cosine")
            assert not await uow.graph_store.has_index(16, "l2")
    # A filter the index's candidates cannot fill a page with: the page comes from an exact search.
    rare = await store.asearch(("docs",), query=query, filter={"kind": 7}, limit=10)
    assert sorted(item.key for item in rare) == sorted(f"d{i}" for i in range(300) if i % 30 == 7)
    assert all(item.score is not None for item in rare)
    with pytest.raises(ValidationError):
        await MemormStore(db, agent=await _agent(db, "wide"), index={**index, "dims": 4000}).asetup()


async def _hnsw_definitions(db: Database) -> list[str]:
    if db.dialect == "sqlite":
        return []
    async with db.unit_of_work(read_only=True) as uow:
        found = await uow.session.execute(
            sa.text("SELECT indexdef FROM pg_indexes WHERE indexname LIKE 'ix_graph_store_vectors_hnsw%'")
        )
        return [row[0] for row in found]


@pytest.mark.owner  # CREATE INDEX: the tables' owner's
async def test_ann_index_config_is_honoured_or_refused(db: Database) -> None:
    # LangGraph's PostgresIndexConfig: memorm builds what it says, or refuses it at once.
    index = {"dims": 16, "embed": _hashed, "fields": ["text"]}
    flat = MemormStore(
        db, agent=await _agent(db, "flat"), index={**index, "ann_index_config": {"kind": "flat"}}
    )
    await flat.asetup()
    assert await _hnsw_definitions(db) == []  # flat: no index, every search exact
    await flat.aput(("docs",), "a", {"text": "alpha beta"})
    assert [item.key for item in await flat.asearch(("docs",), query="alpha")] == ["a"]

    tuned = {"kind": "hnsw", "vector_type": "halfvec", "m": 8, "ef_construction": 40}  # kept as float32
    store = MemormStore(db, agent=await _agent(db), index={**index, "ann_index_config": tuned})
    await store.asetup()
    definitions = await _hnsw_definitions(db)
    if db.dialect == "postgresql":
        [definition] = definitions
        assert "m='8'" in definition, definition
        assert "ef_construction='40'" in definition, definition

    refused = [
        ({"vector_type": "bit"}, "memorm keeps float32 vectors"),
        ({"kind": "ivfflat", "nlist": 100}, "unsupported keys"),
        ({"kind": "ivfflat"}, "expected 'hnsw' or 'flat'"),
        ({"kind": "flat", "m": 8}, "HNSW's options"),
        ({"m": 200}, "m"),
        ({"m": 16, "ef_construction": 8}, "ef_construction"),
        ("hnsw", "expected a dict"),
    ]
    for config, words in refused:
        with pytest.raises(ValidationError, match=re.escape(words)):
            MemormStore(db, agent=store.agent_id, index={**index, "ann_index_config": config})


async def test_store_vectors_are_not_archival_passages(db: Database) -> None:
    agent = await _agent(db)
    store = MemormStore(db, agent=agent, index={"dims": DIMS, "embed": embed})
    await store.aput(("notes",), "a", {"text": "cat"})
    await store.aput(("notes",), "b", {"text": "dog"})
    assert await _rows(db, STORE_VECTORS) == 2
    async with db.unit_of_work(read_only=True) as uow:
        assert await uow.passages.count(agent) == 0
        assert (await uow.passages.list(agent)).items == []


async def test_bad_input_is_refused_before_any_statement(db: Database) -> None:
    agent = await _agent(db)
    store = MemormStore(db, agent=agent, index={"dims": DIMS, "embed": embed, "fields": ["text"]})
    for namespace in [("a.b",), ("a", ""), ("a", 1), ("nul\x00",)]:
        with pytest.raises(InvalidNamespaceError):
            await store.abatch([PutOp(("ok",), "k", {"v": 1}), PutOp(namespace, "k", {"v": 2})])  # type: ignore[arg-type]
        with pytest.raises(ValidationError):
            await store.abatch([GetOp(namespace, "k")])  # type: ignore[arg-type]
    with pytest.raises(InvalidNamespaceError):
        await store.abatch([PutOp((), "k", {"v": 1})])
    assert await store.aget(("ok",), "k") is None  # the batch was refused whole
    with pytest.raises(ValidationError, match="NUL"):
        await store.aput(("ok",), "k", {"text": "a\x00b"})
    with pytest.raises(ValidationError):
        await store.aput(("ok",), "k", {"v": math.nan})
    with pytest.raises(ValidationError):
        await store.aput(("ok",), "k", {"v": object()})
    with pytest.raises(ValidationError):
        await store.aput(("ok",), "k\x00", {"v": 1})
    with pytest.raises(ValidationError):
        await store.aput(("ok",), "k", {"v": 1}, ttl=-1)
    with pytest.raises(ValidationError):
        await store.asearch(("ok",), filter={"v": {"$regex": "x"}})
    with pytest.raises(ValidationError):
        await store.asearch(("ok",), filter={"v": {"$gt": [1]}})
    wrong = MemormStore(db, agent=agent, index={"dims": 3, "embed": embed, "fields": ["text"]})
    with pytest.raises(ValidationError, match="dimensions"):
        await wrong.aput(("ok",), "k", {"text": "cat"})
    nan = MemormStore(
        db, agent=agent, index={"dims": DIMS, "embed": lambda texts: [[math.nan] * DIMS for _ in texts]}
    )
    with pytest.raises(ValidationError):
        await nan.aput(("ok",), "k", {"text": "cat"})
    for bad_index in [
        {"embed": embed},
        {"dims": DIMS},
        {"dims": DIMS, "embed": embed, "distance_type": "hamming"},
    ]:
        with pytest.raises(ValidationError):
            MemormStore(db, agent=agent, index=bad_index)
    with pytest.raises(ValidationError):
        MemormStore(db, agent=agent, ttl={"default_ttl": "soon"})
    with pytest.raises(ValidationError):
        MemormStore(db, agent="not an id")
    assert await _rows(db, STORE_ITEMS) == 0


async def test_concurrent_calls_past_four_merge_into_a_few_units_of_work(db: Database) -> None:
    store = MemormStore(db, agent=await _agent(db))
    with capture_statements(db, "graph_store_items") as sent:
        await asyncio.gather(*(store.aput(("burst",), f"k{n:03}", {"n": n}) for n in range(200)))
    writes = [sql for sql, _ in sent if sql.lstrip().upper().startswith(("INSERT", "WITH"))]
    assert 2 <= len(writes) <= 12  # 200 one at a time would send 200
    found = await asyncio.gather(*(store.aget(("burst",), f"k{n:03}") for n in range(200)))
    assert [item.value["n"] for item in found if item is not None] == list(range(200))
    assert len(await store.asearch(("burst",), limit=1000)) == 200
    # A call that fails its checks fails alone, before it joins the others.
    puts = [
        store.aput(("burst",), "bad", {"n": math.nan})
        if n == 7
        else store.aput(("burst",), f"k{n:03}", {"n": -n})
        for n in range(30)
    ]
    outcomes = await asyncio.gather(*puts, return_exceptions=True)
    assert [type(outcome) for outcome in outcomes].count(ValidationError) == 1
    assert isinstance(outcomes[7], ValidationError)
    assert await store.aget(("burst",), "bad") is None
    assert (await store.aget(("burst",), "k029")).value == {"n": -29}  # type: ignore[union-attr]


async def test_an_abatch_of_reads_and_writes_checks_out_one_connection(db: Database) -> None:
    # memorm's form of LangGraph's test_abatch_uses_single_pool_checkout, which counts
    # PostgresStore's psycopg pool: a batch is one unit of work, on one pooled connection.
    store = MemormStore(db, agent=await _agent(db), index={"dims": DIMS, "embed": embed, "fields": ["text"]})
    await store.aput(("pool",), "a", {"text": "cat"})
    checkouts: list[object] = []

    def count(connection: object, *args: object) -> None:
        checkouts.append(connection)

    pool = db.engine.sync_engine.pool
    sa.event.listen(pool, "checkout", count)
    try:
        results = await store.abatch(
            [
                GetOp(("pool",), "a"),
                PutOp(("pool",), "b", {"text": "dog"}),
                SearchOp(("pool",), query="cat", limit=1),
                GetOp(("pool",), "missing"),
            ]
        )
    finally:
        sa.event.remove(pool, "checkout", count)
    assert len(checkouts) == 1
    got, put, found, missing = results
    assert got is not None
    assert got.value == {"text": "cat"}
    assert put is None
    assert missing is None
    assert [item.key for item in found] == ["a"]
    assert (await store.aget(("pool",), "b")).value == {"text": "dog"}  # type: ignore[union-attr]


async def test_sync_calls_work_from_a_worker_thread(db: Database) -> None:
    store = MemormStore(db, agent=await _agent(db), index={"dims": DIMS, "embed": embed, "fields": ["text"]})

    def work() -> list[Any]:
        store.put(("sync",), "a", {"text": "dog"})
        store.put(("sync",), "b", {"text": "cat"})
        results = store.batch([GetOp(("sync",), "a"), SearchOp(("sync",), query="cat", limit=1)])
        store.delete(("sync",), "a")
        return [results, store.get(("sync",), "a"), store.list_namespaces()]

    (got, found), deleted, listed = await anyio.to_thread.run_sync(work)
    assert got.value == {"text": "dog"}
    assert [i.key for i in found] == ["b"]
    assert deleted is None
    assert listed == [("sync",)]


class _Memory(TypedDict):
    said: Annotated[list[str], operator.add]


def _remember(state: _Memory, config: RunnableConfig, *, store: BaseStore) -> dict[str, Any]:
    user = config["configurable"]["user"]
    known = store.search(("users", user), query="what do I like", limit=5)
    store.put(("users", user), f"fact-{len(known)}", {"text": state["said"][-1]})
    return {"said": [f"knew {len(known)}"]}


async def test_a_graph_reads_and_writes_memories_in_a_node(db: Database) -> None:
    agent = await _agent(db)
    store = MemormStore(db, agent=agent, index={"dims": DIMS, "embed": embed, "fields": ["text"]})
    builder = StateGraph(_Memory)
    builder.add_node("remember", _remember)
    builder.add_edge(START, "remember")
    builder.add_edge("remember", END)
    graph = builder.compile(checkpointer=MemormSaver(db, agent=agent), store=store)

    def run(thread: str, said: str) -> dict[str, Any]:
        config: RunnableConfig = {"configurable": {"thread_id": thread, "user": "ann"}}
        return graph.invoke({"said": [said]}, config)

    first = await anyio.to_thread.run_sync(run, "t-1", "I like cat")
    assert first["said"] == ["I like cat", "knew 0"]
    second = await anyio.to_thread.run_sync(run, "t-2", "I like dog")  # another thread, same memories
    assert second["said"] == ["I like dog", "knew 1"]
    facts = await store.asearch(("users", "ann"), query="dog")
    assert facts[0].value == {"text": "I like dog"}
    assert len(facts) == 2
    state = await graph.aget_state({"configurable": {"thread_id": "t-2"}})
    assert state.values["said"][-1] == "knew 1"
