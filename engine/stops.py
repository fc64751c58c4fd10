"""Stop rules shared by the local and the remote engine: stop strings, line limits, scope end,
repetition, time budget; checked on the text generated so far. Torch-free."""

from __future__ import annotations

import re
import time

# a dedented line made of these only (and a closing bracket among them), or of a closing word
# (Limits.closer_words) with them, closes the block (closes_block): the rules keep it and end the answer
# there, as lsp_server.postprocess.cut_at_scope_end does with the same test (unless the code after the
# cursor shows the block goes on: the server knows the suffix)
CLOSING_BRACKETS = frozenset(")]}")
CLOSER_LINE_CHARS = frozenset(")]};, \t")


def decode_answer(tokenizer, tokens, context=()) -> str:
    """The text `tokens` add after `context` (the prompt's last token). Decoded together: a SentencePiece
    decoder (Llama, CodeLlama) strips the leading space of whatever it decodes, so an answer whose first
    token is `▁x` read `x` alone and `returnx` in the document; after the context it keeps its space.
    Alone where the context's own text is not whole (a character split over byte tokens)."""
    if context:
        head = tokenizer.decode(list(context))
        if "\ufffd" not in head:
            whole = tokenizer.decode([*context, *tokens])
            if whole.startswith(head):
                return whole[len(head):]
    return tokenizer.decode(list(tokens))


