"""Tree-sitter grammar table: which file extensions map to which grammar and which nodes are definitions."""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass, field

from tree_sitter import Language

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LanguageSpec:
    """How to find definitions in one grammar.

    ``definitions`` maps node type -> symbol kind; ``containers`` are definition
    types whose body is searched for nested definitions (methods);
    ``wrappers`` are nodes whose inner definition is the real one (decorators,
    ``export``); ``assignments`` are module-level nodes that define names.
    """

    name: str
    module: str
    function: str = "language"
    extensions: tuple[str, ...] = ()
    definitions: dict[str, str] = field(default_factory=dict)
    containers: frozenset[str] = frozenset()
    wrappers: frozenset[str] = frozenset()
    assignments: frozenset[str] = frozenset()

    def load(self) -> Language:
        mod = importlib.import_module(self.module)
        return Language(getattr(mod, self.function)())


_JS_DEFS = {
    "function_declaration": "function",
    "generator_function_declaration": "function",
    "class_declaration": "class",
    "method_definition": "method",
}
_TS_DEFS = {
    **_JS_DEFS,
    "abstract_class_declaration": "class",
    "interface_declaration": "interface",
    "type_alias_declaration": "type",
    "enum_declaration": "enum",
    "function_signature": "function",
    "method_signature": "method",
    "abstract_method_signature": "method",
}
_JS_CONTAINERS = frozenset({"class_declaration", "abstract_class_declaration", "interface_declaration"})
_JS_WRAPPERS = frozenset({"export_statement"})
_JS_ASSIGN = frozenset({"lexical_declaration", "variable_declaration", "field_definition", "public_field_definition"})
_C_DEFS = {
    "function_definition": "function",
    "struct_specifier": "struct",
    "union_specifier": "struct",
    "enum_specifier": "enum",
    "type_definition": "type",
}
_CPP_DEFS = {**_C_DEFS, "class_specifier": "class", "namespace_definition": "namespace"}

LANGUAGES: tuple[LanguageSpec, ...] = (
    LanguageSpec(
        "python",
        "tree_sitter_python",
        extensions=(".py", ".pyi", ".pyw", ".ipynb"),  # a notebook: its code cells (files.notebook_code)
        definitions={"function_definition": "function", "class_definition": "class"},
        containers=frozenset({"class_definition"}),
        wrappers=frozenset({"decorated_definition"}),
        assignments=frozenset({"expression_statement"}),
    ),
    LanguageSpec(
        "javascript",
        "tree_sitter_javascript",
        extensions=(".js", ".jsx", ".mjs", ".cjs"),
        definitions=_JS_DEFS,
        containers=_JS_CONTAINERS,
        wrappers=_JS_WRAPPERS,
        assignments=_JS_ASSIGN,
    ),
    LanguageSpec(
        "typescript",
        "tree_sitter_typescript",
        function="language_typescript",
        extensions=(".ts", ".mts", ".cts"),
        definitions=_TS_DEFS,
        containers=_JS_CONTAINERS,
        wrappers=_JS_WRAPPERS,
        assignments=_JS_ASSIGN,
    ),
    LanguageSpec(
        "tsx",
        "tree_sitter_typescript",
        function="language_tsx",
        extensions=(".tsx",),
        definitions=_TS_DEFS,
        containers=_JS_CONTAINERS,
        wrappers=_JS_WRAPPERS,
        assignments=_JS_ASSIGN,
    ),
    LanguageSpec(
        "go",
        "tree_sitter_go",
        extensions=(".go",),
        definitions={
            "function_declaration": "function",
            "method_declaration": "method",
            "type_declaration": "type",
        },
        assignments=frozenset({"const_declaration", "var_declaration"}),
    ),
    LanguageSpec(
        "rust",
        "tree_sitter_rust",
        extensions=(".rs",),
        definitions={
            "function_item": "function",
            "struct_item": "struct",
            "enum_item": "enum",
            "trait_item": "trait",
            "impl_item": "impl",
            "mod_item": "module",
            "macro_definition": "macro",
            "type_item": "type",
            "const_item": "constant",
            "static_item": "constant",
            "function_signature_item": "function",
        },
        containers=frozenset({"impl_item", "trait_item", "mod_item"}),
        wrappers=frozenset(),
    ),
    LanguageSpec(
        "java",
        "tree_sitter_java",
        extensions=(".java",),
        definitions={
            "class_declaration": "class",
            "interface_declaration": "interface",
            "enum_declaration": "enum",
            "record_declaration": "class",
            "method_declaration": "method",
            "constructor_declaration": "method",
        },
        containers=frozenset({"class_declaration", "interface_declaration", "enum_declaration", "record_declaration"}),
        assignments=frozenset({"field_declaration"}),  # fields (not private ones): the digest's class stubs
    ),
    LanguageSpec(
        "c",
        "tree_sitter_c",
        extensions=(".c", ".h"),
        definitions=_C_DEFS,
        assignments=frozenset({"declaration"}),  # function prototypes (a header's API) name symbols
    ),
    LanguageSpec(
        "cpp",
        "tree_sitter_cpp",
        extensions=(".cc", ".cpp", ".cxx", ".hpp", ".hh", ".hxx", ".ipp", ".c++", ".h++"),
        definitions=_CPP_DEFS,
        containers=frozenset({"class_specifier", "struct_specifier", "namespace_definition"}),
        wrappers=frozenset({"template_declaration"}),
        assignments=frozenset({"declaration", "field_declaration"}),  # prototypes, member function declarations
    ),
)


class LanguageRegistry:
    """Maps a path's extension to its spec and a lazily created tree-sitter Language."""

    def __init__(self, specs: tuple[LanguageSpec, ...] = LANGUAGES):
        self._by_ext = {ext: spec for spec in specs for ext in spec.extensions}
        self._loaded: dict[str, Language | None] = {}

    def spec_for(self, path: str) -> LanguageSpec | None:
        dot = path.rfind(".")
        if dot < 0 or "/" in path[dot:]:
            return None
        return self._by_ext.get(path[dot:].lower())

    def language(self, spec: LanguageSpec) -> Language | None:
        if spec.name not in self._loaded:
            try:
                self._loaded[spec.name] = spec.load()
            except Exception as exc:  # a missing/broken grammar wheel is an expected condition
                log.warning("tree-sitter grammar %s unavailable (%s); using line windows", spec.name, exc)
                self._loaded[spec.name] = None
        return self._loaded[spec.name]
