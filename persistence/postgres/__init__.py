"""The PostgreSQL state store (docs/design.md#the-postgresql-store): the seam of
persistence/store.py over tables in PostgreSQL, through psycopg 3. An optional extra
(`pip install 'sharecoord[postgres]'`): nothing outside this package imports it, so the
embedded default runs without it."""

from persistence.postgres.leases import (
    Leader,
    Lease,
    NodeRow,
    claim,
    heartbeat,
    list_leases,
    list_nodes,
    live_leaders,
    release,
    renew,
)
from persistence.postgres.partition import PostgresPartition, RowBatch
from persistence.postgres.schema import SCHEMA_VERSION, Tables
from persistence.postgres.store import PostgresStore
from persistence.store_uri import masked

__all__ = [
    "SCHEMA_VERSION",
    "Leader",
    "Lease",
    "NodeRow",
    "PostgresPartition",
    "PostgresStore",
    "RowBatch",
    "Tables",
    "claim",
    "heartbeat",
    "list_leases",
    "list_nodes",
    "live_leaders",
    "masked",
    "release",
    "renew",
]
