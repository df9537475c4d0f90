"""The PostgreSQL state store (docs/design.md#the-postgresql-store): the seam of
persistence/store.py over tables in PostgreSQL, through psycopg 3. An optional extra
(`pip install 'sharecoord[postgres]'`): nothing outside this package imports it, so the
embedded default runs without it."""

from persistence.postgres.connection import masked
from persistence.postgres.leases import Lease, claim, heartbeat, list_leases, release, renew
from persistence.postgres.partition import PostgresPartition, RowBatch
from persistence.postgres.schema import SCHEMA_VERSION, Tables
from persistence.postgres.store import PostgresStore

__all__ = [
    "SCHEMA_VERSION",
    "Lease",
    "PostgresPartition",
    "PostgresStore",
    "RowBatch",
    "Tables",
    "claim",
    "heartbeat",
    "list_leases",
    "masked",
    "release",
    "renew",
]
