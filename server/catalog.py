"""The optional topic catalog (docs/semantics.md §A): topic id -> partition count, and the
topics whose deletion has begun.

With ``--topic-catalog`` the shards check every key against it where Kafka checks its
metadata image (§5), answering UNKNOWN_TOPIC_OR_PARTITION for an unregistered topic or a
partition past its count. A topic being deleted is not registered: as in Kafka, where a
deleted topic leaves the metadata image before the share coordinator tombstones its
share-partitions, RPCs for it answer 3 from the moment its deletion begins, and it cannot
be registered again until the deletion has finished (server/service.py).

It lives in ``DATA/topics.json``::

    {"format": 1,
     "topics": {"<topic id>": <partition count>, ...},
     "deleting": ["<topic id>", ...]}

``deleting`` is written only while a deletion is unfinished; a file without it (every
file written before it existed) has none. The file is replaced atomically (temp file,
fsync, rename, fsync of the directory, through the daemon's FileOps so the fault tests
reach it); every change is made durable before it is visible. Reads are in memory and
cheap: the shards ask on every operation.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Iterable

from persistence.fileops import FileOps, write_file_atomically

_log = logging.getLogger("sharecoord.catalog")

CATALOG_FILE = "topics.json"
_FORMAT = 1
_EXPECTED = (
    '{"format": 1, "topics": {"<topic id>": <partition count>, ...}, '
    '"deleting": ["<topic id>", ...]} ("deleting" optional)'
)


class CatalogError(Exception):
    pass


class TopicCatalog:
    def __init__(
        self,
        data_dir: str,
        topics: dict[str, int] | None = None,
        deleting: Iterable[str] = (),
        *,
        fs: FileOps | None = None,
    ) -> None:
        self.path = os.path.join(data_dir, CATALOG_FILE)
        self._topics: dict[str, int] = dict(topics or {})
        self._deleting: frozenset[str] = frozenset(deleting)
        self._fs = fs or FileOps()
        # One change at a time: each writes the whole file.
        self._lock = asyncio.Lock()

    @classmethod
    def load(cls, data_dir: str, fs: FileOps | None = None) -> TopicCatalog:
        """Read the catalog file (blocking; call it off the loop). Missing = empty."""
        path = os.path.join(data_dir, CATALOG_FILE)
        try:
            with open(path, encoding="utf-8") as f:
                raw = json.load(f)
        except FileNotFoundError:
            return cls(data_dir, fs=fs)
        except (OSError, ValueError) as exc:
            raise CatalogError(f"cannot read the topic catalog {path}: {exc}") from exc
        topics = raw.get("topics") if isinstance(raw, dict) else None
        deleting = raw.get("deleting", []) if isinstance(raw, dict) else None
        if (
            not isinstance(topics, dict)
            or not all(isinstance(t, str) and type(n) is int and n >= 1 for t, n in topics.items())
            or not isinstance(deleting, list)
            or not all(isinstance(t, str) for t in deleting)
        ):
            raise CatalogError(f"the topic catalog {path} is malformed: expected {_EXPECTED}")
        both = sorted(set(deleting) & topics.keys())
        if both:
            raise CatalogError(
                f"the topic catalog {path} is malformed: topic(s) {', '.join(both)} both "
                "registered and being deleted"
            )
        return cls(data_dir, topics, deleting, fs=fs)

    # The shard's TopicMetadata.
    def partition_count(self, topic_id: str) -> int | None:
        return self._topics.get(topic_id)

    def __contains__(self, topic_id: str) -> bool:
        """Whether the topic is registered (a topic being deleted is not)."""
        return topic_id in self._topics

    def topics(self) -> dict[str, int]:
        return dict(self._topics)

    def deleting(self) -> frozenset[str]:
        """The topics whose deletion has begun and not finished."""
        return self._deleting

    async def register(self, topic_id: str, partition_count: int) -> None:
        """Register the topic or change its count; never one being deleted (ValueError)."""
        async with self._lock:
            if topic_id in self._deleting:
                raise ValueError(f"topic {topic_id} is being deleted")
            topics = {**self._topics, topic_id: partition_count}
            await self._replace(topics, self._deleting)
        _log.info("topic %s registered with %d partitions", topic_id, partition_count)

    async def begin_deletion(self, topic_id: str) -> None:
        """Unregister the topic and note that its deletion has begun."""
        async with self._lock:
            topics = {t: n for t, n in self._topics.items() if t != topic_id}
            await self._replace(topics, self._deleting | {topic_id})
        _log.info("topic %s unregistered: its deletion has begun", topic_id)

    async def end_deletions(self, topic_ids: frozenset[str]) -> None:
        """Forget the deletions of these topics: they are done."""
        async with self._lock:
            await self._replace(self._topics, self._deleting - topic_ids)
        _log.info("topic(s) %s deleted", ", ".join(sorted(topic_ids)))

    async def _replace(self, topics: dict[str, int], deleting: frozenset[str]) -> None:
        document: dict[str, object] = {"format": _FORMAT, "topics": topics}
        if deleting:
            document["deleting"] = sorted(deleting)
        data = json.dumps(document, indent=1, sort_keys=True).encode()
        await asyncio.to_thread(write_file_atomically, self._fs, self.path, data)
        self._topics, self._deleting = topics, deleting
