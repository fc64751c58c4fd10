"""`draftline bench gpu`: the GPU path measured on random-init weights of real shapes (issue 20).

Speed does not depend on the weights' values, so each shape (SmolLM2-135M, Qwen2.5-Coder 0.5B / 1.5B
/ 7B) is built with random weights on the device, in bf16 by default. For each shape and context:
- plain decode ms/token: transformers (through engine.model.CachedLM), the lean decoder (eager) and
  the lean decoder with CUDA graphs (engine/graphs.py); each step ends in the argmax's host read, as
  a greedy step does;
- verify cost of k rows (and a 13-node tree) as multiples of one step, eager and graphed, the ks
  interleaved so drift hits all alike;
- prefill of the longest context (transformers and the lean decoder);
- the bandwidth floor: weight bytes plus K/V bytes read per token over the measured device-to-device
  copy bandwidth (bytes read plus written);
- exactness: on the graphed decoder, `--exact-steps` greedy steps one token at a time, then the same
  tokens verified k at a time: the share of verify forwards with a row whose argmax differs from the
  step's, the largest logit difference, and the share of steps whose top-two margin is below it
  (what a verify-then-recheck-ties scheme would redo); again on the eager decoder (today's GPU
  path), on graphs padded to 16 rows (every forward the same GEMM shapes) with bucketed spans and
  over the whole cache (one shape for every forward: exact by construction; the decode ms/token of
  both is printed too), and on the graphed one with the head in float32.
Random weights make flatter distributions than a trained model's (smaller top-two margins), so the
exactness figures are a pessimistic estimate of how often a real model's argmax flips.
Then a projection of speculation for `--pair DRAFT:TARGET` from the graphed costs: expected tokens
per verify under i.i.d. acceptance `--acceptance` (a model, not a measurement) over the cost of
gamma draft steps plus one verify of gamma + 1 rows, for the best gamma among the measured ks.

Without CUDA it runs the same code with graphs run eagerly (`--shapes tiny --device cpu` is the test).
Each part's failure is recorded in the output and the run goes on: one device run must yield all it can.
On a lent GPU machine (torch and transformers installed, nothing else), from the repository root:

    PYTHONUNBUFFERED=1 timeout 90 python3 -m pytest -q -p no:cacheprovider tests/unit/engine/test_graphs.py
    PYTHONUNBUFFERED=1 timeout 480 python3 -m engine.bench.gpu --json $OUT/gpu.json 2>&1 | tee $OUT/gpu.txt

(the first checks the captured graphs against the eager forward; the second prints the README's table).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
import traceback
from typing import Any, Callable

from engine.graphs import MAX_ROWS

# name: (model_type, hidden, intermediate, layers, heads, KV heads, vocabulary, tied head, rope theta, rms eps),
# from each model's config.json (SmolLM2: reference/real-models.md; Qwen2.5-Coder: the issue and the model cards)
SHAPES: dict[str, tuple] = {
    "smollm2-135m": ("llama", 576, 1536, 30, 9, 3, 49152, True, 100000.0, 1e-5),
    "qwen2.5-coder-0.5b": ("qwen2", 896, 4864, 24, 14, 2, 151936, True, 1e6, 1e-6),
    "qwen2.5-coder-1.5b": ("qwen2", 1536, 8960, 28, 12, 2, 151936, True, 1e6, 1e-6),
    "qwen2.5-coder-7b": ("qwen2", 3584, 18944, 28, 28, 4, 151936, False, 1e6, 1e-6),
    "tiny": ("qwen2", 64, 128, 2, 4, 2, 512, True, 10000.0, 1e-6),  # the CPU test's
}
DEFAULT_SHAPES = "smollm2-135m,qwen2.5-coder-0.5b,qwen2.5-coder-1.5b,qwen2.5-coder-7b"
TREE13 = [-1, 0, 0, 0, 1, 1, 2, 4, 4, 5, 7, 7, 8]  # 13 nodes, depth 4, at most 3 children: TreeShape()'s size


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shapes", help=f"comma-separated, from: {', '.join(SHAPES)} (default: {DEFAULT_SHAPES}; "
                                     "without a GPU, name them: tiny checks the code)")
    p.add_argument("--contexts", default="512,4096", help="tokens before the measured forwards")
    p.add_argument("--ks", default="1,2,4,8,16", help="verify rows (1 is the plain step)")
    p.add_argument("--steps", type=int, default=32, help="decode steps timed per backend and context")
    p.add_argument("--reps", type=int, default=7, help="timed verify forwards per k")
    p.add_argument("--exact-steps", type=int, default=64, help="greedy steps checked against verify rows")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    p.add_argument("--copy-mib", type=int, default=1024, help="size of the bandwidth probe's copy")
    p.add_argument("--no-transformers", action="store_true", help="skip the transformers backend")
    p.add_argument("--pair", default="qwen2.5-coder-0.5b:qwen2.5-coder-7b", help="DRAFT:TARGET for the projection")
    p.add_argument("--acceptance", default="0.37,0.6,0.8",
                   help="per-token acceptance rates to project with (0.37 / 0.60: the default CPU pair's EAGLE "
                        "draft, acceptance and first-guess agreement in README's table)")
    p.add_argument("--compile", default="smollm2-135m",
                   help="shapes whose graphed decode is also timed with the forward compiled by torch.compile "
                        "(inductor; one compilation per context; run last: compiling takes tens of seconds)")
    p.add_argument("--compile-backend", default="inductor",
                   help="torch.compile backend for --compile (the CPU test uses aot_eager: no C++ build)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _ms(fn: Callable[[], Any], device) -> float:
    _sync(device)
    started = time.perf_counter()
    fn()
    _sync(device)
    return (time.perf_counter() - started) * 1e3


def _attempt(out: dict, key: str, fn: Callable[[], Any]) -> Any:
    """out[key] = fn(), or the error's last line (the run goes on)."""
    try:
        out[key] = fn()
    except Exception as exc:  # a device run must report every part it can
        traceback.print_exc(file=sys.stderr)
        out[key] = {"error": f"{type(exc).__name__}: {exc}"}
    return out[key]


