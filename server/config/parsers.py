"""What a setting's value may be: parsers turn text (a flag, an environment variable, a
string in the file) into a value, checks raise ``ValueError`` saying what is allowed.

Their messages end up after ``NAME: `` in the one line a bad value produces
(``partitions: must be between 1 and 10000; got '0' from flag --partitions``), so each
says what is allowed, not what went wrong inside.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
import socket
import urllib.parse
from collections.abc import Callable
from typing import Any

from protocol.topic_id import canonical_topic_id

_TRUE = ("true", "1", "yes")
_FALSE = ("false", "0", "no")
INT32_MAX = 2**31 - 1

# Listen hosts that mean "every interface": no client can connect to one.
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})


# --- parsers (text -> value) -----------------------------------------------------------


def parse_int(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise ValueError("expected an integer") from None


def parse_float(text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise ValueError("expected a number") from None
    if not math.isfinite(value):
        raise ValueError("expected a finite number")
    return value


def parse_bool(text: str) -> bool:
    word = text.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise ValueError("expected a boolean: true/false, 1/0 or yes/no")


def parse_path(text: str) -> str:
    return os.path.expanduser(text)


def parse_optional_path(text: str) -> str | None:
    """A path, or ``None`` for an empty value (so an env var can unset a file's path)."""
    return os.path.expanduser(text) if text.strip() else None


def parse_optional_text(text: str) -> str | None:
    """A value that may be unset: empty text (an env var or a file key) unsets it."""
    return text.strip() or None


def parse_text(text: str) -> str:
    return text.strip()


def parse_word(text: str) -> str:
    return text.strip().lower()


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[IPv6]:PORT`` → ``(host, port)``, the host without brackets."""
    text = text.strip()
    if text.startswith("["):
        end = text.find("]")
        if end < 0 or text[end + 1 : end + 2] != ":":
            raise ValueError("expected [IPV6]:PORT, e.g. [::1]:9095")
        host, port_text = text[1:end], text[end + 2 :]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{host!r} in brackets is not an IPv6 address") from None
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            raise ValueError("expected HOST:PORT, e.g. 127.0.0.1:9095")
        if ":" in host:
            raise ValueError("an IPv6 address goes in brackets, e.g. [::1]:9095")
        if not host or any(c.isspace() for c in host):
            raise ValueError("the host is empty or has spaces (0.0.0.0 or [::] listen everywhere)")
    if not (port_text.isascii() and port_text.isdigit()) or int(port_text) > 65535:
        raise ValueError("the port must be an integer 0..65535")
    return host, int(port_text)


def parse_url(text: str) -> str:
    """A daemon's base URL: ``http(s)://HOST[:PORT]``, or ``HOST:PORT`` meaning
    ``http://HOST:PORT`` (what ``--listen`` takes). Anything else is refused here, before
    a connection is tried: another scheme would only time out or fail obscurely."""
    text = text.strip()
    if "://" not in text:
        try:
            parse_listen(text)
        except ValueError:
            raise ValueError("expected http://HOST:PORT, https://HOST:PORT or HOST:PORT") from None
        text = "http://" + text
    try:
        parts = urllib.parse.urlsplit(text)
        port = parts.port  # parsed lazily: a bad port raises here
    except ValueError as exc:
        raise ValueError(f"not a URL ({exc})") from None
    if parts.scheme.lower() not in ("http", "https"):
        raise ValueError(f"the scheme must be http or https, not {parts.scheme}")
    if not parts.hostname:
        raise ValueError("the URL names no host")
    if port == 0:
        raise ValueError("port 0 cannot be connected to")
    if parts.query or parts.fragment:
        raise ValueError("a base URL has no query or fragment")
    return text.rstrip("/")


# Masters spark-submit accepts (Spark's SparkSubmitArguments / SparkContext): local
# ones, standalone clusters (several masters for HA), YARN and Kubernetes.
_SPARK_MASTER = re.compile(
    r"local(\[(\*|[1-9][0-9]*)(,[1-9][0-9]*)?\])?"
    r"|local-cluster\[[1-9][0-9]*,[1-9][0-9]*,[1-9][0-9]*\]"
    r"|spark://[^\s,:/]+:[0-9]+(,[^\s,:/]+:[0-9]+)*"
    r"|yarn"
    r"|k8s://\S+"
)


def parse_spark_master(text: str) -> str:
    master = text.strip()
    if not _SPARK_MASTER.fullmatch(master):
        raise ValueError("expected local, local[*], local[N], spark://HOST:PORT, yarn or k8s://URL")
    return master


def parse_partition_list(text: str) -> tuple[int, ...]:
    """``3``, ``3,5-7`` or ``0-24``: state partition numbers, as in a cluster file."""
    found: set[int] = set()
    for part in text.split(","):
        first, dash, last = (piece.strip() for piece in part.partition("-"))
        if not (first.isdigit() and (not dash or last.isdigit())):
            raise ValueError('expected partition numbers and ranges, e.g. "3" or "3,5-7"')
        low, high = int(first), int(last) if dash else int(first)
        if low > high:
            raise ValueError(f"range {part.strip()!r} is reversed")
        found.update(range(low, high + 1))
    return tuple(sorted(found))


# --- checks (value -> None or ValueError) ----------------------------------------------


def at_least(minimum: int | float) -> Callable[[Any], None]:
    def check(value: Any) -> None:
        if value < minimum:
            raise ValueError(f"must be >= {minimum}")

    return check


def between(low: int, high: int) -> Callable[[Any], None]:
    def check(value: Any) -> None:
        if not low <= value <= high:
            raise ValueError(f"must be between {low} and {high}")

    return check


def one_of(*choices: str) -> Callable[[Any], None]:
    def check(value: Any) -> None:
        if value not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")

    return check


def anything(value: Any) -> None:
    pass


def positive(value: Any) -> None:
    if value <= 0:
        raise ValueError("must be > 0")


def minus_one_or_positive(value: Any) -> None:
    if value != -1 and value < 1:
        raise ValueError("must be -1 (never) or >= 1")


def postgres_schema_name(value: Any) -> None:
    if not re.fullmatch(r"[a-z_][a-z0-9_]{0,40}", value):
        raise ValueError(
            "must be lower-case letters, digits and _ (not starting with a digit), at most "
            "41 characters"
        )


def non_empty(value: Any) -> None:
    if not value.strip():
        raise ValueError("must not be empty")


def topic_id(value: Any) -> None:
    canonical_topic_id(value)  # its ValueError says what a topic id looks like


def listen_address(value: Any) -> None:
    parse_listen(value)


def advertised_address(value: Any) -> None:
    host, port = parse_listen(value)
    if host in WILDCARD_HOSTS:
        raise ValueError(f"{host or 'an empty host'} is not an address a client can connect to")
    if port == 0:
        raise ValueError("the port must be 1..65535: clients connect to it")


def advertised_host(advertised_listener: str | None) -> str:
    """The host find-coordinator names for this node when its listen host is a
    wildcard: the --advertised-listener's, else this machine's host name (what Kafka
    advertises for a listener without a host)."""
    if advertised_listener is not None:
        return parse_listen(advertised_listener)[0]
    return socket.gethostname()
