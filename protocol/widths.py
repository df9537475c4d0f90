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

NonEmptyString = Annotated[str, Meta(min_length=1, extra={"expected": "a non-empty string"})]

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
