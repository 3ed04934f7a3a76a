"""What both engines' vector searches share: the current-model check and passages from rows.

A search's model may come from a cache (`memorm.search.model_cache`), so
each engine's statements carry `current_model`, with the parameters
`model_params` gives; and each reads the passage's own columns
(`PASSAGE_FIELDS`, not the derived search words), from which
`passage_of_row` builds the passage.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql import ColumnElement

from memorm.models import EMBEDDING_MODELS, PASSAGES, ArchivalPassage, EmbeddingModel, fields, hydrate

__all__ = ["PASSAGE_FIELDS", "PASSAGE_WIDTH", "current_model", "model_params", "passage_of_row"]

PASSAGE_FIELDS = fields(PASSAGES)  # the passage's columns, not the derived search words
PASSAGE_WIDTH = len(PASSAGE_FIELDS)
_NAMES = tuple(column.name for column in PASSAGE_FIELDS)


def current_model(tenant: Any, agent_id: Any, model: EmbeddingModel | None = None) -> ColumnElement[bool]:
    """True while this very model row is the agent's: same id, name, dimension and precision.

    A search statement carries it, so a model cached on the `Database`
    (`memorm.search.model_cache`) that another process dropped or replaced
    matches no rows rather than the wrong ones.  An index lookup by primary
    key; Postgres evaluates it once per statement (it refers to no outer row).
    Without `model`, its values are the parameters `model_id`, `model_name`,
    `model_dim` and `model_precision` (a statement built once,
    `memorm.search.vector_pg`), which `model_params` gives.
    """
    shape: tuple[Any, ...] = (
        (model.id, model.name, model.dim, model.precision)
        if model is not None
        else tuple(sa.bindparam(f"model_{field}") for field in ("id", "name", "dim", "precision"))
    )
    return sa.exists().where(
        EMBEDDING_MODELS.c.tenant == tenant,
        EMBEDDING_MODELS.c.id == shape[0],
        EMBEDDING_MODELS.c.agent_id == agent_id,
        EMBEDDING_MODELS.c.name == shape[1],
        EMBEDDING_MODELS.c.dim == shape[2],
        EMBEDDING_MODELS.c.precision == shape[3],
    )


def model_params(tenant: str, agent_id: uuid.UUID, model: EmbeddingModel) -> dict[str, Any]:
    """The parameters of `current_model` (built without a model) and of the agent it belongs to."""
    return {
        "tenant": tenant,
        "agent": agent_id,
        "model_id": model.id,
        "model_name": model.name,
        "model_dim": model.dim,
        "model_precision": model.precision,
    }


def passage_of_row(row: Sequence[Any]) -> ArchivalPassage:
    """The passage in a row that starts with the passage's columns."""
    return hydrate(ArchivalPassage, dict(zip(_NAMES, row[:PASSAGE_WIDTH], strict=True)))
