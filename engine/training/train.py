"""Training of the bundled pair: byte-level BPE tokenizer, target, and a draft distilled from it."""

from __future__ import annotations

import json
import logging
import math
import os
import platform
import shutil
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable

from engine.bundled import MODELS_DIR

log = logging.getLogger(__name__)

SPECIAL_TOKENS = [
    "<|endoftext|>", "<|draftline|>", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>",
    "<|file_sep|>", "<|pad|>",
]
# runs of spaces as single tokens keep indentation cheap (4, 8, ... spaces are common in code)
WHITESPACE_TOKENS = [" " * n for n in (2, 3, 4, 8, 12, 16)] + ["\n" + " " * n for n in (4, 8, 12)] + ["\t", "\t\t"]


def train_tokenizer(texts: Iterable[str], vocab_size: int, out_dir: str | Path):
    """Train a byte-level BPE on `texts` and save it as a standard Hugging Face tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_tokens(WHITESPACE_TOKENS)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|pad|>", bos_token=None,
        additional_special_tokens=SPECIAL_TOKENS[1:-1],
    )
    fast.save_pretrained(str(out_dir))
    return fast


@dataclass(frozen=True)
class ModelSize:
    hidden: int
    layers: int
    heads: int
    ffn: int


# named pair sizes for a fresh run (`--size`); a resumed run keeps the sizes of the models it loads.
# 5m is the shipped pair, sized for 2 CPU cores (target step ~1.5 ms); 20m and 90m are targets for a
# GPU run (the CPU budget is ~10 ms a token: measure before shipping one); tiny is for smoke tests.
SIZE_PRESETS = {
    "5m": {"target": ModelSize(256, 4, 4, 688), "draft": ModelSize(128, 2, 2, 384)},
    "20m": {"target": ModelSize(512, 6, 8, 1376), "draft": ModelSize(128, 2, 2, 384)},
    "90m": {"target": ModelSize(768, 12, 12, 2048), "draft": ModelSize(256, 2, 4, 688)},
    "tiny": {"target": ModelSize(64, 2, 2, 128), "draft": ModelSize(32, 1, 1, 64)},
}


@dataclass(frozen=True)
class TrainConfig:
    out: str = str(MODELS_DIR)
    state: str = ""  # optimizer etc., not shipped ("": a folder under ~/.cache/draftline kept per --out)
    minutes: float = 60.0
    vocab: int = 8192
    seq: int = 1024  # the bundled pair's context: samples are packed whole into rows this long
    batch: int = 8
    lr: float = 2e-3
    draft_lr: float = 3e-3
    warmup: int = 50
    distill: float = 0.5  # draft loss = (1 - distill) * CE + distill * KL(target || draft)
    eval_every_s: float = 300.0
    checkpoint_every_s: float = 900.0
    seed: int = 0
    threads: int = 0  # 0 = torch default
    resume: bool = False
    models: tuple[str, ...] = ("target", "draft")  # which of the pair this run trains (the other is kept as is)
    size: str | None = None  # a SIZE_PRESETS name (None: 5m for a fresh run; a resumed run keeps its sizes)
    device: str = "auto"  # auto = cuda when available, else cpu
    max_chars: int = 60_000_000  # training text gathered (see engine.training.corpus.collect)
    fim_rate: float = 0.5  # share of samples that are fill-in-the-middle (engine.training.corpus.FIM_RATE)


def _llama_config(size: ModelSize, tok, seq: int):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=len(tok), hidden_size=size.hidden, num_hidden_layers=size.layers,
                       num_attention_heads=size.heads, num_key_value_heads=size.heads, intermediate_size=size.ffn,
                       max_position_embeddings=seq, tie_word_embeddings=True, rope_theta=10000.0,
                       bos_token_id=None, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)


ENCODE_CHUNK = 512  # texts per encode_batch: its Encodings (offsets, token strings: ~80 bytes a token) are dropped between chunks


def _encodings(tok, texts: list[str]):
    """The texts' token ids, encoded a chunk at a time: one encode_batch over a whole corpus holds an
    Encoding of every token at once (gigabytes for the default 60M characters)."""
    for i in range(0, len(texts), ENCODE_CHUNK):
        for enc in tok.backend_tokenizer.encode_batch(texts[i : i + ENCODE_CHUNK], add_special_tokens=False):
            yield enc.ids


def _encode_stream(tok, texts: list[str]):
    import numpy as np

    return np.concatenate([np.asarray(ids, dtype=np.uint16) for ids in _encodings(tok, texts)])


def _pack_rows(tok, texts: list[str], seq: int):
    """Whole samples packed into rows of seq + 1 tokens, padded (pad positions are not trained on).

    Samples longer than a row are cut at its end (plain pieces lose a tail; a FIM sample that does
    not fit is dropped, since without its middle and end token it teaches the wrong thing).
    """
    import numpy as np

    width, pad = seq + 1, tok.pad_token_id
    mid = tok.convert_tokens_to_ids("<|fim_middle|>")
    rows: list[np.ndarray] = []
    row: list[int] = []
    for ids in _encodings(tok, texts):
        if len(ids) > width:
            if mid in ids:
                continue
            ids = ids[:width]
        if len(row) + len(ids) > width:
            rows.append(np.asarray(row + [pad] * (width - len(row)), dtype=np.uint16))
            row = []
        row += ids
    if row:
        rows.append(np.asarray(row + [pad] * (width - len(row)), dtype=np.uint16))
    if not rows:
        raise ValueError("no training rows: every sample was a fill-in-the-middle one longer than --seq")
    return np.stack(rows)


def default_state_dir(out: Path) -> Path:
    """Where a run keeps its optimizer state: one folder per output folder, so two runs never share one."""
    import hashlib

    key = hashlib.sha1(str(out.resolve()).encode()).hexdigest()[:12]
    from engine.gguf import cache_root

    return cache_root() / "train-state" / key


def _row_batch(rows, cfg: TrainConfig, rng, pad: int, device=None):
    import torch

    pick = rng.integers(0, len(rows), size=cfg.batch)
    t = torch.from_numpy(rows[pick].astype("int64"))
    x, y = t[:, :-1], t[:, 1:].clone()
    y[y == pad] = -100  # no loss on padding
    return (x, y) if device is None else (x.to(device), y.to(device))


def _batch(stream, cfg: TrainConfig, rng, device=None):
    import numpy as np
    import torch

    starts = rng.integers(0, len(stream) - cfg.seq - 1, size=cfg.batch)
    block = np.stack([stream[s : s + cfg.seq + 1] for s in starts]).astype(np.int64)
    t = torch.from_numpy(block).to(device or "cpu")
    return t[:, :-1], t[:, 1:]


def evaluate(target, draft, stream, cfg: TrainConfig, n: int = 16) -> dict:
    """Held-out loss (nats/token) of both models and draft-vs-target greedy top-1 agreement."""
    import numpy as np
    import torch

    rng = np.random.default_rng(1234)  # the same held-out windows every time
    cfg = replace(cfg, seq=512, batch=16)  # the same window shape in every run, so losses compare
    losses, agree, count = {"target": 0.0, "draft": 0.0}, 0, 0
    device = next(target.parameters()).device
    with torch.inference_mode(), torch.autocast(device.type, dtype=torch.bfloat16):
        for _ in range(max(1, n // cfg.batch)):
            x, y = _batch(stream, cfg, rng, device)
            lt, ld = target(input_ids=x).logits.float(), draft(input_ids=x).logits.float()
            losses["target"] += float(torch.nn.functional.cross_entropy(lt.flatten(0, 1), y.flatten()))
            losses["draft"] += float(torch.nn.functional.cross_entropy(ld.flatten(0, 1), y.flatten()))
            agree += int((lt.argmax(-1) == ld.argmax(-1)).sum())
            count += y.numel()
    k = max(1, n // cfg.batch)
    return {"target_loss": losses["target"] / k, "draft_loss": losses["draft"] / k, "top1_agreement": agree / count}


MIN_SEQ = 32


def check_config(cfg: TrainConfig) -> None:
    """Refuse a setting that cannot train, naming its option (a ValueError, before any work)."""
    bad = []
    if cfg.size is not None and cfg.size not in SIZE_PRESETS:
        bad.append(f"unknown size {cfg.size!r}: one of {', '.join(SIZE_PRESETS)}")
    if not cfg.minutes > 0:  # also NaN
        bad.append(f"--minutes must be above 0 (got {cfg.minutes})")
    if cfg.seq < MIN_SEQ:
        bad.append(f"--seq must be at least {MIN_SEQ} tokens (got {cfg.seq})")
    if cfg.batch < 1:
        bad.append(f"--batch must be at least 1 (got {cfg.batch})")
    for name, lr in (("--lr", cfg.lr), ("--draft-lr", cfg.draft_lr)):
        if not (0 < lr < math.inf):
            bad.append(f"{name} must be above 0 (got {lr})")
    if not 0 <= cfg.fim_rate <= 1:
        bad.append(f"--fim-rate is a share, from 0 to 1 (got {cfg.fim_rate})")
    if cfg.max_chars < 1:
        bad.append(f"--max-chars must be at least 1 (got {cfg.max_chars})")
    if cfg.threads < 0:
        bad.append(f"--threads must be 0 (torch's default) or more (got {cfg.threads})")
    if cfg.warmup < 1:
        bad.append(f"warmup must be at least 1 step (got {cfg.warmup})")
    if not cfg.models or set(cfg.models) - {"target", "draft"}:
        bad.append(f"--models must name target and/or draft (got {','.join(cfg.models)})")
    if bad:
        raise ValueError("; ".join(bad))


def _check_out(out: Path, cfg: TrainConfig) -> None:
    """Refuse an --out that cannot hold this run: a file, a resume without a whole checkpoint, or a
    fresh run over another run's models (which it would overwrite)."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file, not a folder")
    if cfg.resume:
        if not (out / "target" / "config.json").exists():
            # a fresh start under --resume would train random models (and, with --models draft, a draft
            # against an untrained target) and could load another run's optimizer state into them
            raise ValueError(f"--resume: no checkpoint in {out} (no target/config.json); drop --resume to start afresh")
        if not (out / "draft" / "config.json").exists():
            raise ValueError(f"--resume: the checkpoint in {out} has no draft (no draft/config.json)")
        return
    held = [n for n in ("target", "draft", "summary.json") if (out / n).exists()]
    if held:
        raise ValueError(f"--out {out} already holds a run ({', '.join(held)}), which a fresh run would overwrite: "
                         "--resume to continue it, or choose another --out (or remove it to start afresh)")
    if "target" not in cfg.models:
        raise ValueError("--models draft distils the draft from a trained target: --resume from a folder holding one")


