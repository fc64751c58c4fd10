"""draftline's own CPU kernels (engine/native.c), compiled on first use and loaded with ctypes.

The lean decoder's short forwards (decode, verify: at most INT8_MAX_ROWS tokens) on an x86-64 CPU
with AVX2 and FMA run their per-token attention and their int8 matrix products here, because every
row of a verify must be the decode step's computation bit for bit, and torch's exact per-row ops
cost a row's worth of dispatch each (see the C file's header). The library is built once with the
system's C compiler (``$CC``, else ``cc``) into ``~/.cache/draftline/native/``, keyed by the
source, the flags and the compiler, in about a second. Where there is no compiler, no AVX2/FMA, or
``DRAFTLINE_NATIVE=0``, `lib()` is None (one log line says why) and the decoder keeps its torch ops:
outputs then differ from the native path's in the last bits, and each path stays exact with itself.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import threading
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("native.c")
FLAGS = ["-O3", "-mavx2", "-mfma", "-ffp-contract=off", "-fPIC", "-shared"]
QK = 32  # inputs per block: of the activations (native.c: quantize_q8) and of the Q4_1 weights
Q8_NW = 4  # int8 weight rows per tile (native.c: Q8_NW; q8_tile)

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_why: str | None = None  # why there is no library (None: not tried yet, or loaded)


def _cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str] | None:
    """The CPU's feature flags as Linux lists them, or None where they cannot be read."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.split(":")[0].strip() == "flags":
            return set(line.partition(":")[2].split())
    return None


def _cpu_ok() -> str | None:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"not an x86-64 CPU ({platform.machine()})"
    try:
        cap = torch.backends.cpu.get_cpu_capability()
    except Exception as exc:
        # native.c checks for AVX512-VNNI only, never for AVX2: loaded on a CPU without it, its first
        # call dies of SIGILL. Without torch's word, run it only where the CPU's flags list both.
        flags = _cpu_flags()
        if flags is None:
            return f"cannot tell whether the CPU has AVX2 and FMA (torch: {exc}; no CPU flags in /proc/cpuinfo)"
        if missing := [f.upper() for f in ("avx2", "fma") if f not in flags]:
            return f"the CPU has no {' or '.join(missing)} (/proc/cpuinfo)"
        return None
    if cap not in ("AVX2", "AVX512"):
        return f"the CPU has no AVX2 (torch reports {cap})"
    return None


def _build(cc: str, source: Path = SOURCE) -> Path:
    """Compile `source` (native.c) into the cache (once per source, flags and compiler); the library's path."""
    from engine.gguf import cache_root

    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    src = source.read_bytes()
    # without OpenMP (e.g. Apple clang): one thread; DL_NO_VNNI: a compiler that does not know AVX512-VNNI
    attempts = [FLAGS + ["-fopenmp"], FLAGS, FLAGS + ["-fopenmp", "-DDL_NO_VNNI"], FLAGS + ["-DDL_NO_VNNI"]]
    outs = [cache_root() / "native" / f"draftline-{_key(src, cc, flags, version)}.so" for flags in attempts]
    if built := [out for out in outs if out.is_file()]:
        return built[0]
    # every attempt failed on an earlier start (each costs up to a few seconds): not tried again until
    # the source, the flags or the compiler change, or the marker is deleted
    failed = outs[0].with_name(f"draftline-{_key(src, cc, [f for a in attempts for f in a], version)}.failed")
    if failed.is_file():
        raise RuntimeError(f"{failed.read_text(errors='replace').strip()} (on an earlier start; "
                           f"delete {failed} to try again)")
    errors = []
    for flags, out in zip(attempts, outs):
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
        run = subprocess.run([cc, *flags, "-o", str(tmp), str(source), "-lm"], capture_output=True, text=True,
                             timeout=120)
        if run.returncode == 0:
            tmp.replace(out)
            return out
        tmp.unlink(missing_ok=True)
        err = run.stderr.strip().splitlines()[-1:] or ["no output"]
        log.info("native kernels: %s %s failed: %s", cc, " ".join(flags), err[0])
        errors.append(err[0])
    why = f"{cc} could not compile {source.name} ({errors[-1]})"
    with contextlib.suppress(OSError):  # a read-only cache only costs the attempts next time
        failed.write_text(why + "\n")
    raise RuntimeError(why)


