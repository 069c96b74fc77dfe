"""Credentials out of what leaves a run: URIs, messages and ``env.kwargs``.

A tracking URI may carry ``user:password@`` or ``?token=``, an environment's kwargs an API key;
metrics, checkpoints, MLflow params, ``mlflow.json`` and the Kubernetes job's ConfigMap get
these with the secrets replaced by :data:`REDACTED`. Pure text handling: no I/O.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote_plus, urlsplit, urlunsplit

REDACTED = "<redacted>"

# A field whose name contains one of these holds a credential; the short names only as whole
# names (Azure's SAS signature is ``sig``), as substrings they would hit innocent fields.
SECRET_WORDS = ("token", "passw", "pwd", "secret", "key", "credential", "auth", "signature")
SECRET_NAMES = {"sig", "sas", "pass", "pw"}
_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"]+")
_FIELD = re.compile(r"([^&;=]+)=([^&;]*)")


def looks_secret(name: str) -> bool:
    """Whether a field called ``name`` (a query field, an ``env.kwargs`` key) may hold a
    credential."""
    name = name.lower()
    return name in SECRET_NAMES or any(word in name for word in SECRET_WORDS)


def _redact_fields(text: str) -> str:
    return _FIELD.sub(lambda m: f"{m[1]}={REDACTED}" if looks_secret(unquote_plus(m[1]))
                      else m[0], text)


def redact_uri(uri: str) -> str:
    """``uri`` without credentials: its user part (``user:password@``, ``token@``) and the
    values of query and fragment fields whose names look like secrets become ``<redacted>``.

    >>> redact_uri("https://bob:hunter2@mlflow.example.com/?token=abc&x=1")
    'https://<redacted>@mlflow.example.com/?token=<redacted>&x=1'
    """
    try:
        parts = urlsplit(uri)
    except ValueError:   # not a URL urllib can split (a stray bracket): the same, by hand
        head, sep, tail = uri.partition("?")
        return re.sub(r"//[^/]*@", f"//{REDACTED}@", head) + sep + _redact_fields(tail)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{REDACTED}@{netloc.rpartition('@')[2]}"
    query, fragment = _redact_fields(parts.query), _redact_fields(parts.fragment)
    if (netloc, query, fragment) == (parts.netloc, parts.query, parts.fragment):
        return uri   # unchanged: urlunsplit would normalise what needs no redaction
    return urlunsplit((parts.scheme, netloc, parts.path, query, fragment))


def redact(text: str) -> str:
    """``text`` (a message, an exception) with every URI in it passed through
    :func:`redact_uri`."""
    return _URI.sub(lambda m: redact_uri(m[0]), text)


def redact_secrets(value: Any) -> Any:
    """``value`` (``env.kwargs``) with the values of keys that look like secrets replaced by
    ``<redacted>``, at any depth, and every URI in its strings redacted."""
    if isinstance(value, dict):
        return {k: REDACTED if looks_secret(str(k)) else redact_secrets(v)
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_secrets(v) for v in value]
    if isinstance(value, str):
        return redact(value)
    return value
