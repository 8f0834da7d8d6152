/* The engine's single-row kernels, each reading its operands once with float32 arithmetic: one decoding step's
 * attention (mnesio_decode_attention) and a linear layer's product for one row (mnesio_linear_row).
 *
 * Built and loaded by kvengine/fused.py (design: docs/design/attention.md, "Fused single-row kernels"). Per key/value
 * head: the packed query rows' scores over every position (one pass over the keys), their softmax, then the
 * probabilities times the values (one pass over the values). Keys and values are bf16 or f32 rows of 64, the rows
 * of a head contiguous and the heads `head_stride` elements apart (a cache view's layout). `threads` OpenMP threads
 * split the positions, each keeping its own maximum, sum and unnormalized output per row, merged at the end; the
 * library links the OpenMP runtime torch has loaded (libgomp), so the threads are torch's own, already running.
 * AVX-512F instructions only, checked at run time.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#define DIM 64
#define MAX_ROWS 16

static inline __m512 load_bf16(const void *p) {
    __m256i x = _mm256_loadu_si256((const __m256i *)p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(x), 16));
}

static inline __m512 load_f32(const void *p) { return _mm512_loadu_ps((const float *)p); }

/* e^x for x <= 0 (softmax arguments), within ~2 ulp: 2^n * p(r), r = x - n ln2 in [-ln2/2, ln2/2] (Cephes' expf). */
static inline __m512 exp_ps(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

/* Positions [begin, end) of every head. q [heads, rows, DIM] float32, already scaled; k, v: element (h, t, d) at
 * h * head_stride + t * DIM + d; scores: [rows, n] float32 scratch (this chunk writes its positions); part: per
 * (head, row) DIM unnormalized outputs, then the maximum score and the sum of exponentials. */
#define DEFINE_HEADS(NAME, LOAD, ELEM)                                                                           \
static void NAME(const float *q, const ELEM *k, const ELEM *v, int64_t head_stride, int64_t n, int64_t begin,    \
                 int64_t end, int heads, int rows, float *scores, float *part) {                                 \
    for (int h = 0; h < heads; h++) {                                                                            \
        const ELEM *kh = k + h * head_stride, *vh = v + h * head_stride;                                         \
        __m512 qr[MAX_ROWS][4];                                                                                  \
        float m[MAX_ROWS], total[MAX_ROWS];                                                                      \
        for (int r = 0; r < rows; r++) {                                                                         \
            for (int j = 0; j < 4; j++) qr[r][j] = _mm512_loadu_ps(q + ((int64_t)h * rows + r) * DIM + 16 * j);  \
            m[r] = -INFINITY;                                                                                    \
        }                                                                                                        \
        for (int64_t t = begin; t < end; t++) {                                                                  \
            const ELEM *kt = kh + t * DIM;                                                                       \
            __m512 k0 = LOAD(kt), k1 = LOAD(kt + 16), k2 = LOAD(kt + 32), k3 = LOAD(kt + 48);                    \
            for (int r = 0; r < rows; r++) {                                                                     \
                __m512 s = _mm512_mul_ps(qr[r][0], k0);                                                          \
                s = _mm512_fmadd_ps(qr[r][1], k1, s);                                                            \
                s = _mm512_fmadd_ps(qr[r][2], k2, s);                                                            \
                s = _mm512_fmadd_ps(qr[r][3], k3, s);                                                            \
                float x = _mm512_reduce_add_ps(s);                                                               \
                scores[r * n + t] = x;                                                                           \
                if (x > m[r]) m[r] = x;                                                                          \
            }                                                                                                    \
        }                                                                                                        \
        for (int r = 0; r < rows; r++) {                                                                         \
            float *s = scores + r * n;                                                                           \
            __m512 mx = _mm512_set1_ps(m[r]), sum = _mm512_setzero_ps();                                         \
            int64_t t = begin;                                                                                   \
            for (; t + 16 <= end; t += 16) {                                                                       \
                __m512 e = exp_ps(_mm512_sub_ps(_mm512_loadu_ps(s + t), mx));                                    \
                _mm512_storeu_ps(s + t, e);                                                                      \
                sum = _mm512_add_ps(sum, e);                                                                     \
            }                                                                                                    \
            if (t < end) {                                                                                       \
                __mmask16 tail = (__mmask16)((1u << (end - t)) - 1);                                               \
                __m512 e = _mm512_maskz_mov_ps(tail, exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, s + t), mx))); \
                _mm512_mask_storeu_ps(s + t, tail, e);                                                           \
                sum = _mm512_add_ps(sum, e);                                                                     \
            }                                                                                                    \
            total[r] = _mm512_reduce_add_ps(sum);                                                                \
        }                                                                                                        \
        __m512 acc[MAX_ROWS][4];                                                                                 \
        for (int r = 0; r < rows; r++)                                                                           \
            for (int j = 0; j < 4; j++) acc[r][j] = _mm512_setzero_ps();                                         \
        for (int64_t t = begin; t < end; t++) {                                                                  \
            const ELEM *vt = vh + t * DIM;                                                                       \
            __m512 v0 = LOAD(vt), v1 = LOAD(vt + 16), v2 = LOAD(vt + 32), v3 = LOAD(vt + 48);                    \
            for (int r = 0; r < rows; r++) {                                                                     \
                __m512 p = _mm512_set1_ps(scores[r * n + t]);                                                    \
                acc[r][0] = _mm512_fmadd_ps(p, v0, acc[r][0]);                                                   \
                acc[r][1] = _mm512_fmadd_ps(p, v1, acc[r][1]);                                                   \
                acc[r][2] = _mm512_fmadd_ps(p, v2, acc[r][2]);                                                   \
                acc[r][3] = _mm512_fmadd_ps(p, v3, acc[r][3]);                                                   \
            }                                                                                                    \
        }                                                                                                        \
        for (int r = 0; r < rows; r++) {                                                                         \
            float *pr = part + ((int64_t)h * rows + r) * (DIM + 2);                                              \
            for (int j = 0; j < 4; j++) _mm512_storeu_ps(pr + 16 * j, acc[r][j]);                                \
            pr[DIM] = m[r];                                                                                      \
            pr[DIM + 1] = total[r];                                                                              \
        }                                                                                                        \
    }                                                                                                            \
}

