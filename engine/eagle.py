"""A trained EAGLE draft (issue 19): one decoder layer that reads the target's own last hidden states.

EAGLE (Li et al. 2024) drafts at the feature level: to guess the token after position p + 1, the
draft takes the target's last-layer output at position p (f_p, which the target already computed)
and the embedding of the token at p + 1, runs one decoder layer, and predicts f_{p+1}; the
target's own final norm and head turn that into a token. Its next guess feeds its own predicted
feature back in. The target verifies every guess in one forward as with any drafter, so greedy
output is the target's own, whatever the draft says.

Here:
- pair p = (the target's feature at p, made unit-RMS; the token at p + 1) goes through
  fc([embedding; feature]) and one Llama decoder layer of the target's head layout at position p;
- the draft's logits come from the target's final norm and a head restricted to the K most frequent
  tokens of the training split (FR-Spec, engine.selfdraft.SubsetHead): a token outside them is never
  drafted, and the target still verifies over the full vocabulary;
- the draft shares the target's embeddings, final norm and head (the file holds only fc and the
  layer: ~4.2M parameters, 8.5 MB in bf16, for SmolLM2-135M);
- the target must run on the lean decoder, which keeps its hidden states (LeanLM.keep_hidden).

`draftline train-eagle` trains one (engine/training/eagle.py); `draft = "eagle"` loads the shipped
one for the default model, `draft = "eagle:PATH"` another.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any, Sequence

import torch

from engine.bundled import MODELS_DIR
from engine.lean import LeanLM, Linear
from engine.model import CANCEL_CHUNK, common_prefix_len

log = logging.getLogger(__name__)

FORMAT = 1
SHIPPED = MODELS_DIR / "eagle" / "smollm2-135m.safetensors"  # for the default target (engine.bundled)
LAYER_KEYS = ("ln1", "qkv.weight", "o.weight", "ln2", "gate_up.weight", "down.weight")


def unit_rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x scaled to unit root-mean-square per row (no weight): the draft's view of a feature."""
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def parse_eagle_draft(spec: str) -> Path | None:
    """"eagle" -> the shipped file, "eagle:PATH" -> PATH; None when `spec` names no EAGLE draft."""
    if spec == "eagle":
        return SHIPPED
    if spec.startswith("eagle:") and len(spec) > len("eagle:"):
        return Path(spec[len("eagle:"):]).expanduser()
    return None


def save(path: str | Path, tensors: dict[str, torch.Tensor], head_ids: torch.Tensor, meta: dict) -> None:
    """Write an EAGLE draft: its weights (bf16), its head's token ids, and `meta` (what it drafts for)."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    out = {k: v.detach().to("cpu", torch.bfloat16).contiguous() for k, v in tensors.items()}
    out["head_ids"] = head_ids.to(torch.int64).contiguous()
    save_file(out, str(path), metadata={"draftline": json.dumps({"format": FORMAT, **meta})})


def load(path: str | Path) -> tuple[dict[str, torch.Tensor], torch.Tensor, dict]:
    """(weights, head ids, meta) of an EAGLE draft file; ValueError saying what is wrong with it."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"EAGLE draft {path}: no such file")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = json.loads((f.metadata() or {}).get("draftline", "{}"))
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as exc:  # a damaged or foreign file
        raise ValueError(f"EAGLE draft {path}: cannot read it ({exc})") from exc
    if meta.get("format") != FORMAT or "head_ids" not in tensors:
        raise ValueError(f"EAGLE draft {path}: not a draftline EAGLE draft of format {FORMAT}")
    missing = [k for k in ("fc.weight", *LAYER_KEYS) if k not in tensors]
    if missing:
        raise ValueError(f"EAGLE draft {path}: missing {', '.join(missing)}")
    return tensors, tensors.pop("head_ids"), meta


