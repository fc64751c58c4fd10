"""Tiny random-init models (fp32) for exact logic tests: no weights, no network."""

from __future__ import annotations

import pytest
import torch

from engine.model import CachedLM

CPU = torch.device("cpu")


def tiny_model(family: str = "llama", vocab: int = 96, seed: int = 0, layers: int = 2, hidden: int = 32):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    if family == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    else:
        model = LlamaForCausalLM(LlamaConfig(**common))
    with torch.no_grad():  # sharpen the random logits so greedy paths are not near-ties
        model.lm_head.weight.mul_(8.0)
    return model.eval()


@torch.inference_mode()
def naive_greedy(model, prompt: list[int], n: int) -> list[int]:
    """Reference: recompute the whole sequence every step, no cache at all."""
    seq = list(prompt)
    for _ in range(n):
        logits = model(torch.tensor([seq])).logits[0, -1]
        seq.append(int(torch.argmax(logits)))
    return seq[len(prompt):]


@pytest.fixture(scope="session")
def llama():
    return tiny_model("llama", seed=1)


@pytest.fixture(scope="session")
def qwen2():
    return tiny_model("qwen2", seed=2)


def cached(model, vocab_limit=None) -> CachedLM:
    return CachedLM(model, CPU, vocab_limit=vocab_limit)


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory):
    """A small byte-level BPE (the bundled family's special tokens) trained on a few stdlib files."""
    import json as json_mod
    from pathlib import Path

    from engine.training.train import train_tokenizer

    out = tmp_path_factory.mktemp("tok")
    src = Path(json_mod.__file__).parent
    texts = [p.read_text() for p in sorted(src.glob("*.py"))]
    train_tokenizer(texts, 600, out)
    return out


@pytest.fixture(scope="session")
def model_dirs(tokenizer_dir, tmp_path_factory):
    """A random-init target and draft saved as HF directories sharing the tokenizer."""
    import shutil

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    dirs = {}
    for name, (layers, hidden, seed) in {"target": (2, 48, 11), "draft": (1, 16, 12)}.items():
        model = tiny_model("llama", vocab=len(tok), seed=seed, layers=layers, hidden=hidden)
        d = tmp_path_factory.mktemp(name)
        model.save_pretrained(d)
        for f in tokenizer_dir.iterdir():
            shutil.copy(f, d / f.name)
        dirs[name] = d
    return dirs
