"""Spark's Python workers, without re-reading every zip archive's directory per task.

pyspark's worker calls ``importlib.invalidate_caches()`` before every task it runs (it
may have put new ``--py-files`` on ``sys.path``). On Python 3.10 and 3.11 that makes
each ``zipimport.zipimporter`` read its archive's whole central directory again, in
pure Python, at once (CPython gh-103200; 3.12 reads it again only when next used): with
pyspark.zip (3 MB) and py4j's zip on the workers' path, ~80 ms of CPU per task before
any of the task's own work, measured on the bench machine (97 against 15 ms per trivial
task; 50 of them 3.3 against 1.6 s on local[2]).

``install`` makes a zipimporter read its archive again only when the file changed since
it last did (another size or mtime; a file gone lets zipimport forget it, as it would):
what invalidation is for, an archive Spark added or replaced, still shows on the next
task. It is installed by importing the ``spark_jobs`` package in a Spark worker (the
first task that unpickles one of the jobs' functions does), on Pythons that need it, and
nowhere else: the CLI, the driver and the daemon keep zipimport as it is.
"""

from __future__ import annotations

import os
import sys
import zipimport
from collections.abc import Callable
from typing import Any

# The attribute a zipimporter keeps its archive's (mtime, size) in, as last read.
_STAMP = "_sharecoord_stamp"


def needed() -> bool:
    """Whether this process is a Spark Python worker on a Python that re-reads eagerly."""
    return sys.version_info < (3, 12) and "pyspark.worker_util" in sys.modules


def installed() -> bool:
    return hasattr(zipimport.zipimporter.invalidate_caches, "__wrapped__")


def install() -> None:
    """Replace zipimporter.invalidate_caches with the version that checks first (once)."""
    if installed():
        return
    original: Callable[[Any], None] = zipimport.zipimporter.invalidate_caches

    def invalidate_caches(self: zipimport.zipimporter) -> None:
        try:
            st = os.stat(self.archive)
        except OSError:
            self.__dict__.pop(_STAMP, None)
            original(self)  # gone or unreadable: zipimport drops what it knew
            return
        stamp = (st.st_mtime_ns, st.st_size)
        if self.__dict__.get(_STAMP) == stamp:
            return
        original(self)
        self.__dict__[_STAMP] = stamp

    invalidate_caches.__doc__ = original.__doc__
    invalidate_caches.__wrapped__ = original  # type: ignore[attr-defined]
    zipimport.zipimporter.invalidate_caches = invalidate_caches  # type: ignore[method-assign]


def uninstall() -> None:
    """Put zipimport's own back (tests)."""
    if installed():
        original = zipimport.zipimporter.invalidate_caches.__wrapped__  # type: ignore[attr-defined]
        zipimport.zipimporter.invalidate_caches = original  # type: ignore[method-assign]
