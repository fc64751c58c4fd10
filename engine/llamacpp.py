"""Optional llama.cpp backend: the CachedLM seam over llama-cpp-python's low-level API.

Install with `pip install 'draftline[llamacpp]'` (llama-cpp-python has no wheel on PyPI and builds
from source, ~8-15 minutes on a small CPU). Nothing here is imported unless `backend="llamacpp"`
is asked for or `draftline bench peers` runs.

* `gguf_for(model_dir)` converts a Hugging Face directory to GGUF with the converter that ships in
  llama-cpp-python's *source* distribution (vendor/llama.cpp/convert_hf_to_gguf.py; the installed
  wheel does not carry it), caching the file under ~/.cache/draftline/gguf keyed by a hash of the
  model directory. The converter's pre-tokenizer table is keyed by a hash of how the tokenizer
  splits a probe text and does not know the bundled tokenizer; it is mapped at run time (the
  converter runs in a subprocess whose `TextModel.get_vocab_base_pre` falls back to a name derived
  from tokenizer.json), never by editing the package.
* Weights are written as f32 by default: the bundled weights are bf16, which f32 holds exactly, so
  llama.cpp computes from the very values the torch path upcasts to f32; f16 would also hold this
  bf16 range but makes ggml round activations to f16 in every matmul (a different model, slightly).
* `LlamaCppLM` runs tokens through `llama_decode` with a reusable `llama_batch` whose logits flags
  are set only on the rows asked for, and rolls back with `llama_memory_seq_rm` (the KV-cache API
  of llama.cpp since mid-2025, what 0.3.x exposes).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from engine.model import prefill_reusing

log = logging.getLogger(__name__)

MISSING = ("the llama.cpp backend needs llama-cpp-python, which is not installed: "
           "pip install 'draftline[llamacpp]' (it builds from source; CMAKE_ARGS='-DGGML_NATIVE=ON' for a CPU build)")
SRC_ENV = "DRAFTLINE_LLAMACPP_SRC"  # the llama-cpp-python sdist (.tar.gz) or a llama.cpp checkout
GGUF_TYPES = ("f32", "f16", "bf16", "q8_0")


def import_llama_cpp():
    """The llama_cpp module, or an ImportError that says how to install it."""
    try:
        import llama_cpp
    except ImportError as exc:  # pragma: no cover - exercised where the extra is absent
        raise ImportError(MISSING) from exc
    return llama_cpp


def cache_dir() -> Path:
    from engine.gguf import cache_root

    return cache_root() / "gguf"


# --- conversion --------------------------------------------------------------------------------

def model_hash(model_dir: str | os.PathLike) -> str:
    """sha256 over the names and bytes of the files that define the model and its tokenizer.

    Remembered by the directory and each file's name, size and mtime (engine.gguf.remembered_hash, as
    for a GGUF file): computed anew, it read every byte on every start, 14 GB for a 7B model."""
    from engine.gguf import remembered_hash

    root = Path(model_dir)
    files = [p for p in sorted(root.iterdir()) if p.is_file()
             and p.suffix in (".json", ".safetensors", ".bin", ".model", ".txt")]
    stats = [(p.name, p.stat()) for p in files]
    key = f"dir:{root.resolve()}|" + "|".join(f"{name}:{st.st_size}:{st.st_mtime_ns}" for name, st in stats)

    def compute() -> str:
        h = hashlib.sha256()
        for p in files:
            h.update(p.name.encode() + b"\0")
            with p.open("rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
        return h.hexdigest()

    return remembered_hash(key, compute)[:20]


def find_converter(src: str | os.PathLike | None = None) -> Path:
    """convert_hf_to_gguf.py from llama-cpp-python's sdist (extracted once into the cache) or a checkout.

    Looked for in `src`, then $DRAFTLINE_LLAMACPP_SRC, then a copy extracted earlier.
    """
    version = getattr(import_llama_cpp(), "__version__", "unknown")
    extracted = cache_dir() / f"converter-{version}"
    candidates = [c for c in (src, os.environ.get(SRC_ENV)) if c]
    for cand in candidates:
        path = Path(cand).expanduser()
        if path.is_file() and path.name.endswith((".tar.gz", ".tgz")):
            return _extract_converter(path, extracted)
        for d in (path, path / "vendor" / "llama.cpp"):
            if (d / "convert_hf_to_gguf.py").is_file():
                return d / "convert_hf_to_gguf.py"
        if path.is_file() and path.name == "convert_hf_to_gguf.py":
            return path
    if (extracted / "convert_hf_to_gguf.py").is_file():
        return extracted / "convert_hf_to_gguf.py"
    raise FileNotFoundError(
        "GGUF conversion needs llama.cpp's convert_hf_to_gguf.py, which the installed llama-cpp-python "
        f"does not carry: point {SRC_ENV} (or --llamacpp-src) at the llama-cpp-python {version} sdist "
        f"(pip download --no-deps --no-binary :all: llama-cpp-python=={version}) or a llama.cpp checkout")


def _extract_converter(sdist: Path, dest: Path) -> Path:
    """Unpack vendor/llama.cpp/{convert_hf_to_gguf.py, conversion/, gguf-py/} from the sdist."""
    if (dest / "convert_hf_to_gguf.py").is_file():
        return dest / "convert_hf_to_gguf.py"
    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            parts = Path(member.name).parts
            if len(parts) < 4 or parts[1:3] != ("vendor", "llama.cpp"):
                continue
            rel = Path(*parts[3:])
            if rel.parts[0] not in ("convert_hf_to_gguf.py", "conversion", "gguf-py") or not member.isfile():
                continue
            out = tmp / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            with tar.extractfile(member) as f_in:  # type: ignore[union-attr]
                out.write_bytes(f_in.read())
    if not (tmp / "convert_hf_to_gguf.py").is_file():
        raise FileNotFoundError(f"{sdist} holds no vendor/llama.cpp/convert_hf_to_gguf.py")
    tmp.rename(dest)
    return dest / "convert_hf_to_gguf.py"


def pre_tokenizer_name(model_dir: str | os.PathLike) -> str:
    """The llama.cpp pre-tokenizer that splits text like this tokenizer.json, for unknown hashes.

    A plain ByteLevel pre-tokenizer with use_regex is GPT-2's regex ("gpt-2" in llama.cpp). Other
    layouts are not guessed: pass the name explicitly.
    """
    spec = json.loads((Path(model_dir) / "tokenizer.json").read_text())
    pre = spec.get("pre_tokenizer") or {}
    if pre.get("type") == "ByteLevel" and pre.get("use_regex", True) and spec.get("normalizer") is None:
        return "gpt-2"
    raise ValueError(f"{model_dir}: no llama.cpp pre-tokenizer known for {pre!r}; pass pre_tokenizer=NAME")


# Runs in a subprocess: wrap the converter's hash table so an unknown hash maps to argv[2], and skip
# its SentencePiece attempt when there is no tokenizer.model (it imports sentencepiece before it
# looks for the file, and draftline does not depend on sentencepiece).
_SHIM = r"""
import runpy, sys
script, pre = sys.argv[1], sys.argv[2]
root = script.rsplit("/", 1)[0]
sys.path[:0] = [root, root + "/gguf-py"]
from conversion.base import TextModel, logger
_known = TextModel.get_vocab_base_pre
def _mapped(self, tokenizer):
    try:
        return _known(self, tokenizer)
    except NotImplementedError:
        logger.warning("draftline: unknown pre-tokenizer hash mapped to %r at run time", pre)
        return pre
