"""FIM templates per model family and token-budgeted, stable-to-volatile prompt assembly."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Literal, Sequence

from engine.types import CompletionRequest, Snippet


@dataclass(frozen=True)
class FimTemplate:
    """A family's exact fill-in-the-middle tokens and repository-level format."""

    family: str
    prefix: str = ""
    suffix: str = ""
    middle: str = ""
    order: Literal["psm", "spm", "none"] = "psm"  # none = left-to-right, no suffix
    repo_name: str | None = None  # token opening the repository header
    file_sep: str | None = None  # token opening each file (chunks, then the current file)
    path_in_prefix: bool = False  # StarCoder2 puts the current path right after <fim_prefix>
    comment_header: str = "# {path}\n"  # how a snippet is labelled without file tokens
    bos: bool = False  # start with the tokenizer's BOS token
    stop: tuple[str, ...] = ()  # special tokens that end the middle
    split_on: tuple[str, ...] = ()  # text after these is not part of the completion
    # left to right only: the lines after the cursor's line, shown before the current file as another
    # section of it (a model without FIM training still sees what follows the cursor)
    suffix_section: bool = False


QWEN25_CODER = FimTemplate(
    "qwen2.5-coder", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>",
    repo_name="<|repo_name|>", file_sep="<|file_sep|>",
    stop=("<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
          "<|repo_name|>", "<|file_sep|>", "<|im_end|>"),
)
STARCODER2 = FimTemplate(
    "starcoder2", "<fim_prefix>", "<fim_suffix>", "<fim_middle>",
    repo_name="<repo_name>", file_sep="<file_sep>", path_in_prefix=True,
    stop=("<|endoftext|>", "<file_sep>", "<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<fim_pad>"),
)
DEEPSEEK_CODER = FimTemplate(  # full-width bars (U+FF5C) and U+2581, exactly as the tokenizer has them
    "deepseek-coder", "<\uff5cfim\u2581begin\uff5c>", "<\uff5cfim\u2581hole\uff5c>", "<\uff5cfim\u2581end\uff5c>",
    bos=True, stop=("<\uff5cend\u2581of\u2581sentence\uff5c>", "<|EOT|>"),
)
CODELLAMA = FimTemplate(  # infilling exists for 7B/13B only; 34B/70B have the tokens but were not trained
    "codellama", "\u2581<PRE>", "\u2581<SUF>", "\u2581<MID>", bos=True, stop=("\u2581<EOT>", "</s>"),
)
DRAFTLINE = FimTemplate(  # the bundled pair: trained for SPM, so typing only appends to the prompt
    "draftline", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", order="spm",
    file_sep="<|file_sep|>", stop=("<|endoftext|>", "<|file_sep|>", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),
)
SMOLLM = FimTemplate(  # SmolLM/SmolLM2: StarCoder-style file tokens, no FIM: left to right. Measured on 12 held-out stdlib files (a 300-token piece of a sibling file,
    # then 384 tokens of the file): loss 2.31 bare, 1.925 with <repo_name>/<file_sep> headers, 1.926
    # with "# path" comments, 1.938 with <filename>; so the repository format, as StarCoder2 data has it.
    # No <repo_name> header, though: with the workspace folder's name there (request.repo), `bench
    # context --arms digest,digest-norepo --loss` on 280 first-use tasks in 8 packages (2026-12-06)
    # gave exact 37 with it, 41 without (2 gained, 6 lost; 9 lost to 2 over 320 tasks with a second
    # rich seed), edit similarity 0.450 both, answer loss 1.556 vs 1.561. The templates of
    # Qwen2.5-Coder and StarCoder2, whose repository format documents the header, keep it.
    # The lines after the cursor's line come first, as a section of the same path (suffix_section):
    # `bench model --no-bare --windows 1 --tasks 400 --seed S` for seeds 7, 1, 2, against
    # `--suffix-share 0` (2026-12-07): mid-line completions 108 exact of 600 against 90 (better on each
    # seed), infills 42 against 49 (a little worse on each): README, "What follows the cursor".
    "smollm", order="none", file_sep="<file_sep>", suffix_section=True,
    stop=("<|endoftext|>", "<file_sep>", "<filename>", "<repo_name>", "<reponame>", "<|im_start|>", "<|im_end|>"),
)
PLAIN = FimTemplate("plain", order="none")

