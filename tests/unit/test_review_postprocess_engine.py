"""Review of the post-processing and stop-rule changes since 47ef279: defects found, one test each.

1. drop_unclosed_string reads an apostrophe (`user's`, `don't`), a Haskell prime (`foldl'`), a C++ digit
   separator (`1'000`) or a Lisp quote (`'foo`) as the opening quote of a string the answer leaves open, and
   cuts the suggestion there -- in docstrings and block comments continued from a line above, HTML/XML/JSX
   text, and code of those languages.
2. engine.stops._drop_unfinished_line steps back over block-opening lines (`) -> list:`) past the point where
   the answer's own brackets are closed, and leaves a multi-line signature or condition open.
"""

from __future__ import annotations

import pytest

from engine.stops import _StopRules
from lsp_server.postprocess import postprocess
from tests.unit.lsp.test_postprocess_real import shown  # the document with █ at the cursor, as the editor path shapes it


@pytest.mark.parametrize(
    "language, document, raw",
    [
        # a docstring's / block comment's later line: the cursor is in prose, the `'` is an apostrophe
        ("python", 'def name(user):\n    """Return the name.\n\n    Falls back to █.\n    """\n', "the user's login"),
        ("javascript", "/**\n * Returns █.\n */\nfunction f() {}\n", "the user's display name"),
        ("c", "/*\n * Frees █ buffer.\n */\n", "the caller's"),
        # markup text
        ("html", "<p>Welcome to █</p>\n", "John's homepage"),
        ("javascriptreact", "  return <p>█</p>;\n", "Don't forget to save"),
        # a prime, a digit separator, a Lisp quote
        ("haskell", "  let total = █ in total\n", "foldl' (+) 0 xs"),
        ("cpp", "    int n = █;\n", "1'000"),
        ("clojure", "(map inc █)\n", "'(1 2 3)"),
    ],
)
def test_a_quote_glued_to_a_word_or_a_lisp_quote_opens_no_string(language, document, raw):
    assert shown(document, raw, language) == raw


@pytest.mark.parametrize(
    "language, document, raw, expected",
    [
        # still cut: a real string the answer left open, with its prefix letters (as test_postprocess_real)
        ("json", '{\n  "keywords": ["cli", █],\n}\n', '"test", "test-api-test-api-test', '"test"'),
        ("python", "    print(█)\n", "f'{len(message)} bytes to be consumed", ""),
    ],
)
def test_an_open_string_is_still_cut(language, document, raw, expected):
    assert shown(document, raw, language) == expected


class Pieces:
    def __init__(self, items: list[str]):
        self.items = items

    def decode(self, ids) -> str:
        return "".join(self.items[i] for i in ids)


@pytest.mark.parametrize(
    "text, kept",
    [
        # Black's multi-line signature: `) -> list:` opens the body, but the lines before it hold an open `(`
        ("\ndef process(\n    items,\n    limit=10,\n) -> list:\n    for x in items:\n        y = f(",
         "\ndef process(\n    items,\n    limit=10,\n) -> list:"),
        ("\n    with open(\n        path\n    ) as fh:\n        data = json.lo",
         "\n    with open(\n        path\n    ) as fh:"),
        ("\n    if (\n        a and b\n    ):\n        return f(", "\n    if (\n        a and b\n    ):"),
    ],
)
def test_a_limit_stop_never_ends_inside_the_answers_own_brackets(text, kept):
    tok = Pieces(list(text))
    rules = _StopRules(tok, (), 0, 0.0, -1)
    got = rules.cut(text, "max_tokens")
    assert got.count("(") == got.count(")"), got
    assert got == kept


def test_the_first_repeat_of_a_line_under_an_indented_cursor_is_dropped_and_an_escaped_bracket_opens_nothing():
    """`def f():\n    █` + the same print three times: the answer's first line is compared with the
    cursor line's indentation (two copies were kept); `s.replace(█, "")` + a regex with `\\(` lost its tail."""
    raw = 'print("hello world")\n    print("hello world")\n    print("hello world")'
    got = postprocess(raw, "def f():\n    ", "\n", "multi-line", 12, "python", sees_line_rest=False)
    assert got == 'print("hello world")'
    assert postprocess("/\\s*\\(.*$/", "s.replace(", ', "");\n', "single-line", 1, "javascript",
                       sees_line_rest=False) == "/\\s*\\(.*$/"


def test_a_folder_holding_one_upper_case_gguf_runs_it(tmp_path):
    from engine.gguf import resolve_gguf

    (tmp_path / "Model.GGUF").write_bytes(b"GGUF")
    assert resolve_gguf(str(tmp_path)) == tmp_path / "Model.GGUF"
