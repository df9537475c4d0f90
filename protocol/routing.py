"""Which state partition owns a share-partition key (docs/semantics.md §1.2, §1.3).

The coordinator key is ``"<group_id>:<topic_id>:<partition>"`` with the topic id in its
22-char form; its Java ``String.hashCode`` (over UTF-16 code units, 32-bit wrapping),
made non-negative with Kafka's ``Utils.abs``, modulo the number of state partitions,
names the owner.
"""

from __future__ import annotations

import functools
import re
from types import FunctionType
from typing import Final

from protocol.topic_id import parse_key_topic_id

_INT32_MIN: Final = -(2**31)
_INT32_MAX: Final = 2**31 - 1
# Java's Integer.parseInt: an optional sign, then decimal digits, which may be any
# Unicode decimal digit (Character.digit) as long as it is one UTF-16 code unit.
_JAVA_INT = re.compile(r"[+-]?\d+")


def coordinator_key(group_id: str, topic_id: str, partition: int) -> str:
    """The coordinator key string of a share-partition (topic id in its 22-char form)."""
    return f"{group_id}:{topic_id}:{partition}"


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode``: ``h = 31*h + unit`` over UTF-16 code units, int32."""
    h = 0
    if text.isascii():
        for ch in text:
            h = (31 * h + ord(ch)) & 0xFFFFFFFF
    else:
        data = text.encode("utf-16-be", "surrogatepass")
        for i in range(0, len(data), 2):
            h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def kafka_abs(n: int) -> int:
    """Kafka's ``Utils.abs``: like ``abs`` but maps ``Integer.MIN_VALUE`` to 0."""
    return 0 if n == _INT32_MIN else abs(n)


def partition_for(group_id: str, topic_id: str, partition: int, num_partitions: int) -> int:
    """The state partition that owns ``(group_id, topic_id, partition)``.

    ``topic_id`` must be the canonical 22-char form (see ``protocol.topic_id``).
    """
    return partition_for_prefix(prefix_hash(group_id, topic_id), partition, num_partitions)


@functools.lru_cache(maxsize=65536)
def prefix_hash(group_id: str, topic_id: str) -> int:
    """Unsigned 32-bit Java hash of ``group_id:topic_id:``.

    Java's hash is a polynomial in 31, so hash(prefix + suffix) =
    hash(prefix) * 31**len(suffix) + hash(suffix): the part shared by every partition
    of a topic is hashed once (and a request's entries mostly share one topic)."""
    return java_string_hash(f"{group_id}:{topic_id}:") & 0xFFFFFFFF


def partition_for_prefix(prefix: int, partition: int, num_partitions: int) -> int:
    """``partition_for`` given ``prefix_hash(group_id, topic_id)``: the same polynomial
    rule once more, with the partition's digits hashed ahead for the usual numbers."""
    if 0 <= partition < _DIGITS_AHEAD:
        digits_hash, scale = _DIGITS_HASH[partition]
        if _INTERPRETED:
            h = (prefix * scale + digits_hash) & 0xFFFFFFFF
        else:
            # The same, with the prefix in 16-bit halves: compiled, a product of factors
            # below 2**30 stays a machine integer, where prefix * scale (a prefix up to
            # 2**32) takes Python's arbitrary-precision path, for the product and for the
            # mask (scale < 2**20: at most four digits). Interpreted, the halves cost more.
            high = ((prefix >> 16) * scale & 0xFFFF) << 16
            h = (high + (prefix & 0xFFFF) * scale + digits_hash) & 0xFFFFFFFF
    else:
        h = prefix
        for ch in str(partition):
            h = (31 * h + ord(ch)) & 0xFFFFFFFF
    if h & 0x80000000:
        h -= 1 << 32
        # Kafka's Utils.abs: like abs, but Integer.MIN_VALUE maps to 0.
        h = 0 if h == _INT32_MIN else -h
    return h % num_partitions


def _digits_hash(partition: int) -> tuple[int, int]:
    """Java's hash of ``str(partition)`` from 0, and 31 to the power of its length."""
    digits = str(partition)
    return java_string_hash(digits), 31 ** len(digits)


# Whether this module runs interpreted: a compiled module's functions are builtins.
_INTERPRETED: Final = isinstance(partition_for_prefix, FunctionType)

# Topics rarely have more partitions than this; past it, the digits are hashed per call.
_DIGITS_AHEAD: Final = 4096
_DIGITS_HASH: Final = [_digits_hash(p) for p in range(_DIGITS_AHEAD)]


def partition_for_key(key: str, num_partitions: int) -> int:
    """The state partition of a coordinator key string, after Kafka's parsing rules."""
    group_id, topic_id, partition = parse_coordinator_key(key)
    return partition_for(group_id, topic_id, partition, num_partitions)


def parse_coordinator_key(key: str) -> tuple[str, str, int]:
    """Parse ``group:topicId:partition`` as Kafka's share coordinator does (docs/semantics.md §1.2).

    Java ``String.split`` semantics (trailing empty tokens dropped), read from the right:
    the last token is the partition (a Java int), the one before it the topic id
    (base64url of 16 bytes), and all before those, ``:`` included, the group id exactly
    as given. It is not trimmed: the RPCs are routed on the group id they carry, so
    ``" g:T:0"`` must hash ``" g"`` to name the node that serves them. Only a group id
    that is empty or blank (nothing but characters up to U+0020, Java's ``trim``) is
    refused, as Kafka refuses it. Returns the group id, the topic id in its 22-char form
    and the partition; raises ``ValueError`` naming the problem.
    """
    tokens = key.split(":")
    while tokens and tokens[-1] == "":
        tokens.pop()
    if len(tokens) < 3:
        raise ValueError(f"a coordinator key has 3 parts separated by ':', got {len(tokens)}")
    group_id = ":".join(tokens[:-2])
    if not _java_trim(group_id):
        raise ValueError("the group id part of the key is empty or blank")
    topic_id = parse_key_topic_id(tokens[-2])
    if not _JAVA_INT.fullmatch(tokens[-1]) or not all(ord(c) < 0x10000 for c in tokens[-1]):
        raise ValueError("the partition part of the key is not an integer")
    partition = int(tokens[-1])
    if not _INT32_MIN <= partition <= _INT32_MAX:
        raise ValueError("the partition part of the key is out of int32 range")
    return group_id, topic_id, partition


def _java_trim(text: str) -> str:
    # Java's String.trim removes code points <= U+0020 at both ends, nothing else.
    start, end = 0, len(text)
    while start < end and text[start] <= " ":
        start += 1
    while end > start and text[end - 1] <= " ":
        end -= 1
    return text[start:end]
