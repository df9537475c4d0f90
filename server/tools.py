"""Operator commands that read a data directory or ask a running daemon:
``sharecoord log dump``, ``sharecoord log verify`` and ``sharecoord state get``.

None of them takes the data directory's lock or changes a byte: they are safe next to a
running daemon (a frame being written at the very end of a partition is reported as an
incomplete tail, not as damage).
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any, TextIO

from persistence import LogError, LogRecord, partition_dir, read_meta, read_partition, verify
from persistence.journal import JOURNAL_DIR
from persistence.ownership import describe
from persistence.statelog import META_FILE, PARTITIONS_DIR
from protocol.batches import state_name
from protocol.records import (
    FIELDS,
    LOG_OFFSET,
    RECORD_TYPE,
    STATE_BATCHES,
    STATE_PARTITION,
    TIMESTAMP,
    TOMBSTONE,
    VALUE_FIELDS,
    FieldType,
    Record,
    RecordDecodeError,
    RecordDecoder,
    record_row,
)
from protocol.replay import DEFAULT_RECORDS_PER_SNAPSHOT, ShareStateMap
from server.security import SecurityError, client_ssl_context, load_token

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
# `log dump --json`'s record_type for a frame whose key or value does not decode.
UNDECODABLE = "undecodable"


# --- log dump ---------------------------------------------------------------------------


def log_dump(data_dir: str, partition: int | None, as_json: bool, out: TextIO = sys.stdout) -> int:
    try:
        num_partitions = int(read_meta(data_dir)["num_partitions"])
    except LogError as exc:
        print(f"sharecoord log dump: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:  # a meta that is a directory, or cannot be read
        print(f"sharecoord log dump: --data-dir {data_dir}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    if partition is not None and not 0 <= partition < num_partitions:
        print(
            f"sharecoord log dump: partition {partition} is out of range 0..{num_partitions - 1}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    partitions = [partition] if partition is not None else list(range(num_partitions))
    decoder = RecordDecoder()
    try:
        for p in partitions:
            for frame in read_partition(partition_dir(data_dir, p)):
                out.write(dump_line(p, frame, decoder, as_json))
                out.write("\n")
    except LogError as exc:
        print(f"sharecoord log dump: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except BrokenPipeError:  # `| head` is a fine way to read a log
        sys.stderr.close()
    return EXIT_OK


def dump_line(partition: int, frame: LogRecord, decoder: RecordDecoder, as_json: bool) -> str:
    """One record as ``log dump`` prints it: its row (protocol.records.FIELDS) as JSON,
    or a line for people."""
    try:
        record: Record | None = decoder.decode(frame.record_type, frame.key, frame.value)
        problem = None
    except RecordDecodeError as exc:
        record, problem = None, str(exc)
    if as_json:
        if record is None:
            row: dict[str, Any] = dict.fromkeys(f.name for f in FIELDS)
            row.update(
                {
                    STATE_PARTITION.name: partition,
                    LOG_OFFSET.name: frame.offset,
                    TIMESTAMP.name: frame.timestamp,
                    RECORD_TYPE.name: UNDECODABLE,
                    "error": problem,
                }
            )
        else:
            row = record_row(partition, frame.offset, frame.timestamp, record)
        return json.dumps(row, separators=(",", ":"))
    when = _iso(frame.timestamp)
    if record is None:
        return f"p={partition} offset={frame.offset} {when} UNDECODABLE {problem}"
    key = f"{record.key.group_id}:{record.key.topic_id}:{record.key.partition}"
    kind = type(record).__name__
    head = f"p={partition} offset={frame.offset} {when} {kind} {key}"
    if kind == TOMBSTONE:
        return head
    row = record_row(partition, frame.offset, frame.timestamp, record)
    fields = [f for f in VALUE_FIELDS[kind] if f.type is not FieldType.STATE_BATCHES]
    tail = " ".join(f"{f.name}={row[f.name]}" for f in sorted(fields, key=FIELDS.index))
    batches = ", ".join(_batch_text(b) for b in row[STATE_BATCHES.name])
    return f"{head} {tail} {STATE_BATCHES.name}=[{batches}]"


def _batch_text(batch: dict[str, int]) -> str:
    state = state_name(batch["delivery_state"])
    return f"{batch['first_offset']}-{batch['last_offset']} {state} c{batch['delivery_count']}"


def _iso(ms: int) -> str:
    try:
        return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat(timespec="milliseconds")
    except (OverflowError, OSError, ValueError):
        return f"ts={ms}"


# --- log verify -------------------------------------------------------------------------


def log_verify(data_dir: str, out: TextIO = sys.stdout) -> int:
    """Check every frame's CRC and offsets, then replay every record of every partition
    through the state rules. Exit 1 if anything is damaged or does not replay; the
    summary line counts and names the damaged partitions. Exit 2 for a directory that
    is no data directory at all (no meta, no partitions, no journal): a wrong path, not
    damage."""
    if not os.path.isdir(data_dir):
        print(f"sharecoord log verify: {data_dir} is not a directory", file=sys.stderr)
        return EXIT_USAGE
    if not any(
        os.path.lexists(os.path.join(data_dir, name))
        for name in (META_FILE, PARTITIONS_DIR, JOURNAL_DIR)
    ):
        print(
            f"sharecoord log verify: {data_dir} is not a sharecoord data directory: it has "
            f"no {META_FILE}, no {PARTITIONS_DIR} and no {JOURNAL_DIR}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    report = verify(data_dir)
    for problem in report.problems:
        out.write(f"DAMAGED {problem}\n")
    damaged_partitions: list[int] = []
    records = 0
    elsewhere = 0
    for result in report.partitions:
        if result.absent is not None:  # another node's, by the data directory's records
            elsewhere += 1
            kept = "".join(f" ({note})" for note in result.notes)
            out.write(f"partition {result.partition}: {result.absent}{kept}\n")
            continue
        unreplayable = None
        if result.ok:
            unreplayable = replay_problem(partition_dir(data_dir, result.partition))
        notes = list(result.notes)
        if result.tail is not None:
            notes.append(f"incomplete tail: {result.tail}")
        suffix = f" ({'; '.join(notes)})" if notes else ""
        if not result.ok:
            damaged_partitions.append(result.partition)
            for damage in result.damage:
                out.write(f"partition {result.partition}: DAMAGED {damage}\n")
        elif unreplayable is not None:
            damaged_partitions.append(result.partition)
            out.write(f"partition {result.partition}: DOES NOT REPLAY {unreplayable}\n")
        else:
            span = (
                "empty"
                if result.first_offset is None
                else f"offsets {result.first_offset}..{result.last_offset}"
            )
            out.write(
                f"partition {result.partition}: ok, {result.segment_count} segments, "
                f"{result.record_count} records, {span}{suffix}\n"
            )
        records += result.record_count
    for note in report.notes:
        out.write(f"note: {note}\n")
    out.write(
        summary(
            report.problems,
            damaged_partitions,
            len(report.partitions),
            elsewhere,
            "the data directory itself",
        )
    )
    out.write(f", {records} records in {data_dir}\n")
    damaged = bool(report.problems or damaged_partitions)
    if damaged:
        # One line: what the daemon does, where to look, and where the repair is explained.
        which = str(damaged_partitions[0]) if len(damaged_partitions) == 1 else "P"
        out.write(
            "The daemon serves every partition that loads and answers 15 for damaged ones; "
            f"`sharecoord log dump --data-dir {data_dir} --partition {which}` prints the "
            "records before the damage; docs/operations.md#repairing-a-damaged-partition "
            "says how to repair it.\n"
        )
    return EXIT_FAILURE if damaged else EXIT_OK


def summary(
    problems: list[str], damaged: list[int], checked: int, elsewhere: int, whole: str
) -> str:
    """The verdict line up to its record count: `ok: 50 partitions`, or what is damaged
    and only that, `DAMAGED: partitions 3, 17 (2 of 50)`; ``whole`` names what the
    problems are about (the data directory, the store)."""
    if not problems and not damaged:
        held = f" ({elsewhere} of them held by other nodes)" if elsewhere else ""
        return f"ok: {checked} partitions{held}"
    held = f"; {elsewhere} held by other nodes" if elsewhere else ""
    itself = f"{whole} (above)"
    if not damaged:
        sound = f"{checked} partitions checked, none damaged" if checked else "no partition checked"
        return f"DAMAGED: {itself}; {sound}{held}"
    noun = "partition" if len(damaged) == 1 else "partitions"
    partitions = f"{noun} {describe(damaged)} ({len(damaged)} of {checked}{held})"
    return f"DAMAGED: {itself} and {partitions}" if problems else f"DAMAGED: {partitions}"


class ReplayCheck:
    """Replays records, in offset order, through the state rules, as a load would:
    ``problem`` says why the first that does not replay does not (None while all do).
    After a problem the rest is not replayed (their state would mean nothing)."""

    def __init__(self) -> None:
        self._state = ShareStateMap(DEFAULT_RECORDS_PER_SNAPSHOT)
        self._decoder = RecordDecoder()
        self.problem: str | None = None

    def add(self, frame: LogRecord) -> None:
        if self.problem is not None:
            return
        try:
            record = self._decoder.decode(frame.record_type, frame.key, frame.value)
            self._state.replay(frame.offset, record)
        except (LogError, RecordDecodeError, TypeError, ValueError) as exc:
            self.problem = f"at offset {frame.offset}: {exc}"


def replay_problem(directory: str) -> str | None:
    """Why the records of a partition directory do not replay, or None."""
    check = ReplayCheck()
    offset = None
    try:
        for frame in read_partition(directory):
            check.add(frame)
            offset = frame.offset
    except LogError as exc:
        where = f"at offset {offset}: " if offset is not None else ""
        return f"{where}{exc}"
    return check.problem


# --- state get --------------------------------------------------------------------------


def state_get(
    url: str,
    group: str,
    topic: str,
    partition: int,
    *,
    token_file: str | None = None,
    cacert: str | None = None,
    cert: str | None = None,
    key: str | None = None,
    timeout_s: float = 10.0,
    out: TextIO = sys.stdout,
) -> int:
    """``url`` is an http(s) base URL (``config.parse_url`` checked it)."""
    query = urllib.parse.urlencode({"group_id": group, "topic_id": topic, "partition": partition})
    request = urllib.request.Request(
        f"{url.rstrip('/')}/v1/admin/state?{query}", headers={"Accept": "application/json"}
    )
    context: ssl.SSLContext | None = None
    try:
        if token_file is not None:
            request.add_header("Authorization", f"Bearer {load_token(token_file).decode()}")
        if url.lower().startswith("https:"):
            context = client_ssl_context(cacert, cert, key)
    except SecurityError as exc:
        print(f"sharecoord state get: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        with urllib.request.urlopen(request, context=context, timeout=timeout_s) as response:
            raw = response.read()
    except urllib.error.HTTPError as exc:
        print(f"sharecoord state get: HTTP {exc.code}: {_error_text(exc)}", file=sys.stderr)
        return EXIT_FAILURE
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        print(f"sharecoord state get: {_unreachable(url, exc, timeout_s)}", file=sys.stderr)
        return EXIT_FAILURE
    try:
        body = json.loads(raw)
    except ValueError:
        print(f"sharecoord state get: {url} answered, but not with JSON", file=sys.stderr)
        return EXIT_FAILURE
    out.write(json.dumps(body, indent=2))
    out.write("\n")
    return EXIT_OK


def _unreachable(url: str, exc: Exception, timeout_s: float) -> str:
    """Why a request got no HTTP answer, in one line."""
    reason: object = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, TimeoutError):
        return f"no answer from {url} within {timeout_s:g} s (--timeout-s)"
    if isinstance(reason, ConnectionRefusedError):
        return f"cannot reach {url}: connection refused (is the daemon running, listening there?)"
    if isinstance(reason, socket.gaierror):
        return f"cannot reach {url}: its host name does not resolve ({reason.strerror})"
    if isinstance(reason, ssl.SSLError):
        return f"cannot reach {url}: TLS failed: {reason.reason or reason}"
    if isinstance(reason, http.client.HTTPException):
        return f"{url} did not answer in HTTP ({type(reason).__name__}); is that the right port?"
    text = reason.strerror if isinstance(reason, OSError) and reason.strerror else str(reason)
    return f"cannot reach {url}: {text}"


def _error_text(exc: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(exc.read())
        return f"[{body['error_code']}] {body['error_message']}"
    except (ValueError, KeyError, TypeError):
        return str(exc.reason)


def iter_records(data_dir: str, partition: int) -> Iterator[tuple[int, Record]]:
    """(offset, record) of one partition, decoded: for tests and tools."""
    decoder = RecordDecoder()
    for frame in read_partition(partition_dir(data_dir, partition)):
        yield frame.offset, decoder.decode(frame.record_type, frame.key, frame.value)