TEMPLATES = {t.family: t for t in (QWEN25_CODER, STARCODER2, DEEPSEEK_CODER, CODELLAMA, DRAFTLINE, SMOLLM, PLAIN)}


def adds_bos(tokenizer: Any) -> bool:
    """Does the tokenizer, left to itself, start every text with its BOS token?"""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        return False
    try:
        return tokenizer.encode("x", add_special_tokens=True)[:1] == [bos]
    except Exception:
        return False


def detect_template(tokenizer: Any, hint: str = "") -> FimTemplate:
    """Pick the family from the tokenizer's special tokens (a family named in `hint`, the model's file or
    directory name, wins where the tokenizer has its tokens: a folder named "draftline models" or "smollm"
    picked a template whose tokens the model lacked, and every completion failed)."""
    vocab = tokenizer.get_vocab()
    for name, template in TEMPLATES.items():
        if name in hint.lower() and name != "plain" and _has_tokens(template, vocab):
            return template
    if "<|draftline|>" in vocab:
        return DRAFTLINE
    for template in (QWEN25_CODER, STARCODER2, DEEPSEEK_CODER, CODELLAMA):
        if template.prefix in vocab and template.middle in vocab:
            return template
    if SMOLLM.file_sep in vocab and "<filename>" in vocab:  # file tokens without FIM tokens
        return SMOLLM
    return PLAIN


END_OF_TURN = ("<end_of_turn>", "<|eot_id|>", "<|im_end|>", "<|end|>", "<|endoftext|>")


def _has_tokens(template: FimTemplate, vocab: Any) -> bool:
    """Does the vocabulary hold every special token the template writes?"""
    named = (template.prefix, template.suffix, template.middle, template.repo_name, template.file_sep)
    return all(token in vocab for token in named if token)


@dataclass(frozen=True)
class PromptBudget:
    """Token budget of one prompt (the generation budget comes on top)."""

    total: int = 4096
    suffix_share: float = 0.15
    snippet_share: float = 0.35
    margin_share: float = 0.25  # when the window must move, leave this much room to grow into


@dataclass(frozen=True)
class Special:
    token: str


Segment = str | Special


@dataclass
class Prompt:
    segments: list[Segment]
    tokens: list[int] = field(default_factory=list)
    snippets_used: int = 0
    prefix_chars: int = 0  # characters of the request's prefix that made it into the window
    snippets: tuple[Snippet, ...] = ()  # the request's snippets that fit the budget, in prompt order

    def render(self) -> str:
        return "".join(s.token if isinstance(s, Special) else s for s in self.segments)


def assemble(template: FimTemplate, request: CompletionRequest, snippets: Sequence[Snippet],
             prefix: str, suffix: str, bos: str = "") -> list[Segment]:
    """The segments in the family's format, ordered stable -> volatile (the repository header from `request.repo`)."""
    t = template
    seg: list[Segment] = [Special(bos)] if t.bos and bos else []
    if t.repo_name and request.repo:
        seg += [Special(t.repo_name), request.repo + ("\n" if t.family != "starcoder2" else "")]
    for s in snippets:
        if t.file_sep:
            body = s.text if s.text.endswith("\n") or t.family == "starcoder2" else s.text + "\n"
            seg += [Special(t.file_sep), f"{s.path}\n{body}"]
        else:
            seg.append(t.comment_header.format(path=s.path) + s.text.rstrip("\n") + "\n\n")
    path = request.path
    if t.file_sep and path and not t.path_in_prefix:
        if t.order == "none" and t.suffix_section and suffix.strip():
            # the lines after the cursor's (`suffix` is section_text's) as a piece of the same file before it
            seg += [Special(t.file_sep), f"{path}\n{suffix}" + ("" if suffix.endswith("\n") else "\n")]
        seg += [Special(t.file_sep), f"{path}\n"]
    elif t.file_sep and t.path_in_prefix and snippets:
        seg.append(Special(t.file_sep))
    elif not t.file_sep and path and (snippets or t.order == "none"):
        seg.append(t.comment_header.format(path=path))
    if t.order == "none":
        return seg + [prefix]
    head = f"{path}\n{prefix}" if t.path_in_prefix and path else prefix
    if t.order == "spm":
        return seg + [Special(t.suffix), suffix, Special(t.prefix), head, Special(t.middle)]
    return seg + [Special(t.prefix), head, Special(t.suffix), suffix, Special(t.middle)]


