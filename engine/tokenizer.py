"""A model directory's tokenizer without importing transformers.

transformers' import costs ~3 s on this 2-core CPU (its model registry pulls in torch.distributed
and dynamo), most of a warm start. For a directory whose tokenizer is a plain `tokenizer.json`
(transformers' "TokenizersBackend" / PreTrainedTokenizerFast and the byte-level BPE classes that
add nothing of their own), the `tokenizers` library alone gives the same ids and texts; this class
is the slice of the transformers tokenizer API draftline uses. Other tokenizer classes (SentencePiece
ones, Llama's legacy handling, ...) return None from `load`, and transformers loads them as before.
tests/unit/engine/test_light_load.py checks it against AutoTokenizer on the models at hand.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Sequence

log = logging.getLogger(__name__)

# tokenizer_config.json classes whose behaviour is tokenizer.json's alone (transformers 5.x)
PLAIN_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast", "GPT2Tokenizer", "GPT2TokenizerFast",
                 "Qwen2Tokenizer", "Qwen2TokenizerFast")
SPECIAL_ATTRS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def _content(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, or an AddedToken dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _prefix_space(spec: Path) -> bool:
    """Does tokenizer.json's pre-tokenizer (or a step of its sequence) add a space before the text?"""
    try:
        pre = json.loads(spec.read_text()).get("pre_tokenizer") or {}
    except ValueError:
        return True  # unreadable here: let transformers say
    return any(isinstance(step, dict) and step.get("add_prefix_space") for step in pre.get("pretokenizers") or [pre])


class FastTokenizer:
    """encode / decode / get_vocab / special ids over a `tokenizers.Tokenizer`, as transformers does them."""

    def __init__(self, backend: Any, config: dict):
        self._tokenizer = backend
        self.config = config
        self.clean_up_tokenization_spaces = bool(config.get("clean_up_tokenization_spaces", False))
        for attr in SPECIAL_ATTRS:
            setattr(self, attr, _content(config.get(attr)))
        extra = config.get("extra_special_tokens") or config.get("additional_special_tokens") or []
        if isinstance(extra, dict):  # named extras ({"image_token": "<image>"})
            extra = list(extra.values())
        self.extra_special_tokens = [t for t in (_content(x) for x in extra) if t]

    @classmethod
    def load(cls, directory: str | Path) -> FastTokenizer | None:
        """The directory's tokenizer, or None when transformers must load it (no tokenizer.json, or a class
        that changes what tokenizer.json says)."""
        directory = Path(directory)
        spec, config_file = directory / "tokenizer.json", directory / "tokenizer_config.json"
        if not spec.is_file():
            return None
        try:
            config = json.loads(config_file.read_text()) if config_file.is_file() else {}
        except ValueError:
            return None
        kind = config.get("tokenizer_class") or "PreTrainedTokenizerFast"
        if kind not in PLAIN_CLASSES or config.get("auto_map"):
            return None
        # transformers' GPT-2 and Qwen2 classes rebuild the pre-tokenizer with the config's add_prefix_space
        # (default false) whatever tokenizer.json says: "hello" then encodes as " hello" there and not
        # here, or the other way round. Where either side asks for the space, transformers loads it.
        if config.get("add_prefix_space") or (kind not in ("TokenizersBackend", "PreTrainedTokenizerFast")
                                              and _prefix_space(spec)):
            return None
        from tokenizers import Tokenizer

        return cls(Tokenizer.from_file(str(spec)), config)

    # the transformers API draftline uses
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def __call__(self, text: str, add_special_tokens: bool = True, return_offsets_mapping: bool = False) -> dict[str, list]:
        enc = self._tokenizer.encode(text, add_special_tokens=add_special_tokens)
        out: dict[str, list] = {"input_ids": enc.ids, "attention_mask": [1] * len(enc.ids)}
        if return_offsets_mapping:  # character offsets into `text`, as transformers gives them
            out["offset_mapping"] = enc.offsets
        return out

    def decode(self, ids: Sequence[int] | Any, skip_special_tokens: bool = False) -> str:
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        if isinstance(ids, int):
            ids = [ids]
        text = self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)
        return self._clean_up(text) if self.clean_up_tokenization_spaces else text

    @staticmethod
    def _clean_up(text: str) -> str:  # transformers' English-space clean-up, for configs that ask for it
        for a, b in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                     (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
            text = text.replace(a, b)
        return text

    def get_vocab(self) -> dict[str, int]:
        return self._tokenizer.get_vocab(with_added_tokens=True)

    def __len__(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def convert_tokens_to_ids(self, token: str) -> int | None:
        found = self._tokenizer.token_to_id(token)
        if found is None and self.unk_token is not None:
            return self._tokenizer.token_to_id(self.unk_token)
        return found

    def convert_ids_to_tokens(self, ids: int | Sequence[int]):
        if isinstance(ids, int):
            return self._tokenizer.id_to_token(ids)
        return [self._tokenizer.id_to_token(i) for i in ids]

    def _id(self, token: str | None) -> int | None:
        return self._tokenizer.token_to_id(token) if token is not None else None

    @property
    def bos_token_id(self) -> int | None:
        return self._id(self.bos_token)

    @property
    def eos_token_id(self) -> int | None:
        return self._id(self.eos_token)

    @property
    def unk_token_id(self) -> int | None:
        return self._id(self.unk_token)

    @property
    def pad_token_id(self) -> int | None:
        return self._id(self.pad_token)

    @property
    def all_special_tokens(self) -> list[str]:
        named = [getattr(self, a) for a in SPECIAL_ATTRS]
        out: list[str] = []
        for token in [*named, *self.extra_special_tokens]:
            if token is not None and token not in out:
                out.append(token)
        return out

    @property
    def all_special_ids(self) -> list[int]:
        return [i for i in (self._id(t) for t in self.all_special_tokens) if i is not None]
