"""References to documentation must not dangle (issue #15).

The code, the tests, the README and openapi.yaml cite the project's documents as
``docs/<name>.md``, optionally with a section (``docs/semantics.md §5.3``,
``docs/semantics.md §A.1 point 7``) or an anchor (``docs/api.md#security``). Every such
reference in a tracked text file must name a file that exists, a section that exists in
it (a heading that starts with the section's number: ``## 5.``, ``### 5.3``, ``## A.``,
``### A.1``), a numbered point that exists in that section, and an anchor that one of
its headings produces. The founders' input documents were never part of the repository,
so any reference to them by their old names is refused outright. Markdown links in the
Markdown files are checked the same way (file, then anchor).

Code is cited too: a dotted module name (``server.runtime``, ``protocol.shard.ShareKey``)
or a path in the repository (``persistence/fileops.py``, ``tests/reliability/``) in the
Markdown files and in the comments and strings of the Python files must name a module (and
a name it defines) or a file or directory that exists.

``scan`` does the work on any tree; the first test runs it on the repository, the others
on small made-up trees, so that the scanner is seen to fail where it should.
"""

from __future__ import annotations

import ast
import io
import re
import subprocess
import tokenize
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SUFFIXES = frozenset({".py", ".md", ".yaml", ".yml", ".toml"})
NAMES = frozenset({"Makefile", "Dockerfile"})

# docs/<name>.md, then optionally #anchor.
DOC_REF = re.compile(r"(?<![\w./-])docs/(?P<name>[\w.-]+)\.md(?:#(?P<anchor>[\w-]+))?")
# Sections following a reference: "§5.3", "§9, §A", "§1.2-§1.3", "§A.1 point 7". A
# comment marker may sit between a section and its point when a comment wraps.
SECTION = re.compile(
    r"[ \t]*(?:,|and|or|/|-|–)?[ \t]*§(?P<section>[0-9]+(?:\.[0-9]+)*|[A-Z](?:\.[0-9]+)*)"
    r"(?:[\s#]+points?[ \t]+(?P<point>[0-9]+))?"
)
# The input documents by their old names (outside the repository): always wrong.
OLD_NAME = re.compile(r"(?<![\w/.-])(?:API|DESIGN|SPEC|STYLE)\.md\b|\bSPEC[ ]§")
# A heading that starts with a section number: "5.", "5.3", "A.", "A.1".
SECTION_NUMBER = re.compile(r"(?:[0-9]+|[A-Z])(?:\.|(?:\.[0-9]+)+\.?)")
HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t]*#*[ \t]*$")
POINT = re.compile(r"^[ \t]*([0-9]+)\.[ \t]")
MD_LINK = re.compile(r"\[[^\]\n]*\]\((?P<target>[^)\s]+)\)")
# The project's own packages, cited as modules or as paths.
PACKAGES = (
    "protocol",
    "persistence",
    "server",
    "client",
    "spark_jobs",
    "kafka_peer",
    "bench",
    "tests",
)
MODULE_REF = re.compile(
    r"(?<![\w./\\-])(?P<dotted>(?:" + "|".join(PACKAGES) + r")(?:\.[A-Za-z_]\w*)+)"
)
PATH_REF = re.compile(
    r"(?<![\w./\\-])(?P<path>(?:" + "|".join((*PACKAGES, r"\.ci")) + r")/[\w./-]*\w)"
)
# "server.crt", "client.key", "tests.py", "server.properties": file names, not modules.
FILE_SUFFIXES = frozenset(
    {"py", "md", "toml", "yaml", "yml", "json", "txt", "log", "html", "png", "crt", "key"}
    | {"pem", "csr", "csv", "parquet", "tmp", "sock", "ini", "sh", "properties"}
)


@dataclass
class Section:
    points: set[int] = field(default_factory=set)


@dataclass
class Document:
    sections: dict[str, Section]
    anchors: set[str]


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as '-'."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def parse_document(text: str) -> Document:
    """The numbered sections (with their numbered points) and the anchors of a Markdown
    file; headings inside code fences do not count."""
    sections: dict[str, Section] = {}
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    current: Section | None = None
    in_fence = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        heading = HEADING.match(line)
        if heading:
            title = heading.group(2)
            anchor = slug(title)
            count = seen.get(anchor, 0)
            seen[anchor] = count + 1
            anchors.add(anchor if count == 0 else f"{anchor}-{count}")
            first = title.split()[0]
            if SECTION_NUMBER.fullmatch(first):
                current = sections.setdefault(first.rstrip("."), Section())
            else:
                current = None
            continue
        point = POINT.match(line)
        if point and current is not None:
            current.points.add(int(point.group(1)))
    return Document(sections, anchors)


