"""Nesting depth at the end of code being generated, kept incrementally with tree-sitter."""

from __future__ import annotations

import logging

from indexer.chunker import point_at

log = logging.getLogger(__name__)

# nodes that open a nesting level a reader (and a small model) has to keep track of
NESTING = frozenset({
    "block", "class_definition", "function_definition", "argument_list", "parameters", "list", "dictionary",
    "tuple", "set", "parenthesized_expression", "subscript", "list_comprehension", "dictionary_comprehension",
    "set_comprehension", "generator_expression", "string", "lambda", "conditional_expression",
})


def _python_parser():
    try:
        import tree_sitter_python
        from tree_sitter import Language, Parser
    except ImportError:
        return None
    return Parser(Language(tree_sitter_python.language()))


class DepthTracker:
    """depth(text) for a text that only grows between calls: re-parses incrementally."""

    def __init__(self, language: str = "python"):
        self.parser = _python_parser() if language in ("python", "") else None
        self.source = b""
        self.tree = None

    def depth(self, text: str) -> int:
        data = text.encode("utf-8", "replace")
        if self.parser is None:
            return _bracket_depth(text)
        if self.tree is not None and data.startswith(self.source):
            old = len(self.source)
            self.tree.edit(start_byte=old, old_end_byte=old, new_end_byte=len(data),
                           start_point=point_at(self.source, old), old_end_point=point_at(self.source, old),
                           new_end_point=point_at(data, len(data)))
            self.tree = self.parser.parse(data, self.tree)
        else:
            self.tree = self.parser.parse(data)
        self.source = data
        last = max(0, len(data.rstrip()) - 1)  # trailing whitespace belongs to the module
        node = self.tree.root_node.descendant_for_byte_range(last, last + 1)
        depth = 0
        while node is not None:
            depth += node.type in NESTING
            if node.type == "ERROR":  # unfinished code: error recovery flattens the open brackets
                kinds = [c.type for c in node.children]
                depth += max(0, sum(map(kinds.count, "([{")) - sum(map(kinds.count, ")]}")))
                if node.parent is None:  # nothing parsed as a block: fall back on indentation
                    line = text.rstrip("\n").rsplit("\n", 1)[-1]
                    depth += (len(line) - len(line.lstrip())) // 4
            node = node.parent
        return depth


def _bracket_depth(text: str) -> int:
    """Fallback for languages without a grammar here: open brackets plus indentation levels."""
    opened = sum(text.count(c) for c in "([{") - sum(text.count(c) for c in ")]}")
    last = text.rsplit("\n", 1)[-1]
    return max(0, opened) + (len(last) - len(last.lstrip())) // 4
