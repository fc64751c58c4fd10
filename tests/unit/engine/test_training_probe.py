"""`draftline train` / `train-eagle` as a user meets them: settings refused before any work (said,
not a traceback), an --out that is never overwritten by mistake, checkpoints that survive Ctrl-C
and a save cut short, and a data pipeline that neither crashes on short rows nor holds a whole
corpus's encodings at once."""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import replace

import pytest
import torch

from engine.training.train import TrainConfig, train

# small enough that even a setting that is wrongly accepted finishes in seconds
TINY = dict(minutes=0.01, seq=128, batch=2, size="tiny", device="cpu", max_chars=60_000, vocab=400)


def _cfg(tmp_path, **kw) -> TrainConfig:
    return TrainConfig(out=str(tmp_path / "out"), state=str(tmp_path / "state"), **{**TINY, **kw})


@pytest.fixture(scope="module", autouse=True)
def quick_eval():
    """The held-out evaluation (16 windows of 512 tokens, a few seconds a run) is not what these tests check."""
    import engine.training.train as tr

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tr, "evaluate", lambda *a, **k: {"target_loss": 1.0, "draft_loss": 1.0, "top1_agreement": 0.0})
        yield


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One tiny fresh run (its models, summary and optimizer state), copied by the tests that resume it."""
    base = tmp_path_factory.mktemp("trained")
    train(_cfg(base))
    return base


def _copy(trained, tmp_path):
    shutil.copytree(trained / "out", tmp_path / "out")
    shutil.copytree(trained / "state", tmp_path / "state")
    return tmp_path / "out"


@pytest.mark.parametrize("setting,option", [
    (dict(minutes=-1.0), "--minutes"), (dict(minutes=0.0), "--minutes"), (dict(minutes=math.nan), "--minutes"),
    (dict(seq=0), "--seq"), (dict(seq=-5), "--seq"), (dict(batch=0), "--batch"), (dict(batch=-2), "--batch"),
    (dict(lr=0.0), "--lr"), (dict(lr=-1.0), "--lr"), (dict(draft_lr=0.0), "--draft-lr"),
    (dict(fim_rate=1.5), "--fim-rate"), (dict(fim_rate=-0.1), "--fim-rate"), (dict(max_chars=0), "--max-chars"),
    (dict(threads=-1), "--threads"), (dict(device="foo"), "--device"), (dict(models=()), "--models"),
])
def test_a_bad_setting_is_refused_before_any_work(tmp_path, setting, option):
    """Negative/zero minutes trained nothing and overwrote the models anyway; batch/lr/seq failed deep in
    numpy, torch or random after the corpus was read; threads and device were tracebacks."""
    with pytest.raises(ValueError, match=option):
        train(_cfg(tmp_path, **setting))
    assert not (tmp_path / "out").exists() and not (tmp_path / "state").exists()


def test_cli_passes_an_explicit_zero_on_instead_of_the_default(tmp_path, monkeypatch):
    """`--lr 0` trained at 2e-3 and `--batch 0` at the default batch (`args.lr or default`); `--seq 0`
    was a ZeroDivisionError traceback."""
    import engine.training.train as tr
    from lsp_server.cli import main

    seen = []
    monkeypatch.setattr(tr, "train", lambda cfg: seen.append(cfg) or {})
    assert main(["train", "--out", str(tmp_path), "--lr", "0", "--draft-lr", "0", "--batch", "0", "--seq", "0"]) == 0
    assert (seen[0].lr, seen[0].draft_lr, seen[0].batch, seen[0].seq) == (0, 0, 0, 0)
    monkeypatch.undo()
    assert main(["train", "--out", str(tmp_path / "o"), "--seq", "0"]) == 2  # said, not a traceback


@pytest.mark.parametrize("where", ["file", "under-a-file"])
def test_an_out_that_cannot_be_a_folder_is_said(tmp_path, where):
    afile = tmp_path / "afile"
    afile.write_text("not a folder")
    out = afile if where == "file" else afile / "sub"
    with pytest.raises(ValueError, match="--out"):
        train(replace(_cfg(tmp_path), out=str(out)))
    assert afile.read_text() == "not a folder"


def test_a_fresh_run_never_overwrites_another_runs_models(tmp_path):
    """Forgetting --resume (with the default --out: the package's own pair) replaced the trained models
    with a fresh run's."""
    out = tmp_path / "out"
    (out / "target").mkdir(parents=True)
    (out / "target" / "config.json").write_text('{"keep": true}')
    with pytest.raises(ValueError, match="--resume"):
        train(_cfg(tmp_path))
    assert (out / "target" / "config.json").read_text() == '{"keep": true}'


def test_a_fresh_draft_only_run_is_refused(tmp_path):
    """--models draft without --resume distilled the draft from a random, untrained target."""
    with pytest.raises(ValueError, match="trained target"):
        train(_cfg(tmp_path, models=("draft",)))


def test_empty_corpus_is_said(tmp_path):
    with pytest.raises(ValueError, match="no training text"):
        train(_cfg(tmp_path, max_chars=50))  # every file is larger


def test_ctrl_c_saves_a_checkpoint_that_resume_continues(trained, tmp_path, monkeypatch):
    """Ctrl-C was a traceback that threw away every step since the last checkpoint (up to 15 minutes)."""
    import engine.training.train as tr

    out = _copy(trained, tmp_path)
    before = json.loads((out / "summary.json").read_text())["steps"]
    real, calls = tr._step, []

    def step(*a, **k):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(tr, "_step", step)
    result = train(_cfg(tmp_path, resume=True, size=None, minutes=5.0))
    assert result["interrupted"] and result["steps"] == 3
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == before + 3 and summary["runs"][-1]["interrupted"]
    monkeypatch.setattr(tr, "_step", real)
    again = train(_cfg(tmp_path, resume=True, size=None))
    assert json.loads((out / "summary.json").read_text())["steps"] == before + 3 + again["steps"]


def test_cli_says_an_interrupted_run_was_saved(tmp_path, monkeypatch, capsys):
    import engine.training.train as tr
    from lsp_server.cli import main

    monkeypatch.setattr(tr, "train", lambda cfg: {"interrupted": True, "steps": 7})
    assert main(["train", "--out", str(tmp_path)]) == 130
    assert "7 steps are saved" in capsys.readouterr().err


def _load_all(out, state):
    from transformers import AutoTokenizer, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(out / "target")
    target = LlamaForCausalLM.from_pretrained(out / "target", dtype=torch.float32)
    draft = LlamaForCausalLM.from_pretrained(out / "draft", dtype=torch.float32)
    opt_t, opt_d = torch.optim.AdamW(target.parameters()), torch.optim.AdamW(draft.parameters())
    saved = torch.load(state / "optim.pt", weights_only=True)
    opt_t.load_state_dict(saved["target"]), opt_d.load_state_dict(saved["draft"])
    return tok, target, draft, opt_t, opt_d


@pytest.mark.parametrize("cut", ["draft weights", "optimizer state"])
def test_a_save_cut_short_leaves_the_previous_checkpoint_whole(trained, tmp_path, monkeypatch, cut):
    """A run killed while saving (kill -9, a full disk) left a torn model.safetensors or optim.pt:
    the checkpoint could then not be loaded, and --resume crashed on it."""
    import transformers.modeling_utils as mu

    import engine.training.train as tr

    out, state = _copy(trained, tmp_path), tmp_path / "state"
    tok, target, draft, opt_t, opt_d = _load_all(out, state)
    files = {p: p.read_bytes() for p in [*out.rglob("*"), state / "optim.pt"] if p.is_file()}
    with torch.no_grad():
        for p in [*target.parameters(), *draft.parameters()]:
            p.add_(1.0)  # a later step's weights
    if cut == "draft weights":
        real, calls = mu.safe_save_file, []

        def torn(tensors, filename, *a, **k):
            calls.append(filename)
            if len(calls) == 2:  # the target went through; the draft's write dies half way
                open(filename, "wb").write(b"torn")
                raise OSError("killed")
            return real(tensors, filename, *a, **k)

        monkeypatch.setattr(mu, "safe_save_file", torn)
    else:
        def torn(obj, f, *a, **k):
            open(f, "wb").write(b"torn")
            raise OSError("killed")

        monkeypatch.setattr(torch, "save", torn)
    summary = json.loads((out / "summary.json").read_text())
    with pytest.raises(OSError, match="killed"):
        tr._save(target, draft, tok, out, opt_t, opt_d, state / "optim.pt", summary, {"started": "x", "evals": []}, 5,
                 _cfg(tmp_path))
    monkeypatch.undo()
    for p, data in files.items():
        assert p.read_bytes() == data, p
    _load_all(out, state)


def test_a_damaged_optimizer_state_is_replaced_not_a_crash(trained, tmp_path, caplog):
    out = _copy(trained, tmp_path)
    (tmp_path / "state" / "optim.pt").write_bytes(b"torn")
    result = train(_cfg(tmp_path, resume=True, size=None))
    assert result["steps"] > 0 and "does not fit" in caplog.text
    assert (out / "summary.json").exists()


def test_an_optimizer_state_of_other_shapes_is_replaced_not_a_crash(trained, tmp_path, caplog):
    """load_state_dict only counts tensors: moments of another model with as many tensors loaded, and
    the first step failed with a shape error."""
    from transformers import LlamaForCausalLM

    from engine.training.train import SIZE_PRESETS, ModelSize, _llama_config

    _copy(trained, tmp_path)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tmp_path / "out" / "target")
    states = {}
    for name, size in SIZE_PRESETS["tiny"].items():  # same layers, other widths
        other = LlamaForCausalLM(_llama_config(ModelSize(size.hidden * 2, size.layers, size.heads, size.ffn), tok, 64))
        opt = torch.optim.AdamW(other.parameters())
        other(input_ids=torch.tensor([[1, 2, 3]])).logits.sum().backward()
        opt.step()
        states[name] = opt.state_dict()
    torch.save(states, tmp_path / "state" / "optim.pt")
    result = train(_cfg(tmp_path, resume=True, size=None))
    assert result["steps"] > 0 and "does not fit" in caplog.text


