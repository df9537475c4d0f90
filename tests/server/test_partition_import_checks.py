"""`sharecoord partition import` checks everything before it writes anything
(server/partition_import.py, server/export_manifest.py): a manifest field that breaks
the format is one line naming it, exit 2; a target that holds the partition, a damaged
export or another copy of its history is one line, exit 1. Either way the data
directory imported into is byte for byte as it was (every path, mode, size and content
hash), and a data directory the import would have created does not exist.

The manifest rows: hand-written ones for each rule, then a fuzz of every field (and the
elements of each list) with values of every wrong type, then every key taken away. Each
row runs `main()` of the CLI in this process; the three the review found (partition 50,
-1, true) also run as real processes, as an operator would.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from persistence import StateLog
from persistence.ownership import Assignment
from protocol.records import ShareKey, ShareTombstone, encode_record
from server import export_manifest
from tests.harness import run_cli
from tests.server.exports import (
    FINGERPRINT,
    MOVED,
    NODE,
    TARGETS,
    Export,
    N,
    copied,
    make_export,
    make_target,
    run_import,
)
from tests.tree_listing import tree_listing


@pytest.fixture(autouse=True)
def no_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("SHARECOORD_")]:
        monkeypatch.delenv(name)


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> Export:
    made = make_export(tmp_path_factory.mktemp("import-source"))
    assert len(made.manifest["segments"]) >= 3 and len(made.manifest["history"]) == 2
    return made


@pytest.fixture(scope="module")
def templates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("import-targets")
    return {name: make_target(root / name, owners) for name, owners in TARGETS.items()}


@pytest.fixture
def target(templates: dict[str, str], tmp_path: Path) -> str:
    """Node 1's data directory, which held MOVED empty."""
    return copied(templates["held-empty"], tmp_path / "data")


@pytest.fixture(scope="module")
def untouched(tmp_path_factory: pytest.TempPathFactory, templates: dict[str, str]) -> str:
    """One copy of node 1's data directory for every manifest row: each row checks that
    it is still as it was, so a row that changed it fails itself."""
    return copied(templates["held-empty"], tmp_path_factory.mktemp("untouched") / "data")


# --- the manifest -----------------------------------------------------------------------

Mutation = Callable[[dict[str, Any]], bytes]
Path_ = tuple[str | int, ...]


def encoded(document: object) -> bytes:
    return json.dumps(document).encode()


def setting(path: Path_, value: object) -> Mutation:
    def mutate(document: dict[str, Any]) -> bytes:
        *parents, last = path
        holder: Any = document
        for step in parents:
            holder = holder[step]
        holder[last] = value
        return encoded(document)

    return mutate


def removing(path: Path_) -> Mutation:
    def mutate(document: dict[str, Any]) -> bytes:
        *parents, last = path
        holder: Any = document
        for step in parents:
            holder = holder[step]
        del holder[last]
        return encoded(document)

    return mutate


def raw(data: bytes) -> Mutation:
    return lambda document: data


def changing(change: Callable[[dict[str, Any]], None]) -> Mutation:
    def mutate(document: dict[str, Any]) -> bytes:
        change(document)
        return encoded(document)

    return mutate


def label(path: Path_) -> str:
    """How the error names a field: `partition`, `segments[1].size`, `history[0]`."""
    text = ""
    for step in path:
        text += f"[{step}]" if isinstance(step, int) else (f".{step}" if text else step)
    return text


SEGMENT = "00000000000000000000.log"

