"""Speculative decoding is lossless: its greedy tokens equal the target's plain greedy tokens."""

from __future__ import annotations

import random
import threading

import pytest
import torch

from engine.drafters import HybridDrafter, ModelDrafter, NgramDrafter
from engine.speculative import AdaptiveGamma, FixedGamma, accept_greedy, accept_sampled, generate
from engine.types import CompletionStats
from tests.unit.engine.conftest import CPU, cached, naive_greedy, tiny_model


class ScheduleDrafter:
    """Knows the right answer; proposes a run that is right for a scheduled number of tokens, then wrong."""

    name = "schedule"

    def __init__(self, prompt_len: int, truth: list[int], schedule: list[int], vocab: int):
        self.prompt_len, self.truth, self.schedule, self.vocab = prompt_len, truth, schedule, vocab
        self.calls = 0

    def propose(self, tokens, k):
        pos = len(tokens) - self.prompt_len
        right = self.schedule[self.calls % len(self.schedule)]
        self.calls += 1
        out = []
        for i in range(k):
            t = self.truth[pos + i] if pos + i < len(self.truth) else 0
            out.append(t if i < right else (t + 1 + i) % self.vocab)
        return out

    def feedback(self, accepted, proposed):
        pass


def _prompts(vocab: int, n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randrange(3, 40))] for _ in range(n)]


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_schedule_drafter_matches_plain_greedy(family, llama, qwen2):
    model = llama if family == "llama" else qwen2
    for i, prompt in enumerate(_prompts(96, 6, seed=hash(family) % 100)):
        truth = naive_greedy(model, prompt, 24)
        for gamma in range(1, 9):
            for schedule in ([gamma], [0], [gamma // 2], [0, gamma, 1, 3]):
                drafter = ScheduleDrafter(len(prompt), truth, schedule, 96)
                tokens, reason = generate(cached(model), prompt, drafter, max_new_tokens=24,
                                          cancel=threading.Event(), gamma=FixedGamma(gamma))
                assert tokens == truth, (i, gamma, schedule)
                assert reason == "max_tokens"


def test_plain_loop_without_drafter_is_greedy(llama):
    for prompt in _prompts(96, 4, seed=3):
        tokens, _ = generate(cached(llama), prompt, None, max_new_tokens=20, cancel=threading.Event())
        assert tokens == naive_greedy(llama, prompt, 20)


def test_ngram_model_and_hybrid_drafters_are_lossless(llama):
    draft = tiny_model("llama", seed=7, layers=1, hidden=16)
    for prompt in _prompts(96, 4, seed=5):
        prompt = prompt + prompt[:10]  # something to copy
        truth = naive_greedy(llama, prompt, 30)
        for make in (
            lambda: NgramDrafter(),
            lambda: ModelDrafter(cached(draft)),
            lambda: HybridDrafter(NgramDrafter(), ModelDrafter(cached(draft))),
        ):
            for gamma in (FixedGamma(5), AdaptiveGamma()):
                stats = CompletionStats()
                tokens, _ = generate(cached(llama), prompt, make(), max_new_tokens=30,
                                     cancel=threading.Event(), gamma=gamma, stats=stats)
                assert tokens == truth
                assert sum(stats.accepted) <= sum(stats.proposed)


def test_draft_with_smaller_vocabulary_is_sliced_and_lossless(llama):
    draft = tiny_model("qwen2", vocab=80, seed=9, layers=1, hidden=16)  # target has 96 rows
    for prompt in _prompts(80, 4, seed=6):
        truth = naive_greedy(llama, prompt, 20)
        drafter = ModelDrafter(cached(draft, vocab_limit=80))
        tokens, _ = generate(cached(llama), prompt, drafter, max_new_tokens=20, cancel=threading.Event())
        assert tokens == truth


def test_eos_stops_even_inside_an_accepted_run(llama):
    prompt = _prompts(96, 1, seed=8)[0]
    truth = naive_greedy(llama, prompt, 20)
    eos = truth[7]
    first = truth.index(eos)
    drafter = ScheduleDrafter(len(prompt), truth, [8], 96)
    tokens, reason = generate(cached(llama), prompt, drafter, max_new_tokens=20,
                              cancel=threading.Event(), gamma=FixedGamma(8), eos=frozenset({eos}))
    assert (tokens, reason) == (truth[:first], "eos")


@pytest.mark.parametrize("stop_at", [2, 5, 7])
def test_stop_check_fires_inside_an_accepted_run_where_plain_would_stop(llama, stop_at):
    """A verify step that accepts 8 tokens must not overshoot a stop rule: the same tokens as plain."""
    prompt = _prompts(96, 1, seed=9)[0]
    truth = naive_greedy(llama, prompt, 20)
    check = lambda out: "stop" if len(out) >= stop_at else None  # noqa: E731
    plain, _ = generate(cached(llama), prompt, None, max_new_tokens=20, cancel=threading.Event(), stop_check=check)
    drafter = ScheduleDrafter(len(prompt), truth, [8], 96)
    spec, reason = generate(cached(llama), prompt, drafter, max_new_tokens=20, cancel=threading.Event(),
                            gamma=FixedGamma(8), stop_check=check)
    assert spec == plain == truth[:stop_at] and reason == "stop"


def test_stop_check_and_kv_reuse_across_calls(llama):
    prompt = _prompts(96, 1, seed=10)[0]
    lm = cached(llama)
    stats = CompletionStats()
    tokens, reason = generate(lm, prompt, NgramDrafter(), max_new_tokens=30, cancel=threading.Event(),
                              stop_check=lambda out: "stop" if len(out) >= 5 else None, stats=stats)
    assert reason == "stop" and tokens[:5] == naive_greedy(llama, prompt, 5)
    stats2 = CompletionStats()
    longer = prompt + [3, 4]
    tokens2, _ = generate(lm, longer, NgramDrafter(), max_new_tokens=10, cancel=threading.Event(), stats=stats2)
    assert stats2.reused_tokens == len(prompt)  # the typed tokens only appended
    assert tokens2 == naive_greedy(llama, longer, 10)


class CancelAt:
    """Sets the cancel event inside the n-th propose, or inside the n-th target forward."""

    def __init__(self, inner, event: threading.Event, at_propose: int | None):
        self.inner, self.event, self.at, self.calls, self.name = inner, event, at_propose, 0, "cancel"

    def propose(self, tokens, k):
        self.calls += 1
        if self.calls == self.at:
            self.event.set()
        return self.inner.propose(tokens, k)

    def feedback(self, a, p):
        pass


@pytest.mark.parametrize("at", [1, 2, 5])
def test_cancel_during_propose_runs_no_further_target_forward(llama, at):
    event = threading.Event()
    lm = cached(llama)
    drafter = CancelAt(NgramDrafter(), event, at)
    tokens, reason = generate(lm, _prompts(96, 1)[0], drafter, max_new_tokens=200, cancel=event)
    assert reason == "cancelled"
    assert lm.forwards == at  # prefill + (at - 1) verifies; none after the event


def test_cancel_during_verify_stops_before_the_next_step(llama):
    event = threading.Event()
    lm = cached(llama)
    forwards_at_set, draft_forwards_at_set = [], []
    original = lm.forward
    draft_lm = cached(tiny_model("llama", seed=7, layers=1, hidden=16))

    def forward(tokens, keep_logits=None):
        out = original(tokens, keep_logits)
        if lm.forwards == 3:
            event.set()
            forwards_at_set.append(lm.forwards)
            draft_forwards_at_set.append(draft_lm.forwards)
        return out

    lm.forward = forward
    drafter = ModelDrafter(draft_lm)
    _, reason = generate(lm, _prompts(96, 1)[0], drafter, max_new_tokens=200, cancel=event)
    assert reason == "cancelled" and lm.forwards == forwards_at_set[0]
    assert draft_forwards_at_set[0] > 0  # the drafter did run before the event ...
    assert draft_lm.forwards == draft_forwards_at_set[0]  # ... and never after it: propose is checked first


@pytest.mark.parametrize("backend", ["lean", "transformers"])
@pytest.mark.parametrize("after", [1, 3])
def test_cancel_during_prefill_stops_between_chunks_and_keeps_what_ran(llama, backend, after):
    from engine.lean import LeanLM

    event = threading.Event()
    lm = LeanLM(llama, CPU, max_len=512, chunk=16) if backend == "lean" else cached(llama)
    if backend == "transformers":
        import engine.model

        engine.model.CANCEL_CHUNK, saved = 16, engine.model.CANCEL_CHUNK
    original = lm.forward

    def forward(tokens, keep_logits=None):
        out = original(tokens, keep_logits)
        if lm.forwards == after:
            event.set()
        return out

    lm.forward = forward
    prompt = [(5 + 7 * i) % 90 for i in range(90)]
    try:
        tokens, reason = generate(lm, prompt, NgramDrafter(), max_new_tokens=20, cancel=event)
    finally:
        if backend == "transformers":
            engine.model.CANCEL_CHUNK = saved
    assert (tokens, reason) == ([], "cancelled")
    assert lm.forwards == after  # no forward ran after the event was set
    assert lm.tokens == prompt[: 16 * after]  # the chunks that ran stay cached for the next keystroke
    lm.forward = original
    again, _ = generate(lm, prompt, None, max_new_tokens=10, cancel=threading.Event())
    assert again == naive_greedy(llama, prompt, 10)


def test_accept_greedy():
    assert accept_greedy([1, 2, 3, 4], [1, 2, 9]) == [1, 2, 3]
    assert accept_greedy([5], []) == [5]
    assert accept_greedy([1, 2, 3, 4], [1, 2, 3]) == [1, 2, 3, 4]


def _chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


@pytest.mark.parametrize("one_hot", [False, True])
def test_rejection_sampling_preserves_the_target_distribution(one_hot):
    gen = torch.Generator().manual_seed(1234)
    p = torch.tensor([[0.5, 0.2, 0.2, 0.1], [0.1, 0.6, 0.2, 0.1]])  # (k+1=2, V=4)
    q = torch.tensor([[0.1, 0.1, 0.4, 0.4]])  # a draft that disagrees with the target
    counts = torch.zeros(4)
    trials = 20000
    for _ in range(trials):
        if one_hot:  # a deterministic drafter (n-gram) always proposes token 2
            tok, qq = 2, None
        else:
            tok, qq = int(torch.multinomial(q[0], 1, generator=gen)), q
        first = accept_sampled(p, qq, [tok], gen)[0]
        counts[first] += 1
    # chi-square, 3 degrees of freedom: 16.27 is the 0.1 % critical value; seeds are fixed
    assert _chi_square(counts, p[0]) < 16.27
    assert _chi_square(counts, torch.tensor([0.25] * 4)) > 100  # and the test can tell a wrong one


def test_growing_gamma_doubles_on_full_acceptance_and_halves_on_a_rejection():
    from engine.speculative import GrowingGamma

    g = GrowingGamma(initial=4, lo=2, hi=16)
    seen = []
    for accepted, proposed in ((4, 4), (8, 8), (16, 16), (3, 16), (0, 8), (0, 4), (0, 2)):
        g.update(accepted, proposed)
        seen.append(g.gamma([]))
    assert seen == [8, 16, 16, 8, 4, 2, 2]
    g.update(0, 0)  # nothing proposed: no evidence either way
    assert g.gamma([]) == 2


def _gamma_after(policy, steps, out=()):
    for accepted, proposed in steps:
        policy.update(accepted, proposed)
    return policy.gamma(list(out))


@pytest.mark.parametrize("steps, expected", [
    ((), 5),  # no evidence yet: the initial value
    (((0, 0),), 5),  # nothing proposed: no evidence either way
    (((5, 5),), 8),  # acceptance 1.0 -> round(10) -> capped at 8
    (((0, 5),), 2),  # acceptance 0.0 -> 0 -> raised to 2
    (((1, 10),), 2),  # 0.1 -> 1 -> raised to 2
    (((3, 10),), 3),
    (((3, 5),), 6),
    (((7, 10),), 7),
    (((4, 4), (0, 6)), 4),  # tokens over the window (4/10), not the mean of per-step rates (0.5)
    (((0, 5), (0, 5), (5, 5), (5, 5)), 5),  # window 8: every step still counts, 10/20
])
def test_adaptive_gamma_values(steps, expected):
    """min(8, max(2, round(acceptance * 10))), acceptance = accepted / proposed tokens over the window."""
    assert _gamma_after(AdaptiveGamma(initial=5, window=8), steps) == expected


def test_adaptive_gamma_forgets_steps_older_than_its_window():
    g = AdaptiveGamma(initial=5, window=2)
    assert _gamma_after(g, ((0, 5), (0, 5))) == 2
    assert _gamma_after(g, ((5, 5), (5, 5))) == 8  # the two rejections left the window


@pytest.mark.parametrize("depth, steps, expected", [
    (0, (), 5),  # shallow, no evidence: the initial value
    (5, (), 5),  # depth 5 is not deep
    (6, (), 3),  # deeper than 5 -> 3
    (6, ((5, 5),), 3),  # depth wins over a perfect acceptance
    (0, ((2, 5),), 3),  # acceptance 0.4 < 0.5 -> 3 (the seed rule would say 4)
    (0, ((5, 10),), 5),  # exactly 0.5: the seed rule, round(5)
    (0, ((3, 5),), 6),  # 0.6: the seed rule
    (0, ((8, 10),), 8),  # exactly 0.8: the seed rule, round(8)
    (0, ((9, 10),), 7),  # > 0.8 -> 7 (the seed rule would say 8)
    (0, ((5, 5),), 7),  # 1.0 -> 7, not the seed's cap of 8
])
def test_ast_gamma_values(depth, steps, expected):
    from engine.speculative import AstAdaptiveGamma

    seen = []
    policy = AstAdaptiveGamma(lambda out: seen.append(list(out)) or depth, initial=5, window=8)
    assert _gamma_after(policy, steps, out=[11, 12]) == expected
    assert seen == [[11, 12]]  # the depth is asked about the tokens generated so far


def test_engine_gamma_policy_builds_each_schedule_from_the_config():
    """Engine._gamma_policy: the schedule names map to the policies, with the configured values, and
    the ast policy measures depth on the prefix window plus the decoded tokens."""
    from types import SimpleNamespace

    from engine.engine import Engine
    from engine.speculative import AstAdaptiveGamma, GrowingGamma
    from engine.types import CompletionRequest, SpecConfig

    decoded = {(): "", (1,): "[{1: (2, [3, "}
    fake = SimpleNamespace(target=SimpleNamespace(tokenizer=SimpleNamespace(decode=lambda ids: decoded[tuple(ids)])))
    request = CompletionRequest(prefix="x = 0\ndef f(a):\n    return g(h(", language="python")
    window = len("def f(a):\n    return g(h(")  # the chars of the prefix that are in the prompt

    def policy(schedule, **kw):
        return Engine._gamma_policy(fake, SpecConfig(schedule=schedule, **kw), request, window)

    fixed = policy("fixed", gamma=4)
    assert isinstance(fixed, FixedGamma) and _gamma_after(fixed, ((0, 4),)) == 4
    assert isinstance(policy("grow"), GrowingGamma)
    adaptive = policy("adaptive", gamma=6, window=3)
    assert type(adaptive) is AdaptiveGamma and adaptive.gamma([]) == 6 and adaptive.recent.maxlen == 3
    ast = policy("ast", gamma=6, window=3)
    assert isinstance(ast, AstAdaptiveGamma) and ast.recent.maxlen == 3
    assert ast.gamma([]) == 6  # depth 3 at `g(h(`: not deep, no evidence -> the initial value
    assert ast.gamma([1]) == 3  # the generated `[{1: (2, [3, ` takes it to depth 7 -> 3
