/* draftline's own CPU kernels for the short forwards (decode, verify) of the lean decoder, AVX2+FMA.
 * Built and loaded by engine/native.py; the lean decoder falls back to torch ops without them.
 *
 * Why by hand: every row of a verify forward must be, bit for bit, the decode step of the same
 * token (so that greedy speculation equals plain greedy), and should not cost a row's worth of
 * torch op dispatch each. torch's per-token attention loop and its int8 GEMV are exact per row but
 * cost nearly in proportion to the rows. Here every row runs one fixed sequence of operations that
 * does not depend on the other rows, their number, or the thread that runs it: float32 FMAs in a
 * fixed order, integer block dot products (exact), and fixed horizontal sums. Built with
 * -ffp-contract=off and without fast-math, so the compiler keeps that order.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#define QK 32 /* inputs per activation block (one scale each) */

static inline float hsum8(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

/* Activations come and go as float32 or bfloat16 (`bf16` flags): bfloat16 is float32's top half,
 * and results are rounded to it to nearest, ties to even, as torch rounds (values here are finite). */
static inline float load_x(const void *x, int bf16, int64_t i) {
    if (!bf16) return ((const float *)x)[i];
    union { uint32_t u; float f; } v = {(uint32_t)((const uint16_t *)x)[i] << 16};
    return v.f;
}

static inline void store_y(void *y, int bf16, int64_t i, float value) {
    if (!bf16) {
        ((float *)y)[i] = value;
        return;
    }
    union { float f; uint32_t u; } v = {value};
    ((uint16_t *)y)[i] = (uint16_t)((v.u + 0x7FFFu + ((v.u >> 16) & 1u)) >> 16);
}

/* value rounded to bfloat16's precision when `bf16` (what storing it as bfloat16 keeps) */
static inline float rnd(float value, int bf16) {
    if (!bf16) return value;
    union { float f; uint32_t u; } v = {value};
    v.u = (v.u + 0x7FFFu + ((v.u >> 16) & 1u)) & 0xFFFF0000u;
    return v.f;
}

/* y[i] = value, or value + res[i] where there is a residual to add (rounded first, as a torch
 * matmul's result is before the addition) */
static inline void store_out(void *y, int bf16, const void *res, int64_t i, float value) {
    store_y(y, bf16, i, res ? rnd(value, bf16) + load_x(res, bf16, i) : value);
}

/* 8 lanes of load_x, rnd and store_y: the same values lane by lane */
static inline __m256 load8_x(const void *x, int bf16, int64_t i) {
    if (!bf16) return _mm256_loadu_ps((const float *)x + i);
    const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)x + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

static inline __m256i round_bits8(__m256 v) { /* float32 bits rounded to bfloat16's, nearest, ties to even */
    const __m256i u = _mm256_castps_si256(v);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    return _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), odd);
}

static inline __m256 rnd8(__m256 v, int bf16) {
    if (!bf16) return v;
    return _mm256_castsi256_ps(_mm256_and_si256(round_bits8(v), _mm256_set1_epi32((int)0xFFFF0000u)));
}

static inline void store8_y(void *y, int bf16, int64_t i, __m256 v) {
    if (!bf16) {
        _mm256_storeu_ps((float *)y + i, v);
        return;
    }
    const __m256i top = _mm256_srli_epi32(round_bits8(v), 16); /* 0..65535: packus keeps them */
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(top, top), 0x08);
    _mm_storeu_si128((__m128i *)((uint16_t *)y + i), _mm256_castsi256_si128(packed));
}

/* e^x, 8 lanes: x = n ln2 + r with |r| <= ln2/2, e^r by its Taylor polynomial to r^7 (relative
 * error < 1e-8, below float32's), times 2^n put into the exponent field. x is first clamped to
 * [-86, 88] so that the result is always a normal float (e^-86 ~ 4e-38 is nothing next to the 1
 * a softmax's maximum gives; e^88 ~ 1.7e38 is as good as infinity in 1 / (1 + e^-x)).
 * A fixed sequence of operations per lane. */
static inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-86.0f)), _mm256_set1_ps(88.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187045e-06f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23);
    return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), e));
}

/* RMSNorm of M rows of C: y = (x / sqrt(mean(x^2) + eps), rounded to x's dtype) * w, rounded again:
 * the operations of the torch version (engine/lean.py: LeanLM._rms); the squares summed in 8 lanes
 * (then the rest), a fixed order. */
void dl_rmsnorm(const void *x, int bf16, const void *w, int64_t M, int64_t C, float eps, void *y) {
    const int64_t C8 = C - C % 8;
    for (int64_t r = 0; r < M; r++) {
        __m256 acc = _mm256_setzero_ps();
        for (int64_t c = 0; c < C8; c += 8) {
            const __m256 v = load8_x(x, bf16, r * C + c);
            acc = _mm256_add_ps(acc, _mm256_mul_ps(v, v));
        }
        float ss = hsum8(acc);
        for (int64_t c = C8; c < C; c++) {
            const float v = load_x(x, bf16, r * C + c);
            ss = ss + v * v;
        }
        const float inv = 1.0f / sqrtf(ss / (float)C + eps);
        const __m256 vinv = _mm256_set1_ps(inv);
        for (int64_t c = 0; c < C8; c += 8)
            store8_y(y, bf16, r * C + c,
                     _mm256_mul_ps(rnd8(_mm256_mul_ps(load8_x(x, bf16, r * C + c), vinv), bf16), load8_x(w, bf16, c)));
        for (int64_t c = C8; c < C; c++)
            store_y(y, bf16, r * C + c, rnd(load_x(x, bf16, r * C + c) * inv, bf16) * load_x(w, bf16, c));
    }
}