class EagleLM(LeanLM):
    """The draft's layer as a lean decoder over (feature, token) pairs, on the target's shared tensors.

    Position p of its cache holds pair p. `forward_pairs(tokens, feats)` appends pairs; `hidden[p]`
    is then the draft's guess of the target's feature at p + 1 (LeanLM.keep_hidden).
    """

    supports_tree = False  # forward_tree embeds tokens alone; a pair needs its feature

    def __init__(self, target: LeanLM, tensors: dict[str, torch.Tensor], head_ids: torch.Tensor):
        from engine.selfdraft import SubsetHead

        if not isinstance(target, LeanLM) or isinstance(target, EagleLM):
            raise ValueError(f"an EAGLE draft runs on a lean target, not {type(target).__name__}")
        hidden = int(target.embed.shape[1])
        qkv_rows = (target.n_heads + 2 * target.n_kv) * target.head_dim
        if tuple(tensors["fc.weight"].shape) != (hidden, 2 * hidden) or int(tensors["qkv.weight"].shape[0]) != qkv_rows:
            raise ValueError(f"this EAGLE draft was trained for another model: fc {tuple(tensors['fc.weight'].shape)}, "
                             f"qkv rows {tensors['qkv.weight'].shape[0]}; the target has hidden {hidden}, qkv rows {qkv_rows}")
        vars(self).update(vars(target))  # the target's embeddings, norms, RoPE tables, head: the same tensors
        self.graphs = None  # the target's static forwards run the target's layers and cache, not this draft's
        self._target_hidden = target.keep_hidden()
        dtype, dev = target.embed.dtype, target.device
        quant = target.quant  # int4 on the default model: the layer's 4.2M weights read half int8's bytes
        w = {k: v.to(dev, dtype) for k, v in tensors.items()}
        nat = target.native  # the target's kernels (engine/native.c) where it has them

        def lin(name: str) -> Linear:
            return Linear(w[name], quant=quant, native=nat)

        self.fc = lin("fc.weight")
        self.layers = [(w["ln1"], lin("qkv.weight"), lin("o.weight"), w["ln2"], lin("gate_up.weight"), lin("down.weight"))]
        self.ffn = int(w["down.weight"].shape[1])
        self.set_cache(torch.zeros((1, 2, self.n_kv, self.max_len, self.head_dim), dtype=target.kv.dtype, device=dev))
        self.tokens, self.forwards, self._tree, self.hidden = [], 0, None, None
        self.keep_hidden()
        ids = torch.as_tensor(head_ids, dtype=torch.long).unique()
        if len(ids) == 0 or int(ids[0]) < 0 or int(ids[-1]) >= target.lm_head.w.shape[0]:
            raise ValueError("the EAGLE draft's head ids are not ids of the target's vocabulary")
        self.head_ids = ids.to(dev)
        self.lm_head = SubsetHead(target.lm_head, self.head_ids)
        self._feats: torch.Tensor | None = None
        self._f0 = 0

    def _inputs(self, ids: torch.Tensor, start: int, end: int) -> torch.Tensor:
        # a plain forward (prefill, a bench's timing) reads the target's features at the same positions
        # (its hidden buffer: valid where the target holds them, else whatever it last wrote there)
        f = self._target_hidden[start:end] if self._feats is None else self._feats[start - self._f0 : end - self._f0]
        return self.fc(torch.cat([self.embed[ids], unit_rms(f, self.eps)], -1))

    def forward_pairs(self, tokens: Sequence[int], feats: torch.Tensor, keep: int = 1) -> torch.Tensor:
        """Append pairs (feats[i], tokens[i]) at the next positions; logits of the last `keep`."""
        if len(tokens) != len(feats):
            raise ValueError(f"{len(tokens)} tokens but {len(feats)} features")
        self._feats, self._f0 = feats, len(self.tokens)
        try:
            return self.forward(tokens, keep_logits=keep)
        finally:
            self._feats = None


