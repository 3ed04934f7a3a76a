"""`memorm mcp`: every tool and resource through the MCP SDK's own client, on both engines.

Most tests connect the SDK's `Client` to `create_server(db)` in-process; one
spawns `memorm mcp --transport stdio` as a client would and talks to it over
its stdin and stdout.  What the tools wrote is read back through memorm's
repositories, never only through the server.  HTTP and its bearer tokens:
tests/test_mcp_http.py.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import count_rows
from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError

from memorm import Database
from memorm.cli import _parser
from memorm.embeddings import HashingEmbedder
from memorm.errors import ValidationError
from memorm.mcp import TokenTable, create_server, hash_token, load_embedder
from memorm.mcp.resources import RECENT
from memorm.mcp.tools import TOOLS

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "integrations" / "mcp.md"
NO_ID = "01900000-0000-7000-8000-000000000000"


async def call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    """A tool's structured result; the call must succeed."""
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return result.structured_content


async def refused(client: Client, tool: str, **arguments: Any) -> str:
    """The message of a tool error; the call must fail as a tool error, not a protocol error."""
    result = await client.call_tool(tool, arguments)
    assert result.is_error, result.content
    text: str = result.content[0].text  # type: ignore[union-attr]
    assert "Traceback" not in text
    return text


async def chat(client: Client) -> tuple[str, str]:
    """An agent "sam" and its session "c1", made through the tools."""
    agent = await call(client, "get_or_create_agent", name="sam", core_memory={"persona": "kind"})
    session = await call(client, "get_or_create_session", agent_id=agent["agent_id"], key="c1")
    return agent["agent_id"], session["session_id"]


async def test_the_server_lists_every_tool_and_both_resource_templates(db: Database) -> None:
    async with Client(create_server(db)) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        templates = (await client.list_resource_templates()).resource_templates
    assert list(tools) == list(TOOLS)
    assert all(tool.description for tool in tools.values())
    assert not any("\n    " in str(tool.description) for tool in tools.values())  # dedented for the model
    for name in ("insert_archival_memory", "search_archival_memory"):  # the stand-in says what it is
        description = " ".join(str(tools[name].description).split())
        assert "word-hashing stand-in (HashingEmbedder)" in description
    annotations = tools["read_context"].annotations
    assert annotations is not None
    assert annotations.read_only_hint
    assert {t.uri_template: t.mime_type for t in templates} == {
        "memorm://agents/{agent_id}/core-memory": "application/json",
        "memorm://sessions/{session_id}/messages": "application/json",
    }


async def test_get_or_create_finds_the_agent_and_session_it_made(db: Database) -> None:
    async with Client(create_server(db)) as client:
        made = await call(
            client, "get_or_create_agent", name="sam", system="Be brief.", core_memory={"a": "b"}
        )
        found = await call(client, "get_or_create_agent", name="sam", system="ignored")
        chat_made = await call(
            client, "get_or_create_session", agent_id=made["agent_id"], key="c1", title="t"
        )
        chat_found = await call(client, "get_or_create_session", agent_id=made["agent_id"], key="c1")
    assert (made["created"], found["created"]) == (True, False)
    assert found["agent_id"] == made["agent_id"]
    assert (found["system"], found["core_memory"], found["version"]) == ("Be brief.", {"a": "b"}, 1)
    assert (chat_made["created"], chat_found["created"]) == (True, False)
    assert chat_found["session_id"] == chat_made["session_id"]
    async with db.unit_of_work(read_only=True) as uow:
        agent = await uow.agents.get(made["agent_id"])
        session = await uow.sessions.get(chat_made["session_id"])
    assert (agent.name, agent.system) == ("sam", "Be brief.")
    assert (str(session.agent_id), session.key, session.title) == (made["agent_id"], "c1", "t")