class _StopRules:
    """Stop strings, line limits, scope end, loops and the time budget, checked on the text generated so far.

    Called with all the tokens produced so far, after each token (plain decoding; speculative decoding
    hands its accepted tokens over one at a time too) or after a chunk of them (a streamed piece holds
    several lines). The rules run at every token end of the new tokens, on the text all the tokens
    decode to, so they fire at the same token whatever the chunking, and `cut` keeps the text up to
    that token: the answer does not depend on how the tokens arrived.
    """

    def __init__(self, tokenizer, stop: tuple[str, ...], max_lines: int, time_budget_s: float, min_indent: int = -1,
                 healed: str = "", context: tuple[int, ...] = (), closer_words: tuple[str, ...] = (),
                 lead_indent: int = -1):
        """`context`: the prompt's last token, decoded before the answer (decode_answer); `closer_words`:
        a dedented line of one of these closes the block as a `}` line does (Limits.closer_words);
        `lead_indent`: Limits.lead_indent (the first line's scope counts from it; -1: not checked)."""
        self.closer_words = tuple(closer_words)
        self.tokenizer, self.stop, self.max_lines, self.budget = tokenizer, stop, max_lines, time_budget_s
        self.context = tuple(context)
        self.min_indent = min_indent
        self.lead_indent = lead_indent
        self.started = time.perf_counter()
        self.seen = 0  # tokens checked
        self.newlines = 0
        self.text = ""  # what the tokens checked decode to, the healed characters left out
        self.skip = len(healed)  # token healing: the first characters decoded are already in the document
        self.line_start = 0  # where the first line not yet complete starts: the scope rule resumes there
        self.reason: str | None = None
        self.end = -1  # once a rule fired: how much of `text` the answer may keep (the firing token's end)
        self.longest_stop = max(map(len, stop), default=0)

    def __call__(self, tokens: list[int]) -> str | None:
        clock: list[float] = []  # read once per call: the tokens of a chunk arrive together
        for n in range(self.seen + 1, len(tokens) + 1):
            if self.reason is not None:
                break
            self.reason = self._check(tokens[:n], clock)
        return self.reason

    def _check(self, tokens: list[int], clock: list[float]) -> str | None:
        """The rules after the last of `tokens`."""
        before = self.text
        # all the tokens decoded at once, not the new one alone: SentencePiece decoders (Llama, CodeLlama)
        # drop the leading space of the first token they decode, and a character split over byte tokens
        # only shows once all its bytes are in
        self.text = text = decode_answer(self.tokenizer, tokens, self.context)[self.skip :]
        self.seen = len(tokens)
        # where the text is new: the end of the last one, or earlier where decoding rewrote its end (a
        # character's last byte token came in, U+FFFD gives way to it); a rewritten line is checked again
        changed = len(before) if text.startswith(before) else len(_common_prefix(before, text))
        self.line_start = min(self.line_start, text.rfind("\n", 0, changed) + 1)
        self.newlines = text.count("\n")
        self.end = len(text)
        if self.min_indent >= 0 and self._left_scope():
            return "scope"
        if self.max_lines and self.newlines >= self.max_lines:
            return "max_lines"
        if self.stop and any(s in text[max(0, changed - self.longest_stop + 1) :] for s in self.stop):
            return "stop"  # a stop string not there before overlaps the new text
        # a loop of lines ends at a line end: every line the new text completed, then the token's end
        ends = [i + 1 for i, c in enumerate(text[changed:], changed) if c == "\n"]
        for end in dict.fromkeys([*ends, len(text)]):
            if _repetition_end(text[:end]) >= 0:
                self.end = end  # `cut` looks for the loop where it was seen
                return "repeat"  # a small model looping: nothing after this point would be kept
        # the time budget ends the answer at a line end (llama.cpp's t_max_predict_ms rule), and only once
        # it holds a whole non-blank line: after a block opener the first line is empty, and a slow
        # prefill alone can spend the budget; the user gets at least one line (max_tokens bounds it)
        # nor inside a bracket the answer opened (`return {` + half its entries would leave the file unbalanced)
        # and not on a line that opens a block (`if ready:` alone is a body the user must write)
        if (self.budget and "\n" in text[changed:] and _balanced_line(head := text[: text.rfind("\n")])
                and not _opens_block(head[head.rfind("\n") + 1:])):
            if not clock:
                clock.append(time.perf_counter())
            if clock[0] - self.started > self.budget:
                return "time"
        return None

    def _left_scope(self) -> bool:
        """Whether a later line starts left of the scope (the rule of _scope_end), checked on every line
        the new text completed and on the one being written.

        A line counts as soon as its first non-blank character exists, so generation stops at the first
        token of the next scope; one of closing brackets only counts once complete: it is kept.
        """
        text = self.text
        while True:
            nl = text.find("\n", self.line_start)
            line = text[self.line_start :] if nl < 0 else text[self.line_start : nl]
            lead = 0 if self.line_start else self.lead_indent  # the first line starts at the cursor
            if lead >= 0 and line.strip() and lead + len(line) - len(line.lstrip()) < self.min_indent:
                # one that may still become a closing line is read to its end
                return nl >= 0 or not (closes_block(line, self.closer_words)
                                       or any(w.startswith(line.strip()) for w in self.closer_words))
            if nl < 0:
                return False
            self.line_start = nl + 1

    def cut(self, text: str, reason: str | None = None) -> str:
        """The answer `text` keeps. `reason`: why generation ended (the engine's stop reason: the token
        limit is decided outside the rules); the rule that fired by default."""
        if self.reason is not None and text.startswith(self.text[: self.end]):
            text = text[: self.end]  # what a token-by-token run would have had when the rule fired
        if (reason or self.reason) in ("time", "max_tokens"):
            text = _drop_unfinished_line(text)  # first: the cuts below end on a line that is whole
        if (end := _repetition_end(text)) >= 0:
            # a loop inside a line is cut mid-line: that line goes too, as after a limit stop
            text = text[:end] if text[end : end + 1] in ("\n", "") else _drop_unfinished_line(text[:end])
        if self.min_indent >= 0 and (end := _scope_end(text, self.min_indent, self.closer_words,
                                                        self.lead_indent)) >= 0:
            text = text[:end]
        for s in self.stop:
            i = text.find(s)
            if i >= 0:
                text = text[:i]
        if self.max_lines:
            text = "\n".join(text.split("\n")[: self.max_lines]) if text.count("\n") >= self.max_lines else text
        return text


