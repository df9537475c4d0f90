"""bench/gc_pause.py loads the whole state and counts what the collector tracks: that
count must not grow with the number of share-partitions (the pause it times would).
Counted, never timed."""

from __future__ import annotations

from pathlib import Path

from bench import gc_pause
from bench.logs import build_log


def loaded(tmp_path: Path, share_partitions: int) -> dict[str, float]:
    built = build_log(
        tmp_path / f"data-{share_partitions}",
        share_partitions * 2,
        writes_per_key=2,
        progress=False,
    )
    assert built.keys == share_partitions
    return gc_pause.measure(str(built.data_dir), rounds=1)


def test_what_the_collector_tracks_does_not_grow_with_the_state(tmp_path: Path) -> None:
    small = loaded(tmp_path, 1_000)
    large = loaded(tmp_path, 11_000)
    assert (small["share_partitions"], large["share_partitions"]) == (1_000, 11_000)
    assert small["full_collection_ms"] > 0
    # One tracked object per share-partition would add 10,000.
    assert large["tracked_objects"] - small["tracked_objects"] < 1_000
