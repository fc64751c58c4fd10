"""Golden post-processing cases: each file marks the cursor with █ in the document."""

from __future__ import annotations

from pathlib import Path

import pytest

from lsp_server.completer import build_request
from lsp_server.config import CompletionConfig
from lsp_server.documents import Snapshot
from lsp_server.postprocess import choose_mode, cut_at_scope_end, indent_of, postprocess, scope_min_indent

CURSOR = "█"
CASES = sorted((Path(__file__).parent / "golden" / "postprocess").glob("*.txt"))


def parse(path: Path) -> dict[str, str]:
    """Header lines (``key: value``), then ``--- section`` blocks; a block's last newline is not content."""
    sections: dict[str, list[str]] = {"header": []}
    current = "header"
    for line in path.read_text(encoding="utf-8").split("\n"):
        if line.startswith("--- "):
            current = line[4:].strip()
            sections[current] = []
        else:
            sections[current].append(line)
    out = {name: "\n".join(lines) for name, lines in sections.items()}
    out = {name: text[:-1] if name != "header" and text.endswith("\n") else text for name, text in out.items()}
    for line in sections["header"]:
        key, _, value = line.partition(":")
        if key == "setting":
            out["setting"] = value.strip()
    return out


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_golden(path: Path):
    case = parse(path)
    before, after = case["document"].split(CURSOR)
    mode = choose_mode(before, after, case.get("setting", "auto"))
    assert mode == case["mode"]
    assert postprocess(case["completion"], before, after, mode) == case["expected"]


def test_there_are_golden_cases():
    assert len(CASES) >= 10


@pytest.mark.parametrize(
    "text, prefix, suffix, mode, expected",
    [
        # single-line: the first line without its "\r"
        ("x = 1\r\ny = 2", "a = 0\r\n", "\r\n", "single-line", "x = 1"),
        # the scope cut leaves no "\r" either; the kept lines keep CRLF
        ("a = 1\r\n    b = 2\r\nc = 3", "def f():\r\n    ", "\r\n", "multi-line", "a = 1\r\n    b = 2"),
        # a closer the suffix's next line supplies is dropped, as in an LF document
        ("a,\r\n    b\r\n)", "foo(\r\n    ", "\r\n)\r\n", "multi-line", "a,\r\n    b"),
        # an LF document gets LF even where the model wrote CRLF
        ("a = 1\r\n    b = 2", "def f():\n    ", "\n", "multi-line", "a = 1\n    b = 2"),
        # a "\r" the engine's cut left at the end (it cuts at "\n"): not part of the answer
        ("shape.area()\r", "total += ", "\r\n\r\n", "single-line", "shape.area()"),
        ("self.x = x, self.y = y\r", "class Point:\r\n    def __init__(self, x, y):\r\n        ", "\r\n",
         "multi-line", "self.x = x, self.y = y"),
        # bare CR line ends (LSP allows them) get bare CRs, and the rules see lines
        ("a = 1\n    b = 2\nc = 3", "def f():\r    ", "\r", "multi-line", "a = 1\r    b = 2"),
        ("import os", "def f():\r    ", "import json\r", "single-line", "import os"),
        # the first line, its suffix window cut after a "\r": the model's own line end decides
        ("x = 1\r\ny = 2", "a = ", "b" * 20 + "\r", "multi-line", "x = 1\r\ny = 2"),
    ],
)
def test_crlf_documents(text, prefix, suffix, mode, expected):
    assert postprocess(text, prefix, suffix, mode) == expected


@pytest.mark.parametrize(
    "text, prefix, suffix, expected",
    [
        # a bracket in a string of the prefix is not left open: the completion's closer is one too many
        ("x)", 's = "("\nfoo(', ")", "x"),
        # the completion closes the string the prefix opened; the bracket in it does not count
        ('b")', 'print("a (', ")", 'b"'),
    ],
)
def test_brackets_in_strings_do_not_count(text, prefix, suffix, expected):
    assert postprocess(text, prefix, suffix, "single-line") == expected