/* RoPE on the q and k parts of T rows of qkv ((H + 2 KVH) * D each), as the torch version computes it
 * (x * cos + roll(x, D/2) * sin, `sin` with its first half negated, each product rounded to the
 * model's dtype); q goes to q_out (H, T, D) float32, k and v into the caches (KVH, L, D) float32
 * at positions start..start+T-1. cos, sin: (T, D) for those positions. 8 lanes where D/2 is a
 * multiple of 8, else one value at a time (the same values). */
void dl_rope_store(const void *qkv, int bf16, const void *cos, const void *sin, int64_t T, int64_t H,
                   int64_t KVH, int64_t D, float *q_out, float *kc, float *vc, int64_t L, int64_t start) {
    const int64_t row = (H + 2 * KVH) * D, half = D / 2;
    const int lanes = half % 8 == 0;
    for (int64_t i = 0; i < T; i++) {
        for (int64_t head = 0; head < H + KVH; head++) {
            const int64_t base = i * row + head * D;
            float *dst = head < H ? q_out + (head * T + i) * D : kc + ((head - H) * L + start + i) * D;
            if (lanes) {
                for (int64_t e = 0; e < D; e += 8) {
                    const int64_t other = e < half ? e + half : e - half;
                    const __m256 a = rnd8(_mm256_mul_ps(load8_x(qkv, bf16, base + e), load8_x(cos, bf16, i * D + e)), bf16);
                    const __m256 b = rnd8(_mm256_mul_ps(load8_x(qkv, bf16, base + other), load8_x(sin, bf16, i * D + e)), bf16);
                    _mm256_storeu_ps(dst + e, rnd8(_mm256_add_ps(a, b), bf16));
                }
                continue;
            }
            for (int64_t e = 0; e < D; e++) {
                const int64_t other = e < half ? e + half : e - half;
                const float a = rnd(load_x(qkv, bf16, base + e) * load_x(cos, bf16, i * D + e), bf16);
                const float b = rnd(load_x(qkv, bf16, base + other) * load_x(sin, bf16, i * D + e), bf16);
                dst[e] = rnd(a + b, bf16);
            }
        }
        for (int64_t head = 0; head < KVH; head++)
            for (int64_t e = 0; e < D; e++)
                vc[(head * L + start + i) * D + e] = load_x(qkv, bf16, i * row + (H + KVH + head) * D + e);
    }
}

/* SwiGLU's product for T rows of [gate | up] (2F each): out = silu(gate) * up, each rounded to the
 * model's dtype as torch rounds them; silu(g) = g / (1 + e^-g) with exp8 (8 lanes, then the rest). */
void dl_silu_mul(const void *gu, int bf16, int64_t T, int64_t F, void *out) {
    const int64_t F8 = F - F % 8;
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    for (int64_t i = 0; i < T; i++) {
        for (int64_t f = 0; f < F8; f += 8) {
            const __m256 g = load8_x(gu, bf16, i * 2 * F + f);
            const __m256 silu = rnd8(_mm256_div_ps(g, _mm256_add_ps(one, exp8(_mm256_sub_ps(zero, g)))), bf16);
            store8_y(out, bf16, i * F + f, _mm256_mul_ps(silu, load8_x(gu, bf16, i * 2 * F + F + f)));
        }
        for (int64_t f = F8; f < F; f++) {
            float lane[8] = {0};
            lane[0] = -load_x(gu, bf16, i * 2 * F + f);
            float ex[8];
            _mm256_storeu_ps(ex, exp8(_mm256_loadu_ps(lane)));
            const float g = -lane[0];
            const float silu = rnd(g / (1.0f + ex[0]), bf16);
            store_y(out, bf16, i * F + f, silu * load_x(gu, bf16, i * 2 * F + F + f));
        }
    }
}

/* the four sums of v0..v3's lanes, in one fixed order */
static inline __m128 hsum8x4(__m256 v0, __m256 v1, __m256 v2, __m256 v3) {
    const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(v0, v1), _mm256_hadd_ps(v2, v3));
    return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

/* Scores j..j+3 of one query row qi against keys kg (rows of D floats), of its n keys: two accumulators a
 * key (8-lane chunks 0, 2, 4.. and 1, 3, 5..), then the D % 8 rest one product at a time, times scale;
 * past the row's last key the group is padded with repeats of it, and those lanes are not stored. */
static inline void score4(const float *qi, const float *kg, int64_t j, int64_t n, int64_t D, int64_t D8,
                          __m128 vscale, float *s) {
    const float *k0 = kg + j * D, *k1 = kg + (j + 1 < n ? j + 1 : n - 1) * D,
                *k2 = kg + (j + 2 < n ? j + 2 : n - 1) * D, *k3 = kg + (j + 3 < n ? j + 3 : n - 1) * D;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    int64_t e = 0;
    for (; e + 16 <= D8; e += 16) {
        const __m256 qa = _mm256_loadu_ps(qi + e), qb = _mm256_loadu_ps(qi + e + 8);
        a0 = _mm256_fmadd_ps(qa, _mm256_loadu_ps(k0 + e), a0);
        a1 = _mm256_fmadd_ps(qa, _mm256_loadu_ps(k1 + e), a1);
        a2 = _mm256_fmadd_ps(qa, _mm256_loadu_ps(k2 + e), a2);
        a3 = _mm256_fmadd_ps(qa, _mm256_loadu_ps(k3 + e), a3);
        b0 = _mm256_fmadd_ps(qb, _mm256_loadu_ps(k0 + e + 8), b0);
        b1 = _mm256_fmadd_ps(qb, _mm256_loadu_ps(k1 + e + 8), b1);
        b2 = _mm256_fmadd_ps(qb, _mm256_loadu_ps(k2 + e + 8), b2);
        b3 = _mm256_fmadd_ps(qb, _mm256_loadu_ps(k3 + e + 8), b3);
    }
    if (e < D8) {
        const __m256 qa = _mm256_loadu_ps(qi + e);
        a0 = _mm256_fmadd_ps(qa, _mm256_loadu_ps(k0 + e), a0);
        a1 = _mm256_fmadd_ps(qa, _mm256_loadu_ps(k1 + e), a1);
        a2 = _mm256_fmadd_ps(qa, _mm256_loadu_ps(k2 + e), a2);
        a3 = _mm256_fmadd_ps(qa, _mm256_loadu_ps(k3 + e), a3);
    }
    __m128 dots = hsum8x4(_mm256_add_ps(a0, b0), _mm256_add_ps(a1, b1), _mm256_add_ps(a2, b2), _mm256_add_ps(a3, b3));
    if (D8 < D) { /* the last D % 8 products, one at a time */
        float d4[4];
        _mm_storeu_ps(d4, dots);
        for (int64_t r = D8; r < D; r++) {
            d4[0] = d4[0] + qi[r] * k0[r];
            d4[1] = d4[1] + qi[r] * k1[r];
            d4[2] = d4[2] + qi[r] * k2[r];
            d4[3] = d4[3] + qi[r] * k3[r];
        }
        dots = _mm_loadu_ps(d4);
    }
    dots = _mm_mul_ps(dots, vscale);
    if (j + 4 <= n)
        _mm_storeu_ps(s + j, dots);
    else /* s holds n scores: the lanes past the last key are not stored */
        _mm_maskstore_ps(s + j, _mm_cmplt_epi32(_mm_setr_epi32(0, 1, 2, 3), _mm_set1_epi32((int)(n - j))), dots);
}

