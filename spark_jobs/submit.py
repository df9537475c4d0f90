"""`sharecoord compact` and `sharecoord audit`: run the Spark jobs through spark-submit.

The runner ships the project's pure code (the packages protocol, persistence and
spark_jobs) as a zip with `--py-files` (a local master's executors import a compiled
checkout itself instead: ``executor_tree``), runs the `spark-submit` that pyspark ships
with `--master` (default `local[*]`) and the job module's file, and streams the job's output:
job descriptions, a line per stage, the outcome and the summary line (the job prints
them; the JVM's own log is kept at WARN and its console progress bar is off).

On a real cluster (`--master spark://host:7077`) the same command works unchanged; the
data directory (and the audit's output directory) must be visible to the executors at
the same path. For local masters the executors' Python is this interpreter, so driver
and executors agree on the Python version. On any other master the executors run the
environment the command ships (spark_jobs/shipenv.py: packed once into a cache, passed
with ``--archives ENV.tar.gz#environment`` and ``spark.pyspark.python``), unless
PYSPARK_PYTHON names the Python they have (the docker-compose image does); the job's
session checks they can import what it needs before it starts (spark_jobs/session.py).

Only the CLI process imports this module (server/commands/cli.py, which owns the commands'
flags and settings); executors never do.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from typing import TextIO

from spark_jobs import classcache, shipenv

EXIT_FAILURE = 1
# Packages an executor imports: pure code, no server. persistence.postgres is read by
# the jobs over the PostgreSQL store only (it needs psycopg, which only they import).
SHIPPED_PACKAGES = ("protocol", "persistence", "persistence.postgres", "spark_jobs")
JOB_FILES = {"compact": "compact.py", "audit": "audit.py"}

# The driver JVM's logging: warnings and errors only, on stderr; no banner about the
# default profile, no console progress bar (the job prints its own progress).
LOG4J2_PROPERTIES = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n%ex
logger.native.name = org.apache.hadoop.util.NativeCodeLoader
logger.native.level = error
"""


def run_job(
    job: str,
    master: str,
    job_args: Sequence[str],
    out: TextIO | None = None,
    env_cache: str | None = None,
    class_cache: str | None = None,
    compiled_root: str | None = None,
) -> int:
    """spark-submit one job module; stream its output to `out`; return its exit code.
    `env_cache`: where the executors' environment archive is kept (shipenv's default if
    None); a local master needs none. `class_cache`: where the driver JVM's class-data
    archive is kept (classcache's default if None, none if ``off``). `compiled_root`:
    the checkout whose compiled modules (server/native.py) the caller runs, if their
    build is of the sources as they are (this module imports no server code to know):
    see ``executor_tree``."""
    out = out or sys.stdout
    with tempfile.TemporaryDirectory(prefix="sharecoord-spark-") as workdir:
        try:
            shipping = shipping_options(job, master, env_cache, out)
            classes = classcache.class_cache(class_cache, job, spark_home())
            tree = executor_tree(master, compiled_root)
            command = submit_command(
                job, master, job_args, workdir, shipping, classes.options, tree
            )
        except FileNotFoundError as exc:
            print(f"sharecoord {job}: {exc}", file=sys.stderr)
            return EXIT_FAILURE
        except shipenv.PackError as exc:
            print(
                f"sharecoord {job}: cannot pack the Python environment the executors of "
                f"{master} need: {exc}",
                file=sys.stderr,
            )
            return EXIT_FAILURE
        if classes.partial is not None:
            out.write(
                f"sharecoord {job}: {classcache.WRITING_NOTICE} {classes.archive} as it "
                "exits, for the next runs to map (once, a few seconds)\n"
            )
            out.flush()
        if tree is not None:
            out.write(f"sharecoord {job}: the executors import the compiled modules of {tree}\n")
            out.flush()
        with subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            env=job_environment(master, tree),
            text=True,
            bufsize=1,
        ) as process:
            assert process.stdout is not None
            for line in process.stdout:
                out.write(line)
                out.flush()
        classes.finish(process.returncode)
        return process.returncode


def shipping_options(job: str, master: str, env_cache: str | None, out: TextIO) -> list[str]:
    """spark-submit's options that make the executors run this environment: none for a
    local master (they run this interpreter) or when PYSPARK_PYTHON names theirs; else
    the packed environment (shipenv), built now if the cache lacks it."""
    if master.startswith("local") or os.environ.get("PYSPARK_PYTHON"):
        return []

    def say_packing(path: str) -> None:
        out.write(f"sharecoord {job}: packing the executors' Python environment into {path}\n")
        out.flush()

    packed = shipenv.packed_environment(env_cache, say_packing)
    how = f"packed in {packed.seconds:.1f} s" if packed.built else "cached"
    out.write(
        f"sharecoord {job}: shipping the executors' Python environment {packed.path} "
        f"({packed.size_bytes / 2**20:.0f} MiB, {how})\n"
    )
    out.flush()
    return [
        "--archives",
        f"{packed.path}#{shipenv.ARCHIVE_ALIAS}",
        "--conf",
        f"spark.pyspark.python={shipenv.SHIPPED_PYTHON}",
        # spark.pyspark.python would be the driver's too: the driver runs here.
        "--conf",
        f"spark.pyspark.driver.python={sys.executable}",
    ]