def build(name: str, device, dtype):
    """A random-init transformers model of the shape `name` on `device`."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    kind, hidden, inter, layers, heads, kv, vocab, tied, theta, eps = SHAPES[name]
    cfg = AutoConfig.for_model(kind, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                               num_attention_heads=heads, num_key_value_heads=kv, vocab_size=vocab,
                               tie_word_embeddings=tied, rope_theta=theta, rms_norm_eps=eps,
                               max_position_embeddings=32768)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    return model.eval()


def decode_ms(lm, prompt: list[int], steps: int, device) -> float:
    """Median ms of a greedy step (forward of one token, argmax read on the host) after `prompt`."""
    lm.reset()
    tok = int(lm.forward(prompt, keep_logits=1)[-1].argmax())
    times = []
    for i in range(steps + 3):
        started = time.perf_counter()
        tok = int(lm.forward([tok])[-1].argmax())
        if i >= 3:  # warm-up: the first steps capture graphs and fill allocator caches
            times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times)


def verify_costs(lm, prompt: list[int], ks: list[int], reps: int, device) -> dict[str, float]:
    """Median ms of a forward of k rows after `prompt` (k=1: the step) and of a 13-node tree, rolled back
    after each; the arms interleaved."""
    import random

    rng = random.Random(len(prompt))
    lm.reset()
    lm.forward(prompt, keep_logits=1)
    base = len(lm.tokens)
    arms = [str(k) for k in ks] + ["tree13"]
    times: dict[str, list[float]] = {a: [] for a in arms}
    for r in range(reps + 1):
        for arm in arms:
            if arm == "tree13":
                toks = [rng.randrange(lm.rows) for _ in TREE13]
                t = _ms(lambda: int(lm.forward_tree(toks, TREE13).argmax(-1)[-1]), device)
            else:
                toks = [rng.randrange(lm.rows) for _ in range(int(arm))]
                t = _ms(lambda: int(lm.forward(toks)[-1].argmax()), device)
                lm.truncate(base)
            if r:  # the first round warms (and captures) every shape
                times[arm].append(t)
    return {a: statistics.median(v) for a, v in times.items()}


def prefill_ms(lm, prompt: list[int], device, reps: int = 3) -> float:
    def run():
        lm.reset()
        lm.forward(prompt, keep_logits=1)

    run()
    return statistics.median(_ms(run, device) for _ in range(reps))


def exactness(lm, prompt: list[int], steps: int, ks: list[int], stride: int = 1) -> dict[str, Any]:
    """Greedy steps one token at a time against the same tokens verified k at a time (rows = steps),
    a verify starting at every `stride`-th step: with 64 steps, 49 verifies of 16 where blocks of 16
    side by side gave 4, too few for a share."""
    import torch

    lm.reset()
    last = lm.forward(prompt, keep_logits=1)[-1]
    fed, rows = [], []
    for _ in range(steps):
        fed.append(int(last.argmax()))
        last = lm.forward([fed[-1]])[-1]
        rows.append(last)
    seq = torch.stack(rows)  # (S, V): row j predicts the token after fed[j]
    top2 = seq.topk(2, -1).values
    margin = top2[:, 0] - top2[:, 1]
    out: dict[str, Any] = {}
    worst = 0.0
    for k in ks:
        if k == 1:
            continue
        forwards = differ = rows_differ = 0
        for j in range(0, steps - k + 1, stride):
            lm.truncate(len(prompt) + j)
            got = lm.forward(fed[j : j + k])
            diff = (got - seq[j : j + k]).abs().max(-1).values
            worst = max(worst, float(diff.max()))
            bad = int((got.argmax(-1) != seq[j : j + k].argmax(-1)).sum())
            forwards += 1
            differ += bad > 0
            rows_differ += bad
        out[f"k{k}"] = {"verifies": forwards, "verifies_differing": differ, "rows_differing": rows_differ}
    out["max_abs_logit_diff"] = worst
    out["steps_with_margin_below_it"] = float((margin <= worst).float().mean()) if worst else 0.0
    out["median_top2_margin"] = float(margin.median())
    return out


def weight_bytes(lm) -> int:
    """Bytes a decode step reads of the weights: every linear, bias and norm, and the head (one embedding row aside)."""
    total = lm.lm_head.w.numel() * lm.lm_head.w.element_size() + lm.final_norm.numel() * lm.final_norm.element_size()
    for layer in lm.layers:
        for part in layer:
            for t in ((part.w, part.b) if hasattr(part, "w") else (part,)):
                if t is not None:
                    total += t.numel() * t.element_size()
    return total


def kv_bytes(lm, context: int) -> int:
    return len(lm.layers) * 2 * lm.n_kv * context * lm.head_dim * lm.kv.element_size()


def copy_bandwidth(device, mib: int, reps: int = 30) -> float:
    """Device-to-device copy, bytes read plus written per second: the fastest of `reps`, after as many
    copies to warm up (a GPU idle until then may still be at low clocks, and a low bandwidth would
    lower the floor that decode is compared with)."""
    import torch

    n = mib << 20
    src = torch.empty(n, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    for _ in range(reps):
        dst.copy_(src)
    t = min(_ms(lambda: dst.copy_(src), device) for _ in range(reps))
    del src, dst
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)  # the first shape's peak is its own, not the probe's
    return 2 * n / (t / 1e3)


class _Fp32Head:
    """The head as a float32 GEMM (bf16 inputs and weights widened): the check of whether the head's rounding matters."""

    def __init__(self, head):
        self.w = head.w.float()

    def __call__(self, x):
        import torch

        return torch.nn.functional.linear(x.float(), self.w)


