"""Shape raw engine text into a suggestion: line mode, scope end, suffix overlap, bracket balance."""

from __future__ import annotations

from engine.types import Mode

OPENERS = {"(": ")", "[": "]", "{": "}"}
CLOSERS = {v: k for k, v in OPENERS.items()}
BLOCK_OPENERS = (":", "{", "(", "[", "=>", "->")
CLOSER_LINE_CHARS = set(")]};, \t")


def choose_mode(prefix: str, suffix: str, setting: str = "auto") -> Mode:
    """single-line mid-line; multi-line after a block opener or on an empty line (``auto``)."""
    if setting == "single":
        return "single-line"
    if setting == "multi":
        return "multi-line"
    line_before = prefix.rsplit("\n", 1)[-1]
    line_after = suffix.split("\n", 1)[0]
    if line_after.strip():
        return "single-line"
    if not line_before.strip() or line_before.rstrip().endswith(BLOCK_OPENERS):
        return "multi-line"
    return "single-line"


def postprocess(text: str, prefix: str, suffix: str, mode: Mode, max_lines: int = 0) -> str:
    """All the rules in order; pure."""
    if mode == "single-line":
        text = text.split("\n", 1)[0]
    else:
        text = cut_at_scope_end(text, prefix)
        if max_lines:
            text = "\n".join(text.split("\n")[:max_lines])
    text = drop_suffix_overlap(text, suffix, prefix)
    text = balance_brackets(text, suffix)
    return _trim_trailing_blank(text)


def indent_of(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def scope_min_indent(prefix: str) -> int:
    """The least indentation a later line of the completion may have and still be in the cursor's scope.

    The cursor line's indentation (on a whitespace-only line: the block the typed indent puts us in),
    one more after a block opener. The engine stops on the same rule (``Limits.min_indent``).
    """
    cursor_line = prefix.rsplit("\n", 1)[-1]
    base = indent_of(cursor_line)
    return base + 1 if cursor_line.rstrip().endswith(BLOCK_OPENERS) else base


def cut_at_scope_end(text: str, prefix: str) -> str:
    """Stop before the first line that dedents out of the cursor's block.

    A dedented line made only of closing brackets is kept (it closes the block) and ends the text.
    """
    min_indent = scope_min_indent(prefix)
    lines = text.split("\n")
    for i, line in enumerate(lines[1:], start=1):
        if not line.strip():
            continue
        if indent_of(line) < min_indent:
            if _only_closers(line):
                return "\n".join(lines[: i + 1])
            return "\n".join(lines[:i])
    return text


def _only_closers(line: str) -> bool:
    stripped = line.strip()
    return bool(stripped) and set(stripped) <= CLOSER_LINE_CHARS and any(c in CLOSERS for c in stripped)


def drop_suffix_overlap(text: str, suffix: str, prefix: str = "") -> str:
    """Cut where the completion meets the code that already follows the cursor."""
    rest_of_line = suffix.split("\n", 1)[0].strip()
    lines = text.split("\n")
    if rest_of_line and len(lines) == 1 and len(rest_of_line) > 1 and text.rstrip().endswith(rest_of_line):
        return text.rstrip()[: -len(rest_of_line)]
    anchor = rest_of_line or _first_code_line(suffix.split("\n", 1)[1] if "\n" in suffix else "")
    if len(anchor) < 2:
        return text
    line_before = prefix.rsplit("\n", 1)[-1]
    for i, line in enumerate(lines):
        whole = line_before + line if i == 0 else line
        if whole.strip() == anchor and (i > 0 or not rest_of_line):
            return "\n".join(lines[:i])
    return text


def _first_code_line(text: str) -> str:
    for line in text.split("\n"):
        if line.strip():
            return line.strip()
    return ""


def balance_brackets(text: str, suffix: str) -> str:
    """Drop trailing closers of the completion that the suffix already supplies."""
    trailing = _trailing_unmatched_closers(text)  # [(index, char)] in text order
    if not trailing:
        return text
    ahead = "".join(c for c in _leading_closer_run(suffix) if c in CLOSERS)
    chars = "".join(c for _, c in trailing)
    for j in range(min(len(chars), len(ahead)), 0, -1):
        if chars[-j:] == ahead[:j]:
            return text[: trailing[-j][0]].rstrip(" \t")
    return text


def _trailing_unmatched_closers(text: str) -> list[tuple[int, str]]:
    stack: list[str] = []
    unmatched: list[tuple[int, str]] = []
    for i, c in enumerate(text):
        if c in OPENERS:
            stack.append(c)
        elif c in CLOSERS:
            if stack and stack[-1] == CLOSERS[c]:
                stack.pop()
            else:
                unmatched.append((i, c))
    tail: list[tuple[int, str]] = []
    end = len(text.rstrip())
    for i, c in reversed(unmatched):
        if text[i + 1 : end].strip(" \t\n;,") == "":
            tail.insert(0, (i, c))
            end = i
        else:
            break
    return tail


def _leading_closer_run(suffix: str) -> str:
    out = []
    for c in suffix:
        if c in CLOSERS or c in " \t\n":
            out.append(c)
        else:
            break
    return "".join(out)


def _trim_trailing_blank(text: str) -> str:
    lines = text.split("\n")
    while lines and not lines[-1].strip():
        lines.pop()
    return "\n".join(lines).rstrip(" \t")