DEFINE_HEADS(heads_bf16, load_bf16, uint16_t)
DEFINE_HEADS(heads_f32, load_f32, float)

/* 1 when this CPU runs the kernel (AVX-512F), else 0: the caller checks it before the first call. */
int mnesio_decode_attention_supported(void) { return __builtin_cpu_supports("avx512f") ? 1 : 0; }

/* out [heads, rows, DIM] = softmax(q k^T) v per head; kv_bits 16 (bf16) or 32 (f32); part: threads * heads * rows *
 * (DIM + 2) floats of scratch. Returns 0, or -1 for a shape it does not take. */
int mnesio_decode_attention(const float *q, const void *k, const void *v, int64_t head_stride, int64_t n, int heads,
                            int rows, int dim, int kv_bits, int threads, float *scores, float *part, float *out) {
    if (dim != DIM || rows < 1 || rows > MAX_ROWS || n < 1 || heads < 1 || (kv_bits != 16 && kv_bits != 32)) return -1;
    if (threads < 1) threads = 1;
    if (threads > 64) threads = 64;
    if (n < 256 * (int64_t)threads) threads = 1;  /* a short cache: not worth a second thread */
    int64_t per = (n + threads - 1) / threads;
    int64_t stride = (int64_t)heads * rows * (DIM + 2);
#pragma omp parallel for num_threads(threads) schedule(static, 1)
    for (int c = 0; c < threads; c++) {
        int64_t begin = c * per, end = begin + per < n ? begin + per : n;
        if (kv_bits == 16)
            heads_bf16(q, (const uint16_t *)k, (const uint16_t *)v, head_stride, n, begin, end, heads, rows, scores, part + c * stride);
        else
            heads_f32(q, (const float *)k, (const float *)v, head_stride, n, begin, end, heads, rows, scores, part + c * stride);
    }
    for (int64_t hr = 0; hr < (int64_t)heads * rows; hr++) {  /* merge the chunks: the softmax over all positions */
        float m = -INFINITY, total = 0.0f, w[64];
        for (int c = 0; c < threads; c++) m = fmaxf(m, part[c * stride + hr * (DIM + 2) + DIM]);
        for (int c = 0; c < threads && c < 64; c++) {
            const float *pc = part + c * stride + hr * (DIM + 2);
            w[c] = expf(pc[DIM] - m);
            total += w[c] * pc[DIM + 1];
        }
        for (int d = 0; d < DIM; d++) {
            float x = 0.0f;
            for (int c = 0; c < threads && c < 64; c++) x += w[c] * part[c * stride + hr * (DIM + 2) + d];
            out[hr * DIM + d] = x / total;
        }
    }
    return 0;
}

/* y [out] = w x for one row x [in] (float32) and w [out, in] (bf16 or f32, rows contiguous), each weight read once:
 * blocks of 4 output rows over torch's OpenMP threads, two accumulators of 16 per row. Returns 0, or -1 for a shape
 * it does not take (in not a multiple of 32). */
#define DEFINE_ROWS(NAME, LOAD, ELEM)                                                                            \
static void NAME(const float *x, const ELEM *w, int64_t in, int64_t out, int threads, float *y) {                 \
    _Pragma("omp parallel for num_threads(threads) schedule(static)")                                           \
    for (int64_t o = 0; o < out; o += 4) {                                                                      \
        int rows = out - o < 4 ? (int)(out - o) : 4;                                                             \
        __m512 a[4][2];                                                                                          \
        for (int r = 0; r < 4; r++) a[r][0] = a[r][1] = _mm512_setzero_ps();                                     \
        for (int64_t i = 0; i < in; i += 32) {                                                                   \
            __m512 x0 = _mm512_loadu_ps(x + i), x1 = _mm512_loadu_ps(x + i + 16);                                \
            for (int r = 0; r < rows; r++) {                                                                     \
                const ELEM *wr = w + (o + r) * in + i;                                                           \
                a[r][0] = _mm512_fmadd_ps(LOAD(wr), x0, a[r][0]);                                                \
                a[r][1] = _mm512_fmadd_ps(LOAD(wr + 16), x1, a[r][1]);                                           \
            }                                                                                                    \
        }                                                                                                        \
        for (int r = 0; r < rows; r++) y[o + r] = _mm512_reduce_add_ps(_mm512_add_ps(a[r][0], a[r][1]));         \
    }                                                                                                            \
}

DEFINE_ROWS(rows_bf16, load_bf16, uint16_t)
DEFINE_ROWS(rows_f32, load_f32, float)

int mnesio_linear_row(const float *x, const void *w, int64_t in, int64_t out, int w_bits, int threads, float *y) {
    if (in < 32 || in % 32 || out < 1 || (w_bits != 16 && w_bits != 32)) return -1;
    if (threads < 1) threads = 1;
    if (w_bits == 16)
        rows_bf16(x, (const uint16_t *)w, in, out, threads, y);
    else
        rows_f32(x, (const float *)w, in, out, threads, y);
    return 0;
}
