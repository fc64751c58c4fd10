"""``draftline complete FILE:LINE:COL``: one completion from the command line, through the server's pipeline."""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from engine.types import CompletionStats
from lsp_server.completer import Completer, Completion, Retriever, build_request, context_for
from lsp_server.config import WORKSPACE_FILE, Config, resolve_config
from lsp_server.documents import Snapshot, display_path, language_id, lsp_lines
from lsp_server.engines import make_engine
from lsp_server.index_handle import open_index

log = logging.getLogger(__name__)


def describe(completion: Completion) -> dict[str, Any]:
    """The JSON shape of ``draftline complete --json``."""
    stats = completion.result.stats if completion.result else CompletionStats()
    return {
        "text": completion.text,
        "source": completion.source,
        "mode": completion.request.mode,
        "chunks": [{"path": c.path, "start_line": c.start_line, "end_line": c.end_line} for c in completion.chunks],
        "timings_ms": {k: round(v, 3) for k, v in completion.timings_ms.items()},
        "stats": {
            "prompt_tokens": stats.prompt_tokens,
            "reused_tokens": stats.reused_tokens,
            "proposed": sum(stats.proposed),
            "accepted": sum(stats.accepted),
            "generated_tokens": stats.generated_tokens,
            "acceptance": round(stats.acceptance, 4),
        },
        "stop_reason": completion.result.stop_reason if completion.result else "",
    }


def parse_location(location: str) -> tuple[Path, int, int]:
    """``FILE:LINE:COL`` (1-based) to (path, 0-based line, 0-based column)."""
    path, line, col = location.rsplit(":", 2)
    return Path(path), max(int(line) - 1, 0), max(int(col) - 1, 0)


class ModelLoadError(RuntimeError):
    """The configured model could not be loaded (the message says which and why)."""


def complete_file(path: Path, line: int, col: int, config: Config, retriever: Retriever | None = None,
                  workspace: Path | None = None) -> Completion:
    """One completion at a 0-based position of a file on disk (the CLI path, no LSP).

    ``workspace``: the workspace folder (paths and the repository name are shown relative to it);
    without it, the retriever's roots."""
    text = path.read_bytes().decode("utf-8", errors="replace")  # line ends as they are (read_text makes CRLF LF)
    lines = lsp_lines(text)  # lines as an editor counts them (a form feed ends none)
    offset = sum(len(s) for s in lines[:line]) + min(col, len(lines[line].rstrip("\r\n")) if line < len(lines) else 0)
    roots = [workspace.resolve()] if workspace is not None else [Path(r) for r in getattr(retriever, "roots", ())]
    snap = Snapshot(uri=path.resolve().as_uri(), version=0, language=language_id(path),
                    path=display_path(str(path.resolve()), roots), before=text[:offset], after=text[offset:])
    started = time.perf_counter()
    try:
        engine = make_engine(config.model)
    except (ValueError, OSError, RuntimeError) as exc:  # a file that is not a model, not there, refused
        raise ModelLoadError(f"cannot load the model {config.model.target or '(the default)'}: {exc}") from exc
    loaded_ms = (time.perf_counter() - started) * 1e3
    completer = Completer(engine, config.completion, retriever, roots)
    request = build_request(snap, config.completion, roots)
    done = completer.complete(request, threading.Event(), context_for(snap, request, config.completion))
    done.timings_ms["load_model"] = loaded_ms  # not part of "total": the server loads once
    done.prompt = engine.last_prompt_text() if hasattr(engine, "last_prompt_text") else ""
    return done


def run_complete(args: Any) -> int:
    """``draftline complete FILE:LINE:COL``: print the suggestion and its stats."""
    try:
        path, line, col = parse_location(args.location)
    except ValueError:
        print(f"draftline complete: {args.location!r} is not FILE:LINE:COL (1-based numbers)", file=sys.stderr)
        return 2
    if not path.is_file():
        print(f"draftline complete: {path}: no such file", file=sys.stderr)
        return 2
    workspace = args.workspace or find_workspace(path)
    cli: dict[str, Any] = {"model": {k: v for k, v in (("target", args.target), ("draft", args.draft)) if v}}
    if args.mode:
        cli["completion"] = {"mode": args.mode}
    roots = [workspace] if workspace is not None else []
    config = resolve_config(user_file=args.config, workspace_roots=roots, client_settings=cli)
    remote = config.model.remote if isinstance(config.model.remote, Mapping) else {}
    # a remote server answers without the default local model, unless it falls back to that model
    local_needed = not remote.get("url") or remote.get("fallback") == "local"
    if not config.model.target and local_needed and (missing := _default_missing()):
        print(f"draftline complete: {missing}", file=sys.stderr)
        return 2
    index = open_index([workspace.resolve()], config.index) if workspace is not None else None
    if index is not None:
        index.build()
    try:
        completion = complete_file(path, line, col, config, index, workspace)
    except ModelLoadError as exc:
        log.debug("model load failed", exc_info=True)
        print(f"draftline complete: {exc}", file=sys.stderr)
        return 2
    finally:
        if index is not None and hasattr(index, "close"):
            index.close()
    if args.prompt:  # what leaves the user's files, as the model sees it
        print(completion.prompt or "(this engine builds no token prompt)")
        print("-" * 40)
    if args.json:
        print(json.dumps(describe(completion), indent=2))
    else:
        print(completion.text)
        info = describe(completion)
        summary = {key: info[key] for key in ("timings_ms", "stats", "chunks")}
        print(json.dumps(summary), file=sys.stderr)
    return 0


def _default_missing() -> str:
    """Why the default model cannot run ("" when it can)."""
    from engine.bundled import resolve

    try:
        resolve("")
    except ValueError as exc:
        return str(exc)
    return ""


def find_workspace(path: Path) -> Path | None:
    """The nearest ancestor holding .git or .draftline.toml; None (no retrieval) when there is none."""
    for parent in path.resolve().parents:
        if (parent / ".git").exists() or (parent / WORKSPACE_FILE).is_file():
            return parent
    return None
