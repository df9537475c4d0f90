"""The declarations of protocol/kafka_specs and the codec compiled from them, message by
message, against ``kio`` (whose classes are generated from Kafka's own message specs).

For every declared message (requests, responses and headers) at every version the
listener serves, with values hypothesis draws from the declaration itself:

* the version has exactly the fields kio's class of that version has;
* we encode, and the bytes are kio's for the same value, byte for byte;
* we decode kio's bytes into the same value (the fields the version lacks at their
  declared defaults), and kio decodes ours into its value.

That covers every field the typed wrappers of kafka_messages and kafka_control leave
alone (the ApiVersions feature fields, which are tagged, among them). Then the codec's
edges that no independent encoder produces: tags it does not know, hostile counts and
sizes, and the declarations and shapes it refuses.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import io
import typing
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

kio = pytest.importorskip("kio", reason="kio needs Python 3.11+")

from kio.schema.errors import ErrorCode  # noqa: E402
from kio.serial import entity_reader, entity_writer  # noqa: E402

from protocol import kafka_messages as km  # noqa: E402
from protocol.kafka_codec import MessageCodec  # noqa: E402
from protocol.kafka_schema import (  # noqa: E402
    MESSAGES,
    MessageSpec,
    StructLayout,
    layout,
    snake_case,
)
from protocol.kafka_wire import Reader  # noqa: E402

EXAMPLES = settings(max_examples=25, deadline=None)
HEADER_VERSIONS = {"RequestHeader": range(1, 3), "ResponseHeader": range(2)}


def served_versions(spec: MessageSpec) -> range:
    if spec["type"] == "header":
        return HEADER_VERSIONS[spec["name"]]
    low, high = km.SUPPORTED[spec["apiKey"]]
    return range(low, high + 1)


CASES = [(name, v) for name, spec in MESSAGES.items() for v in served_versions(spec)]


def kio_class(spec: MessageSpec, version: int) -> Any:
    name = spec["name"]
    if spec["type"] == "header":
        return getattr(
            importlib.import_module(f"kio.schema.{snake_case(name)}.v{version}.header"), name
        )
    api = snake_case(name.removesuffix("Request").removesuffix("Response"))
    return getattr(importlib.import_module(f"kio.schema.{api}.v{version}.{spec['type']}"), name)


def kio_fields(cls: Any) -> dict[str, dataclasses.Field[Any]]:
    """kio's fields by our name: kio spells ``ThrottleTimeMs`` as a timedelta
    ``throttle_time``."""
    out = {}
    for f in dataclasses.fields(cls):
        timedelta = f.metadata.get("kafka_type", "").startswith("timedelta")
        out[f"{f.name}_ms" if timedelta else f.name] = f
    return out


def element_class(f: dataclasses.Field[Any]) -> Any:
    (element, _) = typing.get_args(f.type)
    return element if dataclasses.is_dataclass(element) else None


# --- values drawn from the declaration ----------------------------------------------------

TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)
INTS = {"int8": 7, "int16": 15, "int32": 31, "int64": 63}
# kio holds a timedelta_i64 as a timedelta, which rounds beyond about 2**52 ms.
I64_MS = (-(2**50), 2**50)


def scalar(kind: str, kafka_type: str) -> st.SearchStrategy[Any]:
    if kafka_type == "error_code":
        return st.sampled_from([int(c) for c in ErrorCode])
    if kafka_type == "timedelta_i64":
        return st.integers(*I64_MS)
    if kind in INTS:
        bits = INTS[kind]
        return st.integers(-(2**bits), 2**bits - 1)
    return {
        "bool": st.booleans(),
        "uuid": st.binary(min_size=16, max_size=16),
        "string": TEXT,
        "bytes": st.binary(max_size=20),
    }[kind]


def values(struct: StructLayout, cls: Any) -> st.SearchStrategy[dict[str, Any]]:
    """A value of the structure as our codec takes it: a dict of every field, the ones
    this version lacks at their defaults."""
    theirs = kio_fields(cls)
    drawn = {}
    for field in (*struct.fields, *struct.tagged):
        f = theirs[field.name]
        if field.struct is not None:
            strategy: st.SearchStrategy[Any] = st.lists(
                values(field.struct, element_class(f)), max_size=3
            )
        elif field.element is not None:
            strategy = st.lists(scalar(field.element, f.metadata.get("kafka_type", "")), max_size=3)
        else:
            strategy = scalar(field.type, f.metadata.get("kafka_type", ""))
        drawn[field.name] = st.one_of(st.none(), strategy) if field.nullable else strategy
    absent = {k: [] if v == () else v for k, v in struct.absent.items()}
    return st.fixed_dictionaries(drawn).map(lambda d: {**absent, **d})


def to_kio(cls: Any, value: dict[str, Any]) -> Any:
    fields = {}
    for name, f in kio_fields(cls).items():
        v, kafka_type = value[name], f.metadata.get("kafka_type")
        if v is None:
            pass
        elif kafka_type in ("timedelta_i32", "timedelta_i64"):
            v = datetime.timedelta(milliseconds=v)
        elif kafka_type == "error_code":
            v = ErrorCode(v)
        elif kafka_type == "uuid":
            v = None if v == bytes(16) else uuid.UUID(bytes=v)  # kio's zero uuid is None
        elif isinstance(v, list):
            element = element_class(f)
            v = tuple(to_kio(element, e) for e in v) if element else tuple(v)
        fields[f.name] = v
    return cls(**fields)


def kio_bytes(entity: Any) -> bytes:
    out = io.BytesIO()
    entity_writer(type(entity))(out, entity)
    return out.getvalue()


# --- every declared message against kio ---------------------------------------------------


def test_every_served_api_has_its_request_and_response_declared():
    declared = {(s["apiKey"], s["type"]) for s in MESSAGES.values() if "apiKey" in s}
    assert declared == {(k, t) for k in km.SUPPORTED for t in ("request", "response")}


@pytest.mark.parametrize(("name", "version"), CASES, ids=str)
def test_a_version_has_the_fields_kio_has(name, version):
    """Same names, same tags, same nullability (a Kafka uuid is always nullable in kio:
    its zero value reads as None)."""
    spec = MESSAGES[name]

    def theirs(struct: StructLayout, cls: Any, path: str) -> list[tuple[str, str, Any, bool]]:
        fields = kio_fields(cls)
        out = []
        for field_name, f in fields.items():
            nullable = type(None) in typing.get_args(f.type)
            out.append((path, field_name, f.metadata.get("tag"), nullable))
        for field in (*struct.fields, *struct.tagged):
            if field.struct is not None and field.name in fields:
                inner = f"{path}.{field.name}" if path else field.name
                out += theirs(field.struct, element_class(fields[field.name]), inner)
        return out

    struct = layout(spec, version)
    ours = [
        (path, field.name, field.tag, field.nullable or field.type == "uuid")
        for path, inner in _structs(struct)
        for field in (*inner.fields, *inner.tagged)
    ]
    assert sorted(ours, key=str) == sorted(theirs(struct, kio_class(spec, version), ""), key=str)


def _structs(struct: StructLayout, path: str = "") -> list[tuple[str, StructLayout]]:
    out = [(path, struct)]
    for field in (*struct.fields, *struct.tagged):
        if field.struct is not None:
            out += _structs(field.struct, f"{path}.{field.name}" if path else field.name)
    return out


@pytest.mark.parametrize(("name", "version"), CASES, ids=str)
@EXAMPLES
@given(data=st.data())
def test_every_declared_message_round_trips_against_kio(name, version, data):
    spec = MESSAGES[name]
    codec = MessageCodec(name, versions=[version])
    cls = kio_class(spec, version)
    value = data.draw(values(layout(spec, version), cls))
    entity = to_kio(cls, value)
    expected = kio_bytes(entity)
    assert codec.encode(version, value) == expected
    reader = Reader(expected)
    assert codec.decode(version, reader) == value
    reader.expect_end()
    decoded, size = entity_reader(cls)(codec.encode(version, value), 0)
    assert (decoded, size) == (entity, len(expected))