@pytest.mark.parametrize(
    "language, prefix, text, suffix, expected",
    [
        # an opener in a comment is not left open: foo(bar( needs two closers, the suffix has one
        ("python", "# see (below\nfoo(bar(", "x))", ")", "x)"),
        ("python", '"""Docs (a [list\n"""\nfoo(bar(', "x))", ")", "x)"),
        ("python", "'''(\n'''\nfoo(bar(", "x))", ")", "x)"),
        ("go", "// see (below\nfoo(bar(", "x))", ")", "x)"),
        ("typescript", "/* a (\n * [b\n */\nfoo(bar(", "x))", ")", "x)"),
        ("rust", "fn f<'a>(x: &'a str) -> X {\n    g(h(", "x))", ")", "x)"),  # a lifetime opens no string
        ("lua", "-- (\nf(g(", "x))", ")", "x)"),
        # a comment marker in a string is no comment; Python's // is floor division, no comment
        ("python", 's = "# ("\nfoo(bar(', "x))", ")", "x)"),
        ("python", "y = a // (b + f(", "c))", ")", "c)"),
        ("c", '#include "a.h"\nf(g(', "x))", ")", "x)"),
        # the function's { stays open after the line: only the line's two ( count against the closers
        ("javascript", "function f() {\n  g(h(", "x))", ")", "x)"),
        ("javascript", "function f() {\n  g([h(", "x)])", "])", "x)"),
        # a language without a listed comment syntax: the comment's ( counts where the lines after it are
        # indented under it (it may be open), not where code at its indent follows (it cannot be)
        ("", "# see (below\n    foo(bar(", "x))", ")", "x))"),
        ("python", "# see (below\n    foo(bar(", "x))", ")", "x)"),
        ("", "# see (below\nfoo(bar(", "x))", ")", "x)"),
        ("javascript", "s = t.replace(/\\(/g, '');\nconst x = foo(", "a)", ");", "a"),  # a regex literal's (
        ("c", "#define OPEN (\nint x = foo(", "a)", ");", "a"),  # a macro's (
        # a bracket really open: its lines are indented under it (or the line starts with a closer)
        ("python", "foo(\n    bar(", "x)", ")", "x)"),  # both open: the suffix's ) closes bar, x) foo
        ("python", "x = {\n    'a': f(1),\n    'b': g(", "2)", ")}", "2"),
        ("python", "x = f(\n    a,\n)\ny = g(h(", "1))", ")", "1)"),
        ("emacs-lisp", ";; Commentary (see README\n(defun f ()\n  (foo (bar ", "a)", "))", "a)"),
    ],
)
def test_brackets_in_comments_do_not_count(language, prefix, text, suffix, expected):
    assert postprocess(text, prefix, suffix, "single-line", language=language) == expected


@pytest.mark.parametrize(
    "language, prefix, text, suffix, mode, expected",
    [
        # a { need not indent what follows it: Go's case labels, a C++ namespace's body
        ("go", "func f(x int) {\n\tswitch x {\n\tcase 1:\n\t\treturn\n\t", "default:\n\t\treturn\n\t}", "\n}\n",
         "multi-line", "default:\n\t\treturn\n\t}"),
        ("cpp", "namespace ns {\n\nint f() {\n  ", "return 0;\n}", "\n}  // namespace ns\n", "multi-line", "return 0;\n}"),
        # the lines of a multi-line string inside the brackets say nothing of them
        ("python", 'def main():\n    parser.add_argument(\n        "--x", help="""\nHelp text.\n""", default=f(g(',
         "1))", ")", "single-line", "1))"),
    ],
)
def test_openers_that_are_open_after_lines_at_their_indent(language, prefix, text, suffix, mode, expected):
    assert postprocess(text, prefix, suffix, mode, language=language) == expected


