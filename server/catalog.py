"""The optional topic catalog (docs/semantics.md §A): topic id -> partition count.

With ``--topic-catalog`` the shards check every key against it where Kafka checks its
metadata image (§5), answering UNKNOWN_TOPIC_OR_PARTITION for an unregistered topic or a
partition past its count. It lives in ``DATA/topics.json``, replaced atomically (temp
file, fsync, rename, fsync of the directory); every change is made durable before it is
visible. Reads are in memory and cheap: the shards ask on every operation.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os

_log = logging.getLogger("sharecoord.catalog")

CATALOG_FILE = "topics.json"
_FORMAT = 1


class CatalogError(Exception):
    pass


class TopicCatalog:
    def __init__(self, data_dir: str, topics: dict[str, int] | None = None) -> None:
        self.path = os.path.join(data_dir, CATALOG_FILE)
        self._topics: dict[str, int] = dict(topics or {})
        # One change at a time: each writes the whole file.
        self._lock = asyncio.Lock()

    @classmethod
    def load(cls, data_dir: str) -> TopicCatalog:
        """Read the catalog file (blocking; call it off the loop). Missing = empty."""
        path = os.path.join(data_dir, CATALOG_FILE)
        try:
            with open(path, encoding="utf-8") as f:
                raw = json.load(f)
        except FileNotFoundError:
            return cls(data_dir)
        except (OSError, ValueError) as exc:
            raise CatalogError(f"cannot read the topic catalog {path}: {exc}") from exc
        topics = raw.get("topics") if isinstance(raw, dict) else None
        if not isinstance(topics, dict) or not all(
            isinstance(t, str) and type(n) is int and n >= 1 for t, n in topics.items()
        ):
            raise CatalogError(
                f"the topic catalog {path} is malformed: expected "
                '{"format": 1, "topics": {"<topic id>": <partition count>, ...}}'
            )
        return cls(data_dir, topics)

    # The shard's TopicMetadata.
    def partition_count(self, topic_id: str) -> int | None:
        return self._topics.get(topic_id)

    def __contains__(self, topic_id: str) -> bool:
        return topic_id in self._topics

    def topics(self) -> dict[str, int]:
        return dict(self._topics)

    async def register(self, topic_id: str, partition_count: int) -> None:
        async with self._lock:
            updated = {**self._topics, topic_id: partition_count}
            await asyncio.to_thread(self._write, updated)
            self._topics = updated
        _log.info("topic %s registered with %d partitions", topic_id, partition_count)

    async def remove(self, topic_id: str) -> None:
        async with self._lock:
            updated = {t: n for t, n in self._topics.items() if t != topic_id}
            await asyncio.to_thread(self._write, updated)
            self._topics = updated
        _log.info("topic %s removed from the catalog", topic_id)

    def _write(self, topics: dict[str, int]) -> None:
        directory = os.path.dirname(self.path) or "."
        tmp = self.path + ".tmp"
        data = json.dumps({"format": _FORMAT, "topics": topics}, indent=1, sort_keys=True)
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