def snippet_cost(snippet: Snippet, count: Callable[[str], int]) -> int:
    """Tokens a snippet takes in a prompt: its text, its path and the separators around them."""
    return count(snippet.text) + count(snippet.path) + 3


def fit_snippets(snippets: Sequence[Snippet], budget: int, count: Callable[[str], int]) -> list[Snippet]:
    """The snippets a prompt shows within ``budget`` tokens: in order, each one that still fits."""
    chosen: list[Snippet] = []
    used = 0
    for s in snippets:
        cost = snippet_cost(s, count)
        if used + cost <= budget:
            chosen.append(s)
            used += cost
    return chosen


class PromptBuilder:
    """Builds token prompts whose local window is line-anchored and moves only with hysteresis.

    Keeping the window's first line fixed while the user types means consecutive prompts share
    their longest prefix (SPM: everything but the tail), so the KV cache is reused.
    """

    def __init__(self, template: FimTemplate, tokenizer: Any, budget: PromptBudget = PromptBudget()):
        if not template.bos and adds_bos(tokenizer):
            # a model whose tokenizer opens every text with BOS was trained so: Gemma 3 without it
            # wrote blank lines where, with it, it wrote the function's loop (bench routing)
            template = replace(template, bos=True)
        self.template = template
        self.tokenizer = tokenizer
        self.budget = budget
        self.best_last = True  # snippets (given best first) shown in reverse, the best next to the current file
        self._anchor: dict[str, int] = {}  # uri -> char offset (in the request's prefix) of the window's first line
        # one build encodes the window twice (budget check, then the prompt), and the suffix and
        # snippets come back unchanged keystroke after keystroke: remember recent encodings
        self._encoded = functools.lru_cache(maxsize=128)(self._encode_tuple)
        self._offsets = functools.lru_cache(maxsize=32)(self._offsets_tuple)

    def forget_windows(self) -> None:
        """Drop the windows' anchors: the next prompt of each document is laid out as a first one."""
        self._anchor.clear()

    def _offsets_tuple(self, text: str) -> tuple[tuple[int, int], ...]:
        enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        return tuple(map(tuple, enc["offset_mapping"]))

    def _encode_tuple(self, text: str) -> tuple[int, ...]:
        return tuple(self.tokenizer.encode(text, add_special_tokens=False))

    def encode(self, text: str) -> list[int]:
        return list(self._encoded(text)) if text else []

    def special_id(self, token: str) -> int:
        return int(self.tokenizer.convert_tokens_to_ids(token))

    def stop_ids(self) -> frozenset[int]:
        vocab = self.tokenizer.get_vocab()
        # the template's, and the end-of-turn tokens chat-tuned families end an answer with (a model's
        # own EOS may be another token: Gemma's <end_of_turn> ran on as text under the plain template)
        ids = {vocab[s] for s in (*self.template.stop, *END_OF_TURN) if s in vocab}
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        return frozenset(ids)

    def build(self, request: CompletionRequest, total: int | None = None) -> Prompt:
        """`total`: a smaller token budget than the configured one for this prompt (to leave room for a long answer)."""
        b = self.budget if total is None or total >= self.budget.total else replace(self.budget, total=total)
        count = lambda text: len(self.encode(text))  # noqa: E731
        suffix_budget = int(b.total * b.suffix_share)
        if self.template.order != "none":
            suffix = self._fit_lines(request.suffix, suffix_budget, head=True)
        elif self.template.suffix_section and suffix_budget and request.path:
            # a long rest of file is cut by characters first (a token is rarely under 1 character), at a
            # line end: _fit_lines keeps a text that fits as it is, and the section shows whole lines
            after = section_text(request.suffix)
            if len(after) > suffix_budget * 8:
                after = after[: after.rfind("\n", 0, suffix_budget * 8) + 1]
            suffix = self._fit_lines(after, suffix_budget, head=True) if after.strip() else ""
        else:
            suffix = ""
        chosen = fit_snippets(request.snippets, int(b.total * b.snippet_share), count)
        used = sum(snippet_cost(s, count) for s in chosen)
        header = len(self.encode(request.repo)) + 2 if self.template.repo_name and request.repo else 0
        section = count(request.path) + 2 if suffix and self.template.order == "none" else 0
        prefix_budget = b.total - used - header - section - len(self.encode(suffix)) - 16
        start = self._anchor_window(request, max(prefix_budget, 32))
        prefix = request.prefix[start:]
        bos = self.tokenizer.bos_token or ""
        # the most relevant snippet (they come best first) goes last, next to the current file: on 422
        # first-use tasks in 13 packages SmolLM2's loss of the true line was lower this way in 12
        # (1.52 vs 1.59 nats/token), exact 52 vs 48 (`bench context --arms digest,digest-bestfirst`)
        shown = chosen[::-1] if self.best_last else list(chosen)
        segments = assemble(self.template, request, shown, prefix, suffix, bos=bos)
        tokens = tokens_for(segments, self.encode, self.special_id)
        return Prompt(segments, tokens, len(chosen), len(prefix), tuple(shown))

    def _anchor_window(self, request: CompletionRequest, budget: int) -> int:
        """Start (in request.prefix) of the local window: a line start whose tail fits the budget."""
        text = request.prefix
        key = request.uri or request.path
        prev = self._anchor.get(key)
        if prev is not None:
            rel = prev
            if 0 <= rel <= len(text) and (rel == 0 or text[rel - 1] == "\n") and len(self.encode(text[rel:])) <= budget:
                return rel
        goal = int(budget * (1 - self.budget.margin_share))
        start = self._fit_lines(text, goal, head=False, return_start=True)
        self._anchor[key] = start
        return start

    def _fit_lines(self, text: str, budget: int, head: bool, return_start: bool = False):
        """The longest run of whole lines at the head (or tail) of `text` within `budget` tokens."""
        if not text:
            return 0 if return_start else ""
        offsets = self._offsets(text)
        if len(offsets) <= budget:
            return 0 if return_start else text
        if head:
            cut = offsets[budget][0]  # first character beyond the budget
            nl = text.rfind("\n", 0, cut)
            return text[: nl + 1] if nl >= 0 else text[:cut]
        first = offsets[len(offsets) - budget][0]  # first character inside the budget
        nl = text.find("\n", first)
        start = nl + 1 if 0 <= nl < len(text) - 1 else first
        return start if return_start else text[start:]


_LEADING_BLANK_LINES = re.compile(r"\A(?:[ \t]*\r?\n)+")


def section_text(suffix: str) -> str:
    """What a left-to-right prompt's suffix section shows of the text after the cursor: the lines after
    the cursor's line (the rest of that line alone says little, and the model never sees it next to
    the cursor), from the first one that is not blank (a section does not open a file)."""
    return _LEADING_BLANK_LINES.sub("", suffix.partition("\n")[2])


def render_golden(template: FimTemplate, request: CompletionRequest, bos: str = "<s>") -> str:
    """The prompt as a string (no budgeting; the repository header from `request.repo`; the snippets, given
    best first, in the builder's order: best last): what golden tests compare."""
    suffix = section_text(request.suffix) if template.order == "none" else request.suffix
    return Prompt(assemble(template, request, tuple(request.snippets)[::-1], request.prefix, suffix, bos=bos)).render()


def tokens_for(segments: Sequence[Segment], encode: Callable[[str], list[int]], special: Callable[[str], int]) -> list[int]:
    out: list[int] = []
    for seg in segments:
        out += [special(seg.token)] if isinstance(seg, Special) else encode(seg)
    return out
