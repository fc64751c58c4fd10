"""Token-tree verification (issue 21): every tree row is a decode step, and generate_tree is plain greedy."""

from __future__ import annotations

import random
import threading

import pytest
import torch

from engine.drafters import HybridDrafter, ModelDrafter, NgramDrafter, _bfs
from engine.lean import INT8_MAX_ROWS, LeanLM, _depth_first
from engine.speculative import FixedGamma, generate
from engine.tree import TreeShape, accept_tree_greedy, accept_tree_sampled, generate_tree, tree_support
from engine.types import CompletionStats
from tests.unit.engine.conftest import CPU, cached, tiny_model

VOCAB = 96


def _random_tree(rng: random.Random, n: int, vocab: int = VOCAB) -> tuple[list[int], list[int]]:
    """n nodes, node 0 the only root (the pending token), each later node under a random earlier one."""
    parents = [-1] + [rng.randrange(i) for i in range(1, n)]
    return [rng.randrange(vocab) for _ in range(n)], parents


def _path(parents: list[int], i: int) -> list[int]:
    path = [i]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    return path[::-1]


def _lm(family: str, quant: str, seed: int = 5) -> LeanLM:
    model = tiny_model(family, seed=seed, hidden=64)
    if quant in ("int8", "int4"):
        model = model.to(torch.bfloat16)
    return LeanLM(model, CPU, max_len=256, quant=quant)


def _decode_steps(lm: LeanLM, base: int, tokens: list[int]) -> list[torch.Tensor]:
    """Each token's logits when the tokens are decoded one by one after the first `base` cached."""
    lm.truncate(base)
    out = [lm.forward([t])[-1] for t in tokens]
    lm.truncate(base)
    return out


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("quant", ["int8", "int4", "none"])
def test_tree_rows_equal_decode_steps(family, quant):
    """Row i of a tree forward is the decode step of node i after its ancestors: bit for bit on the
    int8 path (one query token at a time over the same keys), to float32 rounding without quant."""
    lm = _lm(family, quant)
    rng = random.Random(hash((family, quant)) % 1000)
    prompt = [rng.randrange(VOCAB) for _ in range(40)]  # > INT8_MAX_ROWS: a dense prefill, as in the engine
    lm.prefill(prompt)
    for trial in range(25):
        tokens, parents = _random_tree(rng, rng.randint(1, 16))
        logits = lm.forward_tree(tokens, parents)
        assert lm.tokens == prompt  # the tree is not part of the sequence until keep_path
        assert logits.shape == (len(tokens), VOCAB)
        for i in range(len(tokens)):
            ref = _decode_steps(lm, len(prompt), [tokens[j] for j in _path(parents, i)])[-1]
            if quant != "none":
                assert torch.equal(logits[i], ref), (trial, i)
            else:
                assert torch.allclose(logits[i], ref, atol=1e-4), (trial, i)
                assert int(logits[i].argmax()) == int(ref.argmax())


@pytest.mark.parametrize("quant", ["int8", "none"])
def test_tree_rows_equal_a_chain_verify(quant):
    """A tree that is a chain gives the rows of forward() over the same tokens (the chain verify)."""
    lm = _lm("llama", quant, seed=9)
    prompt = list(range(3, 30))
    lm.prefill(prompt)
    chain = [5, 17, 33, 2, 80]
    tree = lm.forward_tree(chain, [-1, 0, 1, 2, 3])
    ref = lm.forward(chain)
    if quant == "int8":
        assert torch.equal(tree, ref)
    else:
        assert torch.allclose(tree, ref, atol=1e-5)


@pytest.mark.parametrize("where", ["masked-cpu", "sdpa"])
def test_large_trees_and_sdpa_use_a_tree_mask(where):
    """More nodes than INT8_MAX_ROWS (one masked matmul on the CPU), or SDPA (the GPU path): the
    same logits as decoding each path, to float32 rounding."""
    lm = _lm("llama", "none", seed=3)
    if where == "sdpa":
        lm.manual_attention = False
    rng = random.Random(7)
    prompt = [rng.randrange(VOCAB) for _ in range(20)]
    lm.prefill(prompt)
    n = INT8_MAX_ROWS + 8 if where == "masked-cpu" else 12
    tokens, parents = _random_tree(rng, n)
    logits = lm.forward_tree(tokens, parents)
    for i in range(n):
        ref = _decode_steps(lm, len(prompt), [tokens[j] for j in _path(parents, i)])[-1]
        assert torch.allclose(logits[i], ref, atol=1e-4), i
    lm.forward_tree(tokens, parents)
    leaf = max(range(n), key=lambda i: len(_path(parents, i)))
    lm.keep_path(_path(parents, leaf))
    after = lm.forward([7])[-1]
    assert torch.allclose(after, _decode_steps(lm, len(prompt), [tokens[j] for j in _path(parents, leaf)] + [7])[-1],
                          atol=1e-4)


