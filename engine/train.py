"""Training for the bundled pair: the byte-level BPE tokenizer (models come with the models issue)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

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