def _read_summary(out: Path) -> dict:
    path = out / "summary.json"
    if not path.exists():
        log.warning("no summary.json in %s: starting a new run history", out)
        return {"runs": [], "steps": 0, "tokens_seen": 0}
    try:
        summary = json.loads(path.read_text())
        int(summary["steps"]), list(summary["runs"])
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"--resume: {path} is not a run summary ({e}); move it aside to start a new run history") from e
    return summary


def train(cfg: TrainConfig) -> dict:
    """Train (or resume) the tokenizer, target and distilled draft; checkpoint into cfg.out.

    Ctrl-C stops the run where it is and saves a checkpoint (the result has "interrupted")."""
    import numpy as np
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    from engine.model import pick_device
    from engine.training.corpus import collect, repo_samples, window_samples

    check_config(cfg)
    out = Path(cfg.out)
    _check_out(out, cfg)
    try:
        device = pick_device(cfg.device)
    except RuntimeError as e:
        raise ValueError(f"--device {cfg.device!r}: {e}") from e
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {cfg.device!r}: no CUDA device here")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    state_dir = Path(cfg.state) if cfg.state else default_state_dir(out)
    for what, folder in (("--out", out), ("the optimizer state folder", state_dir)):
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ValueError(f"{what} {folder}: cannot create it ({e.strerror or e})") from e
        if not os.access(folder, os.W_OK):
            raise ValueError(f"{what} {folder}: not writable")
    t_start = time.perf_counter()
    # the per-package cap grows with the budget, so a larger corpus (for a GPU run) is not all one library
    corpus = collect(max_chars=cfg.max_chars, per_package_chars=max(8_000_000, cfg.max_chars * 2 // 15))
    log.info("corpus: %d train files, %d held-out files", len(corpus.train), len(corpus.held_out))
    if not corpus.train:
        raise ValueError(f"no training text gathered (--max-chars {cfg.max_chars}: files under 200 characters are "
                         "skipped); raise --max-chars")
    if not corpus.held_out:
        raise ValueError("no held-out text found (the standard library's json, email, asyncio, logging)")
    tdir, ddir = out / "target", out / "draft"
    if cfg.resume:
        tok = AutoTokenizer.from_pretrained(tdir)
        target = LlamaForCausalLM.from_pretrained(tdir, dtype=torch.float32)
        draft = LlamaForCausalLM.from_pretrained(ddir, dtype=torch.float32)
        summary = _read_summary(out)
        if cfg.size is not None and any(_model_size(m) != SIZE_PRESETS[cfg.size][name]
                                        for m, name in ((target, "target"), (draft, "draft"))):
            raise ValueError(f"--size {cfg.size} does not match the models in {out}: a resumed run keeps their sizes")
    else:
        sample = [f.text for f in corpus.train[:: max(1, len(corpus.train) // 1500)]]
        tok = train_tokenizer(sample, cfg.vocab, state_dir / "tokenizer")
        sizes = SIZE_PRESETS[cfg.size or "5m"]
        target = LlamaForCausalLM(_llama_config(sizes["target"], tok, cfg.seq))
        draft = LlamaForCausalLM(_llama_config(sizes["draft"], tok, cfg.seq))
        summary = {"runs": [], "steps": 0, "tokens_seen": 0}
    target, draft = target.to(device), draft.to(device)
    # sample sizes follow the row length, so a longer context is trained on longer files and peers
    scale = cfg.seq / 1024
    samples = window_samples(corpus.train, cfg.seed + summary["steps"], min_chars=min(800, int(1500 * scale)),
                             max_chars=int(3000 * scale), context_chars=int(600 * scale), fim_rate=cfg.fim_rate)
    rows = _pack_rows(tok, samples, cfg.seq)
    held_stream = _encode_stream(tok, repo_samples(corpus.held_out, 99))
    log.info("rows: %d x %d train, %d held-out tokens; params target %.2fM draft %.2fM", len(rows), cfg.seq + 1, len(held_stream),
             target.num_parameters() / 1e6, draft.num_parameters() / 1e6)
    opt_t = torch.optim.AdamW(target.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.1)
    opt_d = torch.optim.AdamW(draft.parameters(), lr=cfg.draft_lr, betas=(0.9, 0.95), weight_decay=0.1)
    state_file = state_dir / "optim.pt"
    if cfg.resume and state_file.exists():
        try:
            saved = torch.load(state_file, weights_only=True, map_location=device)
            opt_t.load_state_dict(saved["target"])
            opt_d.load_state_dict(saved["draft"])
            for opt in (opt_t, opt_d):  # load_state_dict counts the tensors but never checks their shapes
                for group in opt.param_groups:
                    for p in group["params"]:
                        moment = opt.state.get(p, {}).get("exp_avg")
                        if moment is not None and moment.shape != p.shape:
                            raise ValueError(f"a moment of shape {tuple(moment.shape)} for a weight of {tuple(p.shape)}")
        except Exception as e:  # another run's models, or a damaged file
            opt_t = torch.optim.AdamW(target.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.1)
            opt_d = torch.optim.AdamW(draft.parameters(), lr=cfg.draft_lr, betas=(0.9, 0.95), weight_decay=0.1)
            log.warning("optimizer state in %s does not fit these models (%s): starting a fresh one", state_file, e)
        else:
            log.info("optimizer state read from %s", state_file)
    elif cfg.resume:
        log.warning("no optimizer state in %s (kept per --out folder): starting a fresh one", state_file)
    rng = np.random.default_rng(cfg.seed + summary["steps"])
    budget = cfg.minutes * 60
    run = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "minutes": cfg.minutes, "evals": [], "seq": cfg.seq,
           "trained": list(cfg.models), "lr": cfg.lr, "draft_lr": cfg.draft_lr, "fim_rate": cfg.fim_rate,
           "hardware": _hardware(device),
           "data": corpus.manifest}
    target.train(), draft.train()
    for name, model in (("target", target), ("draft", draft)):
        model.requires_grad_(name in cfg.models)
        if name in cfg.models:
            model.config.max_position_embeddings = max(cfg.seq, int(model.config.max_position_embeddings))
    t0 = last_eval = last_ckpt = time.perf_counter()
    step = 0
    try:
        while time.perf_counter() - t0 < budget:
            frac = (time.perf_counter() - t0) / budget
            scale = min(1.0, (step + 1) / cfg.warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
            for opt, lr in ((opt_t, cfg.lr), (opt_d, cfg.draft_lr)):
                for g in opt.param_groups:
                    g["lr"] = lr * scale
            x, y = _row_batch(rows, cfg, rng, tok.pad_token_id, device)
            losses = _step(target, draft, x, y, cfg, opt_t, opt_d)
            step += 1
            now = time.perf_counter()
            if step % 20 == 0:
                tps = step * cfg.batch * cfg.seq / (now - t0)  # row positions, padding included
                shown = " ".join(f"{k} {v:.3f}" for k, v in losses.items())
                print(f"\rstep {step} {shown} {tps:.0f} tok/s {100 * frac:.0f}%", end="", file=sys.stderr, flush=True)
            if now - last_eval > cfg.eval_every_s:
                target.eval(), draft.eval()
                ev = {"elapsed_s": round(now - t0), "step": summary["steps"] + step, **evaluate(target, draft, held_stream, cfg)}
                target.train(), draft.train()
                run["evals"].append(ev)
                log.info("eval %s", ev)
                last_eval = now
            if now - last_ckpt > cfg.checkpoint_every_s:
                _save(target, draft, tok, out, opt_t, opt_d, state_file, summary, run, step, cfg)
                last_ckpt = now
    except KeyboardInterrupt:  # save what was learnt (a checkpoint can be 15 minutes away)
        if step >= 20:
            print(file=sys.stderr)  # end the progress line
        log.warning("interrupted at step %d: saving a checkpoint in %s (--resume continues it)", step, out)
        run["interrupted"] = True
    else:
        if step >= 20:
            print(file=sys.stderr)  # end the progress line
    target.eval(), draft.eval()
    if not run.get("interrupted"):
        run["final"] = evaluate(target, draft, held_stream, cfg, n=64)
    _save(target, draft, tok, out, opt_t, opt_d, state_file, summary, run, step, cfg)
    log.info("done in %.0fs: %s", time.perf_counter() - t_start, run.get("final", f"interrupted after {step} steps"))
    return {**run, "steps": step, "tokens": step * cfg.batch * cfg.seq}


def _step(target, draft, x, y, cfg: TrainConfig, opt_t, opt_d) -> dict:
    """One optimizer step of the models in cfg.models; the draft learns from the data and the target's logits."""
    import torch

    f = torch.nn.functional
    out: dict[str, float] = {}
    with torch.autocast(x.device.type, dtype=torch.bfloat16):
        if "target" in cfg.models:
            lt = target(input_ids=x).logits.float()  # (B, T, V)
            loss_t = f.cross_entropy(lt.flatten(0, 1), y.flatten(), ignore_index=-100)
            _update(opt_t, loss_t, target)
            out["target"] = loss_t.item()
        if "draft" not in cfg.models:
            return out
        if "target" not in cfg.models:
            with torch.no_grad():
                lt = target(input_ids=x).logits.float()
        ld = draft(input_ids=x).logits.float()
        ce_d = f.cross_entropy(ld.flatten(0, 1), y.flatten(), ignore_index=-100)
        keep = y.flatten() != -100
        kl = f.kl_div(torch.log_softmax(ld, -1).flatten(0, 1)[keep], torch.log_softmax(lt.detach(), -1).flatten(0, 1)[keep],
                      log_target=True, reduction="batchmean")
        _update(opt_d, (1 - cfg.distill) * ce_d + cfg.distill * kl, draft)
    out.update(draft=ce_d.item(), kl=kl.item())
    return out


def _update(opt, loss, model) -> None:
    import torch

    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()


def _hardware(device) -> str:
    import torch

    cpu = f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"
    return f"{torch.cuda.get_device_name(device)} ({cpu})" if device.type == "cuda" else cpu


def _model_size(model) -> ModelSize:
    c = model.config
    return ModelSize(c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.intermediate_size)


def _save(target, draft, tok, out: Path, opt_t, opt_d, state_file: Path, summary: dict, run: dict, step: int,
          cfg: TrainConfig) -> None:
    """Write both models (bf16 safetensors: half the bytes in git) and the summary; keep the optimizer aside."""
    import copy

    import torch

    # every file is written aside and then renamed over the old one: a run killed while saving
    # (kill -9, a full disk) leaves the previous checkpoint whole, never a torn file
    saving = {}
    for model, name in ((target, "target"), (draft, "draft")):
        aside = out / f".{name}.saving"
        shutil.rmtree(aside, ignore_errors=True)
        shipped = copy.deepcopy(model).to(torch.bfloat16)
        # max_position_embeddings is the longest context it has been trained at: the engine budgets to it
        shipped.generation_config.pad_token_id = tok.pad_token_id
        shipped.save_pretrained(aside)
        tok.save_pretrained(aside)
        saving[name] = aside
    state_aside = state_file.with_name(state_file.name + ".saving")
    torch.save({"target": opt_t.state_dict(), "draft": opt_d.state_dict()}, state_aside)
    for name, aside in saving.items():
        (out / name).mkdir(exist_ok=True)
        for f in aside.iterdir():
            os.replace(f, out / name / f.name)
        aside.rmdir()
    os.replace(state_aside, state_file)
    run = {**run, "steps": step, "tokens": step * cfg.batch * cfg.seq}
    runs = summary["runs"][:-1] if summary["runs"] and summary["runs"][-1].get("started") == run["started"] else summary["runs"]
    total = {"runs": runs + [run], "steps": sum(r["steps"] for r in runs) + step,
             "tokens_seen": sum(r["tokens"] for r in runs) + run["tokens"],
             "sizes": {name: {**_model_size(model).__dict__, "params": model.num_parameters()}
                       for model, name in ((target, "target"), (draft, "draft"))}}
    aside = out / ".summary.json.saving"
    aside.write_text(json.dumps(total, indent=1))
    os.replace(aside, out / "summary.json")