@pytest.mark.parametrize("quant", ["int8", "none"])
def test_keep_path_compacts_the_cache_to_the_path(quant):
    """After keep_path the cache is what decoding the path token by token leaves: the next
    forward's logits are the same (bit for bit on the int8 path), and the tokens are the path's."""
    lm = _lm("llama", quant, seed=11)
    rng = random.Random(1)
    prompt = [rng.randrange(VOCAB) for _ in range(12)]
    for trial in range(15):
        lm.prefill(prompt)
        tokens, parents = _random_tree(rng, rng.randint(1, 13))
        lm.forward_tree(tokens, parents)
        path = _path(parents, rng.randrange(len(tokens)))
        path = path[: rng.randint(1, len(path))]  # any prefix of a path, the root alone included
        lm.keep_path(path)
        assert lm.tokens == prompt + [tokens[j] for j in path]
        nxt = lm.forward([3, 4])
        lm.truncate(len(prompt))
        for j in path:
            lm.forward([tokens[j]])
        ref = lm.forward([3, 4])
        if quant == "int8":
            assert torch.equal(nxt, ref), trial
        else:
            assert torch.allclose(nxt, ref, atol=1e-5), trial
        lm.truncate(len(prompt))


def test_keep_path_refuses_what_is_not_a_path_of_the_last_tree():
    lm = _lm("llama", "none")
    lm.prefill([1, 2, 3])
    with pytest.raises(ValueError, match="forward_tree first"):
        lm.keep_path([0])
    lm.forward_tree([4, 5, 6], [-1, 0, 0])
    with pytest.raises(ValueError, match="not a path"):
        lm.keep_path([0, 1, 2])  # siblings
    lm.forward_tree([4, 5, 6], [-1, 0, 0])
    with pytest.raises(ValueError, match="not a path"):
        lm.keep_path([1])  # not a root
    lm.forward_tree([4, 5, 6], [-1, 0, 0])
    lm.forward([9])
    with pytest.raises(ValueError, match="changed"):
        lm.keep_path([0])
    with pytest.raises(ValueError, match="parent"):
        lm.forward_tree([4, 5], [-1, 1])
    assert lm.tokens == [1, 2, 3, 9]


def test_tree_orders():
    assert _depth_first([-1, 0, 0, 1, 2, 1]) == [0, 1, 3, 5, 2, 4]
    assert _depth_first([-1, -1, 0]) == [0, 2, 1]
    toks, parents = _bfs([10, 11, 12, 13], [-1, 0, -1, 1])  # depths 0 1 0 2
    assert toks == [10, 12, 11, 13] and parents == [-1, -1, 0, 2]


def test_only_the_lean_decoder_verifies_trees():
    lean = LeanLM(tiny_model("llama", seed=2), CPU, max_len=64)
    assert tree_support(lean) is None
    why = tree_support(cached(tiny_model("llama", seed=2)))
    assert why and "CachedLM" in why and "lean" in why
    with pytest.raises(ValueError, match="tree"):
        generate_tree(cached(tiny_model("llama", seed=2)), [1, 2, 3], NgramDrafter(), max_new_tokens=4,
                      cancel=threading.Event())


# ---- generate_tree is plain greedy -------------------------------------------------------------

class JunkTreeDrafter:
    """Adversarial: random trees of random tokens (a right token only by chance)."""

    name = "junk"

    def __init__(self, seed: int):
        self.rng = random.Random(seed)

    def propose_tree(self, tokens, max_nodes, depth, branch):
        toks, parents, depths, kids = [], [], [], {}
        for _ in range(self.rng.randint(0, max_nodes)):
            options = [p for p in range(-1, len(toks)) if (p < 0 or depths[p] < depth) and kids.get(p, 0) < branch]
            if not options:
                break
            p = self.rng.choice(options)
            kids[p] = kids.get(p, 0) + 1
            toks.append(self.rng.randrange(VOCAB))
            parents.append(p)
            depths.append(1 if p < 0 else depths[p] + 1)
        return _bfs(toks, parents)

    def feedback(self, accepted, proposed):
        pass


