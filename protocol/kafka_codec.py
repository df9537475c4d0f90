"""One generic codec for the Kafka messages declared in ``protocol/kafka_specs``: for each
message and version, a decoder and an encoder compiled from the declaration. Pure, no I/O.

``protocol.kafka_schema.layout`` says what one version of a message is made of; this
module writes the Python source of the function that reads it and of the one that writes
it, straight-line, as one would write them by hand, and compiles them once (when a
version is first used). That keeps the generic codec as fast as a hand-written one:

* consecutive fixed-width fields are one ``struct`` unpack or pack;
* a structure that ends in fixed-width fields and has no tagged fields packs its empty
  tagged fields as a pad byte of its last pack;
* arrays are plain loops, with nothing called per element but the element's own reads.

``decoder_source`` and ``encoder_source`` show the code. Flexible versions read and write
compact strings, bytes and arrays and end every structure in tagged fields; known tagged
fields are read (and written when they differ from their default), unknown ones skipped.

What a structure decodes into and encodes from is its ``protocol.kafka_schema.Shape``.

Decoding raises ``WireError`` for anything malformed, with the bounds of
``protocol.kafka_primitives.Reader``: a count larger than the bytes left, a varint of
more than five bytes, a string that is not UTF-8, a null where the version allows none,
a tagged field that does not fill exactly its size. Whether bytes are left after the
message is the caller's to check (``Reader.expect_end``): a header is followed by a body.
"""

from __future__ import annotations

import dataclasses
import linecache
import struct
from collections.abc import Callable, Iterable
from typing import Any

from protocol import kafka_primitives as primitives
from protocol.kafka_primitives import Reader, WireError
from protocol.kafka_schema import (
    FIXED,
    MESSAGES,
    FieldLayout,
    MessageSpec,
    Shape,
    Shapes,
    SpecError,
    StructLayout,
    Versions,
    check_shapes,
    class_fields,
    layout,
)

Decoder = Callable[[Reader, Any], Any]
Encoder = Callable[[bytearray, Any], None]
_AS_DICT = Shape()
_STRINGS = {  # (compact, nullable) -> the Reader method, the writer
    (True, False): ("compact_string", primitives.compact_string),
    (True, True): ("nullable_compact_string", primitives.nullable_compact_string),
    (False, False): ("string", primitives.string),
    (False, True): ("nullable_string", primitives.nullable_string),
}
_BYTES = {
    (True, False): ("compact_bytes", primitives.compact_bytes),
    (True, True): ("nullable_compact_bytes", primitives.nullable_compact_bytes),
    (False, False): ("bytes_", primitives.bytes_),
    (False, True): ("nullable_bytes", primitives.nullable_bytes),
}
_ARRAY_LENGTHS = {  # (compact, nullable) -> the Reader method
    (True, False): "compact_array_length",
    (True, True): "nullable_compact_array_length",
    (False, False): "array_length",
    (False, True): "nullable_array_length",
}
_CLASSIC_LENGTHS = {"string": "h", "bytes": "i"}
_I32 = struct.Struct(">i")


def _uuid(raw: bytes) -> bytes:
    if len(raw) != 16:
        raise ValueError(f"a uuid of {len(raw)} bytes")
    return raw