def _drop_unfinished_line(text: str) -> str:
    """`text` without its last line, which a time or token-limit stop left half-written (an unclosed
    string or call), once a whole non-blank line comes before it; else unchanged: a single-line answer
    (max_lines 1 stops at its line end) or a first line alone is still worth its partial text. Where
    the answer's own brackets are all closed at an earlier line end, it ends there (not on `return {`)."""
    end = text.rfind("\n")
    if end < 0 or not text[:end].strip():
        return text
    balanced = end
    while balanced > 0 and not _balanced_line(text[:balanced]):
        balanced = text.rfind("\n", 0, balanced)
    if balanced > 0:
        end = balanced
    # nor on a block's opening line with its body cut off (`if ready:`), where a whole line comes before it
    while (_opens_block(text[text.rfind("\n", 0, end) + 1 : end])
           and _balanced_line(text[: max(text.rfind("\n", 0, end), 0)])):  # not back into its own brackets
        end = text.rfind("\n", 0, end)
    return text[: end - 1] if text[end - 1 : end] == "\r" else text[:end]  # a CRLF's "\r" goes with it


# the answer's own brackets, its one-line strings skipped (a quote after `&` or `<` is a Rust lifetime)
_ANSWER_BRACKETS = re.compile(r'"(?:\\.|[^"\\\n])*"|(?<![&<])\'(?:\\.|[^\'\\\n])*\'|[()\[\]{}]')


def _opens_block(line: str) -> bool:
    """A line that ends by opening a block its next lines are the body of (Python's, YAML's `:`)."""
    code = line.rstrip()
    return code.endswith(":") and not code.lstrip().startswith(("#", "//"))


def _balanced_line(text: str) -> bool:
    """Does `text` (an answer up to a line end) hold a non-blank line and leave no bracket of its own
    open? (A closer of a bracket the prefix opened counts against nothing: `a, b)` is balanced.)"""
    if not text.strip():
        return False
    depth = 0
    for m in _ANSWER_BRACKETS.finditer(text):
        c = m.group()
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth = max(depth - 1, 0)
    return depth == 0


def _common_prefix(a: str, b: str) -> str:
    i = 0
    while i < min(len(a), len(b)) and a[i] == b[i]:
        i += 1
    return a[:i]


def closes_block(line: str, words: tuple[str, ...] = ()) -> bool:
    """A line that closes a block: closing brackets (with `;`/`,`), or one that starts with one of `words`
    as a whole word (reserved words: Lua's `end)` closing a function passed as an argument, Ruby's
    `end.compact`, a shell loop's `done < "$1"` or `done | sort`, `fi # ok`)."""
    stripped = line.strip()
    if words and (word := _FIRST_WORD.match(stripped)) and word.group() in words:
        return True
    return bool(stripped) and set(stripped) <= CLOSER_LINE_CHARS and not CLOSING_BRACKETS.isdisjoint(stripped)


_FIRST_WORD = re.compile(r"\w+")


def _scope_end(text: str, min_indent: int, words: tuple[str, ...] = (), lead: int = -1) -> int:
    """Where the answer leaves the cursor's scope; -1 if it does not.

    At the first later line that dedents below `min_indent`: the offset of the newline before it, or,
    for a line of closing brackets only, of its end (it closes the block: kept, and the answer ends there).
    A line counts as soon as its first non-blank character exists (its indentation is known then),
    so generation stops at the first token of the next scope instead of writing that line out.
    `lead` (>= 0): the first line is checked too, its indentation counted from there (Limits.lead_indent).
    """
    offset = 0 if lead >= 0 else text.find("\n") + 1
    if offset == 0 and lead < 0:
        return -1
    for line in text[offset:].split("\n"):
        depth = len(line) - len(line.lstrip()) + (lead if offset == 0 else 0)
        if line.strip() and depth < min_indent:
            if closes_block(line, words):
                return offset + len(line)  # it closes the block: kept, and the answer ends with it
            return max(offset - 1, 0)  # cut before the newline that led to it (the first line: all of it)
        offset += len(line) + 1
    return -1


