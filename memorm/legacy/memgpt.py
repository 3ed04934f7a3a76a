"""Importing a MemGPT-style directory of agent state, saved as JSON.

The layout (one agent per folder; `DIR` may also be a single agent's folder):

```text
DIR/
  <agent>/
    config.json     {"name", "system", "persona", "human", "core_memory", "llm_config", ...}
    messages.json   [{"role", "content", "name", "tool_calls", "tool_call_id", "timestamp"}, ...]
    archival.json   [{"text", "timestamp", "meta"}, ...]  (or plain strings)
```

Only `config.json` is required.  `name` defaults to the folder's name;
`persona` and `human` become core memory blocks (beside any in
`core_memory`); other config keys are kept in the agent's
`meta["memgpt"]`.  Messages are OpenAI-style dicts
([`memorm.compat.memgpt.from_openai`][memorm.compat.memgpt.from_openai]) stored in order in one session,
each `created_at` taken from its ISO-8601 `timestamp` (UTC when it has no
offset).  Archival texts are embedded with [`HashingEmbedder`][memorm.embeddings.HashingEmbedder]
as a stand-in: re-embed them with your real model.

Every file is read and checked before anything is written, and any other
file in `DIR` is refused: in particular pickles (`*.pkl`, `*.pickle`),
which can run arbitrary code when loaded, are never opened.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from memorm.compat.memgpt import from_openai
from memorm.db import Database
from memorm.embeddings import Embedder, HashingEmbedder
from memorm.errors import ConflictError, ValidationError
from memorm.repositories.message_input import check_message
from memorm.validation import check_json_object, check_text

__all__ = ["FILES", "SESSION_KEY", "ImportResult", "LegacyAgent", "import_agents", "read_directory"]

FILES = ("config.json", "messages.json", "archival.json")
PICKLES = (".pkl", ".pickle")
SESSION_KEY = "memgpt-import"  # the imported session's key
_CORE_KEYS = ("persona", "human")
_CONFIG_KEYS = ("name", "system", "core_memory", "llm_config", *_CORE_KEYS)


@dataclass
class LegacyAgent:
    """One agent read from the directory, checked and ready to store."""

    name: str
    path: Path
    system: str = ""
    core_memory: dict[str, str] = field(default_factory=dict)
    llm_config: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    messages: list[dict[str, Any]] = field(default_factory=list)
    passages: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class ImportResult:
    """What happened to one agent: imported (with how many rows), or skipped and why."""

    name: str
    imported: bool
    messages: int = 0
    passages: int = 0
    reason: str = ""


def _refuse_strangers(root: Path, folders: list[Path]) -> None:
    """Every file under `root` must be one of an agent folder's `FILES`."""
    expected = {folder / name for folder in folders for name in FILES}
    everything = sorted(root.rglob("*"))
    for found in everything:  # pickles first: the most important refusal to explain
        if found.suffix.lower() in PICKLES:
            raise ValidationError(
                f"refusing {found}: pickled state can run arbitrary code when loaded, so memorm never "
                "loads it; export the agent's state to JSON (see docs/cli.md) and remove the pickle"
            )
    for found in everything:
        if found not in expected and not (found.is_dir() and found in folders):
            kind = "folder" if found.is_dir() else "file"
            raise ValidationError(
                f"refusing {found}: an unexpected {kind}; an agent folder holds only {', '.join(FILES)}"
            )


def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValidationError(f"{path}: not valid JSON ({error.msg}, line {error.lineno})") from None
    except UnicodeDecodeError:
        raise ValidationError(f"{path}: not UTF-8 text") from None
    except RecursionError:  # Python's parser recurses once per level
        raise ValidationError(f"{path}: JSON nested too deeply") from None


def _timestamp(value: object, where: str) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValidationError(f"{where}.timestamp: expected an ISO-8601 string, got {value!r}")
    try:
        moment = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValidationError(f"{where}.timestamp: not an ISO-8601 time: {value!r}") from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)


def _content(value: object) -> object:
    """OpenAI content parts (`[{"type": "text", "text": …}]`) joined into one string."""
    if isinstance(value, list) and all(isinstance(part, dict) for part in value):
        return "".join(str(part.get("text", "")) for part in value if part.get("type") == "text")
    return value


def _messages(path: Path) -> list[dict[str, Any]]:
    raw = _load(path)
    if not isinstance(raw, list):
        raise ValidationError(f"{path}: expected a list of messages")
    messages: list[dict[str, Any]] = []
    for index, item in enumerate(raw):
        where = f"{path}: messages[{index}]"
        if not isinstance(item, dict):
            raise ValidationError(f"{where}: expected an object")
        item = dict(item)
        created_at = _timestamp(item.pop("timestamp", None), where)
        if "content" in item:
            item["content"] = _content(item["content"])
        message = dict(from_openai(item))  # a dict in, a dict out
        if created_at is not None:
            message["created_at"] = created_at
        try:
            check_message(message, index)
        except ValidationError as error:
            raise ValidationError(f"{path}: {error}") from None
        messages.append(message)
    return messages


