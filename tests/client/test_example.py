"""The documented example (``client`` module docstring, the README's client section)
runs as printed and prints what it says it prints, twice in a row."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import client
from tests.harness import REPO_ROOT


def example_and_output() -> tuple[str, str]:
    doc = client.__doc__ or ""
    code = doc.split("::\n", 1)[1].split("\nIt prints::\n", 1)[0]
    output = doc.split("It prints::\n", 1)[1].split("\n\n", 1)[0].strip("\n")
    return textwrap.dedent(code), textwrap.dedent(output) + "\n"


def test_the_documented_example_prints_what_it_says(shared_daemon):
    code, expected = example_and_output()
    assert 'ShareCoordinatorClient("http://127.0.0.1:9095")' in code  # make serve's address
    code = code.replace("http://127.0.0.1:9095", shared_daemon.url)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    for _ in range(2):  # running it again gives the same
        run = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
        )
        assert run.returncode == 0, run.stderr
        assert run.stdout == expected


def test_the_readme_shows_the_same_example_and_output():
    """The README's client section is the docstring's example, so both run as printed."""
    readme = (REPO_ROOT / "README.md").read_text()
    section = readme.split("## Using the client", 1)[1].split("\n## ", 1)[0]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    output = section.split("It prints:\n\n```\n", 1)[1].split("```", 1)[0]
    expected_code, expected_output = example_and_output()
    assert code.strip("\n") == expected_code.strip("\n")
    assert output == expected_output
