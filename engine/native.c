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

/* RMSNorm of M rows of C: y = (x / sqrt(mean(x^2) + eps), rounded to x's dtype) * w, rounded again:
 * the operations of the torch version (engine/lean.py: LeanLM._rms), sums in a fixed order. */
void dl_rmsnorm(const void *x, int bf16, const void *w, int64_t M, int64_t C, float eps, void *y) {
    for (int64_t r = 0; r < M; r++) {
        float ss = 0.0f;
        for (int64_t c = 0; c < C; c++) {
            const float v = load_x(x, bf16, r * C + c);
            ss = ss + v * v;
        }
        const float inv = 1.0f / sqrtf(ss / (float)C + eps);
        for (int64_t c = 0; c < C; c++)
            store_y(y, bf16, r * C + c, rnd(load_x(x, bf16, r * C + c) * inv, bf16) * load_x(w, bf16, c));
    }
}

/* RoPE on the q and k parts of T rows of qkv ((H + 2 KVH) * D each), as the torch version computes it
 * (x * cos + roll(x, D/2) * sin, `sin` with its first half negated, each product rounded to the
 * model's dtype); q goes to q_out (H, T, D) float32, k and v into the caches (KVH, L, D) float32
 * at positions start..start+T-1. cos, sin: (T, D) for those positions. */