def test_resume_without_a_summary_starts_a_new_history(trained, tmp_path):
    out = _copy(trained, tmp_path)
    (out / "summary.json").unlink()
    result = train(_cfg(tmp_path, resume=True, size=None))
    assert json.loads((out / "summary.json").read_text())["steps"] == result["steps"]


def test_resume_without_a_draft_is_said(trained, tmp_path):
    out = _copy(trained, tmp_path)
    shutil.rmtree(out / "draft")
    with pytest.raises(ValueError, match="no draft"):
        train(_cfg(tmp_path, resume=True, size=None))


def test_short_rows_make_samples_instead_of_crashing():
    """A --seq under ~100 tokens made window_samples draw from an empty range (randint(50, budget // 3),
    randint(100, context_chars)): a ValueError about randrange."""
    from engine.training.corpus import SourceFile, window_samples

    text = "".join(f"def f{i}(x):\n    return x + {i}\n" for i in range(200))
    files = [SourceFile("pkg", f"pkg/m{i}.py", text) for i in range(3)]
    for seed in range(5):
        samples = window_samples(files, seed, min_chars=46, max_chars=93, context_chars=18, fim_rate=1.0)
        assert samples


def test_rows_are_encoded_a_chunk_at_a_time(tokenizer_dir):
    """One encode_batch over every sample held an Encoding (offsets, token strings) of each of the
    corpus's tokens at once: ~80 bytes a token, gigabytes at the default 60M characters."""
    import numpy as np
    from transformers import AutoTokenizer

    import engine.training.train as tr

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    sizes = []

    class Spy:
        def __init__(self, inner):
            self.inner = inner

        def encode_batch(self, texts, **kw):
            sizes.append(len(texts))
            return self.inner.encode_batch(texts, **kw)

    chunk = getattr(tr, "ENCODE_CHUNK", 512)
    texts = [f"x = {i}\n" for i in range(3 * chunk + 5)]
    want = [e.ids for e in tok.backend_tokenizer.encode_batch(texts, add_special_tokens=False)]

    class Tok:
        backend_tokenizer = Spy(tok.backend_tokenizer)
        pad_token_id = tok.pad_token_id
        convert_tokens_to_ids = staticmethod(tok.convert_tokens_to_ids)

    rows = tr._pack_rows(Tok, texts, 64)
    stream = tr._encode_stream(Tok, texts)
    assert max(sizes) <= chunk
    assert stream.tolist() == [t for ids in want for t in ids]
    assert [t for t in rows.flatten().tolist() if t != tok.pad_token_id] == stream.tolist()
    assert rows.dtype == np.uint16


