"""GGUF files as users have them: architectures, quant types, tokenizer kinds and metadata
(rope scaling, context length, tied heads), written here with gguf's GGUFWriter (random weights, tiny
shapes, no downloads), and what draftline does with each: load it and run it the same on the lean
decoder and on transformers, or refuse it with one line that names the file and the reason."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch

from engine import gguf as eg

EOT = "<|endoftext|>"


def _byte_tokens() -> list[str]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    spelling = bytes_to_unicode()
    return [spelling[b] for b in range(256)]


MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "a n", "Ġ =", "e f", "d ef", "Ġ def",
          "Ġ r", "Ġr e", "t u", "Ġre tu", "r n", "Ġretu rn", "Ġ Ġ", "ĠĠ ĠĠ", "Ċ ĠĠ", "ĊĠĠ Ġ"]


@dataclass
class Spec:
    """What one tiny GGUF holds."""

    arch: str = "llama"
    qtype: str = "F32"  # the type of every matrix (norms stay F32, as llama.cpp keeps them)
    tied: bool = False  # no output.weight: the head is the embedding matrix
    tokenizer: str = "gpt2"  # "gpt2" (byte-level BPE with merges) or "llama" (SentencePiece with scores)
    ctx: int = 256
    hidden: int = 64
    ffn: int = 128
    layers: int = 2
    heads: int = 4
    kv: int = 2
    rope_base: float = 10000.0
    bias: bool = False  # q/k/v biases (Qwen2)
    special: tuple[str, ...] = ()  # control tokens appended to the vocabulary (FIM, file separators)
    kv_extra: dict = field(default_factory=dict)  # more metadata: key -> value (ints, floats, strings)
    rope_freqs: np.ndarray | None = None  # llama.cpp's rope_freqs.weight (Llama 3.x's frequency factors)
    seed: int = 0
    drop: tuple[str, ...] = ()  # tensors left out (a file cut short)
    split: int = 0  # at most this many tensors a file (0: one file): llama.cpp's -00001-of-0000N.gguf shards


def _tokens(spec: Spec) -> tuple[list[str], list[float] | None, list[int]]:
    import gguf

    if spec.tokenizer == "gpt2":
        tokens = _byte_tokens()
        for merge in MERGES:
            tokens.append(merge.replace(" ", ""))
        types = [gguf.TokenType.NORMAL] * len(tokens)
        tokens.append(EOT)
        types.append(gguf.TokenType.CONTROL)
        scores = None
    else:  # SentencePiece: <unk> <s> </s>, byte fallbacks, pieces with scores
        tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
        types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] + [gguf.TokenType.BYTE] * 256
        pieces = ["▁", "▁d", "▁de", "▁def", "e", "f", "d", "r", "t", "u", "n", "▁r", "▁re", "▁ret", "▁return",
                  "a", "b", "▁a", "▁b", "(", ")", ":", ",", "▁+", "+", "x", "▁x"]
        tokens += pieces
        types += [gguf.TokenType.NORMAL] * len(pieces)
        scores = [0.0] * 259 + [-float(i) for i in range(len(pieces))]
    for t in spec.special:
        tokens.append(t)
        types.append(gguf.TokenType.CONTROL)
        if scores is not None:
            scores.append(0.0)
    return tokens, scores, [int(t) for t in types]


def _add(w, name: str, value: np.ndarray, qtype: str, rng, drop: tuple[str, ...] = ()) -> None:
    import gguf

    if name in drop:
        return
    kind = gguf.GGMLQuantizationType[qtype]
    if value.ndim == 1 or qtype == "F32":
        w.add_tensor(name, value.astype(np.float32))
    elif qtype == "F16":
        w.add_tensor(name, value.astype(np.float16))
    else:
        try:
            w.add_tensor(name, gguf.quants.quantize(value, kind), raw_dtype=kind)
        except NotImplementedError:  # K and IQ quants: random blocks whose f16 scales stay small and finite
            block, size = gguf.GGML_QUANT_SIZES[kind]
            raw = rng.integers(0, 0x30, size=(value.shape[0], value.shape[1] // block * size), dtype=np.uint8)
            w.add_tensor(name, raw, raw_dtype=kind)


def write_gguf(path: Path, spec: Spec = Spec()) -> Path:
    import gguf

    rng = np.random.default_rng(spec.seed)
    tokens, scores, types = _tokens(spec)
    vocab = len(tokens)
    head_dim = spec.hidden // spec.heads
    w = gguf.GGUFWriter(str(path), spec.arch, split_max_tensors=spec.split)
    w.add_name(f"tiny-{spec.arch}")
    w.add_context_length(spec.ctx)
    w.add_block_count(spec.layers)
    w.add_embedding_length(spec.hidden)
    w.add_feed_forward_length(spec.ffn)
    w.add_head_count(spec.heads)
    w.add_head_count_kv(spec.kv)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(spec.rope_base)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    w.add_tokenizer_model(spec.tokenizer)
    if spec.tokenizer == "gpt2":
        w.add_tokenizer_pre("default")
        w.add_token_merges(MERGES)
        w.add_bos_token_id(tokens.index(EOT))
        w.add_eos_token_id(tokens.index(EOT))
    else:
        w.add_token_scores(scores)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_unk_token_id(0)
    w.add_token_list(tokens)
    w.add_token_types(types)
    for key, value in spec.kv_extra.items():
        if isinstance(value, str):
            w.add_string(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        else:
            w.add_uint32(key, int(value))

    def mat(rows: int, cols: int, scale: float = 0.2) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * scale).astype(np.float32)

    _add(w, "token_embd.weight", mat(vocab, spec.hidden, 1.0), spec.qtype, rng, spec.drop)
    _add(w, "output_norm.weight", 1 + mat(1, spec.hidden, 0.1)[0], "F32", rng, spec.drop)
    if not spec.tied:
        _add(w, "output.weight", mat(vocab, spec.hidden, 0.5), spec.qtype, rng, spec.drop)
    if spec.rope_freqs is not None:
        w.add_tensor("rope_freqs.weight", spec.rope_freqs.astype(np.float32))
    for i in range(spec.layers):
        b = f"blk.{i}."
        _add(w, b + "attn_norm.weight", 1 + mat(1, spec.hidden, 0.1)[0], "F32", rng, spec.drop)
        _add(w, b + "attn_q.weight", mat(spec.hidden, spec.hidden), spec.qtype, rng, spec.drop)
        _add(w, b + "attn_k.weight", mat(spec.kv * head_dim, spec.hidden), spec.qtype, rng, spec.drop)
        _add(w, b + "attn_v.weight", mat(spec.kv * head_dim, spec.hidden), spec.qtype, rng, spec.drop)
        if spec.bias:
            for n, rows in (("q", spec.hidden), ("k", spec.kv * head_dim), ("v", spec.kv * head_dim)):
                _add(w, b + f"attn_{n}.bias", mat(1, rows)[0], "F32", rng, spec.drop)
        _add(w, b + "attn_output.weight", mat(spec.hidden, spec.hidden), spec.qtype, rng, spec.drop)
        _add(w, b + "ffn_norm.weight", 1 + mat(1, spec.hidden, 0.1)[0], "F32", rng, spec.drop)
        _add(w, b + "ffn_gate.weight", mat(spec.ffn, spec.hidden), spec.qtype, rng, spec.drop)
        _add(w, b + "ffn_up.weight", mat(spec.ffn, spec.hidden), spec.qtype, rng, spec.drop)
        _add(w, b + "ffn_down.weight", mat(spec.hidden, spec.ffn), spec.qtype, rng, spec.drop)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(autouse=True)
def _cache(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


def _converted_config(path: Path) -> dict:
    import json

    return json.loads((eg.converted(path) / "config.json").read_text())


@torch.inference_mode()
def _lean_and_transformers(path: Path, prompt: list[int], steps: int = 8):
    """(greedy tokens, last logits) of the lean decoder and of transformers on the converted file, float32."""
    from engine.lean import LeanLM
    from engine.model import CachedLM, load_model

    loaded = load_model(str(path), device="cpu", dtype="float32")
    assert loaded.weights is not None  # the light path: the lean decoder's own reading of the directory
    out = []
    for lm in (LeanLM(loaded.weights, torch.device("cpu"), max_len=256),
               CachedLM(loaded.model, torch.device("cpu"))):
        logits = lm.forward(prompt)
        first = logits.clone()
        tokens = []
        for _ in range(steps):
            tokens.append(int(logits[-1].argmax()))
            logits = lm.forward([tokens[-1]])
        out.append((tokens, first))
    return out


PROMPT = [(i * 37 + 11) % 280 for i in range(120)]  # long enough for scaled RoPE to matter


def _plain_rope_logits(path: Path, prompt: list[int]) -> torch.Tensor:
    """Logits of the same converted weights with RoPE scaling taken out of the config."""
    from transformers import AutoConfig, AutoModelForCausalLM

    out = eg.converted(path)
    config = AutoConfig.from_pretrained(out)
    config.rope_parameters = {"rope_type": "default", "rope_theta": config.rope_parameters["rope_theta"]}
    model = AutoModelForCausalLM.from_pretrained(out, config=config, dtype=torch.float32).eval()
    with torch.inference_mode():
        return model(torch.tensor([prompt])).logits[0]


# ------------------------------------------------------------------------------------------ RoPE


@pytest.mark.parametrize("kind", ["linear", "yarn"])
def test_rope_scaling_metadata_reaches_the_converted_model(tmp_path, kind):
    """transformers' GGUF loader reads `{arch}.rope.scaling.*` for gpt-oss only: a llama or qwen2 file
    that asked for linear or yarn scaling was converted with plain RoPE and ran other numbers than
    llama.cpp runs on the same file, silently."""
    arch = "llama" if kind == "linear" else "qwen2"
    extra = {f"{arch}.rope.scaling.type": kind, f"{arch}.rope.scaling.factor": 4.0}
    if kind == "yarn":
        extra[f"{arch}.rope.scaling.original_context_length"] = 64
    path = write_gguf(tmp_path / f"{kind}.gguf", Spec(arch=arch, bias=arch == "qwen2", kv_extra=extra))
    rope = _converted_config(path)["rope_parameters"]
    assert rope["rope_type"] == kind and rope["factor"] == 4.0 and rope["rope_theta"] == 10000.0
    if kind == "yarn":
        assert rope["original_max_position_embeddings"] == 64
    assert dict(eg.inspect(path).rope)["rope_type"] == kind
    (lean_tokens, lean_logits), (tf_tokens, tf_logits) = _lean_and_transformers(path, PROMPT) if kind == "linear" \
        else [(None, None), (None, None)]
    if kind == "linear":  # the lean decoder runs linear scaling itself, as transformers does
        assert lean_tokens == tf_tokens
        assert torch.allclose(lean_logits, tf_logits, atol=1e-4, rtol=1e-4)
        assert not torch.allclose(_plain_rope_logits(path, PROMPT), tf_logits, atol=1e-2)


LLAMA3_THETA, LLAMA3_HEAD = 500000.0, 16


def _llama3_freqs(factor: float, low: float, high: float, original: int, head_dim: int) -> np.ndarray:
    """rope_freqs.weight as llama.cpp's convert_hf_to_gguf.py writes it for Llama 3's rope scaling."""
    out = []
    for i in range(head_dim // 2):
        wavelen = 2 * np.pi * LLAMA3_THETA ** (2 * i / head_dim)
        if wavelen < original / high:
            out.append(1.0)
        elif wavelen > original / low:
            out.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, np.float32)


@pytest.mark.parametrize("params", [(8.0, 1.0, 4.0, 8192), (16.0, 2.0, 8.0, 8192)], ids=["llama-3.1", "other"])
def test_llama3_rope_freqs_become_llama3_rope_parameters(tmp_path, params):
    """Llama 3.x files carry their RoPE scaling as a rope_freqs.weight tensor, which transformers' loader
    drops: a Llama 3.2 GGUF was converted with plain RoPE. The parameters are recovered from the
    divisors, and both decoders then run them."""
    factor, low, high, original = params
    head_dim = LLAMA3_HEAD if factor == 8.0 else 64
    spec = Spec(rope_base=LLAMA3_THETA, rope_freqs=_llama3_freqs(factor, low, high, original, head_dim),
                hidden=head_dim * 4, heads=4, kv=2)
    path = write_gguf(tmp_path / "llama3.gguf", spec)
    rope = _converted_config(path)["rope_parameters"]
    assert rope["rope_type"] == "llama3" and rope["rope_theta"] == LLAMA3_THETA
    assert (rope["factor"], rope["original_max_position_embeddings"]) == (factor, original)
    # low and high are known up to a common scale with the context length; their divisors are the file's
    want = _llama3_freqs(factor, low, high, original, head_dim)
    assert np.allclose(_llama3_freqs(factor, rope["low_freq_factor"], rope["high_freq_factor"], original, head_dim),
                       want, rtol=1e-5)
    (lean_tokens, lean_logits), (tf_tokens, tf_logits) = _lean_and_transformers(path, PROMPT)
    assert lean_tokens == tf_tokens
    assert torch.allclose(lean_logits, tf_logits, atol=2e-3, rtol=1e-4)  # float32 rounding at logits ~30
    assert not torch.allclose(_plain_rope_logits(path, PROMPT), tf_logits, atol=5e-2)


def test_rope_the_decoders_cannot_express_is_refused_by_name(tmp_path):
    odd = np.ones(8, np.float32)
    odd[2:] = [3.0, 1.5, 8.0, 2.0, 8.0, 8.0]  # not monotone: no Llama 3 parameters give these
    cases = {
        "freqs.gguf": (Spec(rope_freqs=odd), "rope_freqs.weight holds RoPE frequency factors"),
        "longrope.gguf": (Spec(kv_extra={"llama.rope.scaling.type": "longrope"}), "longrope"),
        "su.gguf": (Spec(kv_extra={"llama.rope.scaling.type": "su", "llama.rope.scaling.factor": 2.0}),
                    "RoPE scaling type 'su' is not supported"),
    }
    for name, (spec, reason) in cases.items():
        path = write_gguf(tmp_path / name, spec)
        with pytest.raises(eg.UnsupportedGguf, match=reason) as err:
            eg.inspect(path)
        assert str(err.value).startswith(name) and "\n" not in str(err.value)


def test_plain_rope_files_stay_plain(tmp_path):
    ones = np.ones(8, np.float32)  # a rope_freqs.weight of ones, and scaling "none": nothing to apply
    for name, spec in {"a.gguf": Spec(), "b.gguf": Spec(rope_freqs=ones),
                       "c.gguf": Spec(kv_extra={"llama.rope.scaling.type": "none"})}.items():
        path = write_gguf(tmp_path / name, spec)
        assert eg.inspect(path).rope == ()
    assert _converted_config(path)["rope_parameters"]["rope_type"] == "default"


# ------------------------------------------------------------------------------- files and folders


def test_split_gguf_parts_are_refused_with_how_to_join_them(tmp_path):
    """transformers reads one file: the first part of a split GGUF loaded with the other part's layers
    left at random numbers (a garbage model, and cached as such); the second part said "architecture '?'"."""
    write_gguf(tmp_path / "model.gguf", Spec(split=12))
    parts = sorted(tmp_path.glob("*.gguf"))
    assert [p.name for p in parts] == ["model-00001-of-00002.gguf", "model-00002-of-00002.gguf"]
    for i, part in enumerate(parts):
        with pytest.raises(eg.UnsupportedGguf, match=rf"part {i + 1} of a GGUF split into 2 files.*--merge"):
            eg.inspect(part)
        with pytest.raises(eg.UnsupportedGguf, match="split"):
            eg.converted(part)
    assert not [p for p in (eg.cache_root() / "gguf").iterdir() if p.name != "hashes.json"]


def test_a_file_without_some_of_its_tensors_is_refused_not_filled_with_random_weights(tmp_path):
    path = write_gguf(tmp_path / "short.gguf", Spec(drop=("blk.1.ffn_down.weight",)))
    with pytest.raises(eg.UnsupportedGguf, match=r"short.gguf: the file has no weights for 1 .*layers.1.mlp.down_proj"):
        eg.converted(path)
    assert not [p for p in (eg.cache_root() / "gguf").iterdir() if p.name != "hashes.json"]
    tied = write_gguf(tmp_path / "tied.gguf", Spec(tied=True))  # no output.weight: the head is the embedding
    assert _converted_config(tied)["tie_word_embeddings"] is True


def test_a_folder_holding_a_gguf_file_runs_that_file(tmp_path):
    """A folder as LM Studio keeps one (the .gguf and nothing else) was read as a Hugging Face directory:
    transformers failed asking for sentencepiece or tiktoken."""
    folder = tmp_path / "my models" / "Qwen GGUF"
    folder.mkdir(parents=True)
    path = write_gguf(folder / "model-q8_0.gguf", Spec(qtype="Q8_0"))
    assert eg.resolve_gguf(str(folder)) == path
    from engine.model import load_model

    assert load_model(str(folder), device="cpu", dtype="float32").name == str(path)
    write_gguf(folder / "model-f16.gguf", Spec(qtype="F16"))
    with pytest.raises(eg.UnsupportedGguf, match=r"holds 2 GGUF files \(model-f16.gguf, model-q8_0.gguf\)"):
        eg.resolve_gguf(str(folder))
    (tmp_path / "dir.gguf").mkdir()
    with pytest.raises(eg.UnsupportedGguf, match="dir.gguf: a directory, not a GGUF file"):
        eg.resolve_gguf(str(tmp_path / "dir.gguf"))
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    (hf / "x.gguf").write_bytes(b"GGUF")
    assert eg.resolve_gguf(str(hf)) is None  # a Hugging Face directory stays one


def test_a_refused_conversion_is_not_run_twice(tmp_path, monkeypatch):
    """load_engine asks for the file's architecture (which converts it) and then loads it (which converts
    it): a conversion that ended in a refusal was swallowed by the first and run again by the second."""
    import transformers

    from engine.engine import load_engine

    path = write_gguf(tmp_path / "refused.gguf", Spec())

    def refuse(path, *args):
        raise eg.UnsupportedGguf(f"{path.name}: the converted tokenizer is not the file's own")

    monkeypatch.setattr(eg, "check_vocabulary", refuse)
    calls = []
    real = transformers.AutoModelForCausalLM.from_pretrained

    def counted(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", counted)
    with pytest.raises(eg.UnsupportedGguf, match="refused.gguf: the converted tokenizer is not the file's own"):
        load_engine(str(path), device="cpu")
    assert len(calls) == 1


def test_a_file_without_a_context_length_gets_a_usable_one(tmp_path):
    """`context_length = 0` became max_position_embeddings 0: an engine of capacity 0 whose every
    completion was empty, with no word why."""
    from engine.engine import load_engine

    path = write_gguf(tmp_path / "noctx.gguf", Spec(ctx=0))
    assert _converted_config(path)["max_position_embeddings"] == eg.UNKNOWN_CONTEXT
    assert load_engine(str(path)).capacity > 0
