"""Engine.complete end to end on saved HF directories: loading, modes, stops, stats, cancellation."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import threading

import pytest

from engine.engine import BOUNDARY_PROBES, EngineConfig, load_engine
from engine.fake import FakeEngine
from engine.types import CompletionRequest, Limits, SpecConfig

REQ = CompletionRequest(prefix="import json\n\ndef load(path):\n    with open(path) as f:\n        return json.",
                        suffix="\n", uri="file:///x.py", path="x.py", limits=Limits(max_tokens=40))


@pytest.fixture(scope="module")
def engine(model_dirs):
    return load_engine(str(model_dirs["target"]), str(model_dirs["draft"]), dtype="float32")


def test_every_mode_gives_the_plain_greedy_text(engine):
    plain = engine.complete(REQ, threading.Event(), SpecConfig(drafter="none"))
    assert plain.stats.generated_tokens > 0
    for drafter in ("ngram", "draft", "hybrid"):
        for schedule in ("fixed", "adaptive", "ast", "grow"):
            res = engine.complete(REQ, threading.Event(), SpecConfig(drafter=drafter, schedule=schedule))
            assert res.text == plain.text and res.tokens == plain.tokens, (drafter, schedule)
            assert res.stats.proposed, drafter


def test_draft_confidence_shortens_proposals_and_keeps_the_output(engine):
    plain = engine.complete(REQ, threading.Event(), SpecConfig(drafter="none"))
    runs = {}
    for conf in (0.0, 0.3, 1.01):  # 1.01: no later guess is ever confident enough
        spec = SpecConfig(drafter="draft", schedule="fixed", gamma=4, draft_confidence=conf)
        res = engine.complete(REQ, threading.Event(), spec)
        assert res.tokens == plain.tokens, conf
        runs[conf] = res.stats.proposed
    assert set(runs[1.01]) == {1} and max(runs[0.0]) == 4  # the first guess is always proposed
    mean = {conf: sum(p) / len(p) for conf, p in runs.items()}
    assert mean[1.01] <= mean[0.3] <= mean[0.0]


def test_second_call_reuses_the_prompt_kv(engine):
    engine.complete(REQ, threading.Event())
    typed = CompletionRequest(**{**REQ.__dict__, "prefix": REQ.prefix + "lo"})
    res = engine.complete(typed, threading.Event())
    assert res.stats.reused_tokens >= res.stats.prompt_tokens - 6


def test_forget_leaves_nothing_a_later_request_could_reuse(engine):
    ngram = SpecConfig(drafter="ngram")
    engine.forget()
    first = engine.complete(REQ, threading.Event(), ngram)
    again = engine.complete(REQ, threading.Event(), ngram)
    assert again.stats.reused_tokens > 0 and list(engine.history)[-1] == list(first.tokens)
    engine.forget()  # what benchmarks do between modes
    assert not engine.history and not engine.target_lm.tokens and not engine.draft_lm.tokens
    fresh = engine.complete(REQ, threading.Event(), ngram)
    assert fresh.stats.reused_tokens == 0 and fresh.tokens == first.tokens
    assert (fresh.stats.proposed, fresh.stats.accepted) == (first.stats.proposed, first.stats.accepted)


def test_single_line_mode_stops_at_the_line_end(engine):
    res = engine.complete(CompletionRequest(**{**REQ.__dict__, "mode": "single-line"}), threading.Event())
    assert "\n" not in res.text


def test_stop_strings_cut_the_text(engine):
    full = engine.complete(REQ, threading.Event(), SpecConfig(drafter="none"))
    if len(full.text) < 4:
        pytest.skip("the random model ended at once")
    stop = full.text[2:4]
    res = engine.complete(CompletionRequest(**{**REQ.__dict__, "limits": Limits(max_tokens=40, stop=(stop,))}),
                          threading.Event())
    assert stop not in res.text and full.text.startswith(res.text)


def test_cancelled_before_start_does_no_work(engine):
    event = threading.Event()
    event.set()
    before = engine.target_lm.forwards
    res = engine.complete(REQ, event)
    assert res.cancelled and engine.target_lm.forwards == before


def test_fake_engine_is_deterministic_and_cancellable():
    fake = FakeEngine()
    a = fake.complete(REQ, threading.Event())
    assert a.text == fake.complete(REQ, threading.Event()).text
    ev = threading.Event()
    ev.set()
    assert fake.complete(REQ, ev).cancelled


def test_backend_option_reaches_the_engine(model_dirs):
    """model.options = { backend = ... } from the server config is a load_engine keyword."""
    from engine.model import CachedLM

    eng = load_engine(str(model_dirs["target"]), None, dtype="float32", backend="transformers")
    assert eng.config.backend == "transformers" and type(eng.target_lm) is CachedLM
    with pytest.raises(ValueError):
        load_engine(str(model_dirs["target"]), None, dtype="float32", backend="no-such-backend")


def test_spec_options_reach_the_engine_and_bad_ones_are_refused(model_dirs):
    eng = load_engine(str(model_dirs["target"]), str(model_dirs["draft"]), dtype="float32", drafter="ngram",
                      draft_confidence=0.25)
    assert eng.config.spec.drafter == "ngram" and eng.config.spec.draft_confidence == 0.25
    with pytest.raises(ValueError, match="unknown engine option"):
        load_engine(str(model_dirs["target"]), None, dtype="float32", drafters="ngram")
    with pytest.raises(ValueError, match="drafter must be one of"):
        load_engine(str(model_dirs["target"]), None, dtype="float32", drafter="magic")


def test_mismatched_tokenizer_is_refused(model_dirs, tmp_path):
    from transformers import AutoTokenizer

    from engine.training.train import train_tokenizer
    from tests.unit.engine.conftest import tiny_model

    tok = train_tokenizer(["completely different text " * 50, "zzz yyy xxx"], 300, tmp_path)
    tiny_model("llama", vocab=len(tok), seed=3, layers=1, hidden=16).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="tokenizer"):
        load_engine(str(model_dirs["target"]), str(tmp_path))
    assert AutoTokenizer.from_pretrained(tmp_path) is not None


def test_plain_equals_transformers_generate(engine):
    """The independent reference: transformers' own greedy generate() on the same prompt."""
    import torch

    for prefix in (REQ.prefix, "class A:\n    def f(self):\n        ", "x = [1, 2"):
        req = CompletionRequest(prefix=prefix, uri=f"ref:{prefix[:5]}", limits=Limits(max_tokens=24))
        ours = engine.complete(req, threading.Event(), SpecConfig(drafter="hybrid"))
        ids = torch.tensor([engine.prompts.build(req).tokens])
        ref = engine.target.model.generate(ids, max_new_tokens=24, do_sample=False, eos_token_id=sorted(engine.eos),
                                           pad_token_id=engine.target.tokenizer.pad_token_id)[0, ids.shape[1]:]
        ref = [t for t in ref.tolist() if t not in engine.eos]
        assert list(ours.tokens) == ref[: len(ours.tokens)]
        assert len(ours.tokens) == len(ref) or ours.stop_reason == "repeat"  # a random model loops: cut early


