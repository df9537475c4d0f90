"""Every error a user can cause is one line on stderr and exit 2 (usage) or 1 (the
operation failed), found before anything expensive starts: no trace, no JVM, no daemon.

Each row runs a real ``sharecoord`` process (``python -m server.commands.cli``). Placeholders in
the arguments: ``{file}`` a regular file, ``{dir}`` a directory, ``{data}`` a valid data
directory, ``{odd}`` a directory whose ``meta`` is a directory, ``{missing}`` a path
that does not exist, ``{bad_toml}``, ``{latin1_toml}``,
``{typo_toml}``, ``{huge_cluster}``, ``{cluster}`` config and cluster files (the last
one names node 0 at 127.0.0.1:9095), ``{owned}`` a data directory of node 0, ``{locked}``
one whose lock is held, ``{refused}`` a local port nobody listens on, ``{silent}`` one
that accepts connections and never answers.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from persistence import StateLog
from persistence.ownership import Assignment
from tests.harness import REPO_ROOT, TOPIC, child_env

# A safety net: every row finishes in well under a second when the checks come first.
ROW_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Row:
    id: str
    args: tuple[str, ...]
    code: int
    names: tuple[str, ...]  # what the one line must say (case-insensitive)
    env: Mapping[str, str] = field(default_factory=dict)
    unset: tuple[str, ...] = ()
    hide_modules: tuple[str, ...] = ()  # import as if not installed


def row(
    id: str, args: str, code: int, *names: str, env: Mapping[str, str] | None = None, **kw: Any
) -> Row:
    return Row(id, tuple(args.split()), code, names, env or {}, **kw)


STATE = f"state get --group g --topic {TOPIC} --partition 0"
SECRET = "pw-never-shown"  # a password in a URI: each line shows it masked
NO_JAVA = {"env": {"PATH": "{dir}"}, "unset": ("JAVA_HOME",)}

ROWS = [
    # --- the command line itself
    row("no-command", "", 2, "a command is needed", "serve"),
    row("unknown-command", "frobnicate", 2, "invalid choice", "frobnicate"),
    row("log-without-subcommand", "log", 2, "sharecoord log:", "dump or verify"),
    row("state-without-subcommand", "state", 2, "sharecoord state:", "get"),
    row("unknown-flag", "serve --no-such-flag", 2, "sharecoord serve:", "--no-such-flag"),
    row("flag-without-value", "log dump --data-dir", 2, "--data-dir", "expected one argument"),
    # --- serve
    row("serve-data-dir-is-a-file", "serve --data-dir {file}", 2, "--data-dir", "not a directory"),
    row(
        "serve-data-dir-under-a-file",
        "serve --data-dir {file}/data",
        2,
        "cannot be created",
        "not a directory",
    ),
    row("serve-partitions-huge", "serve --partitions 100000000", 2, "partitions", "10000"),
    row("serve-partitions-zero", "serve --partitions 0", 2, "partitions", "between 1 and"),
    row("serve-partitions-not-int", "serve --partitions many", 2, "partitions", "integer"),
    row(
        "serve-partitions-from-env",
        "serve",
        2,
        "SHARECOORD_PARTITIONS",
        env={"SHARECOORD_PARTITIONS": "100000000"},
    ),
    row("serve-listen-unparsable", "serve --listen nope", 2, "listen", "HOST:PORT"),
    row("serve-listen-bad-port", "serve --listen 127.0.0.1:99999", 2, "listen", "port"),
    row("serve-config-missing", "serve --config {missing}", 2, "config file", "cannot read"),
    row("serve-config-is-a-dir", "serve --config {dir}", 2, "config file", "cannot read"),
    row("serve-config-bad-toml", "serve --config {bad_toml}", 2, "not valid TOML"),
    row("serve-config-not-utf8", "serve --config {latin1_toml}", 2, "not valid TOML", "UTF-8"),
    row("serve-config-unknown-key", "serve --config {typo_toml}", 2, "unknown key", "partitons"),
    row("serve-cluster-missing", "serve --cluster {missing}", 2, "cluster file", "cannot read"),
    row(
        "serve-cluster-huge",
        "serve --cluster {huge_cluster} --partitions 50",
        2,
        "num_partitions",
        "10000",
    ),
    row(
        "serve-token-file-missing",
        "serve --data-dir {dir}/d --listen 127.0.0.1:0 --auth-token-file {missing}",
        2,
        "auth token file",
        "cannot read",
    ),
    row(
        "serve-token-file-unreadable",
        "serve --data-dir {dir}/d --listen 127.0.0.1:0 --auth-token-file {dir}",
        2,
        "auth token file",
        "cannot read",
    ),
    row(
        "serve-data-dir-cannot-be-opened",
        "serve --data-dir {odd} --listen 127.0.0.1:0",
        1,
        "data directory",
        "is a directory",
    ),
    row(
        "serve-data-dir-parent-missing",
        "serve --data-dir {dir}/missing/d --listen 127.0.0.1:0",
        1,
        # The path once, then the reason.
        "data directory {dir}/missing/d: no such file or directory",
    ),
    row("serve-tls-cert-without-key", "serve --tls-cert {file}", 2, "tls_cert", "--tls-key"),
    row("serve-kafka-listener-unparsable", "serve --kafka-listener nope", 2, "kafka_listener"),
    row(
        "serve-kafka-listener-bad-port",
        "serve --kafka-listener 127.0.0.1:70000",
        2,
        "kafka_listener",
        "port",
    ),
    row(
        "serve-kafka-listener-in-use",
        "serve --data-dir {dir}/k --listen 127.0.0.1:0 --kafka-listener 127.0.0.1:{silent}",
        1,
        "cannot listen",
        "--kafka-listener",
    ),
    row(
        "serve-scram-file-missing",
        "serve --data-dir {dir}/s --listen 127.0.0.1:0 --scram-credentials-file {missing}",
        2,
        "SCRAM credentials file",
        "cannot read",
    ),
    row(
        "serve-scram-file-not-credentials",
        "serve --data-dir {dir}/s --listen 127.0.0.1:0 --scram-credentials-file {bad_toml}",
        2,
        "SCRAM credentials file",
    ),
    row(
        "serve-listen-port-not-the-cluster-files",
        "serve --cluster {cluster} --partitions 2 --listen 127.0.0.1:9096",
        2,
        "listen",
        "has port 9096",
        "127.0.0.1:9095",
    ),
    row(
        "serve-advertised-listener-not-the-cluster-files",
        "serve --cluster {cluster} --partitions 2 --advertised-listener other:9095",
        2,
        "advertised_listener",
        "disagrees",
    ),
    row("serve-advertised-listener-unparsable", "serve --advertised-listener nope", 2, "HOST:PORT"),
    row(
        "serve-advertised-listener-wildcard",
        "serve --advertised-listener 0.0.0.0:9095",
        2,
        "advertised_listener",
        "not an address a client can connect to",
    ),
    row(
        "serve-advertised-listener-port-zero",
        "serve --advertised-listener coord:0",
        2,
        "advertised_listener",
        "1..65535",
    ),
    row(
        "serve-data-dir-of-another-node",
        "serve --data-dir {owned} --partitions 2 --node-id 3 --listen 127.0.0.1:0",
        1,
        "data directory of node 0",
        "--node-id 0",
    ),
    # --- partition export / import / adopt
    row("partition-without-subcommand", "partition", 2, "export, import or adopt"),
    row(
        "export-partition-required",
        "partition export --data-dir {data} --out {dir}/x",
        2,
        "--partition is required",
    ),
    row("export-out-required", "partition export --data-dir {data} --partition 0", 2, "--out"),
    row(
        "export-data-dir-missing",
        "partition export --data-dir {missing} --partition 0 --out {dir}/x",
        2,
        "not a directory",
    ),
    row(
        "export-not-a-data-dir",
        "partition export --data-dir {dir} --partition 0 --out {dir}/x",
        2,
        "not a sharecoord data directory",
    ),
    row(
        "export-meta-unreadable",
        "partition export --data-dir {odd} --partition 0 --out {dir}/x",
        2,
        "is a directory",
    ),
    row(
        "export-partition-past-the-end",
        "partition export --data-dir {data} --partition 9 --out {dir}/x",
        2,
        "0..1",
    ),
    row(
        "export-out-not-empty",
        "partition export --data-dir {data} --partition 0 --out {file}",
        2,
        "--out",
        "not an empty directory",
    ),
    row(
        "export-out-under-nothing",
        "partition export --data-dir {data} --partition 0 --out {missing}/x",
        2,
        "--out",
        "is not a directory",
    ),
    row(
        "export-locked",
        "partition export --data-dir {locked} --partition 0 --out {dir}/x",
        1,
        "in use",
        "LOCK",
    ),
    row("import-from-required", "partition import --data-dir {dir}/t", 2, "--from is required"),
    row(
        "import-from-missing",
        "partition import --data-dir {dir}/t --from {missing}",
        2,
        "--from",
        "not a directory",
    ),
    row(
        "import-from-not-an-export",
        "partition import --data-dir {dir}/t --from {dir}",
        2,
        "not a partition export",
        "EXPORT",
    ),
    row(
        "import-node-id-negative",
        "partition import --from {dir} --node-id -1",
        2,
        "node_id",
        "between 0 and",
    ),
    row("adopt-partition-required", "partition adopt --data-dir {data}", 2, "--partition"),
    row(
        "adopt-partition-list-malformed",
        "partition adopt --data-dir {data} --partition 3-",
        2,
        "partition",
        "3,5-7",
    ),
    row(
        "adopt-partition-past-the-end",
        "partition adopt --data-dir {data} --partition 0-5 --node-id 0",
        2,
        "0..1",
    ),
    row(
        "adopt-needs-a-node-id",
        "partition adopt --data-dir {data} --partition 0",
        2,
        "does not record its node",
        "--node-id",
    ),
    row(
        "adopt-node-id-of-another-node",
        "partition adopt --data-dir {owned} --partition 0 --node-id 3",
        2,
        "data directory of node 0",
    ),
    # --- scram
    row("scram-without-subcommand", "scram", 2, "sharecoord scram:", "add or remove"),
    row(
        "scram-add-iterations-low",
        "scram add --file {dir}/c.json --user u --mechanism SCRAM-SHA-256 --iterations 10",
        2,
        "--iterations",
        "4096",
    ),
    row(
        "scram-add-unknown-mechanism",
        "scram add --file {dir}/c.json --user u --mechanism MD5",
        2,
        "invalid choice",
        "MD5",
    ),
    row(
        "scram-add-no-user", "scram add --file {dir}/c.json --mechanism SCRAM-SHA-256", 2, "--user"
    ),
    row(
        "scram-add-file-is-a-directory",
        "scram add --file {dir} --user u --mechanism SCRAM-SHA-256",
        2,
        "is a directory",
    ),
    row(
        "scram-add-file-not-credentials",
        "scram add --file {bad_toml} --user u --mechanism SCRAM-SHA-256",
        2,
        "SCRAM credentials file",
    ),
    row(
        "scram-add-empty-password",
        "scram add --file {dir}/c.json --user u --mechanism SCRAM-SHA-256",
        2,
        "password",
        "empty",
    ),
    row("scram-remove-no-such-user", "scram remove --file {missing} --user u", 2, "no such user"),
    row("serve-log-level", "serve --log-level trace", 2, "log_level", "debug"),
    row("serve-access-log-not-bool", "serve --access-log=maybe", 2, "ignored explicit argument"),
    # --- log dump / log verify
    row("dump-data-dir-is-a-file", "log dump --data-dir {file}", 2, "not a directory"),
    row("dump-data-dir-missing", "log dump --data-dir {missing}", 2, "not a sharecoord data"),
    row("dump-meta-unreadable", "log dump --data-dir {odd}", 2, "--data-dir", "is a directory"),
    row("dump-partition-negative", "log dump --data-dir {data} --partition -1", 2, "partition"),
    row("dump-partition-past-the-end", "log dump --data-dir {data} --partition 9", 2, "0..1"),
    row("verify-data-dir-is-a-file", "log verify --data-dir {file}", 2, "not a directory"),
    row("verify-data-dir-missing", "log verify --data-dir {missing}", 2, "not a directory"),
    row(
        "verify-not-a-data-dir",
        "log verify --data-dir {dir}",
        2,
        "{dir} is not a sharecoord data directory",
    ),
    # --- compact
    row("compact-data-dir-is-a-file", "compact --data-dir {file}", 2, "not a directory"),
    row("compact-data-dir-missing", "compact --data-dir {missing}", 2, "not a sharecoord data"),
    row("compact-meta-unreadable", "compact --data-dir {odd}", 2, "is a directory"),
    row("compact-master-malformed", "compact --data-dir {data} --master bogus://x", 2, "master"),
    row("compact-master-no-port", "compact --data-dir {data} --master spark://h", 2, "master"),
    row("compact-no-java", "compact --data-dir {data}", 2, "java", "PATH", **NO_JAVA),
    row(
        "compact-java-home-wrong",
        "compact --data-dir {data}",
        2,
        "JAVA_HOME",
        env={"JAVA_HOME": "{missing}"},
    ),
    row(
        "compact-without-pyspark",
        "compact --data-dir {data}",
        2,
        "pyspark",
        "sharecoord[spark]",
        hide_modules=("pyspark",),
    ),
    row(
        "compact-retention-negative",
        "compact --data-dir {data} --tombstone-retention-ms -1",
        2,
        "tombstone_retention_ms",
    ),
    # --- audit
    row("audit-out-required", "audit --data-dir {data}", 2, "--out is required"),
    row("audit-out-is-a-file", "audit --data-dir {data} --out {file}", 2, "--out", "not a dir"),
    row(
        "audit-out-unwritable",
        "audit --data-dir {data} --out {file}/report",
        2,
        "--out",
        "cannot be made or written",
    ),
    row("audit-data-dir-is-a-file", "audit --data-dir {file} --out {dir}", 2, "not a directory"),
    row("audit-data-dir-missing", "audit --data-dir {missing} --out {dir}", 2, "not a sharecoord"),
    row("audit-no-java", "audit --data-dir {data} --out {dir}/r", 2, "java", **NO_JAVA),
    row(
        "audit-without-matplotlib",
        "audit --data-dir {data} --out {dir}/r",
        2,
        "matplotlib",
        "sharecoord[spark]",
        hide_modules=("matplotlib",),
    ),
    row("audit-delivery-limit-zero", "audit --data-dir {data} --delivery-limit 0", 2, "delivery"),
    # --- compact and audit on the PostgreSQL store: what is wrong with it, before Spark
    row(
        "compact-on-unreachable-postgres",
        f"compact --state-store postgresql://u:{SECRET}@127.0.0.1:{{refused}}/x",
        1,
        "sharecoord compact",
        "cannot connect",
        "u:***@127.0.0.1",
    ),
    row(
        "audit-on-unreachable-postgres-from-env",
        "audit --out {dir}/r",
        1,
        "sharecoord audit",
        "cannot connect",
        env={"SHARECOORD_STATE_STORE": f"postgresql://u:{SECRET}@127.0.0.1:{{refused}}/x"},
    ),
    row(
        "compact-on-a-store-that-is-not-postgres",
        f"compact --state-store mysql://root:{SECRET}@db/x",
        2,
        "not a PostgreSQL URI",
        "root:***@db",
    ),
    row(
        "compact-on-postgres-with-a-history-dir",
        f"compact --state-store postgresql://u:{SECRET}@db/x --history-dir h",
        2,
        "sharecoord_history",
    ),
    # --- cluster status
    row("cluster-without-subcommand", "cluster", 2, "sharecoord cluster:", "status"),
    row("cluster-status-no-store", "cluster status", 2, "--state-store is required"),
    row(
        "cluster-status-not-postgres",
        f"cluster status --state-store mysql://root:{SECRET}@db/x",
        2,
        "not a PostgreSQL URI",
        "root:***@db",
    ),
    row(
        "cluster-status-not-postgres-from-env",
        "cluster status",
        2,
        "not a PostgreSQL URI",
        env={"SHARECOORD_STATE_STORE": "redis://db"},
    ),
    row(
        "cluster-status-bad-schema",
        "cluster status --state-store postgresql://db/x --state-store-schema Bad-Name",
        2,
        "state-store-schema",
    ),
    row(
        "cluster-status-unreachable",
        f"cluster status --state-store postgresql://u:{SECRET}@127.0.0.1:{{refused}}/x",
        1,
        "cannot connect",
        "u:***@127.0.0.1",
    ),
    row(
        "cluster-status-lease-too-short",
        "cluster status --state-store postgresql://db/x --lease-ms 10",
        2,
        "lease-ms",
    ),
    # --- state get
    row("state-url-not-a-url", f"{STATE} --url not-a-url", 2, "url", "HOST:PORT"),
    row("state-url-ftp", f"{STATE} --url ftp://127.0.0.1:{{refused}}/", 2, "url", "ftp"),
    row("state-url-bad-port", f"{STATE} --url http://127.0.0.1:99999", 2, "url", "port"),
    row("state-url-no-host", f"{STATE} --url http://", 2, "url", "no host"),
    row(
        "state-host-port-means-http",
        f"{STATE} --url 127.0.0.1:{{refused}}",
        1,
        "http://127.0.0.1:{refused}",
        "refused",
    ),
    row("state-refused", f"{STATE} --url http://127.0.0.1:{{refused}}", 1, "refused"),
    row(
        "state-silent-daemon-times-out",
        f"{STATE} --url http://127.0.0.1:{{silent}} --timeout-s 0.3",
        1,
        "no answer",
        "0.3 s",
    ),
    row("state-timeout-zero", f"{STATE} --url 127.0.0.1:1 --timeout-s 0", 2, "timeout_s"),
    row(
        "state-partition-negative",
        f"state get --url 127.0.0.1:1 --group g --topic {TOPIC} --partition -1",
        2,
        "partition",
        "between 0 and",
    ),
    row(
        "state-topic-malformed",
        "state get --url 127.0.0.1:1 --group g --topic nope --partition 0",
        2,
        "topic",
    ),
    row(
        "state-group-empty",
        f"state get --url 127.0.0.1:1 --group= --topic {TOPIC} --partition 0",
        2,
        "group",
        "empty",
    ),
    row("state-required-missing", "state get --url 127.0.0.1:1", 2, "--group is required"),
    row(
        "state-token-file-missing",
        f"{STATE} --url 127.0.0.1:{{refused}} --token-file {{missing}}",
        2,
        "token file",
        "cannot read",
    ),
    row(
        "state-token-file-unreadable",
        f"{STATE} --url 127.0.0.1:{{refused}} --token-file {{dir}}",
        2,
        "token file",
        "cannot read",
    ),
    row(
        "state-cacert-missing",
        f"{STATE} --url https://127.0.0.1:{{refused}} --cacert {{missing}}",
        2,
        "TLS CA",
        "cannot read",
    ),
]


@pytest.fixture(scope="module")
def places(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    root = tmp_path_factory.mktemp("bad-input")
    (root / "file").write_text("not a directory\n")
    (root / "dir").mkdir()
    (root / "bad.toml").write_text("partitions = [\n")
    (root / "latin1.toml").write_bytes("data_dir = 'caf\xe9'\n".encode("latin-1"))
    (root / "typo.toml").write_text("partitons = 4\n")
    (root / "huge.toml").write_text(
        'num_partitions = 100000000\n[[node]]\nid = 0\nhost = "h"\nport = 1\n'
        'partitions = ["0-99999999"]\n'
    )
    StateLog.open(str(root / "data"), 2).close()
    StateLog.open(str(root / "owned"), 2, assignment=Assignment(0, "fp", (0, 0))).close()
    locked = StateLog.open(str(root / "locked"), 2)  # held until the module is done
    (root / "cluster.toml").write_text(
        'num_partitions = 2\n[[node]]\nid = 0\nhost = "127.0.0.1"\nport = 9095\n'
        'partitions = ["0-1"]\n'
    )
    (root / "odd" / "meta").mkdir(parents=True)
    with socket.socket() as refused, socket.socket() as silent:
        refused.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # the kernel completes the handshake; nobody ever reads
        yield {
            "file": str(root / "file"),
            "dir": str(root / "dir"),
            "data": str(root / "data"),
            "odd": str(root / "odd"),
            "missing": str(root / "missing"),
            "bad_toml": str(root / "bad.toml"),
            "latin1_toml": str(root / "latin1.toml"),
            "typo_toml": str(root / "typo.toml"),
            "huge_cluster": str(root / "huge.toml"),
            "cluster": str(root / "cluster.toml"),
            "owned": str(root / "owned"),
            "locked": str(root / "locked"),
            "refused": str(refused.getsockname()[1]),
            "silent": str(silent.getsockname()[1]),
        }
    locked.close()


def run(r: Row, places: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    env = child_env({k: v.format(**places) for k, v in r.env.items()})
    for name in r.unset:
        env.pop(name, None)
    if r.hide_modules:
        # None in sys.modules makes an import fail as if the package were not installed.
        hide = "; ".join(f"sys.modules[{m!r}] = None" for m in r.hide_modules)
        head = [sys.executable, "-c", f"import sys; {hide}; from server.commands.cli import main; "]
        head[-1] += "sys.exit(main())"
    else:
        head = [sys.executable, "-m", "server.commands.cli"]
    return subprocess.run(
        [*head, *(a.format(**places) for a in r.args)],
        env=env,
        capture_output=True,
        stdin=subprocess.DEVNULL,  # a password prompt must not wait for a terminal
        text=True,
        timeout=ROW_TIMEOUT_S,
        check=False,
        cwd=REPO_ROOT,
    )


@pytest.mark.parametrize("r", ROWS, ids=[r.id for r in ROWS])
def test_bad_input_is_one_line_and_the_documented_exit_code(r: Row, places: dict[str, str]) -> None:
    done = run(r, places)
    everything = done.stdout + done.stderr
    assert "Traceback" not in everything, everything
    assert done.returncode == r.code, everything
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].strip(), everything
    (line,) = lines
    for name in r.names:
        assert name.format(**places).lower() in line.lower(), line
    assert SECRET not in everything
    assert done.stdout == ""


def test_the_table_covers_every_command() -> None:
    def command(r: Row) -> str:
        grouped = r.args[0] in ("log", "state", "partition", "cluster") and len(r.args) > 1
        return " ".join(r.args[:2]) if grouped else r.args[0]

    covered = {command(r) for r in ROWS if r.args}
    assert {"serve", "compact", "audit", "log dump", "log verify", "state get"} <= covered
    assert {"partition export", "partition import", "partition adopt"} <= covered
    assert "cluster status" in covered


def test_the_line_is_json_when_json_logs_were_asked_for(places: dict[str, str]) -> None:
    """A supervisor reading the daemon's JSON lines gets its refusal as JSON too."""
    r = row("json", "serve --log-format json --partitions 100000000", 2)
    done = run(r, places)
    (line,) = done.stderr.splitlines()
    record = json.loads(line)
    assert (record["level"], record["exit_code"]) == ("error", 2)
    assert "partitions" in record["msg"]
    assert done.returncode == 2


