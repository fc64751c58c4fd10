"""The graphed forward (engine/graphs.py) computes what the lean decoder's eager forward does.

Without CUDA the graphed path runs the same static-shape function eagerly, so these tests check its
logic (positions, K/V slots, the span mask, trees, spans crossing a bucket) on the CPU; the capture
itself is checked only where CUDA is present.
"""

from __future__ import annotations

import random
import threading

import pytest
import torch

from engine.drafters import ModelDrafter, NgramDrafter
from engine.graphs import MAX_ROWS, span_for
from engine.lean import LeanLM, tree_inputs
from engine.speculative import FixedGamma, generate
from engine.tree import TreeShape, generate_tree
from tests.unit.engine.conftest import CPU, naive_greedy, tiny_model


def test_spans_are_powers_of_two_capped_by_the_cache():
    assert [span_for(e, 4096) for e in (1, 256, 257, 1000, 4096)] == [256, 256, 512, 1024, 4096]
    assert span_for(300, 300) == 300 and span_for(10, 100) == 100


def test_tree_inputs():
    depth, anc = tree_inputs([-1, 0, 0, 1])
    assert depth == [0, 1, 1, 2]
    assert anc[3] == [True, True, False, True] and anc[2] == [True, False, True, False]
    with pytest.raises(ValueError):
        tree_inputs([-1, 2, 0])


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_graphed_rows_equal_the_eager_forward(family):
    model = tiny_model(family, seed=4)
    eager, graphed = LeanLM(model, CPU, max_len=300), LeanLM(model, CPU, max_len=300, graphs=True)
    assert graphed.graphs is not None and not graphed.graphs.capture  # no CUDA: run eagerly
    rng = random.Random(0)
    # a prefill (eager on both: more than MAX_ROWS), then decode and verify-sized blocks, a rollback,
    # and blocks that cross the 256 span into the last, 300-position one
    steps = [[rng.randrange(96) for _ in range(40)]] + [[rng.randrange(96) for _ in range(k)] for k in (1, 3, 16, 1, 8)]
    for new in steps:
        a, b = eager.forward(new), graphed.forward(new)
        assert a.shape == b.shape and torch.allclose(a, b, atol=1e-4), (a - b).abs().max()
    for lm in (eager, graphed):
        lm.truncate(50)
    assert torch.allclose(eager.forward([5, 6]), graphed.forward([5, 6]), atol=1e-4)
    prompt = [rng.randrange(96) for _ in range(250)]
    for lm in (eager, graphed):
        lm.prefill(prompt)
    for new in ([7] * 4, [8] * 16, [9]):  # ends at 254, 270, 271: spans 256, 300, 300
        a, b = eager.forward(new, keep_logits=2), graphed.forward(new, keep_logits=2)
        assert torch.allclose(a, b, atol=1e-4)
    assert graphed.tokens == eager.tokens and len(graphed.tokens) == 271


def test_graphed_forwards_keep_the_vocab_limit_and_the_eagle_features():
    model = tiny_model("llama", seed=3)
    eager = LeanLM(model, CPU, max_len=256, vocab_limit=50)
    graphed = LeanLM(model, CPU, max_len=256, vocab_limit=50, graphs=True)
    he, hg = eager.keep_hidden(), graphed.keep_hidden()
    for new in (list(range(3, 30)), [4, 5, 6], [7]):
        assert graphed.forward(new).shape[1] == 50
        eager.forward(new)
    assert torch.allclose(he[:31], hg[:31], atol=1e-5)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_graphed_trees_equal_eager_trees(family):
    model = tiny_model(family, seed=5, hidden=64)
    rng = random.Random(1)
    prompt = [rng.randrange(96) for _ in range(30)]
    for n in (2, 7, MAX_ROWS):
        parents = [-1] + [rng.randrange(i) for i in range(1, n)]
        tokens = [rng.randrange(96) for _ in range(n)]
        leaf = n - 1
        path = [leaf]
        while parents[path[-1]] >= 0:
            path.append(parents[path[-1]])
        path.reverse()
        outs = []
        for graphs in (False, True):
            lm = LeanLM(model, CPU, max_len=256, graphs=graphs)
            lm.forward(prompt)
            tree = lm.forward_tree(tokens, parents)
            lm.keep_path(path)
            outs.append((tree, lm.forward([11, 12]), list(lm.tokens)))
        (ta, na, sa), (tb, nb, sb) = outs
        assert torch.allclose(ta, tb, atol=1e-4) and torch.allclose(na, nb, atol=1e-4) and sa == sb


def test_speculation_through_graphs_is_plain_greedy():
    model = tiny_model("llama", seed=5)
    draft = tiny_model("llama", seed=6, layers=1, hidden=16)
    prompt = [4, 9, 2, 33, 4, 9, 2, 17, 60, 61]
    truth = naive_greedy(model, prompt, 30)
    for drafter in (None, NgramDrafter(), ModelDrafter(LeanLM(draft, CPU, max_len=256, graphs=True))):
        tokens, _ = generate(LeanLM(model, CPU, max_len=256, graphs=True), prompt, drafter, max_new_tokens=30,
                             cancel=threading.Event(), gamma=FixedGamma(4))
        assert tokens == truth
    tokens, _ = generate_tree(LeanLM(model, CPU, max_len=256, graphs=True), prompt, NgramDrafter(),
                              max_new_tokens=30, cancel=threading.Event(), shape=TreeShape(13, 4, 3))
    assert tokens == truth


