"""Test certificates for TLS and mutual TLS, made with the openssl CLI.

A CA with a server certificate (127.0.0.1 and localhost) and a client certificate; a
rogue CA with its own client certificate; the server key encrypted. One session-scoped
`pki` fixture (tests/conftest.py) serves every test that needs them.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

_REQ_CONFIG = """
[req]
distinguished_name = dn
prompt = no
[dn]
CN = {cn}
[ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
[server]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1,DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
[client]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
"""


@dataclass(frozen=True)
class Pki:
    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str
    rogue_ca: str
    rogue_client_cert: str
    rogue_client_key: str
    encrypted_key: str

    def tls_flags(self) -> list[str]:
        """`sharecoord serve` flags for TLS with the server certificate."""
        return ["--tls-cert", self.server_cert, "--tls-key", self.server_key]

    def mtls_flags(self) -> list[str]:
        """`sharecoord serve` flags for mutual TLS: clients of the test CA only."""
        return [*self.tls_flags(), "--tls-client-ca", self.ca]


def _openssl(directory: Path, command: str) -> None:
    subprocess.run(["openssl", *command.split()], cwd=directory, check=True, capture_output=True)


def _new_key_and_request(directory: Path, name: str, cn: str, extra: str) -> None:
    (directory / f"{name}.cnf").write_text(_REQ_CONFIG.format(cn=cn))
    _openssl(
        directory,
        f"req -new -config {name}.cnf -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
        f"-nodes -keyout {name}.key {extra}",
    )


def _make_ca(directory: Path, name: str) -> None:
    _new_key_and_request(
        directory, name, f"{name}-test-CA", f"-x509 -extensions ca -days 2 -out {name}.pem"
    )


def _make_leaf(directory: Path, name: str, ca: str, kind: str, serial: int) -> None:
    _new_key_and_request(directory, name, name, f"-out {name}.csr")
    _openssl(
        directory,
        f"x509 -req -in {name}.csr -CA {ca}.pem -CAkey {ca}.key -set_serial {serial} -days 2 "
        f"-extfile {name}.cnf -extensions {kind} -out {name}.pem",
    )


def make_pki(d: Path) -> Pki:
    """Every certificate and key in directory `d`."""
    if shutil.which("openssl") is None:
        raise RuntimeError("the TLS tests make their certificates with the openssl CLI")
    _make_ca(d, "ca")
    _make_leaf(d, "server", "ca", "server", 2)
    _make_leaf(d, "client", "ca", "client", 3)
    _make_ca(d, "rogue")
    _make_leaf(d, "rogue-client", "rogue", "client", 4)
    _openssl(d, "pkey -in server.key -aes256 -passout pass:secret -out encrypted.key")
    return Pki(
        ca=str(d / "ca.pem"),
        server_cert=str(d / "server.pem"),
        server_key=str(d / "server.key"),
        client_cert=str(d / "client.pem"),
        client_key=str(d / "client.key"),
        rogue_ca=str(d / "rogue.pem"),
        rogue_client_cert=str(d / "rogue-client.pem"),
        rogue_client_key=str(d / "rogue-client.key"),
        encrypted_key=str(d / "encrypted.key"),
    )