def test_time_budget_fires_only_after_a_full_line(engine, monkeypatch):
    """With the stop rules' clock always past the budget, generation runs exactly to the token that
    completes the first line (plain or speculative); with a clock that never passes it, to the end."""
    from types import SimpleNamespace

    from engine import stops

    tok = engine.target.tokenizer
    req = CompletionRequest(prefix="def f():\n", uri="tb", limits=Limits(max_tokens=60))
    plain = engine.complete(req, threading.Event(), SpecConfig(drafter="none"))
    first_line = next((i + 1 for i in range(len(plain.tokens)) if "\n" in tok.decode([plain.tokens[i]])), None)
    assert first_line and first_line < len(plain.tokens), "the answer needs a line break before its end"
    timed = dataclasses.replace(req, limits=Limits(max_tokens=60, time_budget_s=1.0))
    for clock, want, reason in ((itertools.count(0.0, 10.0), plain.tokens[:first_line], "time"),
                                (itertools.repeat(0.0), plain.tokens, plain.stop_reason)):
        monkeypatch.setattr(stops, "time", SimpleNamespace(perf_counter=functools.partial(next, clock)))
        for drafter in ("none", "hybrid"):
            res = engine.complete(timed, threading.Event(), SpecConfig(drafter=drafter))
            assert (res.tokens, res.stop_reason) == (want, reason), (reason, drafter)


def test_scope_end_rule():
    from engine.engine import _scope_end

    body = "x = 1\n    y = 2\n    return y\n"
    assert _scope_end(body, 4) == -1
    text = "x = 1\n    return y\ndef g():\n"
    assert text[: _scope_end(text, 4)] == "x = 1\n    return y"
    assert _scope_end("a\n\n    b\nc", 4) == len("a\n\n    b")  # known as soon as its first character is
    assert _scope_end("a\n    b\n  ", 4) == -1  # blank so far: its indentation is not known yet


