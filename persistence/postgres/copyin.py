"""Records into sharecoord_records by COPY in its binary format, encoded here.

psycopg's ``write_row`` dumps a row value by value through its Python dumpers; struct
packs a record's numbers and lengths in one call, and the bytes go to the server as one
block: about 1 µs of CPU per record where write_row took several (bench/pg_cycle.py
shows the commit thread's CPU per cycle). The format is PostgreSQL's, "Binary Format"
of the COPY command: a signature and a header extension length, then per row its
number of fields and each field as a length (-1 for NULL) and its bytes in network
order, then -1 as a 16-bit trailer.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Iterable
from typing import Any

import psycopg
from psycopg import sql

from persistence.postgres.schema import Tables

# state_partition, offset, record_type, key, value, timestamp: a record's row
Row = tuple[int, int, int, bytes, bytes | None, int]

SIGNATURE = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)  # no flags, no extension
TRAILER = struct.pack(">h", -1)
# 6 fields; state_partition int4, offset int8, record_type int2, then the key's length
_HEAD = struct.Struct(">hiiiqihi").pack
_LENGTH = struct.Struct(">i").pack
_NULL = _LENGTH(-1)
_TIMESTAMP = struct.Struct(">iq").pack
# The bytes a row takes besides its key and value: the numbers and the length words.
ROW_OVERHEAD = struct.calcsize(">hiiiqihi") + 4 + struct.calcsize(">iq")


def encode(rows: Iterable[Row]) -> bytes:
    """Rows in COPY's binary format, without the signature and the trailer; its length
    is the rows' keys and values and ROW_OVERHEAD bytes a row."""
    out: list[bytes] = []
    add = out.extend
    for partition, offset, record_type, key, value, timestamp in rows:
        head = _HEAD(6, 4, partition, 8, offset, 2, record_type, len(key))
        if value is None:
            add((head, key, _NULL, _TIMESTAMP(8, timestamp)))
        else:
            add((head, key, _LENGTH(len(value)), value, _TIMESTAMP(8, timestamp)))
    return b"".join(out)


@functools.cache
def _statement(tables: Tables) -> sql.Composed:
    return tables.sql(
        'COPY {records} (state_partition, "offset", record_type, key, value, "timestamp") '
        "FROM STDIN (FORMAT BINARY)"
    )


def copy_records(conn: psycopg.Connection[Any], tables: Tables, blocks: Iterable[bytes]) -> None:
    """COPY the rows of `blocks` (each from ``encode``) into sharecoord_records, in the
    connection's transaction."""
    with conn.cursor() as cur, cur.copy(_statement(tables)) as copy:
        copy.write(SIGNATURE)
        for block in blocks:
            copy.write(block)
        copy.write(TRAILER)
