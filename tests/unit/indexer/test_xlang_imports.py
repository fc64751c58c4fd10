"""Imports of JavaScript/TypeScript and Rust resolved through re-exports, and CommonJS destructuring."""

from __future__ import annotations

from indexer.imports import FileTable, Import, parse_imports, resolve

from .conftest import write


def test_commonjs_destructured_require_binds_names():
    src = "const { formatLabel, parse: parseLabel } = require('./util/format.cjs');\nconst fs = require('fs');\n"
    assert [(i.module, i.name, i.alias) for i in parse_imports(src, "/r/app.js")] == [
        ("./util/format.cjs", "formatLabel", "formatLabel"), ("./util/format.cjs", "parse", "parseLabel"),
        ("fs", None, "fs")]


def test_js_barrel_files_are_followed_to_the_defining_file(tmp_path):
    ws = tmp_path / "ws"
    paths = [
        write(ws, "src/models/inventory.ts", "export class InventoryLedger {}\nexport default function createLedger() {}\n"),
        write(ws, "src/models/pricing.ts", "export const computePrice = (x: number) => x;\n"),
        write(ws, "src/models/index.ts", 'export { InventoryLedger as Ledger } from "./inventory";\n'
                                         'export { default as createLedger } from "./inventory";\nexport * from "./deep";\n'),
        write(ws, "src/models/deep/index.ts", 'export * from "../pricing";\n'),
        write(ws, "src/models/local.ts", 'export * from "./pricing";\nexport function localThing() {}\n'),
        write(ws, "src/app.ts", ""),
    ]
    files = FileTable([str(p) for p in paths])
    app = str(ws / "src/app.ts")
    inventory, pricing = str(paths[0]), str(paths[1])
    assert resolve(Import("./models", "Ledger", "L", 1), app, files) == [inventory]
    assert resolve(Import("./models", "createLedger", "createLedger", 1), app, files) == [inventory]
    assert resolve(Import("./models", "computePrice", "computePrice", 1), app, files) == [pricing]  # export * twice
    # a name the barrel does not re-export, a namespace import, a file defining the name: the file itself
    assert resolve(Import("./models", "Missing", "Missing", 1), app, files) == [str(paths[2])]
    assert resolve(Import("./models", None, "models", 1), app, files) == [str(paths[2])]
    assert resolve(Import("./models/local", "localThing", "localThing", 1), app, files) == [str(paths[4])]


def test_rust_pub_use_is_followed_to_the_defining_file(tmp_path):
    ws = tmp_path / "ws"
    paths = [
        write(ws, "src/main.rs", "mod storage;\n"),
        write(ws, "src/storage/mod.rs", "pub mod segment;\nmod codec;\nmod util;\n\npub use segment::{SegmentWriter, SegmentError};\n"
                                        "pub use codec::encode_record as encode;\npub use util::*;\n"),
        write(ws, "src/storage/segment.rs", "pub struct SegmentWriter;\npub enum SegmentError {}\n"),
        write(ws, "src/storage/codec.rs", "pub fn encode_record() {}\n"),
        write(ws, "src/storage/util.rs", "pub fn checksum() {}\n"),
    ]
    files = FileTable([str(p) for p in paths])
    main = str(paths[0])
    assert resolve(Import("crate::storage", "SegmentWriter", "SegmentWriter", 1), main, files) == [str(paths[2])]
    assert resolve(Import("crate::storage", "encode", "enc", 1), main, files) == [str(paths[3])]
    assert resolve(Import("crate::storage", "checksum", "checksum", 1), main, files) == [str(paths[4])]
    assert resolve(Import("crate::storage", "Other", "Other", 1), main, files) == [str(paths[1])]
    assert resolve(Import("self::storage", None, "storage", 1), main, files) == [str(paths[1])]


def test_a_barrel_files_unsaved_buffer_is_what_is_followed(tmp_path):
    """The re-exports are read through the FileTable: an unsaved buffer the index holds before the disk."""
    ws = tmp_path / "ws"
    paths = [write(ws, "src/a.ts", "export class Alpha {}\n"), write(ws, "src/b.ts", "export class Beta {}\n"),
             write(ws, "src/index.ts", 'export * from "./a";\n'), write(ws, "src/app.ts", "")]
    buffers: dict[str, str] = {}
    files = FileTable([str(p) for p in paths], overlay=buffers.get)
    app = str(paths[3])
    assert resolve(Import("./index", "Beta", "Beta", 1), app, files) == [str(paths[2])]  # not re-exported on disk
    buffers[str(paths[2])] = 'export * from "./a";\nexport * from "./b";\n'  # typed, not saved
    assert resolve(Import("./index", "Beta", "Beta", 1), app, files) == [str(paths[1])]
