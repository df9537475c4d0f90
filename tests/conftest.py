"""Suite-wide fixtures and rules."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

# The harness's asserts are rewritten as a test's are; it must be said before the first
# import of it (tests.postgres below waits with it).
pytest.register_assert_rewrite("tests.harness")

from blockbuster import BlockBuster, blockbuster_ctx  # noqa: E402

from tests.figures import print_figures  # noqa: E402
from tests.pki import Pki, make_pki  # noqa: E402
from tests.postgres import PostgresMissing, PostgresServer, server_root  # noqa: E402

# The Spark jobs' driver JVM keeps the classes it loads in a cache that the first run
# writes (spark_jobs/classcache.py): the suite's jobs keep none, so no test writes into
# the user's cache or sees a first run's extra line by running first;
# tests/spark/test_class_cache.py gives its jobs a cache of their own.
os.environ["SHARECOORD_SPARK_CLASS_CACHE"] = "off"

# The daemon harness's fixtures (daemons, spawn) for every test.
pytest_plugins = ("tests.harness.fixtures",)


@pytest.fixture(autouse=True)
def blockbuster() -> Iterator[BlockBuster]:
    """Any blocking call made on a running event loop fails the test, as in aiohttp's own
    suite: fsync, renames and file scans belong in threads."""
    with blockbuster_ctx() as detector:
        # One write on the loop by design: a batch's frames into its partition's page
        # cache after the kernel flushed its journal record (PartitionLog.try_apply,
        # which takes no lock it would wait for and never rolls or syncs), through the
        # file operations' write_on_loop.
        detector.functions["os.write"].can_block_in("persistence/fileops.py", "write_on_loop")
        yield detector


# A long run's safety net: hundreds of kills or rounds, on a machine other work shares,
# take longer than the suite's 600 s per test (pyproject.toml) without anything hung.
SLOW_TEST_TIMEOUT_S = 3600


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked slow (the long reliability runs) only run when asked for with -m, as
    `make reliability` does; a plain `make test` keeps to the short slices. When they
    run, each has SLOW_TEST_TIMEOUT_S unless it says otherwise."""
    if config.option.markexpr:
        for item in items:
            if item.get_closest_marker("slow") and not item.get_closest_marker("timeout"):
                item.add_marker(pytest.mark.timeout(SLOW_TEST_TIMEOUT_S))
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if not item.get_closest_marker("slow")]


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """Certificates for the TLS tests (tests/pki.py), made once per session."""
    if shutil.which("openssl") is None:
        pytest.fail("the TLS tests make their certificates with the openssl CLI; install it")
    return make_pki(tmp_path_factory.mktemp("pki"))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    print_figures(terminalreporter)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """One PostgreSQL server for the session (tests/postgres.py), for the tests that do
    not stop, kill or promote it; each test works in a schema of its own. No PostgreSQL
    on the machine fails the test, in one line: it never skips."""
    with server_root() as root:
        try:
            server = PostgresServer.primary(root, "session")
        except PostgresMissing as exc:
            pytest.fail(str(exc), pytrace=False)
        try:
            yield server
        finally:
            server.destroy()
