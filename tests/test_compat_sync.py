"""The sync bridge: a program using sync adapter methods exits promptly, its private pools closed."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from conftest import Store

from memorm import Database
from memorm.compat._sync import SyncBridge, adispose_sync

pytestmark = pytest.mark.anyio

# Runs in a fresh interpreter.  The first atexit hook registered runs last, after
# the bridge's own: it reports what the bridge left open.
PROGRAM = textwrap.dedent(
    """
    import atexit, json, sys, threading, time

    def report():
        bridge = sys.modules["memorm.compat._sync"].BRIDGE
        pools = sum(bridge._loop in db.engines._by_loop for db in bridge._used)
        print("pools left:", pools, "loop alive:", bridge._thread.is_alive(), flush=True)

    atexit.register(report)

    from langchain_core.messages import HumanMessage
    from memorm import Database
    from memorm.compat.langchain import MemormChatMessageHistory

    url, options, agent, mode = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
    db = Database(url, **options)

    def talk(key):
        history = MemormChatMessageHistory(db, key, agent=agent)
        history.add_messages([HumanMessage(key)])
        print("read:", [m.content for m in history.messages], flush=True)

    if mode == "main":
        talk("from main")
    elif mode == "sweeper":  # a store's TTL sweeper still running on the bridge at exit
        from memorm.compat.langgraph import MemormStore

        store = MemormStore(db, agent=agent, ttl={"default_ttl": 1})
        store.start_ttl_sweeper(0.001)  # every 60 ms; never stopped
        store.put(("exit",), "k", {"v": 1})
        time.sleep(0.3)
        talk("beside a sweeper")
    else:  # a non-daemon thread still talking after the main thread has returned
        def late():
            time.sleep(0.3)
            talk("from a late thread")

        threading.Thread(target=late).start()
    """
)


@pytest.fixture
async def db(db: Database) -> AsyncIterator[Database]:
    yield db
    await adispose_sync(db)


@pytest.mark.parametrize("mode", ["main", "late-thread", "sweeper"])
async def test_a_sync_program_exits_promptly_with_its_pools_closed(
    db: Database, store: Store, tmp_path: Path, mode: str
) -> None:
    async with db.unit_of_work() as uow:
        agent_id = (await uow.agents.create("exiting")).id
    await db.dispose()  # the subprocess's pool becomes the only connection to the file
    argv = [sys.executable, "-c", PROGRAM, store.url, json.dumps(store.options), str(agent_id), mode]
    done = await anyio.to_thread.run_sync(
        lambda: subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # nothing logged: no task destroyed pending, no unclosed connection
    key = {"main": "from main", "late-thread": "from a late thread", "sweeper": "beside a sweeper"}[mode]
    assert done.stdout.splitlines() == [f"read: [{key!r}]", "pools left: 0 loop alive: False"]
    if store.engine == "sqlite":
        # SQLite removes the WAL file when the last connection closes cleanly.
        assert not await anyio.Path(f"{tmp_path / 'memorm.db'}-wal").exists()


async def test_a_stopped_bridge_refuses_work_instead_of_hanging(db: Database) -> None:
    bridge = SyncBridge()

    async def agents(db: Database) -> uuid.UUID:
        async with db.unit_of_work() as uow:
            return (await uow.agents.create("bridged")).id

    await anyio.to_thread.run_sync(lambda: bridge.run(db, agents))
    await anyio.to_thread.run_sync(bridge._shutdown)  # what interpreter exit does
    with pytest.raises(RuntimeError, match="shut down"):
        await anyio.to_thread.run_sync(lambda: bridge.run(db, agents))
    bridge.dispose(db)  # nothing left to close: a no-op
