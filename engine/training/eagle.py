"""Training of an EAGLE draft (engine/eagle.py) for a lean target: `draftline train-eagle`.

1. Features: the target (lean decoder, its own weights and quant) runs over windows of the corpus's
   training split (engine.training.corpus; never the held-out packages the benches cut prompts
   from) and its last-layer outputs are kept, per token, in bf16.
2. Training: for pair p = (feature at p, token at p + 1) the draft predicts the feature at p + 1.
   Loss = the cross-entropy of its head distribution against the target's own (both through the
   target's final norm and the FR-Spec head of the K most frequent tokens, the target's computed
   from the true feature at p + 1) + the smooth-L1 distance of the unit-RMS features (EAGLE's
   regression term). Inputs get a little noise, as EAGLE does, since at inference a draft's second
   guess reads its own (imperfect) feature.
3. Held-out: the same loss and the top-1 agreement of draft and target (full vocabulary) on windows
   of the held-out split; written into the file's metadata with the run's figures.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

from engine.eagle import SHIPPED, save, unit_rms

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EagleTrainConfig:
    target: str = ""  # "" = the default model (engine.bundled)
    out: str = str(SHIPPED)
    data_minutes: float = 18.0  # target forwards over training windows (features)
    minutes: float = 25.0  # optimizer steps
    window: int = 512
    batch: int = 8
    lr: float = 1e-3
    warmup: int = 30
    head_tokens: int = 8192  # FR-Spec: the draft's head covers the K most frequent ids of the training split
    reg: float = 1.0  # weight of the feature regression against the distribution loss
    noise: float = 0.05  # std of the gaussian noise added to the unit-RMS input features
    max_chars: int = 20_000_000  # training text gathered (engine.training.corpus.collect)
    held_out_windows: int = 24
    seed: int = 0
    init_std: float = 0.02
    init: str = ""  # a draft file to continue from (else random initialisation)
    steps: int = 1  # 2: also train the second guess on the draft's own first (EAGLE-3's training-time test)
    features: str = ""  # a file keeping the target's features: read when it exists, else written (reruns skip step 1)


class EagleDraftModule(torch.nn.Module):
    """The draft as a trainable module; its state_dict keys are the file's (engine.eagle.LAYER_KEYS)."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, ffn: int, eps: float):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.ffn, self.eps = heads, kv_heads, head_dim, ffn, eps
        self.fc = torch.nn.Linear(2 * hidden, hidden, bias=False)
        self.ln1 = torch.nn.Parameter(torch.ones(hidden))
        self.qkv = torch.nn.Linear(hidden, (heads + 2 * kv_heads) * head_dim, bias=False)
        self.o = torch.nn.Linear(heads * head_dim, hidden, bias=False)
        self.ln2 = torch.nn.Parameter(torch.ones(hidden))
        self.gate_up = torch.nn.Linear(hidden, 2 * ffn, bias=False)
        self.down = torch.nn.Linear(ffn, hidden, bias=False)

    def _rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return unit_rms(x, self.eps) * w

    def _attention_inputs(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        b, t, _ = x.shape
        h, kvh, d = self.heads, self.kv_heads, self.head_dim
        q, k, v = self.qkv(self._rms(x, self.ln1)).split([h * d, kvh * d, kvh * d], -1)
        q, k, v = (z.view(b, t, -1, d).transpose(1, 2) for z in (q, k, v))  # (B, heads, T, D)
        q = q * cos + q.roll(d // 2, -1) * sin
        k = k * cos + k.roll(d // 2, -1) * sin
        return q, k.repeat_interleave(h // kvh, 1), v.repeat_interleave(h // kvh, 1)

    def _rest(self, x: torch.Tensor, att: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        x = x + self.o(att.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))
        gate, up = self.gate_up(self._rms(x, self.ln2)).split(self.ffn, -1)
        return x + self.down(torch.nn.functional.silu(gate) * up)

    def forward(self, feats: torch.Tensor, emb: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                feats2: torch.Tensor | Callable[[torch.Tensor], torch.Tensor] | None = None):
        """feats: unit-RMS features (B, T, C); emb: the next tokens' embeddings (B, T, C); cos/sin (T, D)
        as engine.lean holds them (sin's first half negated). Returns the guessed features (B, T, C).

        With `feats2` (the draft's own guesses in place of the target's features, or a function of
        the first pass's guesses that makes them), also a second
        pass where pair p reads feats2[p] and attends to the first pass's pairs before p and to itself:
        what the draft's second guess sees at inference (EAGLE-3's training-time test). Returns both."""
        x = self.fc(torch.cat([emb, feats], -1))
        q, k, v = self._attention_inputs(x, cos, sin)
        g = self._rest(x, torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))
        if feats2 is None:
            return g
        t = x.shape[1]
        if callable(feats2):  # made from the first pass's guesses
            feats2 = feats2(g)
        x2 = self.fc(torch.cat([emb, feats2], -1))
        q2, k2, v2 = self._attention_inputs(x2, cos, sin)
        eye = torch.eye(t, dtype=torch.bool, device=x.device)
        mask = torch.cat([torch.ones(t, t, dtype=torch.bool, device=x.device).tril(-1), eye], 1)  # (T, 2T)
        att2 = torch.nn.functional.scaled_dot_product_attention(q2, torch.cat([k, k2], 2), torch.cat([v, v2], 2),
                                                                attn_mask=mask)
        return g, self._rest(x2, att2)

    def tensors(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.state_dict().items()}


def features(lm, stream: list[int], window: int, minutes: float, rng, max_windows: int | None = None):
    """Run the target over random windows of `stream`; (tokens (N, W) int64, features (N, W, C) bf16).

    max_windows=None: as many as `minutes` allow; 0: none (empty tensors)."""
    lm.keep_hidden()
    toks, feats = [], []
    deadline = time.perf_counter() + minutes * 60
    starts = rng.permutation(max(1, (len(stream) - window) // window)) * window if len(stream) >= 2 else []
    for i, s in enumerate(starts):
        if time.perf_counter() > deadline or (max_windows is not None and i >= max_windows):
            break
        ids = stream[s : s + window]
        lm.reset()
        lm.forward(ids, keep_logits=1)
        toks.append(torch.tensor(ids, dtype=torch.long))
        feats.append(lm.hidden[: len(ids)].to("cpu", torch.bfloat16).clone())  # kept in host memory
        if i % 20 == 0:
            print(f"\rfeatures: {i + 1} windows", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    lm.reset()
    if not toks:
        return torch.zeros(0, window, dtype=torch.long), torch.zeros(0, window, int(lm.embed.shape[1]), dtype=torch.bfloat16)
    return torch.stack(toks), torch.stack(feats)


def _stream(tokenizer, texts: list[str], rng) -> list[int]:
    """The texts in random order, each ended by the tokenizer's end token, as one id stream."""
    eos = tokenizer.eos_token_id
    order = rng.permutation(len(texts))
    out: list[int] = []
    for i in order:
        out += tokenizer.encode(texts[i], add_special_tokens=False)
        if eos is not None:
            out.append(eos)
    return out


class _Frozen:
    """The target's tensors the loss reads: embeddings, final norm, and the FR-Spec head rows (float32)."""

    def __init__(self, lm, head_ids: torch.Tensor):
        self.embed = lm.embed.float()
        self.norm = lm.final_norm.float()
        self.full_head = lm.lm_head.w.float()
        self.head = self.full_head[head_ids]
        self.eps = lm.eps
        self.cos, self.sin = lm.cos.float(), lm.sin.float()

    def logits(self, f: torch.Tensor, full: bool = False) -> torch.Tensor:
        return (unit_rms(f, self.eps) * self.norm) @ (self.full_head if full else self.head).T


def _loss(model: EagleDraftModule, fz: _Frozen, toks: torch.Tensor, feats: torch.Tensor, cfg: EagleTrainConfig,
          noise: float, steps: int = 1) -> tuple[torch.Tensor, dict]:
    """The distribution + regression loss of the draft's first guess (and, with steps=2, of its
    second, made from its own first guess), averaged over the guesses."""
    f = feats.float()
    t = f.shape[1] - 1
    inp = unit_rms(f[:, :-1], fz.eps)
    if noise:
        inp = inp + noise * torch.randn_like(inp)
    emb = fz.embed[toks[:, 1:]]
    with torch.no_grad():
        p = torch.softmax(fz.logits(f[:, 1:]), -1)
        want = unit_rms(f[:, 1:], fz.eps)
    if steps == 2:
        def own(g: torch.Tensor) -> torch.Tensor:  # pair p reads the first pass's guess of f_p
            return torch.cat([inp[:, :1], unit_rms(g[:, :-1].detach(), fz.eps)], 1)

        g, g2 = model(inp, emb, fz.cos[:t], fz.sin[:t], feats2=own)
        guesses = [(g, slice(None)), (g2, slice(1, None))]
    else:
        guesses = [(model(inp, emb, fz.cos[:t], fz.sin[:t]), slice(None))]
    total = ce_sum = reg_sum = 0.0
    for guess, keep in guesses:
        ce = -(p[:, keep] * torch.log_softmax(fz.logits(guess[:, keep]), -1)).sum(-1).mean()
        reg = torch.nn.functional.smooth_l1_loss(unit_rms(guess[:, keep], fz.eps), want[:, keep])
        total = total + ce + cfg.reg * reg
        ce_sum, reg_sum = ce_sum + float(ce.detach()), reg_sum + float(reg.detach())
    n = len(guesses)
    return total / n, {"ce": ce_sum / n, "reg": reg_sum / n, "g": guesses[0][0].detach()}


@torch.no_grad()
def evaluate(model: EagleDraftModule, fz: _Frozen, head_ids: torch.Tensor, toks: torch.Tensor, feats: torch.Tensor,
             cfg: EagleTrainConfig) -> dict:
    """Held-out: loss terms, and how often the draft's top token (its head) is the target's (full head)."""
    model.eval()
    agree = covered = count = 0
    ce = reg = 0.0
    dev = fz.embed.device
    head_ids = head_ids.to(dev)
    for s in range(0, len(toks), cfg.batch):
        tk, ft = toks[s : s + cfg.batch].to(dev), feats[s : s + cfg.batch].to(dev)
        _, parts = _loss(model, fz, tk, ft, cfg, 0.0)
        ce, reg = ce + parts["ce"] * len(tk), reg + parts["reg"] * len(tk)
        want = torch.stack([fz.logits(w[1:].float(), full=True).argmax(-1) for w in ft])  # a window at a time
        got = head_ids[fz.logits(parts["g"]).argmax(-1)]
        agree += int((want == got).sum())
        covered += int(torch.isin(want, head_ids).sum())
        count += want.numel()
    model.train()
    n = max(1, len(toks))
    return {"ce": round(ce / n, 4), "reg": round(reg / n, 4), "top1_agreement": round(agree / max(1, count), 4),
            "target_top1_in_head": round(covered / max(1, count), 4), "positions": count}


def cached_features(path: Path | None, made_from: dict) -> dict | None:
    """An earlier run's features (`--features`), if that file exists and was made from the same target,
    window and shapes; None (with a warning for a mismatch) when they must be computed again."""
    import torch

    if path is None or not path.is_file():
        return None
    try:
        saved = torch.load(path, weights_only=True)
        if not isinstance(saved, dict):
            raise ValueError(f"a {type(saved).__name__}, not a dict")
    except Exception as e:  # a torn or foreign file: made again (and written over)
        log.warning("features in %s cannot be read (%s): computing them again", path, e)
        return None
    if saved.get("made_from") != made_from:
        log.warning("features in %s were made from %s, not %s: computing them again", path,
                    saved.get("made_from", "an unrecorded target"), made_from)
        return None
    return saved


def check_config(cfg: EagleTrainConfig) -> None:
    """Refuse a setting that cannot train, naming its option (a ValueError, before any work)."""
    bad = []
    if cfg.window < 2:
        bad.append(f"--window must be at least 2 tokens (got {cfg.window})")
    if cfg.batch < 1:
        bad.append(f"--batch must be at least 1 (got {cfg.batch})")
    if not (0 < cfg.lr < math.inf):
        bad.append(f"--lr must be above 0 (got {cfg.lr})")
    if cfg.head_tokens < 1:
        bad.append(f"--head-tokens must be at least 1 (got {cfg.head_tokens})")
    if not cfg.minutes >= 0 or not cfg.data_minutes >= 0:
        bad.append(f"--minutes and --data-minutes cannot be negative (got {cfg.minutes}, {cfg.data_minutes})")
    if cfg.held_out_windows < 0:
        bad.append(f"--held-out-windows cannot be negative (got {cfg.held_out_windows})")
    if cfg.max_chars < 1:
        bad.append(f"--max-chars must be at least 1 (got {cfg.max_chars})")
    if cfg.steps not in (1, 2):
        bad.append(f"--steps is 1 or 2 (got {cfg.steps})")
    if cfg.warmup < 1 or cfg.noise < 0 or cfg.reg < 0:
        bad.append(f"warmup must be at least 1, noise and reg not negative (got {cfg.warmup}, {cfg.noise}, {cfg.reg})")
    if bad:
        raise ValueError("; ".join(bad))


def _check_out(out: Path) -> None:
    """The draft file is written after all the work: refuse, before it, a place it cannot go."""
    if out.is_dir():
        raise ValueError(f"--out {out} is a folder: name the draft file (e.g. {out / 'draft.safetensors'})")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"--out {out}: cannot create its folder ({e.strerror or e})") from e
    if not os.access(out.parent, os.W_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise ValueError(f"--out {out}: not writable")


def _save_atomic(out: Path, tensors: dict, ids: torch.Tensor, summary: dict) -> None:
    """Write the draft aside and rename it over cfg.out: a run killed while saving keeps the old file whole."""
    aside = out.with_name(f".{out.name}.saving")
    save(aside, tensors, ids, summary)
    os.replace(aside, out)


def train_eagle(cfg: EagleTrainConfig) -> dict:
    """Features from the target, then the draft; writes cfg.out and returns the run's summary.

    Ctrl-C during the optimizer steps ends them there: the draft is evaluated and written as usual
    (its summary says "interrupted")."""
    import numpy as np

    from engine import bundled
    from engine.engine import load_engine
    from engine.lean import LeanLM
    from engine.selfdraft import head_ids as frequent_ids
    from engine.selfdraft import tokenizer_hash
    from engine.training.corpus import collect

    check_config(cfg)
    out = Path(cfg.out)
    _check_out(out)
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    target, _, options = bundled.resolve(cfg.target or None)
    if out.resolve() == SHIPPED.resolve() and target != bundled.default_target():
        # the default --out is the default model's shipped draft: a draft for another target there breaks it
        raise ValueError(f"--out is needed with --target {cfg.target}: the default, {SHIPPED}, is the default model's draft")
    engine = load_engine(target, **options)
    lm, tok = engine.target_lm, engine.target.tokenizer
    if not isinstance(lm, LeanLM):
        raise ValueError(f"an EAGLE draft is trained on a lean target; {target} runs on {type(lm).__name__}")
    t0 = time.perf_counter()
    corpus = collect(max_chars=cfg.max_chars)
    train_stream = _stream(tok, [f.text for f in corpus.train], rng)
    held_stream = _stream(tok, [f.text for f in corpus.held_out], rng)
    log.info("corpus: %d train tokens, %d held-out tokens (%.0fs)", len(train_stream), len(held_stream),
             time.perf_counter() - t0)
    if len(train_stream) < 2:
        raise ValueError(f"no training text gathered (--max-chars {cfg.max_chars}); raise --max-chars")
    ids = frequent_ids(tok, cfg.head_tokens, lm.lm_head.w.shape[0])
    model = EagleDraftModule(int(lm.embed.shape[1]), lm.n_heads, lm.n_kv, lm.head_dim, lm.ffn, lm.eps).to(lm.device)
    if cfg.init:  # continue from a draft file (its head ids must be this run's): checked before the features
        from engine.eagle import load

        tensors, init_ids, _ = load(cfg.init)
        if not torch.equal(init_ids.sort().values, ids):
            raise ValueError(f"{cfg.init} drafts over other head ids than this run's {len(ids)}")
        try:
            model.load_state_dict({k: v.float() for k, v in tensors.items()})
        except RuntimeError as e:
            raise ValueError(f"{cfg.init} is a draft for another target: {str(e).splitlines()[0]}") from e
    else:
        for name, p in model.named_parameters():
            if p.dim() == 2:
                torch.nn.init.normal_(p, std=cfg.init_std)
    cached = Path(cfg.features) if cfg.features else None
    # what the features were made from: another target (or window) would train the draft on features
    # its target never gives
    made_from = {"target": str(target), "window": cfg.window, "hidden": int(lm.embed.shape[1]),
                 "vocab": int(lm.embed.shape[0])}
    saved = cached_features(cached, made_from)
    if saved is not None:  # an earlier run's features: the optimizer steps alone
        held_toks, held_feats, toks, feats = saved["held_toks"], saved["held_feats"], saved["toks"], saved["feats"]
        log.info("features read from %s", cached)
    else:
        held_toks, held_feats = features(lm, held_stream, cfg.window, 10.0, rng, max_windows=cfg.held_out_windows)
        toks, feats = features(lm, train_stream, cfg.window, cfg.data_minutes, rng)
        if not len(toks):
            raise ValueError(f"no training windows: --data-minutes {cfg.data_minutes} ran out before the first")
        if cached is not None:
            cached.parent.mkdir(parents=True, exist_ok=True)
            aside = cached.with_name(f".{cached.name}.saving")
            torch.save({"held_toks": held_toks, "held_feats": held_feats, "toks": toks, "feats": feats,
                        "made_from": made_from}, aside)
            os.replace(aside, cached)  # never a torn file where a rerun reads it
    log.info("features: %d training windows of %d tokens", len(toks), cfg.window)
    fz = _Frozen(lm, ids)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    before = evaluate(model, fz, ids, held_toks, held_feats, cfg)
    budget, start, step = cfg.minutes * 60, time.perf_counter(), 0
    interrupted = False
    try:
        while (elapsed := time.perf_counter() - start) < budget:
            frac = elapsed / budget
            scale = min(1.0, (step + 1) / cfg.warmup) * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * frac)))
            for g in opt.param_groups:
                g["lr"] = cfg.lr * scale
            pick = torch.from_numpy(rng.integers(0, len(toks), size=cfg.batch))
            loss, parts = _loss(model, fz, toks[pick].to(lm.device), feats[pick].to(lm.device), cfg, cfg.noise, cfg.steps)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            step += 1
            if step % 10 == 0:
                print(f"\rstep {step} ce {parts['ce']:.3f} reg {parts['reg']:.3f} {100 * frac:.0f}%", end="",
                      file=sys.stderr, flush=True)
    except KeyboardInterrupt:  # minutes of steps are not thrown away: evaluated and written as they are
        interrupted = True
        print(file=sys.stderr)
        log.warning("interrupted at step %d: evaluating and writing the draft to %s", step, out)
    print(file=sys.stderr)
    after = evaluate(model, fz, ids, held_toks, held_feats, cfg)
    summary = {"target": engine.target.name, "tokenizer": tokenizer_hash(tok), "head_tokens": len(ids),
               "config": {k: v for k, v in asdict(cfg).items() if k not in ("out", "features", "init")},
               "continued_from": Path(cfg.init).name if cfg.init else None,
               "windows": len(toks), "tokens": int(toks.numel()), "steps": step,
               "trained_tokens": step * cfg.batch * (cfg.window - 1),
               "held_out_before": before, "held_out": after,
               "hardware": f"{torch.get_num_threads()} threads", "date": time.strftime("%Y-%m-%d")}
    if interrupted:
        summary["interrupted"] = True
    _save_atomic(out, model.tensors(), ids, summary)
    log.info("EAGLE draft written to %s: %s", cfg.out, after)
    return summary
