"""Imports read with tree-sitter for every grammar the chunker knows, and resolved to workspace files."""

from __future__ import annotations

from indexer.imports import FileTable, Import, parse_imports, resolve


def names(text: str, path: str) -> list[tuple[str, str | None, str]]:
    return [(i.module, i.name, i.alias) for i in parse_imports(text, path)]


def test_python_forms():
    src = ("import os.path as p, json\nfrom ..pkg.mod import (\n    A as B,\n    C,\n)\nfrom . import sib\n"
           "from .x import *\ntry:\n    from .y import Z\nexcept ImportError:\n    Z = None\n")
    assert names(src, "/r/pkg/sub/a.py") == [
        ("os.path", None, "p"), ("json", None, "json"), ("..pkg.mod", "A", "B"), ("..pkg.mod", "C", "C"),
        (".", "sib", "sib"), (".x", "*", ""), (".y", "Z", "Z"),
    ]
    lines = [i.line for i in parse_imports(src, "/r/pkg/sub/a.py")]
    assert lines[:3] == [1, 1, 2]


def test_other_languages():
    assert names("import D, {A as B, type C} from './m';\nimport * as ns from '../n';\nimport './side';\n"
                 "const r = require('./q');\n", "/r/a.ts") == [
        ("./m", "default", "D"), ("./m", "A", "B"), ("./m", "C", "C"), ("../n", None, "ns"), ("./q", None, "r")]
    assert names('package m\nimport (\n  "fmt"\n  u "github.com/x/p/util"\n  _ "embed"\n)\n', "/r/a.go") == [
        ("fmt", None, "fmt"), ("github.com/x/p/util", None, "u")]
    assert names("use crate::a::b::{X, Y as Z};\nuse super::c::W;\nmod foo;\n", "/r/src/a.rs") == [
        ("crate::a::b", "X", "X"), ("crate::a::b", "Y", "Z"), ("super::c", "W", "W"), ("self::foo", None, "foo")]
    assert names("import com.x.Y;\nimport com.z.*;\nimport static com.q.R.m;\n", "/r/A.java") == [
        ("com.x", "Y", "Y"), ("com.z", "*", ""), ("com.q.R", "m", "m")]
    assert names('#include "util.h"\n#include <stdio.h>\n', "/r/a.c") == [("util.h", "*", "")]
    assert names("anything", "/r/notes.txt") == []


def test_resolution_against_the_indexed_files():
    files = FileTable(["/r/pkg/sub/sib.py", "/r/pkg/pkg/mod.py", "/r/pkg/sub/x.py", "/r/src/m.ts", "/r/n/index.ts",
                       "/r/p/util/u.go", "/r/src/a/b.rs", "/r/com/x/Y.java", "/r/util.h", "/r/lib/pkg/util.py",
                       "/r/other/pkg/util.py"])
    py = "/r/pkg/sub/a.py"
    assert resolve(Import("..pkg.mod", "A", "B", 1), py, files) == ["/r/pkg/pkg/mod.py"]
    assert resolve(Import(".", "sib", "sib", 1), py, files) == ["/r/pkg/sub/sib.py"]
    assert resolve(Import("json", None, "json", 1), py, files) == []  # the standard library is not the workspace's
    # an absolute import: the matching file nearest the importing one first
    assert resolve(Import("pkg.util", "f", "f", 1), "/r/lib/main.py", files)[0] == "/r/lib/pkg/util.py"
    assert resolve(Import("./m", "A", "B", 1), "/r/src/a.ts", files) == ["/r/src/m.ts"]
    assert resolve(Import("../n", None, "ns", 1), "/r/src/a.ts", files) == ["/r/n/index.ts"]
    assert resolve(Import("react", "useState", "useState", 1), "/r/src/a.ts", files) == []
    assert resolve(Import("github.com/x/p/util", None, "u", 1), "/r/a.go", files) == ["/r/p/util/u.go"]
    assert resolve(Import("crate::a::b", "X", "X", 1), "/r/src/main.rs", files) == ["/r/src/a/b.rs"]
    assert resolve(Import("com.x", "Y", "Y", 1), "/r/A.java", files) == ["/r/com/x/Y.java"]
    assert resolve(Import("util.h", "*", "", 1), "/r/a.c", files) == ["/r/util.h"]
    files.remove("/r/util.h")
    assert resolve(Import("util.h", "*", "", 1), "/r/a.c", files) == []