class OracleTreeDrafter(JunkTreeDrafter):
    """Knows plain greedy's answer: one path of the tree is right for a random length, the rest junk."""

    name = "oracle"

    def __init__(self, seed: int, prompt_len: int, truth: list[int]):
        super().__init__(seed)
        self.prompt_len, self.truth = prompt_len, truth

    def propose_tree(self, tokens, max_nodes, depth, branch):
        junk, junk_parents = super().propose_tree(tokens, max(0, max_nodes - depth), depth, branch - 1)
        pos = len(tokens) - self.prompt_len
        right = self.truth[pos : pos + min(depth, self.rng.randint(0, depth + 1))]
        toks, parents = list(junk), list(junk_parents)
        parent = -1
        for tok in right:  # the right path, appended after the junk and hung where it belongs
            toks.append(tok)
            parents.append(parent)
            parent = len(toks) - 1
        return _bfs(toks, parents)


def _plain(model, quant, prompt, n, eos=frozenset(), stop_check=None):
    lm = LeanLM(model, CPU, max_len=256, quant=quant)
    return generate(lm, prompt, None, max_new_tokens=n, cancel=threading.Event(), eos=eos, stop_check=stop_check)


@pytest.mark.parametrize("quant", ["int8", "none"])
def test_generate_tree_equals_plain_greedy(quant):
    model = tiny_model("llama", seed=5, hidden=64)
    draft = tiny_model("llama", seed=6, layers=1, hidden=32)
    if quant == "int8":
        model, draft = model.to(torch.bfloat16), draft.to(torch.bfloat16)
    rng = random.Random(3)
    motif = [rng.randrange(VOCAB) for _ in range(6)]
    prompts = [[rng.randrange(VOCAB) for _ in range(rng.randrange(3, 40))] for _ in range(4)]
    prompts += [motif * 4 + [rng.randrange(VOCAB)] for _ in range(2)]  # copyable: n-gram trees get accepted
    accepted_any = False
    for pi, prompt in enumerate(prompts):
        truth, _ = _plain(model, quant, prompt, 30)
        drafters = [NgramDrafter(), JunkTreeDrafter(pi), OracleTreeDrafter(pi, len(prompt), truth),
                    ModelDrafter(LeanLM(draft, CPU, max_len=256, quant=quant))]
        for drafter in drafters:
            for shape in (TreeShape(13, 4, 3), TreeShape(5, 2, 2), TreeShape(2, 1, 1), TreeShape(9, 6, 2)):
                stats = CompletionStats()
                lm = LeanLM(model, CPU, max_len=256, quant=quant)
                tokens, reason = generate_tree(lm, prompt, drafter, max_new_tokens=30, cancel=threading.Event(),
                                               shape=shape, stats=stats)
                assert tokens == truth, (pi, drafter.name, shape)
                assert reason == "max_tokens"
                assert all(n <= shape.nodes - 1 for n in stats.tree_nodes)
                assert all(a <= p <= shape.depth for a, p in zip(stats.accepted, stats.proposed))
                accepted_any |= sum(stats.accepted) > 0
                if drafter.name == "oracle" and shape.depth > 1:
                    assert stats.target_forwards < 30  # the right path was taken
    assert accepted_any


def test_generate_tree_with_hybrid_drafter_and_the_gamma_cap():
    model = tiny_model("llama", seed=5, hidden=64)
    draft = tiny_model("llama", seed=6, layers=1, hidden=32)
    prompt = [4, 9, 2, 33, 4, 9, 2, 17, 60, 61]
    truth, _ = _plain(model, "none", prompt, 30)
    hybrid = HybridDrafter(NgramDrafter(), ModelDrafter(LeanLM(draft, CPU, max_len=256)))
    stats = CompletionStats()
    tokens, _ = generate_tree(LeanLM(model, CPU, max_len=256), prompt, hybrid, max_new_tokens=30,
                              cancel=threading.Event(), gamma=FixedGamma(2), stats=stats)
    assert tokens == truth and stats.proposed and max(stats.proposed) <= 2


def test_generate_tree_reports_the_targets_logprobs_as_plain_does():
    """Routing's confidence rule reads stats.token_logprobs: a tree run gives plain's, token by token."""
    model = tiny_model("llama", seed=5, hidden=64).to(torch.bfloat16)
    prompt = [4, 9, 2, 33, 4, 9, 2, 17, 60, 61] * 2
    plain_stats, tree_stats = CompletionStats(), CompletionStats()
    truth, _ = generate(LeanLM(model, CPU, max_len=256, quant="int8"), prompt, None, max_new_tokens=24,
                        cancel=threading.Event(), stats=plain_stats)
    tokens, _ = generate_tree(LeanLM(model, CPU, max_len=256, quant="int8"), prompt,
                              OracleTreeDrafter(0, len(prompt), truth), max_new_tokens=24, cancel=threading.Event(),
                              stats=tree_stats)
    assert tokens == truth and sum(tree_stats.accepted) > 0
    assert tree_stats.token_logprobs[:24] == plain_stats.token_logprobs[:24]  # the same rows, the same bits


