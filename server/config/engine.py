"""The settings engine: what a setting is, how a command's settings become its flags,
and how each is resolved, first found wins, from

1. its flag (``--data-dir``),
2. the environment (``SHARECOORD_DATA_DIR``: ``SHARECOORD_`` + the flag's name in upper
   case with ``-`` as ``_``),
3. the ``--config`` TOML file (top-level key ``data_dir``),
4. its default.

Flags are declared with ``default=argparse.SUPPRESS`` so "not given" is visible. Every
value, whatever its source, goes through the setting's ``parse`` and ``validate``; an
error is a ``ConfigError`` naming the setting, where the value came from and what is
allowed (the CLI prints it and exits 2). Unknown keys in the file are errors too: a typo
must not be silently ignored.

A setting is declared once, either as a field of a command's typed config
(``setting(...)``, read back by ``settings_of``) or as a ``Setting`` in a command's
table; ``command`` records which commands take it, for the file's known keys and the
documentation (server/config/docs.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from server.config.parsers import anything

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib

ENV_PREFIX = "SHARECOORD_"
CONFIG_ENV_VAR = ENV_PREFIX + "CONFIG"

T = TypeVar("T")


class ConfigError(ValueError):
    """A setting that cannot be used; the message names it, its source and what is allowed."""


@dataclass(frozen=True)
class Kafka:
    """A setting's Kafka counterpart: its name and default in Kafka, and what differs
    (docs/semantics.md §11)."""

    name: str
    default: int
    note: str = ""


@dataclass(frozen=True)
class Setting:
    """One row of a command's config table.

    ``parse`` turns text (a flag, an env var, a string in the file) into a value;
    ``validate`` raises ``ValueError`` saying what is allowed. ``doc`` is the ``--help``
    text, ``meaning`` the (shorter, Markdown) one of the documentation's tables. ``flag``
    defaults to the name with ``-`` for ``_``. A ``required`` setting has no default:
    left unset, the command stops with a ConfigError.
    """

    name: str
    default: Any
    doc: str
    parse: Callable[[str], Any]
    validate: Callable[[Any], None] = anything
    kafka: Kafka | None = None
    flag: str = ""
    metavar: str | None = None
    meaning: str = ""
    required: bool = False

    def __post_init__(self) -> None:
        if not self.flag:
            object.__setattr__(self, "flag", "--" + self.name.replace("_", "-"))

    @property
    def env_var(self) -> str:
        return ENV_PREFIX + self.flag.lstrip("-").upper().replace("-", "_")

    @property
    def is_bool(self) -> bool:
        return isinstance(self.default, bool)

    @property
    def kafka_name(self) -> str | None:
        return self.kafka.name if self.kafka else None


# --- declaring settings as the fields of a typed config ----------------------------------

_DECLARATION = "sharecoord.setting"


def setting(
    default: T,
    parse: Callable[[str], T],
    validate: Callable[[Any], None] = anything,
    *,
    doc: str,
    meaning: str,
    kafka: Kafka | None = None,
    flag: str = "",
    metavar: str | None = None,
) -> T:
    """A dataclass field that declares a setting: the field's name is the setting's,
    its annotation the type of its value (mypy checks ``default`` and what ``parse``
    returns against it); the rest waits in the field's metadata for ``settings_of``."""
    declared = {
        "default": default,
        "doc": doc,
        "parse": parse,
        "validate": validate,
        "kafka": kafka,
        "flag": flag,
        "metavar": metavar,
        "meaning": meaning,
    }
    return dataclasses.field(default=default, metadata={_DECLARATION: declared})


def settings_of(config_class: type[Any]) -> tuple[Setting, ...]:
    """The settings a config dataclass declares, in field order; fields without a
    declaration (values derived from the settings) are not settings."""
    return tuple(
        Setting(name=field.name, **field.metadata[_DECLARATION])
        for field in dataclasses.fields(config_class)
        if _DECLARATION in field.metadata
    )


_COMMANDS: dict[str, tuple[Setting, ...]] = {}


def command(name: str, settings: Sequence[Setting]) -> tuple[Setting, ...]:
    """Record that ``sharecoord NAME`` takes these settings, in this order (its
    ``--help``'s), and return them as its table."""
    assert name not in _COMMANDS, f"command {name!r} declared twice"
    table = tuple(settings)
    _COMMANDS[name] = table
    return table


def commands() -> Mapping[str, tuple[Setting, ...]]:
    """Every command's table, by command (``"serve"``, ``"log dump"``, ...)."""
    return dict(_COMMANDS)


# --- argparse --------------------------------------------------------------------------