void dl_rope_store(const void *qkv, int bf16, const void *cos, const void *sin, int64_t T, int64_t H,
                   int64_t KVH, int64_t D, float *q_out, float *kc, float *vc, int64_t L, int64_t start) {
    const int64_t row = (H + 2 * KVH) * D, half = D / 2;
    for (int64_t i = 0; i < T; i++) {
        for (int64_t head = 0; head < H + KVH; head++) {
            const int64_t base = i * row + head * D;
            float *dst = head < H ? q_out + (head * T + i) * D : kc + ((head - H) * L + start + i) * D;
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
 * model's dtype as torch rounds them. */
void dl_silu_mul(const void *gu, int bf16, int64_t T, int64_t F, void *out) {
    for (int64_t i = 0; i < T; i++)
        for (int64_t f = 0; f < F; f++) {
            const float g = load_x(gu, bf16, i * 2 * F + f);
            const float silu = rnd(g / (1.0f + expf(-g)), bf16);
            store_y(out, bf16, i * F + f, silu * load_x(gu, bf16, i * 2 * F + F + f));
        }
}

/* Causal attention of T new tokens after `start` cached ones, one query row at a time.
 * q (H, T, D), float32 or bfloat16 (q_bf16); the caches (KVH, L, D) float32 already hold the new
 * tokens' keys and values at start..start+T-1; row i attends to positions 0..start+i.
 * out (T, H, D), float32 or bfloat16 (out_bf16); work (T*H, L + D) float32 scratch.
 * H is a multiple of KVH (the heads of a group share a KV head); D is any size (8 lanes, then the rest). */
void dl_attend(const void *q, int q_bf16, const float *kc, const float *vc, int64_t T, int64_t H, int64_t KVH,
               int64_t D, int64_t L, int64_t start, float scale, void *out, int out_bf16, float *work) {
    const int64_t group = H / KVH, D8 = D - D % 8;
#pragma omp parallel for schedule(static)
    for (int64_t ih = 0; ih < T * H; ih++) {
        const int64_t i = ih / H, h = ih % H;
        const int64_t n = start + i + 1;
        const float *kg = kc + (h / group) * L * D, *vg = vc + (h / group) * L * D;
        float *s = work + ih * (L + D), *qi = s + L;
        for (int64_t e = 0; e < D; e++) qi[e] = load_x(q, q_bf16, (h * T + i) * D + e);
        float mx = -INFINITY;
        for (int64_t j = 0; j < n; j++) {
            __m256 acc = _mm256_setzero_ps();
            for (int64_t e = 0; e < D8; e += 8)
                acc = _mm256_fmadd_ps(_mm256_loadu_ps(qi + e), _mm256_loadu_ps(kg + j * D + e), acc);
            float dot = hsum8(acc);
            for (int64_t e = D8; e < D; e++) dot = dot + qi[e] * kg[j * D + e];
            const float v = dot * scale;
            s[j] = v;
            mx = v > mx ? v : mx;
        }
        float sum = 0.0f;
        for (int64_t j = 0; j < n; j++) {
            const float e = expf(s[j] - mx);
            s[j] = e;
            sum = sum + e;
        }
        const float inv = 1.0f / sum;
        const int64_t o = (i * H + h) * D;
        for (int64_t e = 0; e < D8; e += 8) {
            __m256 acc = _mm256_setzero_ps();
            for (int64_t j = 0; j < n; j++)
                acc = _mm256_fmadd_ps(_mm256_set1_ps(s[j]), _mm256_loadu_ps(vg + j * D + e), acc);
            float lanes[8];
            _mm256_storeu_ps(lanes, _mm256_mul_ps(acc, _mm256_set1_ps(inv)));
            for (int l = 0; l < 8; l++) store_y(out, out_bf16, o + e + l, lanes[l]);
        }
        for (int64_t e = D8; e < D; e++) {
            float acc = 0.0f;
            for (int64_t j = 0; j < n; j++) acc = acc + s[j] * vg[j * D + e];
            store_y(out, out_bf16, o + e, acc * inv);
        }
    }
}

/* x (M, K) float32 or bfloat16 -> int8 xq (M, K) and dx (M, K/32): per block of 32, x ~ dx * xq, |xq| <= 127;
 * xs (M, K/32), when not NULL: dx times the block's sum of xq (the Q4_1 kernel's m term).
 * Per row, scalar: a row's result never depends on the others. K must be a multiple of 32. */
static void quantize_q8(const void *x, int bf16, int64_t M, int64_t K, int8_t *xq, float *dx, float *xs) {
    const int64_t nb = K / QK;
    for (int64_t r = 0; r < M; r++) {
        for (int64_t b = 0; b < nb; b++) {
            float xb[QK];
            for (int j = 0; j < QK; j++) xb[j] = load_x(x, bf16, r * K + b * QK + j);
            int8_t *qb = xq + r * K + b * QK;
            float amax = 0.0f;
            for (int j = 0; j < QK; j++) {
                const float a = fabsf(xb[j]);
                amax = a > amax ? a : amax;
            }
            const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
            int sum = 0;
            for (int j = 0; j < QK; j++) {
                int v = (int)nearbyintf(xb[j] * id);
                v = v > 127 ? 127 : (v < -127 ? -127 : v);
                qb[j] = (int8_t)v;
                sum += v;
            }
            dx[r * nb + b] = amax / 127.0f;
            if (xs) xs[r * nb + b] = dx[r * nb + b] * (float)sum;
        }
    }
}

/* One row's step over a block: acc += float(int8 dot of w and a) * s. |w|, |a| <= 127, so the
 * pairwise 16-bit sums cannot saturate. Every row of every call runs exactly this. */
#define Q8_ROW(acc, wabs, w, a, s)                                                                  \
    acc = _mm256_fmadd_ps(                                                                          \
        _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(wabs, _mm256_sign_epi8(a, w)), ones)), s, acc)

/* y (M, N) = x W^T for int8 weights wq (N, K) with one float32 scale per output ws (N), and x given
 * as dl_quantize_q8's blocks. Each weight block is read once for up to four rows. */
static void q8_gemm(const int8_t *wq, const float *ws, int64_t N, int64_t K, const int8_t *xq,
                    const float *dx, int64_t M, void *y, int y_bf16, const void *res) {
    const int64_t nb = K / QK;
    const __m256i ones = _mm256_set1_epi16(1);
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const int8_t *wn = wq + n * K;
        int64_t r = 0;
        for (; r + 4 <= M; r += 4) {
            const int8_t *x0 = xq + r * K;
            const float *e0 = dx + r * nb;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int64_t b = 0; b < nb; b++) {
                const __m256i w = _mm256_loadu_si256((const __m256i *)(wn + b * QK));
                const __m256i wabs = _mm256_sign_epi8(w, w);
                Q8_ROW(a0, wabs, w, _mm256_loadu_si256((const __m256i *)(x0 + b * QK)), _mm256_set1_ps(e0[b]));
                Q8_ROW(a1, wabs, w, _mm256_loadu_si256((const __m256i *)(x0 + K + b * QK)), _mm256_set1_ps(e0[nb + b]));
                Q8_ROW(a2, wabs, w, _mm256_loadu_si256((const __m256i *)(x0 + 2 * K + b * QK)), _mm256_set1_ps(e0[2 * nb + b]));
                Q8_ROW(a3, wabs, w, _mm256_loadu_si256((const __m256i *)(x0 + 3 * K + b * QK)), _mm256_set1_ps(e0[3 * nb + b]));
            }
            store_out(y, y_bf16, res, r * N + n, hsum8(a0) * ws[n]);
            store_out(y, y_bf16, res, (r + 1) * N + n, hsum8(a1) * ws[n]);
            store_out(y, y_bf16, res, (r + 2) * N + n, hsum8(a2) * ws[n]);
            store_out(y, y_bf16, res, (r + 3) * N + n, hsum8(a3) * ws[n]);
        }
        for (; r < M; r++) { /* the rows left over, one at a time, through the same operations */
            const int8_t *x0 = xq + r * K;
            const float *e0 = dx + r * nb;
            __m256 a0 = _mm256_setzero_ps();
            for (int64_t b = 0; b < nb; b++) {
                const __m256i w = _mm256_loadu_si256((const __m256i *)(wn + b * QK));
                const __m256i wabs = _mm256_sign_epi8(w, w);
                Q8_ROW(a0, wabs, w, _mm256_loadu_si256((const __m256i *)(x0 + b * QK)), _mm256_set1_ps(e0[b]));
            }
            store_out(y, y_bf16, res, r * N + n, hsum8(a0) * ws[n]);
        }
    }
}

