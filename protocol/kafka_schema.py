"""The Kafka messages the Kafka listener speaks, as declared in ``protocol/kafka_specs``,
read, checked and seen one version at a time. Pure, no I/O but reading those files.

Each message is declared once, in a JSON file of the shape of Kafka's own message specs
(the files Kafka generates its message classes from): ``name``, ``apiKey`` (requests and
responses), ``type`` (``request``, ``response`` or ``header``), ``validVersions``,
``flexibleVersions`` and ``fields``. A field has a ``name`` (Kafka's CamelCase; the codec
and the typed messages use its snake_case), a ``type``, the ``versions`` it exists in,
an ``about``, and may have:

* ``nullableVersions``: the versions in which it may be null (strings, bytes, arrays);
* ``flexibleVersions``: ``"none"`` keeps a string in its classic encoding even in a
  flexible version (the request header's client id, which a server reads before it
  knows how the rest of the header reads);
* ``taggedVersions`` and ``tag``: a tagged field, written among its structure's trailing
  tagged fields, and only when it differs from its default;
* ``default``: its value where a version does not carry it, and what a tagged field is
  compared to, written as Kafka writes it (``"-1"``, ``"false"``, ``"null"``); without
  one: 0, false, an empty string or bytes, an empty array, the zero uuid;
* ``fields``: for an array of structures (``"[]Name"``), the structure's fields.

Types: ``bool``, ``int8``, ``int16``, ``uint16``, ``int32``, ``uint32``, ``int64``,
``float64``, ``uuid``, ``string``, ``bytes``, and ``[]T`` of any of them or of a
structure. Versions are ``"N"``, ``"N-M"``, ``"N+"`` or ``"none"``.

``layout(spec, version)`` is what one version of a message is made of: its structures,
their fields in wire order, their known tagged fields, and the defaults of the fields
the version lacks. ``protocol.kafka_codec`` compiles a decoder and an encoder from it.

What a structure decodes into and encodes from is its ``Shape``, given per structure
path (``""`` the message, ``"topics"`` the elements of Topics, ``"topics.partitions"``,
...). Without one it is a dict keyed by the snake_case field names, holding every
declared field (a field the version lacks holds its default); an encoder reads such a
dict with the same defaults. With one, the decoder calls ``Shape.cls`` with the fields
of that class in its order (a field the version lacks is given its declared default),
and the encoder reads the fields as attributes. ``Shape.convert`` maps a field's wire
value to and from its typed value (a topic id's 16 bytes to and from its 22 characters);
``Shape.limits`` names, per array field, the method of the decoder's ``budget`` that is
given the array's length before a single element is read (and raises ``WireError``);
``Shape.skip`` names strings and bytes the caller has no use for: their lengths are
checked, their bytes neither decoded nor kept. A shape for a structure or a field the
message does not have is refused (``check_shapes``): it would silently not apply.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict, cast


class _FieldBase(TypedDict):
    name: str
    type: str
    versions: str
    about: str


class FieldSpec(_FieldBase, total=False):
    nullableVersions: str
    flexibleVersions: str
    taggedVersions: str
    tag: int
    default: str
    fields: list[FieldSpec]


class _MessageBase(TypedDict):
    name: str
    type: str
    validVersions: str
    flexibleVersions: str
    fields: list[FieldSpec]


class MessageSpec(_MessageBase, total=False):
    apiKey: int


class SpecError(ValueError):
    """A declaration the codec cannot use: a bug in ``protocol/kafka_specs``."""


# Fixed-width types: their struct format character.
FIXED = {
    "bool": "?",
    "int8": "b",
    "int16": "h",
    "uint16": "H",
    "int32": "i",
    "uint32": "I",
    "int64": "q",
    "float64": "d",
}
_VARIABLE = frozenset({"uuid", "string", "bytes"})
_NULLABLE = frozenset({"string", "bytes"})
_FIELD_KEYS = frozenset(FieldSpec.__required_keys__ | FieldSpec.__optional_keys__)
_MESSAGE_KEYS = frozenset(MessageSpec.__required_keys__ | MessageSpec.__optional_keys__)
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_SPECS = Path(__file__).parent / "kafka_specs"


def snake_case(name: str) -> str:
    """``ThrottleTimeMs`` -> ``throttle_time_ms``: the name the typed messages use."""
    return _CAMEL.sub("_", name).lower()


@dataclass(frozen=True, slots=True)
class Versions:
    """A version range: ``"2"``, ``"1-3"``, ``"3+"`` (``high`` None) or ``"none"``."""

    low: int
    high: int | None

    @classmethod
    def parse(cls, text: str) -> Versions:
        if text == "none":
            return cls(0, -1)
        match = re.fullmatch(r"(\d+)(\+|-(\d+))?", text)
        if match is None:
            raise SpecError(f"{text!r} is not a version range")
        low = int(match[1])
        if match[2] == "+":
            return cls(low, None)
        return cls(low, low if match[3] is None else int(match[3]))

    def __contains__(self, version: int) -> bool:
        return self.low <= version and (self.high is None or version <= self.high)

    def span(self) -> range:
        """Every version in the range (a closed one)."""
        if self.high is None:
            raise SpecError("an open version range has no end")
        return range(self.low, self.high + 1)


@dataclass(frozen=True, slots=True)
class FieldLayout:
    """One field as one version of its message has it."""

    name: str  # snake_case
    type: str  # as declared: "int32", "[]string", "[]PartitionData", ...
    element: str | None  # an array's element type; "struct" for structures
    struct: StructLayout | None  # an array of structures' element
    nullable: bool
    compact: bool  # the flexible encoding of strings, bytes and arrays
    tag: int | None  # a tagged field's tag
    default: object


@dataclass(frozen=True, slots=True)
class StructLayout:
    """A structure (the message itself, or an array's element) in one version."""

    path: str  # the snake_case field names leading to it; "" for the message
    fields: tuple[FieldLayout, ...]  # on the wire, in order
    tagged: tuple[FieldLayout, ...]  # known tagged fields, by tag
    absent: dict[str, object]  # declared, but not in this version: their defaults
    flexible: bool  # ends in tagged fields


def load_messages(directory: Path = _SPECS) -> dict[str, MessageSpec]:
    """Every declaration of ``protocol/kafka_specs``, checked, by name."""
    messages: dict[str, MessageSpec] = {}
    for path in sorted(directory.glob("*.json")):
        spec = cast(MessageSpec, json.loads(path.read_text(encoding="utf-8")))
        if spec.get("name") != path.stem:
            raise SpecError(f"{path.name} declares {spec.get('name')!r}")
        _check_message(spec)
        messages[spec["name"]] = spec
    return messages


def _check_message(spec: MessageSpec) -> None:
    unknown = set(spec) - _MESSAGE_KEYS
    missing = _MessageBase.__required_keys__ - set(spec)
    if unknown or missing:
        raise SpecError(f"{spec.get('name')}: unknown keys {unknown}, missing {missing}")
    Versions.parse(spec["validVersions"]).span()
    Versions.parse(spec["flexibleVersions"])
    _check_fields(spec["name"], spec["fields"])


def _check_fields(where: str, fields: list[FieldSpec]) -> None:
    names = [f["name"] for f in fields]
    if len(set(names)) != len(names):
        raise SpecError(f"{where}: a field name twice")
    tags = [f["tag"] for f in fields if "tag" in f]
    if len(set(tags)) != len(tags):
        raise SpecError(f"{where}: a tag twice")
    for field in fields:
        at = f"{where}.{field.get('name')}"
        unknown = set(field) - _FIELD_KEYS
        missing = _FieldBase.__required_keys__ - set(field)
        if unknown or missing:
            raise SpecError(f"{at}: unknown keys {unknown}, missing {missing}")
        if not snake_case(field["name"]).isidentifier():
            raise SpecError(f"{at}: not a name")
        for key in ("versions", "nullableVersions", "flexibleVersions", "taggedVersions"):
            if key in field:
                Versions.parse(field[key])
        if ("tag" in field) != ("taggedVersions" in field):
            raise SpecError(f"{at}: a tag needs taggedVersions, and taggedVersions a tag")
        kind = field["type"]
        element = kind[2:] if kind.startswith("[]") else None
        is_struct = element is not None and element not in FIXED and element not in _VARIABLE
        if is_struct != ("fields" in field):
            raise SpecError(f"{at}: fields are for arrays of structures, and only them")
        if element is None and kind not in FIXED and kind not in _VARIABLE:
            raise SpecError(f"{at}: unknown type {kind!r}")
        if "nullableVersions" in field and element is None and kind not in _NULLABLE:
            raise SpecError(f"{at}: a {kind} cannot be null")
        if "fields" in field:
            _check_fields(at, field["fields"])


def structures(spec: MessageSpec) -> dict[str, frozenset[str]]:
    """Every structure path of the message (``""``, ``"topics"``, ``"topics.partitions"``,
    ...) and the snake_case names of its fields, in any version."""
    out: dict[str, frozenset[str]] = {}

    def visit(path: str, fields: list[FieldSpec]) -> None:
        out[path] = frozenset(snake_case(f["name"]) for f in fields)
        for field in fields:
            if "fields" in field:
                name = snake_case(field["name"])
                visit(f"{path}.{name}" if path else name, field["fields"])

    visit("", spec["fields"])
    return out


def layout(spec: MessageSpec, version: int) -> StructLayout:
    """What ``version`` of the message is made of."""
    if version not in Versions.parse(spec["validVersions"]):
        raise SpecError(f"{spec['name']} has no version {version}")
    flexible = version in Versions.parse(spec["flexibleVersions"])
    return _struct("", spec["fields"], version, flexible)


def _struct(path: str, fields: list[FieldSpec], version: int, flexible: bool) -> StructLayout:
    wire: list[FieldLayout] = []
    tagged: list[FieldLayout] = []
    absent: dict[str, object] = {}
    for spec in fields:
        name = snake_case(spec["name"])
        if version not in Versions.parse(spec["versions"]):
            absent[name] = _default(spec, nullable=False)
            continue
        field = _field(f"{path}.{name}" if path else name, spec, version, flexible)
        is_tagged = flexible and version in Versions.parse(spec.get("taggedVersions", "none"))
        (tagged if is_tagged else wire).append(field)
    tagged.sort(key=lambda f: cast(int, f.tag))
    return StructLayout(path, tuple(wire), tuple(tagged), absent, flexible)


def _field(path: str, spec: FieldSpec, version: int, flexible: bool) -> FieldLayout:
    kind = spec["type"]
    nullable = version in Versions.parse(spec.get("nullableVersions", "none"))
    compact = flexible and version in Versions.parse(spec.get("flexibleVersions", "0+"))
    element = kind[2:] if kind.startswith("[]") else None
    struct = None
    if "fields" in spec:
        struct = _struct(path, spec["fields"], version, flexible)
        element = "struct"
    tagged = version in Versions.parse(spec.get("taggedVersions", "none"))
    return FieldLayout(
        name=path.rsplit(".", 1)[-1],
        type=kind,
        element=element,
        struct=struct,
        nullable=nullable,
        compact=compact,
        tag=spec["tag"] if flexible and tagged else None,
        default=_default(spec, nullable),
    )


def _default(spec: FieldSpec, nullable: bool) -> object:
    """The field's default, as a Python value."""
    kind, text = spec["type"], spec.get("default")
    if text == "null":
        if not nullable and "nullableVersions" not in spec:
            raise SpecError(f"{spec['name']}: null default of a field never nullable")
        return None
    if kind.startswith("[]"):
        if text is not None:
            raise SpecError(f"{spec['name']}: an array's default is empty or null")
        return ()
    if kind == "bool":
        if text not in (None, "true", "false"):
            raise SpecError(f"{spec['name']}: a bool's default is true or false")
        return text == "true"
    if kind == "float64":
        return float(text or 0)
    if kind in FIXED:
        return int(text or "0", 0)
    if kind == "uuid":
        return bytes(16)
    if kind == "bytes":
        return b""
    return text or ""


# --- the Python side ------------------------------------------------------------------------

Converter = tuple[Callable[[Any], Any], Callable[[Any], Any]]


@dataclass(frozen=True)
class Shape:
    """The Python side of one structure (module docstring)."""

    cls: Callable[..., Any] | None = None
    convert: Mapping[str, Converter] = dataclasses.field(default_factory=dict)
    limits: Mapping[str, str] = dataclasses.field(default_factory=dict)
    skip: frozenset[str] = frozenset()


Shapes = Mapping[str, Shape]  # by structure path


def class_fields(cls: Callable[..., Any]) -> list[tuple[str, bool]]:
    """``(name, has_default)`` of a msgspec Struct's or a dataclass's fields, in order."""
    names = getattr(cls, "__struct_fields__", None)
    if names is not None:
        first_default = len(names) - len(getattr(cls, "__struct_defaults__", ()))
        return [(name, i >= first_default) for i, name in enumerate(names)]
    if isinstance(cls, type) and dataclasses.is_dataclass(cls):
        missing = dataclasses.MISSING
        return [
            (f.name, f.default is not missing or f.default_factory is not missing)
            for f in dataclasses.fields(cls)
        ]
    raise SpecError(f"{cls!r} is neither a msgspec Struct nor a dataclass")


def check_shapes(spec: MessageSpec, shapes: Shapes) -> None:
    """Refuse a shape that would not apply: a misspelt limit would let a request past it."""
    paths = structures(spec)
    for path, shape in shapes.items():
        if path not in paths:
            raise SpecError(f"{spec['name']} has no structure {path!r}")
        named = {*shape.convert, *shape.limits, *shape.skip}
        if not named <= paths[path]:
            raise SpecError(f"{spec['name']} {path!r} has no {sorted(named - paths[path])}")


MESSAGES: dict[str, MessageSpec] = load_messages()
