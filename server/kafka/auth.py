"""SASL on the Kafka listener: which mechanisms are on, the SCRAM credentials file, and
one connection's authentication state (docs/api.md#the-kafka-listener).

* ``--auth-token-file`` turns SASL/PLAIN on: the password is the bearer token, any
  non-empty user name is taken.
* ``--scram-credentials-file`` turns SCRAM-SHA-256 and SCRAM-SHA-512 on, for the users
  and mechanisms the file lists.
* Neither: the listener is open, as the HTTP API is without a token.

The credentials file is JSON, written only by ``sharecoord scram add`` / ``remove``
(atomically: a temporary file, fsync, rename, fsync of the directory), mode 0600::

    {"version": 1,
     "users": {"alice": {"SCRAM-SHA-256": {"salt": B64, "iterations": 8192,
                                          "stored_key": B64, "server_key": B64}}}}

It holds salted keys only (RFC 5802), never a password.

Before a connection has authenticated (when SASL is on), its requests are read only up
to ``KafkaAuth.handshake_frame_limit`` bytes: what the largest legitimate ApiVersions,
SaslHandshake or SaslAuthenticate needs, far below ``--max-body-bytes``.
"""

from __future__ import annotations

import base64
import binascii
import collections
import contextlib
import hashlib
import json
import os
import secrets
import stat
import tempfile
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from protocol.sasl import (
    MAX_ITERATIONS,
    MIN_ITERATIONS,
    PLAIN,
    SALT_BYTES,
    SCRAM_MECHANISMS,
    DecoyShape,
    SaslFailed,
    ScramCredential,
    ScramServer,
    check_plain,
    derive_credential,
)

FILE_VERSION = 1
Credentials = dict[str, dict[str, ScramCredential]]  # user -> mechanism -> credential

# The largest request a connection may send before it has authenticated, besides what
# the configured secrets add (``KafkaAuth.handshake_frame_limit``). A Kafka client's
# ApiVersions, SaslHandshake and SaslAuthenticate are a few hundred bytes: a request
# header with the client id, the software name and version, a mechanism name, a SCRAM
# message with two nonces and a proof, a PLAIN user name. 8 KiB leaves a client id and a
# user name several KiB each, and costs 8 MB for a thousand connections that send half.
HANDSHAKE_FRAME_BYTES = 8192
# A SCRAM user name is sent escaped (',' and '=' take three bytes) twice in the
# client-first message (n= and a=): at most six times its length.
_USER_NAME_COPIES = 6


class CredentialsError(ValueError):
    """A credentials file that cannot be used; the message names it."""


def load_credentials(path: str) -> Credentials:
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise CredentialsError(
            f"SCRAM credentials file {path}: cannot read it: {exc.strerror or exc}"
        ) from exc
    if not raw.strip():
        return {}
    try:
        return _parse(json.loads(raw))
    except (ValueError, TypeError, KeyError) as exc:
        raise CredentialsError(f"SCRAM credentials file {path}: {exc}") from None


def _b64(value: Any, what: str) -> bytes:
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error:
        raise ValueError(f"{what} is not base64") from None


def _parse(document: Any) -> Credentials:
    if not isinstance(document, dict) or document.get("version") != FILE_VERSION:
        raise ValueError(
            f'not a credentials file of version {FILE_VERSION} ({{"version": 1, ...}})'
        )
    users = document.get("users", {})
    if not isinstance(users, dict):
        raise ValueError("users must be an object")
    out: Credentials = {}
    for user, mechanisms in users.items():
        if not isinstance(mechanisms, dict):
            raise ValueError(f"user {user!r}: expected an object of mechanisms")
        for mechanism, entry in mechanisms.items():
            where = f"user {user!r}, {mechanism}"
            if mechanism not in SCRAM_MECHANISMS:
                raise ValueError(f"{where}: unknown mechanism (use {', '.join(SCRAM_MECHANISMS)})")
            if not isinstance(entry, dict):
                raise ValueError(f"{where}: expected an object")
            iterations = entry.get("iterations")
            if (
                not isinstance(iterations, int)
                or isinstance(iterations, bool)
                or not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS
            ):
                raise ValueError(
                    f"{where}: iterations must be an integer {MIN_ITERATIONS}..{MAX_ITERATIONS}"
                )
            out.setdefault(user, {})[mechanism] = ScramCredential(
                _b64(entry.get("salt"), f"{where}: salt"),
                iterations,
                _b64(entry.get("stored_key"), f"{where}: stored_key"),
                _b64(entry.get("server_key"), f"{where}: server_key"),
            )
    return out


def dump_credentials(credentials: Credentials) -> bytes:
    def enc(raw: bytes) -> str:
        return base64.b64encode(raw).decode("ascii")

    users = {
        user: {
            mechanism: {
                "salt": enc(c.salt),
                "iterations": c.iterations,
                "stored_key": enc(c.stored_key),
                "server_key": enc(c.server_key),
            }
            for mechanism, c in sorted(mechanisms.items())
        }
        for user, mechanisms in sorted(credentials.items())
    }
    return (json.dumps({"version": FILE_VERSION, "users": users}, indent=1) + "\n").encode()