/* The scores s (n of them) replaced by e^(s - max), 8 lanes at a time (the last lanes masked); returns
 * 1 / their sum. */
static inline float softmax_row(float *s, int64_t n) {
    __m256 vmax = _mm256_set1_ps(-INFINITY);
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(s + j));
    float mx = -INFINITY, lanes[8];
    _mm256_storeu_ps(lanes, vmax);
    for (int l = 0; l < 8; l++) mx = lanes[l] > mx ? lanes[l] : mx;
    for (; j < n; j++) mx = s[j] > mx ? s[j] : mx;
    const __m256 vmx = _mm256_set1_ps(mx);
    __m256 vsum = _mm256_setzero_ps();
    for (j = 0; j < n; j += 8) {
        if (j + 8 <= n) {
            const __m256 p = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), vmx));
            _mm256_storeu_ps(s + j, p);
            vsum = _mm256_add_ps(vsum, p);
        } else { /* the last n - j scores: the other lanes are zeros, added as zeros */
            float tail[8] = {0};
            for (int64_t c = 0; c < n - j; c++) tail[c] = s[j + c] - mx;
            const __m256 keep = _mm256_cmp_ps(_mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7),
                                              _mm256_set1_ps((float)(n - j)), _CMP_LT_OQ);
            const __m256 p = _mm256_and_ps(exp8(_mm256_loadu_ps(tail)), keep);
            _mm256_storeu_ps(tail, p);
            for (int64_t c = 0; c < n - j; c++) s[j + c] = tail[c];
            vsum = _mm256_add_ps(vsum, p);
        }
    }
    return 1.0f / hsum8(vsum);
}

#define ATT_ROWS 4  /* rows of one head attended together: they share each block of keys and values */
#define ATT_KEYS 64 /* keys per block of values, while the rows' accumulators wait in memory */

/* Causal attention of T new tokens after `start` cached ones, one query row at a time.
 * q (H, T, D), float32 or bfloat16 (q_bf16); the caches (KVH, L, D) float32 already hold the new
 * tokens' keys and values at start..start+T-1; row i attends to positions 0..start+i.
 * out (T, H, D), float32 or bfloat16 (out_bf16); work (T*H, L + D) float32 scratch.
 * H is a multiple of KVH (the heads of a group share a KV head); D is any size (8 lanes, then the rest).
 * Row i's operations depend only on its query and its n = start + i + 1 keys: scores four keys at a
 * time (score4), softmax with exp8 over 8 lanes (softmax_row), values eight 8-lane accumulators at a
 * time, each summed over the keys in order. Up to ATT_ROWS rows of a head are one work item: they go
 * through the keys together, each block of keys and values read once for all of them (a row's
 * accumulators wait in its scratch between blocks: stored and loaded, the same values), so the
 * order of every row's operations is the one a row alone gets. */
