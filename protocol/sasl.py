"""SASL for the Kafka listener, the server's side: PLAIN (RFC 4616) and SCRAM-SHA-256 /
SCRAM-SHA-512 (RFC 5802, RFC 7677). Pure: the caller supplies the credentials, the
server's nonce and the key that makes decoy salts; no I/O, no clock, no randomness here.

PLAIN: the client sends ``authzid NUL authcid NUL password`` in one token. The password
must be the bearer token of ``--auth-token-file``; any non-empty user name is taken (the
token is the credential, as on HTTP), and an authorization id, if given, must equal it.

SCRAM, as Kafka runs it (two SaslAuthenticate round trips)::

    client-first   n,,n=USER,r=CNONCE              (gs2 header "n,," or "y,,"; "a=USER" allowed)
    server-first   r=CNONCE+SNONCE,s=SALT,i=ITERATIONS
    client-final   c=base64(gs2 header),r=CNONCE+SNONCE,p=PROOF
    server-final   v=SERVER_SIGNATURE

with ``AuthMessage = client-first-bare "," server-first "," client-final-without-proof``,
``ClientKey = PROOF xor HMAC(StoredKey, AuthMessage)``, accepted when ``H(ClientKey) ==
StoredKey`` (``hmac.compare_digest``), and ``SERVER_SIGNATURE = HMAC(ServerKey,
AuthMessage)``. The server keeps only the salt, iteration count, StoredKey and ServerKey of
each user (``derive_credential``), never a password. An unknown user gets a decoy: the
salt length and iteration count real users of that mechanism have (``DecoyShape``), a
salt derived from the mechanism and the name with a key the client cannot know, and it
fails at the proof exactly as a wrong password does, so the exchange does not tell
which user names exist. Channel binding (``p=``), mandatory
extensions (``m=``) and Kafka's delegation-token extension (``tokenauth=true``, not a
SCRAM attribute) are refused.

Every failure raises ``SaslFailed`` with the text to send the client (Kafka's error 58,
then the connection closes).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Callable
from dataclasses import dataclass

PLAIN = "PLAIN"
SCRAM_SHA_256 = "SCRAM-SHA-256"
SCRAM_SHA_512 = "SCRAM-SHA-512"
SCRAM_MECHANISMS = (SCRAM_SHA_256, SCRAM_SHA_512)
MIN_ITERATIONS = 4096  # Kafka's minimum for both mechanisms (and RFC 7677's advice)
MAX_ITERATIONS = 16384 * 100  # a ceiling so that a credentials file cannot stall logins
DEFAULT_ITERATIONS = 8192  # what `sharecoord scram add` writes unless told otherwise
SALT_BYTES = 32  # the salt `sharecoord scram add` draws for each user and mechanism

_HASHES = {SCRAM_SHA_256: "sha256", SCRAM_SHA_512: "sha512"}
_FAILED = "Authentication failed: Invalid user credentials"


class SaslFailed(Exception):
    """Authentication failed; ``str(exc)`` is what the client is told."""


@dataclass(frozen=True)
class ScramCredential:
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes


@dataclass(frozen=True)
class DecoyShape:
    """What an unknown user's server-first message carries besides the nonces: the
    salt's length and the iteration count. It must be what a real user's carries,
    and the salt stable per name, or one round trip tells which names exist."""

    key: bytes  # the secret the salts are derived with; never sent
    salt_bytes: int = SALT_BYTES
    iterations: int = DEFAULT_ITERATIONS

    def salt(self, mechanism: str, user: str) -> bytes:
        """HMAC-SHA-256 of the mechanism and the name under ``key``, in counter mode
        for a salt longer than 32 bytes: a different salt per mechanism, the same for
        a name every time, and none a client can compute."""
        message = mechanism.encode("ascii") + b"\x00" + user.encode("utf-8")
        out = b""
        block = 0
        while len(out) < self.salt_bytes:
            out += _hmac(self.key, block.to_bytes(4, "big") + message, "sha256")
            block += 1
        return out[: self.salt_bytes]


def _hmac(key: bytes, message: bytes, name: str) -> bytes:
    return hmac.new(key, message, name).digest()


def derive_credential(
    mechanism: str, password: bytes, salt: bytes, iterations: int
) -> ScramCredential:
    """What the server stores for a password (RFC 5802 §3)."""
    name = _HASHES[mechanism]
    salted = hashlib.pbkdf2_hmac(name, password, salt, iterations)
    client_key = _hmac(salted, b"Client Key", name)
    return ScramCredential(
        salt,
        iterations,
        hashlib.new(name, client_key).digest(),
        _hmac(salted, b"Server Key", name),
    )


def check_plain(token: bytes, secret: bytes) -> str:
    """The user name of a PLAIN token whose password is ``secret``; ``SaslFailed`` else.
    Both sides are hashed to 32 bytes first, so the comparison's time tells nothing of
    the secret's length or content."""
    parts = token.split(b"\x00")
    if len(parts) != 3:
        raise SaslFailed("Invalid SASL/PLAIN response: expected 3 tokens")
    authzid, user, password = parts
    if not user:
        raise SaslFailed("Authentication failed: username not specified")
    if not password:
        raise SaslFailed("Authentication failed: password not specified")
    if authzid and authzid != user:
        raise SaslFailed("Authentication failed: Client requested an authorization id "
                         "that is different from username")  # fmt: skip
    offered = hashlib.sha256(password).digest()
    if not hmac.compare_digest(offered, hashlib.sha256(secret).digest()):
        raise SaslFailed("Authentication failed: Invalid username or password")
    try:
        return user.decode("utf-8")
    except UnicodeDecodeError:
        raise SaslFailed("Authentication failed: the username is not UTF-8") from None


