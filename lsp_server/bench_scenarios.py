"""`draftline bench scenarios`: single-line, function and refactor tasks from held-out code, per mode."""

from __future__ import annotations

import argparse
import ast
import json
import logging
import random
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from engine.types import CompletionRequest, Limits, SpecConfig

log = logging.getLogger(__name__)

MODES = {  # name -> how it drafts and how it picks gamma
    "plain": SpecConfig(drafter="none"),
    "fixed-g5": SpecConfig(drafter="draft", schedule="fixed", gamma=5),
    "adaptive": SpecConfig(drafter="draft", schedule="adaptive"),
    "ast-adaptive": SpecConfig(drafter="draft", schedule="ast"),
    "ngram": SpecConfig(drafter="ngram", schedule="adaptive"),
    "hybrid": SpecConfig(drafter="hybrid", schedule="adaptive"),
    "ngram-grow": SpecConfig(drafter="ngram", schedule="grow"),  # long strides while a copy holds
}
SCENARIOS = ("single-line", "function", "refactor")
MAX_POSITIONS = 8


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", help="target model directory (default: the bundled target)")
    p.add_argument("--draft", help="draft model directory (default: the bundled draft)")
    p.add_argument("--n", type=int, default=6, help="tasks per scenario")
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--dtype", default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    p.add_argument("--plot", metavar="DIR", help="write PNG plots and table.md here")


@dataclass(frozen=True)
class Task:
    scenario: str
    path: str
    request: CompletionRequest


def _held_out_files() -> list[tuple[str, str]]:
    from engine.corpus import collect

    corpus = collect(libs=("pygls", "watchdog"), max_chars=0)
    return [(f.path, f.text) for f in corpus.held_out]


def make_tasks(n: int, seed: int, scenarios: tuple[str, ...], count_tokens=None, room: int = 2048) -> list[Task]:
    """Tasks cut from the held-out split (packages the bundled pair never trained on).

    With `count_tokens` (the model's tokenizer), a refactor task is a class the model can both read
    and re-emit: between min(800, room // 2) and room - 64 tokens, `room` being half its context.
    """
    rng = random.Random(seed)
    files = _held_out_files()
    rng.shuffle(files)
    tasks: list[Task] = []
    for scenario in scenarios:
        made = 0
        for path, text in files:
            task = _cut(scenario, path, text, rng, count_tokens, room)
            if task is not None:
                tasks.append(task)
                made += 1
            if made == n:
                break
    return tasks


