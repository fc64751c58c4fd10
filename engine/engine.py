"""Engine.complete(request, cancel): prompt -> speculative decoding -> stop rules -> result."""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from engine.drafters import Drafter, HybridDrafter, ModelDrafter, NgramDrafter
from engine.model import CachedLM, LoadedModel, batched_rows_differ, load_model
from engine.prompt import TEMPLATES, Prompt, PromptBudget, PromptBuilder, detect_template
from engine.slots import PromptSlots
from engine.speculative import AdaptiveGamma, AstAdaptiveGamma, FixedGamma, GrowingGamma, generate
from engine.stops import MAX_LOOP_LINES, REPEATED_LINES, _repetition_end, _scope_end, _StopRules, decode_answer  # noqa: F401 (also imported from here)
from engine.syntax import DepthTracker
from engine.tree import TreeShape, generate_tree, tree_support
from engine.types import CompletionRequest, CompletionResult, CompletionStats, SpecConfig

log = logging.getLogger(__name__)
_SAID_NO_TREE: set[str] = set()  # why a target verifies no token trees, logged once each


@dataclass(frozen=True)
class EngineConfig:
    spec: SpecConfig = field(default_factory=SpecConfig)
    budget: PromptBudget = field(default_factory=PromptBudget)
    template: str = "auto"  # a family name from engine.prompt.TEMPLATES, or auto-detect
    backend: str = "auto"  # transformers | lean | auto (lean where it runs the architecture exactly)
    quant: str = "none"  # lean decoder weights for decode/verify: none (the dtype's) | int8 (CPU, bfloat16)
    remember_completions: int = 16  # previous completions the n-gram drafter may copy from
    # the lean decoder's short forwards (decode, verify, trees) as CUDA graphs on a GPU (engine/graphs.py);
    # off until `draftline bench gpu` has measured it on one; ignored on the CPU, where verify rows stay exact
    # only through one-query-at-a-time attention
    cuda_graphs: bool = False
    # copies of earlier prompts' KV kept for going back to a file (engine.slots; lean decoder only); each
    # holds up to the prompt budget + 64 positions (SmolLM2 on the CPU: ~26 MB each). None: 3 on the CPU,
    # where a cold prompt costs ~0.5 s; 0 on a GPU, which prefills fast and whose memory the copies
    # would take (a 7B model's 4k-token prompt: ~0.25 GB each)
    prompt_slots: int | None = None
    # every field reaches model.options through load_engine: template, backend, quant, cuda_graphs, prompt_tokens
    # (budget.total), snippet_share (budget.snippet_share), remember_completions, prompt_slots, and SpecConfig's


# code that a row probe (engine.model.batched_rows_differ) runs through a backend at load
ROW_PROBE_TEXT = (
    "import json\nfrom pathlib import Path\n\n\ndef load(path):\n    \"\"\"Read a JSON file of records.\"\"\"\n"
    "    with open(path) as fh:\n        data = json.load(fh)\n    return [dict(r, source=str(path)) for r in data]\n\n\n"
    "class Store:\n    def __init__(self, root):\n        self.root = Path(root)\n        self.items = {}\n\n"
    "    def add(self, key, value):\n        self.items[key] = value\n        return value\n")