class _Source:
    """The lines of one generated function and the objects its names stand for."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.namespace: dict[str, object] = {"Reader": Reader, "WireError": WireError}
        self._names: dict[object, str] = {}
        self._count = 0

    def line(self, indent: int, text: str) -> None:
        self.lines.append("    " * indent + text)

    def var(self, hint: str) -> str:
        self._count += 1
        return f"{hint}{self._count}"

    def const(self, obj: object, hint: str, key: object = None) -> str:
        key = ("id", id(obj)) if key is None else key
        name = self._names.get(key)
        if name is None:
            name = self._names[key] = self.var(f"_{hint}")
            self.namespace[name] = obj
        return name

    def packer(self, fmt: str) -> str:
        return self.const(struct.Struct(">" + fmt), "S", ("struct", fmt))

    def literal(self, value: object) -> str:
        # An array's default (): decoded as a list of its own, never a shared one.
        return "[]" if value == () else repr(value)


# --- decoding ---------------------------------------------------------------------------


def decoder_source(
    spec: MessageSpec, version: int, shapes: Shapes
) -> tuple[str, dict[str, object]]:
    """The source of ``decode(r, budget)`` for ``version`` of the message, and its names."""
    check_shapes(spec, shapes)
    src = _Source()
    src.line(0, "def decode(r, budget):")
    src.line(1, "buf = r.buf")
    value = _decode_struct(src, layout(spec, version), shapes, "r", 1)
    src.line(1, f"return {value}")
    return "\n".join(src.lines) + "\n", src.namespace


def _decode_struct(
    src: _Source, struct_layout: StructLayout, shapes: Shapes, r: str, ind: int
) -> str:
    """Emit the reads of one structure; return the expression that builds it."""
    shape = shapes.get(struct_layout.path, _AS_DICT)
    values: dict[str, str] = {}
    run: list[FieldLayout] = []
    for field in (*struct_layout.fields, None):
        if field is not None and field.type in FIXED:
            run.append(field)
            continue
        skipped = field is not None and field.name in shape.skip
        # A skipped classic string's length has a fixed width: it joins the run.
        length = src.var("n") if skipped and field is not None and not field.compact else None
        if run or length:
            names = [src.var("v") for _ in run]
            fmt = "".join(FIXED[f.type] for f in run)
            if length is not None and field is not None:
                names.append(length)
                fmt += _CLASSIC_LENGTHS[field.type]
            size = struct.calcsize(">" + fmt)
            src.line(
                ind, f"{', '.join(names)}, = {src.packer(fmt)}.unpack_from(buf, {r}._take({size}))"
            )
            values.update((f.name, n) for f, n in zip(run, names, strict=False))
            run = []
        if skipped and field is not None:
            _skip_value(src, field, r, ind, length)
        elif field is not None:
            values[field.name] = _decode_value(src, field, shapes, shape, r, ind)
    if struct_layout.flexible:
        if struct_layout.tagged:
            _decode_tags(src, struct_layout, shapes, shape, r, ind, values)
        else:
            # None, the common case, without a call.
            pos = src.var("pos")
            src.line(ind, f"{pos} = {r}.pos")
            src.line(ind, f"if {pos} < {r}.end and buf[{pos}] == 0:")
            src.line(ind + 1, f"{r}.pos = {pos} + 1")
            src.line(ind, "else:")
            src.line(ind + 1, f"{r}.skip_tagged_fields()")
    for name, (decode, _) in shape.convert.items():
        if name in values:
            values[name] = f"{src.const(decode, 'dec')}({values[name]})"
    return _build(src, struct_layout, shape, values)


def _decode_value(
    src: _Source, field: FieldLayout, shapes: Shapes, shape: Shape, r: str, ind: int
) -> str:
    """Emit the read of one field; return the variable holding it."""
    out = src.var("v")
    kind, modes = field.type, (field.compact, field.nullable)
    if kind in FIXED:
        fmt = FIXED[kind]
        size = struct.calcsize(">" + fmt)
        src.line(ind, f"{out}, = {src.packer(fmt)}.unpack_from(buf, {r}._take({size}))")
    elif kind == "uuid":
        src.line(ind, f"{out} = {r}.uuid()")
    elif kind == "string":
        src.line(ind, f"{out} = {r}.{_STRINGS[modes][0]}()")
    elif kind == "bytes":
        src.line(ind, f"{out} = {r}.{_BYTES[modes][0]}()")
    else:
        n = src.var("n")
        src.line(ind, f"{n} = {r}.{_ARRAY_LENGTHS[modes]}()")
        limit = shape.limits.get(field.name)
        if limit is not None:
            src.line(ind, f"budget.{limit}({n})")
        if field.nullable:
            src.line(ind, f"{out} = None")
            src.line(ind, f"if {n} >= 0:")
            ind += 1
        src.line(ind, f"{out} = []")
        src.line(ind, f"for _ in range({n}):")
        if field.struct is not None:
            element = _decode_struct(src, field.struct, shapes, r, ind + 1)
        else:
            element_field = dataclasses.replace(field, type=field.type[2:], nullable=False)
            element = _decode_value(src, element_field, shapes, _AS_DICT, r, ind + 1)
        src.line(ind + 1, f"{out}.append({element})")
    return out


def _skip_value(src: _Source, field: FieldLayout, r: str, ind: int, n: str | None) -> None:
    """Emit a read past a string or bytes that checks its length (already read into ``n``
    for a classic one) and decodes nothing."""
    if field.type not in _CLASSIC_LENGTHS:
        raise SpecError(f"{field.name}: only strings and bytes are skipped")
    if n is None:
        n = src.var("n")
        src.line(ind, f"{n} = {r}.uvarint() - 1")
    if not (field.compact and field.nullable):
        src.line(ind, f"if {n} < {-1 if field.nullable else 0}:")
        src.line(ind + 1, f"raise WireError('a {field.name} length of %d' % {n})")
    src.line(ind, f"if {n} > 0:")
    src.line(ind + 1, f"{r}._take({n})")


def _decode_tags(
    src: _Source,
    struct_layout: StructLayout,
    shapes: Shapes,
    shape: Shape,
    r: str,
    ind: int,
    values: dict[str, str],
) -> None:
    """Emit the loop over a structure's tagged fields: known tags read, the rest skipped."""
    for field in struct_layout.tagged:
        values[field.name] = src.var("t")
        src.line(ind, f"{values[field.name]} = {src.literal(field.default)}")
    tag, size, start, sub = src.var("tag"), src.var("size"), src.var("start"), src.var("r")
    src.line(ind, f"for _ in range({r}.tag_count()):")
    src.line(ind + 1, f"{tag} = {r}.uvarint()")
    src.line(ind + 1, f"{size} = {r}.uvarint()")
    src.line(ind + 1, f"{start} = {r}._take({size})")
    for i, field in enumerate(struct_layout.tagged):
        src.line(ind + 1, f"{'if' if i == 0 else 'elif'} {tag} == {field.tag}:")
        src.line(ind + 2, f"{sub} = Reader(buf, {start}, {start} + {size})")
        value = _decode_value(src, field, shapes, shape, sub, ind + 2)
        src.line(ind + 2, f"{sub}.expect_end()")
        src.line(ind + 2, f"{values[field.name]} = {value}")