void dl_attend(const void *q, int q_bf16, const float *kc, const float *vc, int64_t T, int64_t H, int64_t KVH,
               int64_t D, int64_t L, int64_t start, float scale, void *out, int out_bf16, float *work) {
    const int64_t group = H / KVH, D8 = D - D % 8, G = (T + ATT_ROWS - 1) / ATT_ROWS;
    const __m128 vscale = _mm_set1_ps(scale);
#pragma omp parallel for schedule(static)
    for (int64_t item = 0; item < G * H; item++) {
        const int64_t g = item / H, h = item % H;
        const int64_t i0 = g * ATT_ROWS, i1 = i0 + ATT_ROWS < T ? i0 + ATT_ROWS : T;
        const int64_t last = start + i1; /* the last row's key count */
        const float *kg = kc + (h / group) * L * D, *vg = vc + (h / group) * L * D;
        float inv[ATT_ROWS];
        for (int64_t i = i0; i < i1; i++) {
            float *qi = work + (i * H + h) * (L + D) + L;
            for (int64_t e = 0; e < D; e++) qi[e] = load_x(q, q_bf16, (h * T + i) * D + e);
        }
        for (int64_t j = 0; j < last; j += 4)
            for (int64_t i = i0; i < i1; i++) {
                const int64_t n = start + i + 1;
                float *s = work + (i * H + h) * (L + D);
                if (j < n) score4(s + L, kg, j, n, D, D8, vscale, s);
            }
        for (int64_t i = i0; i < i1; i++) inv[i - i0] = softmax_row(work + (i * H + h) * (L + D), start + i + 1);
        float lanes[8];
        int64_t e = 0;
        for (; e + 64 <= D8; e += 64) {
            for (int64_t jb = 0; jb < last; jb += ATT_KEYS)
                for (int64_t i = i0; i < i1; i++) {
                    const int64_t n = start + i + 1, stop = jb + ATT_KEYS < n ? jb + ATT_KEYS : n;
                    if (jb >= n) continue;
                    const float *s = work + (i * H + h) * (L + D);
                    float *acc = work + (i * H + h) * (L + D) + L; /* the query's place, free again */
                    __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0;
                    if (jb > 0) {
                        c0 = _mm256_loadu_ps(acc), c1 = _mm256_loadu_ps(acc + 8), c2 = _mm256_loadu_ps(acc + 16);
                        c3 = _mm256_loadu_ps(acc + 24), c4 = _mm256_loadu_ps(acc + 32), c5 = _mm256_loadu_ps(acc + 40);
                        c6 = _mm256_loadu_ps(acc + 48), c7 = _mm256_loadu_ps(acc + 56);
                    }
                    for (int64_t jj = jb; jj < stop; jj++) {
                        const __m256 p = _mm256_broadcast_ss(s + jj);
                        const float *v = vg + jj * D + e;
                        c0 = _mm256_fmadd_ps(p, _mm256_loadu_ps(v), c0);
                        c1 = _mm256_fmadd_ps(p, _mm256_loadu_ps(v + 8), c1);
                        c2 = _mm256_fmadd_ps(p, _mm256_loadu_ps(v + 16), c2);
                        c3 = _mm256_fmadd_ps(p, _mm256_loadu_ps(v + 24), c3);
                        c4 = _mm256_fmadd_ps(p, _mm256_loadu_ps(v + 32), c4);
                        c5 = _mm256_fmadd_ps(p, _mm256_loadu_ps(v + 40), c5);
                        c6 = _mm256_fmadd_ps(p, _mm256_loadu_ps(v + 48), c6);
                        c7 = _mm256_fmadd_ps(p, _mm256_loadu_ps(v + 56), c7);
                    }
                    _mm256_storeu_ps(acc, c0), _mm256_storeu_ps(acc + 8, c1), _mm256_storeu_ps(acc + 16, c2);
                    _mm256_storeu_ps(acc + 24, c3), _mm256_storeu_ps(acc + 32, c4), _mm256_storeu_ps(acc + 40, c5);
                    _mm256_storeu_ps(acc + 48, c6), _mm256_storeu_ps(acc + 56, c7);
                }
            for (int64_t i = i0; i < i1; i++) {
                const float *acc = work + (i * H + h) * (L + D) + L;
                const __m256 vinv = _mm256_set1_ps(inv[i - i0]);
                const int64_t o = (i * H + h) * D;
                for (int c = 0; c < 8; c++) {
                    _mm256_storeu_ps(lanes, _mm256_mul_ps(_mm256_loadu_ps(acc + 8 * c), vinv));
                    for (int l = 0; l < 8; l++) store_y(out, out_bf16, o + e + 8 * c + l, lanes[l]);
                }
            }
        }
        for (int64_t i = i0; i < i1; i++) { /* the rest of D (head sizes not a multiple of 64), row by row */
            const int64_t n = start + i + 1, o = (i * H + h) * D;
            const float *s = work + (i * H + h) * (L + D);
            const __m256 vinv = _mm256_set1_ps(inv[i - i0]);
            int64_t f = e;
            for (; f < D8; f += 8) {
                __m256 c0 = _mm256_setzero_ps();
                for (int64_t jj = 0; jj < n; jj++)
                    c0 = _mm256_fmadd_ps(_mm256_broadcast_ss(s + jj), _mm256_loadu_ps(vg + jj * D + f), c0);
                _mm256_storeu_ps(lanes, _mm256_mul_ps(c0, vinv));
                for (int l = 0; l < 8; l++) store_y(out, out_bf16, o + f + l, lanes[l]);
            }
            for (; f < D; f++) {
                float acc = 0.0f;
                for (int64_t jj = 0; jj < n; jj++) acc = acc + s[jj] * vg[jj * D + f];
                store_y(out, out_bf16, o + f, acc * inv[i - i0]);
            }
        }
    }
}

/* x (M, K) float32 or bfloat16 -> int8 xq (M, K) and dx (M, K/32): per block of 32, x ~ dx * xq, |xq| <= 127
 * (xq = x * (127 / max |x|) rounded to nearest, ties to even); xs (M, K/32), when not NULL: dx times the
 * block's sum of xq (the Q4_1 kernel's m term). 8 lanes at a time; each value's arithmetic is the
 * scalar one's, and a row's result never depends on the others. K must be a multiple of 32. */
static void quantize_q8(const void *x, int bf16, int64_t M, int64_t K, int8_t *xq, float *dx, float *xs) {
    const int64_t nb = K / QK;
    const __m256 nosign = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    const __m256i lim = _mm256_set1_epi32(127), nlim = _mm256_set1_epi32(-127);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t r = 0; r < M; r++) {
        for (int64_t b = 0; b < nb; b++) {
            const int64_t at = r * K + b * QK;
            __m256 v[4];
            for (int c = 0; c < 4; c++) v[c] = load8_x(x, bf16, at + 8 * c);
            const __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v[0], nosign), _mm256_and_ps(v[1], nosign)),
                                           _mm256_max_ps(_mm256_and_ps(v[2], nosign), _mm256_and_ps(v[3], nosign)));
            float lanes[8], amax = 0.0f;
            _mm256_storeu_ps(lanes, m);
            for (int l = 0; l < 8; l++) amax = lanes[l] > amax ? lanes[l] : amax;
            const __m256 id = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
            __m256i q[4];
            for (int c = 0; c < 4; c++) {
                const __m256 t = _mm256_round_ps(_mm256_mul_ps(v[c], id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                q[c] = _mm256_max_epi32(_mm256_min_epi32(_mm256_cvtps_epi32(t), lim), nlim);
            }
            /* packs work within 128-bit halves: the permute puts the 32 bytes back in input order */
            const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
            _mm256_storeu_si256((__m256i *)(xq + at), _mm256_permutevar8x32_epi32(bytes, order));
            dx[r * nb + b] = amax / 127.0f;
            if (xs) {
                int ints[8], sum = 0;
                _mm256_storeu_si256((__m256i *)ints,
                                    _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
                for (int l = 0; l < 8; l++) sum += ints[l];
                xs[r * nb + b] = dx[r * nb + b] * (float)sum;
            }
        }
    }
}