/* One row's step over a block of Q4_1 weights: acc += float(int dot(q, a)) * s, q in 0..15 (unsigned,
 * so maddubs takes it directly; pairs sum to at most 2 * 15 * 127). Every row runs exactly this. */
#define Q4_ROW(acc, w, a, s) \
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(w, a), ones)), s, acc)

/* A Q4_1 block's 16 bytes as 32 unsigned bytes 0..15: inputs 0..15 from the low nibbles, 16..31 from the high. */
static inline __m256i q4_block(const uint8_t *bytes) {
    const __m128i raw = _mm_loadu_si128((const __m128i *)bytes), low4 = _mm_set1_epi8(0x0F);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), low4), _mm_and_si128(raw, low4));
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

/* y (M, N) = x W^T for Q4_1 weights (llama.cpp's block: a scale d and a minimum m per 32 inputs,
 * the weight is d * q + m with q in 0..15) and x given as dl_quantize_q8's blocks, whose sums
 * xs (M, K/32: dx times the sum of the block's xq) carry the m term:
 *   y = sum over blocks of d * dx * (q . xq)  +  m . xs.
 * qs uint8 (N, K/2): byte j of a block holds input j (low nibble) and input j + 16 (high nibble);
 * d, m float32 (N, K/32). Each weight block is unpacked once for up to four rows. */
