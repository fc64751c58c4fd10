"""FIM prompt strings per family are exact, and the local window keeps its anchor while typing."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from transformers import AutoTokenizer

from engine.prompt import (CODELLAMA, DEEPSEEK_CODER, DRAFTLINE, PLAIN, QWEN25_CODER, SMOLLM, STARCODER2, PromptBudget,
                           PromptBuilder, detect_template, render_golden)
from engine.model import common_prefix_len
from engine.types import CompletionRequest, Snippet

REQ = CompletionRequest(
    prefix="def add(a, b):\n    ", suffix="\n\nprint(add(1, 2))\n", path="pkg/calc.py",
    snippets=(Snippet("pkg/util.py", "def sub(a, b):\n    return a - b\n"),), repo="proj",
)

GOLDEN = {
    QWEN25_CODER: "<|repo_name|>proj\n<|file_sep|>pkg/util.py\ndef sub(a, b):\n    return a - b\n"
                  "<|file_sep|>pkg/calc.py\n<|fim_prefix|>def add(a, b):\n    <|fim_suffix|>\n\nprint(add(1, 2))\n"
                  "<|fim_middle|>",
    STARCODER2: "<repo_name>proj<file_sep>pkg/util.py\ndef sub(a, b):\n    return a - b\n"
                "<file_sep><fim_prefix>pkg/calc.py\ndef add(a, b):\n    <fim_suffix>\n\nprint(add(1, 2))\n<fim_middle>",
    DEEPSEEK_CODER: "<s># pkg/util.py\ndef sub(a, b):\n    return a - b\n\n# pkg/calc.py\n"
                    "<｜fim▁begin｜>def add(a, b):\n    <｜fim▁hole｜>\n\nprint(add(1, 2))\n<｜fim▁end｜>",
    CODELLAMA: "<s># pkg/util.py\ndef sub(a, b):\n    return a - b\n\n# pkg/calc.py\n"
               "▁<PRE>def add(a, b):\n    ▁<SUF>\n\nprint(add(1, 2))\n▁<MID>",
    DRAFTLINE: "<|file_sep|>pkg/util.py\ndef sub(a, b):\n    return a - b\n<|file_sep|>pkg/calc.py\n"
               "<|fim_suffix|>\n\nprint(add(1, 2))\n<|fim_prefix|>def add(a, b):\n    <|fim_middle|>",
    PLAIN: "# pkg/util.py\ndef sub(a, b):\n    return a - b\n\n# pkg/calc.py\ndef add(a, b):\n    ",
    SMOLLM: "<file_sep>pkg/util.py\ndef sub(a, b):\n    return a - b\n<file_sep>pkg/calc.py\nprint(add(1, 2))\n"
            "<file_sep>pkg/calc.py\ndef add(a, b):\n    ",
}


@pytest.mark.parametrize("template", list(GOLDEN), ids=lambda t: t.family)
def test_golden_prompt_strings(template):
    assert render_golden(template, REQ) == GOLDEN[template]


@pytest.mark.parametrize("template", [QWEN25_CODER, STARCODER2], ids=lambda t: t.family)
def test_no_repository_header_without_a_repository_name(template):
    bare = render_golden(template, replace(REQ, repo=""))
    assert template.repo_name not in bare and bare == GOLDEN[template].replace(
        template.repo_name + "proj" + ("" if template is STARCODER2 else "\n"), "")


def test_deepseek_uses_full_width_bars():
    assert DEEPSEEK_CODER.prefix == "<\uff5cfim\u2581begin\uff5c>"


def test_detect_bundled_family(tokenizer_dir):
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    assert detect_template(tok) is DRAFTLINE
    # the hint names a family whose <|repo_name|> this vocabulary lacks: its own tokens decide
    assert detect_template(tok, hint="Qwen2.5-Coder-7B") is DRAFTLINE


class _Vocab:
    def __init__(self, *tokens: str):
        self.vocab = {t: i for i, t in enumerate(tokens)}

    def get_vocab(self):
        return self.vocab


def test_a_family_in_the_name_wins_only_where_the_tokenizer_has_its_tokens():
    """A GGUF in a folder named "draftline models" (or a file named after SmolLM) picked a template whose
    special tokens the model lacked: every completion failed converting a missing token to an id."""
    qwen = _Vocab("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|repo_name|>", "<|file_sep|>")
    assert detect_template(qwen, hint="Qwen2.5-Coder-7B-Q4_K_M.gguf") is QWEN25_CODER
    plain = _Vocab("<s>", "</s>", "hello")
    assert detect_template(plain, hint="/tmp/draftline models/llama.gguf") is PLAIN
    assert detect_template(plain, hint="my-smollm-finetune.gguf") is PLAIN


def _lines(n: int) -> str:
    return "".join(f"value_{i} = compute(value_{i - 1}, {i})\n" for i in range(n))


def test_window_is_line_anchored_and_keeps_its_anchor_while_typing(tokenizer_dir):
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    builder = PromptBuilder(DRAFTLINE, tok, PromptBudget(total=400))
    body = _lines(200)
    typed = "result = comp"
    prompts = []
    for i in range(1, len(typed) + 1):
        req = CompletionRequest(prefix=body + typed[:i], suffix="\nprint(result)\n", uri="file:///a.py")
        prompts.append(builder.build(req))
    window = body + typed
    for p in prompts:
        start = len(body) + len(typed[: prompts.index(p) + 1]) - p.prefix_chars
        assert start == 0 or window[start - 1] == "\n"  # a line boundary
        assert len(p.tokens) <= 400
    # SPM + a fixed anchor: each prompt's tokens, minus the tail, are the previous prompt's prefix
    shared = [common_prefix_len(a.tokens, b.tokens) for a, b in zip(prompts, prompts[1:])]
    assert all(len(a.tokens) - s <= 6 for a, s in zip(prompts, shared))  # only the typed tail changes
    assert len({p.prefix_chars - i for i, p in enumerate(prompts)}) == 1  # the window start never moved


def test_window_moves_with_margin_when_it_overflows(tokenizer_dir):
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    builder = PromptBuilder(DRAFTLINE, tok, PromptBudget(total=300, margin_share=0.25))
    text = _lines(100)
    first = builder.build(CompletionRequest(prefix=text, uri="u"))
    grown = builder.build(CompletionRequest(prefix=text + _lines(3), uri="u"))  # still fits the margin
    assert grown.prefix_chars - first.prefix_chars == len(_lines(3))
    moved = builder.build(CompletionRequest(prefix=text + _lines(60), uri="u"))  # overflow: re-anchor
    assert len(moved.tokens) <= 300 and moved.prefix_chars < len(text + _lines(60))


def test_recent_encodings_are_reused_and_never_shared_mutably(tokenizer_dir):
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    builder = PromptBuilder(DRAFTLINE, tok, PromptBudget(total=400))
    req = CompletionRequest(prefix=_lines(40) + "x = ", suffix="\nprint(x)\n" * 30, uri="file:///b.py",
                            snippets=(Snippet("pkg/u.py", "def u():\n    return 1\n"),))
    first = builder.build(req)
    calls = []
    real = tok.encode
    tok.encode = lambda *a, **k: calls.append(a) or real(*a, **k)
    try:
        again = builder.build(req)  # the same keystroke again: nothing is re-tokenized
        assert again.tokens == first.tokens and calls == []
        typed = builder.build(CompletionRequest(**{**req.__dict__, "prefix": req.prefix + "1"}))
        assert len(calls) == 1 and typed.tokens[: len(first.tokens) - 3] == first.tokens[: len(first.tokens) - 3]
    finally:
        tok.encode = real
    ids = builder.encode("def f():\n")
    ids.append(-1)  # a caller's change to its list does not reach the cache
    assert builder.encode("def f():\n") == tok.encode("def f():\n", add_special_tokens=False)


class _BosTokenizer:
    """A tokenizer that, like Gemma's or Llama's, opens every text with BOS unless told not to."""

    bos_token, bos_token_id = "<bos>", 1

    def __init__(self, adds: bool):
        self.adds = adds

    def encode(self, text, add_special_tokens=True):
        ids = [1] if text == "<bos>" else [100 + ord(c) for c in text]
        return ([1] if add_special_tokens and self.adds else []) + ids

    def __call__(self, text, add_special_tokens=True, return_offsets_mapping=False):
        return {"input_ids": self.encode(text, False), "offset_mapping": [(i, i + 1) for i in range(len(text))]}

    def convert_tokens_to_ids(self, token):
        return 1 if token == "<bos>" else 0

    def get_vocab(self):
        return {"<bos>": 1}


@pytest.mark.parametrize("adds", [True, False])
def test_a_tokenizer_that_opens_texts_with_bos_gets_it_in_the_prompt(adds):
    builder = PromptBuilder(PLAIN, _BosTokenizer(adds), PromptBudget(total=400))
    tokens = builder.build(CompletionRequest(prefix="def f():\n    ", path="a.py")).tokens
    assert (tokens[0] == 1) is adds and tokens.count(1) == int(adds)


def test_the_builder_opens_a_qwen_prompt_with_the_request_s_repository_name_and_not_smollm2s():
    """Qwen2.5-Coder's repository format starts `<|repo_name|>NAME\n`; SmolLM2 measured better without it."""
    req = CompletionRequest(prefix="def f():\n    ", path="core.py", uri="file:///ws/click/core.py", repo="click",
                            snippets=(Snippet("utils.py", "def echo():\n    pass\n"),))
    qwen = PromptBuilder(QWEN25_CODER, _BosTokenizer(False), PromptBudget(total=400))
    prompt = qwen.build(req)
    assert prompt.render().startswith("<|repo_name|>click\n<|file_sep|>utils.py\ndef echo():\n")
    assert qwen.build(replace(req, repo="")).render() == prompt.render().replace("<|repo_name|>click\n", "")
    smollm = PromptBuilder(SMOLLM, _BosTokenizer(False), PromptBudget(total=400)).build(req).render()
    assert smollm.startswith("<file_sep>utils.py\ndef echo():\n") and smollm.endswith("<file_sep>core.py\ndef f():\n    ")