def test_generate_tree_stops_where_plain_stops():
    model = tiny_model("llama", seed=5, hidden=64)
    prompt = [4, 9, 2, 33, 4, 9, 2, 17, 60, 61]
    truth, _ = _plain(model, "none", prompt, 40)
    oracle = OracleTreeDrafter(0, len(prompt), truth)
    # eos inside an accepted path
    eos = frozenset({truth[7]})
    want = _plain(model, "none", prompt, 40, eos=eos)
    got = generate_tree(LeanLM(model, CPU, max_len=256), prompt, oracle, max_new_tokens=40,
                        cancel=threading.Event(), eos=eos)
    assert got == want and got[1] == "eos"
    # a stop rule firing mid-path
    for at in (1, 5, 6, 11):
        def stop(out, at=at):
            return "stop" if len(out) >= at else None

        want = _plain(model, "none", prompt, 40, stop_check=stop)
        got = generate_tree(LeanLM(model, CPU, max_len=256), prompt, OracleTreeDrafter(at, len(prompt), truth),
                            max_new_tokens=40, cancel=threading.Event(), stop_check=stop)
        assert got == want == (truth[:at], "stop")
    # max_new_tokens is never overshot by a deep tree
    for n in (1, 2, 3, 7):
        got = generate_tree(LeanLM(model, CPU, max_len=256), prompt, OracleTreeDrafter(n, len(prompt), truth),
                            max_new_tokens=n, cancel=threading.Event())
        assert got == (truth[:n], "max_tokens")


def test_generate_tree_cancels_before_propose_and_verify():
    model = tiny_model("llama", seed=5, hidden=64)
    event = threading.Event()
    lm = LeanLM(model, CPU, max_len=256)

    class Cancelling(NgramDrafter):
        def propose_tree(self, tokens, max_nodes, depth, branch):
            event.set()  # cancelled while drafting: no verify forward follows
            return super().propose_tree(tokens, max_nodes, depth, branch)

    stats = CompletionStats()
    tokens, reason = generate_tree(lm, [1, 2, 3, 1, 2], Cancelling(), max_new_tokens=20, cancel=event, stats=stats)
    assert reason == "cancelled" and len(tokens) == 1 and stats.target_forwards == 1  # the prefill only
    event.set()
    assert generate_tree(lm, [1, 2, 3], NgramDrafter(), max_new_tokens=20, cancel=event) == ([], "cancelled")


# ---- acceptance rules --------------------------------------------------------------------------

def test_accept_tree_greedy_takes_the_longest_agreeing_path():
    #        0(pending) -> 1:a, 2:b ; 1 -> 3:c ; 2 -> 4:d, 5:e ; 5 -> 6:f
    tokens = [0, 10, 11, 12, 13, 14, 15]
    parents = [-1, 0, 0, 1, 2, 2, 5]
    choice = [11, 99, 14, 99, 99, 15, 42]  # the target wants b after the root, then e, then f, then 42
    assert accept_tree_greedy(choice, tokens, parents) == [0, 2, 5, 6]
    assert accept_tree_greedy([77] * 7, tokens, parents) == [0]


def test_tree_rejection_sampling_preserves_the_target_distribution():
    """SpecInfer's multi-candidate rule: the first emitted token is distributed as p, whatever the
    children proposed; chi-square over 20k draws."""
    gen = torch.Generator().manual_seed(0)
    p0 = torch.tensor([0.05, 0.3, 0.2, 0.15, 0.1, 0.2])
    p = torch.stack([p0, torch.full((6,), 1 / 6), torch.full((6,), 1 / 6), torch.full((6,), 1 / 6)])
    tokens, parents = [0, 1, 2, 1], [-1, 0, 0, 0]  # children 1, 2 and a duplicate 1
    counts = torch.zeros(6)
    n = 20000
    for _ in range(n):
        path, bonus = accept_tree_sampled(p, tokens, parents, gen)
        first = tokens[path[1]] if len(path) > 1 else bonus
        counts[first] += 1
    expected = p0 * n
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 20.5  # 5 degrees of freedom, p = 0.001


