"""LangChain documents <-> memorm archival passages: ids, metadata and the items `add_many` takes."""

from __future__ import annotations

import uuid
from typing import Any

from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings

from memorm.errors import ValidationError
from memorm.ids import uuid7
from memorm.models import ArchivalPassage
from memorm.validation import check_json_object, check_list, check_text

__all__ = [
    "DOCUMENT_ID_KEY",
    "DOCUMENT_ID_NAMESPACE",
    "Batch",
    "embedding_model_of",
    "passage_batch",
    "passage_id",
    "to_document",
]

# Fixed forever: document ids that are not UUIDs map to uuid5(namespace, "<agent>/<id>").
DOCUMENT_ID_NAMESPACE = uuid.UUID("6f3f1c2e-8d7a-5b4e-9c1d-2a7e4b6c9d10")
DOCUMENT_ID_KEY = "_langchain_id"  # passage meta: the Document.id, when it is not the passage id

Batch = tuple[list[str], list[dict[str, Any]], set[uuid.UUID]]
"""Document ids, passage items (without embeddings) and the passage ids that may exist already."""


def embedding_model_of(embedding: Embeddings) -> str:
    """The memorm embedding model name for LangChain embeddings: their `model`, else `"default"`."""
    for attribute in ("model", "model_name", "model_id"):
        value = getattr(embedding, attribute, None)
        if isinstance(value, str) and value.strip():
            return value
    return "default"


def passage_id(agent_id: uuid.UUID, document_id: str) -> uuid.UUID:
    """The passage id a document id maps to in `agent_id`'s store.

    A canonical UUID string is the passage id itself; any other string maps to
    a UUID derived from the agent and the id, so two agents' `"1"` differ.
    """
    if not isinstance(document_id, str) or not document_id:
        raise ValidationError(f"ids: expected non-empty strings, got {document_id!r:.80}")
    try:
        parsed = uuid.UUID(document_id)
    except ValueError:
        parsed = None
    if parsed is not None and str(parsed) == document_id:
        return parsed
    return uuid.uuid5(DOCUMENT_ID_NAMESPACE, f"{agent_id}/{document_id}")


def to_document(passage: ArchivalPassage) -> Document:
    """The LangChain `Document` a passage holds."""
    meta = dict(passage.meta or {})
    document_id = meta.pop(DOCUMENT_ID_KEY, None)
    return Document(
        id=document_id if isinstance(document_id, str) else str(passage.id),
        page_content=passage.text,
        metadata=meta,
    )


def passage_batch(
    agent_id: uuid.UUID,
    embedding_model: str,
    texts: list[str],
    metadatas: object,
    ids: object,
) -> Batch:
    """The passages storing `texts` (embeddings still to add), checked before anything is embedded.

    `ids` entries that are None get new UUIDv7 ids; given ids may name
    passages that exist already (an add under them replaces those).
    """
    for index, text in enumerate(texts):
        check_text(text, f"texts[{index}]")
    if metadatas is not None:
        metadatas = check_list(metadatas, "metadatas", "dicts")
    if ids is not None:
        ids = check_list(ids, "ids", "strings or None")
    if metadatas is not None and len(metadatas) != len(texts):
        raise ValidationError(f"metadatas: {len(metadatas)} for {len(texts)} texts")
    if ids is not None and len(ids) != len(texts):
        raise ValidationError(f"ids: {len(ids)} for {len(texts)} texts")
    keys: list[str] = []
    items: list[dict[str, Any]] = []
    existing: set[uuid.UUID] = set()
    for index, text in enumerate(texts):
        given = None if ids is None else ids[index]
        if given is None:
            key_id = uuid7()
            key = str(key_id)
        else:
            key, key_id = given, passage_id(agent_id, given)
            existing.add(key_id)
        meta = check_json_object(metadatas[index], f"metadatas[{index}]") if metadatas is not None else {}
        if DOCUMENT_ID_KEY in meta:
            raise ValidationError(f"metadatas[{index}]: {DOCUMENT_ID_KEY!r} is reserved for the document id")
        if str(key_id) != key:
            meta[DOCUMENT_ID_KEY] = key
        keys.append(key)
        items.append({"id": key_id, "text": text, "meta": meta, "embedding_model": embedding_model})
    return keys, items, existing