RULES: list[tuple[str, Mutation, str]] = [
    # the partition, as the review found it, and around it
    ("partition-50", setting(("partition",), 50), "partition is 50; expected an integer 0..49"),
    ("partition-minus-1", setting(("partition",), -1), "partition is -1; expected an integer 0.."),
    ("partition-true", setting(("partition",), True), "partition is true; expected an integer"),
    ("partition-huge", setting(("partition",), 10**30), "partition is 1000000000000000000000000"),
    (
        "partition-past-its-count",
        setting(("num_partitions",), 3),
        "partition is 3; expected an integer 0..2",
    ),
    (
        "num-partitions-0",
        setting(("num_partitions",), 0),
        "num_partitions is 0; expected an integer 1..10000",
    ),
    ("num-partitions-huge", setting(("num_partitions",), 10001), "num_partitions is 10001"),
    ("format-2", setting(("format",), 2), "format is 2; this version reads format 1"),
    ("format-true", setting(("format",), True), "format is true; this version reads format 1"),
    (
        "source-node-minus-2",
        setting(("source_node",), -2),
        "source_node is -2; expected an integer -1..",
    ),
    ("source-node-huge", setting(("source_node",), 2**31), "source_node is 2147483648"),
    ("exported-ms-negative", setting(("exported_ms",), -1), "exported_ms is -1"),
    (
        "start-negative",
        setting(("log_start_offset",), -1),
        "log_start_offset is -1; expected an integer 0..2^63-1",
    ),
    (
        "start-past-64-bits",
        setting(("log_start_offset",), 2**63),
        "log_start_offset is 9223372036854775808",
    ),
    (
        "end-before-start",
        setting(("log_end_offset",), -5),
        "log_end_offset is -5; expected an integer 0..2^63-1 (at least log_start_offset)",
    ),
    (
        "records-more-than-offsets",
        setting(("records",), 9),
        "records is 9; expected an integer 0..8 (at most",
    ),
    ("records-negative", setting(("records",), -1), "records is -1"),
    (
        "segments-empty",
        setting(("segments",), []),
        "segments is []; an export holds at least one segment",
    ),
    # segment names: only a segment file's, in order, between the offsets
    *(
        (f"segment-name-{i}", setting(("segments", 0, "name"), name), "segments[0].name is")
        for i, name in enumerate(
            [
                "../" + SEGMENT,
                "/etc/passwd",
                "0.log",
                SEGMENT + "/../../meta",
                "00000000000000000000.swap",
                SEGMENT + "\u0000",
                "²" * 20 + ".log",
                "٠" * 20 + ".log",
                "",
            ]
        )
    ),
    (
        "segment-first-base-not-start",
        changing(lambda d: d.update(log_start_offset=1, records=7)),
        f"segments[0].name is {SEGMENT!r}; the first segment's base offset is log_start_offset, 1",
    ),
    (
        "segments-twice",
        changing(lambda d: d["segments"].insert(1, d["segments"][0])),
        f"segments[1].name is {SEGMENT!r}; expected base offsets rising",
    ),
    ("segments-out-of-order", changing(lambda d: d["segments"].reverse()), "segments[0].name is"),
    (
        "segment-past-the-end",
        changing(lambda d: d.update(log_end_offset=1, records=1)),
        "segments[1].name is",
    ),
    (
        "segment-crc-33-bits",
        setting(("segments", 1, "crc32"), 2**32),
        "segments[1].crc32 is 4294967296; expected an integer 0..4294967295",
    ),
    ("segment-size-negative", setting(("segments", 2, "size"), -1), "segments[2].size is -1"),
    # history paths: only this partition's, below the root
    *(
        (f"history-path-{i}", setting(("history", 0, "path"), path), "history[0].path")
        for i, path in enumerate(
            [
                "../../meta",
                "/etc/passwd",
                "_exports/3/../../../meta",
                "state_partition=4/day=2026-11-20/x.parquet",
                "_exports/4/x.json",
                "state_partition=3//x.parquet",
                "state_partition=3/./x.parquet",
                "state_partition=3/x\u0000.parquet",
                "state_partition=3",
                "",
            ]
        )
    ),
    ("history-twice", changing(lambda d: d["history"].append(d["history"][0])), "history[2].path"),
    # the document as a whole
    (
        "extra-field",
        setting(("extra",), 1),
        'the manifest has "extra", which format 1 does not know',
    ),
    (
        "extra-segment-field",
        setting(("segments", 0, "path"), "x"),
        'segments[0] has "path", which format 1',
    ),
    (
        "extra-history-field",
        setting(("history", 1, "name"), "x"),
        'history[1] has "name", which format 1',
    ),
    ("a-list", raw(b"[]"), "the manifest is []; expected a JSON object"),
    ("a-string", raw(b'"EXPORT"'), 'the manifest is "EXPORT"; expected a JSON object'),
    ("not-json", raw(b"{"), "not JSON"),
    ("empty", raw(b""), "not JSON"),
    ("not-utf-8", raw(b'{"format": "\xc3\x28"}'), "not JSON"),
    ("nested-deep", raw(b"[" * 100_000 + b"]" * 100_000), "nested too deeply"),
    (
        "nested-deep-in-a-field",
        raw(b'{"format": 1, "partition": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
        "nested too deeply",
    ),
]

# The fuzz: every field, and every element of a list, given a value of each wrong type.
WRONG_VALUES: list[object] = [
    True,
    None,
    "3",
    1.5,
    [3],
    {"x": 3},
    -1,
    2**64,
]  # bool: an int in Python
VALID = {("source_node", "null"), ("source_node", "-1"), ("assignment", '"3"')}
FIELDS: list[Path_] = [
    ("format",),
    ("partition",),
    ("num_partitions",),
    ("source_node",),
    ("assignment",),
    ("exported_ms",),
    ("log_start_offset",),
    ("log_end_offset",),
    ("records",),
    ("segments",),
    ("history",),
    ("segments", 0),
    ("segments", 0, "name"),
    ("segments", 0, "size"),
    ("segments", 0, "crc32"),
    ("segments", 2),
    ("segments", 2, "name"),
    ("segments", 2, "size"),
    ("segments", 2, "crc32"),
    ("history", 1),
    ("history", 1, "path"),
    ("history", 1, "size"),
    ("history", 1, "crc32"),
]


def refusal(path: Path_, value: object) -> str:
    """What the one line says of `value` at `path`."""
    name = label(path)
    if isinstance(path[-1], int) and isinstance(value, dict):  # an element, without its keys
        return f"{name} has no {'name' if path[0] == 'segments' else 'path'!r}"
    if len(path) == 1 and path[0] in ("segments", "history") and isinstance(value, list):
        return f"{name}[0] is 3; expected a JSON object"
    return f"{name} is {json.dumps(value)}"


def fuzz() -> Iterator[tuple[str, Mutation, str]]:
    for path in FIELDS:
        for value in WRONG_VALUES:
            if (label(path), json.dumps(value)) not in VALID:
                yield (
                    f"{label(path)}={json.dumps(value)}",
                    setting(path, value),
                    refusal(path, value),
                )
        *parents, key = path
        if isinstance(key, str) and path != ("history",):  # history is optional
            where = label(tuple(parents)) if parents else "the manifest"
            yield f"without-{label(path)}", removing(path), f"{where} has no {key!r}"


ROWS = [pytest.param(m, fragment, id=name) for name, m, fragment in [*RULES, *fuzz()]]


def write_manifest(export: Export, into: Path, mutation: Mutation) -> Path:
    """The export with its manifest changed (its segments and history linked, not
    copied: nothing reads past a refused manifest)."""
    copy = into / "export"
    shutil.copytree(export.path, copy, copy_function=os.link)
    (copy / "EXPORT").unlink()
    (copy / "EXPORT").write_bytes(mutation(export.manifest))
    return copy


@pytest.mark.parametrize(("mutation", "fragment"), ROWS)
def test_a_bad_manifest_field_is_one_line_exit_2_and_changes_nothing(
    export: Export,
    untouched: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    mutation: Mutation,
    fragment: str,
) -> None:
    source = write_manifest(export, tmp_path, mutation)
    before = tree_listing(untouched)
    code, errors, out = run_import(capsys, untouched, source)
    assert (code, out) == (2, ""), errors
    (line,) = errors
    prefix = f"sharecoord partition import: {source / 'EXPORT'} is not a valid export manifest: "
    assert line.startswith(prefix), line
    assert fragment in line, line
    assert tree_listing(untouched) == before


def test_a_manifest_past_the_size_limit_is_refused_unread(
    export: Export,
    target: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    source = write_manifest(export, tmp_path, encoded)
    monkeypatch.setattr(export_manifest, "MAX_MANIFEST_BYTES", 100)
    before = tree_listing(target)
    code, errors, _ = run_import(capsys, target, source)
    assert code == 2
    assert "more than 100 bytes" in errors[0]
    assert tree_listing(target) == before


@pytest.mark.parametrize("value", [50, -1, True], ids=["50", "minus-1", "true"])
@pytest.mark.parametrize("where", ["existing", "new"])
def test_the_partitions_the_review_found_in_a_real_process(
    export: Export, templates: dict[str, str], tmp_path: Path, value: object, where: str
) -> None:
    """Into node 1's data directory, or into one the import would create: one line, no
    traceback, exit 2, and nothing written (no partitions/50, -1 or True, no CHECKPOINT
    or ASSIGNMENT change, no new directory)."""
    source = write_manifest(export, tmp_path, setting(("partition",), value))
    if where == "existing":
        target = copied(templates["held-empty"], tmp_path / "data")
        extra: tuple[str, ...] = ()
    else:
        target, extra = str(tmp_path / "new"), ("--node-id", str(NODE))
    before = tree_listing(target)
    done = run_cli("partition", "import", "--data-dir", target, "--from", str(source), *extra)
    assert "Traceback" not in done.stderr + done.stdout
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert f"partition is {json.dumps(value)}; expected an integer 0..{N - 1}" in line
    assert tree_listing(target) == before


# --- the target and the export's bytes ---------------------------------------------------


def flip_a_segment_byte(export: Path) -> None:
    path = export / json.loads((export / "EXPORT").read_text())["segments"][1]["name"]
    data = bytearray(path.read_bytes())
    data[40] ^= 0xFF
    path.write_bytes(bytes(data))


def another_history_copy(target: str, export: Export) -> None:
    path = Path(target, "history", sorted(export.history)[0])
    path.parent.mkdir(parents=True)
    path.write_bytes(b"another copy")


def records_in_the_target(target: str, export: Export) -> None:
    owners = (NODE,) * N
    log = StateLog.open(target, N, assignment=Assignment(NODE, FINGERPRINT, owners))
    try:
        part = log.partition(MOVED)
        part.open()
        part.append(*encode_record(ShareTombstone(ShareKey("group", "A" * 22, 0))), 1)
        part.commit()
    finally:
        log.close()


REFUSALS = [
    pytest.param(
        lambda source, target, export: setting(("num_partitions",), 60)(export.manifest),
        "has 50 state partitions, the export comes from a data directory with 60",
        id="another-partition-count",
    ),
    pytest.param(
        lambda source, target, export: flip_a_segment_byte(source),
        "is damaged",
        id="damaged-segment",
    ),
    pytest.param(
        lambda source, target, export: another_history_copy(target, export),
        "already exists with other contents than the export's",
        id="another-history-copy",
    ),
    pytest.param(
        lambda source, target, export: records_in_the_target(target, export),
        f"already holds records of state partition {MOVED}",
        id="target-holds-records",
    ),
]


@pytest.mark.parametrize(("prepare", "fragment"), REFUSALS)
def test_a_refused_import_is_one_line_exit_1_and_changes_nothing(
    export: Export,
    target: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    prepare: Callable[[Path, str, Export], bytes | None],
    fragment: str,
) -> None:
    source = tmp_path / "export"
    shutil.copytree(export.path, source)
    manifest = prepare(source, target, export)
    if manifest is not None:
        (source / "EXPORT").write_bytes(manifest)
    before = tree_listing(target)
    code, errors, out = run_import(capsys, target, source)
    assert (code, out) == (1, ""), errors
    (line,) = errors
    assert fragment in line, line
    assert tree_listing(target) == before


def test_a_damaged_export_creates_no_data_directory(
    export: Export, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "export"
    shutil.copytree(export.path, source)
    flip_a_segment_byte(source)
    target = str(tmp_path / "new")
    code, errors, _ = run_import(capsys, target, source, "--node-id", str(NODE))
    assert code == 1 and "is damaged" in errors[0]
    assert not os.path.lexists(target)
