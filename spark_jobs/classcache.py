"""The driver JVM's class-data archive: the classes one job's driver loaded, mapped by the next.

Every `sharecoord compact` or `audit` starts a driver JVM (spark-submit), which loads,
parses and verifies some ten thousand of Spark's classes before the job's first line
runs. Since JDK 13 a JVM can write the classes it loaded to an archive as it exits
(``-XX:ArchiveClassesAtExit``, a dynamic AppCDS archive) and a later JVM of the same
JDK and class path maps that archive instead (``-XX:SharedArchiveFile``): ~1.3 s less
per job on the bench machine, the first run paying the archive's writing once (~100
MB, several seconds after the job's own summary line). ``-Xshare`` stays at its default
(auto): a JVM that cannot use an archive (another JDK, another class path, options
that change the heap's layout) runs without it, as it would have anyway.

The archives are kept in a cache directory (the ``spark_class_cache`` setting;
``default_cache_dir`` when unset; ``off`` keeps none), one per job and key: the java
that spark-class runs and the jars of the Spark it runs, by name, size and mtime, so an
upgrade of either writes a new one. Its size is part of its name: a file cut short (a
full disk, a damaged copy) is never mapped (the JVM faults on a truncated archive
instead of refusing it), and the JVM checks an archive's contents against their CRC
before using them (``-XX:+VerifySharedSpaces``, a few milliseconds). A JVM writes its
archive under a partial name that the CLI renames after the job succeeded; a killed
run's partial file and archives unused for two weeks go when a new archive arrives.

This module runs in the CLI's process; it imports no pyspark.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass

from spark_jobs.shipenv import cache_root, prune_cache

# The setting's value that keeps no archive.
OFF = "off"
# How the line a run that writes an archive prints begins, after "sharecoord JOB: ".
WRITING_NOTICE = "the driver JVM keeps the classes it loads in"
ARCHIVE_PREFIX = "driver-"
ARCHIVE_SUFFIX = ".jsa"
PARTIAL_PREFIX = ".writing-"
# Part of the key: a change to how archives are made makes every old one stale.
LAYOUT_VERSION = 1
# The JVM's own lines about archives (a mismatch it falls back from, classes it cannot
# archive) would land in the job's output: the job says what matters itself.
QUIET = ("-Xlog:cds=off", "-Xlog:cds+dynamic=off")


@dataclass(frozen=True)
class ClassCache:
    """What one job's driver JVM does with the cache: its `options`; `archive`, the
    archive it maps or will write (None: no cache); `partial`, where it writes one."""

    options: tuple[str, ...] = ()
    archive: str | None = None
    partial: str | None = None

    def finish(self, returncode: int) -> bool:
        """After the JVM exited: keep what it wrote if the job succeeded, under the name
        that carries its size; whether an archive was kept."""
        if self.partial is None or self.archive is None:
            return False
        try:
            size = os.path.getsize(self.partial)
            if returncode != 0 or size == 0:
                return False
            final = sized_name(self.archive, size)
            os.replace(self.partial, final)
        except OSError:
            return False  # no archive written (the JVM could not), or the cache went away
        finally:
            with contextlib.suppress(OSError):
                os.unlink(self.partial)
        cache_dir = os.path.dirname(final)
        prune_cache(
            cache_dir,
            keep=final,
            kept=(ARCHIVE_PREFIX, ARCHIVE_SUFFIX),
            partial_prefix=PARTIAL_PREFIX,
        )
        return True


def default_cache_dir() -> str:
    return os.path.join(cache_root(), "spark-classes")


def driver_java() -> str | None:
    """The java spark-class runs: $JAVA_HOME's, else the first on PATH."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        return os.path.join(java_home, "bin", "java")
    return shutil.which("java")


def cache_key(job: str, java: str, spark_home: str) -> str:
    """Names an archive: the job, the java binary (resolved) and Spark's jars."""
    digest = hashlib.sha256(f"{LAYOUT_VERSION}\0{job}\0".encode())
    for path in [os.path.realpath(java), *_jars(spark_home)]:
        st = os.stat(path)
        digest.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return digest.hexdigest()[:20]


def _jars(spark_home: str) -> list[str]:
    jars = os.path.join(spark_home, "jars")
    return sorted(os.path.join(jars, name) for name in os.listdir(jars) if name.endswith(".jar"))


def sized_name(archive: str, size: int) -> str:
    return f"{archive[: -len(ARCHIVE_SUFFIX)]}-{size}{ARCHIVE_SUFFIX}"


def find_archive(archive: str) -> str | None:
    """The kept archive for `archive`'s key whose size is the one its name says."""
    directory, base = os.path.split(archive)
    stem = base[: -len(ARCHIVE_SUFFIX)] + "-"
    try:
        names = os.listdir(directory)
    except OSError:
        return None
    for name in sorted(names):
        size = name[len(stem) : -len(ARCHIVE_SUFFIX)]
        if not (name.startswith(stem) and name.endswith(ARCHIVE_SUFFIX) and size.isdigit()):
            continue
        path = os.path.join(directory, name)
        with contextlib.suppress(OSError):
            if os.path.getsize(path) == int(size):
                return path
    return None


def class_cache(cache_dir: str | None, job: str, spark_home: str) -> ClassCache:
    """The driver's options for `job`: map the cached archive if there is one, else
    write one at exit. Nothing (no options) when the cache is `off`, when there is no
    java to key on, or when the cache directory cannot be made or written."""
    if cache_dir == OFF:
        return ClassCache()
    java = driver_java()
    if java is None:
        return ClassCache()
    cache_dir = os.path.abspath(cache_dir or default_cache_dir())
    try:
        key = cache_key(job, java, spark_home)
    except OSError:
        return ClassCache()  # no java or jars where expected: spark-submit will say so
    archive = os.path.join(cache_dir, f"{ARCHIVE_PREFIX}{job}-{key}{ARCHIVE_SUFFIX}")
    found = find_archive(archive)
    if found is not None:
        with contextlib.suppress(OSError):  # a read-only cache serves, unmarked
            os.utime(found)
        return ClassCache(
            (f"-XX:SharedArchiveFile={found}", "-XX:+VerifySharedSpaces", *QUIET), found
        )
    try:
        os.makedirs(cache_dir, exist_ok=True)
        fd, partial = tempfile.mkstemp(prefix=PARTIAL_PREFIX, suffix=ARCHIVE_SUFFIX, dir=cache_dir)
        os.close(fd)
    except OSError:
        return ClassCache()
    return ClassCache((f"-XX:ArchiveClassesAtExit={partial}", *QUIET), archive, partial)
