"""A state store's URI as the daemon and the tools show it: which store it names, and
its password, if any, masked. Pure text, no driver: the lean install (no ``postgres``
extra) checks and shows a URI with it too.

A PostgreSQL URI is libpq's: ``postgresql://`` (or ``postgres://``), multi-host form
included, or libpq's ``key=value`` words. Its password, given as ``user:password@`` or
``password=``, becomes ``***`` wherever the URI is shown (settings errors, logs, reprs,
``cluster status``)."""

from __future__ import annotations

import re

MASK = "***"
POSTGRES_SCHEMES = ("postgresql://", "postgres://")

# Any scheme's: a URI that is not PostgreSQL's is refused, in a line showing it masked.
_URI_PASSWORD = re.compile(r"^([a-z][a-z0-9+.-]*://[^:@/?#]*):[^@/?#]*@", re.IGNORECASE)
_WORD_PASSWORD = re.compile(r"(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&]*)", re.IGNORECASE)
_WORDS = re.compile(r"^\s*[a-z_]+\s*=", re.IGNORECASE)


def masked(uri: str) -> str:
    """The URI with its password, if any, replaced by ***."""
    uri = _URI_PASSWORD.sub(rf"\1:{MASK}@", uri)
    return _WORD_PASSWORD.sub(rf"\g<1>{MASK}", uri)


def is_postgres_uri(uri: str) -> bool:
    """Whether ``uri`` names a PostgreSQL store (a ``postgresql://`` URI or libpq's
    ``key=value`` words); libpq checks the rest when the store connects."""
    return uri.lower().startswith(POSTGRES_SCHEMES) or bool(_WORDS.match(uri))
