"""examples/fastapi_server.py, driven over ASGI with httpx, on both engines.

The app reads a plain URL from ``MEMORM_DATABASE_URL`` (a URL cannot carry a
search_path), so on Postgres each test gets a throwaway database.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
import sqlalchemy as sa

from memorm.schema_state import head_revision, scripts

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from examples.fastapi_server import app  # noqa: E402  (after the skips)

pytestmark = pytest.mark.anyio


@pytest.fixture
def database_url(plain_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The app's database (MEMORM_DATABASE_URL): a SQLite file, or a throwaway Postgres database."""
    monkeypatch.setenv("MEMORM_DATABASE_URL", plain_url)
    return plain_url


@pytest.fixture
async def client(database_url: str) -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client on the app, inside its lifespan (the database opened and migrated)."""
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://memorm.test") as http:
            yield http


async def new_session(client: httpx.AsyncClient, name: str = "sam") -> tuple[str, str]:
    agent = await client.post("/agents", json={"name": name, "system": "You are Sam."})
    assert agent.status_code == 201, agent.text
    chat = await client.post(f"/agents/{agent.json()['id']}/sessions", json={"title": "first"})
    assert chat.status_code == 201, chat.text
    assert chat.json()["agent_id"] == agent.json()["id"]
    return agent.json()["id"], chat.json()["id"]


async def test_append_returns_stored_messages_with_seq(client: httpx.AsyncClient) -> None:
    _, chat = await new_session(client)
    first = await client.post(
        f"/sessions/{chat}/messages",
        json=[{"role": "system", "content": "You are Sam."}, {"role": "user", "content": "hi"}],
    )
    assert first.status_code == 201, first.text
    assert [(m["seq"], m["role"]) for m in first.json()] == [(1, "system"), (2, "user")]
    more = await client.post(f"/sessions/{chat}/messages", json=[{"role": "assistant", "content": "hello"}])
    assert [m["seq"] for m in more.json()] == [3]
    assert more.json()[0]["session_id"] == chat


async def test_context_keeps_system_and_newest_within_budget(client: httpx.AsyncClient) -> None:
    _, chat = await new_session(client)
    messages = [{"role": "system", "content": "You are Sam."}]
    messages += [{"role": "user", "content": f"message {n} " + "word " * 20} for n in range(10)]
    assert (await client.post(f"/sessions/{chat}/messages", json=messages)).status_code == 201
    everything = await client.get(f"/sessions/{chat}/context", params={"max_tokens": 100_000})
    assert everything.status_code == 200
    assert [m["seq"] for m in everything.json()] == list(range(1, 12))
    tight = await client.get(f"/sessions/{chat}/context", params={"max_tokens": 80})
    kept = tight.json()
    assert kept[0]["role"] == "system"
    assert 1 < len(kept) < 11
    assert [m["seq"] for m in kept[1:]] == list(range(12 - len(kept) + 1, 12))  # the newest, in order


async def test_search_returns_items_and_total(client: httpx.AsyncClient) -> None:
    agent, chat = await new_session(client)
    batch = [{"role": "user", "content": f"the blue whale number {n}"} for n in range(3)]
    batch.append({"role": "assistant", "content": "a red herring"})
    await client.post(f"/sessions/{chat}/messages", json=batch)
    found = await client.get(f"/agents/{agent}/search", params={"q": "whale", "limit": 2})
    assert found.status_code == 200
    assert found.json()["total"] == 3
    assert len(found.json()["items"]) == 2
    assert all("whale" in m["content"] for m in found.json()["items"])
    nothing = await client.get(f"/agents/{agent}/search", params={"q": "submarine"})
    assert nothing.json() == {"items": [], "total": 0}


async def test_unknown_ids_are_404(client: httpx.AsyncClient) -> None:
    missing = str(uuid.uuid4())
    assert (await client.post(f"/agents/{missing}/sessions", json={})).status_code == 404
    assert (await client.post(f"/sessions/{missing}/messages", json=[])).status_code == 404
    response = await client.get(f"/sessions/{missing}/context", params={"max_tokens": 10})
    assert response.status_code == 404
    assert "no session" in response.json()["detail"]
    assert (await client.get(f"/agents/{missing}/search", params={"q": "x"})).status_code == 404


async def test_taken_agent_name_is_409(client: httpx.AsyncClient) -> None:
    await new_session(client, "taken")
    again = await client.post("/agents", json={"name": "taken"})
    assert again.status_code == 409
    assert again.json()["detail"] == "an agent named 'taken' exists"  # no driver internals


async def test_memorm_validation_errors_are_422_and_write_nothing(client: httpx.AsyncClient) -> None:
    _, chat = await new_session(client)
    blank = await client.post("/agents", json={"name": "   "})  # memorm rejects blank names
    assert blank.status_code == 422
    assert "name" in blank.json()["detail"]
    nul = await client.post(
        f"/sessions/{chat}/messages",
        json=[{"role": "user", "content": "fine"}, {"role": "user", "content": "bad\x00byte"}],
    )
    assert nul.status_code == 422
    budget = await client.get(f"/sessions/{chat}/context", params={"max_tokens": 0})
    assert budget.status_code == 422
    assert (await client.get(f"/sessions/{chat}/context", params={"max_tokens": 10**6})).json() == []


async def test_request_validation_is_422(client: httpx.AsyncClient) -> None:
    _, chat = await new_session(client)
    assert (await client.post(f"/sessions/{chat}/messages", json=[{"role": "robot"}])).status_code == 422
    assert (await client.get("/sessions/not-a-uuid/context", params={"max_tokens": 5})).status_code == 422


async def test_tenants_share_agent_names_and_see_only_their_own_data(client: httpx.AsyncClient) -> None:
    chats = {}
    for tenant in ("acme", "globex"):
        headers = {"X-Tenant": tenant}
        agent = await client.post("/agents", json={"name": "sam"}, headers=headers)  # the same name: no 409
        assert agent.status_code == 201, agent.text
        chat = await client.post(f"/agents/{agent.json()['id']}/sessions", json={}, headers=headers)
        said = [{"role": "user", "content": f"the {tenant} whale"}]
        assert (
            await client.post(f"/sessions/{chat.json()['id']}/messages", json=said, headers=headers)
        ).is_success
        chats[tenant] = (agent.json()["id"], chat.json()["id"])
    assert (await client.post("/agents", json={"name": "sam"})).status_code == 201  # no header: "default"
    for tenant, (agent, chat) in chats.items():
        headers = {"X-Tenant": tenant}
        seen = await client.get(f"/sessions/{chat}/context", params={"max_tokens": 100}, headers=headers)
        assert [m["content"] for m in seen.json()] == [f"the {tenant} whale"]
        found = await client.get(f"/agents/{agent}/search", params={"q": "whale"}, headers=headers)
        assert [m["content"] for m in found.json()["items"]] == [f"the {tenant} whale"]
        for other in ("acme", "globex", "default"):
            if other == tenant:
                continue
            theirs = {"X-Tenant": other}  # the other tenant's ids are unknown ids there
            missing = await client.get(
                f"/sessions/{chat}/context", params={"max_tokens": 100}, headers=theirs
            )
            assert (missing.status_code, missing.json()) == (404, {"detail": f"no session {chat}"})
            assert (
                await client.get(f"/agents/{agent}/search", params={"q": "whale"}, headers=theirs)
            ).json() == {"detail": f"no agent {agent}"}
            wrote = await client.post(f"/sessions/{chat}/messages", json=[{"role": "user"}], headers=theirs)
            assert wrote.status_code == 404


async def test_a_tenant_header_that_is_no_tenant_name_is_422(client: httpx.AsyncClient) -> None:
    for bad in ("", "x" * 129):
        response = await client.post("/agents", json={"name": "sam"}, headers={"X-Tenant": bad})
        assert response.status_code == 422, bad
        assert "tenant" in response.json()["detail"]
        assert (
            await client.get(f"/agents/{uuid.uuid4()}/search", params={"q": "x"}, headers={"X-Tenant": bad})
        ).status_code == 422
    longest = await client.post("/agents", json={"name": "sam"}, headers={"X-Tenant": "x" * 128})
    assert longest.status_code == 201


async def test_a_tenant_header_is_read_as_utf8_and_other_bytes_are_422(client: httpx.AsyncClient) -> None:
    # HTTP servers hand a header's bytes over as latin-1: "café" in UTF-8 arrived as "cafÃ©".
    made = await client.post("/agents", json={"name": "sam"}, headers={"X-Tenant": "café".encode()})
    assert made.status_code == 201, made.text
    db = app.state.db
    async with db.for_tenant("café").unit_of_work(read_only=True) as uow:
        assert (await uow.agents.get(made.json()["id"])).name == "sam"
    async with db.for_tenant("cafÃ©").unit_of_work(read_only=True) as uow:
        assert await uow.agents.get_by_name("sam") is None
    latin1 = await client.post(
        "/agents", json={"name": "sam"}, headers={"X-Tenant": "café".encode("latin-1")}
    )
    assert latin1.status_code == 422
    assert latin1.json() == {"detail": "tenant: the X-Tenant header is not UTF-8 text"}


async def test_healthz_is_200_while_the_schema_is_current_and_503_when_it_is_behind(
    client: httpx.AsyncClient,
) -> None:
    ready = await client.get("/healthz")
    assert ready.status_code == 200, ready.text
    body = ready.json()
    assert body["ok"] is True
    assert body["revision"] == head_revision()
    assert body["error"] is None
    assert body["pool"]["in_use"] == 0
    assert body["latency"] > 0
    behind = scripts().get_revision(head_revision()).down_revision
    db = app.state.db
    async with db.unit_of_work() as uow:  # another release's deploy moved the schema back
        await uow.session.execute(sa.text("UPDATE alembic_version SET version_num = :r"), {"r": behind})
    stale = await client.get("/healthz")
    assert stale.status_code == 503
    assert (stale.json()["ok"], stale.json()["revision"], stale.json()["reachable"]) == (False, behind, True)
