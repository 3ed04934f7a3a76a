"""Portable column types: one schema, two engines.

Each type is a `TypeDecorator` whose `load_dialect_impl` picks the native
type on Postgres (`jsonb`, `timestamptz`, `uuid`, pgvector's `vector`,
`tsvector`) and a faithful encoding on SQLite.  Nothing here depends on runtime settings.
"""

from memorm.types.datetime import UTCDateTime, utcnow
from memorm.types.json import JSONType
from memorm.types.search_words import SearchWords
from memorm.types.uuid import UUIDType
from memorm.types.vector import VectorType

__all__ = ["JSONType", "SearchWords", "UTCDateTime", "UUIDType", "VectorType", "utcnow"]
