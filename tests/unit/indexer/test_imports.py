"""Imports read with tree-sitter for every grammar the chunker knows, and resolved to workspace files."""

from __future__ import annotations

from indexer.imports import FileTable, Import, parse_imports, resolve

from .conftest import write


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


def test_python_relative_import_of_the_package_itself():
    files = FileTable(["/ws/pkg.py", "/ws/pkg/__init__.py", "/ws/pkg/mod.py", "/ws/pkg/helper.py"])
    # `from . import x` where x is no submodule: the package's __init__.py, never a sibling pkg.py
    assert resolve(Import(".", "helper_fn", "helper_fn", 1), "/ws/pkg/mod.py", files) == ["/ws/pkg/__init__.py"]
    assert resolve(Import(".", "helper", "helper", 1), "/ws/pkg/mod.py", files) == ["/ws/pkg/helper.py"]


def test_python_absolute_import_prefers_the_nearest_import_root():
    files = FileTable(["/ws/vendor/pkg.py", "/ws/pkg/__init__.py", "/ws/pkg/util.py", "/ws/main.py",
                       "/ws/vendor/pkg/util.py"])
    assert resolve(Import("pkg", None, "pkg", 1), "/ws/main.py", files)[0] == "/ws/pkg/__init__.py"
    assert resolve(Import("pkg", "util", "util", 1), "/ws/main.py", files)[0] == "/ws/pkg/util.py"
    assert resolve(Import("pkg", None, "pkg", 1), "/ws/vendor/x.py", files)[0] == "/ws/vendor/pkg.py"
    # the same root: a package directory before a same-named module, as Python's finder does
    files = FileTable(["/ws/pkg.py", "/ws/pkg/__init__.py"])
    assert resolve(Import("pkg", None, "pkg", 1), "/ws/main.py", files)[0] == "/ws/pkg/__init__.py"


def test_an_empty_init_is_known_after_a_restart(workspace, make_index):
    write(workspace, "pkg/__init__.py", "")
    write(workspace, "pkg/mod.py", "def f():\n    pass\n")
    init = str(workspace / "pkg" / "__init__.py")
    index = make_index(workspace, embedder=None)
    index.build()
    assert init in index.files
    index.close()
    restarted = make_index(workspace, embedder=None)
    assert init in restarted.files
    assert resolve(Import(".", "f", "f", 1), str(workspace / "pkg" / "mod.py"), restarted.files) == [init]


def test_rust_module_directories():
    files = FileTable(["/r/src/main.rs", "/r/src/a.rs", "/r/src/b.rs", "/r/src/a/b.rs", "/r/src/c.rs", "/r/c.rs",
                       "/r/src/d/mod.rs", "/r/src/d/e.rs", "/r/tests/it.rs", "/r/tests/common/mod.rs",
                       "/r/src/bin/tool.rs", "/r/src/bin/util.rs"])
    assert resolve(Import("self::b", None, "b", 1), "/r/src/a.rs", files) == ["/r/src/a/b.rs"]  # mod b;
    assert resolve(Import("super::c", "W", "W", 1), "/r/src/a.rs", files) == ["/r/src/c.rs"]
    assert resolve(Import("self::b", None, "b", 1), "/r/src/main.rs", files) == ["/r/src/b.rs"]
    assert resolve(Import("self::e", None, "e", 1), "/r/src/d/mod.rs", files) == ["/r/src/d/e.rs"]
    assert resolve(Import("super::c", "W", "W", 1), "/r/src/d/mod.rs", files) == ["/r/src/c.rs"]
    assert resolve(Import("super::c", "W", "W", 1), "/r/src/a/b.rs", files) == []  # a's c: src/a/c.rs
    assert resolve(Import("super::super::c", "W", "W", 1), "/r/src/a/b.rs", files) == ["/r/src/c.rs"]
    assert resolve(Import("self::common", None, "common", 1), "/r/tests/it.rs", files) == ["/r/tests/common/mod.rs"]
    assert resolve(Import("self::util", None, "util", 1), "/r/src/bin/tool.rs", files) == ["/r/src/bin/util.rs"]
