"""The operator commands on a PostgreSQL store (``--state-store postgresql://...``):
``log dump`` and ``log verify`` (this module and server/postgres_verify.py), and
``partition export`` and ``import`` (server/postgres_partitions.py).

They read in one REPEATABLE READ snapshot (persistence/postgres/reading.py): none of
them changes a row but ``partition import``, and a running cluster can be dumped and
verified as it serves. Output and exit codes are the data directory's
(server/tools.py): 2 when the URI or schema names no store (no sharecoord tables
there, a URI libpq cannot parse), 1 when it cannot be read (one line, the password
masked) or is damaged.

Imported only for such a store: psycopg is the ``postgres`` extra.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import TextIO

from persistence.errors import LogError, StoreUnavailableError
from persistence.postgres.reading import NotAStoreError, StoreSnapshot, read_snapshot
from persistence.store_uri import masked
from protocol.records import RecordDecoder
from server.postgres_verify import print_report, records_of, verify_store
from server.tools import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, dump_line


class StoreToolError(Exception):
    """Why a command cannot run on the store, with its exit code: one line."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


@contextlib.contextmanager
def snapshot_of(uri: str, schema: str) -> Iterator[StoreSnapshot]:
    """``read_snapshot``, its errors as StoreToolError: a URI or schema that names no
    store is a usage error (2), a store that cannot be read a failure (1)."""
    try:
        with read_snapshot(uri, schema) as store:
            yield store
    except StoreUnavailableError as exc:
        raise StoreToolError(EXIT_FAILURE, str(exc)) from None
    except (NotAStoreError, LogError) as exc:
        raise StoreToolError(EXIT_USAGE, str(exc)) from None


def store_flags(uri: str, schema: str) -> str:
    """The flags that name the store again, as a person would type them."""
    flags = f"--state-store '{masked(uri)}'"
    return flags if schema == "public" else f"{flags} --state-store-schema {schema}"


def log_verify_postgres(uri: str, schema: str, out: TextIO = sys.stdout) -> int:
    """``log verify`` on a PostgreSQL store (server/postgres_verify.py)."""
    try:
        with snapshot_of(uri, schema) as store:
            report = verify_store(store)
    except StoreToolError as exc:
        print(f"sharecoord log verify: {exc}", file=sys.stderr)
        return exc.code
    return print_report(report, out, uri_flag=store_flags(uri, schema))


def log_dump_postgres(
    uri: str, schema: str, partition: int | None, as_json: bool, out: TextIO = sys.stdout
) -> int:
    """``log dump`` on a PostgreSQL store: every record (of one state partition), in
    offset order, as a data directory's are printed."""
    decoder = RecordDecoder()
    try:
        with snapshot_of(uri, schema) as store:
            num_partitions = store.num_partitions
            if num_partitions is None or store.missing_tables:
                raise StoreToolError(
                    EXIT_FAILURE,
                    f"the store {store.where} is damaged (missing tables or no schema "
                    f"row): `sharecoord log verify {store_flags(uri, schema)}` says what",
                )
            if partition is not None and not 0 <= partition < num_partitions:
                raise StoreToolError(
                    EXIT_USAGE,
                    f"partition {partition} is out of range 0..{num_partitions - 1}",
                )
            partitions = [partition] if partition is not None else list(range(num_partitions))
            for p, record in records_of(store, partitions):
                out.write(dump_line(p, record, decoder, as_json))
                out.write("\n")
    except StoreToolError as exc:
        print(f"sharecoord log dump: {exc}", file=sys.stderr)
        return exc.code
    except BrokenPipeError:  # `| head` is a fine way to read a log
        sys.stderr.close()
    return EXIT_OK
