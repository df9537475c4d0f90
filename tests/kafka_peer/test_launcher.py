"""`make kafka-peer` (python -m kafka_peer fetch) when what it needs is not there: one
line on stderr and exit status 1, never a traceback and never a silent success."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.harness import REPO_ROOT


def fetch(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kafka_peer", "fetch"],
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **env},
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr
    return lines[0]


def test_without_java_it_says_so_in_one_line(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"  # a PATH with Maven but no java
    bin_dir.mkdir()
    mvn = shutil.which("mvn")
    if mvn:
        (bin_dir / "mvn").symlink_to(mvn)
    line = one_line(fetch({"PATH": str(bin_dir), "KAFKA_PEER_CACHE": str(tmp_path / "cache")}))
    assert line.startswith("kafka peer: no `java` on PATH"), line
    assert not (tmp_path / "cache").exists()


def test_an_unreachable_repository_is_one_line(tmp_path: Path) -> None:
    """Real Maven, an empty local repository and every download sent to a port where
    nothing listens: the fetch fails with Maven's reason in one line."""
    (tmp_path / ".m2").mkdir()
    (tmp_path / ".m2" / "settings.xml").write_text(
        "<settings><mirrors><mirror><id>nowhere</id><mirrorOf>*</mirrorOf>"
        "<url>http://127.0.0.1:9/maven2</url></mirror></mirrors></settings>"
    )
    env = {
        "KAFKA_PEER_CACHE": str(tmp_path / "cache"),
        "MAVEN_OPTS": f"-Duser.home={tmp_path} -Dmaven.repo.local={tmp_path / 'repository'}",
    }
    line = one_line(fetch(env))
    assert line.startswith("kafka peer: Maven could not fetch Kafka 4.4.0's jars: "), line
    assert "127.0.0.1:9" in line or "Connect" in line or "transfer" in line, line
    assert not (tmp_path / "cache" / "kafka-4.4.0").exists()


def test_a_fetched_cache_is_reused_without_maven(tmp_path: Path) -> None:
    """Once the jars are in the cache, fetching again needs no Maven at all."""
    done = fetch({})
    assert done.returncode == 0, done.stderr
    java = shutil.which("java")
    assert java is not None
    bin_dir = tmp_path / "bin"  # java, but no mvn
    bin_dir.mkdir()
    (bin_dir / "java").symlink_to(java)
    again = fetch({"PATH": str(bin_dir)})
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == done.stdout.strip()
