"""Post-processing of answers the real default model (SmolLM2-135M, left-to-right prompt) gave.

Each raw text was captured from `draftline complete`'s pipeline at the cursor shown; the model never
saw the rest of the cursor's line, so it often writes its own version of it. What the user is shown
must fit in front of the text that is already there."""

from __future__ import annotations

import pytest

from lsp_server.postprocess import choose_mode, postprocess

CURSOR = "█"


def shown(document: str, raw: str, language: str) -> str:
    before, after = document.split(CURSOR)
    mode = choose_mode(before, after, "auto", language)
    return postprocess(raw, before, after, mode, 12 if mode == "multi-line" else 1, language, sees_line_rest=False)


@pytest.mark.parametrize(
    "language, document, raw, expected",
    [
        # the answer closes the call the cursor is in, which the line closes too: it stops where the
        # line's own next argument starts (`, errNotFound)`), or at its closer
        ("go", '\treturn fmt.Errorf("open %s: %w", █, errNotFound)\n', "path, nil)", "path"),
        ("python", "    with open(█, encoding=\"utf-8\") as fh:\n", "path, 'r') as f:", "path"),
        ("python", "    return template.format(█, **context)\n", "context=context)", "context=context"),
        ("python", "    return int(config.get(█, 8080))\n", "'port'))", "'port'"),
        ("javascript", "  if (█ && user.active) {\n", "user) {", "user"),
        ("python", "    print(█ + str(score))\n", 'f"Hello, {name}! You scored {score}!")',
         'f"Hello, {name}! You scored {score}!"'),
        # the answer's own version of the rest of the line: it stops where that starts
        ("python", "    return [█ for n in numbers]\n", "x ** 2 for x in numbers]", "x ** 2"),
        ("python", "    return sum(█ for o in orders)\n", "order.total_value for order in orders)",
         "order.total_value"),
        ("python", "    return xs[█:]\n", "1::3]", "1"),
        ("python", "    for █ in cart.items:\n        total += 1\n", "item in cart:", "item"),
        # the whole answer is another version of the rest of the line: nothing fits in front of it
        ("python", "        if █self.ready:\n            self.start()\n", 'self.name == "Job":', ""),
        ("javascript", '  return n === 1 ? █ : "items";\n', '"1" : n === 2 ? "2" : "3";', '"1"'),
    ],
)
def test_an_answer_that_runs_over_the_rest_of_the_line_stops_before_it(language, document, raw, expected):
    assert shown(document, raw, language) == expected


@pytest.mark.parametrize(
    "language, document, raw, expected",
    [
        # new code in front of the rest of the line, with its own balanced brackets: kept
        ("python", "    if █self.ready:\n", "self.enabled and ", "self.enabled and "),
        ("python", "    foo(self.a█, self.b)\n", ", self.c", ", self.c"),
        ("python", "    x = f(█, y)\n", "g(1, 2)", "g(1, 2)"),
        ("python", "    total = █ + 1\n", "a + b", "a + b"),
        # the answer closes only what it opened
        ("python", "    print(█ + str(score))\n", "len(name)", "len(name)"),
        # the line closes the cursor's bracket right after it: the rules before this one decide
        ("python", "        data = json.load(█)\n", "fh)", "fh"),
        ("rust", "    xs.iter().map(|x| █).collect()\n", "x * 2).unwrap()", "x * 2"),
    ],
)
def test_an_answer_that_fits_before_the_rest_of_the_line_is_kept(language, document, raw, expected):
    assert shown(document, raw, language) == expected


@pytest.mark.parametrize(
    "language, document, raw, expected",
    [
        # the model wants a block body mid-line; the one-line answer is its opening bracket alone, which
        # nothing in the file closes (`map((u) => {).join(", ")`)
        ("javascript", 'function names(users) {\n  return users.map((u) => █).join(", ");\n}\n', "{", ""),
        ("javascript", "function sleep(ms) {\n  return new Promise((resolve) => █);\n}\n", "{", ""),
    ],
)
def test_a_one_line_answer_mid_line_leaves_no_bracket_open(language, document, raw, expected):
    assert shown(document, raw, language) == expected