def measure_shape(name: str, args, device, dtype, ks: list[int], contexts: list[int], bandwidth: float) -> dict:
    import random

    import torch

    from engine.graphs import Graphs
    from engine.lean import LeanLM
    from engine.model import CachedLM

    res: dict[str, Any] = {"shape": name}
    torch.manual_seed(args.seed)
    model = build(name, device, dtype)
    res["params_M"] = round(sum(p.numel() for p in model.parameters()) / 1e6, 1)
    vocab = model.config.vocab_size
    rng = random.Random(args.seed)
    margin = max(args.steps + 3, args.exact_steps, max(ks), len(TREE13)) + 1
    longest = max(contexts)
    tokens = [rng.randrange(vocab) for _ in range(longest)]
    prompts = {c: tokens[: max(1, c - margin)] for c in contexts}  # the measured forwards end within c
    res["prompt_tokens"] = {str(c): len(p) for c, p in prompts.items()}
    if not args.no_transformers:
        hf = CachedLM(model, device)
        _attempt(res, "transformers_decode_ms", lambda: {str(c): decode_ms(hf, p, args.steps, device)
                                                         for c, p in prompts.items()})
        _attempt(res, "transformers_prefill_ms", lambda: prefill_ms(hf, tokens, device))
        hf.reset()
        del hf
    lm = LeanLM(model, device, max_len=longest + 64)
    res["weight_MB"] = round(weight_bytes(lm) / 1e6, 1)
    res["floor_ms"] = {str(c): (weight_bytes(lm) + kv_bytes(lm, c)) / bandwidth * 1e3 for c in contexts}
    _attempt(res, "lean_prefill_ms", lambda: prefill_ms(lm, tokens, device))
    for label, graphs in (("lean", False), ("graphs", True)):
        lm.graphs = Graphs(lm) if graphs else None
        _attempt(res, f"{label}_decode_ms", lambda: {str(c): decode_ms(lm, p, args.steps, device)
                                                     for c, p in prompts.items()})
        costs = _attempt(res, f"{label}_verify_ms", lambda: {str(c): verify_costs(lm, p, ks, args.reps, device)
                                                             for c, p in prompts.items()})
        if "error" not in costs:
            res[f"{label}_verify_steps"] = {c: {a: v / row["1"] for a, v in row.items()} for c, row in costs.items()}
    if lm.graphs is not None:
        res["graphs_captured"] = lm.graphs.captures

    def graph_vs_eager() -> float:
        """The largest logit difference between a graphed and an eager forward of the same rows."""
        p = prompts[min(contexts)]
        worst = 0.0
        for k in ks:
            rows = []
            for graphs in (lm.graphs, None):
                keep, lm.graphs = lm.graphs, graphs
                lm.reset()
                lm.forward(p, keep_logits=1)
                rows.append(lm.forward(tokens[len(p) : len(p) + k]))
                lm.graphs = keep
            worst = max(worst, float((rows[0] - rows[1]).abs().max()))
        return worst

    _attempt(res, "graph_vs_eager_max_diff", graph_vs_eager)
    p0 = prompts[min(contexts)]
    _attempt(res, "exactness", lambda: exactness(lm, p0, args.exact_steps, ks))
    lm.graphs = None
    _attempt(res, "exactness_eager", lambda: exactness(lm, p0, args.exact_steps, ks))
    for label, step in (("padded", None), ("padded_whole", lm.max_len)):  # bucketed spans; always the whole cache
        lm.graphs = Graphs(lm, pad=True, span_step=step)
        _attempt(res, f"{label}_decode_ms", lambda: {str(c): decode_ms(lm, p, args.steps, device)
                                                     for c, p in prompts.items()})
        _attempt(res, f"exactness_{label}", lambda: exactness(lm, p0, args.exact_steps, ks))
    head = lm.lm_head
    lm.lm_head = _Fp32Head(head)
    lm.graphs = Graphs(lm)
    _attempt(res, "exactness_fp32_head", lambda: exactness(lm, p0, args.exact_steps, ks))
    lm.lm_head, lm.graphs = head, None
    del lm, model
    gc.collect()
    if device.type == "cuda":
        res["peak_GB"] = round(torch.cuda.max_memory_allocated(device) / 1e9, 1)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    return res


