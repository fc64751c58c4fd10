"""Shape raw engine text into a suggestion: line mode, scope end, suffix overlap, bracket balance."""

from __future__ import annotations

import bisect
import os
import re
from collections import Counter
from collections.abc import Sequence

from engine.stops import _FIRST_WORD, closes_block
from engine.types import Mode

OPENERS = {"(": ")", "[": "]", "{": "}"}
CLOSERS = {v: k for k, v in OPENERS.items()}
BLOCK_OPENERS = (":", "{", "(", "[", "=>", "->")
# Languages whose blocks open with a keyword (LSP language ids): a cursor line that matches (stripped) opens
# a block too. Ruby's `if`/`def`/... open one at the start of a line (`x if y` is a modifier), not where
# the line ends the block again (`def to_s; name; end`).
_KEYWORD_OPENERS = {
    "lua": re.compile(r"\b(?:then|do|else|repeat)$|\bfunction\b[\w.:\s]*\([^()]*\)$"),
    "shellscript": re.compile(r"(?:^|[\s;])(?:then|do|else)$|^case\b.*\bin$"),
    "ruby": re.compile(r"\bdo(?:\s*\|[^|]*\|)?$|\{\s*\|[^|]*\|$|^(?:else|ensure|begin|rescue)$"
                       # a keyword with its operand (a bare `def` is a line still being typed)
                       r"|^(?:def|class|module|if|unless|while|until|case|for|elsif|when|rescue)\s+\S(?!.*\bend$)"),
}
# a line of one of these words (closers after it allowed: Lua's `end)`) closes a keyword block
CLOSER_WORDS = {"lua": ("end",), "ruby": ("end",), "shellscript": ("fi", "done", "esac")}
# A rest of line made of one of these is the closing half of a pair (an editor's auto-close) or a
# statement's end; one the completion ends with again is dropped (brackets: balance_brackets).
CLOSING_CHARS = set("\"'`:;,")
QUOTES = set("\"'`")
_WORD_CHAR = re.compile(r"\w")
# A one-line string literal or a bracket: brackets inside strings do not count as open.
_STRINGS = r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\''
_BRACKET_TOKENS = re.compile(_STRINGS + r"|[()\[\]{}]")
# Comments (and Python's triple-quoted strings) by language: brackets in them do not count either. A
# language not listed keeps strings only (``//`` is Python's floor division, ``#`` C's preprocessor).
_HASH = r"#[^\n]*"
# a shell word starts a comment (`${#items[@]}`, `$#` are code), as YAML's after a blank does
_WORD_HASH = r"(?<![^\s;|&(])#[^\n]*"
_BLOCK = r"/\*[\s\S]*?\*/"
# not after `:` (a URL outside a string the rules know: a regex literal, CSS's bare `url(`) or `\` (`\//`)
_SLASH = r"(?<![:\\])//[^\n]*|" + _BLOCK
_DASH = r"--[^\n]*"
# JavaScript's template literals and Go's raw strings: strings that may span lines
_BACKTICK = r"`(?:\\.|[^`\\])*`"
_COMMENTS = {
    **dict.fromkeys(("python",), r'"""[\s\S]*?"""|\'\'\'[\s\S]*?\'\'\'|' + _HASH),
    **dict.fromkeys(("ruby", "perl", "r", "toml", "makefile", "elixir", "julia", "nim", "powershell",
                     "coffeescript"), _HASH),
    **dict.fromkeys(("shellscript", "yaml", "dockerfile"), _WORD_HASH),
    # Rust: a quote is a char literal only around one character (``'a`` is a lifetime)
    **dict.fromkeys(("rust",), _SLASH + r"""|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])'"""),
    **dict.fromkeys(("javascript", "javascriptreact", "typescript", "typescriptreact", "go"), _BACKTICK + "|" + _SLASH),
    **dict.fromkeys(("c", "cpp", "cuda-cpp", "objective-c", "objective-cpp", "java", "csharp", "kotlin",
                     "swift", "scala", "dart", "zig", "groovy", "jsonc", "proto", "solidity", "scss", "less"), _SLASH),
    **dict.fromkeys(("css",), _BLOCK),  # no line comments
    **dict.fromkeys(("php",), _SLASH + "|" + _HASH),
    **dict.fromkeys(("lua", "sql", "haskell", "ada", "elm"), _DASH),
    **dict.fromkeys(("emacs-lisp", "lisp", "commonlisp", "scheme", "racket", "clojure", "fennel"), r";[^\n]*"),
}
_TOKENS_BY_LANGUAGE = {
    lang: re.compile(f"{comments}|{'' if lang == 'rust' else _STRINGS + '|'}[()\\[\\]{{}}]")
    for lang, comments in _COMMENTS.items()
}