def _build(src: _Source, struct_layout: StructLayout, shape: Shape, values: dict[str, str]) -> str:
    if shape.cls is None:
        items = {name: src.literal(default) for name, default in struct_layout.absent.items()}
        items.update(values)
        return "{" + ", ".join(f"{name!r}: {value}" for name, value in items.items()) + "}"
    where = f"{getattr(shape.cls, '__name__', shape.cls)} at {struct_layout.path!r}"
    args = []
    left = dict(values)
    for name, has_default in class_fields(shape.cls):
        if name in left:
            args.append(left.pop(name))
        elif name in struct_layout.absent:
            args.append(src.literal(struct_layout.absent[name]))
        elif has_default:
            break
        else:
            raise SpecError(f"{where}: its field {name} is not declared")
    if left:
        raise SpecError(f"{where}: no field (or one after a default) for {sorted(left)}")
    return f"{src.const(shape.cls, 'C')}({', '.join(args)})"


# --- encoding ---------------------------------------------------------------------------


def encoder_source(
    spec: MessageSpec, version: int, shapes: Shapes
) -> tuple[str, dict[str, object]]:
    """The source of ``encode(out, value)`` for ``version`` of the message: it appends the
    encoded value to the bytearray ``out``."""
    check_shapes(spec, shapes)
    src = _Source()
    src.line(0, "def encode(out, value):")
    _encode_struct(src, layout(spec, version), shapes, "value", "out", 1)
    if len(src.lines) == 1:  # a version without fields (ApiVersions v0-v2's request)
        src.line(1, "pass")
    return "\n".join(src.lines) + "\n", src.namespace


