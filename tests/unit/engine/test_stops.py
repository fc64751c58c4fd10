"""engine.stops._StopRules on scripted tokens: loops in a line, closing lines, chunked and SentencePiece
decoding, and the same stop whatever the chunking (what keeps speculative decoding lossless)."""

from __future__ import annotations

import dataclasses
import random

import pytest

from engine.stops import _repetition_end, _scope_end, _StopRules
from lsp_server.postprocess import cut_at_scope_end, scope_min_indent


class Pieces:
    """Token i is the string items[i] (what engine.remote feeds the rules with)."""

    def __init__(self, items: list[str]):
        self.items = items

    def decode(self, ids) -> str:
        return "".join(self.items[i] for i in ids)


def llama_like(pieces: list[str]):
    """A SentencePiece-style tokenizer (Llama's decoder: ▁ for a space, byte fallback, and one leading
    space stripped from whatever is decoded) and the ids of `pieces`."""
    from tokenizers import Tokenizer, decoders, models

    from engine.tokenizer import FastTokenizer

    vocab = {p: i for i, p in enumerate(dict.fromkeys(["<unk>", *pieces]))}
    backend = Tokenizer(models.BPE(vocab, [], unk_token="<unk>", byte_fallback=True))
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    return FastTokenizer(backend, {}), [vocab[p] for p in pieces]


def run(tok, ids: list[int], bounds, **limits) -> tuple[int | None, str | None, str]:
    """Call the rules on ids[:b] for each b of `bounds`: (b, reason, cut text) at the first stop."""
    rules = _StopRules(tok, limits.get("stop", ()), limits.get("max_lines", 0), 0.0, limits.get("min_indent", -1),
                       lead_indent=limits.get("lead_indent", -1))
    for b in bounds:
        if reason := rules(ids[:b]):
            return b, reason, rules.cut(tok.decode(ids[:b]))
    return None, None, rules.cut(tok.decode(ids))


def pieces(items: list[str]):
    return Pieces(items), list(range(len(items)))


SP_BODY = ["<0x0A>", "▁▁▁", "▁return", "▁x", "<0x0A>", "▁▁▁", "▁s", "▁=", "▁'", "<0xC3>", "<0xA9>", "'",
           "<0x0A>", "z", "▁=", "▁2"]  # "\n    return x\n    s = 'é'\nz = 2"

SCENARIOS = {  # name: (tokenizer, ids, limits, (reason, cut text) of a token-by-token run)
    "scope, a whole line in one piece": (*pieces(["return x", "\n", "def g():\n    pass", "\n", "    y = 1"]),
                                          dict(min_indent=4, max_lines=20), ("scope", "return x")),
    "a closing line": (*pieces(["\n", "    1,", "\n", "    2,", "\n", "]", "\n", "\n", "print", "(items)"]),
                       dict(min_indent=1), ("scope", "\n    1,\n    2,\n]")),
    "a loop in a line, then more": (*pieces(["x = f(a", *[", self.b"] * 10, ")\n", "y = 2\n"]), {},
                                    ("repeat", "x = f(a, self.b")),
    "a loop of lines, then more": (*pieces(["    x = 1\n", *["    y += 1\n"] * 3, "    z = 0\n", "    w"]), {},
                                   ("repeat", "    x = 1\n    y += 1")),
    "max_lines": (*pieces(["a = 1", "\n", "b = 2", "\n", "c = 3", "\n"]), dict(max_lines=2),
                  ("max_lines", "a = 1\nb = 2")),
    "a stop string over two tokens": (*pieces(["x = 1", "<E", "OT>", "junk\n"]), dict(stop=("<EOT>",)),
                                      ("stop", "x = 1")),
    "no stop": (*pieces(["if a:", "\n", "    b()", "\n"]), dict(min_indent=0), (None, "if a:\n    b()\n")),
    "SentencePiece": (*llama_like(SP_BODY), dict(min_indent=4), ("scope", "\n    return x\n    s = 'é'")),
}