def _bracket_tokens(language: str) -> re.Pattern[str]:
    return _TOKENS_BY_LANGUAGE.get(language.lower(), _BRACKET_TOKENS)


def opens_block(line: str, language: str = "") -> bool:
    """Whether ``line`` ends with a block opener: a bracket, ``:``, an arrow, or a keyword of ``language``'s."""
    stripped = line.strip()
    if stripped.endswith(BLOCK_OPENERS):
        return True
    keywords = _KEYWORD_OPENERS.get(language.lower())
    return bool(keywords and keywords.search(stripped))


def choose_mode(prefix: str, suffix: str, setting: str = "auto", language: str = "") -> Mode:
    """single-line mid-line; multi-line after a block opener or on an empty line (``auto``).

    ``language``: an LSP language id (its keyword block openers: Lua's ``then``, Ruby's ``do |x|``)."""
    if setting == "single":
        return "single-line"
    if setting == "multi":
        return "multi-line"
    line_before = prefix.rsplit("\n", 1)[-1]
    line_after = suffix.split("\n", 1)[0]
    if line_after.strip():
        return "single-line"
    if not line_before.strip() or opens_block(line_before, language):
        return "multi-line"
    return "single-line"


def postprocess(text: str, prefix: str, suffix: str, mode: Mode, max_lines: int = 0, language: str = "",
                sees_line_rest: bool = True) -> str:
    """All the rules in order; pure. ``language``: an LSP language id (which comments to skip);
    ``sees_line_rest``: whether the model saw the rest of the cursor's line (a FIM prompt does;
    SmolLM2's left-to-right one shows only the lines after it)."""
    # A CRLF (or bare CR) document: the rules split on "\n", so a kept "\r" would end the suggestion or
    # hide a closer from the bracket rules. Work on "\n"; the result gets the document's line ending
    # (the model's own where the windows hold no line break to tell). A "\r" the engine's cut left at
    # the end of an answer (it cuts at "\n") goes with the rest.
    eol = line_ending(prefix, suffix) or line_ending(text) or "\n"
    text, prefix, suffix = (to_lf(s) for s in (text, prefix, suffix))
    if mode == "single-line":
        text = text.split("\n", 1)[0]
    else:
        text = cut_at_scope_end(text, prefix, suffix, language)
        if max_lines:
            text = "\n".join(text.split("\n")[:max_lines])
    text = drop_repeated_line(text, prefix)
    text = drop_suffix_overlap(text, suffix, prefix, language)
    text = balance_brackets(text, suffix, prefix, language)
    text = drop_unclosed_openers(text, suffix, prefix, language)
    text = drop_unclosed_string(text, suffix, prefix, language)
    # a space before the code right after the cursor is part of the answer (`return ` + `store.save()`)
    rest = suffix.split("\n", 1)[0]
    text = _trim_trailing_blank(text, keep_space=bool(rest) and (_WORD_CHAR.match(rest) is not None or rest[0] in QUOTES))
    line_before = prefix.rsplit("\n", 1)[-1]
    if not sees_line_rest and text.strip() and "\n" not in text and rest.strip() and not line_before.strip():
        # the cursor at a line's indentation, code after it the model never saw: its answer is a line of
        # its own (`|import json` got `import os`, which made `import osimport json`)
        text += "\n" + line_before
    return text if eol == "\n" else text.replace("\n", eol)


def to_lf(text: str) -> str:
    """``text`` with "\n" line breaks: the rules', and the engine's (a model saw mostly LF code)."""
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text


def line_ending(before: str, after: str = "") -> str:
    """The line break nearest the cursor: the last in ``before``, else the first in ``after`` ("\r\n",
    a bare "\r" or "\n"); "" when neither holds one."""
    at = max(before.rfind("\n"), before.rfind("\r"))
    if at >= 0:  # the cursor is never between a "\r" and its "\n"
        return "\r" if before[at] == "\r" else "\r\n" if at and before[at - 1] == "\r" else "\n"
    ends = [i for i in (after.find("\n"), after.find("\r")) if i >= 0]
    if not ends:
        return ""
    at = min(ends)
    if at == len(after) - 1 and after[at] == "\r":
        return ""  # a window cut between a "\r" and what follows it: a bare one, or half of "\r\n"
    return "\n" if after[at] == "\n" else "\r\n" if after.startswith("\n", at + 1) else "\r"


