"""The test harness for daemons: one way to start a ``sharecoord`` process, wait for
anything, read /metrics and keep the acknowledged state.

* wait.py: ``wait_until`` (and ``wait_until_blocking``), the suite's one poll loop.
* daemon.py: ``DaemonConfig`` and ``Daemon`` (start, ready, SIGTERM, SIGKILL, its log),
  ``run_cli`` for the other commands, free ports and cluster files.
* fixtures.py: the ``daemons`` and ``spawn`` fixtures (a plugin of tests/conftest.py).
* metrics.py: /metrics read with prometheus_client's own text parser.
* acknowledged.py: the one model of acknowledged state, and writes whose outcome is
  known without the merge rules.
* api.py: docs/api.md for tests: keys, request bodies, and an HTTP client.

Tests import what they use from here (``from tests.harness import Api, wait_until``);
the fixtures need no import.
"""

from tests.harness.acknowledged import (
    DELIVERY_STATES,
    INITIAL,
    Acknowledged,
    AcknowledgedGroup,
    Expected,
    next_write,
)
from tests.harness.api import (
    FORMATS,
    MEDIA,
    OTHER_TOPIC,
    TOPIC,
    TOPIC_RFC4122,
    Api,
    Reply,
    batch,
    body,
    decode,
    encode,
    init_entry,
    part,
    partitions_in,
    read_entry,
    write_entry,
)
from tests.harness.daemon import (
    REPO_ROOT,
    SHARECOORD,
    STOP_TIMEOUT_S,
    Daemon,
    DaemonConfig,
    DaemonExited,
    child_env,
    cluster_file,
    free_port,
    free_ports,
    run_cli,
)
from tests.harness.fixtures import Daemons, Spawn
from tests.harness.metrics import metric_total, metric_value, samples, series
from tests.harness.wait import WAIT_TIMEOUT_S, WaitTimeout, wait_until, wait_until_blocking

__all__ = [
    "DELIVERY_STATES",
    "FORMATS",
    "INITIAL",
    "MEDIA",
    "OTHER_TOPIC",
    "REPO_ROOT",
    "SHARECOORD",
    "STOP_TIMEOUT_S",
    "TOPIC",
    "TOPIC_RFC4122",
    "WAIT_TIMEOUT_S",
    "Acknowledged",
    "AcknowledgedGroup",
    "Api",
    "Daemon",
    "DaemonConfig",
    "DaemonExited",
    "Daemons",
    "Expected",
    "Reply",
    "Spawn",
    "WaitTimeout",
    "batch",
    "body",
    "child_env",
    "cluster_file",
    "decode",
    "encode",
    "free_port",
    "free_ports",
    "init_entry",
    "metric_total",
    "metric_value",
    "next_write",
    "part",
    "partitions_in",
    "read_entry",
    "run_cli",
    "samples",
    "series",
    "wait_until",
    "wait_until_blocking",
    "write_entry",
]