async def test_append_messages_stores_them_in_order_and_read_context_keeps_the_budget(db: Database) -> None:
    turns = [{"role": "system", "content": "You are Sam."}] + [
        {"role": "user" if n % 2 else "assistant", "content": f"turn {n} " + "word " * 20}
        for n in range(1, 9)
    ]
    async with Client(create_server(db)) as client:
        _, session_id = await chat(client)
        stored = (await call(client, "append_messages", session_id=session_id, messages=turns))["messages"]
        context = await call(client, "read_context", session_id=session_id, max_tokens=100)
        loose = await call(client, "read_context", session_id=session_id, max_tokens=100, pinned_system=False)
    assert [message["seq"] for message in stored] == list(range(1, 10))
    assert [message["content"] for message in stored] == [turn["content"] for turn in turns]
    async with db.unit_of_work(read_only=True) as uow:
        window = await uow.messages.window(session_id, limit=50)
        expected = await uow.messages.context(session_id, max_tokens=100)
    assert [str(message.id) for message in window] == [message["id"] for message in stored]
    # The server's window is the repository's: the system message pinned, then the newest that fit.
    assert [message["id"] for message in context["messages"]] == [str(message.id) for message in expected]
    assert context["messages"][0]["role"] == "system"
    assert 2 < len(context["messages"]) < len(turns)
    assert context["tokens"] == sum(message["token_count"] for message in context["messages"]) <= 100
    assert loose["messages"][0]["role"] != "system"


async def test_search_messages_finds_words_across_the_agent_or_in_one_session(db: Database) -> None:
    async with Client(create_server(db)) as client:
        agent_id, first = await chat(client)
        second = (await call(client, "get_or_create_session", agent_id=agent_id, key="c2"))["session_id"]
        for session_id, text in [
            (first, "the zebra sleeps"),
            (second, "a zebra runs"),
            (second, "cats purr"),
        ]:
            await call(
                client, "append_messages", session_id=session_id, messages=[{"role": "user", "content": text}]
            )
        everywhere = await call(client, "search_messages", agent_id=agent_id, query="zebra")
        in_first = await call(client, "search_messages", agent_id=agent_id, query="zebra", session_id=first)
        paged = await call(client, "search_messages", agent_id=agent_id, query="zebra", limit=1, offset=1)
        as_assistant = await call(
            client, "search_messages", agent_id=agent_id, query="zebra", roles=["assistant"]
        )
    assert everywhere["total"] == 2
    assert sorted(message["content"] for message in everywhere["messages"]) == [
        "a zebra runs",
        "the zebra sleeps",
    ]
    assert [message["content"] for message in in_first["messages"]] == ["the zebra sleeps"]
    assert (paged["total"], len(paged["messages"])) == (2, 1)
    assert paged["messages"][0]["id"] not in {m["id"] for m in everywhere["messages"][:1]}
    assert as_assistant == {"total": 0, "messages": []}


async def test_archival_memory_is_embedded_by_the_hashing_stand_in_by_default(db: Database) -> None:
    facts = ["Ada prefers green tea in the morning", "The office moved to Oslo in May", "Kim plays the cello"]
    async with Client(create_server(db)) as client:
        agent_id, _ = await chat(client)
        stored = [
            await call(client, "insert_archival_memory", agent_id=agent_id, text=fact) for fact in facts
        ]
        await call(
            client, "insert_archival_memory", agent_id=agent_id, text="Ada rides", meta={"source": "chat"}
        )
        found = await call(
            client, "search_archival_memory", agent_id=agent_id, query="does Ada drink green tea", k=2
        )
    model = HashingEmbedder().model
    assert {row["embedding_model"] for row in stored} == {model} == {found["embedding_model"]}
    assert found["passages"][0]["text"] == facts[0]  # shares the most words
    assert len(found["passages"]) == 2
    assert found["passages"][0]["score"] > found["passages"][1]["score"]
    async with db.unit_of_work(read_only=True) as uow:
        passage = await uow.passages.get(stored[0]["id"])
        assert await uow.passages.count(agent_id, embedding_model=model) == 4
    assert passage.embedding == pytest.approx(HashingEmbedder().embed_one(facts[0]), abs=1e-6)


async def test_another_embedder_stores_and_searches_under_its_own_model(db: Database) -> None:
    small = HashingEmbedder(16, model="tiny")
    async with Client(create_server(db, embedder=small)) as client:
        agent_id, _ = await chat(client)
        stored = await call(client, "insert_archival_memory", agent_id=agent_id, text="green tea")
        found = await call(client, "search_archival_memory", agent_id=agent_id, query="green tea")
    assert stored["embedding_model"] == found["embedding_model"] == "tiny"
    assert [hit["text"] for hit in found["passages"]] == ["green tea"]
    async with db.unit_of_work(read_only=True) as uow:
        assert len((await uow.passages.get(stored["id"])).embedding or []) == 16


