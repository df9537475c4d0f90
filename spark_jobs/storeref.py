"""A PostgreSQL store as the Spark jobs name it (``StoreRef``): plain data, which Spark
ships to the tasks, and which imports no driver, so the jobs over a data directory run
without the `postgres` extra. spark_jobs/pgsource.py reads through it."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from persistence.store_uri import masked


@dataclass(frozen=True)
class StoreRef:
    """A PostgreSQL store: its URI (libpq's) and the schema of its tables."""

    uri: str
    schema: str = "public"

    def __str__(self) -> str:
        """The store as reports, progress lines and checkpoints name it: the password
        masked."""
        return f"{masked(self.uri)} schema {self.schema}"

    def __repr__(self) -> str:
        return f"StoreRef({self})"


# The jobs take the store's URI from the environment, not from their command line
# (where `ps` would show its password): `sharecoord compact` and `audit` set it there.
STATE_STORE_ENV = "SHARECOORD_STATE_STORE"


def add_state_store_args(parser: argparse.ArgumentParser) -> None:
    """A job's --state-store (default: $SHARECOORD_STATE_STORE) and --state-store-schema."""
    parser.add_argument("--state-store", default=os.environ.get(STATE_STORE_ENV) or None)
    parser.add_argument("--state-store-schema", default="public")


def state_store_of(args: argparse.Namespace, job: str) -> StoreRef | None:
    """The store a job's arguments name, None for a data directory (then required)."""
    if args.state_store:
        return StoreRef(args.state_store, args.state_store_schema)
    if not args.data_dir:
        raise SystemExit(f"{job}: give --data-dir or --state-store")
    return None