def test_repetition_rule_keeps_the_first_occurrence():
    from engine.engine import _repetition_end

    loop = "\n        total += 1" * 5 + "\n        tot"
    assert loop[: _repetition_end(loop)] == "\n        total += 1"
    assert _repetition_end("a = 1\nb = 2\nb = 2\n") == -1  # twice is allowed
    assert _repetition_end("x\n}\n}\n}\n") == -1  # closing brackets are not a loop
    assert _repetition_end("\n\n\n\n") == -1
    line = "_cast(self.width, self.width, self.width, self.width, self.wi"
    cut = line[: _repetition_end(line)]
    assert cut.startswith("_cast(self.width") and cut.count("self.width") <= 2
    for fine in ("[0, 0, 0, 0, 0, 0]", "# " + "-" * 60, "assert f(1) == f(1)", "self.a, self.b, self.c, self.d",
                 "# " + "=" * 78, "x = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0]"):
        assert _repetition_end(fine) == -1, fine
    symbols = "    return ' ' * ' * " + "' * " * 20  # no letter in the unit, but long and mixed
    for end in range(len(symbols) - 4, len(symbols) + 1):  # wherever the last token ended
        cut = symbols[: _repetition_end(symbols[:end])]
        assert cut.startswith("    return ' ' *") and cut.count("*") <= 3, (end, cut)


def test_repetition_rule_catches_blocks_of_lines():
    from engine.engine import _repetition_end

    block = "        if not self.ready:\n            return\n"
    text = "        x = 1\n" + block * 4 + "        if"
    assert text[: _repetition_end(text)] == "        x = 1\n" + block.rstrip("\n")  # the first copy kept
    with_blank = "    if x:\n        raise E()\n\n"  # a blank line is part of the block
    assert _repetition_end("pass\n" + with_blank * 3) == len("pass\n" + with_blank) - 1
    assert _repetition_end("a = 1\n" + block * 2) == -1  # twice is allowed
    assert _repetition_end(("#\n# the same class\n") * 3) == len("#\n# the same class")
    nine = "".join(f"    line{i}\n" for i in range(9))  # longer than MAX_LOOP_LINES: not checked
    assert _repetition_end(nine * 3) == -1
    real = "    if a:\n        return 1\n    if b:\n        return 2\n    if c:\n        return 3\n"
    assert _repetition_end(real) == -1
    assert _repetition_end("}\n)\n" * 4) == -1  # closers only


def test_a_loop_counts_the_answers_first_line_and_symbol_lines():
    """The first line starts at the cursor, after the typed indentation: it is the loop's first copy (a
    JSON answer kept two copies of its line). A line of symbols only (`#`) loops once it runs six times."""
    from engine.engine import _repetition_end

    line = '"test": "todo.js",'
    text = line + ("\n    " + line) * 3 + "\n    "
    assert text[: _repetition_end(text)] == line
    assert _repetition_end(line + ("\n    " + line) * 1 + "\n") == -1  # twice is allowed
    hashes = "\n" + "#\n" * 11
    assert hashes[: _repetition_end(hashes)] == "\n#"
    assert _repetition_end("\n" + "#\n" * 5 + "x") == -1  # a comment box's few `#` lines


def test_repetition_stops_generation_token_by_token(engine):
    from engine.engine import _StopRules

    tok = engine.target.tokenizer
    ids = tok.encode("    x = 1\n" + "    y += 1\n" * 6, add_special_tokens=False)
    rules = _StopRules(tok, (), 0, 0.0)
    fired = next(i for i in range(1, len(ids) + 1) if rules(ids[:i]))
    assert rules(ids[:fired]) == "repeat"
    assert rules.cut(tok.decode(ids[:fired])) == "    x = 1\n    y += 1"


def test_ast_depth_tracker_follows_growing_code():
    from engine.syntax import DepthTracker

    t = DepthTracker("python")
    shallow = t.depth("x = 1\n")
    deep = t.depth("x = 1\nclass A:\n    def f(self):\n        return g([1, (2, {3: ")
    assert deep >= shallow + 5