def tracked_files(root: Path) -> list[str]:
    listing = subprocess.run(
        ["git", "ls-files", "-z"], cwd=root, capture_output=True, text=True, check=False
    )
    assert listing.returncode == 0, f"git ls-files failed in {root}: {listing.stderr}"
    return [name for name in listing.stdout.split("\0") if name]


def is_text_to_scan(name: str) -> bool:
    path = Path(name)
    return path.suffix in SUFFIXES or path.name in NAMES


def scan(root: Path, names: list[str]) -> list[str]:
    """Every dangling or forbidden reference in the files ``names`` (relative to ``root``),
    as ``file:line: reference: problem``."""
    documents: dict[Path, Document | None] = {}
    modules = _Modules(root)

    def document(path: Path) -> Document | None:
        if path not in documents:
            documents[path] = parse_document(path.read_text()) if path.is_file() else None
        return documents[path]

    problems = []
    for name in sorted(n for n in names if is_text_to_scan(n)):
        path = root / name
        if not path.is_file():
            continue
        text = path.read_text(errors="replace")

        def where(position: int, name: str = name, text: str = text) -> str:
            return f"{name}:{text.count(chr(10), 0, position) + 1}"

        for match in OLD_NAME.finditer(text):
            problems.append(
                f"{where(match.start())}: {match.group(0)}: an input document outside the "
                "repository; cite docs/api.md, docs/design.md or docs/semantics.md"
            )
        for match in DOC_REF.finditer(text):
            target = root / "docs" / f"{match.group('name')}.md"
            cited = f"docs/{match.group('name')}.md"
            doc = document(target)
            if doc is None:
                problems.append(f"{where(match.start())}: {cited}: no such file")
                continue
            anchor = match.group("anchor")
            if anchor is not None and anchor not in doc.anchors:
                problems.append(f"{where(match.start())}: {cited}#{anchor}: no such heading")
            position = match.end()
            while section_match := SECTION.match(text, position):
                position = section_match.end()
                number, point = section_match.group("section"), section_match.group("point")
                section = doc.sections.get(number)
                if section is None:
                    problems.append(
                        f"{where(match.start())}: {cited} §{number}: no section {number}"
                    )
                elif point is not None and int(point) not in section.points:
                    problems.append(
                        f"{where(match.start())}: {cited} §{number} point {point}: "
                        f"section {number} has no point {point}"
                    )
        if path.suffix == ".md":
            for match in MD_LINK.finditer(text):
                problems.extend(_link_problem(root, path, match, where, document))
        if path.suffix in (".md", ".py"):
            for position, cited in _code_references(text, python=path.suffix == ".py"):
                problem = _code_problem(root, cited, modules)
                if problem:
                    problems.append(f"{where(position)}: {cited}: {problem}")
    return problems


def _prose(text: str, python: bool) -> list[tuple[int, str]]:
    """The parts of a file that cite code in words: all of a Markdown file; the comments
    and strings of a Python file (its code names variables, not modules), with offsets."""
    if not python:
        return [(0, text)]
    starts = [0]
    for line in text.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    parts = []
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type in (tokenize.COMMENT, tokenize.STRING):
                row, column = token.start
                string = token.string
                if (
                    token.type == tokenize.STRING
                    and "f" in string.split("'")[0].split('"')[0].lower()
                ):
                    # An f-string's fields are code: blank them, keeping the offsets.
                    string = re.sub(r"\{[^{}]*\}", lambda m: " " * len(m.group(0)), string)
                parts.append((starts[row - 1] + column, string))
    except (tokenize.TokenError, SyntaxError):
        return [(0, text)]
    return parts


