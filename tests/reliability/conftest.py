"""Fixtures of the reliability suite (issue #7).

The daemons come from the harness (``spawn``, ``daemons``: tests/harness), the client
session from the end-to-end tests (``session``), the test PKI from the suite-wide
``pki`` fixture. ``figures`` (tests/figures.py) collects what a run measured (cycles
survived, faults injected, bad inputs tried, ...): they are printed at the end of the
run, and written as JSON to the file named by ``SHARECOORD_RELIABILITY_FIGURES`` when it
is set, whence RELIABILITY.md's figures.
"""

from __future__ import annotations

from tests.figures import figures  # noqa: F401
from tests.fullfs import full_disk  # noqa: F401
from tests.server.conftest import session  # noqa: F401
