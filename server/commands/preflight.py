"""Checks the CLI makes before it starts anything expensive (a JVM, a daemon, a job).

Each returns ``None`` when all is well, or one line saying what is wrong and how to put
it right; the CLI prints it and exits 2 (a usage error: the command could never have
worked as given). They read the file system and the environment but change nothing,
except ``writable_directory``, which makes the directory the job would make anyway.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence


def data_directory_problem(path: str, *, created_if_missing: bool) -> str | None:
    """``--data-dir``: a directory, or (when the command creates it) a path under one."""
    if os.path.exists(path):
        if not os.path.isdir(path):
            return f"--data-dir {path} is not a directory"
        return None
    if not created_if_missing:
        return None  # the command's own reading says what is missing
    ancestor = _nearest_existing(path)
    if not os.path.isdir(ancestor):
        return f"--data-dir {path} cannot be created: {ancestor} is not a directory"
    return None


def writable_directory(path: str, flag: str) -> str | None:
    """A directory the command will write into: made if missing, and written to once
    (an access check would not do: it says yes to root on a read-only mount)."""
    if os.path.exists(path) and not os.path.isdir(path):
        return f"{flag} {path} exists and is not a directory"
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        return f"{flag} {path} cannot be made or written to: {exc.strerror or exc}"
    return None


def missing_modules(modules: Sequence[str], command: str) -> str | None:
    """The Spark commands' extra: say how to install it instead of failing on import."""
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if not missing:
        return None
    return (
        f"{command} needs {' and '.join(missing)}, not installed here: install the spark "
        "extra, pip install 'sharecoord[spark]' (in a checkout: make venv)"
    )


def java_problem(environ: Mapping[str, str]) -> str | None:
    """Whether spark-submit will find a java, looked for as pyspark's bin/spark-class
    does: ``$JAVA_HOME/bin/java`` when JAVA_HOME is set (even if wrong), else ``java`` on
    PATH."""
    java_home = environ.get("JAVA_HOME", "")
    if java_home:
        java = os.path.join(java_home, "bin", "java")
        if os.path.isfile(java) and os.access(java, os.X_OK):
            return None
        return (
            f"JAVA_HOME is {java_home} but {java} is not an executable: point JAVA_HOME at "
            "a Java 17 or newer, or unset it to use the java on PATH"
        )
    if shutil.which("java", path=environ.get("PATH", os.defpath)) is not None:
        return None
    return "Spark needs Java 17 or newer: no JAVA_HOME is set and no java is on PATH"


def _nearest_existing(path: str) -> str:
    current = os.path.abspath(path)
    while not os.path.exists(current):
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    return current


def postgres_driver_problem() -> str | None:
    """``--state-store postgresql://``: the ``postgres`` extra (psycopg) is installed."""
    try:
        import psycopg  # noqa: F401
    except ImportError as exc:
        return (
            f"state_store names a PostgreSQL store, and its driver cannot be imported ({exc}): "
            "pip install 'sharecoord[postgres]'"
        )
    return None
