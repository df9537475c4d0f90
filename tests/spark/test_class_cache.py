"""The driver JVM's class-data archive (spark_jobs/classcache.py): written once by a
successful job, mapped by the next, never mapped when cut short or damaged."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spark_jobs import classcache, submit
from spark_jobs.classcache import OFF, class_cache
from tests.spark.conftest import REPO_ROOT
from tests.spark.test_audit import ANOMALOUS_LOG, build

JOB_TIMEOUT_S = 300
DAY_S = 86400


@pytest.fixture
def spark_home(tmp_path: Path) -> Path:
    """A Spark home of two jars: what the key reads."""
    jars = tmp_path / "spark" / "jars"
    jars.mkdir(parents=True)
    for name in ("spark-core.jar", "scala-library.jar"):
        (jars / name).write_bytes(name.encode())
    return jars.parent


@pytest.fixture
def java(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """$JAVA_HOME/bin/java, the java spark-class runs: a file to key on."""
    binary = tmp_path / "jdk" / "bin" / "java"
    binary.parent.mkdir(parents=True)
    binary.write_bytes(b"java 17")
    monkeypatch.setenv("JAVA_HOME", str(binary.parent.parent))
    return binary


def jvm_writes(partial: str, size: int) -> None:
    """What the JVM does at exit under -XX:ArchiveClassesAtExit: replaces the file."""
    os.unlink(partial)
    Path(partial).write_bytes(b"\xcd" * size)


def option(options: tuple[str, ...], name: str) -> str:
    (found,) = [o.split("=", 1)[1] for o in options if o.startswith(f"-XX:{name}=")]
    return found


def test_a_cold_cache_writes_at_exit_and_the_next_run_maps_what_was_kept(
    tmp_path: Path, spark_home: Path, java: Path
) -> None:
    cache = str(tmp_path / "cache")
    first = class_cache(cache, "compact", str(spark_home))
    assert first.partial is not None and first.archive is not None
    assert option(first.options, "ArchiveClassesAtExit") == first.partial
    assert os.path.dirname(first.partial) == cache  # renamed, never copied, across disks
    assert set(classcache.QUIET) <= set(first.options)
    jvm_writes(first.partial, 4096)
    assert first.finish(0)
    kept = classcache.sized_name(first.archive, 4096)
    assert os.listdir(cache) == [os.path.basename(kept)]

    second = class_cache(cache, "compact", str(spark_home))
    assert second.partial is None and second.archive == kept
    assert option(second.options, "SharedArchiveFile") == kept
    assert "-XX:+VerifySharedSpaces" in second.options
    assert not second.finish(0)  # nothing written: nothing to keep
    assert os.listdir(cache) == [os.path.basename(kept)]
    # Another job keeps its own archive.
    assert class_cache(cache, "audit", str(spark_home)).partial is not None


def test_a_failed_job_keeps_nothing(tmp_path: Path, spark_home: Path, java: Path) -> None:
    cache = str(tmp_path / "cache")
    run = class_cache(cache, "compact", str(spark_home))
    assert run.partial is not None
    jvm_writes(run.partial, 4096)
    assert not run.finish(1)
    assert os.listdir(cache) == []
    # A JVM that wrote nothing (it could not, or was killed before its exit) neither.
    run = class_cache(cache, "compact", str(spark_home))
    assert run.partial is not None
    assert not run.finish(0)
    assert os.listdir(cache) == []


def test_an_archive_cut_short_is_never_mapped(tmp_path: Path, spark_home: Path, java: Path) -> None:
    cache = str(tmp_path / "cache")
    run = class_cache(cache, "compact", str(spark_home))
    assert run.partial is not None
    jvm_writes(run.partial, 4096)
    assert run.finish(0)
    (kept,) = os.listdir(cache)
    os.truncate(os.path.join(cache, kept), 4095)
    again = class_cache(cache, "compact", str(spark_home))
    assert not any(o.startswith("-XX:SharedArchiveFile") for o in again.options)
    assert again.partial is not None  # a new one is written instead


def test_the_key_follows_the_java_and_each_jar(
    tmp_path: Path, spark_home: Path, java: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def key() -> str:
        java_path = classcache.driver_java()
        assert java_path == str(java)
        return classcache.cache_key("compact", java_path, str(spark_home))

    before = key()
    assert key() == before
    assert classcache.cache_key("audit", str(java), str(spark_home)) != before
    jar = spark_home / "jars" / "spark-core.jar"
    os.utime(jar, ns=(0, jar.stat().st_mtime_ns + 1))
    after_jar = key()
    assert after_jar != before
    java.write_bytes(b"java 17.0.16")
    assert key() != after_jar
    (spark_home / "jars" / "new.jar").write_bytes(b"x")
    assert key() not in (before, after_jar)


def test_off_no_java_or_no_cache_directory_add_no_option(
    tmp_path: Path, spark_home: Path, java: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert class_cache(OFF, "compact", str(spark_home)).options == ()
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert class_cache(str(blocker / "cache"), "compact", str(spark_home)).options == ()
    java.unlink()
    assert class_cache(str(tmp_path / "cache"), "compact", str(spark_home)).options == ()


def test_a_new_archive_prunes_the_stale_and_the_abandoned(
    tmp_path: Path, spark_home: Path, java: Path
) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    old = time.time() - 15 * DAY_S
    entries = {
        "stale": cache / "driver-compact-0000-5.jsa",  # an old Spark's, unused for two weeks
        "recent": cache / "driver-compact-1111-5.jsa",  # another Spark's, in use
        "abandoned": cache / ".writing-killed.jsa",  # a killed run's
        "theirs": cache / "notes.txt",
    }
    for path in entries.values():
        path.write_bytes(b"12345")
    for name in ("stale", "abandoned", "theirs"):
        os.utime(entries[name], (old, old))
    run = class_cache(str(cache), "compact", str(spark_home))
    assert run.partial is not None and run.archive is not None
    jvm_writes(run.partial, 64)
    assert run.finish(0)
    assert sorted(os.listdir(cache)) == sorted(
        [os.path.basename(classcache.sized_name(run.archive, 64))]
        + [entries[name].name for name in ("recent", "theirs")]
    )


def test_options_reach_spark_s_launcher_whole() -> None:
    line = submit.java_option_string(["-Da=/x y/z", "-XX:F=/q\"r'\\s"])
    assert line == "-Da=/x\\ y/z -XX:F=/q\\\"r\\'\\\\s"


def run_compact(data_dir: str, cache: Path, **env: str) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable, "-m", "server.commands.cli", "compact", "--data-dir", data_dir,
        "--master", "local[1]", "--history-retention-ms", "-1",
        "--spark-class-cache", str(cache),
    ]  # fmt: skip
    return subprocess.run(
        command,
        cwd=REPO_ROOT,
        env=dict(os.environ, PYTHONPATH=str(REPO_ROOT), **env),
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT_S,
        check=False,
    )


def compacted(done: subprocess.CompletedProcess[str]) -> bool:
    last = done.stdout.splitlines()[-1] if done.stdout else ""
    return done.returncode == 0 and last.startswith("compaction: 2 of 2 partitions compacted")


@pytest.mark.spark  # spark-submit, in subprocesses
def test_the_next_job_maps_the_classes_the_first_kept_and_ignores_a_damaged_archive(
    tmp_path: Path,
) -> None:
    cache = tmp_path / "class cache"  # a space: the option must reach the JVM whole
    data_dirs = []
    for run in range(3):
        data_dir = str(tmp_path / f"data-{run}")
        build(data_dir, ANOMALOUS_LOG * 3, segment_bytes=300)
        data_dirs.append(data_dir)

    first = run_compact(data_dirs[0], cache)
    assert compacted(first), first.stdout + first.stderr
    assert f"sharecoord compact: {classcache.WRITING_NOTICE} {cache}" in first.stdout
    assert "[cds" not in first.stdout + first.stderr  # the JVM's archive lines are off
    (kept,) = os.listdir(cache)
    size = os.path.getsize(cache / kept)
    assert kept.endswith(f"-{size}.jsa") and size > 1 << 20

    # -Xshare:on: a JVM that cannot map the archive refuses to start.
    second = run_compact(data_dirs[1], cache, SPARK_SUBMIT_OPTS="-Xshare:on")
    assert compacted(second), second.stdout + second.stderr
    assert "the driver JVM keeps" not in second.stdout

    # Bytes changed in place, the size kept: the JVM's CRC check refuses it, the job runs.
    archive = cache / kept
    archive.chmod(0o644)
    with open(archive, "r+b") as f:
        for offset in range(size // 3, size, size // 7):
            f.seek(offset)
            f.write(os.urandom(64))
    third = run_compact(data_dirs[2], cache)
    assert compacted(third), third.stdout + third.stderr