def test_forget_windows_lays_the_next_prompt_out_as_a_first_one(tokenizer_dir):
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    builder = PromptBuilder(DRAFTLINE, tok, PromptBudget(total=300))
    first = builder.build(CompletionRequest(prefix=_lines(100), uri="u"))
    longer = CompletionRequest(prefix=_lines(100) + _lines(3), uri="u")
    assert builder.build(longer).prefix_chars > first.prefix_chars  # kept its anchor: the window grew
    builder.forget_windows()
    assert builder.build(longer).prefix_chars <= first.prefix_chars + len(_lines(3)) // 2  # re-anchored


def test_the_best_snippet_goes_last_next_to_the_current_file_and_the_budget_drops_the_least_relevant():
    """Snippets come best first (digest, definitions, then retrieved chunks); the prompt shows them in
    reverse, so the best one sits right before the current file, where a small model reads it."""
    best, mid, worst = (Snippet(f"{n}.py", f"def {n}():\n    pass\n") for n in ("best", "mid", "worst"))
    req = CompletionRequest(prefix="def f():\n    ", path="core.py", snippets=(best, mid, worst))
    text = PromptBuilder(SMOLLM, _BosTokenizer(False), PromptBudget(total=400)).build(req).render()
    assert text.index("worst.py") < text.index("mid.py") < text.index("best.py") < text.index("core.py")
    assert text.endswith("<file_sep>best.py\ndef best():\n    pass\n<file_sep>core.py\ndef f():\n    ")
    assert render_golden(SMOLLM, req, bos="").startswith("<file_sep>worst.py\n")
    first = PromptBuilder(SMOLLM, _BosTokenizer(False), PromptBudget(total=400))
    first.best_last = False  # as before 2026-12-06 (`bench context`'s -bestfirst arms)
    text = first.build(req).render()
    assert text.index("best.py") < text.index("mid.py") < text.index("worst.py") < text.index("core.py")
    # a budget with room for two: the worst is the one left out, and the best is still last
    room = len("def best():\n    pass\n") * 2 + len("best.py") + len("mid.py") + 6
    small = PromptBuilder(SMOLLM, _BosTokenizer(False), PromptBudget(total=room * 4, snippet_share=0.25))
    prompt = small.build(req)
    assert [s.path for s in prompt.snippets] == ["mid.py", "best.py"]