def test_a_long_answer_gets_its_room_from_a_shorter_prompt(model_dirs):
    # a budget above half the context (the CPU default, 512, is below it)
    engine = load_engine(str(model_dirs["target"]), None, dtype="float32", prompt_tokens=1536)
    long_prefix = "".join(f"value_{i} = compute({i}, 'x')\n" for i in range(300))
    short = engine.complete(CompletionRequest(prefix=long_prefix, uri="room-a", limits=Limits(max_tokens=8)),
                            threading.Event(), SpecConfig(drafter="none"))
    long = engine.complete(CompletionRequest(prefix=long_prefix, uri="room-b", limits=Limits(max_tokens=700)),
                           threading.Event(), SpecConfig(drafter="none"))
    assert short.stats.prompt_tokens > engine.capacity // 2  # the configured budget when the answer is short
    assert long.stats.prompt_tokens <= engine.capacity // 2  # room for up to half the context of answer
    assert long.stop_reason != "context"


def test_token_healing_on_left_to_right_prompts(model_dirs):
    """A prompt ending in a lone space takes that token back and makes the first token start with it."""
    eng = load_engine(str(model_dirs["target"]), str(model_dirs["draft"]), dtype="float32",
                      config=EngineConfig(template="plain"))
    tok = eng.target.tokenizer
    req = CompletionRequest(prefix="def area(width, height):\n    return width * ", path="x.py",
                            mode="single-line", limits=Limits(max_tokens=12, max_lines=1))
    built = eng.prompts.build(req).tokens
    assert tok.decode(built[-1:]) == " "  # the case healing is for
    plain = eng.complete(req, threading.Event(), SpecConfig(drafter="none"))
    assert plain.stats.prompt_tokens == len(built) - 1  # the space went back
    assert plain.tokens and tok.decode(plain.tokens[:1]).startswith(" ")  # and the first token carries it
    full = tok.decode(plain.tokens)
    assert plain.text and full.startswith(" ") and not plain.text.startswith(" ") and full[1:].startswith(plain.text)
    for drafter in ("ngram", "draft", "hybrid"):  # healing is the same with speculation
        res = eng.complete(req, threading.Event(), SpecConfig(drafter=drafter))
        assert res.tokens == plain.tokens and res.text == plain.text, drafter
    # a cursor on a fresh indented line: the newline-and-indent token is healed too, and the stop rules
    # count the answer's lines, not the healed newline (one line asked, one line given)
    body = CompletionRequest(prefix="def area(width, height):\n    ", path="x.py", mode="single-line",
                             limits=Limits(max_tokens=12, max_lines=1))
    ends = eng.prompts.build(body).tokens
    assert tok.decode(ends[-1:]) == "\n    "  # one newline-and-indent token
    healed_tokens, healed, _ = eng._heal(list(ends))
    split = len(tok.encode("\n   ", add_special_tokens=False)) == 1
    if all(tok.encode("\n    " + w, add_special_tokens=False)[:1] == ends[-1:] for w in BOUNDARY_PROBES):
        # this tokenizer keeps "\n    " whole before any word ("re", "turn"): the prompt is already
        # as it saw code in training, and nothing is healed (SmolLM2's " return" case: test_default_model)
        assert healed == "" and healed_tokens == ends
    elif split:  # it becomes "\n   " in the prompt, and the first token must bring the last space (" return")
        assert healed == " " and tok.decode(healed_tokens[-1:]) == "\n   " and healed_tokens[:-1] == ends[:-1]
    else:  # no such token: the whole newline-and-indent is healed
        assert healed == "\n    " and healed_tokens == ends[:-1]
    res = eng.complete(body, threading.Event(), SpecConfig(drafter="none"))
    assert res.stats.prompt_tokens == len(healed_tokens) and tok.decode(res.tokens).startswith(healed)
    assert res.text and "\n" not in res.text and not res.text.startswith(" ")
    fim = load_engine(str(model_dirs["target"]), None, dtype="float32")  # FIM templates are left as they are
    assert fim.template.order != "none" and fim._heal(built) == (built, "", None)


def engine_heal(eng, tokens):
    return eng._heal(list(tokens))[1]


def test_ngram_min_match_proposes_less_and_keeps_the_output(engine):
    plain = engine.complete(REQ, threading.Event(), SpecConfig(drafter="none"))
    proposed = {}
    for n in (1, 3):
        res = engine.complete(REQ, threading.Event(), SpecConfig(drafter="ngram", ngram_min=n))
        assert res.tokens == plain.tokens
        proposed[n] = len(res.stats.proposed)
    assert proposed[3] <= proposed[1] and proposed[1] > 0