def _code_references(text: str, python: bool) -> list[tuple[int, str]]:
    found = []
    for offset, part in _prose(text, python):
        for match in MODULE_REF.finditer(part):
            dotted = match.group("dotted")
            if dotted.rsplit(".", 1)[1] not in FILE_SUFFIXES:
                found.append((offset + match.start(), dotted))
        for match in PATH_REF.finditer(part):
            after = part[match.end() : match.end() + 2]
            if after[:1] not in ("*", "{", "<") and after not in (".{", ".*", "-<", "_*"):
                found.append((offset + match.start(), match.group("path")))  # not a pattern
    return found


class _Modules:
    """What the tree's modules define, parsed once each."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._names: dict[Path, set[str]] = {}

    def module(self, parts: list[str]) -> Path | None:
        base = self.root.joinpath(*parts)
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
        return base if base.is_dir() else None

    def names(self, path: Path) -> set[str]:
        """Top-level names a module defines or imports, and every name defined or
        assigned as an attribute anywhere in it (methods, fields, ``self.x``)."""
        if path not in self._names:
            found: set[str] = set()
            if path.is_file():
                for node in ast.walk(ast.parse(path.read_text(), str(path))):
                    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                        found.add(node.name)
                    elif isinstance(node, ast.Name | ast.arg):
                        found.add(node.id if isinstance(node, ast.Name) else node.arg)
                    elif isinstance(node, ast.Attribute):
                        found.add(node.attr)
                    elif isinstance(node, ast.alias):
                        found.add((node.asname or node.name).split(".")[0])
            else:  # a directory without __init__.py: its modules
                found = {child.stem for child in path.iterdir()}
            self._names[path] = found
        return self._names[path]


def _code_problem(root: Path, cited: str, modules: _Modules) -> str | None:
    if "/" in cited:
        if (root / cited).exists() or (root / f"{cited}.py").exists():
            return None
        return "no such file or directory"
    parts = cited.split(".")
    for length in range(len(parts), 0, -1):
        module = modules.module(parts[:length])
        if module is not None:
            break
    else:
        return "no such module"
    rest = parts[length:]
    if not rest:
        return None
    if rest[0] not in modules.names(module):
        name = ".".join(parts[:length])
        return f"{name} has no module or name {rest[0]}"
    return None


def _link_problem(
    root: Path,
    path: Path,
    match: re.Match[str],
    where: Callable[[int], str],
    document: Callable[[Path], Document | None],
) -> list[str]:
    """What is wrong with one Markdown link (relative path, then anchor), if anything."""
    target = match.group("target")
    if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
        return []
    file_part, _, anchor = target.partition("#")
    linked = (path.parent / file_part).resolve() if file_part else path
    try:
        linked.relative_to(root.resolve())
    except ValueError:
        return [f"{where(match.start())}: link {target}: points outside the repository"]
    if not linked.exists():
        return [f"{where(match.start())}: link {target}: no such file"]
    if anchor and linked.suffix == ".md":
        doc = document(linked)
        if doc is not None and anchor not in doc.anchors:
            return [f"{where(match.start())}: link {target}: no such heading"]
    return []


# --- the repository ---------------------------------------------------------------------


def test_no_reference_to_documentation_dangles():
    problems = scan(REPO, tracked_files(REPO))
    assert not problems, "dangling documentation references:\n" + "\n".join(problems)


# --- the scanner on made-up trees ---------------------------------------------------------

# Spelled so that this file's own source holds no reference of either kind.
OLD = "API" + ".md"


def placeholders(text: str) -> str:
    return text.replace("SRV", "server").replace("TST", "tests").replace("CLI.", "client.")


def make_tree(root: Path, files: dict[str, str]) -> list[str]:
    for name, text in files.items():
        path = root / placeholders(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(placeholders(text).replace("DOCS/", "docs/").replace("OLD_DOC", OLD))
    return [placeholders(name) for name in files]


SEMANTICS = """\
# Semantics

## 5. The RPCs

### 5.3 Write

## A. Differences

### A.1 Precise points

1. First.
2. Second.

