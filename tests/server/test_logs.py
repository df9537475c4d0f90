"""Structured logs: text lines for people, JSON lines for machines, to stderr."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
import sys
import threading
import warnings
from collections.abc import Iterator

import pytest

from server.logs import (
    DAEMON_LOGGERS,
    ThrottledLog,
    json_line,
    log_event,
    setup_daemon_logging,
    setup_logging,
)

TEXT_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (\S+) (\S+) (.*)$")


@pytest.fixture(autouse=True)
def restore_loggers() -> Iterator[None]:
    """Each test configures logging afresh; put the loggers back as they were after."""
    saved = {}
    for name in ("sharecoord", "other.lib", *DAEMON_LOGGERS):
        logger = logging.getLogger(name)
        saved[name] = (list(logger.handlers), logger.level, logger.propagate)
    hooks = (sys.excepthook, threading.excepthook)
    yield
    logging.captureWarnings(False)
    sys.excepthook, threading.excepthook = hooks
    for name, (handlers, level, propagate) in saved.items():
        logger = logging.getLogger(name)
        logger.handlers[:] = handlers
        logger.setLevel(level)
        logger.propagate = propagate


def json_lines(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_json_lines_parse_and_carry_the_core_keys():
    stream = io.StringIO()
    setup_logging("info", "json", stream=stream)
    logging.getLogger("sharecoord.log").info("loaded %d records", 12)
    [event] = json_lines(stream)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", event["ts"])
    assert event == {
        "ts": event["ts"],
        "level": "info",
        "logger": "sharecoord.log",
        "msg": "loaded 12 records",
    }


def test_json_lines_carry_extra_fields():
    stream = io.StringIO()
    setup_logging("info", "json", stream=stream)
    logger = logging.getLogger("sharecoord.runtime")
    logger.warning("slow fsync", extra={"partition": 3, "seconds": 1.5})
    log_event(logger, "error", "reload failed", partition=4, name="clashes with LogRecord")
    first, second = json_lines(stream)
    assert (first["partition"], first["seconds"], first["level"]) == (3, 1.5, "warning")
    assert second["partition"] == 4
    assert second["name"] == "clashes with LogRecord"
    assert second["msg"] == "reload failed"


def test_json_fields_named_like_a_core_key_are_prefixed():
    stream = io.StringIO()
    setup_logging("info", "json", stream=stream)
    log_event(logging.getLogger("sharecoord"), "info", "m", level="mine", msg="also mine")
    [event] = json_lines(stream)
    assert (event["level"], event["msg"]) == ("info", "m")
    assert (event["field_level"], event["field_msg"]) == ("mine", "also mine")


def test_json_values_that_json_cannot_hold_become_strings():
    stream = io.StringIO()
    setup_logging("info", "json", stream=stream)
    log_event(logging.getLogger("sharecoord"), "info", "m", where=io, raw=b"\x00")
    [event] = json_lines(stream)
    assert event["where"] == str(io)
    assert event["raw"] == "b'\\x00'"


def test_json_exception_carries_the_trace_in_exc():
    stream = io.StringIO()
    setup_logging("info", "json", stream=stream)
    logger = logging.getLogger("sharecoord.commit")
    try:
        raise OSError("disk on fire")
    except OSError:
        logger.exception("fsync failed", extra={"partition": 9})
    [event] = json_lines(stream)
    assert event["level"] == "error"
    assert event["partition"] == 9
    assert event["exc"].startswith("Traceback (most recent call last):")
    assert "OSError: disk on fire" in event["exc"]
    assert "\n" not in stream.getvalue().rstrip("\n")


def test_log_event_passes_an_exception_on():
    stream = io.StringIO()
    setup_logging("info", "json", stream=stream)
    log_event(logging.getLogger("sharecoord"), "error", "m", exc_info=ValueError("bad"))
    [event] = json_lines(stream)
    assert "ValueError: bad" in event["exc"]


def test_text_is_one_line_time_level_logger_message_fields():
    stream = io.StringIO()
    setup_logging("info", "text", stream=stream)
    log_event(
        logging.getLogger("sharecoord.log"),
        "info",
        "loaded",
        partition=3,
        path="/data/a b",
        empty="",
        quote='say "hi"',
    )
    [line] = stream.getvalue().splitlines()
    match = TEXT_LINE.match(line)
    assert match is not None, line
    assert match.groups() == (
        "INFO",
        "sharecoord.log",
        'loaded partition=3 path="/data/a b" empty="" quote="say \\"hi\\""',
    )


def test_text_message_with_a_newline_stays_on_one_line():
    stream = io.StringIO()
    setup_logging("info", "text", stream=stream)
    logging.getLogger("sharecoord").info("two\nlines")
    assert stream.getvalue().count("\n") == 1
    assert "two\\nlines" in stream.getvalue()


def test_text_exception_trace_follows_the_line():
    stream = io.StringIO()
    setup_logging("info", "text", stream=stream)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("sharecoord").exception("failed")
    lines = stream.getvalue().splitlines()
    assert TEXT_LINE.match(lines[0]).groups()[:2] == ("ERROR", "sharecoord")
    assert lines[1] == "Traceback (most recent call last):"
    assert lines[-1] == "RuntimeError: boom"


def test_level_filters_events_below_it():
    stream = io.StringIO()
    setup_logging("warning", "json", stream=stream)
    logger = logging.getLogger("sharecoord.x")
    logger.info("hidden")
    log_event(logger, "debug", "hidden too")
    logger.warning("shown")
    assert [e["msg"] for e in json_lines(stream)] == ["shown"]


def test_setting_up_twice_does_not_duplicate_handlers():
    first, second = io.StringIO(), io.StringIO()
    setup_logging("info", "text", stream=first)
    setup_logging("info", "json", stream=second)
    assert len(logging.getLogger("sharecoord").handlers) == 1
    logging.getLogger("sharecoord").info("once")
    assert first.getvalue() == ""
    assert [e["msg"] for e in json_lines(second)] == ["once"]


def test_logs_go_to_stderr_by_default(capsys):
    setup_logging("info", "text")
    logging.getLogger("sharecoord.cli").info("to stderr")
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "sharecoord.cli to stderr" in captured.err


def test_the_root_logger_does_not_print_our_events_again(caplog):
    stream = io.StringIO()
    setup_logging("info", "json", stream=stream)
    with caplog.at_level(logging.INFO):
        logging.getLogger("sharecoord").info("once")
    assert caplog.records == []
    assert len(json_lines(stream)) == 1


def test_other_loggers_can_share_the_format():
    stream = io.StringIO()
    setup_logging("info", "json", stream=stream, other_loggers=("other.lib",))
    logging.getLogger("other.lib.server").error("handler failed")
    [event] = json_lines(stream)
    assert event["logger"] == "other.lib.server"


@pytest.mark.parametrize(("level", "fmt"), [("trace", "text"), ("info", "xml")])
def test_unknown_level_or_format_is_refused(level, fmt):
    with pytest.raises(ValueError, match="must be one of"):
        setup_logging(level, fmt)


# --- the daemon's setup: nothing it prints in JSON mode is anything but JSON ---------------


def test_the_daemon_s_libraries_and_warnings_log_in_its_format():
    stream = io.StringIO()
    setup_daemon_logging("info", "json", stream=stream)
    logging.getLogger("aiohttp.server").error("Error handling request")
    logging.getLogger("asyncio").warning("Task was destroyed but it is pending!")
    with warnings.catch_warnings():
        warnings.simplefilter("always")  # the suite turns warnings into errors
        warnings.warn("a library complains", UserWarning, stacklevel=1)
    events = json_lines(stream)
    assert [e["logger"] for e in events] == ["aiohttp.server", "asyncio", "py.warnings"]
    assert "a library complains" in events[2]["msg"]


def test_in_json_mode_an_uncaught_exception_is_a_json_record():
    stream = io.StringIO()
    setup_daemon_logging("info", "json", stream=stream)
    try:
        raise RuntimeError("escaped")
    except RuntimeError as exc:
        sys.excepthook(RuntimeError, exc, exc.__traceback__)
    thread = threading.Thread(target=lambda: 1 / 0, name="worker")
    thread.start()
    thread.join()
    first, second = json_lines(stream)
    assert (first["level"], first["msg"]) == ("critical", "uncaught exception")
    assert "RuntimeError: escaped" in first["exc"]
    assert second["msg"] == "uncaught exception in thread worker"
    assert "ZeroDivisionError" in second["exc"]


def test_in_text_mode_uncaught_exceptions_keep_python_s_own_report():
    before = sys.excepthook
    setup_daemon_logging("info", "text", stream=io.StringIO())
    assert sys.excepthook is before


def test_json_line_is_what_the_json_format_writes():
    record = json.loads(json_line("sharecoord.daemon", "info", "listening", url="http://h:1"))
    assert record == {
        "ts": record["ts"],
        "level": "info",
        "logger": "sharecoord.daemon",
        "msg": "listening",
        "url": "http://h:1",
    }
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", record["ts"])


async def test_a_throttled_log_shows_a_burst_an_interval_then_counts_the_rest():
    """ThrottledLog: the first ``burst`` events of an interval are lines, the rest only
    counted; the interval ends with one line saying how many were not shown, and the
    next event starts a new interval."""
    stream = io.StringIO()
    logger = setup_logging("info", "json", stream=stream).getChild("throttled")
    throttled = ThrottledLog(logger, "info", "more than shown", burst=3, interval_s=0.05)
    # All within one interval: its end is a timer, which cannot run between these calls.
    for n in range(10):
        throttled.log("closed", n=n)
    assert [(line["msg"], line["n"]) for line in json_lines(stream)] == [
        ("closed", 0),
        ("closed", 1),
        ("closed", 2),
    ]
    # The loop runs its timers in order of their time: this sleep ends after the
    # interval's timer ran, however busy the machine.
    await asyncio.sleep(0.1)
    assert json_lines(stream)[3]["msg"] == "more than shown"
    assert json_lines(stream)[3]["not_shown"] == 7
    throttled.log("closed", n=10)
    throttled.log("closed", n=11)
    throttled.close()  # an interval with nothing hidden ends without a line
    assert [line.get("n") for line in json_lines(stream)[4:]] == [10, 11]


async def test_a_throttled_log_closed_mid_interval_says_what_it_did_not_show():
    stream = io.StringIO()
    logger = setup_logging("info", "json", stream=stream).getChild("throttled")
    throttled = ThrottledLog(logger, "info", "more than shown", burst=1, interval_s=3600)
    for _ in range(5):
        throttled.log("closed")
    throttled.close()
    assert [(line["msg"], line.get("not_shown")) for line in json_lines(stream)] == [
        ("closed", None),
        ("more than shown", 4),
    ]