@pytest.mark.parametrize("name", SCENARIOS)
def test_the_same_stop_and_text_whatever_the_chunking(name):
    """One token at a time (plain decoding) or several (a verify's accepted tokens, a streamed piece):
    the rules fire in the chunk holding the token where one at a time fires, and cut to the same text."""
    tok, ids, limits, want = SCENARIOS[name]
    n = len(ids)
    at, *got = run(tok, ids, range(1, n + 1), **limits)
    assert tuple(got) == want
    rng = random.Random(name)
    chunkings = [[n], list(range(3, n, 3)) + [n], list(range(2, n, 2)) + [n]]
    chunkings += [sorted(rng.sample(range(1, n), rng.randint(1, n - 1))) + [n] for _ in range(20)]
    for bounds in chunkings:
        expected_at = None if at is None else min(b for b in bounds if b >= at)
        assert run(tok, ids, bounds, **limits) == (expected_at, *want), bounds


@pytest.mark.parametrize("line", [
    "MASK = 0xFFFFFFFF", "MASK = 0xFFFFFFFFFFFFFFFF", 'data = b"\\x00\\x00\\x00\\x00"', 'data = b"' + "\\x00" * 8 + '"',
    'SEP = "\\t\\t\\t\\t"', "f(x, None, None, None, None)", "row = (None, None, None, None, None, None)",
    "ab = 'abababababab'",
])
def test_short_repeats_in_real_code_are_not_a_loop(line):
    for end in range(len(line) + 1):  # wherever the last token ended
        assert _repetition_end(line[:end]) == -1, line[:end]
    tok, ids = pieces(list(line))
    assert run(tok, ids, range(1, len(ids) + 1)) == (None, None, line)


@pytest.mark.parametrize(("head", "unit", "word"), [
    ("    return f(x", ", None", "None"), ("print(", "a, ", "a"), ("    total = ", "self.x + ", "self.x"),
    ("_cast(", "self.width, ", "self.width"),
])
def test_a_loop_in_a_line_still_stops_and_keeps_its_first_copy(head, unit, word):
    line = head + unit * 20
    tok, ids = pieces(list(line))  # a character at a time: generation stops once the loop is long enough
    at, reason, text = run(tok, ids, range(1, len(ids) + 1))
    assert reason == "repeat" and text.startswith(head) and text.count(word) == 1, text
    assert at <= len(head) + 50  # soon after it started


@pytest.mark.parametrize(("prefix", "items", "kept"), [
    ("items = [", ["\n", "    1,", "\n", "    2,", "\n", "]", "\n", "\n", "print", "(items)"], "\n    1,\n    2,\n]"),
    ("function f() {", ["\n", "  return 1;", "\n", "}", ";", "\n", "f();"], "\n  return 1;\n};"),
    ("    x = call(", ["\n", "        a,", "\n", "  ", ")", ")", "\n", "x"], "\n        a,\n  ))"),
])
def test_a_closing_line_is_kept_and_ends_the_answer(prefix, items, kept):
    """lsp_server.postprocess keeps a dedented line of closers only: the engine stops after it, not before."""
    tok, ids = pieces(items)
    at, reason, text = run(tok, ids, range(1, len(ids) + 1), min_indent=scope_min_indent(prefix))
    assert (reason, text) == ("scope", kept)
    assert tok.decode(ids[:at]) == kept + "\n"  # at the newline after it
    assert cut_at_scope_end(tok.decode(ids), prefix) == kept  # what postprocess keeps of the whole answer
    ended = run(tok, ids[: at - 1], range(1, at), min_indent=scope_min_indent(prefix))  # generation ends on it
    assert ended == (None, None, kept)