/* The integer lanes of an int8 block's dot product of weights w and an input row: lane l (of 8) =
 * the sum of the products of bytes 4l..4l+3. Two ways to the same integers (so the same results):
 * - AVX2: |w| (unsigned) against the input carrying w's signs (Q8_PREP_AVX2 makes |w| once per weight
 *   block, the step signs each row's input), in two steps (pairs into 16 bits, which cannot saturate
 *   here: |products| <= 127 * 127);
 * - AVX512-VNNI: the input offset to unsigned (xu = xq + 128, made once per call) against w, in one
 *   instruction that starts from -128 * (the lane's sum of w), made once per weight block
 *   (Q8_PREP_VNNI): (xq + 128) . w - 128 . w = xq . w, exact in 32 bits; no per-row sign step. */
#define Q8_PREP_AVX2(w) _mm256_sign_epi8(w, w)
#define Q8_LANES_AVX2(aux, w, a) _mm256_madd_epi16(_mm256_maddubs_epi16(aux, _mm256_sign_epi8(a, w)), _mm256_set1_epi16(1))
#define Q8_PREP_VNNI(w) \
    _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8((char)0x80), w))
#define Q8_LANES_VNNI(aux, w, a) _mm256_dpbusd_epi32(aux, a, w)

/* One row's step over an int8 block: acc += float(dot of w and a) * s. Every row of every call runs
 * exactly this. */
#define Q8_ROW(LANES, acc, aux, w, a, s) acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(LANES(aux, w, a)), s, acc)

/* int8 weights are kept in tiles of Q8_NW rows, block by block: tile t holds, for each block b in order,
 * the 32 bytes of rows 4t, 4t+1, 4t+2, 4t+3 (a last partial tile is padded with zero rows). A tile's
 * bytes are then read in order, one stream, as a product needs them (rows read side by side from the
 * plain (N, K) layout made four streams, and the output head, read from memory, ran at a third of the
 * speed). engine/native.py's q8_tile makes this layout. */
#define Q8_NW 4

/* Rows r+I0..r+I0+R-1 of x against the four weight rows of a tile (I0, R constants, so the accumulators
 * stay in registers): 4 * R independent FMA chains, so that one chain's latency (an FMA waits for the
 * previous block's) does not hold the others up. Each output still runs Q8_ROW over its blocks in
 * order, exactly as alone, whatever the tile. Padding rows are not stored. ROWS_INNER: per block, all
 * four weight blocks are loaded first and each row's input once (32 vector registers: VNNI builds);
 * else one weight block at a time against each row's input (AVX2's 16 registers; the inputs come
 * from L1 again). The order of different outputs' operations does not change any output's bits. */
#define Q8_TILE(PREP, LANES, I0, R, ROWS_INNER)                                                            \
    do {                                                                                                   \
        __m256 acc[Q8_NW][R];                                                                              \
        _Pragma("GCC unroll 8") for (int j = 0; j < Q8_NW; j++)                                            \
        _Pragma("GCC unroll 8") for (int i = 0; i < R; i++) acc[j][i] = _mm256_setzero_ps();               \
        for (int64_t b = 0; b < nb; b++) {                                                                 \
            if (ROWS_INNER) {                                                                              \
                __m256i w[Q8_NW], aux[Q8_NW];                                                              \
                _Pragma("GCC unroll 8") for (int j = 0; j < Q8_NW; j++) {                                  \
                    w[j] = _mm256_loadu_si256((const __m256i *)(wt + (b * Q8_NW + j) * QK));               \
                    aux[j] = PREP(w[j]);                                                                   \
                }                                                                                          \
                _Pragma("GCC unroll 8") for (int i = 0; i < R; i++) {                                      \
                    const __m256i a = _mm256_loadu_si256((const __m256i *)(x0 + (I0 + i) * K + b * QK));   \
                    const __m256 s = _mm256_set1_ps(e0[(I0 + i) * nb + b]);                                \
                    _Pragma("GCC unroll 8") for (int j = 0; j < Q8_NW; j++)                                \
                        Q8_ROW(LANES, acc[j][i], aux[j], w[j], a, s);                                      \
                }                                                                                          \
            } else {                                                                                       \
                _Pragma("GCC unroll 8") for (int j = 0; j < Q8_NW; j++) {                                  \
                    const __m256i w = _mm256_loadu_si256((const __m256i *)(wt + (b * Q8_NW + j) * QK));    \
                    const __m256i aux = PREP(w);                                                           \
                    _Pragma("GCC unroll 8") for (int i = 0; i < R; i++)                                    \
                        Q8_ROW(LANES, acc[j][i], aux, w,                                                   \
                               _mm256_loadu_si256((const __m256i *)(x0 + (I0 + i) * K + b * QK)),          \
                               _mm256_set1_ps(e0[(I0 + i) * nb + b]));                                     \
                }                                                                                          \
            }                                                                                              \
        }                                                                                                  \
        _Pragma("GCC unroll 8") for (int j = 0; j < Q8_NW; j++)                                            \
            if (n0 + j < N)                                                                                \
                _Pragma("GCC unroll 8") for (int i = 0; i < R; i++)                                        \
                    store_out(y, y_bf16, res, (r + I0 + i) * N + n0 + j, hsum8(acc[j][i]) * ws[n0 + j]);   \
    } while (0)