def measure_compiled(name: str, args, device, dtype, contexts: list[int]) -> dict:
    """Graphed decode ms/token with the forward compiled (inductor fuses the elementwise kernels)."""
    import random

    import torch

    from engine.graphs import Graphs
    from engine.lean import LeanLM

    torch.manual_seed(args.seed)
    model = build(name, device, dtype)
    rng = random.Random(args.seed)
    tokens = [rng.randrange(model.config.vocab_size) for _ in range(max(contexts))]
    lm = LeanLM(model, device, max_len=max(contexts) + 64)
    lm.graphs = Graphs(lm, compile=args.compile_backend)
    out: dict[str, Any] = {}
    started = time.perf_counter()
    out["decode_ms"] = {str(c): decode_ms(lm, tokens[: max(1, c - args.steps - 8)], args.steps, device) for c in contexts}
    out["wall_s"] = round(time.perf_counter() - started, 1)  # compilations included
    # the compiled forward must be the eager one (it writes the cache's per-layer views in place):
    # a prefill and a decode step on both, their logits compared
    eager = LeanLM(model, device, max_len=max(contexts) + 64)
    probe = tokens[:64]
    diffs = []
    for m in (lm, eager):
        m.reset()
        m.forward(probe[:-1], keep_logits=1)
    diffs.append(float((lm.forward(probe[-1:]).float() - eager.forward(probe[-1:]).float()).abs().max()))
    out["compiled_vs_eager_max_diff"] = max(diffs)
    del lm, model, eager
    gc.collect()
    return out