static void q4_gemm(const uint8_t *qs, const float *d, const float *m, int64_t N, int64_t K, const int8_t *xq,
                    const float *dx, const float *xs, int64_t M, void *y, int y_bf16, const void *res) {
    const int64_t nb = K / QK;
    const __m256i ones = _mm256_set1_epi16(1);
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const uint8_t *wn = qs + n * (K / 2);
        const float *dn = d + n * nb, *mn = m + n * nb;
        int64_t r = 0;
        for (; r + 4 <= M; r += 4) {
            const int8_t *x0 = xq + r * K;
            const float *e0 = dx + r * nb;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int64_t b = 0; b < nb; b++) {
                const __m256i w = q4_block(wn + b * 16);
                const __m256 db = _mm256_set1_ps(dn[b]);
                Q4_ROW(a0, w, _mm256_loadu_si256((const __m256i *)(x0 + b * QK)), _mm256_mul_ps(db, _mm256_set1_ps(e0[b])));
                Q4_ROW(a1, w, _mm256_loadu_si256((const __m256i *)(x0 + K + b * QK)), _mm256_mul_ps(db, _mm256_set1_ps(e0[nb + b])));
                Q4_ROW(a2, w, _mm256_loadu_si256((const __m256i *)(x0 + 2 * K + b * QK)), _mm256_mul_ps(db, _mm256_set1_ps(e0[2 * nb + b])));
                Q4_ROW(a3, w, _mm256_loadu_si256((const __m256i *)(x0 + 3 * K + b * QK)), _mm256_mul_ps(db, _mm256_set1_ps(e0[3 * nb + b])));
            }
            store_out(y, y_bf16, res, r * N + n, hsum8(a0) + dot_blocks(mn, xs + r * nb, nb));
            store_out(y, y_bf16, res, (r + 1) * N + n, hsum8(a1) + dot_blocks(mn, xs + (r + 1) * nb, nb));
            store_out(y, y_bf16, res, (r + 2) * N + n, hsum8(a2) + dot_blocks(mn, xs + (r + 2) * nb, nb));
            store_out(y, y_bf16, res, (r + 3) * N + n, hsum8(a3) + dot_blocks(mn, xs + (r + 3) * nb, nb));
        }
        for (; r < M; r++) { /* the rows left over, one at a time, through the same operations */
            const int8_t *x0 = xq + r * K;
            const float *e0 = dx + r * nb;
            __m256 a0 = _mm256_setzero_ps();
            for (int64_t b = 0; b < nb; b++) {
                const __m256i w = q4_block(wn + b * 16);
                const __m256 db = _mm256_set1_ps(dn[b]);
                Q4_ROW(a0, w, _mm256_loadu_si256((const __m256i *)(x0 + b * QK)), _mm256_mul_ps(db, _mm256_set1_ps(e0[b])));
            }
            store_out(y, y_bf16, res, r * N + n, hsum8(a0) + dot_blocks(mn, xs + r * nb, nb));
        }
    }
}

/* The entry points: y (M, N) = x W^T (+ res, (M, N) in y's dtype, where not NULL), x and y float32
 * or bfloat16 (the flags), x quantized into `scratch` (at least M*K + 8*M*(K/32) bytes) and multiplied. */
void dl_q8_linear(const void *x, int x_bf16, int64_t M, int64_t K, const int8_t *wq, const float *ws, int64_t N,
                  void *y, int y_bf16, const void *res, uint8_t *scratch) {
    int8_t *xq = (int8_t *)scratch;
    float *dx = (float *)(scratch + M * K);
    quantize_q8(x, x_bf16, M, K, xq, dx, NULL);
    q8_gemm(wq, ws, N, K, xq, dx, M, y, y_bf16, res);
}

void dl_q4_linear(const void *x, int x_bf16, int64_t M, int64_t K, const uint8_t *qs, const float *d,
                  const float *m, int64_t N, void *y, int y_bf16, const void *res, uint8_t *scratch) {
    int8_t *xq = (int8_t *)scratch;
    float *dx = (float *)(scratch + M * K), *xs = dx + M * (K / QK);
    quantize_q8(x, x_bf16, M, K, xq, dx, xs);
    q4_gemm(qs, d, m, N, K, xq, dx, xs, M, y, y_bf16, res);
}