class Engine:
    """Owns the target, the draft, their caches and the drafters; one caller thread at a time."""

    def __init__(self, target: LoadedModel, draft: LoadedModel | None = None, config: EngineConfig = EngineConfig()):
        self.target = target
        self.draft = draft
        self.config = config
        self.base_spec = config.spec  # as configured; apply_overrides derives config.spec from it
        tok = target.tokenizer
        template = TEMPLATES[config.template] if config.template != "auto" else detect_template(tok, Path(str(target.name)).name)
        if draft is not None:
            check_draft_rows(target, draft)
        shared = min(target.vocab_size, draft.vocab_size) if draft else None
        self.target_lm = make_lm(target, shared, config.backend, config.budget.total, config.quant, config.cuda_graphs)
        self.draft_lm = make_lm(draft, shared, config.backend, config.budget.total, config.quant,
                                config.cuda_graphs) if draft else None
        capacity = min(self.target_lm.capacity, self.draft_lm.capacity if self.draft_lm else 1 << 30)
        budget = config.budget
        reserve = min(512, capacity // 4)  # room to generate within the model's context
        if budget.total > capacity - reserve:
            budget = dataclasses.replace(budget, total=max(256, capacity - reserve))
        self.prompts = PromptBuilder(template, tok, budget)
        self.capacity = capacity
        self.eos = self.prompts.stop_ids()
        # a backend whose batched rows may not be the decode steps (llama.cpp on a quantized GGUF) is
        # probed once; where they differ, speculation would change answers, so it is left off
        self.speculation_off = ""
        if getattr(self.target_lm, "rows_need_probe", False):
            probe = tok.encode(ROW_PROBE_TEXT, add_special_tokens=False)
            if (diff := batched_rows_differ(self.target_lm, probe)) > 0.0:
                self.speculation_off = (f"{type(self.target_lm).__name__}: a verify forward's logits differ from "
                                        f"one-at-a-time decoding by up to {diff:.3g}")
                log.warning("%s; speculation is off on this backend (plain greedy decoding), so that answers "
                            "stay what the model alone gives", self.speculation_off)
        self.ngram = NgramDrafter()
        self.model_drafter = ModelDrafter(self.draft_lm) if self.draft_lm else None
        self.hybrid = HybridDrafter(self.ngram, self.model_drafter, config.spec.min_ngram) if self.model_drafter else None
        self.history: deque[list[int]] = deque(maxlen=config.remember_completions)
        self.generator = torch.Generator().manual_seed(config.spec.seed)
        # a sampling draft model draws from a stream of its own, derived from the same seed: a seed
        # reproduces sampled output whatever else used torch's global generator, and the target's
        # stream (first token, accept/reject, residuals) is not shifted by how many guesses the draft drew
        self.draft_generator = torch.Generator().manual_seed((config.spec.seed + DRAFT_SEED_OFFSET) % (1 << 64))
        # each id's text, for token healing (~0.25 s for 49k ids: paid at load, not by the first request)
        self._token_texts: list[str] | None = self._vocab_texts() if self.template.order == "none" else None
        self._healing: dict[str, torch.Tensor] = {}
        self._boundaries: dict[int, bool] = {}  # token -> does the tokenizer split after it before a word
        self.line_start_probes = LINE_START_PROBES  # () heals a line break as before (bench model --unhealed-line-start)
        self.last_prompt: list[int] = []  # the tokens of the last request's prompt, as the model got them
        slots = config.prompt_slots if config.prompt_slots is not None else 3 if target.device.type == "cpu" else 0
        self.slots = PromptSlots(slots, self.prompts.budget.total + 64)

    def forget(self) -> None:
        """Drop everything a later request could reuse: both models' KV and the remembered
        completions the n-gram drafter copies from. Benchmarks call it between modes, so that no
        mode copies another's output of the same prompt or skips its prefill."""
        self.target_lm.reset()
        if self.draft_lm is not None:
            self.draft_lm.reset()
        self.history.clear()
        self.slots.clear()

    def apply_overrides(self, *, gamma: int | None = None, drafter: str | None = None,
                        target_only: bool = False) -> SpecConfig:
        """The monitor's rollback actions (lsp_server.monitor): the spec later requests run with is
        the configured one under these overrides (SpecConfig.with_overrides); no arguments restore
        it. One attribute swap: a generation already running keeps the spec it started with."""
        spec = self.base_spec.with_overrides(gamma=gamma, drafter=drafter, target_only=target_only)
        self.config = dataclasses.replace(self.config, spec=spec)
        return spec

    @property
    def template(self):
        return self.prompts.template

    def drafter_for(self, spec: SpecConfig) -> Drafter | None:
        if self.speculation_off:
            return None
        if spec.drafter == "ngram":
            return self.ngram
        if spec.drafter in ("draft", "hybrid") and self.model_drafter is None:
            return self.ngram  # no draft model loaded: the free drafter still helps
        if spec.drafter == "draft":
            return self.model_drafter
        if spec.drafter == "hybrid":
            return self.hybrid
        return None

    def complete(self, request: CompletionRequest, cancel: threading.Event, spec: SpecConfig | None = None,
                 drafter: Drafter | None = None) -> CompletionResult:
        """`drafter` replaces the one `spec` names (benchmarks' diagnostic drafters)."""
        spec = spec or self.config.spec
        started = time.perf_counter()
        stats = CompletionStats()
        if cancel.is_set():
            return CompletionResult("", cancelled=True, stop_reason="cancelled", stats=stats)
        limits = request.limits
        prompt = self.prompt_for(request)
        prompt_tokens, heal, allowed = self._heal(prompt.tokens)
        self.last_prompt = prompt_tokens
        room = self.capacity - len(prompt_tokens)
        if room <= 1:
            log.warning("prompt of %d tokens leaves no room in the model's context", len(prompt.tokens))
            return CompletionResult("", stop_reason="context", stats=stats)
        max_lines = 1 if request.mode == "single-line" else limits.max_lines
        context = tuple(prompt_tokens[-1:])  # the answer is decoded after it (stops.decode_answer)
        rules = _StopRules(self.target.tokenizer, limits.stop, max_lines, limits.time_budget_s, limits.min_indent,
                           healed=heal, context=context, closer_words=limits.closer_words,
                           lead_indent=limits.lead_indent)
        if request.mode == "single-line" and spec.single_line_drafter:
            spec = dataclasses.replace(spec, drafter=spec.single_line_drafter)
        drafter = None if self.speculation_off else (drafter or self.drafter_for(spec))
        self.ngram.set_extra(list(self.history))
        self.ngram.min_n = spec.ngram_min
        if self.model_drafter:  # the request's settings (attach() may have replaced the drafter since load)
            self.model_drafter.temperature = spec.temperature
            self.model_drafter.p_min = spec.draft_confidence
            self.model_drafter.generator = self.draft_generator
        gamma = self._gamma_policy(spec, request, prompt.prefix_chars)
        self.slots.choose([self.target_lm, *([self.draft_lm] if self.draft_lm else [])], prompt_tokens)
        draft_before = self.draft_lm.forwards if self.draft_lm else 0
        run = generate
        if spec.tree_nodes > 1 and drafter is not None and hasattr(drafter, "propose_tree"):
            why = tree_support(self.target_lm)
            if why is None:
                run = functools.partial(generate_tree, shape=TreeShape(spec.tree_nodes, spec.tree_depth, spec.tree_branch))
            elif why not in _SAID_NO_TREE:
                _SAID_NO_TREE.add(why)
                log.info("token trees off: %s", why)
        if self.model_drafter:
            self.model_drafter.cancel = cancel  # its cold prefill stops between chunks, as the target's does
        try:
            tokens, reason = run(
                self.target_lm, prompt_tokens, drafter, max_new_tokens=min(limits.max_tokens, room - 1),
                cancel=cancel, gamma=gamma, eos=self.eos, stop_check=rules, temperature=spec.temperature,
                generator=self.generator, stats=stats, first_allowed=allowed,
            )
        finally:
            if self.model_drafter:
                self.model_drafter.cancel = None  # a later direct use must not see this request's flag
        stats.draft_forwards = (self.draft_lm.forwards if self.draft_lm else 0) - draft_before
        stats.generated_tokens = len(tokens)
        del stats.token_logprobs[len(tokens):]  # the last chosen token may not have been emitted
        if tokens and reason != "cancelled":
            self.history.append(tokens)
        text = decode_answer(self.target.tokenizer, tokens, context)
        if heal:  # the healed characters are already in the document
            text = text[len(heal):] if text.startswith(heal) else ""
        text = rules.cut(text, reason)  # the token limit is decided here, not by the rules
        stats.total_s = time.perf_counter() - started
        cancelled = reason == "cancelled"
        return CompletionResult(text, cancelled=cancelled, stop_reason=reason, tokens=tuple(tokens), stats=stats)


    def prompt_for(self, request: CompletionRequest) -> Prompt:
        """The prompt `complete` gives the model for ``request`` (before token healing)."""
        # a long answer (a multi-line or refactor request) gets its room by shortening the prompt, up to half the context
        room_wanted = min(request.limits.max_tokens, self.capacity // 2)
        return self.prompts.build(request, total=max(256, self.capacity - room_wanted))

    def count_tokens(self, text: str) -> int:
        """Tokens ``text`` costs in a prompt (remembered encodings: the completer budgets context with it)."""
        return len(self.prompts.encode(text))

    def snippet_budget(self) -> int:
        """Tokens a prompt gives cross-file snippets."""
        b = self.prompts.budget
        return int(b.total * b.snippet_share)

    def last_prompt_text(self) -> str:
        """The last prompt as text, special tokens included (a healed-away last token is not in it)."""
        return self.target.tokenizer.decode(self.last_prompt, skip_special_tokens=False)

    def _heal(self, tokens: list[int]) -> tuple[list[int], str, torch.Tensor | None]:
        """Token healing for left-to-right prompts: (prompt, healed text, ids the first token may take).

        A cursor after `total += ` ends the prompt with a lone-space token, which a BPE model has
        rarely seen (its text puts the space inside the next word's token, " shape"), so it writes
        something odd. The prompt's last token is taken back and the first generated token must start
        with its text; the text is removed from the answer again (the stop rules never see it). The
        commonest case is a cursor on a fresh indented line: BPE writes "\n    return" as "\n   " +
        " return", so a prompt ending in the token "\n    " is one the model rarely saw; and only
        healing its last space keeps " return" possible: such a token is replaced by its text minus
        the last space (when that is one token, "\n   "), and the first token must start with " ".
        Tab indentation alike: "\n\t\t\t" becomes "\n\t\t" and a first token starting with "\t".
        FIM templates end the prompt with their middle token and are left alone.
        """
        if self.template.order != "none" or len(tokens) < 2 or tokens[-1] in self.eos:
            return tokens, "", None
        if self._token_texts is None:
            self._token_texts = self._vocab_texts()
        heal = self._token_texts[tokens[-1]] if tokens[-1] < len(self._token_texts) else ""
        special = set(self.target.tokenizer.all_special_ids)
        if not heal or "\ufffd" in heal or tokens[-1] in special or self._stable_boundary(tokens[-1], heal):
            return tokens, "", None
        tokens = tokens[:-1]
        if len(heal) > 1 and heal[-1] in " \t":  # a tab too: SmolLM2 writes "\n\t\t\tif" as "\n\t\t" + "\t" + "if"
            head = self.target.tokenizer.encode(heal[:-1], add_special_tokens=False)
            # that very text as one token (a SentencePiece encoder may add a leading space of its own)
            if len(head) == 1 and head[0] < len(self._token_texts) and self._token_texts[head[0]] == heal[:-1]:
                tokens, heal = tokens + head, heal[-1]
        allowed = self._healing.get(heal)
        if allowed is None:
            ids = [i for i, t in enumerate(self._token_texts) if t.startswith(heal) and i not in special]
            allowed = self._healing.setdefault(heal, torch.tensor(ids, dtype=torch.long))
            if len(self._healing) > 4096:
                self._healing.clear()
        return tokens, heal, allowed

    def _stable_boundary(self, token: int, text: str) -> bool:
        """Does the tokenizer end a token here whatever word follows (its own split of text + word
        starts with this very token, for each of BOUNDARY_PROBES, and LINE_START_PROBES after a line break)?
        Then the prompt is as the model saw such text in training and
        healing only adds risk: Gemma writes indentation as its own token ("    ", "files"), and,
        healed, chose a 7-space token on a 4-space line. BPE's "\n    " before " return" is not."""
        known = self._boundaries.get(token)
        if known is None:
            encode = self.target.tokenizer.encode
            words = BOUNDARY_PROBES + (self.line_start_probes if text.endswith(("\n", "\r")) else ())
            known = all(encode(text + word, add_special_tokens=False)[:1] == [token] for word in words)
            self._boundaries[token] = known
        return known

    def _vocab_texts(self) -> list[str]:
        """The text of every id the target's logits cover: healing's allowed ids index those logits,
        which a draft's smaller vocabulary cuts (make_lm's vocab_limit)."""
        tok = self.target.tokenizer
        n = min(self.target.vocab_size, len(tok))
        if (limit := getattr(self.target_lm, "vocab_limit", None)) is not None:
            n = min(n, limit)
        backend = getattr(tok, "_tokenizer", None)
        if backend is not None and hasattr(backend, "decode_batch"):  # the Rust tokenizer: 0.22 s vs 0.29 s
            return backend.decode_batch([[i] for i in range(n)], skip_special_tokens=False)
        return [tok.decode([i]) for i in range(n)]

    def _gamma_policy(self, spec: SpecConfig, request: CompletionRequest, window_chars: int):
        if spec.schedule == "fixed":
            return FixedGamma(spec.gamma)
        if spec.schedule == "grow":
            # starts at 8 whatever spec.gamma says: the powers of two the README's ngram-grow numbers
            # were measured with (bench scenarios' mode leaves gamma at its default, 5)
            return GrowingGamma()
        if spec.schedule == "ast":
            tracker = DepthTracker(request.language)
            window = request.prefix[len(request.prefix) - window_chars:]
            decode = self.target.tokenizer.decode
            return AstAdaptiveGamma(lambda out: tracker.depth(window + decode(out)), spec.gamma, spec.window)
        return AdaptiveGamma(spec.gamma, spec.window)


BACKENDS = ("auto", "lean", "transformers", "llamacpp")
DRAFT_SEED_OFFSET = 1 << 32  # the draft's generator: seed + this (not seed + 1, another run's target seed)
# words that follow a cut in code; a token the tokenizer keeps whole before each of them needs no healing
BOUNDARY_PROBES = ("x", "self", "return", "value", "i", "1", "(", "_", '"', "[", "=", ".", ":", "s")
# and after a line break, indented words: a cursor at column 0 of an empty line ends the prompt with a
# bare "\n", which BPE merges with the next line's indentation ("\n   " + " total"), so a lone "\n" told
# SmolLM2 that the next line starts at column 0, and it wrote `total += v;` unindented in a loop's body
LINE_START_PROBES = ("    x", "\tx")


def make_lm(loaded: LoadedModel, vocab_limit: int | None, backend: str, prompt_budget: int, quant: str = "none",
            cuda_graphs: bool = False):
    """The forward backend for one model: the lean static-cache decoder where it applies, else transformers.

    backend="llamacpp" (optional extra `draftline[llamacpp]`) runs the model's GGUF on llama.cpp.
    `quant` and `cuda_graphs` (a GPU only) apply to the lean decoder only (transformers runs the loaded dtype).
    """
    max_len = min(int(getattr(loaded.config, "max_position_embeddings", 8192)), prompt_budget + 4096)
    if backend == "llamacpp":  # imported only when asked for; a clear ImportError when the extra is missing
        from engine.llamacpp import load_llamacpp_lm

        return load_llamacpp_lm(loaded.name, vocab_limit=vocab_limit, n_ctx=max_len, model=loaded.model)
    from engine import lean

    why = lean.supports(loaded.config)
    if backend == "lean" or (backend == "auto" and why is None):
        source = loaded.weights if loaded.weights is not None else loaded.model
        graphs = cuda_graphs and loaded.device.type == "cuda"
        if cuda_graphs and not graphs:
            log.info("%s: cuda_graphs applies on a GPU only; running eagerly on %s", loaded.name, loaded.device)
        return lean.LeanLM(source, loaded.device, vocab_limit=vocab_limit, max_len=max_len, quant=quant, graphs=graphs)
    if backend == "auto":
        log.info("%s: transformers backend (%s)", loaded.name, why)
    return CachedLM(loaded.model, loaded.device, vocab_limit=vocab_limit)


SPEC_OPTIONS = tuple(f.name for f in dataclasses.fields(SpecConfig))
DRAFTERS = ("none", "ngram", "draft", "hybrid")
SCHEDULES = ("fixed", "adaptive", "ast", "grow")


# Prompt budget (tokens) by device when none is asked for. On this 2-core CPU SmolLM2-135M prefills
# ~700 tokens/s cold, and the first request in a file took 2.2 s p50 at 1,024 tokens (`draftline bench
# lsp`, goal 1.5 s), while single-line quality on held-out code was flat from 512 to 2,048 tokens
# (`draftline bench model --prompt-tokens N`: exact 26 / 26 / 30 %, first word 60 / 60 / 60 %, edit
# similarity 0.66 / 0.64 / 0.65 on 50 completions). GPUs take the full 4k window.
CPU_PROMPT_TOKENS = 512
GPU_PROMPT_TOKENS = 4096
QUANTS = ("auto", "none", "int8", "int4")
LEAN_GGUF_ARCHITECTURES = ("llama", "qwen2")  # llama.cpp's names for what engine.lean runs


def load_engine(target: str, draft: str | None = None, *, device: str | None = None, dtype: str = "auto",
                trust_remote_code: bool = False, config: EngineConfig = EngineConfig(),
                backend: str | None = None, quant: str = "auto", prompt_tokens: int | None = None,
                template: str | None = None, snippet_share: float | None = None, suffix_share: float | None = None,
                remember_completions: int | None = None, cuda_graphs: bool | None = None,
                prompt_slots: int | None = None, prefill_rows: int | None = None, **spec: Any) -> Engine:
    """Load a target (and optional draft sharing its tokenizer) and build an Engine.

    ``draft="self:N"`` drafts with the target's own first N layers and its head (``"self:N:K"``: a
    head over the K most frequent tokens), sharing the target's weights (engine.selfdraft; lean decoder only).
    ``draft="eagle"`` drafts with the shipped EAGLE layer for the default model, ``"eagle:PATH"`` with
    another (engine.eagle; lean decoder only).

    ``backend`` (auto | lean | transformers | llamacpp) overrides ``config.backend``, and SpecConfig
    fields (``drafter``, ``schedule``, ``gamma``, ``draft_confidence``, ...) override ``config.spec``,
    so that the server's ``model.options = { backend = "llamacpp", drafter = "ngram" }`` reaches them.
    A model from a GGUF file on the CPU runs, by default ("auto"), in bfloat16 with int8 weights (with
    the native kernels; without them int4 for a file of 4-bit blocks) for decode and verify (``quant``); other models keep float32 there. ``prompt_tokens`` caps the
    prompt (default: CPU_PROMPT_TOKENS on the CPU, GPU_PROMPT_TOKENS on a GPU); ``snippet_share`` is
    the share of it cross-file context may take, ``suffix_share`` the share the code after the cursor may
    take (a FIM suffix; for SmolLM, the lines after the cursor's line as a section before the current
    file; 0: none); ``template`` names the prompt format (a family of
    engine.prompt.TEMPLATES) where detection from the tokenizer is wrong. ``cuda_graphs`` replays the lean
    decoder's decode and verify forwards as CUDA graphs on a GPU (engine.graphs). ``prompt_slots``: how
    many earlier prompts' KV are kept for going back to a file (engine.slots; 0: none). ``prefill_rows``:
    the most tokens a lean decoder with int8/int4 weights runs a prompt in at once (LeanLM.prefill_rows:
    by default INT8_MAX_ROWS, the decode kernels, so a warm cache answers what a cold one does; 0: long
    chunks on the dense weights, faster where bf16 matrix kernels are, warm and cold may differ).
    """
    if prefill_rows is not None and (isinstance(prefill_rows, bool) or not isinstance(prefill_rows, int)
                                     or prefill_rows < 0):
        raise ValueError(f"prefill_rows must be an int >= 0, not {prefill_rows!r}")
    if unknown := sorted(set(spec) - set(SPEC_OPTIONS)):
        raise ValueError(f"unknown engine option(s) {', '.join(unknown)}; known: {', '.join(SPEC_OPTIONS)}")
    if spec:
        config = dataclasses.replace(config, spec=dataclasses.replace(config.spec, **spec))
    if config.spec.drafter not in DRAFTERS or config.spec.schedule not in SCHEDULES or \
            config.spec.single_line_drafter not in ("", *DRAFTERS):
        raise ValueError(f"drafter must be one of {', '.join(DRAFTERS)} and schedule one of {', '.join(SCHEDULES)}, "
                         f"not {config.spec.drafter!r} / {config.spec.schedule!r}")
    if backend is not None:
        config = dataclasses.replace(config, backend=backend)
    if template is not None:
        if template not in TEMPLATES and template != "auto":
            raise ValueError(f"template must be auto or one of {', '.join(TEMPLATES)}, not {template!r}")
        config = dataclasses.replace(config, template=template)
    if snippet_share is not None:
        if not 0.0 <= snippet_share < 1.0:
            raise ValueError(f"snippet_share must be in [0, 1), not {snippet_share!r}")
        config = dataclasses.replace(config, budget=dataclasses.replace(config.budget, snippet_share=snippet_share))
    if suffix_share is not None:
        if not 0.0 <= suffix_share < 1.0:
            raise ValueError(f"suffix_share must be in [0, 1), not {suffix_share!r}")
        config = dataclasses.replace(config, budget=dataclasses.replace(config.budget, suffix_share=suffix_share))
    if remember_completions is not None:
        config = dataclasses.replace(config, remember_completions=max(0, int(remember_completions)))
    if prompt_slots is not None:
        if not isinstance(prompt_slots, int) or isinstance(prompt_slots, bool) or prompt_slots < 0:
            raise ValueError(f"prompt_slots must be a whole number >= 0, not {prompt_slots!r}")
        config = dataclasses.replace(config, prompt_slots=prompt_slots)
    if cuda_graphs is not None:
        if not isinstance(cuda_graphs, bool):
            raise ValueError(f"cuda_graphs must be true or false, not {cuda_graphs!r}")
        config = dataclasses.replace(config, cuda_graphs=cuda_graphs)
    if config.backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, not {config.backend!r}")
    if quant not in QUANTS:
        raise ValueError(f"quant must be one of {', '.join(QUANTS)}, not {quant!r}")
    from engine.gguf import resolve_gguf
    from engine.gguf import architecture as gguf_architecture
    from engine.model import pick_device

    on_cpu = pick_device(device).type == "cpu"
    gguf_file = resolve_gguf(target) if on_cpu and config.backend in ("auto", "lean") else None
    # int8 weights live in the lean decoder: a GGUF of another architecture (Gemma 3) keeps float32 on
    # transformers, where bf16 wrote mis-indented code (Gemma-3-270M, 2026-12-05) and is opt-in
    quantized_source = gguf_file is not None and gguf_architecture(gguf_file) in LEAN_GGUF_ARCHITECTURES
    if quant == "auto" and quantized_source and dtype in ("auto", "bfloat16"):
        # With draftline's native kernels (engine/native.py), int8: on a 2-core AVX2 VM (2026-12-07,
        # `draftline bench quant`) SmolLM2's Q4_1 decoded at 19.4 ms/token with them in int8, 20.1 in
        # int4, 25.2 on torch's int4 kernel, and a 5-row verify cost 1.66 / 1.91 / 2.46 decode steps.
        # Without them, a file of 4-bit blocks decodes with torch's int4 kernel (12.4 vs 16.3 ms/token
        # for int8 on an AVX-512 VM; held-out quality the same: README), finer files with int8.
        from engine import native
        from engine.gguf import decode_quant, quant_types

        quant = "int8" if native.lib() is not None else decode_quant(quant_types(gguf_file))
    elif quant == "auto":
        quant = "none"
    if quant in ("int8", "int4") and dtype == "auto":
        dtype = "bfloat16"
    config = dataclasses.replace(config, quant=quant)
    if prompt_tokens or config.budget.total == PromptBudget().total:  # a caller's own budget stays
        total = prompt_tokens or (CPU_PROMPT_TOKENS if on_cpu else GPU_PROMPT_TOKENS)
        config = dataclasses.replace(config, budget=dataclasses.replace(config.budget, total=total))
    from engine import eagle
    from engine.selfdraft import attach, parse_self_draft

    self_draft = parse_self_draft(draft or "")  # "self:N[:K]": the target's first N layers (engine.selfdraft)
    eagle_draft = eagle.parse_eagle_draft(draft or "")  # "eagle[:PATH]": a trained EAGLE layer (engine.eagle)
    if self_draft is not None or eagle_draft is not None:
        if config.backend not in ("auto", "lean"):
            raise ValueError(f"draft {draft!r} runs on the lean decoder, not backend {config.backend!r}")
        draft = None
    tgt = load_model(target, device=device, dtype=dtype, trust_remote_code=trust_remote_code)
    drf = load_model(draft, device=device, dtype=dtype, trust_remote_code=trust_remote_code) if draft else None
    if drf is not None:
        check_shared_tokenizer(tgt, drf)
    engine = Engine(tgt, drf, config)
    if prefill_rows is not None:  # the lean decoder's prompt pieces (LeanLM.prefill_rows; 0: dense chunks)
        for lm in (engine.target_lm, getattr(engine, "draft_lm", None)):
            if hasattr(lm, "prefill_rows"):
                lm.prefill_rows = prefill_rows
    if self_draft is not None:
        attach(engine, *self_draft)
    if eagle_draft is not None:
        eagle.attach(engine, eagle_draft)
    return engine


def check_draft_rows(target: LoadedModel, draft: LoadedModel) -> None:
    """Refuse a draft with fewer rows of logits than the target has real tokens.

    Both models' logits are cut to the rows they share (make_lm's vocab_limit), the target's too, so
    that its verify and the draft's guesses index one vocabulary: a target token above the cut could
    never be emitted, and answers would differ from the target's alone (CodeLlama-7B's <EOT> is id
    32010 of 32,016; a 32,000-row Llama-2 draft would cut it off). Rows past the target's tokenizer
    are padding no token uses (Qwen2.5-Coder 7B: 152,064 rows, 151,665 tokens; its 0.5B draft has
    151,936 rows), so cutting those changes nothing and such a pair still runs."""
    shared = min(target.vocab_size, draft.vocab_size)
    real = min(target.vocab_size, len(target.tokenizer))
    if real > shared:
        raise ValueError(f"draft {draft.name} has {draft.vocab_size} rows of logits but target {target.name} has "
                         f"{real} tokens: the target could never emit its {real - shared} ids from {shared} on "
                         "with this draft; use a draft with the target's whole vocabulary")


def check_shared_tokenizer(target: LoadedModel, draft: LoadedModel) -> None:
    """Draft and target must map text to the same ids (embedding rows may differ)."""
    probe = "def main(argv):\n    return {'a': [1, 2.5]}  # ünïcode\n"
    a, b = target.tokenizer.encode(probe), draft.tokenizer.encode(probe)
    if a != b:
        raise ValueError(f"draft {draft.name} does not share the target's tokenizer ({target.name})")