/* y (M, N) = x W^T for int8 weights wq (Q8_NW-row tiles, above) with one float32 scale per output ws
 * (N), and x given as quantize_q8's blocks. A tile of weights against up to four rows of x at a time:
 * each weight block is read from memory once for them. WIDE (VNNI builds, 32 vector registers): the
 * four rows in one pass; else (AVX2, 16) at most two rows a pass, the tile read again from L1. */
#define DEFINE_Q8_GEMM(NAME, PREP, LANES, WIDE)                                                            \
    static void NAME(const int8_t *wq, const float *ws, int64_t N, int64_t K, const int8_t *xq,            \
                     const float *dx, int64_t M, void *y, int y_bf16, const void *res) {                  \
        const int64_t nb = K / QK, tiles = (N + Q8_NW - 1) / Q8_NW;                                        \
        _Pragma("omp parallel for schedule(static)")                                                       \
        for (int64_t t = 0; t < tiles; t++) {                                                              \
            const int64_t n0 = t * Q8_NW;                                                                  \
            const int8_t *wt = wq + n0 * K;                                                                \
            for (int64_t r = 0; r < M; r += 4) {                                                           \
                const int8_t *x0 = xq + r * K;                                                             \
                const float *e0 = dx + r * nb;                                                             \
                switch (M - r < 4 ? M - r : 4) { /* 4, or the 1-3 rows left */                             \
                case 1: Q8_TILE(PREP, LANES, 0, 1, WIDE); break;                                           \
                case 2: Q8_TILE(PREP, LANES, 0, 2, WIDE); break;                                           \
                case 3:                                                                                    \
                    if (WIDE) Q8_TILE(PREP, LANES, 0, 3, 1);                                               \
                    else { Q8_TILE(PREP, LANES, 0, 2, 0); Q8_TILE(PREP, LANES, 2, 1, 0); }                 \
                    break;                                                                                 \
                default:                                                                                   \
                    if (WIDE) Q8_TILE(PREP, LANES, 0, 4, 1);                                               \
                    else { Q8_TILE(PREP, LANES, 0, 2, 0); Q8_TILE(PREP, LANES, 2, 2, 0); }                 \
                    break;                                                                                 \
                }                                                                                          \
            }                                                                                              \
        }                                                                                                  \
    }

/* m . xs over a row's blocks: 8 lanes in a fixed order, then the rest; a row's bits never depend on others. */
static inline float dot_blocks(const float *m, const float *xs, int64_t nb) {
    __m256 acc = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b + 8 <= nb; b += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(m + b), _mm256_loadu_ps(xs + b), acc);
    float sum = hsum8(acc);
    for (; b < nb; b++) sum = sum + m[b] * xs[b];
    return sum;
}

/* The Q4_1 products take their input in pairs of blocks, as the weights' bytes come: 32 bytes of qs
 * hold blocks b and b+1, their low nibbles inputs 0..15 and their high nibbles inputs 16..31. So a
 * row's int8 input is laid out per pair as [b: 0..15 | b+1: 0..15 | b: 16..31 | b+1: 16..31] (64
 * bytes; a last odd block is paired with zeros), and its scales as [dx_b x4 | dx_b+1 x4]. One load,
 * a shift and two ANDs then unpack two blocks for every row, and a row's step over a pair is two
 * integer dots (lanes 0..3: block b, 4..7: block b+1), one conversion and one FMA.
 * x1 (M, P*64), dxe (M, P*8), P = ceil(nb / 2), from xq (M, K) and dx (M, nb). */
static void pair_q4_input(const int8_t *xq, const float *dx, int64_t M, int64_t K, int8_t *x1, float *dxe) {
    const int64_t nb = K / QK, P = (nb + 1) / 2;
    for (int64_t r = 0; r < M; r++)
        for (int64_t p = 0; p < P; p++) {
            int8_t *o = x1 + (r * P + p) * 64;
            float *e = dxe + (r * P + p) * 8;
            const int8_t *b0 = xq + r * K + 2 * p * QK;
            const int two = 2 * p + 1 < nb;
            for (int j = 0; j < 16; j++) {
                o[j] = b0[j];
                o[32 + j] = b0[16 + j];
                o[16 + j] = two ? b0[QK + j] : 0;
                o[48 + j] = two ? b0[QK + 16 + j] : 0;
            }
            for (int j = 0; j < 4; j++) {
                e[j] = dx[r * nb + 2 * p];
                e[4 + j] = two ? dx[r * nb + 2 * p + 1] : 0.0f;
            }
        }
}

/* The integer lanes of a pair's dot: lo . x_lo + hi . x_hi (lane l: four products of each); AVX2 in two
 * steps per half (pairs into 16 bits cannot saturate: 15 * 127 * 2), VNNI in one; the same integers. */
#define PAIR_AVX2(lo, a, hi, b)                                                                            \
    _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(lo, a), _mm256_set1_epi16(1)),                 \
                     _mm256_madd_epi16(_mm256_maddubs_epi16(hi, b), _mm256_set1_epi16(1)))
#define PAIR_VNNI(lo, a, hi, b) _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), lo, a), hi, b)

/* One row's step over a pair: acc += float(lanes) * (d pair * dx pair). Every row runs exactly this. */
#define Q4_PAIR(PAIR, acc, lo, hi, xr, er, dd)                                                             \
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(PAIR(lo, _mm256_loadu_si256((const __m256i *)(xr)), hi,      \
                                                  _mm256_loadu_si256((const __m256i *)((xr) + 32)))),     \
                          _mm256_mul_ps(dd, _mm256_loadu_ps(er)), acc)