def _encode_struct(
    src: _Source,
    struct_layout: StructLayout,
    shapes: Shapes,
    value: str,
    out: str,
    ind: int,
) -> None:
    shape = shapes.get(struct_layout.path, _AS_DICT)
    if shape.cls is not None:
        known = {name for name, _ in class_fields(shape.cls)}
        missing = [f.name for f in (*struct_layout.fields, *struct_layout.tagged)]
        missing = [name for name in missing if name not in known]
        if missing:
            raise SpecError(f"{shape.cls!r} at {struct_layout.path!r} has no {missing}")

    def read(field: FieldLayout) -> str:
        if shape.cls is None:
            expr = f"{value}.get({field.name!r}, {src.literal(field.default)})"
        else:
            expr = f"{value}.{field.name}"
        converter = shape.convert.get(field.name)
        return expr if converter is None else f"{src.const(converter[1], 'enc')}({expr})"

    # The empty tagged fields of a structure without known ones: one zero byte, packed
    # as the pad byte of a last run of fixed fields when there is one.
    empty_tags = struct_layout.flexible and not struct_layout.tagged
    run: list[FieldLayout] = []
    for field in (*struct_layout.fields, None):
        if field is not None and field.type in FIXED:
            run.append(field)
            continue
        if run:
            fmt = "".join(FIXED[f.type] for f in run)
            if field is None and empty_tags:
                fmt, empty_tags = fmt + "x", False
            args = ", ".join(read(f) for f in run)
            src.line(ind, f"{out} += {src.packer(fmt)}.pack({args})")
            run = []
        if field is not None:
            _encode_value(src, field, shapes, read(field), out, ind)
    if empty_tags:
        src.line(ind, f"{out} += b'\\x00'")
    elif struct_layout.tagged:
        _encode_tags(src, struct_layout, shapes, read, out, ind)


def _encode_value(
    src: _Source, field: FieldLayout, shapes: Shapes, expr: str, out: str, ind: int
) -> None:
    kind, modes = field.type, (field.compact, field.nullable)
    if kind in FIXED:
        src.line(ind, f"{out} += {src.packer(FIXED[kind])}.pack({expr})")
    elif kind == "uuid":
        src.line(ind, f"{out} += {src.const(_uuid, 'uuid')}({expr})")
    elif kind in ("string", "bytes"):
        writer = src.const((_STRINGS if kind == "string" else _BYTES)[modes][1], "w")
        if field.nullable:  # the common null, without a call
            x = src.var("x")
            null = b"\x00" if field.compact else (b"\xff\xff" if kind == "string" else b"\xff" * 4)
            src.line(ind, f"{x} = {expr}")
            src.line(ind, f"{out} += {null!r} if {x} is None else {writer}({x})")
        else:
            src.line(ind, f"{out} += {writer}({expr})")
    else:
        items, element = src.var("a"), src.var("e")
        src.line(ind, f"{items} = {expr}")
        if field.nullable:
            null = b"\x00" if field.compact else b"\xff" * 4
            src.line(ind, f"if {items} is None:")
            src.line(ind + 1, f"{out} += {null!r}")
            src.line(ind, "else:")
            ind += 1
        if field.compact:
            uvarint = src.const(primitives.uvarint, "uvarint")
            src.line(ind, f"{out} += {uvarint}(len({items}) + 1)")
        else:
            src.line(ind, f"{out} += {src.const(_I32, 'I32')}.pack(len({items}))")
        src.line(ind, f"for {element} in {items}:")
        if field.struct is not None:
            _encode_struct(src, field.struct, shapes, element, out, ind + 1)
        else:
            element_field = dataclasses.replace(field, type=field.type[2:], nullable=False)
            _encode_value(src, element_field, shapes, element, out, ind + 1)