def test_single_line_requests_can_draft_differently(engine):
    from dataclasses import replace

    single = replace(REQ, mode="single-line", limits=Limits(max_tokens=40, max_lines=1))
    spec = SpecConfig(drafter="ngram", single_line_drafter="none")
    assert not engine.complete(single, threading.Event(), spec).stats.proposed  # no drafting on one line
    multi = engine.complete(REQ, threading.Event(), spec)
    assert multi.stats.proposed and multi.tokens == engine.complete(REQ, threading.Event(), SpecConfig(drafter="none")).tokens


def test_every_engine_config_field_reaches_model_options(model_dirs):
    """model.options carries template, snippet_share and remember_completions (and the rest) to the engine."""
    eng = load_engine(str(model_dirs["target"]), None, dtype="float32", template="plain", snippet_share=0.2,
                      remember_completions=3, prompt_tokens=300)
    assert eng.template.family == "plain"
    assert eng.prompts.budget.snippet_share == 0.2 and eng.prompts.budget.total == 300
    assert eng.history.maxlen == 3 and eng.snippet_budget() == 60
    with pytest.raises(ValueError, match="template must be"):
        load_engine(str(model_dirs["target"]), None, template="nonesuch")
    with pytest.raises(ValueError, match="snippet_share"):
        load_engine(str(model_dirs["target"]), None, snippet_share=1.5)
    # CUDA graphs are a GPU's: asked for on the CPU, the lean decoder keeps its exact eager path
    eng = load_engine(str(model_dirs["target"]), str(model_dirs["draft"]), dtype="float32", cuda_graphs=True)
    assert eng.config.cuda_graphs and eng.target_lm.graphs is None and eng.draft_lm.graphs is None
    with pytest.raises(ValueError, match="cuda_graphs"):
        load_engine(str(model_dirs["target"]), None, cuda_graphs="yes")


def test_apply_overrides_sets_the_spec_later_requests_run_with(engine):
    base = engine.config.spec
    try:
        spec = engine.apply_overrides(gamma=2, drafter="ngram")
        assert engine.config.spec is spec and spec == base.with_overrides(gamma=2, drafter="ngram")
        assert (spec.gamma, spec.schedule) == (2, "fixed")
        res = engine.complete(REQ, threading.Event())
        assert res.stats.proposed and max(res.stats.proposed) <= 2
        engine.apply_overrides(target_only=True)
        plain = engine.complete(REQ, threading.Event())
        assert not plain.stats.proposed and plain.tokens == res.tokens
    finally:
        engine.apply_overrides()
    assert engine.config.spec == base == engine.base_spec


def test_a_token_the_tokenizer_keeps_whole_before_any_word_is_not_healed(model_dirs):
    """Healing exists for cuts inside what the tokenizer would merge (" " before "=" is " ="); a token it
    ends before every word (Gemma's indentation, "    " then "files") is already canonical."""
    eng = load_engine(str(model_dirs["target"]), None, dtype="float32", config=EngineConfig(template="plain"))
    tok = eng.target.tokenizer
    seen = set()
    for prefix in ("def area(width, height):\n    ", "total = width * "):
        tokens = eng.prompts.build(CompletionRequest(prefix=prefix, path="x.py")).tokens
        last = tok.decode(tokens[-1:])
        stable = all(tok.encode(last + w, add_special_tokens=False)[:1] == tokens[-1:] for w in BOUNDARY_PROBES)
        healed_tokens, healed, _ = eng._heal(list(tokens))
        seen.add(stable)
        if stable:
            assert healed == "" and healed_tokens == tokens
        else:
            assert healed and healed_tokens[:-1] == tokens[: len(healed_tokens) - 1]
    assert seen == {True, False}  # this tokenizer has both kinds: "\n    " stays whole, " " merges into " ="


def test_gamma_starts_each_schedule_but_grow_which_starts_at_8(engine):
    """SpecConfig.gamma: the draft length of "fixed", the first one of adaptive and ast; "grow" moves among
    powers of two from 8 (the README's ngram-grow numbers) whatever it says."""
    for schedule, first in (("fixed", 3), ("adaptive", 3), ("ast", 3), ("grow", 8)):
        assert engine._gamma_policy(SpecConfig(schedule=schedule, gamma=3), REQ, 0).gamma([]) == first, schedule


