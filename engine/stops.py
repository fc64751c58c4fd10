"""Stop rules shared by the local and the remote engine: stop strings, line limits, scope end,
repetition, time budget; checked on the text generated so far. Torch-free."""

from __future__ import annotations

import re
import time


class _StopRules:
    """Stop strings, line limits and the time budget, checked on the text generated so far."""

    def __init__(self, tokenizer, stop: tuple[str, ...], max_lines: int, time_budget_s: float, min_indent: int = -1,
                 healed: str = ""):
        self.tokenizer, self.stop, self.max_lines, self.budget = tokenizer, stop, max_lines, time_budget_s
        self.min_indent = min_indent
        self.started = time.perf_counter()
        self.seen = 0
        self.newlines = 0
        self.text = ""  # decoded so far, the healed characters left out
        self.skip = len(healed)  # token healing: the first characters decoded are already in the document

    def __call__(self, tokens: list[int]) -> str | None:
        new = self.tokenizer.decode(tokens[self.seen :])  # '\n' is one byte: never split across tokens
        if self.skip:
            new, self.skip = new[self.skip :], max(0, self.skip - len(new))
        self.newlines += new.count("\n")
        self.seen = len(tokens)
        self.text += new
        self.line = self.text[self.text.rfind("\n") + 1 :]  # the line being written
        if self.min_indent >= 0 and self.newlines and self.line.strip() and \
                len(self.line) - len(self.line.lstrip()) < self.min_indent:
            return "scope"  # a later line starts left of the scope (the same rule as _scope_end)
        if self.max_lines and self.newlines >= self.max_lines:
            return "max_lines"
        if self.stop:
            tail = self.tokenizer.decode(tokens[-48:])
            if any(s in tail for s in self.stop):
                return "stop"
        if _repetition_end(self.text) >= 0:
            return "repeat"  # a small model looping: nothing after this point would be kept
        if self.budget and self.newlines and time.perf_counter() - self.started > self.budget:
            return "time"  # only once a whole first line exists (llama.cpp's t_max_predict_ms rule)
        return None

    def cut(self, text: str) -> str:
        if (end := _repetition_end(text)) >= 0:
            text = text[:end]
        if self.min_indent >= 0 and (end := _scope_end(text, self.min_indent)) >= 0:
            text = text[:end]
        for s in self.stop:
            i = text.find(s)
            if i >= 0:
                text = text[:i]
        if self.max_lines:
            text = "\n".join(text.split("\n")[: self.max_lines]) if text.count("\n") >= self.max_lines else text
        return text


def _scope_end(text: str, min_indent: int) -> int:
    """Offset of the newline before the first later line that dedents below `min_indent`; -1 if none.

    A line counts as soon as its first non-blank character exists (its indentation is known then),
    so generation stops at the first token of the next scope instead of writing that line out.
    """
    offset = text.find("\n") + 1
    if offset == 0:
        return -1
    for line in text[offset:].split("\n"):
        if line.strip() and len(line) - len(line.lstrip()) < min_indent:
            return offset - 1  # cut before the newline that led to it
        offset += len(line) + 1
    return -1


# a unit of up to 40 characters with a non-blank in it, four or more times at the end (it may start
# with a blank, so that a loop is seen wherever the last token happened to end)
_LOOP_IN_LINE = re.compile(r"(\s*\S.{0,38}?)\1{3,}\Z")
REPEATED_LINES = 3  # the same line (or block of lines) this many times in a row is a loop
MAX_LOOP_LINES = 8  # longest block of lines checked for repetition


def _repetition_end(text: str) -> int:
    """Where a degenerate loop starts, keeping its first occurrence; -1 if the text is not looping.

    Two shapes (Tabby's post-processing drops the same ones): a block of 1 to MAX_LOOP_LINES
    complete lines, with a letter or digit in it, written REPEATED_LINES times in a row
    (`if x:\n    return\n` three times over), and a unit of 2-40 characters with a letter in it
    repeated four times at the end of the line being written (`self.x, self.x, self.x, self.x, `;
    a unit without letters only over 64 characters or more). Real code rarely does either; a small
    model does it until the token limit.
    """
    lines = text.split("\n")
    done = lines[:-1]  # complete lines only: the last may still grow
    for period in range(1, min(MAX_LOOP_LINES, len(done) // REPEATED_LINES) + 1):
        block = done[-period:]
        if not any(c.isalnum() for line in block for c in line):
            continue  # blank lines or closing brackets are not a loop
        if all(done[-(k + 1) * period : len(done) - k * period] == block for k in range(1, REPEATED_LINES)):
            copies = REPEATED_LINES
            while (copies + 1) * period <= len(done) and done[-(copies + 1) * period : -copies * period] == block:
                copies += 1
            return len("\n".join(done[: len(done) - (copies - 1) * period]))  # up to the end of its first occurrence
    tail = lines[-1][-200:]
    m = _LOOP_IN_LINE.search(tail)
    if m and (any(c.isalpha() for c in m.group(1)) or _long_symbol_run(m)):
        return len(text) - len(tail) + m.start() + len(m.group(1))
    return -1


def _long_symbol_run(m: re.Match) -> bool:
    """A unit without letters (`' * `) is a loop only once its run is longer than a code line's
    worth and mixes characters: `[0, 0, 0, 0]` and `# ------` rulers stay legal."""
    return len(m.group(0)) >= 64 and len(set(m.group(1)) - {" "}) >= 2
