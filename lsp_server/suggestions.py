"""Suggestions already made: type-through of the one shown, and an LRU of recent results."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

from engine.types import CompletionRequest
from lsp_server.documents import Snapshot


@dataclass
class _Shown:
    before: str
    after_head: str
    text: str


class SuggestionCache:
    """Answers without the engine: type-through of the last suggestion, and an LRU of results."""

    def __init__(self, size: int = 1000, suffix_head: int = 200):
        self._size = size
        self._suffix_head = suffix_head
        self._lru: OrderedDict[bytes, str] = OrderedDict()
        self._shown: dict[str, _Shown] = {}

    def lookup(self, snap: Snapshot, request: CompletionRequest) -> tuple[str, str] | None:
        """(text, source) when the cache can answer at once."""
        rest = self._type_through(snap)
        if rest:
            return rest, "type-through"
        text = self._lru.get(_key(request))
        if text:
            self._lru.move_to_end(_key(request))
            return text, "cache"
        return None

    def remember(self, snap: Snapshot, request: CompletionRequest, text: str) -> None:
        if not text:
            return
        self._lru[_key(request)] = text
        self._lru.move_to_end(_key(request))
        while len(self._lru) > self._size:
            self._lru.popitem(last=False)
        self.shown(snap, text)

    def shown(self, snap: Snapshot, text: str) -> None:
        self._shown[snap.uri] = _Shown(snap.before, snap.after[: self._suffix_head], text)

    def forget(self, uri: str) -> None:
        self._shown.pop(uri, None)

    def _type_through(self, snap: Snapshot) -> str:
        last = self._shown.get(snap.uri)
        if last is None or len(snap.before) <= len(last.before):
            return ""
        if snap.after[: self._suffix_head] != last.after_head or not snap.before.startswith(last.before):
            return ""
        typed = snap.before[len(last.before) :]
        return last.text[len(typed) :] if last.text.startswith(typed) else ""


def _key(request: CompletionRequest) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    # every part ends in a NUL (no two requests' parts run together into one key), and the workspace
    # folder's name is in it: two roots with the same relative path and text are two prompts
    for part in (request.mode, request.path, request.repo, request.prefix, request.suffix):
        h.update(part.encode("utf-8", "surrogatepass") + b"\x00")
    return h.digest()
