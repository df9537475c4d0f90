"""The topic catalog file (server/catalog.py; docs/operations.md#deleting-a-topic):
format 1, with the topics being deleted in an optional ``deleting`` list."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from server.catalog import CATALOG_FILE, CatalogError, TopicCatalog
from tests.harness import OTHER_TOPIC, TOPIC


def write(data_dir: Path, document: object) -> None:
    (data_dir / CATALOG_FILE).write_text(json.dumps(document))


def on_disk(data_dir: Path) -> object:
    return json.loads((data_dir / CATALOG_FILE).read_text())


def test_a_file_written_before_deletions_were_kept_loads(tmp_path: Path) -> None:
    write(tmp_path, {"format": 1, "topics": {TOPIC: 3}})
    catalog = TopicCatalog.load(str(tmp_path))
    assert catalog.topics() == {TOPIC: 3}
    assert catalog.deleting() == frozenset()
    assert catalog.partition_count(TOPIC) == 3


def test_a_topic_being_deleted_is_not_registered(tmp_path: Path) -> None:
    write(tmp_path, {"format": 1, "topics": {TOPIC: 3}, "deleting": [OTHER_TOPIC]})
    catalog = TopicCatalog.load(str(tmp_path))
    assert catalog.deleting() == {OTHER_TOPIC}
    assert OTHER_TOPIC not in catalog
    assert catalog.partition_count(OTHER_TOPIC) is None


@pytest.mark.parametrize(
    ("document", "problem"),
    [
        ({"format": 1, "topics": {TOPIC: 0}}, "expected"),
        ({"format": 1, "topics": {}, "deleting": TOPIC}, "expected"),
        ({"format": 1, "topics": {}, "deleting": [1]}, "expected"),
        ({"format": 1, "topics": {TOPIC: 2}, "deleting": [TOPIC]}, "both registered and being"),
    ],
)
def test_a_malformed_file_is_refused_naming_it(tmp_path: Path, document, problem) -> None:
    write(tmp_path, document)
    with pytest.raises(CatalogError, match=problem) as refused:
        TopicCatalog.load(str(tmp_path))
    assert CATALOG_FILE in str(refused.value)


async def test_a_deletion_is_kept_in_the_file_until_it_ends(tmp_path: Path) -> None:
    catalog = TopicCatalog(str(tmp_path))
    await catalog.register(TOPIC, 4)
    await catalog.register(OTHER_TOPIC, 2)
    await catalog.begin_deletion(TOPIC)
    assert TOPIC not in catalog
    assert await asyncio.to_thread(on_disk, tmp_path) == {
        "format": 1,
        "topics": {OTHER_TOPIC: 2},
        "deleting": [TOPIC],
    }
    with pytest.raises(ValueError, match="being deleted"):
        await catalog.register(TOPIC, 4)
    reloaded = await asyncio.to_thread(TopicCatalog.load, str(tmp_path))
    assert (reloaded.topics(), reloaded.deleting()) == ({OTHER_TOPIC: 2}, {TOPIC})
    await catalog.end_deletions(frozenset({TOPIC}))
    # Nothing pending: the file is what a sharecoord without deletions wrote.
    assert await asyncio.to_thread(on_disk, tmp_path) == {"format": 1, "topics": {OTHER_TOPIC: 2}}
    await catalog.register(TOPIC, 1)
    assert catalog.partition_count(TOPIC) == 1
