"""The SQLite log store, the embedded default control plane: `schema` (tables, statements,
migrations), `staging` (pure group-commit staging), `writer_link` + `writer_process` (the process
that commits staged batches), `lockfile` (one store per file), `store` (the facade)."""

from .schema import SCHEMA_VERSION
from .store import LogStoreStatistics, SqliteLogStore, Synchronous

__all__ = ["SCHEMA_VERSION", "LogStoreStatistics", "SqliteLogStore", "Synchronous"]