@pytest.mark.parametrize(("items", "lead", "kept", "reason"), [
    # the cursor at column 0 of an empty line inside a body (scope 4): a first line at column 0 leaves it
    (["\n", "# Example usage", "\n", "save_config(", "\n"], 0, "", "scope"),
    (["# Example", " usage", "\n", "x = 1"], 0, "", "scope"),
    (["    ", "return", " data", "\n", "\n", "def", " g"], 0, "    return data\n", "scope"),
    # two spaces typed: the first line's own two more reach the scope
    (["  ", "return", " data", "\n", "x"], 2, "  return data", "scope"),
    # not checked (code before the cursor): unchanged rules
    (["# Example", " usage", "\n", "    y"], -1, "# Example usage\n    y", None),
])
def test_the_first_line_counts_for_the_scope_after_a_cursor_with_only_whitespace_before_it(items, lead, kept, reason):
    tok, ids = pieces(items)
    at, got, text = run(tok, ids, range(1, len(ids) + 1), min_indent=4, lead_indent=lead)
    assert (got, text.rstrip("\n") if got else text) == (reason, kept.rstrip("\n") if reason else kept)


def test_a_line_that_only_starts_with_closers_ends_before_it():
    tok, ids = pieces(["\n", "    1,", "\n", "]", " + extra", "\n"])
    assert run(tok, ids, range(1, len(ids) + 1), min_indent=1) == (5, "scope", "\n    1,")
    assert cut_at_scope_end(tok.decode(ids), "items = [") == "\n    1,"


def test_scope_end_keeps_a_line_of_closers():
    assert _scope_end("\n    1,\n]\nprint(items)", 1) == len("\n    1,\n]")
    assert _scope_end("\n    1,\n] + x\n", 1) == len("\n    1,")
    assert _scope_end("\n    1,\n  ]", 4) == len("\n    1,\n  ]")  # the end of the text, being the end of the line


def test_every_line_a_chunk_completes_is_checked():
    """A streamed piece can hold a whole dedented line and its newline: the scope ends there, not at max_lines."""
    tok, ids = pieces(["return x", "\n", "def g():\n    pass", "\n", "    y = 1"])
    assert run(tok, ids, range(1, len(ids) + 1), min_indent=4, max_lines=20) == (3, "scope", "return x")
    tok, ids = pieces(["\n    1,", "\n]\nprint(items)\n"])  # a closing line inside a piece
    assert run(tok, ids, range(1, 3), min_indent=1) == (2, "scope", "\n    1,\n]")


def test_sentencepiece_tokens_are_decoded_with_what_comes_before():
    """Llama's decoder strips a leading space from whatever it decodes, so `▁▁▁` `▁return` decoded one at a
    time reads `  return` (out of a 4-space scope); a split `é` is two U+FFFD alone. The rules see the whole."""
    tok, ids = llama_like(SP_BODY)
    assert tok.decode(ids[1:2]) + tok.decode(ids[2:3]) == "  return"  # what token-by-token decoding gave
    rules = _StopRules(tok, (), 0, 0.0, 4)
    for n in range(1, len(ids) + 1):
        reason = rules(ids[:n])
        assert rules.text == tok.decode(ids[:n])
        if reason:
            break
    assert (n, reason) == (SP_BODY.index("z") + 1, "scope")
    assert rules.cut(tok.decode(ids[:n])) == "\n    return x\n    s = 'é'"


def test_healed_characters_are_left_out():
    tok, ids = pieces([" x", " = 1", "\n", "y"])
    rules = _StopRules(tok, (), 0, 0.0, 1, healed=" ")
    assert [rules(ids[:n]) for n in range(1, 5)] == [None, None, None, "scope"]
    assert rules.text == "x = 1\ny" and rules.cut(rules.text) == "x = 1"


def test_an_answer_keeps_its_leading_space_after_the_prompts_last_token():
    """A SentencePiece decoder strips the space `▁x` starts with when it decodes it alone: after
    `return` the answer read `x` (`returnx` in the document). Decoded after the prompt's last token it
    is ` x`, and the rules see the same text."""
    from engine.stops import decode_answer

    tok, ids = llama_like(["▁return", "▁x", "<0x0A>", "z"])
    ctx, answer = ids[:1], ids[1:]
    assert tok.decode(answer) == "x\nz"  # alone: the space is gone
    assert decode_answer(tok, answer, ctx) == " x\nz"
    assert decode_answer(tok, answer) == "x\nz"  # no context: as before
    rules = _StopRules(tok, (), 1, 0.0, context=tuple(ctx))
    assert rules(answer) == "max_lines" and rules.cut(decode_answer(tok, answer, ctx)) == " x"
    bpe, bids = pieces(["a", " b"])  # a decoder that keeps spaces: the same text either way
    assert decode_answer(bpe, bids[1:], bids[:1]) == bpe.decode(bids[1:]) == " b"