def project(draft: dict, target: dict, ks: list[int], rates: list[float]) -> dict:
    """Speedup of draft -> target speculation over plain graphed decoding, per context and acceptance rate."""
    out: dict[str, Any] = {}
    for c, steps in target["graphs_verify_steps"].items():
        c_draft = draft["graphs_verify_ms"][c]["1"] / target["graphs_verify_ms"][c]["1"]
        row = {"draft_step_over_target_step": c_draft}
        for a in rates:
            best = None
            for k in ks:
                if k < 2:
                    continue
                gamma = k - 1
                tokens = (1 - a ** (gamma + 1)) / (1 - a) if a < 1 else gamma + 1
                speedup = tokens / (gamma * c_draft + steps[str(k)])
                if best is None or speedup > best[1]:
                    best = (gamma, speedup)
            if best:
                row[f"a={a}"] = {"gamma": best[0], "speedup": round(best[1], 2)}
        out[c] = row
    return out


def _fmt(x: Any, digits: int = 2) -> str:
    return f"{x:.{digits}f}" if isinstance(x, (int, float)) else "-" if x is None else "error"


def report(results: dict) -> str:
    lines = [f"device: {results['device']} · torch {results['torch']} · {results['dtype']} · "
             f"copy bandwidth {results['bandwidth_GBps']:.0f} GB/s (read + written)"]
    for r in results["shapes"]:
        lines.append(f"\n{r['shape']} ({r.get('params_M')}M parameters, {r.get('weight_MB')} MB read per step)")
        for c in results["contexts"]:
            c = str(c)

            def get(key, c=c):
                v = r.get(key)
                return v.get(c) if isinstance(v, dict) and "error" not in v else v if v is None else None

            floor = (r.get("floor_ms") or {}).get(c)
            g = get("graphs_decode_ms")
            comp = (r.get("compiled") or {}).get("decode_ms", {}).get(c)
            lines.append(f"  context {c}: decode ms/token transformers {_fmt(get('transformers_decode_ms'))}, "
                         f"lean {_fmt(get('lean_decode_ms'))}, graphs {_fmt(g)}"
                         + (f", graphs + compiled {_fmt(comp, 3)}" if comp else "")
                         + f", graphs padded to {MAX_ROWS} rows {_fmt(get('padded_decode_ms'))} "
                         f"(whole cache {_fmt(get('padded_whole_decode_ms'))}); floor {_fmt(floor, 3)}"
                         + (f" (over the floor: lean {get('lean_decode_ms') / floor:.2f}x, graphs {g / floor:.2f}x)"
                            if g and floor and get("lean_decode_ms") else ""))
            for label in ("lean", "graphs"):
                v = get(f"{label}_verify_steps")
                if v:
                    lines.append(f"    verify in steps, {label}: " + ", ".join(f"{a}: {x:.2f}" for a, x in v.items()))
        diff = r.get("graph_vs_eager_max_diff")
        lines.append(f"  prefill of {max(results['contexts'])}: transformers {_fmt(r.get('transformers_prefill_ms'), 1)} ms, "
                     f"lean {_fmt(r.get('lean_prefill_ms'), 1)} ms; graphed vs eager logits: max |diff| "
                     + (f"{diff:.3g}" if isinstance(diff, float) else "error"))
        for key in ("exactness", "exactness_eager", "exactness_padded", "exactness_padded_whole", "exactness_fp32_head"):
            e = r.get(key) or {}
            if "error" in e or not e:
                lines.append(f"  {key}: {e.get('error', '-')}")
                continue
            ks = [k for k in e if k.startswith("k")]
            lines.append(f"  {key}: verifies with a differing argmax " + ", ".join(
                f"{k} {e[k]['verifies_differing']}/{e[k]['verifies']}" for k in ks)
                + f"; max |logit diff| {e['max_abs_logit_diff']:.3g}; steps with a top-2 margin under it "
                f"{e['steps_with_margin_below_it']:.1%} (median margin {e['median_top2_margin']:.3f})")
    for c, row in (results.get("projection") or {}).items():
        if isinstance(row, dict) and "error" not in row:
            lines.append(f"\nprojection {results['pair']} at context {c}: draft step = "
                         f"{row['draft_step_over_target_step']:.2f} target steps; " + ", ".join(
                             f"{a}: {v['speedup']}x (gamma {v['gamma']})" for a, v in row.items() if a.startswith("a=")))
    return "\n".join(lines)