def indent_of(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def scope_min_indent(prefix: str, language: str = "", suffix: str = "") -> int:
    """The least indentation a later line of the completion may have and still be in the cursor's scope.

    The cursor line's indentation (typed whitespace included: the user's choice), one more after a
    block opener (``language``'s keywords included). An empty cursor line (an empty line inside a
    function body, the cursor at column 0) is inside the code around it: no shallower than both the
    code line above and the one below (one deeper than an `else`/`except` below, whose block it is
    in). Code left of both would break the block (Python's `return` after a module-level line is an
    error). Neither neighbour's being a block opener or closer counts: a continued statement's opener
    line is deeper than its body (a hanging signature), a comment or a YAML key may end with ":",
    and Go's and C's `case` lines sit at their switch's depth, left of the bodies between them. The
    engine stops on the same rule (``Limits.min_indent``).
    """
    cursor_line = prefix.rsplit("\n", 1)[-1]
    base = indent_of(cursor_line)
    if cursor_line:
        return base + 1 if opens_block(cursor_line, language) else base
    if language.lower() in PROSE_LANGUAGES or language.lower() in _DIRECTIVE_LANGUAGES:
        return 0  # no blocks, or code at column 0 inside them (C's `#ifdef` and `#endif`)
    before = _last_code_line(prefix)
    lines = suffix.split("\n", 1)
    after = _first_code_line(lines[1]) if len(lines) == 2 and not lines[0].strip() else ""
    if not before or not after:
        return 0  # the start or end of the file (a new top-level definition is fine there)
    word = _FIRST_WORD.match(after.lstrip())
    return min(indent_of(before), indent_of(after) + bool(word and word.group() in CONTINUING_WORDS))


# a line starting with one of these goes on with the statement above it, whose block ends before it
CONTINUING_WORDS = frozenset({"else", "elif", "elsif", "except", "finally", "rescue", "ensure"})
# column 0 inside a body is code in these (a C preprocessor line)
_DIRECTIVE_LANGUAGES = frozenset({"c", "cpp", "cuda-cpp", "objective-c", "objective-cpp", "csharp"})


def _last_code_line(text: str) -> str:
    """The last non-blank line, its indentation kept (read from the end: ``text`` may be a whole file)."""
    end = len(text)
    while end > 0:
        start = text.rfind("\n", 0, end - 1) + 1  # the line that holds text[end - 1]
        if text[start:end].strip():
            return text[start:end].rstrip()
        end = start
    return ""


def lead_indent(prefix: str) -> int:
    """The whitespace before the cursor on its line when there is nothing else: the answer's first line
    starts there, so its own indentation counts for the scope (Limits.lead_indent); -1 otherwise."""
    cursor_line = prefix.rsplit("\n", 1)[-1]
    return -1 if cursor_line.strip() else len(cursor_line)


def cut_at_scope_end(text: str, prefix: str, suffix: str = "", language: str = "") -> str:
    """Stop before the first line that dedents out of the cursor's block.

    A dedented line made only of closing brackets is kept (it closes the block) and ends the text,
    unless the code after the cursor goes on inside the block: the block's closer is in the file
    then, and the answer's would close it early.
    """
    min_indent = scope_min_indent(prefix, language, suffix)
    words = closer_words(language)
    after = _first_code_line(suffix.split("\n", 1)[1] if "\n" in suffix else "")
    block_goes_on = bool(after) and indent_of(after) >= min_indent
    # the file's next line closes the block (Ruby's `      end` after `if amount > 1|`): an answer's closer
    # at that depth or deeper closes it again (one further out closes the block the cursor's line opens)
    closed_at = indent_of(after) if after and not block_goes_on and closes_block(after, words) else -1
    lines = text.split("\n")
    lead = lead_indent(prefix)  # the first line starts at the cursor: counted only after whitespace
    for i, line in enumerate(lines[1:] if lead < 0 else lines, start=1 if lead < 0 else 0):
        if not line.strip():
            continue
        depth = indent_of(line) + (lead if i == 0 else 0)
        if depth < min_indent:
            if closes_block(line, words) and not block_goes_on and depth > closed_at:
                return "\n".join(lines[: i + 1])
            return "\n".join(lines[:i])
    return text


# Where a markdown fence is text, not the model slipping into a chat answer (SmolLM2 ends a file with
# "```" and a paragraph about the code: 4 of 7 languages at the end of a file)
PROSE_LANGUAGES = frozenset({"markdown", "mdx", "rmarkdown", "quarto", "plaintext", "restructuredtext", "latex",
                             "asciidoc"})


def stop_strings(language: str) -> tuple[str, ...]:
    """Text an answer in ``language`` ends before (Limits.stop): a markdown fence in a code file."""
    return () if language.lower() in PROSE_LANGUAGES else ("```",)


def closer_words(language: str) -> tuple[str, ...]:
    """The words whose line closes a block in ``language`` (Limits.closer_words)."""
    return CLOSER_WORDS.get(language.lower(), ())


def drop_suffix_overlap(text: str, suffix: str, prefix: str = "", language: str = "") -> str:
    """Cut where the completion meets the code that already follows the cursor."""
    raw_rest = suffix.split("\n", 1)[0]
    rest_of_line = raw_rest.strip()
    line_before = prefix.rsplit("\n", 1)[-1]
    if rest_of_line:
        single = text.rstrip("\n").rstrip()
        if ("\n" not in single and len(rest_of_line) > 1 and not set(rest_of_line) <= set(CLOSERS) | {" ", "\t"}
                and single.endswith(rest_of_line) and single != rest_of_line):
            return single[: -len(rest_of_line)]  # it closes with the line's own text: that is cut off its end
        # A left-to-right model never saw the text after the cursor and often writes it again: an
        # answer that starts by retyping it adds nothing insertable at the cursor (`tot|alx` + `al`
        # gave `totalalx`). Only where the shared part holds a word and does not end inside one
        # (`if |self.ready:` + `self.enabled and ` is new code; closers are balance_brackets' to weigh).
        # The blanks the line goes on with count as the answer's own, and a whole word of it written again
        # is retyping too (`parses | and returns` + `and executes`; `|import json` + `import os` is a new line).
        after_blank = raw_rest[:1] in (" ", "\t") and text[:1] not in (" ", "\t")
        shared = raw_rest.lstrip(" \t") if after_blank else raw_rest
        same = len(os.path.commonprefix([text, shared]))
        inside_word = (same < len(text) and same < len(shared) and _WORD_CHAR.match(text[same])
                       and _WORD_CHAR.match(shared[same]) and not (after_blank and shared[same - 1] == " "))
        if (same and _WORD_CHAR.search(shared[:same]) and not inside_word
                and (same in (len(text), len(shared)) or same >= 3)):
            return ""
        # The rest of the line closes what the cursor is in (an editor's auto-closed pair: `f(|)`,
        # `"|"`, `{|}"`): the answer ends where it first closes that at its own top level, and the
        # line's closer does it (`f"{` + `name}!"` + `}"` was `{name}!"}"`).
        cut = _cut_at_closer(text, rest_of_line[0], line_before, language)
        if cut is None and (quote := next((c for c in rest_of_line if c in QUOTES), "")):
            # the line closes the string the cursor is in further on (`<` + `{user.email}` + `>`;`): the
            # answer's own closing quote and what follows it are the line's again
            cut = _cut_at_closer(text, quote, line_before, language)
        if cut is None:
            cut = _cut_at_line_overrun(text, prefix, suffix, language)
        if cut is not None:
            return cut
    lines = text.rstrip("\n").split("\n")  # a trailing newline (a forced multi-line answer) is no line
    if rest_of_line and len(lines) == 1:
        body = text.rstrip()
        if set(rest_of_line) <= set(CLOSERS) | {" ", "\t"}:
            pass  # only brackets: balance_brackets weighs them against what the prefix left open
        elif len(rest_of_line) > 1:
            if body.endswith(rest_of_line):
                return body[: -len(rest_of_line)]
        elif rest_of_line in CLOSING_CHARS and body.endswith(rest_of_line):
            # One character is too common to drop blindly: a quote only where it closes a string
            # the cursor's line opened (odd count before it), so the suffix's quote closes it instead.
            if rest_of_line not in QUOTES or _count_quote(line_before + body[:-1], rest_of_line) % 2:
                return body[:-1]
    lines = text.split("\n")
    following = _code_lines(suffix.split("\n", 1)[1] if "\n" in suffix else "", LATER_ANCHORS)
    later: set[str] = set()
    if rest_of_line:
        anchor = rest_of_line
    else:
        # The next code line, indentation kept: a later line of the completion repeats it only at the
        # same indent (``return None`` inside a new ``if`` body is new code, not the suffix's line).
        anchor = following[0] if following else ""
        if closes_block(anchor):
            # The block's closing line (`  }`) follows: the completion's same line at the same indent
            # closes that block again, unless it closes a bracket the completion itself opened.
            for i, line in enumerate(lines[1:], start=1):
                if line.rstrip() == anchor and not open_brackets("\n".join(lines[:i]), language):
                    return "\n".join(lines[:i])
            return text
        # The model sees the lines after the cursor's (a left-to-right prompt's suffix section) and may
        # copy one from a little further down (`return {` two lines below): a distinctive line of the
        # next few is the code that follows too -- for a later line of the answer at the cursor's own
        # indent, outside the answer's own brackets (an answer's `if err != nil {` body repeats real
        # code further down; its first line is judged by the next line alone).
        # A line the file has more than once (above the cursor or further down) is a pattern the code
        # repeats, not a copy: Go's `if err != nil {` after a new call, a test's assert.
        later = {ln for ln in following[1:] if len(ln.strip()) >= MIN_LATER_ANCHOR and not closes_block(ln)}
        if later:
            seen = Counter(line.strip() for line in prefix.split("\n")[:-1] + suffix.split("\n")[1:])
            later = {ln for ln in later if seen[ln.strip()] < 2}
    if len(anchor.strip()) < 2:
        anchor = ""  # too short to tell a copy from new code
    if not anchor and not later:
        return text
    base = indent_of(line_before) if not line_before.strip() else -1
    for i, line in enumerate(lines):
        if i == 0:  # starts at the cursor, mid-line: compared without indentation
            if not rest_of_line and anchor and (line_before + line).strip() == anchor.strip():
                return ""
        elif anchor and (line.strip() if rest_of_line else line.rstrip()) == anchor:
            return "\n".join(lines[:i])
        elif (line.rstrip() in later and indent_of(line) == base
              and not open_brackets("\n".join(lines[:i]), language)):
            return "\n".join(lines[:i])
    return text


def _cut_at_closer(text: str, closer: str, line_before: str, language: str = "") -> str | None:
    """``text`` up to where it first closes ``closer`` at its own top level (a bracket outside its own
    strings, comments (by ``language``) and brackets, with the closers right after it; a quote: before
    the first unescaped one, only where the cursor's line opened that string), or None where it never
    does or ``closer`` is neither."""
    if closer in QUOTES:
        if _count_quote(line_before, closer) % 2 == 0 or line_before.count(closer * 3) % 2:
            return None  # the cursor is not inside such a string (or inside a triple-quoted one)
        escaped = False
        for i, c in enumerate(text):
            if c == "\n":
                return None
            if c == closer and not escaped:
                return text[:i]
            escaped = c == "\\" and not escaped
        return None
    if closer not in CLOSERS:
        return None
    depth = 0
    for i, c in _code_brackets(text, language, line_before):
        if c in OPENERS:
            depth += 1
        elif depth:
            depth -= 1
        elif c != closer:
            return None  # another kind first: leave it to the other rules
        else:
            # with the closers that follow it: balance_brackets weighs them against the line's
            # (`foo(bar(|)` + `x)).strip()`: both are needed, one of them is the line's)
            end = i
            while end < len(text) and text[end] in CLOSERS:
                end += 1
            return text[:end]
    return None


# the first token of the rest of a line: a word, or one other character
_FIRST_TOKEN = re.compile(r"\s*(\w+|\S)")
# an answer that ends a statement or opens a block with the character the rest of its line ends with wrote
# its own version of that rest (`for | in cart.items:` + `item in cart:`)
_LINE_ENDS = frozenset(":;{")


def _cut_at_line_overrun(text: str, prefix: str, suffix: str, language: str = "") -> str | None:
    """A one-line answer that goes on over the rest of the cursor's line (not blank; a left-to-right
    model never sees it and writes its own): cut where its own version of that rest starts -- at its
    top level, the rest's first token (`[` + `x ** 2 for x in numbers]` + ` for n in numbers]`: `x ** 2`),
    else its first closer of a bracket it did not open. Only where the answer shows it went past the
    cursor's slot: its closers and those the file has after the cursor together close more than the
    prefix left open (`get(` + `'port'))` + `, 8080))`), or it ends with the character its line ends with
    (`:`, `;`, `{`). None where it does not."""
    rest = suffix.split("\n", 1)[0]
    if "\n" in text or not text.strip() or not rest.strip() or rest.lstrip()[0] in CLOSERS:
        return None  # a line that goes on with a closer: _cut_at_closer and balance_brackets weigh those
    tokens = _code_tokens(text, language, prefix.rsplit("\n", 1)[-1])
    # each character's bracket depth in the answer, and whether it is in one of its strings or comments
    level, inside = [0] * len(text), [False] * len(text)
    answer_closers: list[str] = []  # the closers of brackets it did not open
    first_closer = None
    depth = 0
    marks = {}
    for at, tok in tokens:
        if tok in OPENERS or tok in CLOSERS:
            marks[at] = tok
        else:
            for i in range(max(at, 0), min(at + len(tok), len(text))):
                inside[i] = True
    for i in range(len(text)):
        tok = marks.get(i)
        if tok in CLOSERS:
            if depth:
                depth -= 1
            else:
                answer_closers.append(tok)
                first_closer = i if first_closer is None else first_closer
        level[i] = depth
        if tok in OPENERS:
            depth += 1
    over = False
    if answer_closers:
        stack = open_brackets(prefix, language)
        later = _unmatched_closers(suffix, language)  # as balance_brackets counts them
        over = len(answer_closers) + len(later) > _closing(answer_closers + later, stack)
    end, line_end = text.rstrip()[-1], rest.rstrip()[-1]
    if not over and not (end in _LINE_ENDS and end == line_end and not inside[len(text.rstrip()) - 1]):
        return None
    stop = first_closer if over and first_closer is not None else len(text)
    token = _FIRST_TOKEN.match(rest).group(1)  # the rest is not blank
    word = _WORD_CHAR.match(token) is not None
    for j in range(stop):
        if level[j] or inside[j] or not text.startswith(token, j):
            continue
        if word and ((j and _WORD_CHAR.match(text[j - 1]))
                     or (j + len(token) < len(text) and _WORD_CHAR.match(text[j + len(token)]))):
            continue  # inside a longer word
        return text[:j].rstrip()
    return text[:stop].rstrip() if over else None


def drop_unclosed_openers(text: str, suffix: str, prefix: str = "", language: str = "") -> str:
    """A one-line answer in the middle of a line that opens a bracket nothing after it closes (a model
    that wanted a block there: `map((u) => ` + `{` + `).join(", ")`): cut before the first such opener.
    The file's closers after the cursor close the prefix's openers as they did before the answer."""
    if "\n" in text or not suffix.split("\n", 1)[0].strip():
        return text
    lead = prefix.rsplit("\n", 1)[-1]
    stack: list[tuple[int, str]] = []
    for at, c in _code_brackets(text, language, lead):
        if c in OPENERS and (text[at - 1] if at else lead[-1:]) == "\\":
            continue  # an escaped bracket (a regex's `\(`) opens nothing
        if c in OPENERS:
            stack.append((at, c))
        elif stack and stack[-1][1] == CLOSERS[c]:
            stack.pop()
    if not stack:
        return text
    before = open_brackets(prefix, language)
    later = _unmatched_closers(suffix, language)
    if _closing(later, before + [c for _, c in stack]) >= _closing(later, before) + len(stack):
        return text  # the line closes them (it had closers too many)
    return text[: stack[0][0]].rstrip()


# a string's prefix letters glued to its quote (Python's f/r/b/u and pairs, C++'s u8/L/R, C#'s @/$)
_STRING_PREFIX = re.compile(r"(?<![\w$@])(?:[rRbBuUfF]{1,2}|u8|L|[@$]{1,2})$")


_LISPS = frozenset({"emacs-lisp", "lisp", "commonlisp", "scheme", "racket", "clojure", "fennel"})


def drop_unclosed_string(text: str, suffix: str, prefix: str = "", language: str = "") -> str:
    """A one-line answer in the middle of a line that opens a string and stops inside it (the engine cut a
    loop or the token limit there: `["cli", ` + `"test", "test-api-test-api-test` + `],`): the string would
    run on over the rest of the line; cut before its quote, and a separator left before the line's closer.
    Not where the cursor is in a string or comment already (the answer's quote closes that one), nor
    where a quote of the rest of the line closes the answer's string."""
    rest = suffix.split("\n", 1)[0]
    if "\n" in text or not rest.strip() or language.lower() in PROSE_LANGUAGES:
        return text
    # a Rust `'` may be a lifetime, a Lisp's quotes a form
    quotes = '"' if language.lower() == "rust" or language.lower() in _LISPS else "\"'"
    lead = prefix.rsplit("\n", 1)[-1]
    if any(_count_quote(lead, q) % 2 for q in quotes):
        return text
    # read with the whole line: a string or comment that spans the cursor covers the answer's quotes
    covered = [False] * len(text)
    n = len(lead)
    for m in _bracket_tokens(language).finditer(lead + text + rest):
        if len(m.group()) > 1 or m.group() not in OPENERS and m.group() not in CLOSERS:
            for i in range(max(m.start() - n, 0), min(m.end() - n, len(text))):
                covered[i] = True
    escaped = False
    for i, c in enumerate(text):
        # a `'` right after a letter or digit is an apostrophe (`user's`, a docstring's prose), a prime
        # (`foldl'`) or a digit separator (`1'000`), unless those letters are a string's prefix (`f'`)
        near = (lead + text[:i])[-3:]
        glued = c == "'" and _WORD_CHAR.match(near[-1:]) is not None and not _STRING_PREFIX.search(near)
        if c in quotes and not covered[i] and not escaped and not glued:
            cut = _STRING_PREFIX.sub("", text[:i]).rstrip()  # `f"`, `rb'`: the prefix goes with its quote
            return cut[:-1].rstrip() if cut.endswith(",") and rest.lstrip()[:1] in CLOSERS else cut
        escaped = c == "\\" and not escaped
    return text


# a line written again right under itself is a small model's loop, unless it is as short as this or
# closes a block (`}` under `}`)
MIN_REPEATED_LINE = 12


def drop_repeated_line(text: str, prefix: str) -> str:
    """Cut the answer before its first line that repeats the line right above it (the document's, for an
    answer that starts on an empty line under it): the engine's loop rule keeps a loop's first copy,
    which may be the copy of the line above the cursor (a test's `assert` line again)."""
    lines = text.split("\n")
    cursor_line = prefix.rsplit("\n", 1)[-1]
    above = prefix.rsplit("\n", 2)[-2] if prefix.count("\n") and not cursor_line.strip() else None
    for i, line in enumerate(lines):
        whole = cursor_line + line if i == 0 else line
        prev = above if i == 0 else cursor_line + lines[0] if i == 1 else lines[i - 1]
        if (prev is not None and whole.rstrip() == prev.rstrip() and len(whole.strip()) >= MIN_REPEATED_LINE
                and _WORD_CHAR.search(whole) and not closes_block(whole)):
            return "\n".join(lines[:i])
    return text


def _count_quote(line: str, quote: str) -> int:
    """Unescaped ``quote`` characters in ``line``."""
    return line.count(quote) - line.count("\\" + quote)


def _first_code_line(text: str) -> str:
    """The first non-blank line, its indentation kept."""
    return next(iter(_code_lines(text, 1)), "")


# an answer line equal to one of the next LATER_ANCHORS code lines (beyond the first: any line that long)
# is the code that already follows the cursor
LATER_ANCHORS = 3
MIN_LATER_ANCHOR = 6


def _code_lines(text: str, n: int) -> list[str]:
    """The first ``n`` non-blank lines, their indentation kept."""
    out: list[str] = []
    for line in text.split("\n"):
        if len(out) == n:
            break
        if line.strip():
            out.append(line.rstrip())
    return out


def balance_brackets(text: str, suffix: str, prefix: str = "", language: str = "") -> str:
    """Drop trailing closers of the completion that the suffix already supplies.

    Only the closers too many: the completion's trailing closers and the suffix's leading ones
    together beyond the brackets left open before them (by the prefix and the completion) -- in
    ``foo(bar(`` + ``x)`` + ``)`` both closers are needed. A ``,``/``;`` after a kept closer stays.
    """
    trailing = _trailing_unmatched_closers(text, language, prefix.rsplit("\n", 1)[-1])  # [(index, char)]
    if not trailing:
        return text
    ahead = "".join(c for c in _leading_closer_run(suffix) if c in CLOSERS)
    chars = "".join(c for _, c in trailing)
    # Scanned as one text: a string the prefix opens may be closed by the completion.
    stack = open_brackets(prefix + text[: trailing[0][0]], language)
    # All the closers, the completion's then every one the file has after the cursor that closes
    # nothing of its own (the line's auto-closed `}`, then the function's), against the openers left
    # open: those beyond what they close are too many (`Item{` + `ID: 1}` + `}` + the function's `}`:
    # one). The file's later closers count, not only the line's: `load([path(` + `"a")]),` with the
    # call's `)` on the next line needs every one of its own.
    later = "".join(_unmatched_closers(suffix, language))
    extra = len(chars) + len(later) - _closing(chars + later, stack)
    for j in range(min(len(chars), len(ahead), extra), 0, -1):
        if chars[-j:] == ahead[:j]:
            return text[: trailing[-j][0]].rstrip(" \t")
    return text


def _closing(closers: Sequence[str], stack: Sequence[str]) -> int:
    """How many of ``closers`` close the openers of ``stack`` in turn, from the innermost out, while the
    kinds match (a function's `{` stays open after a line's `)`s)."""
    n = 0
    for c in closers:
        if n == len(stack) or stack[-1 - n] != CLOSERS[c]:
            break
        n += 1
    return n


def _code_brackets(text: str, language: str = "", lead: str = "") -> list[tuple[int, str]]:
    """The brackets of ``text`` (offset, character) outside its strings and the comments of ``language``
    (a Rust lifetime's ``'`` opens no string). ``lead``: the cursor line's text before ``text``, read
    with it (`print("color: ` + `#fff")`: the string goes on, no comment), unless the cursor is in a
    comment (`# see f(` + `x)`) or in code inside a string (`${`, `f"{`): the answer is read alone. A
    quote that has no partner is no string: it closes one the prefix opened (`print("a (` + `b")`)."""
    return [(at, tok) for at, tok in _code_tokens(text, language, lead)
            if at >= 0 and (tok in OPENERS or tok in CLOSERS)]


def _code_tokens(text: str, language: str = "", lead: str = "") -> list[tuple[int, str]]:
    """The strings, comments and brackets of ``text`` as _code_brackets reads it (offset, text); a string
    or comment that ``lead`` opened and ``text`` goes on in has a negative offset."""
    tokens = _bracket_tokens(language)
    n = len(lead)
    whole = lead + text
    if n:
        for m in tokens.finditer(whole):
            if m.end() > n:
                opened = m.group()[: n - m.start()]
                if m.start() < n and (m.group()[0] not in QUOTES or opened.count("{") > opened.count("}")):
                    n, whole = 0, text  # a comment the cursor is in, or code in a string (`${`, f"{")
                break
    return [(m.start() - n, m.group()) for m in tokens.finditer(whole) if m.end() > n]


def _unmatched_closers(code: str, language: str = "") -> list[str]:
    """The closers of ``code`` that close no opener of its own, in order (those of the text after the
    cursor close what the prefix left open)."""
    stack: list[str] = []
    out: list[str] = []
    for _, c in _code_brackets(code, language):
        if c in OPENERS:
            stack.append(c)
        elif CLOSERS[c] in stack:  # as open_brackets: it gives up the openers above its own
            del stack[len(stack) - 1 - stack[::-1].index(CLOSERS[c]):]
        else:
            out.append(c)
    return out


def open_brackets(code: str, language: str = "") -> list[str]:
    """The openers left open at the end of ``code``; brackets in one-line string literals are skipped,
    and in the comments (and Python's triple-quoted strings) of a ``language`` listed in ``_COMMENTS``.

    A closer whose opener is deeper in the stack closes it and gives up the ones above it (a stray
    opener from a comment or a multi-line string); a closer with no opener is ignored (a window cut).
    """
    stack: list[tuple[str, int]] = []  # (opener, offset)
    spans: list[tuple[int, int]] = []  # multi-line strings and comments: their lines say nothing of brackets
    for m in _bracket_tokens(language).finditer(code):
        c = m.group()
        if len(c) > 1:
            if "\n" in c:
                spans.append(m.span())
        elif c in OPENERS:
            stack.append((c, m.start()))
        elif c in CLOSERS:
            for k in range(len(stack) - 1, -1, -1):
                if stack[k][0] == CLOSERS[c]:
                    del stack[k:]
                    break
    if not stack:
        return []
    kept = _stray_after(code, spans)
    return [c for c, at in stack if c == "{" or kept(at)]


def _stray_after(code: str, spans: Sequence[tuple[int, int]] = ()):
    """``kept(offset)``: False for a ``(``/``[`` that code after it shows was never open -- a later line
    at its line's indentation or less that does not start with a closer (a bracket in a comment or regex
    the rules above did not see, a macro's ``(``). Such a bracket really open has its later lines
    indented under it; a ``{`` need not (Go's ``case``, a C++ namespace's body), so the caller keeps
    those. Lines that start inside ``spans`` (multi-line strings and comments) do not count. One pass
    over the lines, then a lookup per opener."""
    starts = [0]
    starts.extend(i + 1 for i, c in enumerate(code) if c == "\n")
    inside = set()
    for lo, hi in spans:
        first = bisect.bisect_right(starts, lo)  # the lines that start after the span's first character
        last = bisect.bisect_left(starts, hi)
        inside.update(range(first, last))
    # least_after[k]: the least indentation of a line from line k on that would close a block (not
    # blank, not starting with a closer)
    least_after = [float("inf")] * (len(starts) + 1)
    for k in range(len(starts) - 1, -1, -1):
        end = starts[k + 1] - 1 if k + 1 < len(starts) else len(code)
        line = code[starts[k]:end]
        body = line.lstrip(" \t")
        here = len(line) - len(body) if body and body[0] not in CLOSERS and k not in inside else float("inf")
        least_after[k] = min(here, least_after[k + 1])

    def kept(at: int) -> bool:
        k = bisect.bisect_right(starts, at) - 1
        return least_after[k + 1] > indent_of(code[starts[k]:at])

    return kept


def _trailing_unmatched_closers(text: str, language: str = "", lead: str = "") -> list[tuple[int, str]]:
    """The closers at the end of ``text`` that close no opener of its own (its strings' skipped; ``lead``:
    the cursor line before it, as _code_brackets reads it)."""
    stack: list[str] = []
    unmatched: list[tuple[int, str]] = []
    for i, c in _code_brackets(text, language, lead):
        if c in OPENERS:
            stack.append(c)
        elif stack and stack[-1] == CLOSERS[c]:
            stack.pop()
        else:
            unmatched.append((i, c))
    tail: list[tuple[int, str]] = []
    end = len(text.rstrip())
    for i, c in reversed(unmatched):
        if text[i + 1 : end].strip(" \t\r\n;,") == "":
            tail.insert(0, (i, c))
            end = i
        else:
            break
    return tail


def _leading_closer_run(suffix: str) -> str:
    out = []
    for c in suffix:
        if c in CLOSERS or c in " \t\r\n":
            out.append(c)
        else:
            break
    return "".join(out)


def _trim_trailing_blank(text: str, keep_space: bool = False) -> str:
    lines = text.split("\n")
    while lines and not lines[-1].strip():
        lines.pop()
    text = "\n".join(lines)
    return text if keep_space and "\n" not in text else text.rstrip(" \t")