def _passages(path: Path) -> list[dict[str, Any]]:
    raw = _load(path)
    if not isinstance(raw, list):
        raise ValidationError(f"{path}: expected a list of passages")
    passages: list[dict[str, Any]] = []
    for index, item in enumerate(raw):
        where = f"{path}: archival[{index}]"
        entry = {"text": item} if isinstance(item, str) else item
        if not isinstance(entry, dict) or not isinstance(entry.get("text"), str) or not entry["text"].strip():
            raise ValidationError(f'{where}: expected a non-empty string or an object with "text"')
        passages.append(
            {
                "text": check_text(entry["text"], f"{where}.text"),
                "created_at": _timestamp(entry.get("timestamp"), where),
                "meta": check_json_object(entry.get("meta"), f"{where}.meta"),
            }
        )
    return passages


def _agent(folder: Path) -> LegacyAgent:
    config = _load(folder / "config.json")
    where = folder / "config.json"
    if not isinstance(config, dict):
        raise ValidationError(f"{where}: expected an object")
    try:
        name = check_text(config.get("name", folder.name), "name") or ""
        if not name.strip():
            raise ValidationError("name: must not be blank")
        core = {str(k): v for k, v in check_json_object(config.get("core_memory"), "core_memory").items()}
        core.update({key: config[key] for key in _CORE_KEYS if config.get(key) is not None})
        for label, text in core.items():
            check_text(text, f"core_memory.{label}")
        extra = {key: value for key, value in config.items() if key not in _CONFIG_KEYS}
        agent = LegacyAgent(
            name=name,
            path=folder,
            system=check_text(config.get("system") or "", "system") or "",
            core_memory=core,
            llm_config=check_json_object(config.get("llm_config"), "llm_config"),
            meta={"memgpt": extra} if extra else {},
        )
    except ValidationError as error:
        raise ValidationError(f"{where}: {error}") from None
    if (folder / "messages.json").is_file():
        agent.messages = _messages(folder / "messages.json")
    if (folder / "archival.json").is_file():
        agent.passages = _passages(folder / "archival.json")
    return agent


def read_directory(root: Path, *, only: str | None = None) -> list[LegacyAgent]:
    """Read and check every agent under `root` (or just the one called `only`).

    Raises `ValidationError` for a pickle or any other unexpected file, bad
    JSON, or a value memorm would reject — before anything is written.
    """
    if not root.is_dir():
        raise ValidationError(f"{root}: not a directory")
    if (root / "config.json").is_file():
        folders = [root]
    else:
        folders = sorted(entry for entry in root.iterdir() if entry.is_dir())
        folders = [folder for folder in folders if (folder / "config.json").is_file()]
    _refuse_strangers(root, folders)
    if not folders:
        raise ValidationError(f"{root}: no agent folders (each needs a config.json)")
    agents = [_agent(folder) for folder in folders]
    names = [agent.name for agent in agents]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValidationError(f"{root}: several folders name the agent {', '.join(map(repr, twice))}")
    if only is not None:
        agents = [agent for agent in agents if agent.name == only]
        if not agents:
            raise ValidationError(f"{root}: no agent called {only!r} (found {', '.join(names)})")
    return agents


async def _store(db: Database, agent: LegacyAgent, vectors: list[list[float]], model: str) -> ImportResult:
    async with db.unit_of_work() as uow:
        if await uow.agents.get_by_name(agent.name) is not None:
            return ImportResult(agent.name, imported=False, reason="an agent of that name exists")
        try:
            stored = await uow.agents.create(
                agent.name,
                system=agent.system,
                core_memory=agent.core_memory,
                llm_config=agent.llm_config,
                meta=agent.meta,
            )
        except ConflictError:  # created meanwhile by another process
            return ImportResult(agent.name, imported=False, reason="an agent of that name exists")
        chat = await uow.sessions.create(
            stored.id, title="imported from MemGPT", key=SESSION_KEY, meta={"source": str(agent.path)}
        )
        if agent.messages:
            await uow.messages.append(chat.id, agent.messages)
        items = [
            {**passage, "embedding": vector, "embedding_model": model}
            for passage, vector in zip(agent.passages, vectors, strict=True)
        ]
        if items:
            await uow.passages.add_many(stored.id, items)
    return ImportResult(agent.name, imported=True, messages=len(agent.messages), passages=len(items))


async def import_agents(
    db: Database, agents: list[LegacyAgent], *, embedder: Embedder | None = None
) -> list[ImportResult]:
    """Store each agent with one session of its messages and its archival passages.

    One unit of work per agent, all or nothing.  An agent whose name is taken
    is skipped (so importing the same directory twice adds nothing).  Passages
    are embedded with `embedder` (default `HashingEmbedder()`, a stand-in
    to re-embed with a real model).
    """
    embedder = embedder or HashingEmbedder()
    results = []
    for agent in agents:
        vectors = await embedder.embed([passage["text"] for passage in agent.passages])
        results.append(await _store(db, agent, vectors, embedder.model))
    return results