def _cut(scenario: str, path: str, text: str, rng: random.Random, count_tokens=None, room: int = 2048) -> Task | None:
    lines = text.splitlines(keepends=True)
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    funcs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    if scenario == "single-line":
        candidates = [i for i, ln in enumerate(lines) if ln.startswith("        ") and 20 <= len(ln.strip()) <= 90
                      and not ln.strip().startswith(("#", '"', "'"))]
        if not candidates:
            return None
        i = rng.choice(candidates)
        indent = len(lines[i]) - len(lines[i].lstrip())
        cut = offsets[i] + indent + rng.randint(0, max(0, (len(lines[i].strip()) // 3)))
        req = CompletionRequest(prefix=text[:cut], suffix=text[cut:], path=path, uri=f"bench:{path}:{i}",
                                mode="single-line", limits=Limits(max_tokens=48, max_lines=1))
        return Task(scenario, path, req)
    if scenario == "function":
        for f in rng.sample(funcs, len(funcs)):
            body = f.body
            if not body or not isinstance(body[0], ast.Expr) or not isinstance(getattr(body[0], "value", None), ast.Constant):
                continue  # needs a docstring
            if len(body) < 2 or f.end_lineno - body[0].end_lineno < 8 or f.end_lineno - body[0].end_lineno > 60:
                continue
            cut = offsets[body[0].end_lineno]  # right after the docstring
            indent = len(lines[body[1].lineno - 1]) - len(lines[body[1].lineno - 1].lstrip())
            req = CompletionRequest(prefix=text[:cut], suffix=text[offsets[f.end_lineno]:], path=path,
                                    uri=f"bench:{path}:{f.lineno}", mode="multi-line",
                                    limits=Limits(max_tokens=400, min_indent=indent))
            return Task(scenario, path, req)
        return None
    # refactor: re-emit a class after a rename; long and copy-heavy
    classes = [c for c in tree.body if isinstance(c, ast.ClassDef) and 40 <= c.end_lineno - c.lineno <= 220]
    if count_tokens is not None:
        low = min(800, room // 2)
        classes = [c for c in classes if low <= count_tokens("".join(lines[c.lineno - 1 : c.end_lineno])) <= room - 64]
    if not classes:
        return None
    c = rng.choice(classes)
    source = "".join(lines[c.lineno - 1 : c.end_lineno])
    renamed = source.replace(c.name, c.name + "V2")
    first = renamed.split("\n", 1)[0] + "\n"
    prefix = (text[: offsets[c.end_lineno]] + f"\n\n# {c.name}V2: the same class as {c.name}, renamed.\n" + first)
    req = CompletionRequest(prefix=prefix, suffix="", path=path, uri=f"bench:{path}:{c.name}", mode="multi-line",
                            limits=Limits(max_tokens=2000, min_indent=1))
    return Task(scenario, path, req)


def degenerate(text: str) -> bool:
    """The same non-blank line three times in a row: small models loop, and n-gram drafting then
    looks miraculous; that is not a speedup a user gets."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return any(lines[i] == lines[i + 1] == lines[i + 2] for i in range(len(lines) - 2))


@dataclass
class Cell:
    """One scenario x mode: what the non-degenerate tasks cost."""

    seconds: list[float] = field(default_factory=list)
    prefill: list[float] = field(default_factory=list)  # seconds of each task's (cold) prefill
    tokens: int = 0
    proposed: int = 0
    accepted: int = 0
    steps: int = 0
    by_position: list[list[int]] = field(default_factory=lambda: [[0, 0] for _ in range(MAX_POSITIONS)])
    identical: bool = True


def run_bench_scenarios(args: argparse.Namespace) -> int:
    from engine.bundled import bundled_pair
    from engine.engine import load_engine

    target, draft = args.target, args.draft
    if target is None:
        target, draft = bundled_pair() or (None, None)
    if target is None or draft is None:
        print("bench scenarios needs a target and a draft (--target/--draft, or the bundled pair)", file=sys.stderr)
        return 2
    modes = [m for m in args.modes.split(",") if m]
    if "plain" not in modes:
        modes.insert(0, "plain")
    engine = load_engine(target, draft, dtype=args.dtype)
    tok = engine.target.tokenizer
    tasks = make_tasks(args.n, args.seed, tuple(s for s in args.scenarios.split(",") if s),
                       count_tokens=lambda text: len(tok.encode(text, add_special_tokens=False)), room=engine.capacity // 2)
    cells = {(s, m): Cell() for s in SCENARIOS for m in modes}
    degenerate_count = {s: 0 for s in SCENARIOS}
    task_count = {s: 0 for s in SCENARIOS}
    for i, task in enumerate(tasks):
        order = modes[i % len(modes):] + modes[: i % len(modes)]  # interleave against drift
        runs = {}
        for mode in order:
            engine.target_lm.reset()
            engine.draft_lm.reset()
            started = time.perf_counter()
            res = engine.complete(task.request, threading.Event(), MODES[mode])
            runs[mode] = (res, time.perf_counter() - started)
        task_count[task.scenario] += 1
        plain = runs["plain"][0]
        if plain.stop_reason == "repeat" or degenerate(plain.text):  # the engine cut a loop, or one got through
            degenerate_count[task.scenario] += 1
            continue  # shown separately, kept out of the headline numbers
        for mode, (res, elapsed) in runs.items():
            cell = cells[(task.scenario, mode)]
            cell.seconds.append(elapsed)
            cell.prefill.append(res.stats.prefill_s)
            cell.tokens += len(res.tokens)
            cell.identical &= res.tokens == plain.tokens
            cell.proposed += sum(res.stats.proposed)
            cell.accepted += sum(res.stats.accepted)
            cell.steps += len(res.stats.proposed)
            for k, a in zip(res.stats.proposed, res.stats.accepted):
                for pos in range(min(k, MAX_POSITIONS)):
                    cell.by_position[pos][1] += 1
                    cell.by_position[pos][0] += pos < a
        log.info("task %d/%d (%s) done", i + 1, len(tasks), task.scenario)
    report = _report(cells, modes, task_count, degenerate_count, engine, target, draft)
    if args.plot:
        _plots(report, Path(args.plot))
    print(json.dumps(report, indent=2) if args.json else markdown_table(report))
    return 0


def _pct(data: list[float], q: float) -> float:
    data = sorted(data)
    return 1000 * data[min(len(data) - 1, int(q * len(data)))] if data else 0.0


def _report(cells, modes, task_count, degenerate_count, engine, target, draft) -> dict:
    scenarios = {}
    for s in SCENARIOS:
        if not task_count[s]:
            continue
        plain_s = sum(cells[(s, "plain")].seconds)
        plain_decode = plain_s - sum(cells[(s, "plain")].prefill)
        out = {}
        for m in modes:
            c = cells[(s, m)]
            total = sum(c.seconds)
            out[m] = {
                "tasks": len(c.seconds),
                "p50_ms": 1000 * statistics.median(c.seconds) if c.seconds else 0.0,
                "p99_ms": _pct(c.seconds, 0.99),
                "tokens_per_s": c.tokens / total if total else 0.0,
                "acceptance": c.accepted / c.proposed if c.proposed else None,
                "accepted_per_step": (c.accepted + c.steps) / c.steps if c.steps else None,
                "speedup": plain_s / total if total else 0.0,
                # the same prefill runs in every mode; this is the part speculation changes
                "decode_speedup": plain_decode / (total - sum(c.prefill)) if total > sum(c.prefill) else 0.0,
                "prefill_ms": 1000 * statistics.mean(c.prefill) if c.prefill else 0.0,
                "tokens_mean": c.tokens / len(c.seconds) if c.seconds else 0.0,
                "identical": c.identical,
                "acceptance_by_position": [a / n if n else None for a, n in c.by_position],
            }
        scenarios[s] = {"tasks": task_count[s], "degenerate": degenerate_count[s], "modes": out}
    return {"device": str(engine.target.device), "target": target, "draft": draft, "scenarios": scenarios}


def markdown_table(report: dict) -> str:
    rows = ["| task | tokens | plain | speculative (fixed-g5) | best mode | best | speedup | decode speedup | acceptance "
            "| identical | degenerate |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s, data in report["scenarios"].items():
        modes = data["modes"]
        best = max((m for m in modes if m != "plain"), key=lambda m: modes[m]["speedup"], default="plain")
        b = modes[best]
        acc = "-" if b["acceptance"] is None else f"{100 * b['acceptance']:.1f} %"
        fixed = modes.get("fixed-g5", {}).get("p50_ms", 0.0)
        rows.append(f"| {s} | {modes['plain']['tokens_mean']:.0f} | {modes['plain']['p50_ms']:.0f} ms | {fixed:.0f} ms | "
                    f"{best} | {b['p50_ms']:.0f} ms | {b['speedup']:.2f}x | {b['decode_speedup']:.2f}x | {acc} | "
                    f"{all(m['identical'] for m in modes.values())} | {data['degenerate']}/{data['tasks']} |")
    return "\n".join(rows) + ("\n\n(tokens: mean generated by plain greedy under the server's stop rules; latencies are p50 "
                              "over non-degenerate tasks with a cold prefill in every mode; speedup = total plain time / "
                              "total mode time; decode speedup leaves out the prefill, which is the same in every mode)")


def _plots(report: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    scen = list(report["scenarios"])
    fig, axes = plt.subplots(1, len(scen), figsize=(5 * len(scen), 4), squeeze=False)
    for ax, s in zip(axes[0], scen):
        for m, d in report["scenarios"][s]["modes"].items():
            ys = d["acceptance_by_position"]
            if any(y is not None for y in ys):
                ax.plot(range(1, len(ys) + 1), [float("nan") if y is None else y for y in ys], marker="o", label=m)
        ax.set(title=s, xlabel="draft position", ylabel="acceptance", ylim=(0, 1))
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "acceptance_by_position.png", dpi=110)
    fig, ax = plt.subplots(figsize=(8, 4))
    modes = [m for m in next(iter(report["scenarios"].values()))["modes"]] if scen else []
    width = 0.8 / max(1, len(modes))
    for j, m in enumerate(modes):
        ax.bar([i + j * width for i in range(len(scen))], [report["scenarios"][s]["modes"][m]["speedup"] for s in scen],
               width, label=m)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(scen))], scen)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set(ylabel="speedup vs plain greedy")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "speedup.png", dpi=110)
    (out / "table.md").write_text(markdown_table(report) + "\n")
