"""Fixtures of the reliability suite (issue #7).

The daemon fixtures of the end-to-end tests are reused as they are (``spawn``,
``daemons``, ``session``; the test PKI is the suite-wide ``pki`` fixture). ``figures``
(tests/figures.py) collects what a run measured (cycles survived, faults injected, bad
inputs tried, ...): they are printed at the end of the run, and written as JSON to the
file named by ``SHARECOORD_RELIABILITY_FIGURES`` when it is set, whence
RELIABILITY.md's figures.
"""

from __future__ import annotations

from tests.figures import figures  # noqa: F401
from tests.fullfs import full_disk  # noqa: F401
from tests.server.conftest import daemons, session, spawn  # noqa: F401