async def test_core_memory_updates_with_its_version_and_a_stale_version_is_refused(db: Database) -> None:
    async with Client(create_server(db)) as client:
        agent_id, _ = await chat(client)
        read = await call(client, "read_core_memory", agent_id=agent_id)
        updated = await call(
            client, "update_core_memory", agent_id=agent_id, label="human", value="Ada", expected_version=1
        )
        stale = await refused(
            client, "update_core_memory", agent_id=agent_id, label="human", value="Bob", expected_version=1
        )
        after = await call(client, "read_core_memory", agent_id=agent_id)
    assert read == {"agent_id": agent_id, "core_memory": {"persona": "kind"}, "version": 1}
    assert (updated["core_memory"], updated["version"]) == ({"persona": "kind", "human": "Ada"}, 2)
    assert "ConflictError: " in stale
    assert "is at version 2, not 1" in stale
    assert after == updated  # the stale write changed nothing
    async with db.unit_of_work(read_only=True) as uow:
        agent = await uow.agents.get(agent_id)
    assert (agent.core_memory, agent.version) == ({"persona": "kind", "human": "Ada"}, 2)


async def test_resources_show_core_memory_and_the_newest_messages(db: Database) -> None:
    async with Client(create_server(db)) as client:
        agent_id, session_id = await chat(client)
        turns = [{"role": "user", "content": f"message {n}"} for n in range(RECENT + 5)]
        await call(client, "append_messages", session_id=session_id, messages=turns)
        memory = await client.read_resource(f"memorm://agents/{agent_id}/core-memory")
        await call(
            client, "update_core_memory", agent_id=agent_id, label="persona", value="new", expected_version=1
        )
        changed = await client.read_resource(f"memorm://agents/{agent_id}/core-memory")
        messages = await client.read_resource(f"memorm://sessions/{session_id}/messages")
        with pytest.raises(MCPError) as missing:
            await client.read_resource(f"memorm://agents/{NO_ID}/core-memory")
        with pytest.raises(MCPError) as malformed:
            await client.read_resource("memorm://sessions/not-an-id/messages")
    shown = json.loads(memory.contents[0].text)  # type: ignore[union-attr]
    assert shown == {"agent_id": agent_id, "core_memory": {"persona": "kind"}, "version": 1}
    assert json.loads(changed.contents[0].text)["core_memory"] == {"persona": "new"}  # type: ignore[union-attr]
    recent = json.loads(messages.contents[0].text)["messages"]  # type: ignore[union-attr]
    assert [m["content"] for m in recent] == [f"message {n}" for n in range(5, RECENT + 5)]
    assert missing.value.error.code == -32602  # invalid params: no such resource
    assert f"no agent {NO_ID}" in missing.value.error.message
    assert "ValidationError: session_id" in malformed.value.error.message


BAD_INPUT = [  # tool, arguments ({agent}/{session} filled in), the error's class and a phrase of its message
    (
        "append_messages",
        {"session_id": NO_ID, "messages": [{"role": "user", "content": "hi"}]},
        "NotFoundError",
        NO_ID,
    ),
    (
        "append_messages",
        {"session_id": "nope", "messages": [{"role": "user"}]},
        "ValidationError",
        "session_id",
    ),
    ("append_messages", {"messages": [{"role": "wizard", "content": "hi"}]}, "ValidationError", "'wizard'"),
    ("append_messages", {"messages": [{"role": "user", "content": "a\x00b"}]}, "ValidationError", "NUL"),
    (
        "append_messages",
        {"messages": [{"role": "user", "content": "fine"}, {"role": "user", "content": "\x00"}]},
        "ValidationError",
        "NUL",
    ),
    ("read_context", {"max_tokens": 0}, "ValidationError", "max_tokens"),
    ("read_context", {"max_tokens": 2**40}, "ValidationError", "max_tokens"),
    ("read_context", {"session_id": NO_ID, "max_tokens": 10}, "NotFoundError", NO_ID),
    ("search_messages", {"query": "hi", "limit": -1}, "ValidationError", "limit"),
    ("search_messages", {"query": "a\x00"}, "ValidationError", "NUL"),
    ("search_messages", {"agent_id": NO_ID, "query": "hi"}, "NotFoundError", NO_ID),
    ("insert_archival_memory", {"text": "a\x00b"}, "ValidationError", "NUL"),
    ("insert_archival_memory", {"agent_id": NO_ID, "text": "hi"}, "NotFoundError", NO_ID),
    ("insert_archival_memory", {"text": "hi", "meta": {"k": "a\x00"}}, "ValidationError", "meta"),
    ("search_archival_memory", {"query": "hi", "k": 0}, "ValidationError", "k"),
    ("read_core_memory", {"agent_id": NO_ID}, "NotFoundError", NO_ID),
    ("update_core_memory", {"label": "", "value": "x", "expected_version": 1}, "ValidationError", "label"),
    ("update_core_memory", {"label": "a", "value": "\x00", "expected_version": 1}, "ValidationError", "NUL"),
    ("get_or_create_agent", {"name": "x\x00"}, "ValidationError", "NUL"),
    ("get_or_create_session", {"key": ""}, "ValidationError", "key"),
]


