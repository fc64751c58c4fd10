"""A deterministic, torch-free engine for protocol tests: same interface, predictable text."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from engine.types import CompletionRequest, CompletionResult, CompletionStats, SpecConfig


@dataclass
class FakeEngine:
    """Completes with text derived from the request, one "token" (character) per step.

    The default completion is ``"# draftline"`` followed by the last word before the cursor, so
    tests can tell which document version was completed. ``step_s`` makes each step take time
    (for cancellation tests); the cancel event is checked before every step, like the real loop.
    """

    step_s: float = 0.0
    text: str | None = None
    calls: int = 0
    # the monitor's hooks, as on Engine: the spec in effect (the text ignores it), and forget() calls
    base_spec: SpecConfig = field(default_factory=SpecConfig)
    spec: SpecConfig | None = None  # None: base_spec
    forgets: int = 0

    def __post_init__(self) -> None:
        if self.spec is None:
            self.spec = self.base_spec

    def apply_overrides(self, *, gamma: int | None = None, drafter: str | None = None,
                        target_only: bool = False) -> SpecConfig:
        self.spec = self.base_spec.with_overrides(gamma=gamma, drafter=drafter, target_only=target_only)
        return self.spec

    def forget(self) -> None:
        self.forgets += 1

    def complete(self, request: CompletionRequest, cancel: threading.Event,
                 spec: SpecConfig | None = None) -> CompletionResult:
        self.calls += 1
        words = request.prefix.split()
        last = words[-1] if words else ""
        target = self.text if self.text is not None else f"fake_{len(request.prefix)}_{last[-16:]}"
        if request.mode == "single-line":
            target = target.split("\n", 1)[0]
        target = target[: request.limits.max_tokens]
        stats = CompletionStats(prompt_tokens=len(request.prefix) + len(request.suffix))
        started = time.perf_counter()
        out: list[str] = []
        for ch in target:
            if cancel.is_set():
                stats.total_s = time.perf_counter() - started
                return CompletionResult("".join(out), cancelled=True, stop_reason="cancelled", stats=stats)
            if self.step_s:
                time.sleep(self.step_s)
            stats.target_forwards += 1
            out.append(ch)
        stats.generated_tokens = len(out)
        stats.total_s = time.perf_counter() - started
        return CompletionResult("".join(out), stop_reason="eos", stats=stats)