def test_sampled_generate_tree_runs_and_stays_in_the_tree_contract():
    model = tiny_model("llama", seed=5, hidden=64)
    prompt = [4, 9, 2, 33, 4, 9, 2, 17, 60, 61]
    gen = torch.Generator().manual_seed(1)
    lm = LeanLM(model, CPU, max_len=256)
    tokens, reason = generate_tree(lm, prompt, NgramDrafter(), max_new_tokens=25, cancel=threading.Event(),
                                   temperature=0.8, generator=gen)
    assert reason == "max_tokens" and len(tokens) == 25
    assert lm.tokens[: len(prompt) + len(tokens) - 1] == prompt + tokens[:-1]  # the cache holds the answer


# ---- the n-gram tree ---------------------------------------------------------------------------

def test_ngram_tree_branches_on_different_continuations():
    d = NgramDrafter()
    #             x  y  1  2  3 | x  y  4  5 | x  y  1  2  6 | x y
    seq = [7, 8, 1, 2, 3, 9, 7, 8, 4, 5, 9, 7, 8, 1, 2, 6, 9, 7, 8]
    toks, parents = d.propose_tree(seq, 12, 3, 3)
    chain = d.propose(seq, 3)
    assert chain == [1, 2, 6]
    # the first path is propose's chain; the other occurrence after "7 8" gives a second branch
    assert toks[:2] == [1, 4] and parents[:2] == [-1, -1]
    paths = set()
    for i in range(len(toks)):
        path, j = [], i
        while j >= 0:
            path.append(toks[j])
            j = parents[j]
        paths.add(tuple(path[::-1]))
    assert {(1, 2, 6), (1, 2, 3), (4, 5, 9)} <= paths
    assert all(p < i for i, p in enumerate(parents))  # parents come first
    depth = []
    for p in parents:
        depth.append(0 if p < 0 else depth[p] + 1)
    assert depth == sorted(depth)  # breadth first


def test_ngram_tree_respects_its_limits_and_copies_extra_sequences():
    rng = random.Random(0)
    seq = [rng.randrange(6) for _ in range(400)]  # few symbols: many occurrences, many branches
    d = NgramDrafter()
    for nodes, depth, branch in ((12, 4, 3), (3, 4, 3), (20, 2, 2), (12, 4, 1)):
        toks, parents = d.propose_tree(seq, nodes, depth, branch)
        assert 0 < len(toks) <= nodes
        kids: dict[int, int] = {}
        dep = []
        for p in parents:
            kids[p] = kids.get(p, 0) + 1
            dep.append(1 if p < 0 else dep[p] + 1)
        assert max(kids.values()) <= branch and max(dep) <= depth
        siblings = [(p, t) for p, t in zip(parents, toks)]
        assert len(set(siblings)) == len(siblings)  # no two children of a node with the same token
    d = NgramDrafter()
    d.set_extra([[50, 51, 52, 53], [60, 61, 62]])
    assert d.propose_tree([1, 50, 51], 12, 4, 3) == ([52, 53], [-1, 0])  # the sentinel ends the copy
    assert d.propose_tree([1, 2, 3], 12, 4, 3) == ([], [])
    assert d.propose_tree([], 12, 4, 3) == ([], [])


# ---- the draft model's tree --------------------------------------------------------------------

def test_model_drafter_tree_is_its_top_k_level_by_level():
    draft = tiny_model("llama", seed=6, layers=1, hidden=32)
    lean = ModelDrafter(LeanLM(draft, CPU, max_len=256))
    prompt = [4, 9, 2, 33, 4, 9, 2]
    toks, parents = lean.propose_tree(prompt, 12, 4, 3)
    assert len(toks) == 12 and all(p < i for i, p in enumerate(parents))
    depth = []
    for p in parents:
        depth.append(1 if p < 0 else depth[p] + 1)
    assert depth == [1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4]  # ceil(12 / 4) = 3 nodes a level, breadth first
    ref = LeanLM(draft, CPU, max_len=256)
    top = torch.topk(ref.prefill(prompt)[0], 3).indices.tolist()
    assert toks[:3] == top  # the first level is the draft's top 3
    chain = ModelDrafter(LeanLM(draft, CPU, max_len=256)).propose(prompt, 4)
    assert toks[0] == chain[0]  # the best child first: the greedy chain starts the tree
    # a draft on transformers (no trees) proposes its chain, as a tree with one child per node
    hf = ModelDrafter(cached(draft))
    toks, parents = hf.propose_tree(prompt, 12, 4, 3)
    assert toks == chain and parents == [-1, 0, 1, 2]