def test_sampled_speculation_is_reproducible_from_the_seed(model_dirs):
    """temperature > 0: the draft model samples from the engine's draft generator (seeded from
    SpecConfig.seed), so two engines with one seed give one run, whatever used torch's global generator."""
    import torch

    runs = []
    for run in range(2):
        eng = load_engine(str(model_dirs["target"]), str(model_dirs["draft"]), dtype="float32", drafter="draft",
                          schedule="fixed", gamma=4, draft_confidence=0.0, temperature=1.5, seed=3)
        torch.manual_seed(run)
        res = eng.complete(REQ, threading.Event())
        runs.append((res.tokens, res.stats.proposed, res.stats.accepted))
    assert runs[0] == runs[1] and sum(runs[0][1]) > 0


def test_a_cancel_during_the_drafts_cold_prefill_stops_it_between_chunks(engine, monkeypatch):
    """The draft model's prefill of a long prompt checks the request's cancel flag between chunks, as the
    target's does: a cancel while it runs its first chunk ends the request there."""
    from engine.model import CANCEL_CHUNK

    engine.forget()
    event = threading.Event()
    draft = engine.draft_lm
    real = draft.forward

    def forward(tokens, keep_logits=None):
        event.set()  # cancelled while the draft works on its first chunk
        return real(tokens, keep_logits)

    monkeypatch.setattr(draft, "forward", forward)
    prefix = "".join(f"value_{i} = compute({i}, 'x')\n" for i in range(60))
    req = CompletionRequest(prefix=prefix, uri="draft-cancel", limits=Limits(max_tokens=20))
    step, before = draft.chunk or CANCEL_CHUNK, draft.forwards
    res = engine.complete(req, event, SpecConfig(drafter="draft"))
    assert res.cancelled and res.stats.prompt_tokens > step
    assert draft.forwards - before == 1 and len(draft.tokens) == step  # one chunk, not the prompt and k guesses
    assert engine.model_drafter.cancel is None  # the request's flag is not kept past it
    engine.forget()


def test_a_draft_that_cuts_off_target_tokens_is_refused(model_dirs, tokenizer_dir, tmp_path):
    """Both models' logits are cut to the rows they share, the target's too: a draft 150 rows short of
    the target's tokenizer made its last 150 tokens unreachable (and answers differ from the target's
    alone), so such a pair is refused, saying how many ids it would lose."""
    import shutil

    from tests.unit.engine.conftest import tiny_model

    tok = load_engine(str(model_dirs["target"]), None, dtype="float32").target.tokenizer
    small = len(tok) - 150
    tiny_model("llama", vocab=small, seed=12, layers=1, hidden=16).save_pretrained(tmp_path)
    for f in tokenizer_dir.iterdir():
        shutil.copy(f, tmp_path / f.name)
    with pytest.raises(ValueError, match=rf"could never emit its 150 ids from {small} on"):
        load_engine(str(model_dirs["target"]), str(tmp_path), dtype="float32")


def test_token_healing_with_a_draft_of_smaller_vocabulary(model_dirs, tokenizer_dir, tmp_path):
    """A target whose extra rows are padding past its tokenizer (Qwen2.5-Coder 7B against its 0.5B draft)
    runs with a draft of fewer rows: the target's logits are cut to the shared rows, healing's allowed
    first tokens are ids below that cut, and every mode gives the plain answer."""
    import shutil

    from tests.unit.engine.conftest import tiny_model

    tok = load_engine(str(model_dirs["target"]), None, dtype="float32").target.tokenizer
    padded = len(tok) + 150
    tiny_model("llama", vocab=padded, seed=12, layers=2, hidden=48).save_pretrained(tmp_path)
    for f in tokenizer_dir.iterdir():
        shutil.copy(f, tmp_path / f.name)
    eng = load_engine(str(tmp_path), str(model_dirs["draft"]), dtype="float32", config=EngineConfig(template="plain"))
    assert eng.target.vocab_size == padded and eng.target_lm.vocab_limit == len(tok) == eng.draft.vocab_size
    req = CompletionRequest(prefix="def area(width, height):\n    return width * ", path="x.py",
                            mode="single-line", limits=Limits(max_tokens=12, max_lines=1))
    _, healed, allowed = eng._heal(eng.prompts.build(req).tokens)
    assert healed == " " and int(allowed.max()) < len(tok)
    plain = eng.complete(req, threading.Event(), SpecConfig(drafter="none"))
    assert plain.tokens and max(plain.tokens) < len(tok) and tok.decode(plain.tokens[:1]).startswith(" ")
    for drafter in ("ngram", "draft", "hybrid"):
        assert eng.complete(req, threading.Event(), SpecConfig(drafter=drafter)).tokens == plain.tokens, drafter