TextModel.get_vocab_base_pre = _mapped
_spm = TextModel._set_vocab_sentencepiece
def _spm_if_present(self, *args, **kwargs):
    if not (self.dir_model / "tokenizer.model").is_file():  # the import of sentencepiece comes first
        raise FileNotFoundError("no tokenizer.model")
    return _spm(self, *args, **kwargs)
TextModel._set_vocab_sentencepiece = _spm_if_present
sys.argv = [script] + sys.argv[3:]
runpy.run_path(script, run_name="__main__")
"""


def gguf_for(model_dir: str | os.PathLike, outtype: str = "f32", *, pre_tokenizer: str | None = None,
             src: str | os.PathLike | None = None) -> Path:
    """A cached GGUF of `model_dir` (converted on first use)."""
    if outtype not in GGUF_TYPES:
        raise ValueError(f"outtype {outtype!r} not in {GGUF_TYPES}")
    model_dir = Path(model_dir)
    pre = pre_tokenizer or pre_tokenizer_name(model_dir)
    out = cache_dir() / f"{model_dir.name}-{model_hash(model_dir)}-{pre}-{outtype}.gguf"
    if out.is_file():
        return out
    converter = find_converter(src)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".tmp{os.getpid()}.gguf")
    cmd = [sys.executable, "-c", _SHIM, str(converter), pre, str(model_dir), "--outfile", str(tmp),
           "--outtype", outtype]
    log.info("converting %s to GGUF %s with %s", model_dir, outtype, converter)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not tmp.is_file():
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"GGUF conversion of {model_dir} failed:\n{proc.stderr[-4000:]}")
    tmp.rename(out)
    return out


# --- the seam ----------------------------------------------------------------------------------

class _EmbeddingRows:
    """What ModelDrafter asks of `lm.model`: how many token ids the model can embed."""

    def __init__(self, rows: int):
        self.weight = torch.empty((rows, 0))

    def get_input_embeddings(self):
        return self


class LlamaCppLM:
    """Drop-in for CachedLM/LeanLM on llama.cpp: tokens, forwards, capacity, truncate, forward, prefill, reset."""

    rows_need_probe = True  # engine.Engine checks engine.model.batched_rows_differ before a drafter verifies here

    def __init__(self, gguf: str | os.PathLike, *, n_ctx: int = 4096, n_threads: int | None = None,
                 n_batch: int = 512, vocab_limit: int | None = None, kv_type: str = "f16",
                 flash_attn: bool = False, model: Any = None, verbose: bool = False):
        lc = import_llama_cpp()
        from llama_cpp import _logger

        _logger.set_verbose(verbose)
        self._lc = lc
        lc.llama_backend_init()
        mparams = lc.llama_model_default_params()
        mparams.n_gpu_layers = 0
        self._model = lc.llama_model_load_from_file(os.fsencode(gguf), mparams)
        if not self._model:
            raise RuntimeError(f"llama.cpp could not load {gguf}")
        threads = n_threads or max(1, os.cpu_count() or 1)
        cparams = lc.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = cparams.n_ubatch = n_batch
        cparams.n_seq_max = 1
        cparams.n_threads = cparams.n_threads_batch = threads
        kv = {"f32": lc.GGML_TYPE_F32, "f16": lc.GGML_TYPE_F16}[kv_type]
        cparams.type_k = cparams.type_v = kv
        cparams.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn else lc.LLAMA_FLASH_ATTN_TYPE_DISABLED
        cparams.no_perf = True
        self._ctx = lc.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            lc.llama_model_free(self._model)
            raise RuntimeError("llama.cpp could not create a context")
        self._mem = lc.llama_get_memory(self._ctx)
        self.n_vocab = int(lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(self._model)))
        self.n_batch = n_batch
        self._batch = lc.llama_batch_init(n_batch, 0, 1)
        self.capacity = int(lc.llama_n_ctx(self._ctx))
        self.vocab_limit = vocab_limit
        self.threads = threads
        self.gguf = Path(gguf)
        self.model = model if model is not None else _EmbeddingRows(self.n_vocab)
        self.tokens: list[int] = []
        self.forwards = 0

    def __del__(self):
        lc = getattr(self, "_lc", None)
        if lc is None:
            return
        try:
            if getattr(self, "_batch", None) is not None:
                lc.llama_batch_free(self._batch)
            if getattr(self, "_ctx", None):
                lc.llama_free(self._ctx)
            if getattr(self, "_model", None):
                lc.llama_model_free(self._model)
        except Exception:  # interpreter shutdown
            pass
        self._batch = self._ctx = self._model = None

    def reset(self) -> None:
        self._lc.llama_memory_clear(self._mem, True)
        self.tokens = []

    def truncate(self, n: int) -> None:
        """Keep the KV of the first n tokens only."""
        if n >= len(self.tokens):
            return
        if not self._lc.llama_memory_seq_rm(self._mem, 0, n, -1):
            raise RuntimeError("llama.cpp refused to drop the KV tail")
        del self.tokens[n:]

    def prefill(self, tokens: Sequence[int], cancel=None) -> tuple[torch.Tensor | None, int]:
        return prefill_reusing(self, tokens, cancel)

    def forward(self, new_tokens: Sequence[int], keep_logits: int | None = None) -> torch.Tensor:
        """Append tokens; return float32 logits (T', V) of the last `keep_logits` (all by default)."""
        t = len(new_tokens)
        if t == 0:
            raise ValueError("forward needs at least one token")
        start = len(self.tokens)
        if start + t > self.capacity:
            raise ValueError(f"sequence of {start + t} tokens exceeds the llama.cpp context ({self.capacity})")
        keep = t if not keep_logits else min(keep_logits, t)
        first_kept = t - keep
        lc, batch = self._lc, self._batch
        rows: list[torch.Tensor] = []
        for lo in range(0, t, self.n_batch):
            chunk = new_tokens[lo : lo + self.n_batch]
            n = len(chunk)
            batch.n_tokens = n
            n_out = 0
            for j, tok in enumerate(chunk):
                i = lo + j
                batch.token[j] = int(tok)
                batch.pos[j] = start + i
                batch.n_seq_id[j] = 1
                batch.seq_id[j][0] = 0
                want = i >= first_kept
                batch.logits[j] = want
                n_out += want
            rc = lc.llama_decode(self._ctx, batch)
            if rc != 0:
                lc.llama_memory_seq_rm(self._mem, 0, start, -1)  # keep the seam's state consistent
                raise RuntimeError(f"llama_decode failed ({rc})")
            if n_out:
                ptr = lc.llama_get_logits(self._ctx)  # the flagged rows, contiguous, in batch order
                arr = np.ctypeslib.as_array(ptr, shape=(n_out, self.n_vocab))
                rows.append(torch.from_numpy(arr.copy()))
        self.forwards += 1
        self.tokens.extend(int(x) for x in new_tokens)
        logits = rows[0] if len(rows) == 1 else torch.cat(rows)
        if self.vocab_limit is not None:
            logits = logits[:, : self.vocab_limit]
        return logits


def load_llamacpp_lm(model_dir: str | os.PathLike, *, vocab_limit: int | None = None, n_ctx: int = 4096,
                     n_threads: int | None = None, outtype: str | None = None, kv_type: str | None = None,
                     model: Any = None, src: str | os.PathLike | None = None) -> LlamaCppLM:
    """Convert (cached) and open `model_dir` on llama.cpp.

    When not given: $DRAFTLINE_LLAMACPP_GGUF_TYPE picks the GGUF type (f32), $DRAFTLINE_LLAMACPP_KV the
    KV-cache type (f16, llama.cpp's default) and $DRAFTLINE_LLAMACPP_THREADS the threads (torch's count).
    """
    import_llama_cpp()  # fail with the install hint before converting anything
    if str(model_dir).endswith(".gguf") and Path(model_dir).is_file():  # a GGUF model runs as it is
        n_threads = n_threads or int(os.environ.get("DRAFTLINE_LLAMACPP_THREADS", 0)) or torch.get_num_threads()
        return LlamaCppLM(Path(model_dir), n_ctx=n_ctx, n_threads=n_threads, vocab_limit=vocab_limit,
                          kv_type=kv_type or os.environ.get("DRAFTLINE_LLAMACPP_KV", "f16"), model=model)
    if not Path(model_dir).is_dir():  # a hub id: its local snapshot
        from huggingface_hub import snapshot_download

        model_dir = snapshot_download(os.fspath(model_dir), local_files_only=True)
    outtype = outtype or os.environ.get("DRAFTLINE_LLAMACPP_GGUF_TYPE", "f32")
    if n_threads is None and os.environ.get("DRAFTLINE_LLAMACPP_THREADS"):
        n_threads = int(os.environ["DRAFTLINE_LLAMACPP_THREADS"])
    if n_threads is None:
        n_threads = torch.get_num_threads()
    kv_type = kv_type or os.environ.get("DRAFTLINE_LLAMACPP_KV", "f16")
    path = gguf_for(model_dir, outtype, src=src)
    return LlamaCppLM(path, n_ctx=n_ctx, n_threads=n_threads, vocab_limit=vocab_limit, kv_type=kv_type, model=model)