class EagleDrafter:
    """Drafts with an EagleLM from the target's hidden states; the Drafter protocol of engine.drafters.

    propose(tokens, k): `tokens` is the target's cache plus the pending token (the speculative
    loop's state). The draft catches up on the pairs it has not seen (the prompt's, on a first
    request; the last verify's accepted tokens, later) and then guesses k tokens one step each.
    When the target's cache is not tokens[:-1] (nothing to read features from), it proposes nothing.
    With `cancel` set (Engine.complete sets the request's flag), a long catch-up runs in chunks and
    stops between them, as a prefill does; the pairs done stay for the next call.
    """

    name = "eagle"

    def __init__(self, target: LeanLM, lm: EagleLM, p_min: float = 0.0):
        if target.hidden is None:
            target.keep_hidden()
        self.target, self.lm, self.p_min = target, lm, p_min
        self.last_probs: torch.Tensor | None = None  # greedy guesses: one-hot, which accept_sampled handles
        self.temperature = 0.0
        self.generator: torch.Generator | None = None  # set as on ModelDrafter; greedy guesses draw nothing
        self.cancel: threading.Event | None = None  # the request's cancel flag (Engine.complete sets it)
        self.rows = lm.rows

    @torch.inference_mode()
    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        self.last_probs = None
        n = len(tokens)
        target, lm = self.target, self.lm
        if k <= 0 or n < 2 or len(target.tokens) != n - 1 or target.tokens[-64:] != list(tokens[max(0, n - 65) : n - 1]):
            return []
        want = list(tokens[1:])  # pair p holds the token at p + 1, for p = 0 .. n - 2
        common = min(common_prefix_len(lm.tokens, want), n - 2)
        lm.truncate(common)
        logits = self._catch_up(want, common, n - 1)
        if logits is None:  # cancelled between chunks; the loop sees the flag next
            return []
        out: list[int] = []
        pos = n - 2  # the pair whose output guesses the next token
        for i in range(k):
            tok = int(torch.argmax(logits))
            if self.p_min and i > 0 and float(torch.softmax(logits, -1)[tok]) < self.p_min:
                break
            out.append(tok)
            if i + 1 < k:
                logits = lm.forward_pairs([tok], lm.hidden[pos : pos + 1])[-1]
                pos += 1
        lm.truncate(n - 1)  # keep the pairs of true features only: guessed ones are redone with the target's
        return out

    def _catch_up(self, want: list[int], start: int, end: int) -> torch.Tensor | None:
        """Run pairs start .. end - 1 (want's tokens, the target's features); the last one's logits, or
        None when the cancel flag is set between chunks (a first request's catch-up is the whole prompt)."""
        lm, feats = self.lm, self.target.hidden
        if self.cancel is not None:
            step = lm.chunk or CANCEL_CHUNK
            while end - start > step:
                if self.cancel.is_set():
                    return None
                lm.forward_pairs(want[start : start + step], feats[start : start + step])
                start += step
            if self.cancel.is_set():
                return None
        return lm.forward_pairs(want[start:end], feats[start:end])[-1]

    def propose_tree(self, tokens: Sequence[int], max_nodes: int, depth: int,
                     branch: int) -> tuple[list[int], list[int]]:
        """No trees: the chain (engine.drafters' protocol for drafts without them)."""
        chain = self.propose(tokens, min(depth, max_nodes))
        return chain, list(range(-1, len(chain) - 1))

    def feedback(self, accepted: int, proposed: int) -> None:
        pass


def attach(engine: Any, path: str | Path) -> EagleLM:
    """Give a loaded Engine (no draft model) the EAGLE draft in `path`: its draft_lm, drafter and hybrid."""
    from engine.drafters import HybridDrafter
    from engine.selfdraft import check_lean_target, tokenizer_hash

    check_lean_target(engine, f"EAGLE draft {Path(path).name}")
    if Path(path) == SHIPPED and not SHIPPED.is_file():
        raise ValueError("this build ships no EAGLE draft (engine/models/eagle): train one with `draftline train-eagle`")
    tensors, ids, meta = load(path)
    want = meta.get("tokenizer")
    if want and want != tokenizer_hash(engine.target.tokenizer):
        raise ValueError(f"EAGLE draft {path} was trained for {meta.get('target', 'another model')}, whose tokenizer "
                         f"differs from {engine.target.name}'s")
    engine.target_lm.keep_hidden()
    lm = EagleLM(engine.target_lm, tensors, ids)
    engine.draft_lm = lm
    engine.model_drafter = EagleDrafter(engine.target_lm, lm, p_min=engine.config.spec.draft_confidence)
    engine.hybrid = HybridDrafter(engine.ngram, engine.model_drafter, engine.config.spec.min_ngram)
    log.info("EAGLE draft %s: one layer over %s's features, head %d ids", Path(path).name,
             meta.get("target", "the target"), len(lm.head_ids))
    return lm
