"""The integer widths and string kinds of the wire schema, declared once.

Every integer field of Kafka's share-group state schemas has a fixed width (partition
and epochs int32, offsets int64, delivery_count int16, delivery_state int8, error codes
int16). These ``Annotated`` aliases carry the width as a ``msgspec.Meta`` bound, so the
decoders check it, and an ``expected`` phrase that error messages and the OpenAPI
document share.
"""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from protocol.topic_id import TOPIC_ID_PATTERN


def _int(bits: int) -> Meta:
    return Meta(
        ge=-(2 ** (bits - 1)),
        le=2 ** (bits - 1) - 1,
        extra={"expected": f"an integer in int{bits} range"},
    )


Int8 = Annotated[int, _int(8)]
Int16 = Annotated[int, _int(16)]
Int32 = Annotated[int, _int(32)]
Int64 = Annotated[int, _int(64)]

# The default of max_group_id_bytes (server.config): Kafka's group ids are short names
# (its topic names stop at 249 characters), and every record of the state log repeats
# its key's group id, so the limit bounds what one request can make the daemon write.
DEFAULT_MAX_GROUP_ID_BYTES = 255
# Checked after decoding (protocol.codec), in UTF-8 bytes and against the configured
# limit: a schema's maxLength counts characters. The schema says the default, in
# characters: a longer string is over the default in bytes too.
GroupId = Annotated[
    str,
    Meta(
        min_length=1,
        description="A share group's id: not empty, at most max_group_id_bytes bytes "
        f"in UTF-8 (default {DEFAULT_MAX_GROUP_ID_BYTES})",
        extra={"expected": "a non-empty string"},
        extra_json_schema={"maxLength": DEFAULT_MAX_GROUP_ID_BYTES},
    ),
]

TOPIC_ID_EXPECTED = "a Kafka topic id (22 base64url characters or a 36-character RFC 4122 UUID)"
# Checked after decoding (protocol.topic_id): msgspec cannot express "either spelling",
# and both spellings name the same topic.
TopicIdText = Annotated[
    str,
    Meta(
        description="Kafka Uuid: 22 base64url characters (as Kafka prints it) or the "
        "36-character RFC 4122 form; both name the same topic",
        extra={"expected": TOPIC_ID_EXPECTED, "check": "topic_id"},
        # The schema's pattern only: Meta(pattern=...) would also make msgspec check it,
        # a second check in front of the one decoding already does (above).
        extra_json_schema={"pattern": TOPIC_ID_PATTERN},
    ),
]
