"""``sharecoord partition export | import | adopt``: moving a state partition between
nodes (docs/operations.md#moving-a-state-partition), the daemons stopped
(``server.partition_tools``, ``server.partition_import``)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from server.commands import preflight
from server.commands.common import add_command, needs_a_command, postgres_store, refuse, say
from server.config import (
    PARTITION_ADOPT_SETTINGS,
    PARTITION_EXPORT_SETTINGS,
    PARTITION_IMPORT_SETTINGS,
    load_settings,
)


def add_commands(subparsers: Any) -> None:
    """`partition export | import | adopt`: moving a state partition between nodes
    (docs/operations.md#moving-a-state-partition). Each takes DATA/LOCK: its node's
    daemon must be stopped."""
    partition = subparsers.add_parser(
        "partition", help="move a state partition between nodes (the daemon stopped)"
    )
    commands = partition.add_subparsers(title="partition commands", metavar="COMMAND")
    add_command(
        commands,
        "export",
        run_export,
        PARTITION_EXPORT_SETTINGS,
        help="copy a state partition out, verified, and stop serving it here",
    )
    add_command(
        commands,
        "import",
        run_import,
        PARTITION_IMPORT_SETTINGS,
        help="check an export and make it this node's state partition",
    )
    add_command(
        commands,
        "adopt",
        run_adopt,
        PARTITION_ADOPT_SETTINGS,
        help="serve partitions this data directory would refuse, as they are here",
    )
    partition.set_defaults(
        command=needs_a_command(partition, ["export", "import", "adopt"]), prog=partition.prog
    )


def run_export(args: argparse.Namespace) -> int:
    from server.partition_tools import ToolError, export_partition

    values = load_settings(PARTITION_EXPORT_SETTINGS, args, required=("partition", "out"))
    if postgres_store(values, args) is not None:
        return _export_from_postgres(args.prog, values)
    data_dir, partition = values["data_dir"], values["partition"]
    try:
        manifest = export_partition(data_dir, partition, values["out"])
    except ToolError as exc:
        say(args.prog, str(exc))
        return exc.code
    size = sum(segment.size for segment in manifest.segments)
    print(
        f"exported state partition {partition} of {data_dir} to {os.path.abspath(values['out'])}"
        f": {manifest.records} records, offsets {manifest.log_start_offset}.."
        f"{manifest.log_end_offset - 1}, {len(manifest.segments)} segments, {size} bytes"
    )
    if manifest.history:
        print(f"with its history: {len(manifest.history)} files")
    print(f"{data_dir} no longer serves state partition {partition} (its OWNER says exported)")
    print(
        "next: with the new owner stopped, `sharecoord partition import --data-dir ITS_DATA "
        "--from DIR` there; then start it"
    )
    return 0


def run_import(args: argparse.Namespace) -> int:
    from server.partition_import import import_partition
    from server.partition_tools import ToolError

    values = load_settings(PARTITION_IMPORT_SETTINGS, args, required=("source",))
    if postgres_store(values, args) is not None:
        return _import_into_postgres(args.prog, values)
    data_dir = values["data_dir"]
    refuse(preflight.data_directory_problem(data_dir, created_if_missing=True))
    try:
        done = import_partition(data_dir, values["source"], values["node_id"])
    except ToolError as exc:
        say(args.prog, str(exc))
        return exc.code
    manifest = done.manifest
    if done.already:
        print(
            f"state partition {manifest.partition} of {data_dir} already holds this export "
            "(an import of it finished before): nothing to do"
        )
        return 0
    print(
        f"imported state partition {manifest.partition} into {data_dir} for node {done.node}: "
        f"{manifest.records} records, offsets {manifest.log_start_offset}.."
        f"{manifest.log_end_offset - 1} (checked against the export's manifest)"
    )
    if done.history_root is not None:
        kept = "" if done.history_declared else " (the first compaction here takes it up)"
        print(f"its history: {len(manifest.history)} files, in {done.history_root}{kept}")
    return 0


def _export_from_postgres(prog: str, values: dict[str, Any]) -> int:
    from server.partition_tools import ToolError
    from server.postgres_partitions import export_from_postgres, manifest_line

    partition, out = values["partition"], os.path.abspath(values["out"])
    try:
        done = export_from_postgres(
            values["state_store"], values["state_store_schema"], partition, out
        )
    except ToolError as exc:
        say(prog, str(exc))
        return exc.code
    print(
        f"exported state partition {partition} of {done.where} to {out}: "
        f"{manifest_line(done.manifest)}"
    )
    print(
        "read from one snapshot: the store still serves the partition, and what its nodes "
        "commit from now on is not in this export"
    )
    print(
        "next: `sharecoord partition import --data-dir ITS_DATA --from DIR` on a node that "
        "is stopped (or --state-store for another store); then start it"
    )
    return 0


def _import_into_postgres(prog: str, values: dict[str, Any]) -> int:
    from server.partition_tools import ToolError
    from server.postgres_partitions import import_into_postgres, manifest_line, with_history_note

    source = values["source"]
    try:
        done = import_into_postgres(values["state_store"], values["state_store_schema"], source)
    except ToolError as exc:
        say(prog, str(exc))
        return exc.code
    partition = done.manifest.partition
    if done.already:
        print(
            f"state partition {partition} of {done.where} already holds this export (an "
            "import of it finished before): nothing to do"
        )
        return 0
    created = " (its tables created now)" if done.created else ""
    print(
        f"imported state partition {partition} into {done.where}{created}: "
        f"{manifest_line(done.manifest)} (checked against the export's manifest); its epoch "
        f"is now {done.epoch}, and the node that claims it next loads them"
    )
    note = with_history_note(done.manifest, source)
    if note is not None:
        print(note)
    return 0


def run_adopt(args: argparse.Namespace) -> int:
    from server.partition_tools import ToolError, adopt_partitions

    values = load_settings(PARTITION_ADOPT_SETTINGS, args, required=("partition",))
    try:
        lines = adopt_partitions(values["data_dir"], list(values["partition"]), values["node_id"])
    except ToolError as exc:
        say(args.prog, str(exc))
        return exc.code
    for line in lines:
        print(line)
    return 0