def test_graphed_forwards_refuse_what_does_not_fit():
    lm = LeanLM(tiny_model("llama"), CPU, max_len=20, graphs=True)
    lm.forward(list(range(3, 18)))
    with pytest.raises(ValueError, match="exceed"):
        lm.graphs.run([1] * 8, 15)
    with pytest.raises(ValueError, match="rows"):
        lm.graphs.run([1] * (MAX_ROWS + 1), 0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_captured_graphs_equal_the_eager_forward_on_cuda():
    cuda = torch.device("cuda")
    model = tiny_model("qwen2", seed=4).to(cuda)
    eager, graphed = LeanLM(model, cuda, max_len=512), LeanLM(model, cuda, max_len=512, graphs=True)
    assert graphed.graphs.capture
    for new in (list(range(3, 40)), [5], [6, 7, 8], [9], [6, 7, 8]):  # the last replays a captured graph
        assert torch.allclose(eager.forward(new), graphed.forward(new), atol=1e-3)
    assert graphed.graphs.captures == 2


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_the_forward_traces_under_torch_compile(backend):
    """What `Graphs(compile="inductor")` compiles on a GPU, traced here by dynamo: "eager" checks the
    graph capture; "aot_eager" also runs AOTAutograd's functionalization, which inductor uses and which
    must carry the in-place K/V writes to the cache's per-layer views (aliases of one tensor)."""
    import torch._dynamo

    from engine.graphs import Graphs

    model = tiny_model("qwen2", seed=4)
    eager, traced = LeanLM(model, CPU, max_len=256), LeanLM(model, CPU, max_len=256)
    traced.graphs = Graphs(traced, compile=backend)
    torch._dynamo.reset()
    try:
        for new in (list(range(3, 40)), [5], [6, 7, 8], [9]):
            assert torch.allclose(eager.forward(new), traced.forward(new), atol=1e-4)
    finally:
        torch._dynamo.reset()


def test_padded_forwards_give_a_verify_row_the_decode_steps_bits():
    """pad=True: decode steps and verify rows all run MAX_ROWS rows, so (bf16, one span) a verify row is
    the decode step bit for bit; near the cache's end the real rows run alone and stay correct. (On this
    AVX2 CPU unpadded rows match too; on a GPU the row count picks the GEMM kernel: `bench gpu` measures both.)"""
    from engine.graphs import Graphs

    model = tiny_model("qwen2", seed=4, hidden=64).to(torch.bfloat16)
    lm, eager = LeanLM(model, CPU, max_len=64), LeanLM(model, CPU, max_len=64)
    lm.graphs = Graphs(lm, pad=True)
    rng = random.Random(2)
    prompt, fed = [rng.randrange(96) for _ in range(20)], [rng.randrange(96) for _ in range(12)]
    lm.forward(prompt)
    steps = torch.cat([lm.forward([t]) for t in fed])
    lm.truncate(len(prompt))
    for j in range(0, 12, 4):
        rows = lm.forward(fed[j : j + 4])
        assert all(torch.equal(rows[i], steps[j + i]) for i in range(4)), j
    eager.forward(prompt + fed)
    lm.forward(list(range(3, 3 + 64 - 33)))  # 63 cached: no room for 16 rows
    eager.forward(list(range(3, 3 + 64 - 33)))
    assert torch.allclose(lm.forward([5]).float(), eager.forward([5]).float(), atol=0.05)


@pytest.mark.parametrize("quant", ["int8", "int4"])
def test_padded_whole_cache_forwards_are_the_decode_steps_bit_for_bit(quant):
    """pad=True with span_step = the cache's length: every forward has one shape, so a verify row is
    the decode step at its position bit for bit, wherever it starts (here on the CPU's int8/int4
    weights, with SmolLM2's head size; a GPU's cuBLAS kernels are chosen by shape alike)."""
    from engine.graphs import Graphs

    model = tiny_model("llama", seed=7, hidden=256).to(torch.bfloat16)  # 4 heads of 64, as SmolLM2's
    lm = LeanLM(model, CPU, max_len=600, quant=quant)
    lm.graphs = Graphs(lm, pad=True, span_step=lm.max_len)
    rng = random.Random(3)
    ids = [rng.randrange(96) for _ in range(600)]
    for base in [40, 250, 255, 500, 509] + [rng.randrange(40, 560) for _ in range(3)]:
        lm.prefill(ids[: base + 1])
        lm.truncate(base)
        steps = torch.cat([lm.forward([t]) for t in ids[base : base + MAX_ROWS]])
        for k in (2, 5, 8, MAX_ROWS):
            lm.truncate(base)
            assert torch.equal(lm.forward(ids[base : base + k]), steps[:k]), (base, k)


def test_a_self_draft_does_not_run_its_targets_graphs():
    """A self draft copies its target's attributes; the target's graphs (its layers, its cache) stay behind."""
    from engine.selfdraft import SelfDraftLM

    model = tiny_model("llama", seed=5, layers=3)
    target = LeanLM(model, CPU, max_len=256, graphs=True)
    draft, ref = SelfDraftLM(target, 1), SelfDraftLM(LeanLM(model, CPU, max_len=256), 1)
    assert draft.graphs is None and target.graphs is not None
    for new in ([3, 4, 5], [6]):
        assert torch.allclose(draft.forward(new), ref.forward(new), atol=1e-5)
    assert target.tokens == []  # the draft's forwards never touched the target