@pytest.mark.parametrize(("tool", "arguments", "error", "phrase"), BAD_INPUT, ids=lambda v: str(v)[:24])
async def test_bad_input_is_a_tool_error_that_writes_nothing(
    db: Database, tool: str, arguments: dict[str, Any], error: str, phrase: str
) -> None:
    async with Client(create_server(db)) as client:
        agent_id, session_id = await chat(client)
        before = {
            table: await count_rows(db, table)
            for table in ("agents", "sessions", "messages", "archival_passages")
        }
        message = await refused(client, tool, **{"agent_id": agent_id, "session_id": session_id, **arguments})
        memory = await call(client, "read_core_memory", agent_id=agent_id)
    assert f"{error}: " in message
    assert phrase in message
    assert {table: await count_rows(db, table) for table in before} == before
    assert memory["version"] == 1


async def test_a_wrongly_typed_argument_is_a_tool_error_too(db: Database) -> None:
    async with Client(create_server(db)) as client:
        _, session_id = await chat(client)
        message = await refused(client, "read_context", session_id=session_id, max_tokens="many")
        missing = await refused(client, "append_messages", session_id=session_id)
    assert "max_tokens" in message
    assert "messages" in missing
    assert await count_rows(db, "messages") == 0


async def test_a_server_for_a_tenant_reads_and_writes_that_tenant_only(db: Database) -> None:
    async with Client(create_server(db, tenant="acme")) as acme, Client(create_server(db)) as default:
        agent_id, _ = await chat(acme)
        assert "NotFoundError" in await refused(default, "read_core_memory", agent_id=agent_id)
        assert (await call(default, "get_or_create_agent", name="sam"))["created"] is True
    async with db.for_tenant("acme").unit_of_work(read_only=True) as uow:
        assert [str(agent.id) for agent in (await uow.agents.list()).items] == [agent_id]
    with pytest.raises(ValueError, match="not both"):
        create_server(db, tenant="acme", tokens=TokenTable({"acme": hash_token("t" * 20)}))
    with pytest.raises(ValidationError):
        create_server(db, tenant="a\x00")


async def test_memorm_mcp_over_stdio_serves_a_client(plain_url: str) -> None:
    async with Database(plain_url) as setup:
        await setup.upgrade()
    command = "import sys; from memorm.cli import main; sys.exit(main())"
    server = StdioServerParameters(
        command=sys.executable, args=["-c", command, "mcp", "--url", plain_url, "--tenant", "acme"], cwd=ROOT
    )
    async with Client(server) as client:
        agent_id, session_id = await chat(client)
        await call(
            client, "append_messages", session_id=session_id, messages=[{"role": "user", "content": "hi"}]
        )
        context = await call(client, "read_context", session_id=session_id, max_tokens=50)
        hit = await call(client, "insert_archival_memory", agent_id=agent_id, text="green tea")
    assert [message["content"] for message in context["messages"]] == ["hi"]
    assert hit["embedding_model"] == HashingEmbedder().model  # the default --embedder
    async with Database(plain_url) as db:
        async with db.for_tenant("acme").unit_of_work(read_only=True) as uow:
            assert [m.content for m in await uow.messages.window(session_id)] == ["hi"]
        async with db.unit_of_work(read_only=True) as uow:
            assert (await uow.agents.list()).total == 0  # the default tenant: untouched


# -- no database: tokens, embedders, the CLI's helpers, the docs page --------------------


