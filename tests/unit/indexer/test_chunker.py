import pytest

from indexer.chunker import Chunker
from indexer.config import IndexConfig

PY = '''import os

LIMIT = 10


class Parser(Base):
    """Parses things."""

    mode = "fast"

    def parse(self, text):
        return text.split()

    @staticmethod
    def helper():
{body}

def main():
    return Parser().parse("a b")
'''


def chunk(path, text, **cfg):
    return Chunker(IndexConfig(**cfg)).chunk("/ws/" + path, text, path)


def test_python_definitions_with_header_context():
    body = "\n".join(f"        x{i} = {i}" for i in range(50)) + "\n        return x0\n"
    cf = chunk("pkg/parse.py", PY.format(body=body), max_chunk_lines=20)
    by_name = {}
    for c in cf.chunks:
        by_name.setdefault(c.name, []).append(c)
    parse = by_name["parse"][0]
    assert parse.kind == "method" and parse.header == "pkg/parse.py :: Parser :: method parse"
    assert parse.text.strip().startswith("def parse") and (parse.start_line, parse.end_line) == (11, 12)
    helper = by_name["helper"]
    assert len(helper) == 3  # 53 lines split into 20-line pieces
    assert helper[0].text.lstrip().startswith("@staticmethod")
    assert "(continued)" in helper[1].header and "def helper" in helper[1].header
    assert helper[-1].end_line - helper[0].start_line + 1 == 53
    cls = by_name["Parser"][0]
    assert cls.kind == "class" and "class Parser" in cls.text and "mode =" in cls.text
    assert by_name["main"][0].kind == "function"
    module = by_name[None][0]
    assert module.kind == "module" and "LIMIT = 10" in module.text
    # every non-blank line is covered exactly once
    lines = PY.format(body=body).split("\n")
    covered = [0] * (len(lines) + 1)
    for c in cf.chunks:
        for ln in range(c.start_line, c.end_line + 1):
            covered[ln] += 1
    assert all(covered[i + 1] == 1 for i, ln in enumerate(lines) if ln.strip())


def test_python_symbols_point_at_their_chunks():
    cf = chunk("m.py", PY.format(body="        pass\n"))
    syms = {(s.name, s.kind, s.container) for s in cf.symbols}
    assert {("Parser", "class", None), ("parse", "method", "Parser"), ("helper", "method", "Parser"),
            ("main", "function", None), ("LIMIT", "variable", None), ("mode", "variable", "Parser")} <= syms
    for s in cf.symbols:
        c = cf.chunks[s.chunk_index]
        assert c.start_line <= s.start_line <= c.end_line or s.start_line <= c.start_line <= s.end_line


@pytest.mark.parametrize("path,code,expected", [
    ("a.js", "export class A {\n  run() { return 1; }\n}\nfunction helper(x) {\n  return x;\n}\nconst arrow = (y) => y;\n",
     {("A", "class"), ("run", "method"), ("helper", "function"), ("arrow", "function")}),
    ("a.ts", "interface Shape { area(): number }\nexport function makeShape(): Shape { return null as any; }\n",
     {("Shape", "interface"), ("makeShape", "function")}),
    ("a.go", "package m\n\ntype Server struct{}\n\nfunc (s *Server) Serve() error {\n\treturn nil\n}\n\nfunc New() *Server { return nil }\n",
     {("Server", "type"), ("Serve", "method"), ("New", "function")}),
    ("a.rs", "pub struct Config;\nimpl Config {\n    pub fn load() -> Self { Config }\n}\nfn main() {}\n",
     {("Config", "struct"), ("load", "method"), ("main", "function")}),
    ("A.java", "public class Account {\n  private int n;\n  public int balance() { return n; }\n}\n",
     {("Account", "class"), ("balance", "method")}),
    ("a.c", "#ifndef A_H\n#define A_H\nstatic int *make_buffer(int n) {\n  return 0;\n}\nstruct point { int x; };\n#endif\n",
     {("make_buffer", "function"), ("point", "struct")}),
    ("a.cpp", "namespace geo {\nclass Circle {\n public:\n  double area() const { return 0; }\n};\n}\n",
     {("geo", "namespace"), ("Circle", "class"), ("area", "method")}),
])
def test_other_languages(path, code, expected):
    cf = chunk(path, code)
    assert cf.language is not None
    got = {(s.name, s.kind) for s in cf.symbols}
    assert expected <= got, got


def test_line_window_fallback_for_unknown_files():
    text = "\n".join(f"line {i}" for i in range(95)) + "\n"
    cf = chunk("notes.txt", text, window_lines=30)
    assert cf.language is None and cf.symbols == []
    assert [(c.start_line, c.end_line) for c in cf.chunks] == [(1, 30), (31, 60), (61, 90), (91, 95)]
    assert all(c.kind == "window" for c in cf.chunks)


def test_long_lines_are_split_by_characters():
    text = "\n".join("x" * 100 for _ in range(20))
    cf = chunk("data.txt", text, window_lines=50, max_chunk_chars=500)
    assert all(len(c.text) <= 500 for c in cf.chunks) and len(cf.chunks) == 5


def test_empty_and_syntax_error_files():
    assert chunk("e.py", "").chunks == []
    cf = chunk("bad.py", "def broken(:\n    pass\nclass\n")
    assert cf.chunks  # still chunked, never raises
