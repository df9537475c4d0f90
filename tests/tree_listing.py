"""A full listing of a directory tree, to show that something changed nothing in it."""

from __future__ import annotations

import hashlib
import os
import stat

# path below the root -> (mode, size, SHA-256 of the content; "" for a directory, the
# target for a symbolic link)
Listing = dict[str, tuple[int, int, str]]


def tree_listing(root: str | os.PathLike[str]) -> Listing:
    """Every directory, file and link under `root` (the root itself as "."), with its
    mode, size and content hash; empty when `root` does not exist."""
    root = os.fspath(root)
    if not os.path.lexists(root):
        return {}
    listing: Listing = {".": _entry(root)}
    for directory, names, files in os.walk(root):
        for name in names + files:
            path = os.path.join(directory, name)
            listing[os.path.relpath(path, root)] = _entry(path)
    return listing


def _entry(path: str) -> tuple[int, int, str]:
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        return info.st_mode, info.st_size, os.readlink(path)
    if stat.S_ISDIR(info.st_mode):
        return info.st_mode, 0, ""
    with open(path, "rb") as f:
        return info.st_mode, info.st_size, hashlib.sha256(f.read()).hexdigest()
