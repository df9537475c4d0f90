"""``python -m server.config FILE``: print the Markdown FILE with its settings tables
regenerated from the declarations (server/config/docs.py). ``make docs`` writes the
output aside, then renames it over FILE."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from server.config.docs import DocsError, regenerate


def main(argv: Sequence[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m server.config FILE.md", file=sys.stderr)
        return 2
    (path,) = argv
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        sys.stdout.write(regenerate(text))
    except (OSError, DocsError) as exc:
        print(f"{path}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
