"""engine/gguf.py's conversion directory: the file's own tokenizer whatever lies beside it, a check that
the tokenizer fits the model, conversions racing for one directory, and remembered directory hashes
(engine/llamacpp.py's model_hash)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from engine import gguf as eg
from tests.unit.engine.test_gguf import _write_tiny_llama


@pytest.fixture(autouse=True)
def _cache(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@pytest.fixture
def tiny(tmp_path):
    (tmp_path / "models").mkdir()
    return _write_tiny_llama(tmp_path / "models" / "tiny-llama.gguf")


def test_a_tokenizer_lying_beside_the_file_is_not_the_one_converted(tiny, tokenizer_dir):
    """transformers preferred a tokenizer.json in the file's folder to the file's own vocabulary: the
    279-token GGUF beside another model's tokenizer got that tokenizer's 600+ tokens."""
    for f in tokenizer_dir.iterdir():  # another model's tokenizer.json and tokenizer_config.json
        shutil.copy(f, tiny.path.parent / f.name)
    out = eg.converted(tiny.path)
    spec = json.loads((out / "tokenizer.json").read_text())
    vocab = {**spec["model"]["vocab"], **{t["content"]: t["id"] for t in spec["added_tokens"]}}
    assert len(vocab) == tiny.vocab == json.loads((out / "config.json").read_text())["vocab_size"]
    assert all(vocab[t] == i for i, t in enumerate(tiny.tokens))
    assert sorted(p.name for p in out.parent.iterdir() if p.suffix == ".tmp") == []  # the scratch folder is gone
    assert sorted(p.name for p in tiny.path.parent.iterdir()) == sorted(  # nothing written beside the file
        [tiny.path.name] + [f.name for f in tokenizer_dir.iterdir()])


def test_a_tokenizer_that_does_not_fit_the_model_is_refused_before_anything_is_written(tiny, tokenizer_dir,
                                                                                         monkeypatch):
    import transformers

    foreign = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    assert len(foreign) > tiny.vocab
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: foreign)
    with pytest.raises(eg.UnsupportedGguf, match=rf"{len(foreign)} tokens but the model only {tiny.vocab} rows"):
        eg.converted(tiny.path)
    assert [p.name for p in (eg.cache_root() / "gguf").iterdir()] == ["hashes.json"]


def test_check_vocabulary_compares_the_file_s_tokens():
    class Tok:
        def __init__(self, tokens):
            self.tokens = tokens

        def __len__(self):
            return len(self.tokens)

        def convert_ids_to_tokens(self, ids):
            return [self.tokens[i] for i in ids]

    path = Path("x.gguf")
    tokens = [f"t{i}" for i in range(300)]
    eg.check_vocabulary(path, Tok(tokens), 300, tokens)
    eg.check_vocabulary(path, Tok(tokens), 320, None)  # a file without a token list: the size check only
    respelled = tokens[:5] + ["\u2581"] * 3 + tokens[8:]  # a few respelled on purpose (Gemma's whitespace)
    eg.check_vocabulary(path, Tok(respelled), 300, tokens)
    with pytest.raises(eg.UnsupportedGguf, match="at 300 of 300 ids"):
        eg.check_vocabulary(path, Tok(tokens[::-1]), 300, tokens)
    with pytest.raises(eg.UnsupportedGguf, match="at 16 of 300 ids"):  # a shorter tokenizer lacks the rest
        eg.check_vocabulary(path, Tok(tokens[:284]), 300, tokens)
    with pytest.raises(eg.UnsupportedGguf, match="300 tokens but the model only 299 rows"):
        eg.check_vocabulary(path, Tok(tokens), 299, tokens)


def test_a_conversion_finished_meanwhile_by_another_process_is_kept(tiny, monkeypatch):
    """Two starts converting one file: the second to finish used to remove the first one's directory (which
    that process may be loading from) and rename its own in; now it keeps the first and drops its own."""
    import transformers

    real = transformers.AutoModelForCausalLM.from_pretrained.__func__
    other: dict[str, object] = {}

    def load(cls, *args, **kwargs):
        if not other:  # "another process" converts the same file and finishes while this one loads
            other["started"] = True
            done = eg.converted(tiny.path)
            other["inode"] = done.stat().st_ino
            other["stamp"] = (done / "config.json").stat().st_mtime_ns
        return real(cls, *args, **kwargs)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", classmethod(load))
    out = eg.converted(tiny.path)
    assert out.stat().st_ino == other["inode"] and (out / "config.json").stat().st_mtime_ns == other["stamp"]
    assert [p.name for p in out.parent.iterdir() if p.name != "hashes.json"] == [out.name]  # no scratch left


def test_publish_handles_a_rename_race_and_an_old_leftover(tmp_path, monkeypatch):
    def finished(name):
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text(name)
        return d

    out = tmp_path / "out"
    # the directory appears between the check and the rename: ours is dropped, theirs kept
    real_rename = Path.rename

    def racing_rename(self, target):
        if Path(target) == out and not out.exists():
            real_rename(finished("theirs"), out)
        return real_rename(self, target)

    ours = finished("ours")
    with monkeypatch.context() as m:
        m.setattr(Path, "rename", racing_rename)
        assert eg._publish(ours, out) is False
    assert (out / "config.json").read_text() == "theirs" and ours.is_dir()

    # a leftover without config.json (an interrupted older version) is replaced
    shutil.rmtree(out)
    out.mkdir()
    (out / "model.safetensors").write_text("half")
    assert eg._publish(finished("mine"), out) is True
    assert (out / "config.json").read_text() == "mine" and not (out / "model.safetensors").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ours", "out"]


# ----------------------------------------------------------------------------- llama.cpp's model_hash


def _old_model_hash(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.iterdir()):
        if p.is_file() and p.suffix in (".json", ".safetensors", ".bin", ".model", ".txt"):
            h.update(p.name.encode() + b"\0")
            h.update(p.read_bytes())
    return h.hexdigest()[:20]


def test_llamacpp_model_hash_is_remembered_by_name_size_and_mtime(tmp_path, monkeypatch):
    from engine import llamacpp

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(os.urandom(4096))
    (model / "notes.md").write_text("not part of the model")
    first = llamacpp.model_hash(model)
    assert first == _old_model_hash(model)  # the same digest as before: converted files keep their names

    def refuse(*args, **kwargs):
        raise AssertionError("hashed the files again")

    with monkeypatch.context() as m:  # (undo() would also drop the cache's XDG_CACHE_HOME)
        m.setattr(llamacpp.hashlib, "sha256", refuse)
        assert llamacpp.model_hash(model) == first  # remembered: no byte read

    (model / "model.safetensors").write_bytes(os.urandom(4096))  # same size, new bytes and mtime
    os.utime(model / "model.safetensors", ns=(1, 1))
    second = llamacpp.model_hash(model)
    assert second != first and second == _old_model_hash(model)