def _key(src: bytes, cc: str, flags: list[str], version: str) -> str:
    return hashlib.sha256(src + " ".join([cc, *flags, version]).encode()).hexdigest()[:20]


def lib() -> ctypes.CDLL | None:
    """The loaded kernels, or None where they cannot be had here (the reason is logged once)."""
    global _lib, _why
    if _lib is not None or _why is not None:
        return _lib
    with _lock:
        if _lib is not None or _why is not None:
            return _lib
        try:
            if os.environ.get("DRAFTLINE_NATIVE", "") == "0":
                raise RuntimeError("DRAFTLINE_NATIVE=0")
            if why := _cpu_ok():
                raise RuntimeError(why)
            handle = build(SOURCE)
            _lib = handle
            log.info("native kernels loaded (%s; integer dots: %s)", Path(handle._name).name,
                     "AVX512-VNNI" if handle.dl_vnni(-1) else "AVX2")
        except Exception as exc:  # any failure leaves the torch ops in place
            _why = str(exc) or type(exc).__name__
            log.info("native kernels unavailable, using torch ops: %s", _why)
    return _lib


def build(source: Path, any_layout: bool = False) -> ctypes.CDLL:
    """Compile (or find in the cache) and load a native.c; raises where it cannot. `lib()` uses SOURCE;
    `draftline bench kernels` also loads another version of the file, to time both in one process.
    A file whose int8 products read another weight layout than q8_tile's is refused, unless
    `any_layout` (q8_layout then tells which)."""
    cc = os.environ.get("CC") or "cc"
    if shutil.which(cc) is None:
        raise RuntimeError(f"no C compiler ({cc}) on PATH")
    # torch loads its own OpenMP runtime (libgomp.so.1) first, so the library's OpenMP
    # pragmas run in torch's thread pool rather than in a second one competing for the cores
    handle = ctypes.CDLL(str(_build(cc, source)))
    ptr, i64, f32, flag = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int
    handle.dl_attend.argtypes = [ptr, flag, ptr, ptr, i64, i64, i64, i64, i64, i64, f32, ptr, flag, ptr]
    handle.dl_q8_linear.argtypes = [ptr, flag, i64, i64, ptr, ptr, i64, ptr, flag, ptr, ptr]
    handle.dl_q4_linear.argtypes = [ptr, flag, i64, i64, ptr, ptr, ptr, i64, ptr, flag, ptr, ptr]
    handle.dl_rmsnorm.argtypes = [ptr, flag, ptr, i64, i64, f32, ptr]
    handle.dl_rope_store.argtypes = [ptr, flag, ptr, ptr, i64, i64, i64, i64, ptr, ptr, ptr, i64, i64]
    handle.dl_silu_mul.argtypes = [ptr, flag, i64, i64, ptr]
    handle.dl_vnni.argtypes, handle.dl_vnni.restype = [flag], flag
    if q8_layout(handle) != Q8_NW and not any_layout:
        raise RuntimeError(f"{source}: its int8 products take another weight layout than this engine/native.py "
                           f"makes (tiles of {Q8_NW} rows: native.c from the commit that added dl_q8_tiles on)")
    handle.dl_layers.argtypes = [ptr, flag, i64, i64, i64, i64, i64, i64, i64, i64, i64, f32, f32, ptr, ptr,
                                 ptr, ptr, ptr, ptr, ptr, ptr, ptr, ptr, ptr, ptr]
    for fn in (handle.dl_attend, handle.dl_q8_linear, handle.dl_q4_linear, handle.dl_rmsnorm,
               handle.dl_rope_store, handle.dl_silu_mul, handle.dl_layers):
        fn.restype = None
    return handle


def q8_layout(handle: ctypes.CDLL) -> int:
    """The rows per tile of the int8 weights a build's products read: 1 for a native.c from before the
    tiles (plain (N, K) rows), else its dl_q8_tiles()."""
    try:
        tiles = handle.dl_q8_tiles
    except AttributeError:
        return 1
    return int(tiles())


@contextlib.contextmanager
def using(handle: ctypes.CDLL):
    """Within the block, every kernel call goes to `handle` (another build of native.c) instead of lib()'s."""
    global _lib
    lib()
    saved = _lib
    _lib = handle
    try:
        yield handle
    finally:
        _lib = saved


