"""Kafka topic ids (Uuid): the 22-character base64url form and the RFC 4122 form.

Kafka prints a topic id as the URL-safe base64 of its 16 big-endian bytes without
padding, always 22 characters (docs/semantics.md §1.2); callers may also send the 36-character
RFC 4122 form. Both name the same topic, so keys always use the canonical 22-char form.
"""

from __future__ import annotations

import base64
import binascii
import re

_BASE64URL_22 = re.compile(r"[A-Za-z0-9_-]{22}")
_RFC4122 = re.compile(
    r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
)
# Either spelling as a JSON Schema pattern (ECMA-262, where $ is the very end): what
# generated clients and test generators need to produce ids this module accepts.
TOPIC_ID_PATTERN = f"^(?:{_BASE64URL_22.pattern}|{_RFC4122.pattern})$"
# Java's URL decoder also accepts the padded form; find-coordinator keys follow Java.
_BASE64URL_PADDED = re.compile(r"[A-Za-z0-9_-]{22}(==)?")


def canonical_topic_id(text: str) -> str:
    """The 22-char form of a topic id given in either accepted spelling.

    Raises ``ValueError`` for anything else.
    """
    if len(text) == 22 and _BASE64URL_22.fullmatch(text):
        return _encode(base64.urlsafe_b64decode(text + "=="))
    if len(text) == 36 and _RFC4122.fullmatch(text):
        return _encode(bytes.fromhex(text.replace("-", "")))
    raise ValueError("not a Kafka topic id: expected 22 base64url characters or an RFC 4122 UUID")


def parse_key_topic_id(token: str) -> str:
    """The 22-char form of the topic id token of a coordinator key (docs/semantics.md §1.2).

    Follows Kafka's ``Uuid.fromString``: base64url that decodes to exactly 16 bytes,
    padding optional, nothing longer than 24 characters. Raises ``ValueError``.
    """
    if len(token) > 24 or not _BASE64URL_PADDED.fullmatch(token):
        raise ValueError("the topic id must be 16 bytes in base64url (22 characters)")
    return _encode(base64.urlsafe_b64decode(token[:22] + "=="))


def topic_id_bytes(topic_id: str) -> bytes:
    """The 16 bytes of a canonical topic id."""
    try:
        raw = base64.urlsafe_b64decode(topic_id + "==")
    except binascii.Error as exc:  # pragma: no cover - canonical ids always decode
        raise ValueError(str(exc)) from exc
    if len(raw) != 16:
        raise ValueError("a topic id is 16 bytes")
    return raw


def topic_id_to_rfc4122(topic_id: str) -> str:
    """The 36-char RFC 4122 spelling of a canonical topic id (for people reading logs)."""
    h = topic_id_bytes(topic_id).hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _encode(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")