@pytest.fixture
def clock(monkeypatch):
    """The rules' clock, set by the test: [now]."""
    from types import SimpleNamespace

    from engine import stops

    now = [0.0]
    monkeypatch.setattr(stops, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    return now


# "\n    return x\n    y = 1\n": after a block opener the first line is empty
OPENER_BODY = ["\n", "    ", "return", " x", "\n", "    ", "y", " =", " 1", "\n"]


def test_the_time_budget_waits_for_a_non_blank_line(clock):
    """A slow prefill spends the budget before the first token: the answer still gets its first
    non-blank line (it stopped at the empty one, and the suggestion was ''), whatever the chunking."""
    tok, ids = pieces(OPENER_BODY)
    n = len(ids)
    bounds_list = [range(1, n + 1), [n], [2, 4, 6, n], [3, 7, n], [5, n]]
    for bounds in bounds_list:
        clock[0] = 0.0
        rules = _StopRules(tok, (), 0, 1.0)
        clock[0] = 5.0  # past the budget from the first token on
        got = next(((b, reason) for b in bounds if (reason := rules(ids[:b]))), (None, None))
        assert got == (min(b for b in bounds if b >= 5), "time"), bounds
        assert rules.cut(tok.decode(ids[: got[0]])) == "\n    return x", bounds


def test_the_time_budget_ends_the_answer_at_a_line_end(clock):
    """Spent in the middle of a line, the budget lets it finish: the answer ends with a whole line."""
    tok, ids = pieces(["x = 1", "\n", "y = f(", "a", ")", "\n", "z", " = 2"])
    rules = _StopRules(tok, (), 0, 1.0)
    reasons = []
    for b in range(1, len(ids) + 1):
        clock[0] = 5.0 if b >= 3 else 0.0  # spent as `y = f(` arrives
        reasons.append(rules(ids[:b]))
        if reasons[-1]:
            break
    assert reasons == [None, None, None, None, None, "time"]
    assert rules.cut(tok.decode(ids[:6])) == "x = 1\ny = f(a)"


def test_the_time_budget_waits_for_the_answers_brackets_to_close(clock):
    """Spent inside a literal the answer opened, the budget lets it close (a `return {` line alone
    would leave the file unbalanced); max_tokens still bounds it."""
    tok, ids = pieces(["\n", "    return {", "\n", "        'a': 1,", "\n", "    }", "\n", "    x"])
    rules = _StopRules(tok, (), 0, 1.0)
    clock[0] = 5.0  # spent before the first token
    reasons = [rules(ids[:b]) for b in range(1, len(ids) + 1)]
    assert reasons.index("time") == 6  # at the line end after `}`, not after `return {` or `'a': 1,`
    assert rules.cut(tok.decode(ids[:7])) == "\n    return {\n        'a': 1,\n    }"


def test_the_time_budget_does_not_end_an_answer_on_a_block_opener(clock):
    """Spent before the first token, the answer was `if ready:` alone: a body the user must write. It
    ends after the body's first line."""
    tok, ids = pieces(["\n", "    if ready:", "\n", "        go()", "\n", "    y"])
    rules = _StopRules(tok, (), 0, 1.0)
    clock[0] = 5.0
    reasons = [rules(ids[:b]) for b in range(1, len(ids) + 1)]
    assert reasons.index("time") == 4  # the line end after `go()`, not the one after `if ready:` (2)
    assert rules.cut(tok.decode(ids[:5])) == "\n    if ready:\n        go()"


def test_a_loop_inside_a_line_drops_that_line_of_a_multi_line_answer():
    """The loop rule keeps a loop's first copy, mid-line: a later line cut so is half-written (an
    unclosed string in a dict); a single-line answer keeps it (its line is all there is)."""
    text = '"max": 10,\n    "max_stock": 10,\n    "max_stock_stock' + "_stock" * 12
    tok, ids = pieces(list(text))
    rules = _StopRules(tok, (), 0, 0.0)
    assert rules.cut(text, "repeat") == '"max": 10,\n    "max_stock": 10,'
    line = "x = f(a" + ", self.b" * 10
    assert _StopRules(*pieces(list(line))[:1], (), 1, 0.0).cut(line, "repeat") == "x = f(a, self.b"


def test_no_time_budget_stop_before_it_is_spent(clock):
    tok, ids = pieces(OPENER_BODY)
    assert run(tok, ids, range(1, len(ids) + 1)) == (None, None, "".join(OPENER_BODY))
    rules = _StopRules(tok, (), 0, 1.0)
    assert not any(rules(ids[:b]) for b in range(1, len(ids) + 1))  # the clock stays at 0


@pytest.mark.parametrize(("text", "reason", "max_lines", "min_indent", "kept"), [
    ("def f():\n    return g(", "max_tokens", 0, -1, "def f():"),
    ("\n    a = 1\n    b = '", "max_tokens", 0, -1, "\n    a = 1"),
    ("\r\n    a = 1\r\n    b = max(orders,", "time", 0, -1, "\r\n    a = 1"),  # the CRLF goes with the line
    ("\n    a = 1\n    ", "max_tokens", 0, -1, "\n    a = 1"),  # a line begun but empty
    ("x = 1\n    y = 2\nd", "max_tokens", 0, 4, "x = 1\n    y = 2"),  # dropped before the scope cut, not after
    ("\n    throw new E(\"no items", "max_tokens", 0, -1, "\n    throw new E(\"no items"),  # no whole line before it
    ("x = f(a, b", "max_tokens", 1, -1, "x = f(a, b"),  # single-line: the partial line is the answer
    ("x = f(a, b", "max_tokens", 0, -1, "x = f(a, b"),
    ("a = 1\nb = f(", "eos", 0, -1, "a = 1\nb = f("),  # the model ended it: not a limit's cut
    ("a = 1\nb = f(", None, 0, -1, "a = 1\nb = f("),
    # the answer's own bracket still open at the last line end: it ends where its brackets were closed
    ("\n    x = 1\n    return {\n        'a': 1,\n        'b", "max_tokens", 0, -1, "\n    x = 1"),
    ("a, b)\n    y = g(1)\n    z = [\n", "max_tokens", 0, -1, "a, b)\n    y = g(1)"),  # the prefix's ( closed
    ("\n    x = {\n        'a': 1,\n        'b", "max_tokens", 0, -1, "\n    x = {\n        'a': 1,"),  # none: as before
    # a block's opening line whose body was cut off goes too (`if ready:` alone is no suggestion)
    ("\n    x = 1\n    if x > 0:\n        return f(", "max_tokens", 0, -1, "\n    x = 1"),
    ("\n    x = 1\n    for a in b:\n        if a:\n            g(", "time", 0, -1, "\n    x = 1"),
])
def test_a_limit_stop_drops_the_unfinished_last_line(text, reason, max_lines, min_indent, kept):
    tok, ids = pieces(list(text))
    rules = _StopRules(tok, (), max_lines, 0.0, min_indent)
    assert rules(ids[:-1]) is None  # the decoding loop does not check the token that reaches the limit
    assert rules.cut(text, reason) == kept


def test_the_engine_drops_the_line_its_token_limit_cut(model_dirs):
    """The token limit is decided in the decoding loop, not by the rules: the engine hands its reason
    to the cut, plain or speculative, so a multi-line answer ends with a whole line."""
    import threading

    from engine.engine import load_engine
    from engine.types import CompletionRequest, Limits, SpecConfig

    engine = load_engine(str(model_dirs["target"]), str(model_dirs["draft"]), dtype="float32")
    tok = engine.target.tokenizer
    req = CompletionRequest(prefix="def f():\n", uri="tl", limits=Limits(max_tokens=60))
    whole = engine.complete(req, threading.Event(), SpecConfig(drafter="none"))
    first = next(i + 1 for i, t in enumerate(whole.tokens) if "\n" in tok.decode([t]))
    assert "\n" not in tok.decode(list(whole.tokens[first : first + 2])), "two tokens into the second line"
    kept = whole.text[: whole.text.index("\n")]
    assert kept.strip(), "a non-blank first line"
    limited = dataclasses.replace(req, limits=Limits(max_tokens=first + 2))
    for drafter in ("none", "hybrid"):
        res = engine.complete(limited, threading.Event(), SpecConfig(drafter=drafter))
        assert (res.text, res.stop_reason, res.tokens) == (kept, "max_tokens", whole.tokens[: first + 2]), drafter


def test_a_keyword_closing_line_is_kept_as_a_bracket_one_is():
    """Lua/Ruby `end`, the shell's `fi`: a dedented line of the language's closing word (Limits.closer_words)
    ends the answer and is kept, whatever the chunking; without the words it is cut at its first letter."""
    tok, ids = pieces(["\n", "    return 1", "\n", "  e", "nd", "\n", "  x = 2"])
    for bounds in (range(1, len(ids) + 1), [len(ids)], [2, 4, len(ids)]):
        rules = _StopRules(tok, (), 0, 0.0, 3, closer_words=("end",))
        fired = next(b for b in bounds if rules(ids[:b]))
        assert rules.reason == "scope"
        assert rules.cut(tok.decode(ids[:fired])) == "\n    return 1\n  end"
    rules = _StopRules(tok, (), 0, 0.0, 3)
    assert next(b for b in range(1, len(ids) + 1) if rules(ids[:b])) == 4  # at `  e`
    assert rules.cut(tok.decode(ids[:4])) == "\n    return 1"


@pytest.mark.parametrize(
    "words, line, kept",
    [
        # the closing word with closers after it (a function passed as an argument, a table's field):
        # kept whole, as `}))` is
        (("end",), ["  end", ")", ")"], True),
        (("end",), ["  end", " }", ")"], True),
        (("end",), ["  end", ".compact"], True),  # Ruby: a block's end with a call on it
        # a shell loop's `done` with its redirect or pipe, a `fi` with a comment
        (("fi", "done", "esac"), ["  done", ' < "$1"'], True),
        (("fi", "done", "esac"), ["  done", " |", " sort"], True),
        (("fi", "done", "esac"), ["  fi", " # ok"], True),
        # a word that only starts like one is the next statement: cut before its line
        (("end",), ["  end", "_time", " = 1"], False),
    ],
)
def test_a_keyword_closing_line_is_read_to_its_end(words, line, kept):
    tok, ids = pieces(["\n", "    x = 1", "\n", *line, "\n", "  y()"])
    rules = _StopRules(tok, (), 0, 0.0, 3, closer_words=words)
    fired = next(b for b in range(1, len(ids) + 1) if rules(ids[:b]))
    assert rules.reason == "scope"
    assert rules.cut(tok.decode(ids[:fired])) == "\n    x = 1" + ("\n" + "".join(line) if kept else "")


def test_a_rust_lifetime_opens_no_string_in_the_answers_bracket_count():
    """`&'a str) -> &'a` read as a string hid the `)` and the `}`: the answer looked unbalanced for good,
    and the time budget never ended it (it ran to max_tokens)."""
    from engine.stops import _balanced_line

    assert _balanced_line("fn get(&self, key: &'a str) -> &'a str {\n    self.map[key]\n}")
    assert not _balanced_line("fn get(&self, key: &'a str) -> &'a str {")
    assert _balanced_line("x = f('(')") and _balanced_line("d = {'a': [1, 2]}")