# ---- train-eagle --------------------------------------------------------------------------------


def _eagle_cfg(tmp_path, **kw):
    from engine.training.eagle import EagleTrainConfig

    base = dict(target="tiny", out=str(tmp_path / "draft.safetensors"), data_minutes=0.01, minutes=0.01, window=32,
                batch=2, max_chars=30_000, held_out_windows=1, head_tokens=64)
    return EagleTrainConfig(**{**base, **kw})


@pytest.fixture
def quick_head(monkeypatch):
    """The head's ids without counting the whole corpus (engine.selfdraft caches that, but not in a fresh home)."""
    import engine.selfdraft as sd

    monkeypatch.setattr(sd, "head_ids", lambda tok, k, vocab=None, ranking=None: torch.arange(min(k, vocab or k)))


@pytest.mark.parametrize("setting,option", [
    (dict(batch=0), "--batch"), (dict(window=1), "--window"), (dict(lr=-1.0), "--lr"),
    (dict(head_tokens=-5), "--head-tokens"), (dict(held_out_windows=-1), "--held-out-windows"),
    (dict(minutes=-1.0), "--minutes"), (dict(max_chars=0), "--max-chars"),
])
def test_eagle_bad_settings_are_refused_before_any_work(tmp_path, quick_head, setting, option):
    """--batch 0 and --window 1 were tracebacks after the features were made; --head-tokens -5 trained
    a head over nearly the whole vocabulary (ranking[:-5])."""
    from engine.training.eagle import train_eagle

    with pytest.raises(ValueError, match=option):
        train_eagle(_eagle_cfg(tmp_path, **setting))
    assert not (tmp_path / "draft.safetensors").exists()