/* y (M, N) = x W^T for Q4_1 weights (llama.cpp's block: a scale d and a minimum m per 32 inputs,
 * the weight is d * q + m with q in 0..15) and x given as pair_q4_input's layout, with the block
 * sums xs (M, K/32: dx times the sum of the block's xq) for the m term:
 *   y = sum over blocks of d * dx * (q . xq)  +  m . xs.
 * qs uint8 (N, K/2): byte j of a block holds input j (low nibble) and input j + 16 (high nibble);
 * d, m float32 (N, K/32). Each pair of weight blocks is unpacked once for up to four rows. */
#define DEFINE_Q4_GEMM(NAME, PAIR)                                                                         \
    static void NAME(const uint8_t *qs, const float *d, const float *m, int64_t N, int64_t K,              \
                     const int8_t *x1, const float *dxe, const float *xs, int64_t M, void *y, int y_bf16,  \
                     const void *res) {                                                                    \
        const int64_t nb = K / QK, P = (nb + 1) / 2;                                                       \
        const __m256i low4 = _mm256_set1_epi8(0x0F), idx = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);     \
        _Pragma("omp parallel for schedule(static)")                                                       \
        for (int64_t n = 0; n < N; n++) {                                                                  \
            const uint8_t *wn = qs + n * (K / 2);                                                          \
            const float *dn = d + n * nb, *mn = m + n * nb;                                                \
            int64_t r = 0;                                                                                 \
            for (; r < M; r += 4) {                                                                        \
                const int64_t rows = M - r < 4 ? M - r : 4; /* 4, or the 1-3 rows left: each row alike */  \
                const int8_t *x0 = x1 + r * P * 64;                                                        \
                const float *e0 = dxe + r * P * 8;                                                         \
                __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                                \
                for (int64_t p = 0; p < P; p++) {                                                          \
                    __m256i raw;                                                                           \
                    __m256 dd;                                                                             \
                    if (2 * p + 1 < nb) {                                                                  \
                        raw = _mm256_loadu_si256((const __m256i *)(wn + p * 32));                          \
                        dd = _mm256_permutevar8x32_ps(                                                     \
                            _mm256_castps128_ps256(_mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)(dn + 2 * p)))), idx); \
                    } else { /* a last odd block: its 16 bytes, the other half zeros (times zero inputs) */ \
                        raw = _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)(wn + p * 32)));     \
                        dd = _mm256_setr_ps(dn[2 * p], dn[2 * p], dn[2 * p], dn[2 * p], 0, 0, 0, 0);       \
                    }                                                                                      \
                    const __m256i lo = _mm256_and_si256(raw, low4);                                        \
                    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);                  \
                    Q4_PAIR(PAIR, a0, lo, hi, x0 + p * 64, e0 + p * 8, dd);                                \
                    if (rows > 1) Q4_PAIR(PAIR, a1, lo, hi, x0 + (P + p) * 64, e0 + (P + p) * 8, dd);      \
                    if (rows > 2) Q4_PAIR(PAIR, a2, lo, hi, x0 + (2 * P + p) * 64, e0 + (2 * P + p) * 8, dd); \
                    if (rows > 3) Q4_PAIR(PAIR, a3, lo, hi, x0 + (3 * P + p) * 64, e0 + (3 * P + p) * 8, dd); \
                }                                                                                          \
                const __m256 acc[4] = {a0, a1, a2, a3};                                                    \
                for (int64_t i = 0; i < rows; i++)                                                         \
                    store_out(y, y_bf16, res, (r + i) * N + n,                                             \
                              hsum8(acc[i]) + dot_blocks(mn, xs + (r + i) * nb, nb));                      \
            }                                                                                              \
        }                                                                                                  \
    }

DEFINE_Q8_GEMM(q8_gemm_avx2, Q8_PREP_AVX2, Q8_LANES_AVX2, 0)
DEFINE_Q4_GEMM(q4_gemm_avx2, PAIR_AVX2)
#if defined(__GNUC__) && !defined(DL_NO_VNNI)
#define VNNI __attribute__((target("avx512f,avx512vl,avx512vnni")))
VNNI DEFINE_Q8_GEMM(q8_gemm_vnni, Q8_PREP_VNNI, Q8_LANES_VNNI, 1)
VNNI DEFINE_Q4_GEMM(q4_gemm_vnni, PAIR_VNNI)
static int vnni_ok(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512vnni");
}
#else
#define q8_gemm_vnni q8_gemm_avx2
#define q4_gemm_vnni q4_gemm_avx2
static int vnni_ok(void) { return 0; }
#endif

/* The int8 weight layout this file's products read: tiles of this many rows (engine/native.py checks it). */
int dl_q8_tiles(void) { return Q8_NW; }

static int use_vnni = -1; /* -1: not decided yet */

/* Which integer dot the products use: want 0 = AVX2's, 1 = AVX512-VNNI's where the CPU has it,
 * -1 = keep (the first call decides: VNNI where there is one). The results are the same bits either
 * way; only the time differs. Returns 1 if VNNI is in use. */
int dl_vnni(int want) {
    if (want >= 0 || use_vnni < 0) use_vnni = (want != 0) && vnni_ok();
    return use_vnni;
}

/* xq (M, K) is the call's own copy: VNNI's products take it offset to unsigned, in place (Q8_PREP_VNNI). */
static void q8_gemm(const int8_t *wq, const float *ws, int64_t N, int64_t K, int8_t *xq, const float *dx,
                    int64_t M, void *y, int y_bf16, const void *res) {
    if (!dl_vnni(-1)) {
        q8_gemm_avx2(wq, ws, N, K, xq, dx, M, y, y_bf16, res);
        return;
    }
    const __m256i flip = _mm256_set1_epi8((char)0x80); /* xq + 128 as an unsigned byte */
    for (int64_t i = 0; i < M * K; i += 32)
        _mm256_storeu_si256((__m256i *)(xq + i), _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(xq + i)), flip));
    q8_gemm_vnni(wq, ws, N, K, xq, dx, M, y, y_bf16, res);
}

