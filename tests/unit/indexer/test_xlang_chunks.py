"""Chunks and symbols of languages other than Python: definitions whole and named, symbols where the digest looks."""

from __future__ import annotations

from indexer.chunker import Chunker
from indexer.config import IndexConfig


def chunk(path, text):
    return Chunker(IndexConfig()).chunk("/ws/" + path, text, path)


def spans(cf):
    return {(c.kind, c.name): (c.start_line, c.end_line) for c in cf.chunks}


def syms(cf):
    return {(s.name, s.kind, s.container): (s.start_line, s.end_line) for s in cf.symbols}


def test_rust_doc_comments_and_attributes_stay_with_their_item():
    src = ("use std::io;\n\n/// Errors raised while writing.\n#[derive(Debug)]\npub enum SegmentError {\n    Io(io::Error),\n}\n\n"
           "/// Appends records.\n#[derive(Debug, Clone)]\n#[allow(dead_code)]\npub struct SegmentWriter {\n    pub n: usize,\n}\n\n"
           "impl SegmentWriter {\n    /// Opens a segment.\n    pub fn create() -> Self {\n        SegmentWriter { n: 0 }\n    }\n}\n")
    cf = chunk("src/segment.rs", src)
    got = spans(cf)
    assert got[("enum", "SegmentError")] == (3, 7)
    assert got[("struct", "SegmentWriter")] == (9, 14)
    assert got[("method", "create")] == (17, 20)
    assert cf.chunks[0].text == "use std::io;"  # the module chunk keeps no stray doc comment or attribute


def test_js_and_ts_functions_bound_to_a_const_are_named_definitions():
    src = ("// Prices.\nexport const computeDiscountedPrice = (basePrice, tier) => {\n  const rate = tier === 'gold' ? 0.2 : 0;\n"
           "  return basePrice * (1 - rate);\n};\n\nconst helper = function (x) {\n  return x;\n};\nconst one = (x) => x;\nconst LIMIT = 3;\n")
    for path in ("pricing.js", "pricing.ts"):
        cf = chunk(path, src)
        got = spans(cf)
        assert got[("function", "computeDiscountedPrice")] == (1, 5), got
        assert got[("function", "helper")] == (7, 9)
        assert ("function", "one") not in got  # a one-line arrow stays in the module's chunk, with its symbol
        assert ("one", "function", None) in syms(cf) and ("LIMIT", "variable", None) in syms(cf)
        assert sum(1 for s in cf.symbols if s.name == "computeDiscountedPrice") == 1
    tsx = ("type Props = { id: string };\n\nexport const OrderTable: React.FC<Props> = ({ id }) => {\n"
           "  const [order, setOrder] = useState(null);\n  return <div>{id}</div>;\n};\n")
    assert spans(chunk("OrderTable.tsx", tsx))[("function", "OrderTable")] == (3, 6)


def test_go_grouped_constants_each_point_at_their_own_line():
    src = "package money\n\ntype Cents int64\n\nconst (\n\tZero Cents = 0\n\tOneDollar Cents = 100\n)\n\nvar Default = Zero\n"
    got = syms(chunk("money.go", src))
    assert got[("Zero", "constant", None)] == (6, 6)
    assert got[("OneDollar", "constant", None)] == (7, 7)
    assert got[("Default", "variable", None)] == (10, 10)


def test_c_and_cpp_prototypes_are_symbols():
    header = ("#ifndef RB_H\n#define RB_H\n#ifdef __cplusplus\nextern \"C\" {\n#endif\n"
              "typedef struct ring { int n; } ring_t;\n\n/* Allocate a ring. */\nring_t *ring_create(unsigned capacity);\n"
              "void ring_destroy(ring_t *rb);\nint (*ring_hook)(int);\nextern int ring_count;\n"
              "#ifdef __cplusplus\n}\n#endif\n#endif\n")
    cf = chunk("ring.h", header)
    got = syms(cf)
    assert got[("ring_create", "function", None)] == (9, 9)
    assert got[("ring_destroy", "function", None)] == (10, 10)
    assert not any(name in ("ring_hook", "ring_count") for name, _, _ in got)  # variables, not functions
    for s in cf.symbols:  # each symbol's chunk holds its line
        c = cf.chunks[s.chunk_index]
        assert c.start_line <= s.start_line <= c.end_line
    cpp = ("namespace geo {\nclass Polygon {\npublic:\n    explicit Polygon(int n);\n    double signedArea() const;\n"
           "    int count() const { return n_; }\nprivate:\n    int n_;\n};\n}\n")
    got = syms(chunk("polygon.hpp", cpp))
    assert got[("signedArea", "method", "geo.Polygon")] == (5, 5)
    assert got[("Polygon", "method", "geo.Polygon")] == (4, 4)
    assert ("count", "method", "geo.Polygon") in got and not any(n == "n_" for n, _, _ in got)


def test_java_and_ts_class_fields_are_symbols_except_private_ones():
    java = ("public final class Parcel {\n    public static final int MAX_WEIGHT_GRAMS = 30_000, MIN = 1;\n"
            "    private final String trackingCode;\n    public int getWeight() { return 0; }\n}\n")
    got = syms(chunk("Parcel.java", java))
    assert got[("MAX_WEIGHT_GRAMS", "variable", "Parcel")] == (2, 2) and ("MIN", "variable", "Parcel") in got
    assert not any(n == "trackingCode" for n, _, _ in got)
    ts = ("export class OrderService {\n  private cache = new Map();\n  public readonly baseUrl: string;\n  retries = 3;\n"
          "  #secret = 1;\n  constructor(u: string) { this.baseUrl = u; }\n}\n")
    got = syms(chunk("OrderService.ts", ts))
    assert ("baseUrl", "variable", "OrderService") in got and ("retries", "variable", "OrderService") in got
    assert not any(n in ("cache", "#secret") for n, _, _ in got)