def vnni(want: bool | None = None) -> bool:
    """Do the int8/Q4_1 products use AVX512-VNNI's integer dot? `want` False makes them use AVX2's, True
    VNNI's where the CPU has it. Either gives the same bits (the tests check it); VNNI is faster for
    a verify's rows. Needs the library."""
    return bool(lib().dl_vnni(-1 if want is None else int(want)))


def unavailable_reason() -> str | None:
    lib()
    return _why


def _ptr(t: torch.Tensor) -> ctypes.c_void_p:
    return ctypes.c_void_p(t.data_ptr())


_DTYPES = (torch.float32, torch.bfloat16)  # what the kernels read and write; flag 1 is bfloat16


def _input(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous() if x.dtype in _DTYPES else x.to(torch.float32).contiguous()


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int, scale: float,
           work: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Causal attention of q's T tokens at positions start..start+T-1, one query row at a time.

    q (H, T, D), float32 or bfloat16; keys/values (KVH, L, D) float32, contiguous, already holding
    the new tokens' rows; work: float32 scratch of at least T*H*(L+D). Returns (T, H*D) in
    `out_dtype` (float32 or bfloat16; q's by default). Row i of the answer does not depend on T: it is the decode step's computation for its token."""
    h, t, d = q.shape
    kvh, length = keys.shape[0], keys.shape[1]
    if not (keys.is_contiguous() and values.is_contiguous() and keys.dtype == values.dtype == torch.float32):
        raise ValueError("attend needs contiguous float32 key/value caches")
    if values.shape != keys.shape or keys.dim() != 3 or keys.shape[2] != d or start < 0:
        raise ValueError(f"attend: q {tuple(q.shape)} against caches {tuple(keys.shape)} / {tuple(values.shape)}")
    if h % kvh or start + t > length or work.numel() < t * h * (length + d) or work.dtype != torch.float32:
        raise ValueError(f"attend: unsupported shapes q {tuple(q.shape)} cache {tuple(keys.shape)}")
    q = _input(q)
    out = torch.empty((t, h * d), dtype=out_dtype or q.dtype)
    lib().dl_attend(_ptr(q), _bf(q), _ptr(keys), _ptr(values), t, h, kvh, d, length, start, scale, _ptr(out), _bf(out),
                    _ptr(work))
    return out


def _bf(t: torch.Tensor) -> int:
    if t.dtype not in _DTYPES:
        raise ValueError(f"the native kernels take float32 or bfloat16, not {t.dtype}")
    return int(t.dtype == torch.bfloat16)


def _same(x: torch.Tensor, *others: torch.Tensor) -> None:
    if any(o.dtype != x.dtype or not o.is_contiguous() for o in others):
        raise ValueError(f"the native kernels want contiguous operands of one dtype ({x.dtype})")


def _residual(residual: torch.Tensor | None, y: torch.Tensor) -> ctypes.c_void_p | None:
    if residual is None:
        return None
    if residual.shape != y.shape:
        raise ValueError(f"residual {tuple(residual.shape)} for an output {tuple(y.shape)}")
    _same(y, residual)
    return _ptr(residual)


def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of x's rows (M, C) by the weight w (C,), in x's dtype, with the roundings of the torch
    version (engine.lean.LeanLM._rms)."""
    x = x.contiguous()
    _same(x, w)
    m, c = x.shape
    y = torch.empty_like(x)
    lib().dl_rmsnorm(_ptr(x), _bf(x), _ptr(w), m, c, eps, _ptr(y))
    return y


def rope_store(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int, kv_heads: int,
               q_out: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int) -> None:
    """RoPE on the q and k parts of qkv (T, (H + 2 KVH) D) at positions start..start+T-1 (cos/sin:
    (T, D) rows for them, `sin` with its first half negated as LeanLM keeps it): q into q_out
    (H, T, D) float32, k and v into the float32 caches (KVH, L, D)."""
    t, row = qkv.shape
    d = cos.shape[1]
    qkv = qkv.contiguous()
    _same(qkv, cos, sin)
    if row != (heads + 2 * kv_heads) * d or q_out.shape != (heads, t, d) or q_out.dtype != torch.float32 \
            or not q_out.is_contiguous() or cos.shape != (t, d) or sin.shape != (t, d) or start < 0 \
            or start + t > keys.shape[1] or tuple(keys.shape) != (kv_heads, keys.shape[1], d) \
            or values.shape != keys.shape:
        raise ValueError(f"rope_store: unsupported shapes qkv {tuple(qkv.shape)} cos {tuple(cos.shape)}")
    if not (keys.is_contiguous() and values.is_contiguous() and keys.dtype == values.dtype == torch.float32):
        raise ValueError("rope_store needs contiguous float32 key/value caches")
    lib().dl_rope_store(_ptr(qkv), _bf(qkv), _ptr(cos), _ptr(sin), t, heads, kv_heads, d, _ptr(q_out), _ptr(keys),
                        _ptr(values), keys.shape[1], start)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for rows of [gate | up] (T, 2F), in their dtype: (T, F)."""
    gate_up = gate_up.contiguous()
    t, f2 = gate_up.shape
    out = torch.empty((t, f2 // 2), dtype=gate_up.dtype)
    lib().dl_silu_mul(_ptr(gate_up), _bf(gate_up), t, f2 // 2, _ptr(out))
    return out


def _scratch(m: int, k: int) -> torch.Tensor:
    # the int8 input and its scales, and for Q4_1 the same again in pairs of blocks (native.c: dl_q4_linear)
    return torch.empty(2 * m * k + 24 * m * (k // QK) + 64 * m, dtype=torch.uint8)


def q8_tile(wq: torch.Tensor) -> torch.Tensor:
    """int8 weights (N, K) in the products' layout: tiles of Q8_NW rows, block by block (tile t holds,
    for each block of 32 inputs in order, those 32 bytes of rows Q8_NW*t .. Q8_NW*t + Q8_NW-1), so that
    a product reads each tile as one stream. N is padded with zero rows to a multiple of Q8_NW:
    (ceil(N / Q8_NW) * Q8_NW, K). q8_untile(q8_tile(w), N) is w."""
    n, k = wq.shape
    if k % QK or wq.dtype != torch.int8:
        raise ValueError(f"q8_tile: unsupported weights {tuple(wq.shape)} {wq.dtype}")
    padded = -(-n // Q8_NW) * Q8_NW
    if padded != n:
        wq = torch.cat([wq, wq.new_zeros(padded - n, k)])
    return wq.reshape(padded // Q8_NW, Q8_NW, k // QK, QK).transpose(1, 2).contiguous().reshape(padded, k)


def q8_untile(wt: torch.Tensor, n: int) -> torch.Tensor:
    """The (n, K) row-major weights of q8_tile's layout."""
    padded, k = wt.shape
    return wt.reshape(padded // Q8_NW, k // QK, Q8_NW, QK).transpose(1, 2).reshape(padded, k)[:n].contiguous()


def q8_linear(x: torch.Tensor, wt: torch.Tensor, ws: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
    """x W^T for int8 weights in q8_tile's layout with float32 scales ws (N,) (N = the outputs): the
    input is quantized to int8 per block of 32 (llama.cpp's Q8_0 recipe) and the products are summed
    exactly in integers per block. Returns (M, N) in x's dtype (float32 or bfloat16), plus `residual`
    (M, N) where given; a row's result does not depend on the other rows."""
    m, k = x.shape
    n = ws.shape[0]
    if (k % QK or wt.shape != (-(-n // Q8_NW) * Q8_NW, k) or wt.dtype != torch.int8 or ws.dtype != torch.float32
            or not wt.is_contiguous()):
        raise ValueError(f"q8_linear: unsupported shapes x {tuple(x.shape)} w {tuple(wt.shape)} scales {tuple(ws.shape)}")
    x = _input(x)
    y = torch.empty((m, n), dtype=x.dtype)
    bf = int(x.dtype == torch.bfloat16)
    scratch = _scratch(m, k)  # held here: a temporary's memory is freed as soon as _ptr has read its address
    lib().dl_q8_linear(_ptr(x), bf, m, k, _ptr(wt), _ptr(ws), n, _ptr(y), bf, _residual(residual, y), _ptr(scratch))
    return y


def q4_pack(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_1 blocks of w (N, K), K a multiple of 32: per 32 inputs, d = (max - min) / 15, m = min and
    q = round((w - min) / d) in 0..15 (llama.cpp's Q4_1 grid; d and m kept in float32, which the
    kernel reads faster than float16 here). Returns (qs uint8 (N, K/2), dm float32 (2, N, K/32)),
    native.c's q4_gemm layout."""
    n, k = w.shape
    if k % QK:
        raise ValueError(f"q4_pack: K = {k} is not a multiple of {QK}")
    g = w.float().reshape(n, k // QK, QK)
    lo, hi = g.amin(-1), g.amax(-1)
    d = ((hi - lo) / 15).clamp_min(1e-12)
    q = torch.round((g - lo[..., None]) / d[..., None]).clamp_(0, 15).to(torch.uint8)
    qs = (q[..., : QK // 2] | (q[..., QK // 2 :] << 4)).reshape(n, k // 2).contiguous()
    return qs, torch.stack([d, lo]).contiguous()


def q4_linear(x: torch.Tensor, qs: torch.Tensor, dm: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
    """x W^T for q4_pack's blocks: the input quantized to int8 per block of 32, the products summed
    exactly in integers per block. Returns (M, N) in x's dtype (float32 or bfloat16), plus `residual`
    where given; a row's result does not depend on the other rows."""
    m, k = x.shape
    n = qs.shape[0]
    if k % QK or qs.shape[1] * 2 != k or qs.dtype != torch.uint8 or dm.dtype != torch.float32 \
            or tuple(dm.shape) != (2, n, k // QK) or not dm.is_contiguous():
        raise ValueError(f"q4_linear: unsupported shapes x {tuple(x.shape)} qs {tuple(qs.shape)} dm {tuple(dm.shape)}")
    x = _input(x)
    y = torch.empty((m, n), dtype=x.dtype)
    bf = int(x.dtype == torch.bfloat16)
    scratch = _scratch(m, k)
    lib().dl_q4_linear(_ptr(x), bf, m, k, _ptr(qs), _ptr(dm[0]), _ptr(dm[1]), n, _ptr(y), bf, _residual(residual, y),
                       _ptr(scratch))
    return y


class Layers:
    """All the layers of a short forward in one native call (dl_layers): the nine steps a layer that
    LeanLM._native_layers makes one call at a time, with the same arguments and so the same bits,
    without ~270 calls' overhead a token. For int8 (Linear with `sf`) or Q4_1 (`n4`) weights without biases.

    layers: LeanLM.layers' tuples (ln1, qkv, o, ln2, gate_up, down); caches: their (k, v) float32
    views (KVH, L, D), fixed for this object's life; work: the attention's scratch (attend's, for
    `rows` tokens: LeanLM._work); the other scratch is held here, for up to `rows` tokens.
    """

    def __init__(self, layers, caches, heads: int, kv_heads: int, head_dim: int, ffn: int, eps: float,
                 scale: float, rows: int, dtype: torch.dtype, work: torch.Tensor):
        self.heads, self.kv_heads, self.head_dim, self.ffn = heads, kv_heads, head_dim, ffn
        self.eps, self.scale, self.rows, self.dtype = eps, scale, rows, dtype
        self.hidden = layers[0][0].shape[0]
        self.length = caches[0][0].shape[1]
        # dl_layers trusts every shape it is given (a wrong one reads or writes out of bounds and kills
        # the server): what it will index is checked here, once
        c, qkv_rows = self.hidden, (heads + 2 * kv_heads) * head_dim
        if kv_heads <= 0 or heads % kv_heads:
            raise ValueError(f"Layers: {heads} heads over {kv_heads} KV heads")
        for (ln1, wqkv, wo, ln2, wgu, wdown), (k, v) in zip(layers, caches):
            if tuple(k.shape) != (kv_heads, self.length, head_dim) or k.shape != v.shape:
                raise ValueError(f"Layers: a KV cache of shape {tuple(k.shape)}, not {(kv_heads, self.length, head_dim)}")
            for lin, n, kk in ((wqkv, qkv_rows, c), (wo, c, heads * head_dim), (wgu, 2 * ffn, c), (wdown, c, ffn)):
                rows_n, cols = (lin.q.shape[0], lin.q.shape[1] * (2 if lin.n4 else 1))
                if cols != kk or rows_n < n or tuple(ln1.shape) != (c,) or tuple(ln2.shape) != (c,):
                    raise ValueError(f"Layers: a weight of shape {tuple(lin.q.shape)} where ({n}, {kk}) is wanted")
        keep = []  # every tensor whose address is in the table
        table = []
        def add(t: torch.Tensor) -> None:
            if not t.is_contiguous():
                raise ValueError("Layers: a weight or cache is not contiguous")
            keep.append(t)
            table.append(t.data_ptr())

        def linear(lin) -> None:  # dl_layers' (w, s1, s2, kind): int8 (q, sf, -, 0) or Q4_1 (qs, d, m, 1)
            if lin.n4:
                add(lin.q)
                add(lin.s[0])
                add(lin.s[1])
                table.append(1)
            else:
                add(lin.q)
                add(lin.sf)
                table.extend([0, 0])

        for (ln1, wqkv, wo, ln2, wgu, wdown), (k, v) in zip(layers, caches):
            add(ln1)
            linear(wqkv)
            linear(wo)
            add(ln2)
            linear(wgu)
            linear(wdown)
            add(k)
            add(v)
        biases = [layer[1].b for layer in layers]  # Qwen2's q/k/v biases (the other linears have none: fits)
        keep += [b for b in biases if b is not None]
        self._bias = (ctypes.c_void_p * len(biases))(*[None if b is None else b.data_ptr() for b in biases]) \
            if any(b is not None for b in biases) else None
        self._keep = keep
        self._table = (ctypes.c_void_p * len(table))(*table)
        self.count = len(layers)
        c, h, d, f = self.hidden, heads, head_dim, ffn
        self._h = torch.empty((rows, c), dtype=dtype)
        self._qkv = torch.empty((rows, (h + 2 * kv_heads) * d), dtype=dtype)
        self._q = torch.empty((h * rows * d,), dtype=torch.float32)
        self._att = torch.empty((rows, h * d), dtype=dtype)
        self._gu = torch.empty((rows, 2 * f), dtype=dtype)
        self._act = torch.empty((rows, f), dtype=dtype)
        self._scratch = _scratch(rows, max(c, h * d, f))  # the Q4_1 products' input sums fit in it too
        if work.dtype != torch.float32 or not work.is_contiguous() or work.numel() < rows * h * (self.length + d):
            raise ValueError("Layers: the attention scratch is too small")
        self._work = work

    @staticmethod
    def fits(layers, dtype: torch.dtype) -> bool:
        """Can these layers run in one call? Native int8 or Q4_1 weights, norms in the model's dtype, and no
        biases but the q/k/v ones (Qwen2's), contiguous in that dtype."""
        def bias_ok(lin, allowed: bool) -> bool:
            return lin.b is None or (allowed and lin.b.dtype == dtype and lin.b.is_contiguous()
                                     and tuple(lin.b.shape) == (lin.w.shape[0],))

        return dtype in _DTYPES and all(
            (lin.sf is not None or lin.n4) and bias_ok(lin, i == 1)
            for layer in layers for i, lin in ((1, layer[1]), (2, layer[2]), (4, layer[4]), (5, layer[5]))
        ) and all(layer[0].dtype == dtype and layer[3].dtype == dtype for layer in layers)

    def __call__(self, x: torch.Tensor, start: int, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """The layers' output for x (T, C), T <= rows, at positions start..start+T-1 (cos, sin: their
        (T, D) rows); the caches get the new keys and values. Returns a new tensor."""
        t = x.shape[0]
        if t > self.rows or x.dtype != self.dtype or start + t > self.length:
            raise ValueError(f"Layers: {t} rows of {x.dtype} at {start} do not fit")
        x = x.contiguous().clone()
        cos, sin = cos.contiguous(), sin.contiguous()
        _same(x, cos, sin)
        lib().dl_layers(_ptr(x), _bf(x), t, start, self.count, self.hidden, self.heads, self.kv_heads, self.head_dim,
                        self.ffn, self.length, self.eps, self.scale, ctypes.cast(self._table, ctypes.c_void_p),
                        _ptr(cos), _ptr(sin), _ptr(self._h), _ptr(self._qkv), _ptr(self._q), _ptr(self._att),
                        _ptr(self._gu), _ptr(self._act), _ptr(self._scratch), _ptr(self._work),
                        None if self._bias is None else ctypes.cast(self._bias, ctypes.c_void_p))
        return x
