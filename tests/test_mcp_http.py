"""`memorm mcp --transport http`: streamable HTTP behind bearer tokens, a tenant per token.

The server runs in-process (uvicorn on a free port, in the test's event
loop, on the test's `Database`); the clients are the MCP SDK's own, over
real HTTP.  A request without a known token gets 401 and reaches no tool;
two tokens are two tenants that never see each other's rows, checked
through the tools, through memorm's repositories and, on Postgres, under
row-level security with an application role.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx2
import pytest
import sqlalchemy as sa
import uvicorn
from conftest import Store, app_role, count_rows
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

from memorm import Database
from memorm.mcp import PATH, TokenTable, hash_token, http_app

pytestmark = pytest.mark.anyio

ACME = "acme-token-0123456789abcdef"
GLOBEX = "globex-token-0123456789abcdef"
TOKENS = TokenTable({"acme": hash_token(ACME), "globex": [hash_token(GLOBEX)]})


@asynccontextmanager
async def serving(db: Database, tokens: TokenTable = TOKENS) -> AsyncIterator[str]:
    """The URL of memorm's MCP endpoint, served by uvicorn on a free port while inside."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    app = http_app(db, tokens, host="127.0.0.1", port=port)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(lambda: server.serve(sockets=[listener]))
        while not server.started:  # noqa: ASYNC110 - uvicorn sets a flag, not an event
            await anyio.sleep(0.01)
        try:
            yield f"http://127.0.0.1:{port}{PATH}"
        finally:
            server.should_exit = True
    listener.close()


def leaves(group: BaseException) -> list[BaseException]:
    """The exceptions inside nested exception groups."""
    inner = getattr(group, "exceptions", None)  # an exception group's (3.10: the backport's)
    if inner is None:
        return [group]
    return [leaf for exception in inner for leaf in leaves(exception)]


def client(url: str, token: str | None, *, mode: str = "auto") -> Client:
    """The SDK's client over streamable HTTP with `token`; `mode="legacy"`: the initialize handshake."""
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    http = create_mcp_http_client(headers=headers)
    return Client(streamable_http_client(url, http_client=http), mode=mode)  # type: ignore[arg-type]


async def call(session: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await session.call_tool(tool, arguments)
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return result.structured_content


INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "probe", "version": "1"},
    },
}


REFUSED = [  # Authorization headers that name no known token
    None,
    "Bearer wrong-token-0123456789abcdef",
    f"Basic {ACME}",
    "Bearer",
    f"Bearer {ACME}x",
    f"Bearer {ACME[:-1]}",
    f"Bearer {hash_token(ACME)}",  # the stored hash is no credential
]


