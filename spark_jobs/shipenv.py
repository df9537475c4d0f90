"""The Python environment a cluster's executors run: packed once, shipped with each job.

Spark's executors start a Python of their own; on a cluster it need not have what the
jobs import. As Spark's guide to Python package management does with venv-pack, the
jobs ship one: an archive passed with ``--archives ENV.tar.gz#environment`` that each
executor unpacks into its working directory, and ``spark.pyspark.python`` set to
``./environment/bin/python``. What the archive holds (paths inside it):

* ``pyvenv.cfg`` and ``bin/python``, a symbolic link to this interpreter's base Python
  (the one the driver's venv was made from, by its absolute path): the executors must
  have that Python at that path, as with venv-pack; an archive carries no interpreter;
* ``lib/pythonX.Y/site-packages/``: the files of the distributions the executors import
  (pyproject.toml's ``spark-executor`` extra, with what they depend on), exactly as the
  installed distributions list them (their RECORD). Not pyspark (the executors put their
  Spark's own ``pyspark.zip`` on ``PYTHONPATH``, and the driver's and the cluster's
  Spark must agree anyway) and not sharecoord (``--py-files`` carries its code).

The archive is built by the command that needs it and kept in a cache directory
(``default_cache_dir``, or the ``spark_env_cache`` setting), named by a key over the
interpreter and every packed distribution's name, version and RECORD: a changed
environment packs a new archive; an unchanged one is reused (and its mtime set: the
cache's record of use). Packing a new one deletes the archives nobody used for
``STALE_AFTER_S`` and what killed packers left, so a cache holds about one archive per
environment in use, not one per change ever made.

This module runs in the CLI's and the driver's process; it imports no pyspark.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from packaging.requirements import Requirement

PROJECT = "sharecoord"
EXECUTOR_EXTRA = "spark-executor"
# What `#environment` names: the directory each executor unpacks the archive into.
ARCHIVE_ALIAS = "environment"
SHIPPED_PYTHON = f"./{ARCHIVE_ALIAS}/bin/python"
ARCHIVE_PREFIX = "sharecoord-env-"
# Part of the key: a change to what an archive holds makes every old one stale.
LAYOUT_VERSION = 1
# gzip's fastest level: most of the archive is compiled code, which level 6 shrinks by a
# few percent more at several times the time.
COMPRESS_LEVEL = 1
# An archive unused this long is deleted when another is packed (a venv gone or changed).
STALE_AFTER_S = 14 * 86400
# A partial archive this old is a killed packer's: no packer takes a day.
ABANDONED_AFTER_S = 86400
PARTIAL_PREFIX = ".packing-"


class PackError(Exception):
    """Why the environment cannot be packed: one line, for the user."""


@dataclass(frozen=True)
class Packed:
    path: str
    built: bool  # false: the cache had it
    seconds: float
    size_bytes: int


def cache_root() -> str:
    """sharecoord's directory of caches: $XDG_CACHE_HOME/sharecoord (~/.cache/...)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "sharecoord")


def default_cache_dir() -> str:
    return os.path.join(cache_root(), "spark-env")


def base_python() -> str:
    """The interpreter the shipped ``bin/python`` points at: the base of this venv (or
    this interpreter itself outside one), by the path the executors must also have."""
    return str(getattr(sys, "_base_executable", "") or sys.executable)


def executor_distributions() -> list[metadata.Distribution]:
    """The installed distributions of the ``spark-executor`` extra and everything they
    require, sorted by name; sharecoord itself is left out (its code ships as a zip)."""
    found: dict[str, metadata.Distribution] = {}
    pending = [(PROJECT, EXECUTOR_EXTRA)]
    seen: set[tuple[str, str]] = set()
    while pending:
        name, extra = pending.pop()
        if (name, extra) in seen:
            continue
        seen.add((name, extra))
        for requirement in _requirements(name, extra):
            required = canonicalize_name(requirement.name)
            if required != PROJECT and required not in found:
                found[required] = _installed(required, name)
                pending.append((required, ""))
            pending.extend((required, wanted) for wanted in requirement.extras)
    return [found[name] for name in sorted(found)]