def _encode_tags(
    src: _Source,
    struct_layout: StructLayout,
    shapes: Shapes,
    read: Callable[[FieldLayout], str],
    out: str,
    ind: int,
) -> None:
    """Emit the tagged fields that differ from their defaults, in tag order."""
    uvarint = src.const(primitives.uvarint, "uvarint")
    tags = src.var("tags")
    src.line(ind, f"{tags} = []")
    for field in struct_layout.tagged:
        x, sub = src.var("x"), src.var("sub")
        src.line(ind, f"{x} = {read(field)}")
        if field.default == ():
            src.line(ind, f"if {x}:")
        elif field.default is None:
            src.line(ind, f"if {x} is not None:")
        else:
            src.line(ind, f"if {x} != {src.literal(field.default)}:")
        src.line(ind + 1, f"{sub} = bytearray()")
        _encode_value(src, field, shapes, x, sub, ind + 1)
        src.line(ind + 1, f"{tags}.append(({field.tag}, {sub}))")
    tag, payload = src.var("tag"), src.var("payload")
    src.line(ind, f"{out} += {uvarint}(len({tags}))")
    src.line(ind, f"for {tag}, {payload} in {tags}:")
    src.line(ind + 1, f"{out} += {uvarint}({tag}) + {uvarint}(len({payload}))")
    src.line(ind + 1, f"{out} += {payload}")


# --- compiling --------------------------------------------------------------------------


def _compile(name: str, source: str, namespace: dict[str, object]) -> Any:
    # The source is kept where tracebacks look for it, so a bug shows its line.
    filename = f"<kafka {name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), namespace)
    return namespace[name.rsplit(" ", 1)[-1]]


def compile_decoder(spec: MessageSpec, version: int, shapes: Shapes | None = None) -> Decoder:
    source, namespace = decoder_source(spec, version, shapes or {})
    decoder: Decoder = _compile(f"{spec['name']} v{version} decode", source, namespace)
    return decoder


def compile_encoder(spec: MessageSpec, version: int, shapes: Shapes | None = None) -> Encoder:
    source, namespace = encoder_source(spec, version, shapes or {})
    encoder: Encoder = _compile(f"{spec['name']} v{version} encode", source, namespace)
    return encoder


class _Compiled(dict[int, Any]):
    """Version -> its compiled function, compiled on first use and kept: the few
    versions a daemon's clients use cost their compilation (about a millisecond each)
    once, the rest nothing."""

    def __init__(self, compile_one: Callable[[int], Any], versions: Iterable[int]) -> None:
        super().__init__()
        self._compile_one = compile_one
        self._versions = frozenset(versions)

    def __missing__(self, version: int) -> Any:
        if version not in self._versions:
            raise KeyError(version)
        function = self[version] = self._compile_one(version)
        return function


class MessageCodec:
    """A declared message's decoder and encoder for each of ``versions`` (by default
    every valid one), each compiled when first used."""

    __slots__ = ("decoders", "encoders", "name")

    def __init__(
        self, name: str, shapes: Shapes | None = None, versions: Iterable[int] | None = None
    ) -> None:
        spec = MESSAGES[name]
        shapes = shapes or {}
        check_shapes(spec, shapes)
        served = list(
            Versions.parse(spec["validVersions"]).span() if versions is None else versions
        )
        self.name = name
        self.decoders: dict[int, Decoder] = _Compiled(
            lambda v: compile_decoder(spec, v, shapes), served
        )
        self.encoders: dict[int, Encoder] = _Compiled(
            lambda v: compile_encoder(spec, v, shapes), served
        )

    def decode(self, version: int, reader: Reader, budget: object = None) -> Any:
        """The message at the reader's position; the reader is left after it."""
        return self.decoders[version](reader, budget)

    def encode(self, version: int, value: Any) -> bytes:
        out = bytearray()
        self.encoders[version](out, value)
        return bytes(out)