@pytest.mark.parametrize(
    "language, prefix, text, suffix, mode, expected",
    [
        # the block's closing line follows the cursor: the completion's same line would close it twice
        ("javascript", "function count(items) {\n  let n = 0;\n  if (items) {\n    ", "n++;\n  }", "\n  }\n  return n;\n}\n",
         "multi-line", "n++;"),
        ("c", "int sum(int *a, int n) {\n    for (int i = 0; i < n; i++) {\n        ", "s += a[i];\n    }",
         "\n    }\n    return s;\n}\n", "multi-line", "s += a[i];"),
        ("go", "func sum(xs []int) int {\n\tfor _, x := range xs {\n\t\t", "s += x\n\t}", "\n\t}\n\treturn s\n}\n",
         "multi-line", "s += x"),
        # unless it closes a block the completion opened itself
        ("javascript", "function f() {\n  if (x) {\n    a();\n  ", "if (y) {\n    b();\n  }", "\n  }\n}\n",
         "multi-line", "if (y) {\n    b();\n  }"),
        # an answer that starts by retyping the text after the cursor adds nothing there
        ("python", "def add(a, b):\n    return a + ", "b", "b\n", "single-line", ""),
        ("python", "    return tot", "al", "alx\n", "single-line", ""),
        ("python", "data = [0, 1, 1016, ", "1017, 1018, 1019, 1020, 1021", "1017, 1018, 1019, 1020]\n", "single-line", ""),
        # an auto-closed pair after the cursor: the answer stops where it closes that pair itself
        ("python", 'def hello(name):\n    return f"Hello, {', 'name}!"', '}"\n', "single-line", "name"),
        ("python", 'def greet(name):\n    log.info("', 'Hello, {}!".format(name))', '")\n', "single-line", "Hello, {}!"),
        ("python", "x = f(", "a, b).strip()", ")\n", "single-line", "a, b"),
        ("python", "x = foo(bar(", "x)).strip()", ")\n", "single-line", "x)"),  # bar's ) is the line's, foo's is not
        ("python", "x = f(", "g(y)", ")\n", "single-line", "g(y)"),  # closes only what it opened: kept
        ("python", 'x = f(', '"a)b")', ")\n", "single-line", '"a)b"'),  # a closer in its own string does not count
        # closers shared with the rest are not retyping: balance_brackets weighs them
        ("python", "print(len(x", "))", ")\n", "single-line", ")"),
        ("c", "if (foo(x", ")", ") {\n", "single-line", ")"),
        # new code before an existing word: kept (the shared part ends inside a word, or holds none)
        ("python", "if ", "self.enabled and x", "self.ready:\n", "single-line", "self.enabled and x"),
        ("python", "foo(self.a", ", self.c", ", self.b)\n", "single-line", ", self.c"),
        ("python", "if ", "not y and x", "not x:\n", "single-line", "not y and x"),
        # an answer closing the string with the line's own text and going on: that text is cut off its end
        ("python", 'f = open("data.csv', '", "w")', '")\n', "single-line", '", "w'),  # open("data.csv", "w")
        ("python", 'print("hello', '", end="")', '")\n', "single-line", '", end="'),
        # inside a triple-quoted string a lone quote closes nothing
        ("python", '    """', 'Return the "best" match.', '"""\n', "single-line", 'Return the "best" match.'),
        ("python", "    '''", "Don't stop.", "'''\n", "single-line", "Don't stop."),
        # a forced multi-line answer with a trailing newline, mid-line: as a single line
        ("python", 'def hello():\n    print("Hello, wor', 'ld!")\n', '")\n', "multi-line", "ld!"),
    ],
)
def test_the_text_after_the_cursor_is_not_written_again(language, prefix, text, suffix, mode, expected):
    assert postprocess(text, prefix, suffix, mode, language=language) == expected


def test_a_quote_that_opens_a_string_is_kept():
    # before the completion's quote the line's strings are closed: it opens one, the suffix's does not close it
    assert postprocess('b"', 's = "a" + ', '"', "single-line") == 'b"'


def test_a_multi_character_rest_of_line_is_still_dropped():
    assert postprocess('hi")', 'print("', '")', "single-line") == "hi"
    assert postprocess("1);", "foo(", ");", "single-line") == "1"


@pytest.mark.parametrize(
    "language, prefix, text, suffix, expected",
    [
        # the closer right after the cursor is the innermost opener's (an auto-closed pair): a completion
        # that closes that opener too writes it twice, though the function's `{` (closed further down) is open
        ("go", "func (s *Store) Add(title string) Item {\n\titem := Item{", "ID: 1, Title: title}",
         "}\n\ts.items = append(s.items, item)\n\treturn item\n}\n", "ID: 1, Title: title"),
        ("typescript", "export function greet(user: User): string {\n  return `Hello, ${user.", "name}!`;",
         "}`;\n}\n", "name"),
        ("shellscript", 'make_archive() {\n    log "created ${', 'SRC_DIR} archive created"', '}"\n}\n', "SRC_DIR"),
        # the cursor on the line that closes an `if`, before its `}`
        ("go", "func (s *Store) Pending() []Item {\n\tfor _, it := range s.items {\n\t\tif !it.Done {\n"
               "\t\t\tout = append(out, it)\n\t\t", "}", "}\n\t\t\n\t}\n\treturn out\n}\n", ""),
    ],
)
def test_a_closer_after_the_cursor_is_not_written_again_inside_a_block(language, prefix, text, suffix, expected):
    assert postprocess(text, prefix, suffix, "single-line", language=language) == expected


