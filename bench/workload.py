"""The share-partitions the benchmark writes to, and the request bodies wrk replays.

10,000 share-partitions (100 groups x 100 partitions of one topic), initialized over
HTTP before any run. Each write acknowledges or releases a batch of ten records inside
a 200-offset window above the start offset, and one in ten moves the start offset: the
stored state of a share-partition stays a few batches long, as a leader's in-flight
window does.
"""

from __future__ import annotations

import json
import random
import struct
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack

TOPIC_ID = "WwwvDo06T2ueIXxNGis8TQ"
GROUPS = 100
PARTITIONS_PER_GROUP = 100
WINDOW = 200

Body = dict[str, Any]


def group_name(g: int) -> str:
    return f"bench-group-{g}"


def initialize_all(base_url: str, token: str | None = None) -> None:
    """Initialize every share-partition (start offset 0, epochs 0), one request per group."""
    for g in range(GROUPS):
        body = {
            "group_id": group_name(g),
            "topics": [
                {
                    "topic_id": TOPIC_ID,
                    "partitions": [
                        {"partition": p, "state_epoch": 0, "start_offset": 0}
                        for p in range(PARTITIONS_PER_GROUP)
                    ],
                }
            ],
        }
        answer = post(base_url, "/v1/share-group-state/initialize", body, token)
        codes = {p["error_code"] for t in answer["results"] for p in t["partitions"]}
        if codes != {0}:
            raise RuntimeError(f"initialize failed with codes {codes}")


def post(base_url: str, path: str, body: Body, token: str | None = None) -> Any:
    request = urllib.request.Request(
        base_url + path,
        data=msgpack.packb(body),
        headers={"Content-Type": "application/msgpack"},
    )
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=60) as response:
        return msgpack.unpackb(response.read())


def _write_entry(rng: random.Random, partition: int) -> dict[str, Any]:
    first = rng.randrange(WINDOW)
    return {
        "partition": partition,
        "state_epoch": 0,
        "leader_epoch": 0,
        "start_offset": rng.randrange(WINDOW // 2) if rng.random() < 0.1 else -1,
        "state_batches": [
            {
                "first_offset": first,
                "last_offset": first + 9,
                "delivery_state": rng.choice((0, 2, 2, 2, 4)),
                "delivery_count": rng.randint(1, 3),
            }
        ],
    }


def write_bodies(rng: random.Random, count: int, per_request: int) -> list[Body]:
    """Write requests of `per_request` distinct share-partitions of one group each."""
    bodies = []
    for _ in range(count):
        partitions = rng.sample(range(PARTITIONS_PER_GROUP), per_request)
        bodies.append(
            {
                "group_id": group_name(rng.randrange(GROUPS)),
                "topics": [
                    {"topic_id": TOPIC_ID, "partitions": [_write_entry(rng, p) for p in partitions]}
                ],
            }
        )
    return bodies


def read_bodies(
    rng: random.Random, count: int, rpc_entry: Callable[[int], dict[str, Any]]
) -> list[Body]:
    return [
        {
            "group_id": group_name(rng.randrange(GROUPS)),
            "topics": [
                {
                    "topic_id": TOPIC_ID,
                    "partitions": [rpc_entry(rng.randrange(PARTITIONS_PER_GROUP))],
                }
            ],
        }
        for _ in range(count)
    ]


def save_bodies(bodies: list[Body], path: Path, *, as_json: bool = False) -> Path:
    """Length-prefixed bodies, the format bench/wrk/bodies.lua reads."""
    return write_frames(
        [json.dumps(body).encode() if as_json else msgpack.packb(body) for body in bodies], path
    )


def load_bodies(path: Path) -> list[Body]:
    """The msgpack bodies of a file `save_bodies` wrote: what wrk sends, decoded."""
    return [msgpack.unpackb(frame) for frame in read_frames(path)]


def write_frames(frames: list[bytes], path: Path) -> Path:
    """Each frame preceded by its length (4 bytes, big-endian)."""
    with open(path, "wb") as f:
        for frame in frames:
            f.write(struct.pack(">I", len(frame)))
            f.write(frame)
    return path


def read_frames(path: Path) -> list[bytes]:
    data = path.read_bytes()
    frames, at = [], 0
    while at < len(data):
        (size,) = struct.unpack_from(">I", data, at)
        frames.append(data[at + 4 : at + 4 + size])
        at += 4 + size
    return frames


def build_body_files(directory: Path, seed: int = 932) -> dict[str, Path]:
    """Every body file the HTTP scenarios use."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    return {
        "write": save_bodies(write_bodies(rng, 20_000, 1), directory / "write-1.bin"),
        "write_json": save_bodies(
            write_bodies(rng, 20_000, 1), directory / "write-1.json.bin", as_json=True
        ),
        "write_batch": save_bodies(write_bodies(rng, 4_000, 50), directory / "write-50.bin"),
        "read": save_bodies(
            read_bodies(rng, 20_000, lambda p: {"partition": p, "leader_epoch": 0}),
            directory / "read-1.bin",
        ),
        "read_summary": save_bodies(
            read_bodies(rng, 20_000, lambda p: {"partition": p, "leader_epoch": -1}),
            directory / "read-summary-1.bin",
        ),
    }