def canonicalize_name(name: str) -> str:
    """A distribution's name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirements(name: str, extra: str) -> list[Requirement]:
    """What `name` requires with `extra` ("" for itself alone); of sharecoord, only what
    the extra adds (its own dependencies serve the daemon, not the executors)."""
    try:
        # Here, not above: every sharecoord command imports this module (through
        # spark_jobs.submit), and a lean install has no packaging.
        from packaging.requirements import Requirement  # noqa: PLC0415
    except ImportError:
        raise PackError("packaging is not installed: pip install 'sharecoord[spark]'") from None
    try:
        texts = metadata.requires(name) or []
    except metadata.PackageNotFoundError:
        raise PackError(f"{name} is not installed: pip install 'sharecoord[spark]'") from None
    wanted = []
    for text in texts:
        requirement = Requirement(text)
        marker = requirement.marker
        if extra:
            # Only what the extra adds: true with it, false without.
            if marker is None or not marker.evaluate({"extra": extra}):
                continue
            if marker.evaluate({"extra": ""}):
                continue
        elif name == PROJECT or (marker is not None and not marker.evaluate({"extra": ""})):
            continue
        wanted.append(requirement)
    return wanted


def _installed(name: str, required_by: str) -> metadata.Distribution:
    try:
        return metadata.distribution(name)
    except metadata.PackageNotFoundError:
        raise PackError(
            f"{name} (required by {required_by}) is not installed: "
            "pip install 'sharecoord[spark]' (in a checkout: make venv)"
        ) from None


def environment_key(distributions: list[metadata.Distribution]) -> str:
    """Names what an archive holds: the interpreter, and each distribution's name,
    version and RECORD (a reinstall of another build changes it)."""
    digest = hashlib.sha256()
    digest.update(f"{LAYOUT_VERSION}\0{sys.version}\0{base_python()}\0".encode())
    for dist in distributions:
        record = dist.read_text("RECORD") or ""
        name = canonicalize_name(dist.metadata["Name"])
        digest.update(f"{name}\0{dist.version}\0".encode())
        digest.update(hashlib.sha256(record.encode()).digest())
    return digest.hexdigest()[:20]


def packed_environment(
    cache_dir: str | None = None, on_packing: Callable[[str], None] | None = None
) -> Packed:
    """The archive for this environment: from the cache, or packed into it now (after
    calling `on_packing` with its path)."""
    started = time.monotonic()
    cache_dir = os.path.abspath(cache_dir or default_cache_dir())
    distributions = executor_distributions()
    path = os.path.join(cache_dir, f"{ARCHIVE_PREFIX}{environment_key(distributions)}.tar.gz")
    if os.path.isfile(path):
        with contextlib.suppress(OSError):  # a read-only cache serves, unmarked
            os.utime(path)
        return Packed(path, False, time.monotonic() - started, os.path.getsize(path))
    if on_packing is not None:
        on_packing(path)
    if not os.path.exists(base_python()):
        raise PackError(f"the base interpreter {base_python()} is missing")
    try:
        os.makedirs(cache_dir, exist_ok=True)
        # Packed aside and renamed: a killed run leaves no half archive under the name.
        fd, partial = tempfile.mkstemp(prefix=PARTIAL_PREFIX, suffix=".tar.gz", dir=cache_dir)
    except OSError as exc:
        raise PackError(f"cache directory {cache_dir}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as raw:
            write_archive(raw, distributions)
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(partial, path)
    except OSError as exc:
        raise PackError(f"packing into {cache_dir}: {exc.strerror or exc}") from None
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    prune_cache(cache_dir, keep=path)
    return Packed(path, True, time.monotonic() - started, os.path.getsize(path))


def prune_cache(
    cache_dir: str,
    keep: str,
    now: float | None = None,
    *,
    kept: tuple[str, str] = (ARCHIVE_PREFIX, ".tar.gz"),
    partial_prefix: str = PARTIAL_PREFIX,
) -> list[str]:
    """Delete the archives in `cache_dir` (names that start and end as `kept` says)
    unused for STALE_AFTER_S and the partial ones (`partial_prefix`) older than
    ABANDONED_AFTER_S, never `keep`; the names deleted. Best effort: an entry another
    process deleted or touched meanwhile is left to it."""
    now = time.time() if now is None else now
    deleted: list[str] = []
    try:
        names = os.listdir(cache_dir)
    except OSError:
        return deleted
    for name in names:
        if name.startswith(kept[0]) and name.endswith(kept[1]):
            age = STALE_AFTER_S
        elif name.startswith(partial_prefix):
            age = ABANDONED_AFTER_S
        else:
            continue  # not ours
        path = os.path.join(cache_dir, name)
        if path == keep:
            continue
        try:
            if now - os.stat(path).st_mtime > age:
                os.unlink(path)
                deleted.append(name)
        except OSError:
            continue
    return deleted


def write_archive(raw: io.BufferedIOBase, distributions: list[metadata.Distribution]) -> None:
    version = sys.version_info
    site_packages = f"lib/python{version.major}.{version.minor}/site-packages"
    python = base_python()
    config = (
        f"home = {os.path.dirname(python)}\n"
        "include-system-site-packages = false\n"
        f"version = {version.major}.{version.minor}.{version.micro}\n"
    )
    with tarfile.open(fileobj=raw, mode="w:gz", compresslevel=COMPRESS_LEVEL) as archive:
        _add_bytes(archive, "pyvenv.cfg", config.encode())
        _add_link(archive, "bin/python", python)
        for alias in ("python3", f"python{version.major}.{version.minor}"):
            _add_link(archive, f"bin/{alias}", "python")
        for dist in distributions:
            for member, source in _files(dist):
                archive.add(source, f"{site_packages}/{member}", recursive=False)


def _files(dist: metadata.Distribution) -> list[tuple[str, str]]:
    """(path inside site-packages, installed file) of what `dist` installed there; its
    scripts and data outside site-packages stay behind."""
    name = dist.metadata["Name"]
    listed = dist.files
    if listed is None:
        raise PackError(f"{name} lists no files (no RECORD): reinstall it with pip")
    out = []
    for member in listed:
        if ".." in member.parts:
            continue
        source = str(dist.locate_file(member))
        if not os.path.lexists(source):
            if "__pycache__" in member.parts:
                continue  # compiled lazily; the executors compile their own
            raise PackError(f"{name} {dist.version} is damaged: {source} is missing")
        out.append((member.as_posix(), source))
    return sorted(out)


def _add_bytes(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    info.mtime = int(time.time())
    archive.addfile(info, io.BytesIO(data))


def _add_link(archive: tarfile.TarFile, name: str, target: str) -> None:
    info = tarfile.TarInfo(name)
    info.type = tarfile.SYMTYPE
    info.linkname = target
    info.mode = 0o777
    info.mtime = int(time.time())
    archive.addfile(info)