@pytest.mark.parametrize(
    "language, prefix, text, suffix, expected",
    [
        # a Rust lifetime opens no string: the answer stops where it closes the line's `(`
        ("rust", "pub fn last_word<'a>(", "text: &'a str) -> &'a str {",
         ")\n\npub fn count_by_name(shapes: &[Shape]) -> HashMap<&'static str, usize> {\n", "text: &'a str"),
        # a bracket in the completion's own string or char literal closes nothing
        ("rust", "fn f() {\n    foo(", "'(')", ")\n}\n", "'('"),
        ("python", "def f():\n    foo(", '"(")', ")\n", '"("'),
    ],
)
def test_the_completions_strings_follow_the_language(language, prefix, text, suffix, expected):
    assert postprocess(text, prefix, suffix, "single-line", language=language) == expected


@pytest.mark.parametrize(
    "language, prefix, text, suffix, expected",
    [
        # no comment inside a template literal, a raw string, a regex, CSS's bare url(), a shell
        # parameter's `${#`, nor in a string the cursor's line opened: the answer's `)` is the line's
        ("javascript", "async function get(id) {\n  const r = await fetch(", "`https://api.example.com/users/${id}`)",
         ")\n}\n", "`https://api.example.com/users/${id}`"),
        ("typescript", "function host(u: string) {\n  return u.replace(", "/^https?:\\/\\//, '')", ")\n}\n",
         "/^https?:\\/\\//, ''"),
        ("go", "var urlRe = regexp.MustCompile(", "`https?://[^\\s]+`)", ")\n", "`https?://[^\\s]+`"),
        ("css", ".hero {\n  background: url(", "https://example.com/bg.png);", ")\n}\n", "https://example.com/bg.png"),
        ("shellscript", "count() {\n  n=$(", "echo ${#items[@]})", ")\n}\n", "echo ${#items[@]}"),
        ("ruby", 'def greet(name)\n  puts("Hello, ', '#{name}!")', ")\nend\n", '#{name}!"'),
        ("python", 'def f():\n    print("color: ', '#fff")', ")\n", '#fff"'),
        # the cursor in a comment: the answer's brackets are read as code (its `)` is the line's)
        ("python", "def f():\n    x = 1  # see foo(", "bar)", ")\n", "bar"),
    ],
)
def test_strings_and_comments_are_read_with_the_cursor_s_line(language, prefix, text, suffix, expected):
    assert postprocess(text, prefix, suffix, "single-line", language=language) == expected


@pytest.mark.parametrize(
    "language, line",
    [
        ("lua", "  if self.first > self.last then"),
        ("lua", "  for i = 1, n do"),
        ("lua", "  while x do"),
        ("lua", "  else"),
        ("lua", "  repeat"),
        ("lua", "function Queue:pop()"),
        ("lua", "local function f(x)"),
        ("lua", "  table.sort(t, function(a, b)"),
        ("shellscript", '    if [ ! -d "$SRC_DIR" ]; then'),
        ("shellscript", "    for f in *; do"),
        ("shellscript", "    while read -r line; do"),
        ("shellscript", "    elif [ -z $x ]; then"),
        ("shellscript", "    else"),
        ("ruby", "    @rows.each do |row|"),
        ("ruby", "    loop do"),
        ("ruby", "  def top(n)"),
        ("ruby", "  def to_s"),
        ("ruby", "class Report < Base"),
        ("ruby", "    if total > 0"),
        ("ruby", "    elsif total < 0"),
        ("ruby", "    begin"),
        ("ruby", "    rows.map { |r|"),
    ],
)
def test_keyword_block_openers(language, line):
    prefix = "x = 1\n" + line
    assert choose_mode(prefix, "\n", language=language) == "multi-line"
    assert scope_min_indent(prefix, language) == indent_of(line) + 1


