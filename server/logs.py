"""Structured logs for the ``sharecoord`` logger hierarchy, to stderr.

Two formats (``--log-format``):

* ``text``, one line per event for people::

      2025-01-31T12:00:00.123Z INFO sharecoord.log state partition loaded partition=3 records=120

* ``json``, one object per line for machines: ``ts``, ``level``, ``logger``, ``msg``, the
  event's fields, and ``exc`` (the trace) when an exception is logged.

Fields come from ``log_event(logger, "info", "loaded", partition=3)`` or from the
standard ``extra={"partition": 3}``. Modules log to ``logging.getLogger("sharecoord.<x>")``
and need nothing from here; ``setup_logging`` is called once by the CLI (again is
harmless: it replaces its own handler, never adds a second).

The daemon (``setup_daemon_logging``) also sends its libraries' loggers and Python's
warnings through the same format, and in JSON mode an uncaught exception too: a process
started with ``--log-format json`` prints nothing that is not a JSON line.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import threading
from collections.abc import Sequence
from datetime import datetime, timezone
from types import TracebackType
from typing import Any, TextIO

LOGGER_NAME = "sharecoord"
LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
FORMATS = ("text", "json")
_JSON_KEYS = ("ts", "level", "logger", "msg", "exc", "stack")
# What the daemon runs on, and Python's warnings: their lines come out in its format too.
DAEMON_LOGGERS = ("aiohttp", "asyncio", "py.warnings")
_FIELDS = "sharecoord_fields"  # the LogRecord attribute log_event puts its fields in
_RECORD_ATTRS = frozenset(
    logging.LogRecord("", 0, "", 0, "", (), None).__dict__.keys() | {"message", "asctime", _FIELDS}
)


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """Ours, so that a second ``setup_logging`` finds and replaces it."""


def setup_logging(
    level: str,
    fmt: str,
    *,
    stream: TextIO | None = None,
    other_loggers: Sequence[str] = (),
) -> logging.Logger:
    """Send the ``sharecoord`` loggers (and ``other_loggers``, e.g. ``"aiohttp.server"``)
    to stderr (or ``stream``) at ``level`` in format ``fmt`` (text or json)."""
    if level not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, got {level!r}")
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    formatter = JsonFormatter() if fmt == "json" else TextFormatter()
    for name in (LOGGER_NAME, *other_loggers):
        logger = logging.getLogger(name)
        for old in [h for h in logger.handlers if isinstance(h, _Handler)]:
            logger.removeHandler(old)
        handler = _Handler(stream if stream is not None else sys.stderr)
        handler.setFormatter(formatter)
        logger.addHandler(handler)
        logger.setLevel(LEVELS[level])
        # Our handler is the one that writes; the root logger must not print it again.
        logger.propagate = False
    return logging.getLogger(LOGGER_NAME)


def setup_daemon_logging(level: str, fmt: str, *, stream: TextIO | None = None) -> logging.Logger:
    """``setup_logging`` for ``sharecoord serve``: the libraries' loggers and warnings
    too, and in JSON mode uncaught exceptions as JSON records (with the trace in
    ``exc``) instead of a bare trace."""
    logging.captureWarnings(True)
    logger = setup_logging(level, fmt, stream=stream, other_loggers=DAEMON_LOGGERS)
    if fmt == "json":
        sys.excepthook = _log_uncaught
        threading.excepthook = _log_uncaught_in_thread
    return logger


def _log_uncaught(
    kind: type[BaseException], value: BaseException, trace: TracebackType | None
) -> None:
    logging.getLogger(LOGGER_NAME).critical("uncaught exception", exc_info=(kind, value, trace))


def _log_uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
    if args.exc_value is None or isinstance(args.exc_value, SystemExit):
        return
    thread = args.thread.name if args.thread is not None else "?"
    logging.getLogger(LOGGER_NAME).critical(
        "uncaught exception in thread %s",
        thread,
        exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
    )


def json_line(logger: str, level: str, msg: str, /, **fields: Any) -> str:
    """One JSON log line as ``JsonFormatter`` writes it, for what is printed without a
    configured logger (the "listening" line on stdout, an error before logging is set
    up)."""
    record = logging.LogRecord(logger, LEVELS[level], "", 0, msg, (), None)
    setattr(record, _FIELDS, fields)
    return JsonFormatter().format(record)


def log_event(
    logger: logging.Logger,
    level: str | int,
    msg: str,
    /,
    *,
    exc_info: bool | BaseException | None = None,
    **fields: Any,
) -> None:
    """Log ``msg`` with ``fields``: any names, even ``level`` or ones ``LogRecord`` uses."""
    levelno = LEVELS[level] if isinstance(level, str) else level
    if logger.isEnabledFor(levelno):
        logger.log(levelno, msg, exc_info=exc_info, extra={_FIELDS: fields}, stacklevel=2)


class ThrottledLog:
    """Log lines of one kind, at most ``burst`` per ``interval_s`` seconds: the ones over
    are only counted, and the interval ends with one line (``summary``) saying how many
    were not shown. A flood of events a client can cause (connections closed for bad
    frames) so costs a few lines a second, and the count loses none. The interval
    starts with the first event after a quiet one; it runs on the event loop's clock."""

    def __init__(
        self, logger: logging.Logger, level: str, summary: str, *, burst: int, interval_s: float
    ) -> None:
        self._logger = logger
        self._level = level
        self._summary = summary
        self._burst = burst
        self._interval_s = interval_s
        self._shown = 0
        self._hidden = 0
        self._timer: asyncio.TimerHandle | None = None

    def log(self, msg: str, /, **fields: Any) -> None:
        """One event: a line while the interval has room, else a count."""
        if self._timer is None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self._interval_s, self._end_interval)
        if self._shown < self._burst:
            self._shown += 1
            log_event(self._logger, self._level, msg, **fields)
        else:
            self._hidden += 1

    def close(self) -> None:
        """The end of the last interval, now (at shutdown)."""
        if self._timer is not None:
            self._timer.cancel()
        self._end_interval()

    def _end_interval(self) -> None:
        self._timer = None
        if self._hidden:
            log_event(self._logger, self._level, self._summary, not_shown=self._hidden)
        self._shown = self._hidden = 0


def event_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The fields of a record: ``extra=`` attributes, then ``log_event``'s."""
    fields = {k: v for k, v in record.__dict__.items() if k not in _RECORD_ATTRS}
    fields.update(getattr(record, _FIELDS, None) or {})
    return fields


def _timestamp(record: logging.LogRecord) -> str:
    moment = datetime.fromtimestamp(record.created, timezone.utc)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class TextFormatter(logging.Formatter):
    """``time LEVEL logger message key=value ...``; a trace follows on its own lines."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage().replace("\n", "\\n")
        parts = [_timestamp(record), record.levelname, record.name, message]
        parts.extend(f"{key}={_text_value(value)}" for key, value in event_fields(record).items())
        line = " ".join(parts)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return line


def _text_value(value: Any) -> str:
    text = str(value)
    if not text or any(c.isspace() or c in '"=\\' for c in text):
        return json.dumps(text, ensure_ascii=False)
    return text


class JsonFormatter(logging.Formatter):
    """One JSON object per line; a field named like a core key gets ``field_`` before it."""

    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in event_fields(record).items():
            document[f"field_{key}" if key in _JSON_KEYS else key] = value
        if record.exc_info:
            document["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            document["stack"] = self.formatStack(record.stack_info)
        return json.dumps(document, ensure_ascii=False, default=str)