# a unit of up to 40 characters with two non-blanks in it, four or more times at the end (it may start
# with a blank, so that a loop is seen wherever the last token happened to end)
_LOOP_IN_LINE = re.compile(r"(\s*\S\s*\S.{0,38}?)\1{3,}\Z")
# characters a loop in a line spans before it counts. Real code repeats short units a few times
# (0xFFFFFFFFFFFFFFFF: 16, eight b"\x00": 32, six ", None": 36); a model caught in a loop goes on to
# the token limit, so 40 costs it a dozen tokens. Units of 10 characters or more pass it with 4 copies.
MIN_LOOP_RUN = 40
REPEATED_LINES = 3  # the same line (or block of lines) this many times in a row is a loop
MAX_LOOP_LINES = 8  # longest block of lines checked for repetition


def _repetition_end(text: str) -> int:
    """Where a degenerate loop starts, keeping its first occurrence; -1 if the text is not looping.

    Two shapes (Tabby's post-processing drops the same ones): a block of 1 to MAX_LOOP_LINES
    complete lines, with a letter or digit in it, written REPEATED_LINES times in a row
    (`if x:\n    return\n` three times over), and a unit of 2-40 characters with two non-blanks and a
    letter in it repeated four times or more, over MIN_LOOP_RUN characters or more, at the end of the
    line being written (`self.x, self.x, self.x, self.x, self.x, `; a unit without letters only over
    64 characters or more). Real code rarely does either; a small model does it until the token limit.
    """
    lines = text.split("\n")
    done = lines[:-1]  # complete lines only: the last may still grow
    for period in range(1, min(MAX_LOOP_LINES, len(done) // REPEATED_LINES) + 1):
        block = done[-period:]
        if any(c.isalnum() for line in block for c in line):
            needed = REPEATED_LINES
        elif any(set(line.strip()) - CLOSER_LINE_CHARS for line in block):
            needed = REPEATED_LINES * 2  # symbols only (`#` lines): a loop once it runs longer
        else:
            continue  # blank lines or closing brackets are not a loop
        if all(_is_copy(done, len(done) - (k + 1) * period, block) for k in range(1, needed)):
            copies = needed
            while (copies + 1) * period <= len(done) and _is_copy(done, len(done) - (copies + 1) * period, block):
                copies += 1
            return len("\n".join(done[: len(done) - (copies - 1) * period]))  # up to the end of its first occurrence
    tail = lines[-1][-200:]
    m = _LOOP_IN_LINE.search(tail)
    # the match starts leftmost and runs to the end: no other match in the tail is longer
    if m and len(m.group(0)) >= MIN_LOOP_RUN and (any(c.isalpha() for c in m.group(1)) or _long_symbol_run(m)):
        return len(text) - len(tail) + m.start() + len(m.group(1))
    return -1


def _is_copy(done: list[str], at: int, block: list[str]) -> bool:
    """Whether ``done[at:at + len(block)]`` is ``block``; the answer's first line (it starts at the cursor,
    after the indentation typed) counts with its indentation left out."""
    if at < 0:
        return False
    chunk = done[at : at + len(block)]
    if at == 0 and chunk[1:] == block[1:] and chunk[0].strip() == block[0].strip():
        return bool(chunk[0].strip())
    return chunk == block


def _long_symbol_run(m: re.Match) -> bool:
    """A unit without letters (`' * `) is a loop only once its run is longer than a code line's
    worth and mixes characters: `[0, 0, 0, 0]` and `# ------` rulers stay legal."""
    return len(m.group(0)) >= 64 and len(set(m.group(1)) - {" "}) >= 2