@pytest.mark.parametrize(
    "language, document, raw, expected",
    [
        # a closer the line supplies after the answer's opener: balanced, kept
        ("python", "    x = █\n", "foo(", "foo("),  # nothing after the cursor: a line still being written
        ("javascript", "  items.forEach(█);\n", "(item) => console.log(item)", "(item) => console.log(item)"),
    ],
)
def test_a_one_line_answer_with_its_brackets_closed_is_kept(language, document, raw, expected):
    assert shown(document, raw, language) == expected


@pytest.mark.parametrize(
    "language, document, raw, expected",
    [
        # the answer is the line right above it again (the engine cut the model's loop after its first copy)
        ("python", "def test_add():\n    assert add(1, 2) == 3\n    █\n", "assert add(1, 2) == 3", ""),
        # a line of the answer that is the answer's line above it again: the loop starts there
        ("python", "import os\nimport sys\n█\n", "import tempfile\nimport tempfile\nimport tempfile.Spaamath",
         "import tempfile"),
    ],
)
def test_a_line_written_twice_in_a_row_is_not_suggested_again(language, document, raw, expected):
    assert shown(document, raw, language) == expected


@pytest.mark.parametrize(
    "language, document, raw, expected",
    [
        # closers and short lines repeat in real code
        ("javascript", "function f() {\n  if (a) {\n    if (b) {\n      g();\n    }\n█", "  }\n}", "  }\n}"),
        ("python", "def f(it):\n    next(it)\n    █\n", "next(it)", "next(it)"),
        # the same line further up is a pattern, not a loop
        ("python", "def test_add():\n    assert add(1, 2) == 3\n    x = 1\n    █\n", "assert add(1, 2) == 3",
         "assert add(1, 2) == 3"),
    ],
)
def test_a_line_that_may_repeat_is_kept(language, document, raw, expected):
    assert shown(document, raw, language) == expected


@pytest.mark.parametrize(
    "language, document, raw, expected",
    [
        # the line goes on after a blank with the word the answer starts with: the answer is its own
        # version of the rest of the line, nothing to insert in front of it
        ("markdown", "# Project\n\nThis library parses █ and returns a tree.\n", "and executes a Python script.", ""),
        # new words in front of it are kept
        ("markdown", "# Project\n\nThis library parses █ and returns a tree.\n", "JSON", "JSON"),
    ],
)
def test_an_answer_that_retypes_the_words_after_a_blank_adds_nothing(language, document, raw, expected):
    assert shown(document, raw, language) == expected


@pytest.mark.parametrize(
    "language, document, raw, expected",
    [
        # the engine cut a loop inside a string: the string the answer opened is left open, and would run
        # on over the rest of the line; the answer ends before it (and its separator, before the `]`)
        ("json", '{\n  "name": "demo",\n  "keywords": ["cli", █],\n  "license": "MIT"\n}\n',
         '"test", "test-api-test-api-test', '"test"'),
        ("", '{\n  "name": "demo",\n  "keywords": ["cli", █],\n  "license": "MIT"\n}\n',
         '"test", "test-api-test-api-test', '"test"'),
    ],
)
def test_a_one_line_answer_mid_line_leaves_no_string_open(language, document, raw, expected):
    assert shown(document, raw, language) == expected


@pytest.mark.parametrize(
    "language, document, raw, expected",
    [
        # the cursor is in a string: the answer's quote closes it
        ("python", '    log.info("█")\n', 'Connecting to {0} on {1}...".format(host, port))',
         "Connecting to {0} on {1}..."),
        # an apostrophe in a comment, a Rust lifetime
        ("python", "    x = f(█)  # see\n", "a)  # don't", "a"),
        ("rust", "fn f(█) {}\n", "x: &'a str", "x: &'a str"),
        ("python", "    # Compute the area █of a circle\n", "(don't round) ", "(don't round) "),
        ("c", "    /* the caller █owns it */\n", "(it's freed) ", "(it's freed) "),
    ],
)
def test_a_quote_that_is_no_open_string_is_kept(language, document, raw, expected):
    assert shown(document, raw, language) == expected


def test_a_cut_string_takes_its_prefix_letters_with_it():
    """`print(` + `f'{len(m)} bytes")` (the model's quotes do not match): cut before the quote, the `f` alone
    was suggested."""
    got = postprocess("f'{len(message)} bytes to be consumed\")", "    print(", ")\n", "single-line", 1, "python")
    assert got == ""
    assert postprocess('name, rb"abc', "f(", ")\n", "single-line", 1, "python") == "name"
