"""README's ``spark.read.format("sharecoord")`` snippet, run as a user runs it: taken
from README.md as written, in a fresh process with a clean environment (no
PYSPARK_PYTHON, a minimal PATH whose python3 lacks sharecoord's dependencies), with the
interpreter sharecoord is installed in. Its Python workers must run that interpreter,
not Spark's default python3 (issue 24)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from protocol.records import ShareKey
from tests.spark.conftest import REPO_ROOT
from tests.spark.histories import Appended, state_partition_of, write_log
from tests.spark.test_audit import TOPIC, b, snap, upd

NUM_PARTITIONS = 2
SNIPPET_TIMEOUT_S = 300
ORDERS = ShareKey("orders", TOPIC, 0)
BILLING = ShareKey("billing", TOPIC, 0)


def readme_snippet() -> str:
    """The Python block under README's "The log as a table", verbatim."""
    text = (REPO_ROOT / "README.md").read_text()
    section = text[text.index("**The log as a table.**") :]
    found = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert found is not None, "README's log-as-a-table section has no python block"
    return found[1]


def clean_environment(home: Path) -> dict[str, str]:
    """What a user's fresh shell would give: a java, the system's directories on PATH,
    and nothing of this test run's (no PYSPARK_PYTHON, no venv on PATH)."""
    java = shutil.which("java")
    assert java is not None, "no java on PATH: the Spark suite needs Java 17"
    path = os.pathsep.join(dict.fromkeys([os.path.dirname(java), "/usr/bin", "/bin"]))
    env = {"PATH": path, "HOME": str(home), "LANG": "C.UTF-8"}
    if "JAVA_HOME" in os.environ:
        env["JAVA_HOME"] = os.environ["JAVA_HOME"]
    return env


def write_recent_log(data_dir: Path) -> None:
    """Two groups' records, written a moment ago (the snippet looks at the last hour)."""
    now = int(time.time() * 1000)
    records = [
        snap(ORDERS, 1, 0, b(0, 9, 0, 3)),
        upd(ORDERS, 0, b(10, 14, 1, 1)),
        snap(BILLING, 1, 0, b(0, 99, 0, 7)),
    ]
    offsets = [0] * NUM_PARTITIONS
    appended = []
    for record in records:
        p = state_partition_of(record.key, NUM_PARTITIONS)
        appended.append(Appended(p, offsets[p], now, record))
        offsets[p] += 1
    write_log(str(data_dir), appended, NUM_PARTITIONS, 1 << 20)


def shown_rows(stdout: str) -> list[list[str]]:
    """The body rows of DataFrame.show()'s table."""
    rows = [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in stdout.splitlines()
        if line.startswith("|")
    ]
    assert rows, f"no table printed:\n{stdout}"
    return rows[1:]


@pytest.mark.spark  # a JVM, in a subprocess
def test_the_readme_snippet_prints_rows_in_a_clean_environment(tmp_path: Path) -> None:
    write_recent_log(tmp_path / "data")
    script = tmp_path / "snippet.py"
    script.write_text(readme_snippet())
    env = clean_environment(tmp_path)
    # The premise: the python3 Spark would start by default cannot read the log.
    system = subprocess.run(
        ["python3", "-c", "import msgspec"], env=env, capture_output=True, check=False
    )
    assert system.returncode != 0, "the minimal PATH's python3 has msgspec: no premise"
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=SNIPPET_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    topic = TOPIC[:17] + "..."  # show() cuts a cell at 20 characters
    assert shown_rows(done.stdout) == [[topic, "0", "0", "9", "3"], [topic, "0", "10", "14", "1"]]