@pytest.mark.parametrize(
    "language, line",
    [
        ("python", "    if x then"),  # another language: unchanged
        ("lua", "  local done = x"),
        ("shellscript", "    echo done"),
        ("ruby", "    return if done"),  # a modifier `if` opens no block
        ("ruby", "  def to_s; name; end"),
        ("ruby", "  def"),  # a keyword still being typed: its name comes first
    ],
)
def test_lines_that_open_no_block(language, line):
    prefix = "x = 1\n" + line
    assert choose_mode(prefix, "\n", language=language) == "single-line"
    assert scope_min_indent(prefix, language) == indent_of(line)


def test_a_keyword_block_answer_stays_in_the_block():
    prefix = "function Queue:pop()\n  if self.first > self.last then"
    suffix = "\n  local value = self.items[self.first]\n"
    text = "\n    self.first = 0\n  self.last = 0\n  self.items[self.last] = None"
    assert postprocess(text, prefix, suffix, "multi-line", language="lua") == "\n    self.first = 0"


@pytest.mark.parametrize("closer", ['done < "$1"', "done | sort", 'done <<< "$data"', "done # lines"])
def test_a_shell_loop_s_done_line_with_a_redirect_closes_it(closer):
    prefix = "count_lines() {\n  while read -r line; do"
    text = '\n    echo "$line"\n  ' + closer + "\n  echo ok"
    assert postprocess(text, prefix, "\n}\n", "multi-line", language="shellscript") == text.rsplit("\n", 1)[0]


@pytest.mark.parametrize(
    "prefix, text, suffix, expected",
    [
        # the answer retyped the code after the cursor: what is left keeps its space before that code
        ("function f() {\n  ", "return store.save();", "store.save();\n}\n", "return "),
        ("async function g() {\n  const r = ", "await fetch(url);", "fetch(url);\n}\n", "await "),
        # nothing (or a closer) after the cursor: trailing blanks go
        ("f(", "a, ", ")\n", "a,"),
        ("", "x = 1   ", "\n", "x = 1"),
    ],
)
def test_the_space_before_the_code_after_the_cursor_is_kept(prefix, text, suffix, expected):
    assert postprocess(text, prefix, suffix, "single-line", language="javascript") == expected


@pytest.mark.parametrize(
    "language, prefix, text, suffix, expected",
    [
        # the file's next line closes the block the cursor's line opened, deeper than the answer's closer
        ("ruby", "class A\n  def add(amount)\n      if amount > 1", "000.to_f\n    end",
         "\n      end\n      @stock += amount\n    end\n", "000.to_f"),
        ("shellscript", 'f() {\ncase "$1" in', "\n  *)\n  echo hi\nfi", "\nesac\n", "\n  *)\n  echo hi"),
        # the file's closer is an outer block's: the answer's closes the block the cursor's line opens
        ("lua", "function f()\n  if x then", "\n    y()\n  end", "\nend\n", "\n    y()\n  end"),
        ("go", "func f() {\n\tif x {", "\n\t\ty()\n\t}", "\n}\n", "\n\t\ty()\n\t}"),
    ],
)
def test_an_answer_s_closer_is_dropped_where_the_file_closes_the_block(language, prefix, text, suffix, expected):
    assert postprocess(text, prefix, suffix, "multi-line", language=language) == expected


def test_an_answer_stops_at_its_quote_where_the_line_closes_the_string_further_on():
    prefix = "function f(user) {\n  return `${user.name} <"
    assert postprocess("{user.email}`;", prefix, ">`;\n}\n", "single-line", language="typescript") == "{user.email}"


def test_a_markdown_fence_ends_an_answer_in_a_code_file():
    """SmolLM2 at the end of a file wrote '```' and a paragraph about the code (4 of 7 languages)."""
    from engine.stops import _StopRules

    class Chars:
        def decode(self, ids):
            return "".join(map(chr, ids))

    code = build_request(Snapshot("file:///b.py", 1, "python", "b.py", "x = 1\n", ""), CompletionConfig())
    prose = build_request(Snapshot("file:///r.md", 1, "markdown", "r.md", "# R\n", ""), CompletionConfig())
    assert "```" in code.limits.stop and "```" not in prose.limits.stop
    for answer, kept in [("```\n\nThis script uses the `load` function", ""), ("y = 2\n```\nIt adds", "y = 2\n")]:
        rules = _StopRules(Chars(), code.limits.stop, 0, 0.0)
        ids = list(map(ord, answer))
        fired = next(n for n in range(1, len(ids) + 1) if rules(ids[:n]))
        assert rules.cut(answer[:fired]) == kept