def test_eagle_out_that_is_a_folder_is_refused_before_the_work(tmp_path, quick_head):
    """The file was written after all the work (~45 minutes) and then failed: Is a directory."""
    from engine.training.eagle import train_eagle

    with pytest.raises(ValueError, match="is a folder"):
        train_eagle(_eagle_cfg(tmp_path, out=str(tmp_path)))


def test_eagle_another_target_never_overwrites_the_default_models_draft(tmp_path, quick_head, monkeypatch):
    """The default --out is SmolLM2's shipped draft: `--target X` without --out wrote X's draft over it."""
    import engine.training.eagle as te

    shipped = tmp_path / "eagle" / "smollm2-135m.safetensors"
    shipped.parent.mkdir()
    shipped.write_bytes(b"the shipped draft")
    monkeypatch.setattr(te, "SHIPPED", shipped)
    with pytest.raises(ValueError, match="--out is needed"):
        te.train_eagle(_eagle_cfg(tmp_path, out=str(shipped)))
    assert shipped.read_bytes() == b"the shipped draft"


def test_eagle_init_is_checked_before_the_features(tmp_path, quick_head, monkeypatch):
    """A missing or mismatched --init was found only after the target's features (18 minutes) were made."""
    import engine.training.eagle as te

    def no_features(*a, **k):
        raise AssertionError("features made before --init was checked")

    monkeypatch.setattr(te, "features", no_features)
    with pytest.raises(ValueError, match="no such file"):
        te.train_eagle(_eagle_cfg(tmp_path, init=str(tmp_path / "missing.safetensors")))


def test_held_out_windows_zero_means_none():
    """`max_windows and i >= max_windows` read 0 as no limit: --held-out-windows 0 ran the target over
    every held-out window for up to 10 minutes."""
    import numpy as np

    from engine.lean import LeanLM
    from engine.training.eagle import features

    from .conftest import CPU, tiny_model

    lm = LeanLM(tiny_model(layers=1, hidden=32), CPU, max_len=128)
    stream = list(range(90)) * 4
    toks, feats = features(lm, stream, 32, 1.0, np.random.default_rng(0), max_windows=0)
    assert toks.shape == (0, 32) and feats.shape == (0, 32, 32)
    toks, _ = features(lm, stream, 32, 1.0, np.random.default_rng(0), max_windows=2)
    assert toks.shape == (2, 32)


def test_torn_features_file_is_made_again(tmp_path, caplog):
    """A --features file cut short (a run killed while writing it) crashed every later run in torch.load."""
    from engine.training.eagle import cached_features

    path = tmp_path / "feats.pt"
    path.write_bytes(b"torn")
    assert cached_features(path, {"target": "t"}) is None and "cannot be read" in caplog.text


def test_eagle_ctrl_c_still_writes_the_draft(tmp_path, quick_head, monkeypatch):
    """Ctrl-C during the optimizer steps threw every step away (no checkpoint in a 25-minute run)."""
    from engine.eagle import load
    from engine.training.eagle import train_eagle

    real, calls = torch.nn.utils.clip_grad_norm_, []

    def clip(*a, **k):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip)
    summary = train_eagle(_eagle_cfg(tmp_path, minutes=5.0))
    assert summary["steps"] == 2 and summary["interrupted"]
    assert load(tmp_path / "draft.safetensors")[2]["interrupted"] is True
    assert not list(tmp_path.glob(".*saving"))


def test_eagle_cli_says_a_refused_setting(tmp_path, monkeypatch, capsys):
    """train-eagle let every ValueError (a non-lean target, an --init for other head ids) out as a traceback."""
    import engine.training.eagle as te
    from lsp_server.cli import main

    def refuse(cfg):
        raise ValueError(f"--batch must be at least 1 (got {cfg.batch})")

    monkeypatch.setattr(te, "train_eagle", refuse)
    assert main(["train-eagle", "--batch", "0", "--out", str(tmp_path / "d.safetensors")]) == 2
    assert "--batch must be at least 1 (got 0)" in capsys.readouterr().err