def write_credentials(path: str, credentials: Credentials) -> None:
    """Replace the file atomically: readers see the old file or the new one, whole."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, temporary = tempfile.mkstemp(prefix=".scram-", dir=directory)
    try:
        os.fchmod(fd, stat.S_IRUSR | stat.S_IWUSR)
        with os.fdopen(fd, "wb") as f:
            f.write(dump_credentials(credentials))
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def decoy_key(credentials: Credentials) -> bytes:
    """The key unknown users' salts are derived with: a digest of every stored
    ServerKey. As secret as they are (no client ever sees one), the same at every start
    while the file is unchanged, and nothing to keep anywhere else. With no credentials
    there is no name to hide, and no secret is needed."""
    digest = hashlib.sha256(b"sharecoord SCRAM decoy salts\x00")
    for user in sorted(credentials):
        for mechanism in sorted(credentials[user]):
            digest.update(credentials[user][mechanism].server_key)
    return digest.digest()


def decoy_shape(key: bytes, credentials: Credentials, mechanism: str) -> DecoyShape:
    """The decoy of one mechanism looks like most of its real users: their most common
    salt length and iteration count (``scram add --iterations`` may differ per user),
    else those of the file's other mechanism, else what ``scram add`` writes."""
    shapes: collections.Counter[tuple[int, int]] = collections.Counter()
    for mechanisms in credentials.values():
        credential = mechanisms.get(mechanism)
        if credential is not None:
            shapes[len(credential.salt), credential.iterations] += 1
    if not shapes:
        for mechanisms in credentials.values():
            for credential in mechanisms.values():
                shapes[len(credential.salt), credential.iterations] += 1
    if not shapes:
        return DecoyShape(key)
    (salt_bytes, iterations), _ = shapes.most_common(1)[0]
    return DecoyShape(key, salt_bytes, iterations)


@dataclass(frozen=True)
class KafkaAuth:
    """What the listener needs to authenticate clients; built once at start."""

    token: bytes | None = None
    credentials: Credentials = field(default_factory=dict)
    scram_enabled: bool = False

    @property
    def required(self) -> bool:
        return self.token is not None or self.scram_enabled

    @property
    def mechanisms(self) -> list[str]:
        out = [PLAIN] if self.token is not None else []
        return out + (list(SCRAM_MECHANISMS) if self.scram_enabled else [])

    def lookup(self, user: str, mechanism: str) -> ScramCredential | None:
        return self.credentials.get(user, {}).get(mechanism)

    @cached_property
    def decoys(self) -> dict[str, DecoyShape]:
        """Each SCRAM mechanism's decoy for unknown users."""
        key = decoy_key(self.credentials)
        return {m: decoy_shape(key, self.credentials, m) for m in SCRAM_MECHANISMS}

    @cached_property
    def handshake_frame_limit(self) -> int:
        """The largest frame read before authentication: ``HANDSHAKE_FRAME_BYTES`` plus
        what the longest secret takes (a PLAIN token, six copies of the longest SCRAM
        user name), so that every configured credential fits."""
        longest_user = max((len(user.encode("utf-8")) for user in self.credentials), default=0)
        token = len(self.token) if self.token is not None else 0
        return HANDSHAKE_FRAME_BYTES + token + _USER_NAME_COPIES * longest_user


class SaslSession:
    """One connection's authentication: handshake, then one or two tokens."""

    def __init__(self, auth: KafkaAuth) -> None:
        self.auth = auth
        self.authenticated = not auth.required
        self.mechanism: str | None = None
        self.user: str | None = None
        self._scram: ScramServer | None = None

    def handshake(self, mechanism: str) -> bool:
        if mechanism not in self.auth.mechanisms:
            return False
        self.mechanism = mechanism
        if mechanism != PLAIN:
            self._scram = ScramServer(
                mechanism,
                self.auth.lookup,
                secrets.token_urlsafe(24),
                self.auth.decoys[mechanism],
            )
        return True

    def authenticate(self, token: bytes) -> bytes:
        """The server's token; raises ``SaslFailed``. Sets ``authenticated`` when done."""
        if self.mechanism == PLAIN:
            assert self.auth.token is not None
            self.user = check_plain(token, self.auth.token)
            self.authenticated = True
            return b""
        scram = self._scram
        if scram is None:
            raise SaslFailed("SaslAuthenticate before a SaslHandshake")
        answer = scram.step(token)
        if scram.done:
            self.user = scram.user
            self.authenticated = True
        return answer


# --- `sharecoord scram add / remove` ------------------------------------------------------


def _existing(path: str) -> Credentials:
    """The file's credentials, or none when it does not exist yet."""
    if not os.path.exists(path):
        return {}
    return load_credentials(path)


def add_user(path: str, user: str, mechanism: str, password: bytes, iterations: int) -> None:
    """Add or replace one user's credential for one mechanism (a fresh 32-byte salt)."""
    credentials = _existing(path)
    salt = secrets.token_bytes(SALT_BYTES)
    credential = derive_credential(mechanism, password, salt, iterations)
    credentials.setdefault(user, {})[mechanism] = credential
    write_credentials(path, credentials)


def remove_user(path: str, user: str, mechanism: str | None) -> bool:
    """Remove a user (one mechanism, or all); whether there was anything to remove."""
    credentials = _existing(path)
    mechanisms = credentials.get(user)
    if mechanisms is None or (mechanism is not None and mechanism not in mechanisms):
        return False
    if mechanism is None:
        del credentials[user]
    else:
        del mechanisms[mechanism]
        if not mechanisms:
            del credentials[user]
    write_credentials(path, credentials)
    return True