def test_the_request_for_a_keyword_block_opener_is_multi_line():
    snap = Snapshot("file:///q.lua", 1, "lua", "q.lua", "function f()\n  if x then", "\n  y()\nend\n")
    request = build_request(snap, CompletionConfig())
    assert request.mode == "multi-line" and request.limits.min_indent == 3
    assert request.limits.closer_words == ("end",)  # the engine keeps the block's `end` line


@pytest.mark.parametrize(
    "prefix, text, suffix, expected",
    [
        # the block goes on after the cursor: its closer is in the file, the answer's would close it early
        ("func (s *Store) Pending() []Item {\n\tvar out []Item\n\t",
         "for i := range s.items {\n\t\tout = append(out, i)\n\t}\n\treturn out, nil\n}",
         "\n\tfor _, it := range s.items {\n\t\tif !it.Done {\n\t\t\tout = append(out, it)\n\t\t}\n\t}\n"
         "\treturn out\n}\n",
         "for i := range s.items {\n\t\tout = append(out, i)\n\t}\n\treturn out, nil"),
        ("items = [", "\n    1,\n    2,\n]", "\n    3,\n]\n", "\n    1,\n    2,"),
        # the code after the cursor is out of the block: the block's closer is missing, the answer's is kept
        ("func f() {\n\tx := 1\n\t", "y := 2\n}", "\n\nfunc g() {}\n", "y := 2\n}"),
    ],
)
def test_a_closing_line_is_kept_only_where_the_block_ends(prefix, text, suffix, expected):
    assert postprocess(text, prefix, suffix, "multi-line", language="go") == expected


@pytest.mark.parametrize(
    "text, suffix, expected",
    [
        # an answer's first line is judged by the next line alone: `return {` two lines below may be new code
        ("return {", "\n        total = sum(x.price for x in items)\n        return {\n            'total': total,\n",
         "return {"),
        # a body the answer opened repeats lines below (Go's error checks): kept
        ("if x is None:\n            return None", "\n        if y:\n            return None\n        return x\n",
         "if x is None:\n            return None"),
        ("count = len(items)\n        return {",
         "\n        total = sum(x.price for x in items)\n        return {\n            'total': total,\n",
         "count = len(items)"),
        # the third code line, blank lines between them
        ("log.info('done')\n        self.save()", "\n        a = 1\n\n        b = 2\n        self.save()\n", "log.info('done')"),
        # a short common line further down is no copy (`pass`, `else:` repeat in real code)
        ("if x:\n            pass", "\n        y = 1\n        pass\n", "if x:\n            pass"),
        # beyond the third code line: not looked at
        ("z = 3\n        self.save()", "\n        a = 1\n        b = 2\n        c = 3\n        self.save()\n",
         "z = 3\n        self.save()"),
    ],
)
def test_an_answer_stops_at_a_copy_of_one_of_the_next_few_lines(text, suffix, expected):
    assert postprocess(text, "def f(items):\n        ", suffix, "multi-line", language="python") == expected


def test_a_go_error_check_repeating_one_further_down_is_kept():
    suffix = "\n\tb, err := h()\n\tif err != nil {\n\t\treturn nil, err\n\t}\n\treturn b, nil\n}\n"
    text = "if err != nil {\n\t\treturn nil, err\n\t}"
    assert postprocess(text, "func f() (*T, error) {\n\ta, err := g()\n\t", suffix, "multi-line", 12,
                       language="go") == text


