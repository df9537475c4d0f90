"""Bearer tokens and TLS contexts (docs/api.md#security).

* ``--auth-token-file``: every ``/v1/`` request carries ``Authorization: Bearer <token>``;
  ``check_bearer`` compares it in constant time.
* ``--tls-cert`` / ``--tls-key``: TLS 1.2 or newer; with ``--tls-client-ca`` the client
  must present a certificate that chains to that CA (mutual TLS).

Errors are ``SecurityError`` (a ``ValueError``) naming the file and what is wrong; the
CLI reports them as usage errors. Loading files happens once at start-up.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import ssl
import stat
from typing import NoReturn

_log = logging.getLogger("sharecoord.security")

# The token goes into an HTTP header: visible ASCII, no spaces.
_TOKEN_CHARS = frozenset(range(0x21, 0x7F))


class SecurityError(ValueError):
    """A token or TLS file that cannot be used; the message names the file."""


def load_token(path: str) -> bytes:
    """The bearer token in ``path``, surrounding whitespace (a final newline) removed."""
    try:
        with open(path, "rb") as f:
            token = f.read().strip()
            mode = os.fstat(f.fileno()).st_mode
    except OSError as exc:
        raise SecurityError(f"auth token file {path}: cannot read it: {_reason(exc)}") from exc
    if not token:
        raise SecurityError(f"auth token file {path}: it is empty")
    if not set(token) <= _TOKEN_CHARS:
        raise SecurityError(
            f"auth token file {path}: the token must be printable ASCII without spaces"
        )
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        _log.warning("auth token file %s is readable by group or others (chmod 600)", path)
    return token


def check_bearer(header: str | None, token: bytes) -> bool:
    """Whether an ``Authorization`` header value is ``Bearer <token>``.

    The scheme is case-insensitive (RFC 9110 §11.1) and parted from the token by spaces
    or tabs, never by other characters Python counts as whitespace (a NEL or a no-break
    space is part of what was sent, not a separator). Both sides are hashed to 32 bytes
    before ``hmac.compare_digest`` so neither the content nor the length of the token
    shows in the time taken.
    """
    if header is None:
        return False
    match = _BEARER.fullmatch(header.strip(" \t"))
    if match is None:
        return False
    try:
        # aiohttp decodes header bytes as UTF-8 with surrogateescape; undo that.
        offered = match.group(1).encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return False
    return hmac.compare_digest(hashlib.sha256(offered).digest(), hashlib.sha256(token).digest())


_BEARER = re.compile(r"bearer[ \t]+([^ \t]+)", re.IGNORECASE | re.ASCII)


def server_ssl_context(cert: str, key: str, client_ca: str | None = None) -> ssl.SSLContext:
    """TLS (1.2 or newer) for the listener; with ``client_ca``, mutual TLS: a client
    without a certificate chaining to that CA is refused in the handshake."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_cert_chain(context, cert, key)
    if client_ca is not None:
        _load_ca(context, client_ca, "TLS client CA")
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_ssl_context(
    cacert: str | None = None, cert: str | None = None, key: str | None = None
) -> ssl.SSLContext:
    """TLS for the CLI and the client: the server is verified against ``cacert`` (the
    system's CAs if none) with its host name checked; ``cert``/``key`` is the client's
    own certificate for mutual TLS (``key`` may be omitted if ``cert`` holds it)."""
    if key is not None and cert is None:
        raise SecurityError(f"TLS key {key} given without a certificate")
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if cacert is not None:
        _load_ca(context, cacert, "TLS CA")
    if cert is not None:
        _load_cert_chain(context, cert, key)
    return context


def _load_cert_chain(context: ssl.SSLContext, cert: str, key: str | None) -> None:
    _check_readable(cert, "TLS certificate")
    if key is not None:
        _check_readable(key, "TLS key")
    key_name = key if key is not None else cert

    def no_password() -> NoReturn:
        # Without this, OpenSSL would prompt on the terminal and block start-up.
        raise SecurityError(f"TLS key {key_name} is encrypted; give an unencrypted key")

    try:
        context.load_cert_chain(cert, key, password=no_password)
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc):
            raise SecurityError(f"TLS certificate {cert} and key {key_name} do not match") from exc
        raise SecurityError(
            f"TLS certificate {cert} / key {key_name}: not a PEM certificate and key: {exc}"
        ) from exc


def _load_ca(context: ssl.SSLContext, cafile: str, what: str) -> None:
    _check_readable(cafile, what)
    try:
        context.load_verify_locations(cafile=cafile)
    except ssl.SSLError as exc:
        raise SecurityError(f"{what} {cafile}: not a PEM certificate bundle: {exc}") from exc


def _check_readable(path: str, what: str) -> None:
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise SecurityError(f"{what} {path}: cannot read it: {_reason(exc)}") from exc


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)