def submit_command(
    job: str,
    master: str,
    job_args: Sequence[str],
    workdir: str,
    shipping: Sequence[str] = (),
    java_options: Sequence[str] = (),
    tree: str | None = None,
) -> list[str]:
    """The spark-submit command line for `job`, its zip and logging config in `workdir`,
    with `shipping`'s options (shipping_options) and the driver JVM's `java_options`;
    no zip if the executors import `tree` (executor_tree)."""
    log4j = os.path.join(workdir, "log4j2.properties")
    with open(log4j, "w", encoding="utf-8") as f:
        f.write(LOG4J2_PROPERTIES)
    py_files = (
        [] if tree else ["--py-files", build_py_files(os.path.join(workdir, "sharecoord.zip"))]
    )
    return [
        spark_submit_path(),
        "--master",
        master,
        "--name",
        f"sharecoord-{job}",
        *py_files,
        "--conf",
        "spark.ui.showConsoleProgress=false",
        "--driver-java-options",
        java_option_string([f"-Dlog4j2.configurationFile=file:{log4j}", *java_options]),
        *shipping,
        job_file(job),
        *job_args,
    ]


def java_option_string(options: Sequence[str]) -> str:
    """`options` as one --driver-java-options value: Spark's launcher splits it at
    whitespace and takes a backslash as escaping the next character."""
    return " ".join(re.sub(r"""([\s\\"'])""", r"\\\1", option) for option in options)


def spark_home() -> str:
    """The Spark that spark_submit_path's script runs: $SPARK_HOME, else pyspark's own."""
    return os.environ.get("SPARK_HOME") or os.path.dirname(os.path.dirname(spark_submit_path()))


def job_file(job: str) -> str:
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), JOB_FILES[job])


def spark_submit_path() -> str:
    """The spark-submit that the installed pyspark ships (it runs the Spark of
    $SPARK_HOME if that is set, else its own)."""
    import pyspark  # noqa: PLC0415 - only here: every sharecoord command imports this module

    path = os.path.join(os.path.dirname(os.path.abspath(pyspark.__file__)), "bin", "spark-submit")
    if not os.access(path, os.X_OK):
        raise FileNotFoundError(f"{path}: pyspark's spark-submit is missing or not executable")
    return path


def build_py_files(zip_path: str) -> str:
    """A zip of SHIPPED_PACKAGES' sources, as installed next to this module."""
    with zipfile.ZipFile(zip_path, "w", zipfile.ZIP_DEFLATED) as archive:
        for package in SHIPPED_PACKAGES:
            package_dir = _package_dir(package)
            for name in sorted(os.listdir(package_dir)):
                if name.endswith(".py"):
                    arcname = f"{package.replace('.', '/')}/{name}"
                    archive.write(os.path.join(package_dir, name), arcname)
    return zip_path


def _package_dir(package: str) -> str:
    # Found, not imported: persistence.postgres imports psycopg, which a data
    # directory's job does not need.
    spec = importlib.util.find_spec(package)
    origin = "" if spec is None or spec.origin is None else spec.origin
    directory = os.path.dirname(os.path.abspath(origin))
    if not os.path.isfile(os.path.join(directory, "__init__.py")):
        raise FileNotFoundError(f"package {package}: no sources at {directory}")
    return directory


def executor_tree(master: str, compiled_root: str | None) -> str | None:
    """The checkout a local master's executors import in place of the zip: the one
    whose compiled modules the caller runs (`compiled_root`), when every shipped package
    is found there. The zip holds sources alone (Python imports no extension module
    from a zip); a compaction whose executors run the frame walk and the merge compiled
    took 0.83-0.91x the time (the bench's 10M records on local[2], 3 interleaved pairs,
    2026-11-28). Another master's executors get the zip as ever: their machines need
    not hold the build."""
    if compiled_root is None or not master.startswith("local"):
        return None
    root = os.path.abspath(compiled_root)
    for package in SHIPPED_PACKAGES:
        if _package_dir(package) != os.path.join(root, *package.split(".")):
            return None
    return root


def job_environment(master: str, tree: str | None = None) -> dict[str, str]:
    """The job's environment; with `tree` (executor_tree), the executors import it."""
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join([tree, *filter(None, [env.get("PYTHONPATH")])])
    # The driver runs here whatever the master (client mode): with this interpreter,
    # which has the project's dependencies, not whichever python3 is first on PATH.
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    if master.startswith("local"):
        # Driver and executors must share a Python minor version: make both this one.
        env["PYSPARK_PYTHON"] = sys.executable
        # Everything runs on this machine: bind to loopback (and skip the JVM's warning
        # about the hostname resolving to it).
        env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    return env