## Words and anchors
"""


def test_valid_references_pass(tmp_path):
    names = make_tree(
        tmp_path,
        {
            "docs/semantics.md": SEMANTICS,
            "docs/README.md": "[the rules](semantics.md#a1-precise-points), [top](#x)\n# X\n",
            "code.py": (
                "# DOCS/semantics.md §5.3 and DOCS/semantics.md §5, §A\n"
                "# DOCS/semantics.md §A.1 point 2; DOCS/semantics.md#words-and-anchors\n"
                '"""DOCS/semantics.md §A.1\n    point 1"""\n'
            ),
        },
    )
    assert scan(tmp_path, names) == []


def test_each_kind_of_dangling_reference_is_named_with_file_and_line(tmp_path):
    names = make_tree(
        tmp_path,
        {
            "docs/semantics.md": SEMANTICS,
            "lib/code.py": (
                "x = 1\n"
                "# see DOCS/gone.md\n"
                "# DOCS/semantics.md §9.9\n"
                "# DOCS/semantics.md §5.3, §B\n"
                "# DOCS/semantics.md §A.1 point 7\n"
                "# DOCS/semantics.md#no-such-heading\n"
                "# see OLD_DOC\n"
            ),
            "README.md": "[api](DOCS/missing.md) and [rules](DOCS/semantics.md#nope)\n",
            "data.bin": "DOCS/gone.md is not text we scan\n",
        },
    )
    expected = [
        "README.md:1: DOCS/missing.md: no such file",
        "README.md:1: DOCS/semantics.md#nope: no such heading",
        "README.md:1: link DOCS/missing.md: no such file",
        "README.md:1: link DOCS/semantics.md#nope: no such heading",
        f"lib/code.py:7: {OLD}: an input document outside the repository; cite "
        "docs/api.md, docs/design.md or docs/semantics.md",
        "lib/code.py:2: DOCS/gone.md: no such file",
        "lib/code.py:3: DOCS/semantics.md §9.9: no section 9.9",
        "lib/code.py:4: DOCS/semantics.md §B: no section B",
        "lib/code.py:5: DOCS/semantics.md §A.1 point 7: section A.1 has no point 7",
        "lib/code.py:6: DOCS/semantics.md#no-such-heading: no such heading",
    ]
    assert scan(tmp_path, names) == [line.replace("DOCS/", "docs/") for line in expected]


def test_the_old_spec_section_form_is_refused(tmp_path):
    names = make_tree(tmp_path, {"t.py": "# " + "SPEC" + " §5.3\n"})
    [problem] = scan(tmp_path, names)
    assert problem.startswith("t.py:1: SPEC")


def test_headings_in_code_fences_and_unnumbered_headings_are_not_sections():
    doc = parse_document("```sh\n# 7. not a heading\n```\n## A write, end to end\n## 3. Yes\n")
    assert set(doc.sections) == {"3"}
    assert doc.anchors == {"a-write-end-to-end", "3-yes"}


def test_slugs_follow_github():
    assert slug("5.1 Initialize (InitializeShareGroupState, apiKey 83)") == (
        "51-initialize-initializesharegroupstate-apikey-83"
    )
    assert slug("No replication: what a lost node or disk means") == (
        "no-replication-what-a-lost-node-or-disk-means"
    )


def test_modules_names_and_paths_cited_must_exist(tmp_path):
    # SRV, TST and CLI stand for package names, so that this file cites nothing itself.
    names = make_tree(
        tmp_path,
        {
            "SRV/__init__.py": "",
            "SRV/runtime.py": (
                "from protocol.records import ShareKey\n"
                "class PartitionRuntime:\n"
                "    def execute(self):\n"
                "        self.shard_writes = 1\n"
            ),
            "TST/fixtures/keep": "",
            "README.md": (
                "`SRV.runtime.PartitionRuntime.execute`, `SRV.runtime.ShareKey`,\n"
                "SRV/runtime.py, TST/fixtures/ and SRV/*.py, SRV.crt\n"
                "`SRV.gone`, `SRV.runtime.Missing`, SRV/gone.py\n"
            ),
            "SRV/code.py": (
                "# SRV.runtime.shard_writes; SRV/runtime.py\n"
                'x = f"{SRV.sockets[0]}"\n'
                "CLI.close()  # code, not a citation\n"
                '"""SRV.missing, and SRV/old.py"""\n'
            ),
        },
    )
    expected = [
        "README.md:3: SRV.gone: SRV has no module or name gone",
        "README.md:3: SRV.runtime.Missing: SRV.runtime has no module or name Missing",
        "README.md:3: SRV/gone.py: no such file or directory",
        "SRV/code.py:4: SRV.missing: SRV has no module or name missing",
        "SRV/code.py:4: SRV/old.py: no such file or directory",
    ]
    assert scan(tmp_path, names) == [placeholders(line) for line in expected]