@pytest.mark.parametrize(
    "language, prefix, text, suffix",
    [
        # a call, then its check: the file has the check above and below (a pattern it repeats)
        ("go", "func load() (*T, error) {\n\ta, err := readA()\n\tif err != nil {\n\t\treturn nil, err\n\t}\n\t",
         "b, err := readB(a)\n\tif err != nil {\n\t\treturn nil, err\n\t}",
         "\n\tc, err := readC(a)\n\tif err != nil {\n\t\treturn nil, err\n\t}\n\treturn c, nil\n}\n"),
        ("python", 'def test_pages(client):\n    resp = client.get("/a")\n    assert resp.status_code == 200\n    ',
         'resp = client.get("/b")\n    assert resp.status_code == 200',
         '\n    resp = client.get("/c")\n    assert resp.status_code == 200\n'),
    ],
)
def test_a_line_the_file_repeats_is_no_copy_of_the_code_below(language, prefix, text, suffix):
    assert postprocess(text, prefix, suffix, "multi-line", 12, language=language) == text


@pytest.mark.parametrize(
    "language, prefix, text, suffix, mode, expected",
    [
        # the answer closes the inner openers itself; the next line's closer is the outer call's
        ("python", "result = compute(\n    data=load([path(", '"a")]),', "\n)\n", "multi-line", '"a")]),'),
        ("rust", "fn main() {\n    let cfg = Config { items: vec![Item { id: 1", " }] };", "\n}\n", "single-line",
         " }] };"),
        ("typescript", "function f() {\n  const cfg = { items: [{ id: 1", " }] };", "\n}\n", "single-line", " }] };"),
    ],
)
def test_closers_an_answer_needs_are_kept_when_later_lines_close_outer_blocks(language, prefix, text, suffix, mode,
                                                                                expected):
    assert postprocess(text, prefix, suffix, mode, 12, language=language) == expected


@pytest.mark.parametrize(
    "language, prefix, text, suffix, expected",
    [
        ("lua", "function f(x)\n  if x then", "\n    return 1\n  end\n  y()", "\n  return 0\nend\n",
         "\n    return 1\n  end"),
        ("lua", "call(function()", "\n  x = 1\nend)\ny()", "\n", "\n  x = 1\nend)"),
        ("shellscript", "for f in *; do", "\n  echo $f\ndone\necho ok", "\n", "\n  echo $f\ndone"),
        ("ruby", "class Report\n  def top(n)", "\n    @rows.first(n)\n  end\n  def x", "\nend\n",
         "\n    @rows.first(n)\n  end"),
        # the block goes on after the cursor: its `end` is in the file already
        ("lua", "function f(x)\n  if x then", "\n    return 1\n  end", "\n    y = 2\n  end\nend\n", "\n    return 1"),
        # another language: `end` is a word like any
        ("python", "def f():", "\n    return 1\nend", "\n", "\n    return 1"),
    ],
)
def test_a_keyword_block_keeps_its_closing_line(language, prefix, text, suffix, expected):
    assert postprocess(text, prefix, suffix, "multi-line", 12, language=language) == expected


# an empty line inside a body, the cursor at column 0 (the block's indentation comes with the answer)
BODY = "import json\n\n\ndef load(path):\n    with open(path) as f:\n        data = json.load(f)\n"


@pytest.mark.parametrize(("prefix", "suffix", "language", "floor"), [
    (BODY, "\n    return data\n", "python", 4),  # between a deeper line and the block's last line
    (BODY, "\n\n\ndef save(path):\n", "python", 0),  # after the function: a new definition may follow
    (BODY, "", "python", 0),  # the end of the file
    ("def save(path, data):\n    with open(path) as f:\n", "", "python", 0),  # the end of the file too
    ("class A:\n    def f(self):\n        return 1\n", "\n    def g(self):\n", "python", 4),  # between methods
    ("  for (const v of values) {\n", "\n  }\n", "javascript", 2),
    ("def f():\n        x = (1 +\n            2)\n", "\n        return x\n", "python", 8),
    ("def f(x):\n    if x:\n        a = 1\n", "\n    else:\n        a = 2\n", "python", 5),  # else's block ends
    (BODY + "    ", "\n    return data\n", "python", 4),  # the typed indentation: as before
    (BODY + "        ", "\n    return data\n", "python", 8),
    # what a block opener or closer beside the line does not say (a review of the first version of this rule)
    ("def long_function_name(var_one, var_two,\n                       var_three, var_four):\n",
     "\n    return 0\n", "python", 4),  # a hanging signature: its body is left of its last line
    ("def f(args):\n    # Parse the arguments:\n", "\n    opts = parse(args)\n", "python", 4),  # a comment
    ("func name(x int) string {\n\tswitch x {\n\tcase 1:\n\t\treturn \"one\"\n", "\n\t}\n}\n", "go", 1),
    ("  let total = 0;\n", "\n}\n", "javascript", 0),
    ("jobs:\n  build:\n    steps:\n", "\n    - run: make\n", "yaml", 4),
    ("Run this:\n", "\n  npm install\n", "markdown", 0),  # prose: no scope
])
def test_an_empty_cursor_line_is_in_the_block_of_the_code_around_it(prefix, suffix, language, floor):
    assert scope_min_indent(prefix, language, suffix) == floor


