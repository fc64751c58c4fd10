"""Where the bundled model pair lives inside the package (absent until it is trained)."""

from __future__ import annotations

from pathlib import Path

MODELS_DIR = Path(__file__).parent / "models"


def bundled_pair() -> tuple[str, str] | None:
    """(target dir, draft dir) of the bundled pair, or None when this build carries none."""
    target, draft = MODELS_DIR / "target", MODELS_DIR / "draft"
    if (target / "config.json").is_file() and (draft / "config.json").is_file():
        return str(target), str(draft)
    return None