def test_smollm_shows_the_lines_after_the_cursor_s_line_as_a_section_of_the_file_before_it():
    """SmolLM2 has no FIM training: the code after the cursor comes first, as another piece of the same
    file (its lines after the cursor's line, blank ones at its head dropped), cut to whole lines within
    suffix_share of the budget; the rest of the cursor's own line is not shown."""
    after = "".join(f"    total += item_{i}\n" for i in range(60))
    req = CompletionRequest(prefix="def f(items):\n    total = sum(", suffix=")\n\n" + after + "    return total\n",
                            path="core.py", snippets=(Snippet("utils.py", "def echo():\n    pass\n"),))
    builder = PromptBuilder(SMOLLM, _BosTokenizer(False), PromptBudget(total=400, suffix_share=0.25))
    prompt = builder.build(req)
    text = prompt.render()
    head, section, current = text.split("<file_sep>")[1:]
    assert head.startswith("utils.py\n") and current == "core.py\ndef f(items):\n    total = sum("
    assert section.startswith("core.py\n    total += item_0\n") and section.endswith("\n")
    shown = section[len("core.py\n"):]
    assert after.startswith(shown) and 80 <= len(shown) <= 100  # whole lines within 100 (one-character) tokens
    assert len(prompt.tokens) <= 400
    # typing on the line changes nothing before the typed characters: the KV cache covers the rest
    typed = builder.build(replace(req, prefix=req.prefix + "it")).tokens
    assert typed[: len(prompt.tokens)] == prompt.tokens
    # no share for it, nothing after the cursor's line, or no path to name it by: no section
    off = PromptBuilder(SMOLLM, _BosTokenizer(False), PromptBudget(total=400, suffix_share=0.0)).build(req).render()
    assert off.count("core.py") == 1 and off.endswith(current)
    assert builder.build(replace(req, suffix=")\n\n  \n")).render().count("core.py") == 1
    assert "total +=" not in builder.build(replace(req, path="")).render()


