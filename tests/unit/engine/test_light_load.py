"""A model directory the lean decoder runs loads without transformers, and runs the same model."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading

import pytest
import torch

from engine.bundled import tiny_pair
from engine.lean import LeanLM, Weights
from engine.model import load_model
from engine.speculative import generate
from engine.tokenizer import FastTokenizer
from tests.unit.engine.conftest import CPU, tiny_model

TEXTS = [
    "def main(argv):\n    return {'a': [1, 2.5]}  # ünïcode\n",
    "<|endoftext|>x = 1<|fim_prefix|>  don't  stop .  , ?\n\t\ttabs\r\n",
    "class Foo(Bar):\n    \"\"\"Doc.\"\"\"\n\n    def __init__(self):\n        self.x = None\n",
    "",
    "日本語のテキスト 🙂 and emoji",
]


def _dirs(model_dirs):
    out = [model_dirs["target"]]
    pair = tiny_pair()
    if pair:
        out.append(pair[0])
    return out


def test_fast_tokenizer_matches_transformers(model_dirs):
    from transformers import AutoTokenizer

    for d in _dirs(model_dirs):
        ref, fast = AutoTokenizer.from_pretrained(d), FastTokenizer.load(d)
        assert fast is not None, d
        for text in TEXTS:
            for special in (True, False):
                assert fast.encode(text, add_special_tokens=special) == ref.encode(text, add_special_tokens=special)
            a = ref(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
            b = fast(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
            assert [tuple(x) for x in a] == [tuple(x) for x in b]
        rng = random.Random(0)
        for _ in range(20):
            ids = [rng.randrange(len(ref)) for _ in range(rng.randrange(1, 200))]
            for skip in (True, False):
                assert fast.decode(ids, skip_special_tokens=skip) == ref.decode(ids, skip_special_tokens=skip)
        assert fast.get_vocab() == ref.get_vocab() and len(fast) == len(ref)
        assert fast.all_special_ids == ref.all_special_ids
        assert (fast.eos_token_id, fast.bos_token, fast.bos_token_id) == (ref.eos_token_id, ref.bos_token, ref.bos_token_id)
        for token in ("<|file_sep|>", "<|fim_prefix|>", "not-a-token-at-all"):
            assert fast.convert_tokens_to_ids(token) == ref.convert_tokens_to_ids(token)


def test_other_tokenizer_classes_go_to_transformers(model_dirs, tmp_path):
    import shutil

    for f in model_dirs["target"].iterdir():
        shutil.copy(f, tmp_path / f.name)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, "tokenizer_class": "LlamaTokenizerFast"}))
    assert FastTokenizer.load(tmp_path) is None
    loaded = load_model(str(tmp_path))
    assert loaded.weights is None and loaded._model is not None  # transformers loaded it, as before



@pytest.mark.parametrize("kind", ["TokenizersBackend", "GPT2Tokenizer", "Qwen2Tokenizer"])
def test_add_prefix_space_either_matches_transformers_or_goes_to_it(model_dirs, tmp_path, kind):
    """`add_prefix_space` in tokenizer_config.json was ignored here: transformers' GPT-2 and Qwen2 classes
    encoded "hello" as " hello" and this class as "hello". Whatever the config and tokenizer.json say,
    the light tokenizer encodes as AutoTokenizer does, or leaves the directory to transformers."""
    import shutil

    from transformers import AutoTokenizer

    for config_says in (None, False, True):
        for json_says in (False, True):
            d = tmp_path / f"{config_says}-{json_says}"
            d.mkdir()
            for f in model_dirs["target"].glob("tokenizer*"):
                shutil.copy(f, d / f.name)
            spec = json.loads((d / "tokenizer.json").read_text())
            assert spec["pre_tokenizer"]["type"] == "ByteLevel"
            spec["pre_tokenizer"]["add_prefix_space"] = json_says
            (d / "tokenizer.json").write_text(json.dumps(spec))
            config = {**json.loads((d / "tokenizer_config.json").read_text()), "tokenizer_class": kind}
            if config_says is not None:
                config["add_prefix_space"] = config_says
            (d / "tokenizer_config.json").write_text(json.dumps(config))
            fast, ref = FastTokenizer.load(d), AutoTokenizer.from_pretrained(d)
            if config_says:
                assert fast is None, (config_says, json_says)
            if fast is not None:
                for text in ("hello world", TEXTS[0]):
                    assert fast.encode(text) == ref.encode(text), (config_says, json_says, text)

def test_light_load_runs_the_same_model(model_dirs):
    loaded = load_model(str(model_dirs["target"]))
    assert loaded.weights is not None and loaded._model is None  # no transformers model built
    light = LeanLM(loaded.weights, CPU, max_len=256)
    assert loaded.vocab_size == light.rows and loaded.config.num_hidden_layers == 2
    model = loaded.model  # asked for: transformers loads it then
    heavy = LeanLM(model, CPU, max_len=256)
    prompt = list(range(5, 60))
    assert torch.equal(light.forward(prompt), heavy.forward(prompt))
    a = generate(light, prompt, None, max_new_tokens=20, cancel=threading.Event())
    b = generate(heavy, prompt, None, max_new_tokens=20, cancel=threading.Event())
    assert a == b


@pytest.mark.parametrize("quant", ["int8", "int4"])
def test_quantized_weights_are_cached_between_starts(tmp_path, monkeypatch, quant):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    model = tiny_model("llama", seed=7, hidden=64).to(torch.bfloat16)
    model.save_pretrained(tmp_path / "m")
    first = Weights.from_dir(tmp_path / "m", torch.bfloat16, CPU)
    from engine import native
    from engine.lean import quant_cache_key

    nat = native.lib() is not None  # the lean decoder's default
    cache = first.cache_file(quant_cache_key(quant, nat))
    assert not cache.exists()
    a = LeanLM(first, CPU, max_len=128, quant=quant)
    other = quant_cache_key("int8" if quant == "int4" else "int4", nat)
    assert cache.is_file() and not first.cache_file(other).exists()
    second = Weights.from_dir(tmp_path / "m", torch.bfloat16, CPU)
    assert second.cache_file(quant_cache_key(quant, nat)) == cache
    b = LeanLM(second, CPU, max_len=128, quant=quant)
    c = LeanLM(model, CPU, max_len=128, quant=quant)  # computed afresh from the transformers model
    for x, y in ((a, b), (a, c)):
        assert torch.equal(x.lm_head.q, y.lm_head.q) and torch.equal(x.layers[1][1].s, y.layers[1][1].s)
        assert torch.equal(x.layers[1][1].q, y.layers[1][1].q) and x.layers[1][1].int4 == y.layers[1][1].int4
    # the kernels load their operands with aligned vector loads: tensors read back from the cache
    # (8 bytes off in the file) must not reach them as they lie there (SIGSEGV on SmolLM2's head)
    for lin in [b.lm_head] + [layer[i] for layer in b.layers for i in (1, 2, 4, 5)]:
        assert lin.q.data_ptr() % 64 == 0 and lin.s.data_ptr() % 64 == 0
    prompt = [3, 9, 4, 11, 20, 21]
    assert torch.equal(b.forward(prompt), c.forward(prompt))
    cache.write_bytes(b"garbage")  # a damaged cache is recomputed, never fatal
    d = LeanLM(Weights.from_dir(tmp_path / "m", torch.bfloat16, CPU), CPU, max_len=128, quant=quant)
    assert torch.equal(d.lm_head.q, a.lm_head.q)


def test_engine_start_imports_no_transformers(model_dirs):
    code = (
        "import sys\n"
        "from engine.engine import load_engine\n"
        f"engine = load_engine({str(model_dirs['target'])!r})\n"
        "assert type(engine.target_lm).__name__ == 'LeanLM'\n"
        "print(sorted(m for m in sys.modules if m == 'transformers' or m.startswith('transformers.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("backend", ["transformers"])
def test_transformers_backend_still_loads_the_model(model_dirs, backend):
    from engine.engine import load_engine

    engine = load_engine(str(model_dirs["target"]), backend=backend)
    assert type(engine.target_lm).__name__ == "CachedLM" and engine.target._model is not None


@pytest.mark.parametrize("quant", ["int8", "int4"])
def test_a_cache_written_for_another_layout_is_recomputed_not_read(tmp_path, monkeypatch, quant):
    """An int4 cache's int8 head written in plain rows, read later as the native kernels' tiles, gave
    garbage logits (bench quant: the int4 arm's top-1 0 %): the layout is in the file and is checked."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from engine import native
    from engine.lean import packed_layout, quant_cache_key

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    model = tiny_model("llama", seed=7, hidden=64).to(torch.bfloat16)
    model.save_pretrained(tmp_path / "m")
    nat = native.lib() is not None
    weights = Weights.from_dir(tmp_path / "m", torch.bfloat16, CPU)
    fresh = LeanLM(weights, CPU, max_len=128, quant=quant)
    cache = weights.cache_file(quant_cache_key(quant, nat))
    with safe_open(cache, framework="pt") as f:
        assert f.metadata()["layout"] == packed_layout(nat)
    tensors = load_file(cache)
    tensors["lm_head.q"] = torch.flip(tensors["lm_head.q"], [0]).contiguous()  # what another layout's bytes look like
    save_file(tensors, str(cache), metadata={"layout": "native:q8-rows;q4_1-blocks"})  # an older layout
    again = LeanLM(Weights.from_dir(tmp_path / "m", torch.bfloat16, CPU), CPU, max_len=128, quant=quant)
    assert torch.equal(again.lm_head.q, fresh.lm_head.q)
    prompt = [3, 9, 4, 11, 20, 21]
    assert torch.equal(again.forward(prompt), fresh.forward(prompt))
    with safe_open(cache, framework="pt") as f:  # and the file is written again in this layout
        assert f.metadata()["layout"] == packed_layout(nat)