static void q4_gemm(const uint8_t *qs, const float *d, const float *m, int64_t N, int64_t K, const int8_t *xq,
                    const float *dx, const float *xs, int64_t M, void *y, int y_bf16, const void *res) {
    (dl_vnni(-1) ? q4_gemm_vnni : q4_gemm_avx2)(qs, d, m, N, K, xq, dx, xs, M, y, y_bf16, res);
}

/* The entry points: y (M, N) = x W^T (+ res, (M, N) in y's dtype, where not NULL), x and y float32
 * or bfloat16 (the flags), x quantized into `scratch` (at least 2*M*K + 24*M*(K/32) + 64*M bytes) and multiplied.
 * int8 weights wq in Q8_NW-row tiles (ceil(N / Q8_NW) * Q8_NW rows); Q4_1 weights in plain rows. */
void dl_q8_linear(const void *x, int x_bf16, int64_t M, int64_t K, const int8_t *wq, const float *ws, int64_t N,
                  void *y, int y_bf16, const void *res, uint8_t *scratch) {
    int8_t *xq = (int8_t *)scratch;
    float *dx = (float *)(scratch + M * K);
    quantize_q8(x, x_bf16, M, K, xq, dx, NULL);
    q8_gemm(wq, ws, N, K, xq, dx, M, y, y_bf16, res);
}

void dl_q4_linear(const void *x, int x_bf16, int64_t M, int64_t K, const uint8_t *qs, const float *d,
                  const float *m, int64_t N, void *y, int y_bf16, const void *res, uint8_t *scratch) {
    const int64_t nb = K / QK, P = (nb + 1) / 2;
    int8_t *xq = (int8_t *)scratch, *x1 = xq + M * K;
    float *dx = (float *)(x1 + M * P * 64), *xs = dx + M * nb, *dxe = xs + M * nb;
    quantize_q8(x, x_bf16, M, K, xq, dx, xs);
    pair_q4_input(xq, dx, M, K, x1, dxe);
    q4_gemm(qs, d, m, N, K, x1, dxe, xs, M, y, y_bf16, res);
}

/* One linear of dl_layers' table: (w, s1, s2, kind): kind 0 = int8 (w int8 (N, K), s1 float32 scales (N)),
 * kind 1 = Q4_1 (w = qs (N, K/2), s1 = d, s2 = m (N, K/32) float32). */
static void linear_any(void *const *p, const void *x, int bf16, int64_t M, int64_t K, int64_t N, void *y,
                       const void *res, uint8_t *scratch) {
    if ((intptr_t)p[3] == 1)
        dl_q4_linear(x, bf16, M, K, (const uint8_t *)p[0], (const float *)p[1], (const float *)p[2], N, y, bf16, res,
                     scratch);
    else
        dl_q8_linear(x, bf16, M, K, (const int8_t *)p[0], (const float *)p[1], N, y, bf16, res, scratch);
}

/* All the layers of a short forward (decode, verify) of a Llama-style decoder with int8 or Q4_1 weights
 * and no biases, in one call: per layer the same nine steps, with the same arguments, as LeanLM's
 * _native_layers makes one call at a time (so the same bits), without a call's overhead each.
 * x (T, C) float32 or bfloat16 (bf16) is updated in place: the residual additions write into it.
 * ptrs: 20 per layer: ln1, then 4 for each of the linears qkv, o (see linear_any), ln2, then gate_up
 * and down, then the k and v caches ((KVH, L, D) float32). cos, sin (T, D) for positions
 * start..start+T-1 in x's dtype. Scratch: h (T, C), qkv (T, (H + 2 KVH) D), att (T, H D), gu (T, 2F),
 * act (T, F) in x's dtype; q (H, T, D) float32; scratch: the products', for the largest K; work: dl_attend's. */
void dl_layers(void *x, int bf16, int64_t T, int64_t start, int64_t NL, int64_t C, int64_t H, int64_t KVH,
               int64_t D, int64_t F, int64_t L, float eps, float scale, void *const *ptrs, const void *cos,
               const void *sin, void *h, void *qkv, float *q, void *att, void *gu, void *act, uint8_t *scratch,
               float *work, void *const *qkv_bias) {
    const int64_t nqkv = (H + 2 * KVH) * D;
    for (int64_t l = 0; l < NL; l++) {
        void *const *p = ptrs + 20 * l;
        float *kc = (float *)p[18], *vc = (float *)p[19];
        dl_rmsnorm(x, bf16, p[0], T, C, eps, h);
        linear_any(p + 1, h, bf16, T, C, nqkv, qkv, NULL, scratch);
        if (qkv_bias && qkv_bias[l]) /* Qwen2's q/k/v biases: added to the stored product, as torch's y + b is */
            for (int64_t i = 0; i < T * nqkv; i++)
                store_y(qkv, bf16, i, load_x(qkv, bf16, i) + load_x(qkv_bias[l], bf16, i % nqkv));
        dl_rope_store(qkv, bf16, cos, sin, T, H, KVH, D, q, kc, vc, L, start);
        dl_attend(q, 0, kc, vc, T, H, KVH, D, L, start, scale, att, bf16, work);
        linear_any(p + 5, att, bf16, T, H * D, C, x, x, scratch);
        dl_rmsnorm(x, bf16, p[9], T, C, eps, h);
        linear_any(p + 10, h, bf16, T, C, 2 * F, gu, NULL, scratch);
        dl_silu_mul(gu, bf16, T, F, act);
        linear_any(p + 14, act, bf16, T, F, C, x, x, scratch);
    }
}