async def test_a_request_without_a_known_token_gets_401(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # every log line of the server, the SDK and uvicorn
    headers = {"Accept": "application/json, text/event-stream"}
    async with serving(db) as url, httpx2.AsyncClient() as http:
        for authorization in REFUSED:
            given = headers if authorization is None else {**headers, "Authorization": authorization}
            refused = await http.post(url, json=INITIALIZE, headers=given)
            assert refused.status_code == 401, authorization
            assert refused.headers["www-authenticate"].startswith("Bearer "), authorization
            assert ACME not in refused.text
        accepted = await http.post(
            url, json=INITIALIZE, headers={**headers, "Authorization": f"Bearer {ACME}"}
        )
    assert accepted.status_code == 200  # the same request with the token: each refusal was the token's
    assert caplog.records  # the log was captured, and holds no token
    assert ACME not in caplog.text
    assert ACME[:-1] not in caplog.text


async def test_the_sdk_client_with_a_wrong_token_reaches_no_tool(db: Database) -> None:
    async with serving(db) as url:
        try:
            async with client(url, "wrong-token-0123456789abcdef") as session:
                await session.call_tool("get_or_create_agent", {"name": "sam"})
        except Exception as failed:  # the SDK's transport fails its task group
            [error] = leaves(failed)
        else:
            pytest.fail("the client was served without a valid token")
    assert isinstance(error, MCPError)  # the server's refusal (the 401), as the SDK reports it
    assert "error response" in str(error)
    assert await count_rows(db, "agents") == 0  # nothing was written, in any tenant


async def test_two_tokens_are_two_tenants_that_never_see_each_other(db: Database) -> None:
    async with serving(db) as url, client(url, ACME) as acme, client(url, GLOBEX) as globex:
        assert acme.protocol_version >= "2026"  # the per-request protocol; the handshake era: below
        sam = await call(acme, "get_or_create_agent", name="sam", core_memory={"human": "Ada"})
        chat = await call(acme, "get_or_create_session", agent_id=sam["agent_id"], key="c1")
        await call(
            acme,
            "append_messages",
            session_id=chat["session_id"],
            messages=[{"role": "user", "content": "zebra"}],
        )
        await call(acme, "insert_archival_memory", agent_id=sam["agent_id"], text="zebras are striped")

        # globex's "sam" is another agent: the name is free in its tenant.
        other = await call(globex, "get_or_create_agent", name="sam")
        assert other["created"] is True
        assert other["agent_id"] != sam["agent_id"]
        # acme's ids name nothing for globex: as unknown ids, never "forbidden".
        for tool, arguments in [
            ("read_core_memory", {"agent_id": sam["agent_id"]}),
            ("read_context", {"session_id": chat["session_id"], "max_tokens": 100}),
            ("search_messages", {"agent_id": sam["agent_id"], "query": "zebra"}),
            ("search_archival_memory", {"agent_id": sam["agent_id"], "query": "zebras"}),
        ]:
            result = await globex.call_tool(tool, arguments)
            assert result.is_error, (tool, result.content)
            assert "NotFoundError" in result.content[0].text  # type: ignore[union-attr]
        assert (await call(acme, "search_messages", agent_id=sam["agent_id"], query="zebra"))["total"] == 1
        again = await call(acme, "get_or_create_agent", name="sam")
        assert (again["agent_id"], again["created"]) == (sam["agent_id"], False)

    # The repositories agree: each tenant holds its own agent, the default tenant none.
    for tenant, agent_id in [("acme", sam["agent_id"]), ("globex", other["agent_id"])]:
        async with db.for_tenant(tenant).unit_of_work(read_only=True) as uow:
            assert [str(agent.id) for agent in (await uow.agents.list()).items] == [agent_id]
    async with db.unit_of_work(read_only=True) as uow:
        assert (await uow.agents.list()).total == 0


async def test_a_handshake_era_session_works_in_its_tokens_tenant_too(db: Database) -> None:
    # `initialize`, then requests on the session it opened (the SDK's stateful transport).
    async with serving(db) as url, client(url, GLOBEX, mode="legacy") as globex:
        assert globex.protocol_version < "2026"
        kim = await call(globex, "get_or_create_agent", name="kim")
        await call(
            globex, "update_core_memory", agent_id=kim["agent_id"], label="a", value="b", expected_version=1
        )
    async with db.for_tenant("globex").unit_of_work(read_only=True) as uow:
        agent = await uow.agents.get(kim["agent_id"])
    assert (agent.name, agent.core_memory, agent.version) == ("kim", {"a": "b"}, 2)
    async with db.for_tenant("acme").unit_of_work(read_only=True) as uow:
        assert (await uow.agents.list()).total == 0


@pytest.mark.postgres
@pytest.mark.parametrize("engine", ["postgres"], indirect=True)
async def test_tenants_hold_under_row_level_security(store: Store) -> None:
    # The server connects as an application role: Postgres itself keeps the tenants apart.
    async with app_role(store) as (owner, app, _):
        async with serving(app) as url, client(url, ACME) as acme, client(url, GLOBEX) as globex:
            await call(acme, "get_or_create_agent", name="sam")
            await call(globex, "get_or_create_agent", name="kim")
        for tenant, names in [("acme", ["sam"]), ("globex", ["kim"]), ("default", [])]:
            async with app.for_tenant(tenant).unit_of_work(read_only=True) as uow:
                # Raw SQL, under the repositories: row-level security alone filters it.
                rows = await uow.session.execute(sa.text("SELECT name FROM agents ORDER BY name"))
                assert [row.name for row in rows] == names
        async with owner.unit_of_work(all_tenants=True, read_only=True) as uow:
            rows = await uow.session.execute(sa.text("SELECT tenant, name FROM agents ORDER BY tenant"))
            assert [tuple(row) for row in rows] == [("acme", "sam"), ("globex", "kim")]