def test_hash_token_prints_the_hash_the_tokens_file_holds(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import io

    from memorm.cli import main

    token = "s3cret-token-0123456789"
    monkeypatch.setattr(sys, "stdin", io.StringIO(token + "\n"))
    assert main(["mcp", "hash-token"]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed == hash_token(token)
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", printed)
    assert token not in printed
    monkeypatch.setattr(sys, "stdin", io.StringIO("short"))
    assert main(["mcp", "hash-token"]) == 1
    assert "at least 16 characters" in capsys.readouterr().err
    assert main(["mcp", "hash-token", "--new"]) == 0
    new, stored = (line.split(":", 1)[1].strip() for line in capsys.readouterr().out.splitlines())
    file = tmp_path / "tokens.json"
    file.write_text(json.dumps({"acme": stored, "globex": [hash_token(token)]}), encoding="utf-8")
    table = TokenTable.from_file(file)
    assert (table.tenant_of(new), table.tenant_of(token), table.tenant_of(token + "x")) == (
        "acme",
        "globex",
        None,
    )
    assert table.tenants == ["acme", "globex"]
    assert stored not in repr(table)


@pytest.mark.parametrize(
    ("content", "phrase"),
    [
        ("[]", "expected a JSON object"),
        ("{", "not JSON"),
        ('{"acme": "md5:00"}', "sha256:"),
        ('{"acme": "sha256:zz"}', "64 hex digits"),
        ('{"acme": []}', "no token hash"),
        ("{}", "no tenant has a token"),
        ('{"": "sha256:' + "0" * 64 + '"}', "tenant"),
        ('{"a": "sha256:' + "0" * 64 + '", "b": "sha256:' + "0" * 64 + '"}', "given to 'a' too"),
    ],
)
def test_a_malformed_tokens_file_is_refused_naming_what_is_wrong(
    tmp_path: Path, content: str, phrase: str
) -> None:
    file = tmp_path / "tokens.json"
    file.write_text(content, encoding="utf-8")
    with pytest.raises(ValidationError, match=re.escape(phrase)):
        TokenTable.from_file(file)


def test_the_embedder_option_names_the_stand_in_or_your_own() -> None:
    assert load_embedder().model == HashingEmbedder().model == "hashing-384"
    assert load_embedder("hashing:64").dim == 64
    assert load_embedder("memorm.embeddings:HashingEmbedder").model == "hashing-384"  # a factory
    for spec, phrase in [
        ("hashing:4", "dimension"),
        ("nope", "expected"),
        ("no.such.module:x", "cannot import"),
    ]:
        with pytest.raises(ValidationError, match=phrase):
            load_embedder(spec)
    with pytest.raises(ValidationError, match="not an embedder"):
        load_embedder("memorm.errors:__all__")


def test_refusals_before_serving_say_what_to_change(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from memorm.cli import main

    url = f"sqlite:///{tmp_path / 'none.db'}"
    assert main(["mcp", "--transport", "http", "--url", url]) == 1
    assert "--transport http needs --tokens FILE" in capsys.readouterr().err
    assert main(["mcp", "--tokens", "t.json", "--url", url]) == 1
    assert "--tokens is for --transport http" in capsys.readouterr().err
    assert main(["mcp", "--url", url]) == 1  # as every command that reads a database
    assert f"no SQLite database at {tmp_path / 'none.db'}" in capsys.readouterr().err
    assert not (tmp_path / "none.db").exists()


def test_memorm_mcp_without_the_extra_names_it_in_one_line(tmp_path: Path) -> None:
    script = (
        "import sys; sys.modules['mcp'] = None; from memorm.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    url = f"sqlite:///{tmp_path / 'none.db'}"
    done = subprocess.run([sys.executable, "-c", script, "mcp", "--url", url], capture_output=True, text=True)
    assert done.returncode == 1
    assert done.stderr.startswith("memorm: error: memorm.mcp.server needs memorm's `mcp` extra")
    assert "pip install 'memorm[mcp]'" in done.stderr
    assert len(done.stderr.splitlines()) == 1


def json_blocks(page: Path) -> list[Any]:
    return [
        json.loads(block)
        for block in re.findall(r"^```json\n(.*?)^```", page.read_text("utf-8"), re.M | re.S)
    ]


def test_the_docs_client_configurations_name_the_real_command_and_options() -> None:
    servers = [entry for block in json_blocks(PAGE) for entry in block.get("mcpServers", {}).values()]
    stdio = [entry for entry in servers if "command" in entry]
    http = [entry for entry in servers if "url" in entry]
    assert stdio
    assert http
    for entry in stdio:
        assert (entry["command"], entry["args"][0]) == ("memorm", "mcp")
        args = _parser().parse_args(entry["args"])  # argparse exits on an unknown option
        assert (args.handler.__name__, args.transport) == ("_serve", "stdio")
    for entry in http:
        assert entry["url"].endswith("/mcp")
        assert re.fullmatch(r"Bearer \S+", entry["headers"]["Authorization"])
    tokens_files = [block for block in json_blocks(PAGE) if "mcpServers" not in block]
    assert tokens_files
    assert all(TokenTable(block).tenants for block in tokens_files)
