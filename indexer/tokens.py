"""Code tokenizer shared by indexing and queries: identifiers, plus their snake_case / camelCase parts."""

from __future__ import annotations

import re

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]+")
_CAMEL = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")
MAX_TOKEN_LEN = 64


def split_identifier(word: str) -> list[str]:
    """Lower-cased sub-words of one identifier (``HTTPServer_error2`` -> http, server, error, 2)."""
    parts: list[str] = []
    for piece in word.split("_"):
        if piece:
            parts.extend(m.group(0).lower() for m in _CAMEL.finditer(piece))
    return parts


def code_tokens(text: str) -> list[str]:
    """Tokens of ``text`` in order: each identifier lower-cased, followed by its parts when it has several.

    >>> code_tokens("getHTTPResponse(max_len)")
    ['gethttpresponse', 'get', 'http', 'response', 'max_len', 'max', 'len']
    """
    out: list[str] = []
    for m in _WORD.finditer(text):
        word = m.group(0)
        if len(word) > MAX_TOKEN_LEN:
            continue
        out.append(word.lower())
        if not word[0].isdigit():
            parts = split_identifier(word)
            if len(parts) > 1:
                out.extend(parts)
    return out