def test_the_section_shows_whole_lines_where_the_character_cut_decides():
    """Token-cheap lines (a ruler, here 40 characters a token): the text cut by characters fits the
    token budget as it is, and its last line was shown half (the model read it as a whole line)."""

    class Runs(_BosTokenizer):
        def __call__(self, text, add_special_tokens=True, return_offsets_mapping=False):
            spans = [m.span() for m in re.finditer(r"-{1,40}|.", text, re.S)]
            return {"input_ids": [100 + ord(text[a]) for a, _ in spans], "offset_mapping": spans}

        def encode(self, text, add_special_tokens=True):
            return self(text)["input_ids"]

    ruler = "    # " + "-" * 114 + "\n"
    req = CompletionRequest(prefix="x = (", suffix=")\n" + ruler * 20, path="a.py")
    section = PromptBuilder(SMOLLM, Runs(False), PromptBudget(total=400)).build(req).render().split("<file_sep>")[1]
    lines = section[len("a.py\n"):].rstrip("\n").split("\n")
    assert 1 <= len(lines) < 20 and all(line + "\n" == ruler for line in lines)


def test_a_long_rest_of_file_is_cut_before_it_is_tokenized():
    """A file's whole tail (the bench passes it, up to 300 KB) is not tokenized per keystroke."""
    seen: list[int] = []

    class Counting(_BosTokenizer):
        def __call__(self, text, **kw):
            seen.append(len(text))
            return super().__call__(text, **kw)

    req = CompletionRequest(prefix="x = (", suffix=")\n" + "y = 1\n" * 50_000, path="a.py")
    PromptBuilder(SMOLLM, Counting(False), PromptBudget(total=400)).build(req)
    assert max(seen) <= 400 * 0.15 * 8


def test_chat_families_end_of_turn_tokens_stop_an_answer_under_any_template():
    """Gemma's EOS is <eos>, yet an answer ends with <end_of_turn>: under the plain template it ran on."""
    from types import SimpleNamespace

    vocab = {"<eos>": 1, "<end_of_turn>": 106, "x": 5}
    tok = SimpleNamespace(get_vocab=lambda: vocab, eos_token_id=1)
    builder = PromptBuilder.__new__(PromptBuilder)
    builder.tokenizer, builder.template = tok, PLAIN
    assert builder.stop_ids() == {1, 106}