def test_the_request_of_an_empty_cursor_line_carries_its_scope_and_lead():
    snap = Snapshot(uri="file:///w/load.py", version=1, language="python", path="load.py", before=BODY, after="\n    return data\n")
    limits = build_request(snap, CompletionConfig()).limits
    assert (limits.min_indent, limits.lead_indent) == (4, 0)
    snap = Snapshot(uri="file:///w/load.py", version=1, language="python", path="load.py", before=BODY + "  ", after="\n    return data\n")
    assert build_request(snap, CompletionConfig()).limits.lead_indent == 2
    snap = Snapshot(uri="file:///w/load.py", version=1, language="python", path="load.py", before=BODY + "    x", after="\n")
    assert build_request(snap, CompletionConfig()).limits.lead_indent == -1  # code before the cursor


@pytest.mark.parametrize(("text", "suffix", "kept"), [
    # the model's module-level example code inside a function (the case that was inserted)
    ("\n# Example usage\nsave_config(\n    \"data.json\",\n    data\n)", "\n    return data\n", ""),
    ("# Example usage", "\n    return data\n", ""),
    ("        data = dict(data)\n    return data", "\n    return data\n", "        data = dict(data)\n    return data"),
    ("    log(data)\nprint(1)", "\n    return data\n", "    log(data)"),
    # after the function: a new top-level definition stays
    ("\ndef save(path):\n    pass", "\n\n\ndef other():\n", "\ndef save(path):\n    pass"),
])
def test_an_answer_at_column_0_inside_a_body_stays_in_the_block(text, suffix, kept):
    assert cut_at_scope_end(text, BODY, suffix, "python") == kept


@pytest.mark.parametrize(("language", "prefix", "suffix", "text"), [
    # Go's and C's case lines sit at their switch's depth, left of the case bodies
    ("go", "func name(x int) string {\n\tswitch x {\n\tcase 1:\n\t\treturn \"one\"\n", "\n\t}\n}\n",
     "\tcase 100:\n\t\treturn \"hundred\""),
    ("c", "int f(int c) {\n\tswitch (c) {\n\tcase 'a':\n\t\treturn 1;\n", "\n\t}\n}\n", "\tcase 'b':\n\t\treturn 2;"),
    ("cpp", "class Lexer {\n", "\n};\n", "public:\n  Lexer(int pos);"),  # an access specifier
    ("c", "int f(void) {\n    int x = 1;\n", "\n    return x;\n}\n", "#ifdef DEBUG\n    log(x);\n#endif"),
    ("python", "def long_function_name(var_one, var_two,\n                       var_three, var_four):\n",
     "\n\n\ndef other():\n", "    return var_one + var_two + var_three + var_four"),
    ("python", "def f(args):\n    # Parse the arguments:\n", "\n    return opts\n", "    opts = parse(args)"),
    ("markdown", "Run this:\n", "\n  npm install\n", "1. Install the package"),
])
def test_a_line_left_of_its_block_that_is_code_there_is_kept(language, prefix, suffix, text):
    """A review found the first version of the column-0 rule cutting these to nothing (the engine stopped
    at their first token): the floor came from an opener line or a closer below."""
    assert cut_at_scope_end(text, prefix, suffix, language) == text
    snap = Snapshot(uri="file:///w/x", version=1, language=language, path="x", before=prefix, after=suffix)
    request = build_request(snap, CompletionConfig())
    from engine.stops import _scope_end
    assert _scope_end(text, request.limits.min_indent, request.limits.closer_words, request.limits.lead_indent) == -1