def add_arguments(
    parser: argparse.ArgumentParser, settings: Sequence[Setting], *, config_flag: bool = True
) -> None:
    """Add one ``--flag`` per setting (and ``--config FILE`` unless ``config_flag`` is
    false). Nothing given leaves no attribute on the namespace (``argparse.SUPPRESS``)."""
    if config_flag:
        parser.add_argument(
            "--config",
            metavar="FILE",
            default=argparse.SUPPRESS,
            help=f"TOML file of settings, top-level keys with '_' (env {CONFIG_ENV_VAR}).",
        )
    for setting in settings:
        help_text = _help(setting).replace("%", "%%")
        if setting.is_bool:
            parser.add_argument(
                setting.flag,
                dest=setting.name,
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS,
                help=help_text,
            )
        else:
            parser.add_argument(
                setting.flag,
                dest=setting.name,
                metavar=setting.metavar or "VALUE",
                default=argparse.SUPPRESS,
                help=help_text,
            )


def _help(setting: Setting) -> str:
    default = "required" if setting.required else f"default: {show_default(setting.default)}"
    parts = [default, f"env {setting.env_var}"]
    if setting.kafka_name:
        parts.append(f"Kafka: {setting.kafka_name}")
    return f"{setting.doc} ({'; '.join(parts)})"


def show_default(default: Any) -> str:
    if default is None:
        return "none"
    if isinstance(default, bool):
        return "true" if default else "false"
    return str(default)


# --- resolution ------------------------------------------------------------------------


def resolve(
    settings: Sequence[Setting],
    args: argparse.Namespace,
    environ: Mapping[str, str],
    config_file: str | None,
) -> dict[str, Any]:
    """The value of every setting: flag > env > file > default, parsed and validated."""
    values, _ = resolve_with_sources(settings, args, environ, config_file)
    return values


def config_file_of(args: argparse.Namespace, environ: Mapping[str, str]) -> str | None:
    """The file ``--config`` or ``SHARECOORD_CONFIG`` names, if any."""
    return getattr(args, "config", None) or environ.get(CONFIG_ENV_VAR) or None


def load_settings(
    settings: Sequence[Setting],
    args: argparse.Namespace,
    environ: Mapping[str, str] = os.environ,
    *,
    required: Sequence[str] = (),
) -> dict[str, Any]:
    """Resolve one command's settings (flag > env > file > default); a required setting
    (declared so, or named in ``required``) left unset is a ConfigError naming its flag
    and env var."""
    values = resolve(settings, args, environ, config_file_of(args, environ))
    for setting in settings:
        if (setting.required or setting.name in required) and values[setting.name] is None:
            raise ConfigError(f"{setting.flag} is required (or set {setting.env_var})")
    return values


def resolve_with_sources(
    settings: Sequence[Setting],
    args: argparse.Namespace,
    environ: Mapping[str, str],
    config_file: str | None,
) -> tuple[dict[str, Any], dict[str, str]]:
    """``resolve``'s values, and for each setting where it came from (``flag --x``,
    ``env var X``, ``key x in config file F`` or ``default``), for messages."""
    file_values = _read_config_file(config_file, settings) if config_file else {}
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for setting in settings:
        if hasattr(args, setting.name):
            raw: Any = getattr(args, setting.name)
            source = f"flag {setting.flag}"
        elif setting.env_var in environ:
            raw = environ[setting.env_var]
            source = f"env var {setting.env_var}"
        elif setting.name in file_values:
            raw = file_values[setting.name]
            source = f"key {setting.name} in config file {config_file}"
        else:
            values[setting.name] = setting.default
            sources[setting.name] = "default"
            continue
        values[setting.name] = _convert(setting, raw, source)
        sources[setting.name] = source
    return values, sources


def _convert(setting: Setting, raw: Any, source: str) -> Any:
    try:
        if isinstance(raw, str):
            value = setting.parse(raw)
        elif isinstance(raw, bool) and setting.is_bool:
            value = raw
        elif isinstance(raw, bool):  # TOML true where a non-boolean belongs
            value = setting.parse("true" if raw else "false")
        elif isinstance(raw, (int, float)):
            value = setting.parse(str(raw))
        else:
            raise ValueError("expected a string, number or boolean")
        if value is not None:
            setting.validate(value)
    except ValueError as exc:
        raise ConfigError(f"{setting.name}: {exc}; got {raw!r} from {source}") from None
    return value


def _read_config_file(path: str, settings: Sequence[Setting]) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            document: dict[str, Any] = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"config file {path}: cannot read it: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path}: not valid TOML: {exc}") from exc
    except UnicodeDecodeError as exc:  # tomllib decodes before it parses
        raise ConfigError(
            f"config file {path}: not valid TOML: not UTF-8 ({exc.reason} at byte {exc.start})"
        ) from exc
    # Keys of any command's settings are allowed (one file serves several commands);
    # anything else is a typo and refused.
    known = {s.name for table in _COMMANDS.values() for s in table} | {s.name for s in settings}
    unknown = sorted(set(document) - known)
    if unknown:
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(key.replace("-", "_"), known, n=1)
            hints.append(f"{key} (did you mean {close[0]}?)" if close else key)
        raise ConfigError(f"config file {path}: unknown key(s): {', '.join(hints)}")
    return document