def test_version_prints_the_installed_version() -> None:
    done = run(row("version", "--version", 0), {})
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"sharecoord {importlib.metadata.version('sharecoord')}\n"
    assert done.stderr == ""


def test_the_console_script_reports_the_same_version() -> None:
    """``make serve`` runs the installed ``sharecoord`` script, next to this Python."""
    script = Path(sys.executable).with_name("sharecoord")
    done = subprocess.run(
        [str(script), "--version"],
        env=child_env(),
        capture_output=True,
        stdin=subprocess.DEVNULL,  # a password prompt must not wait for a terminal
        text=True,
        timeout=ROW_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"sharecoord {importlib.metadata.version('sharecoord')}\n"


@pytest.mark.parametrize(
    "listen",
    ["--listen 127.0.0.1:{silent}", "--listen 127.0.0.1:0 --kafka-listener 127.0.0.1:{silent}"],
    ids=["http", "kafka"],
)
def test_a_taken_port_leaves_no_data_directory_behind(
    listen: str, places: dict[str, str], tmp_path: Path
) -> None:
    """``serve`` binds its listen addresses before it makes or opens the data directory:
    a port in use is one line and exit 1, and the directory it would have made is not
    there (nor the log it would have loaded)."""
    data_dir = tmp_path / "fresh"
    done = run(row("taken", f"serve --data-dir {data_dir} {listen}", 1), places)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 1, done.stderr
    (line,) = done.stderr.splitlines()
    assert "cannot listen" in line and places["silent"] in line, line
    assert not data_dir.exists()


def test_a_reader_that_went_away_ends_the_command_quietly(tmp_path: Path) -> None:
    """``sharecoord ... | head`` closes the pipe early: no traceback and no 'Broken pipe'
    line, and the exit code a shell gives a process SIGPIPE ended. The read end is closed
    before the command starts, so its first write meets it whatever the timing."""
    data_dir = tmp_path / "data"
    StateLog.open(str(data_dir), 50).close()  # `log verify` prints a line per partition
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "server.commands.cli",
                "log",
                "verify",
                "--data-dir",
                str(data_dir),
            ],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO_ROOT,
            env=child_env(),
            timeout=120,
            check=False,
        )
    finally:
        os.close(write_end)
    assert done.stderr == ""
    assert done.returncode == 141
