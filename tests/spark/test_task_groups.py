"""How the jobs spread state partitions over Spark tasks (spark_jobs/session.py
``balanced_groups``, weighed by spark_jobs/compact.py ``sealed_bytes``), without Spark:
every partition once, groups of about equal work, the heaviest first, so that cores
taking the tasks in order finish together."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from persistence import partition_dir
from persistence.segments import SWAP_SUFFIX, base_name, segment_name
from spark_jobs.compact import sealed_bytes
from spark_jobs.session import balanced_groups


def cores_finish(groups: list[list[int]], sizes: list[int], cores: int) -> list[int]:
    """When each core ends the stage if tasks start in order on whichever core is free
    first (as a local master runs them)."""
    ends = [0] * cores
    for group in groups:
        core = ends.index(min(ends))
        ends[core] += sum(sizes[u] for u in group)
    return ends


def test_fifty_equal_partitions_in_eight_tasks_keep_two_cores_equally_busy():
    sizes = [1_000] * 50
    groups = balanced_groups(sizes, 8)
    assert [len(g) for g in groups] == [7, 7, 6, 6, 6, 6, 6, 6]
    # Sliced in order (6, 6, 6, 7, 6, 6, 6, 7) both groups of 7 fell to one core.
    assert cores_finish(groups, sizes, 2) == [25_000, 25_000]


def test_one_large_partition_gets_a_task_of_its_own():
    assert balanced_groups([50, 1, 1, 1, 1, 1], 2) == [[0], [1, 2, 3, 4, 5]]


def test_fewer_partitions_than_tasks_and_empty_partitions():
    assert balanced_groups([3], 8) == [[0]]
    # Partitions with nothing sealed weigh nothing: spread by count all the same.
    assert sorted(map(len, balanced_groups([0, 0, 0, 0], 2))) == [2, 2]


@settings(max_examples=300, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 10_000), min_size=1, max_size=80),
    tasks=st.integers(1, 20),
)
def test_every_partition_once_heaviest_group_first_within_one_partition_of_even(sizes, tasks):
    groups = balanced_groups(sizes, tasks)
    assert sorted(u for g in groups for u in g) == list(range(len(sizes)))
    assert 1 <= len(groups) <= tasks
    totals = [sum(sizes[u] for u in g) for g in groups]
    assert totals == sorted(totals, reverse=True)
    if len(groups) == tasks:
        # Each unit went to the lightest group: no group outweighs another by more
        # than the largest unit.
        assert totals[0] - totals[-1] <= max(sizes)


def test_a_partitions_weight_is_its_sealed_bytes_and_zero_when_it_cannot_be_listed(tmp_path):
    good = Path(partition_dir(str(tmp_path), 0))
    good.mkdir(parents=True)
    (good / segment_name(0)).write_bytes(b"x" * 100)
    (good / segment_name(10)).write_bytes(b"x" * 7)
    (good / segment_name(20)).write_bytes(b"x" * 50)  # the newest: not sealed
    assert sealed_bytes(str(tmp_path), 0) == 107
    # A swap file whose manifest is missing: listing fails; the task says why, not this.
    bad = Path(partition_dir(str(tmp_path), 1))
    bad.mkdir(parents=True)
    (bad / (base_name(0) + SWAP_SUFFIX)).write_bytes(b"")
    assert sealed_bytes(str(tmp_path), 1) == 0
    assert sealed_bytes(str(tmp_path), 2) == 0  # no directory at all
