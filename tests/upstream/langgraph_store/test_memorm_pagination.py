"""memorm's own case for what LangGraph's `test_omit_expired_search_pagination` checks (left out).

The upstream case backdates rows through PostgresStore's private cursor inside its body, which no
name swap reaches; this one backdates them on memorm's table (kit.py) and checks the same pages.
"""

from __future__ import annotations

import pytest

from memorm.compat.langgraph import MemormStore

from .kit import arun, expire_now, updated_ago

pytestmark = pytest.mark.anyio


async def test_omit_expired_filters_before_the_page_is_cut(store: MemormStore) -> None:
    await store.astop_ttl_sweeper()
    omitting = MemormStore(store.db, agent=store.agent_id, ttl={"default_ttl": 1, "omit_expired": True})
    ns = ("page",)
    for key in ("a", "b", "c", "expired"):
        await omitting.aput(ns, key, {"k": key})
    await arun(store, expire_now(ns, "expired"))
    # Newest first: a, expired, b, c.  Filtering after LIMIT would leave page one as just [a].
    for key, seconds in {"a": 1, "expired": 2, "b": 3, "c": 4}.items():
        await arun(store, updated_ago(ns, key, seconds))
    assert [item.key for item in await omitting.asearch(ns, limit=2, offset=0)] == ["a", "b"]
    assert [item.key for item in await omitting.asearch(ns, limit=2, offset=2)] == ["c"]
