"""Self-speculation (issue 19): the target's own first layers, its final norm and its tied head as the draft.

`SelfDraftLM(target, layers, head_ids)` is a draft LM for ModelDrafter that runs the first `layers`
decoder layers of a lean target (engine.lean.LeanLM) and exits through the target's final norm and
head. It holds no copy of the target's weights (the layer tuples, embeddings, norms, RoPE tables and
int8 copies are the target's own tensors), only its own KV cache of `layers` layers, so drafting
never touches the target's cache.

FR-Spec: with `head_ids`, the exit head scores only those ids (the int8 rows of the K most frequent
tokens, a gathered copy of K x hidden bytes) and returns full-vocabulary logits with -inf elsewhere,
which is what ModelDrafter reads. The target still verifies over the whole vocabulary, so greedy
output is unchanged (lossless); a token outside the set is simply never drafted. On SmolLM2-135M the
49,152-row head reads about as many bytes as 8 of its 30 layers; 4,096 rows read less than one.

The ranking of token ids (`token_ranking`) is counted over the training split of
engine.training.corpus (never the held-out split, which benches cut prompts from) and cached under
~/.cache/draftline/selfdraft/ keyed by a hash of the tokenizer's vocabulary.

`load_engine(target, draft="self:N")` or `"self:N:K"` wires it in (`attach`). `draftline bench
selfdraft` measures it on the default model (engine/bench/selfdraft.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch

from engine import native as native_kernels
from engine.lean import INT8_MAX_ROWS, LeanLM, Linear, dense_linear

log = logging.getLogger(__name__)

RANKING_VERSION = 1  # bump when what token_ranking counts changes


class SubsetHead:
    """The exit head restricted to `ids` (FR-Spec): scores those rows only, returns (T, V) logits, -inf elsewhere.

    On an int8 target the int8 rows of `ids` are gathered (per-row scales: each kept row has the
    full head's very bits); a forward of more than INT8_MAX_ROWS rows (never a draft step) runs the
    full dense head and keeps the columns of `ids`. A target without int8 copies gets a gathered
    dense copy of the rows.
    """

    def __init__(self, full: Linear, ids: torch.Tensor):
        if full.b is not None:
            raise ValueError("an exit head with a bias is not supported")
        self.full, self.ids, self.vocab = full, ids, int(full.w.shape[0])
        self.q = full.q.index_select(0, ids).contiguous() if full.q is not None and full.sf is None else None
        self.s = full.s.index_select(0, ids) if full.s is not None else None
        self.sf = None
        if full.sf is not None:  # native kernels: their int8 rows come in tiles of four (native.q8_tile)
            self.sf = full.sf.index_select(0, ids).contiguous()
            self.q = native_kernels.q8_tile(native_kernels.q8_untile(full.q, self.vocab).index_select(0, ids))
        self.w = full.w.index_select(0, ids) if full.q is None else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.sf is not None and x.shape[0] <= INT8_MAX_ROWS:
            y = native_kernels.q8_linear(x, self.q, self.sf)
        elif self.q is not None and x.shape[0] <= INT8_MAX_ROWS:
            y = torch._weight_int8pack_mm(x, self.q, self.s)
        elif self.w is not None:
            y = dense_linear(x, self.w)
        else:
            y = self.full(x).index_select(-1, self.ids)
        return y.new_full((x.shape[0], self.vocab), float("-inf")).index_copy_(1, self.ids, y)


class SelfDraftLM(LeanLM):
    """The first `layers` layers of a lean target, its final norm and head (or a SubsetHead), with its own KV cache.

    The LeanLM interface (tokens, forward, truncate, prefill, reset, forward_tree, keep_path) over
    the target's weights: every attribute of the target is shared except the layer list (a slice
    of the target's), the KV cache (its own, `layers` deep), the head when `head_ids` restricts it,
    and the sequence state.
    """

    def __init__(self, target: LeanLM, layers: int, head_ids: Sequence[int] | torch.Tensor | None = None):
        if not isinstance(target, LeanLM):
            raise ValueError(f"self-speculation runs on the lean decoder; the target runs on {type(target).__name__}")
        if isinstance(target, SelfDraftLM):
            raise ValueError("a self draft of a self draft")
        total = len(target.layers)
        if not 1 <= layers < total:
            raise ValueError(f"a self draft runs 1 to {total - 1} of the target's {total} layers, not {layers}")
        # No LeanLM.__init__: take the target's attributes as they are (the same tensor objects),
        # then give this draft its own layer list, cache, head and sequence state.
        vars(self).update(vars(target))
        self.graphs = None  # the target's static forwards run the target's layers and cache, not this draft's
        self.target = target
        self.layers = target.layers[:layers]
        self.set_cache(torch.zeros_like(target.kv[:layers]))  # (layers, k|v, KVH, L, D), the target's dtype and length
        self.tokens, self.forwards, self._tree = [], 0, None
        self.hidden = None  # never the target's feature buffer (LeanLM.keep_hidden): its layers' outputs are not the target's
        self.head_ids: torch.Tensor | None = None
        if head_ids is not None:
            ids = torch.as_tensor(head_ids, dtype=torch.long).unique()  # sorted, unique
            if len(ids) == 0 or int(ids[0]) < 0 or int(ids[-1]) >= target.lm_head.w.shape[0]:
                raise ValueError("head_ids must be a non-empty set of ids of the target's vocabulary")
            self.head_ids = ids.to(target.device)
            self.lm_head = SubsetHead(target.lm_head, self.head_ids)

    @property
    def n_layers(self) -> int:
        return len(self.layers)


# ---------------------------------------------------------------- "self:N[:K]" and load_engine


def parse_self_draft(spec: str) -> tuple[int, int | None] | None:
    """"self:N" -> (N, None), "self:N:K" -> (N, K); None when `spec` does not name a self draft."""
    if not spec or not spec.startswith("self:"):
        return None
    parts = spec.split(":")[1:]
    try:
        if len(parts) not in (1, 2):
            raise ValueError
        layers = int(parts[0])
        head = int(parts[1]) if len(parts) == 2 and parts[1] not in ("", "full") else None
        if layers < 1 or (head is not None and head < 1):
            raise ValueError
    except ValueError:
        raise ValueError(f"draft {spec!r}: a self draft is 'self:N' (the target's first N layers) or "
                         f"'self:N:K' (and a head over the K most frequent tokens)") from None
    return layers, head


def check_lean_target(engine: Any, what: str) -> None:
    """ValueError unless `engine`'s target runs on the lean decoder and no draft model is loaded:
    what a draft made of the target's own state (`what`: "draft 'self:4'", ...) needs."""
    if not isinstance(engine.target_lm, LeanLM):
        raise ValueError(f"{what} reads the target's own state on the lean decoder, but "
                         f"{engine.target.name} runs on {type(engine.target_lm).__name__} "
                         f"(backend {engine.config.backend!r}); use backend 'auto' or 'lean' with a Llama/Qwen2 target")
    if engine.draft_lm is not None:
        raise ValueError(f"{what} replaces the draft model: load no other draft")


def attach(engine: Any, layers: int, head_tokens: int | None = None) -> SelfDraftLM:
    """Give a loaded Engine (no draft model) a self draft: its draft_lm, model drafter and hybrid."""
    from engine.drafters import HybridDrafter, ModelDrafter

    check_lean_target(engine, f"draft 'self:{layers}'")
    ids = head_ids(engine.target.tokenizer, head_tokens, engine.target_lm.lm_head.w.shape[0]) if head_tokens else None
    lm = SelfDraftLM(engine.target_lm, layers, ids)
    engine.draft_lm = lm
    engine.model_drafter = ModelDrafter(lm, p_min=engine.config.spec.draft_confidence)
    engine.hybrid = HybridDrafter(engine.ngram, engine.model_drafter, engine.config.spec.min_ngram)
    log.info("self draft: %d of %d layers, head %s", layers, len(engine.target_lm.layers),
             f"{len(ids)} ids" if ids is not None else "full")
    return lm


# ---------------------------------------------------------------- token frequencies (FR-Spec)


def tokenizer_hash(tokenizer: Any) -> str:
    """A key for a tokenizer's id assignment: its vocabulary (token -> id, added tokens included)."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()[:24]


def count_tokens(tokenizer: Any, texts: Iterable[str], batch: int = 256) -> Counter:
    """How often each id occurs in `texts` (no special tokens added)."""
    backend = getattr(tokenizer, "_tokenizer", None) or getattr(tokenizer, "backend_tokenizer", None)
    counts: Counter = Counter()
    texts = list(texts)
    for s in range(0, len(texts), batch):
        piece = texts[s : s + batch]
        if backend is not None and hasattr(backend, "encode_batch"):
            for enc in backend.encode_batch(piece, add_special_tokens=False):
                counts.update(enc.ids)
        else:
            for text in piece:
                counts.update(tokenizer.encode(text, add_special_tokens=False))
    return counts


def _training_texts(max_chars: int) -> list[str]:
    """The texts of the corpus's training split (never the held-out split)."""
    try:
        from engine.training.corpus import collect
    except ImportError:  # before the training package existed
        from engine.corpus import collect  # type: ignore[no-redef]
    return [f.text for f in collect(max_chars=max_chars).train]


def token_ranking(tokenizer: Any, max_chars: int = 60_000_000, cache_dir: Path | None = None,
                  texts: Iterable[str] | None = None) -> dict:
    """Token ids by frequency over the corpus's training split, most frequent first (ties by id).

    Returns {"ranking": [ids...] (every id of the vocabulary), "counts": [count per ranked id],
    "tokens": total counted, "source": ...}. Cached in `cache_dir` (~/.cache/draftline/selfdraft)
    by tokenizer hash; `texts` replaces the corpus (tests) and skips the cache.
    """
    from engine.gguf import cache_root

    vocab = len(tokenizer)
    path = None
    if texts is None:
        key = tokenizer_hash(tokenizer)
        path = (cache_dir or cache_root() / "selfdraft") / f"{key}-v{RANKING_VERSION}-{max_chars}.json"
        if path.is_file():
            try:
                return json.loads(path.read_text())
            except ValueError as exc:
                log.warning("ignoring the token ranking %s: %s", path, exc)
        started = time.perf_counter()
        texts = _training_texts(max_chars)
        source = f"engine.training.corpus training split, max_chars={max_chars}, {len(texts)} files"
    else:
        texts, source = list(texts), "given texts"
    counts = count_tokens(tokenizer, texts)
    ranking = sorted(range(vocab), key=lambda i: (-counts.get(i, 0), i))
    out = {"ranking": ranking, "counts": [counts.get(i, 0) for i in ranking], "tokens": sum(counts.values()),
           "source": source}
    if path is not None:
        log.info("counted %d tokens for the self draft's head in %.1fs", out["tokens"], time.perf_counter() - started)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(out))
            tmp.replace(path)
        except OSError as exc:
            log.warning("could not keep the token ranking in %s: %s", path, exc)
    return out


def head_ids(tokenizer: Any, k: int, vocab: int | None = None, ranking: dict | None = None) -> torch.Tensor:
    """The K most frequent ids of the training split, plus the tokenizer's special ids (the end
    tokens a completion stops at), sorted; only ids below `vocab` (the head's rows)."""
    ranking = ranking or token_ranking(tokenizer)
    ids = set(ranking["ranking"][:k]) | set(getattr(tokenizer, "all_special_ids", []) or [])
    if vocab is not None:
        ids = {i for i in ids if 0 <= i < vocab}
    return torch.tensor(sorted(ids), dtype=torch.long)