def _attributes(text: str) -> list[tuple[str, str]]:
    out = []
    for item in text.split(","):
        if len(item) < 2 or item[1] != "=":
            raise SaslFailed(f"Invalid SCRAM message: malformed attribute {item[:20]!r}")
        out.append((item[0], item[2:]))
    return out


def _saslname(text: str) -> str:
    """RFC 5802 §5.1: ',' and '=' travel as '=2C' and '=3D'; any other '=' is invalid."""
    out = text.replace("=2C", ",").replace("=3D", "=")
    if "=" in text.replace("=2C", "").replace("=3D", ""):
        raise SaslFailed("Invalid SCRAM message: malformed user name")
    return out


class ScramServer:
    """One SCRAM exchange. ``step`` takes each client token and returns the server's
    answer; ``user`` is set once ``done``."""

    def __init__(
        self,
        mechanism: str,
        lookup: Callable[[str, str], ScramCredential | None],
        server_nonce: str,
        decoy: DecoyShape,
    ) -> None:
        self._hash = _HASHES[mechanism]
        self._mechanism = mechanism
        self._lookup = lookup
        self._server_nonce = server_nonce
        self._decoy_shape = decoy
        self._stage = 0
        self.done = False
        self.user: str | None = None
        self._credential: ScramCredential | None = None
        self._known = False
        self._gs2 = ""
        self._nonce = ""
        self._first_bare = ""
        self._server_first = ""

    def step(self, token: bytes) -> bytes:
        try:
            text = token.decode("utf-8")
        except UnicodeDecodeError:
            raise SaslFailed("Invalid SCRAM message: not UTF-8") from None
        if self._stage == 0:
            self._stage = 1
            return self._first(text).encode("utf-8")
        if self._stage == 1:
            self._stage = 2
            return self._final(text).encode("utf-8")
        raise SaslFailed("Invalid SCRAM exchange: the authentication is already complete")

    def _first(self, text: str) -> str:
        parts = text.split(",", 2)
        if len(parts) != 3:
            raise SaslFailed("Invalid SCRAM client-first message")
        flag, authz, bare = parts
        if flag.startswith("p="):
            raise SaslFailed("Invalid SCRAM message: channel binding is not supported")
        if flag not in ("n", "y"):
            raise SaslFailed("Invalid SCRAM client-first message: bad gs2 header")
        attributes = _attributes(bare)
        if len(attributes) < 2 or attributes[0][0] != "n" or attributes[1][0] != "r":
            raise SaslFailed("Invalid SCRAM client-first message: expected n= and r=")
        if any(name == "m" for name, _ in attributes):
            raise SaslFailed("Invalid SCRAM message: mandatory extensions are not supported")
        user = _saslname(attributes[0][1])
        nonce = attributes[1][1]
        if not user or not nonce or not nonce.isascii() or not nonce.isprintable():
            raise SaslFailed("Invalid SCRAM client-first message: empty user or bad nonce")
        if authz and (not authz.startswith("a=") or _saslname(authz[2:]) != user):
            raise SaslFailed("Authentication failed: Client requested an authorization id "
                             "that is different from username")  # fmt: skip
        credential = self._lookup(user, self._mechanism)
        self._known = credential is not None
        if credential is None:
            credential = self._decoy(user)
        self._credential = credential
        self.user = user
        self._gs2 = f"{flag},{authz},"
        self._nonce = nonce + self._server_nonce
        self._first_bare = bare
        salt = base64.b64encode(credential.salt).decode("ascii")
        self._server_first = f"r={self._nonce},s={salt},i={credential.iterations}"
        return self._server_first

    def _decoy(self, user: str) -> ScramCredential:
        """A salt stable per unknown name, shaped as a real user's, and keys that match
        no password."""
        shape = self._decoy_shape
        size = hashlib.new(self._hash).digest_size
        salt = shape.salt(self._mechanism, user)
        return ScramCredential(salt, shape.iterations, b"\x00" * size, b"\x00" * size)

    def _final(self, text: str) -> str:
        credential = self._credential
        assert credential is not None
        proof_at = text.rfind(",p=")
        if proof_at < 0:
            raise SaslFailed("Invalid SCRAM client-final message: no proof")
        without_proof = text[:proof_at]
        attributes = _attributes(without_proof)
        if len(attributes) < 2 or attributes[0][0] != "c" or attributes[1][0] != "r":
            raise SaslFailed("Invalid SCRAM client-final message: expected c= and r=")
        expected_binding = base64.b64encode(self._gs2.encode("utf-8")).decode("ascii")
        if attributes[0][1] != expected_binding:
            raise SaslFailed("Invalid SCRAM client-final message: channel binding mismatch")
        if attributes[1][1] != self._nonce:
            raise SaslFailed("Invalid SCRAM client-final message: nonce mismatch")
        try:
            proof = base64.b64decode(text[proof_at + 3 :], validate=True)
        except (binascii.Error, ValueError):
            raise SaslFailed("Invalid SCRAM client-final message: proof is not base64") from None
        auth_message = f"{self._first_bare},{self._server_first},{without_proof}".encode()
        name = self._hash
        signature = _hmac(credential.stored_key, auth_message, name)
        if len(proof) != len(signature):
            raise SaslFailed(_FAILED)
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        matches = hmac.compare_digest(hashlib.new(name, client_key).digest(), credential.stored_key)
        if not (matches and self._known):
            raise SaslFailed(_FAILED)
        self.done = True
        server_signature = _hmac(credential.server_key, auth_message, name)
        return "v=" + base64.b64encode(server_signature).decode("ascii")