def run_bench_gpu(args: argparse.Namespace) -> int:
    import torch

    from engine.model import pick_device

    device = pick_device(args.device)
    dtype = getattr(torch, args.dtype)
    if args.shapes is None and device.type != "cuda":
        print(f"bench gpu: no GPU here ({device}); the default shapes would take hours on a CPU "
              "(name --shapes to run anyway: tiny checks the code)", file=sys.stderr)
        return 2
    shapes = [s for s in (args.shapes or DEFAULT_SHAPES).split(",") if s]
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        print(f"bench gpu: unknown shapes {unknown}; known: {', '.join(SHAPES)}", file=sys.stderr)
        return 2
    ks, contexts = sorted(set(_ints(args.ks)) | {1}), _ints(args.contexts)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    results: dict[str, Any] = {"device": name, "torch": torch.__version__, "dtype": args.dtype,
                               "contexts": contexts, "ks": ks, "pair": args.pair, "shapes": []}
    results["bandwidth_GBps"] = copy_bandwidth(device, args.copy_mib) / 1e9
    for s in shapes:
        print(f"bench gpu: {s} ...", file=sys.stderr, flush=True)
        try:
            results["shapes"].append(measure_shape(s, args, device, dtype, ks, contexts, results["bandwidth_GBps"] * 1e9))
        except Exception as exc:
            traceback.print_exc(file=sys.stderr)
            results["shapes"].append({"shape": s, "error": f"{type(exc).__name__}: {exc}"})
            gc.collect()
        _save(args.json, results)  # after every shape: a run cut short keeps what it measured
    by = {r["shape"]: r for r in results["shapes"]}
    draft, _, target = args.pair.partition(":")
    if draft in by and target in by:  # before the compile, the least certain step in time
        _attempt(results, "projection", lambda: project(by[draft], by[target], ks, [float(a) for a in args.acceptance.split(",")]))
        _save(args.json, results)
    print(report(results), flush=True)  # the table without the compiled rows, in case the compile runs out of time
    for s in [s for s in args.compile.split(",") if s in by]:
        print(f"bench gpu: {s} compiled ...", file=sys.stderr, flush=True)
        _attempt(by[s], "compiled", lambda: measure_compiled(s, args, device, dtype, contexts))
        _save(args.json, results)
    if any("compiled" in by[s] for s in by):
        print("\nwith the compiled forward:\n" + report(results))
    return 0


def _save(path: str | None, results: dict[str, Any]) -> None:
    """The JSON so far, replaced whole (a timeout's SIGTERM mid-write leaves the previous one)."""
    if not path:
        return
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(results, f, indent=1)
    os.replace(tmp, path)


if __name__ == "__main__":  # the device machine has torch and transformers but not draftline's other dependencies
    parser = argparse.ArgumentParser(prog="python -m engine.bench.gpu")
    add_arguments(parser)
    sys.exit(run_bench_gpu(parser.parse_args()))
