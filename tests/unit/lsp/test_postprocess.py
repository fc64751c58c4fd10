"""Golden post-processing cases: each file marks the cursor with █ in the document."""

from __future__ import annotations

from pathlib import Path

import pytest

from lsp_server.postprocess import choose_mode, postprocess

CURSOR = "█"
CASES = sorted((Path(__file__).parent / "golden" / "postprocess").glob("*.txt"))


def parse(path: Path) -> dict[str, str]:
    """Header lines (``key: value``), then ``--- section`` blocks; a block's last newline is not content."""
    sections: dict[str, list[str]] = {"header": []}
    current = "header"
    for line in path.read_text(encoding="utf-8").split("\n"):
        if line.startswith("--- "):
            current = line[4:].strip()
            sections[current] = []
        else:
            sections[current].append(line)
    out = {name: "\n".join(lines) for name, lines in sections.items()}
    out = {name: text[:-1] if name != "header" and text.endswith("\n") else text for name, text in out.items()}
    for line in sections["header"]:
        key, _, value = line.partition(":")
        if key == "setting":
            out["setting"] = value.strip()
    return out


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_golden(path: Path):
    case = parse(path)
    before, after = case["document"].split(CURSOR)
    mode = choose_mode(before, after, case.get("setting", "auto"))
    assert mode == case["mode"]
    assert postprocess(case["completion"], before, after, mode) == case["expected"]


def test_there_are_golden_cases():
    assert len(CASES) >= 10
