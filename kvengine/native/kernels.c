/* The engine's fused kernels for a few rows, each reading its operands once with float32 arithmetic: the attention of a
 * decoding step or a question's pass over the cache (mnesio_decode_attention) and a linear layer's product for a few
 * rows (mnesio_linear_rows; int8 codes: mnesio_linear_rows_int8).
 *
 * Built and loaded by kvengine/fused.py (design: docs/design/attention.md, "Fused few-row kernels"). Per key/value
 * head: the packed query rows' scores over every position (one pass over the keys; with many rows, sixteen rows to
 * a vector), their softmax, then the probabilities times the values (one pass over the values); each row sees the
 * positions before its limit (all of them for a decoding step, the cache and the question up to its own token for a
 * question's pass). Keys and values are bf16 or f32 rows of 64, the rows of a head contiguous and the heads
 * `head_stride` elements apart (a cache view's layout). `threads` parts split the positions, each keeping its own
 * maximum, sum and unnormalized output per row, merged at the end, in the kernels' own threads (pool.h: not libgomp's,
 * whose workers sleep between regions once two threads use it). AVX-512F instructions only, checked at run time.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels.h"
#include "pool.h"

#define DIM 64
#define MAX_ROWS 128  /* packed query rows: a question's 42 tokens times SmolLM2's 3 query heads per KV head */

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

/* The sums of four vectors' elements, the i-th in elements 4i..4i+3 (lanes added as _mm512_reduce_add_ps adds them). */
static inline __m512 sum4(const __m512 s[4]) {
    __m512 a = _mm512_add_ps(_mm512_shuffle_f32x4(s[0], s[1], 0x44), _mm512_shuffle_f32x4(s[0], s[1], 0xEE));
    __m512 b = _mm512_add_ps(_mm512_shuffle_f32x4(s[2], s[3], 0x44), _mm512_shuffle_f32x4(s[2], s[3], 0xEE));
    __m512 c = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(a, b, 0xDD));
    c = _mm512_add_ps(c, _mm512_permute_ps(c, 0x4E));
    return _mm512_add_ps(c, _mm512_permute_ps(c, 0xB1));
}

#define LANE_ROWS 12  /* this many packed rows or more: sixteen rows to a vector (lanes_); fewer were no faster */
#define TILE 256  /* positions per tile: a tile's keys or values stay in cache while every row group reads them */

/* Rows [r0, r0 + G) of one head over positions [t0, t1): their scores into scores [rows, n], their maxima over the
 * positions each row sees into m. */
#define DEFINE_SCORES(NAME, LOAD, ELEM, G)                                                                       \
static inline void NAME(const float *q, const ELEM *kh, int64_t n, int64_t t0, int64_t t1, int r0,               \
                        const int64_t *limit, float *scores, float *m) {                                         \
    __m512 qr[G][4];                                                                                             \
    for (int i = 0; i < G; i++)                                                                                  \
        for (int j = 0; j < 4; j++) qr[i][j] = _mm512_loadu_ps(q + (int64_t)(r0 + i) * DIM + 16 * j);            \
    for (int64_t t = t0; t < t1; t++) {                                                                          \
        const ELEM *kt = kh + t * DIM;                                                                           \
        __m512 k0 = LOAD(kt), k1 = LOAD(kt + 16), k2 = LOAD(kt + 32), k3 = LOAD(kt + 48);                        \
        __m512 s[4];                                                                                             \
        for (int i = 0; i < 4; i++) {                                                                            \
            if (i >= G) { s[i] = _mm512_setzero_ps(); continue; }                                                \
            s[i] = _mm512_mul_ps(qr[i][0], k0);                                                                  \
            s[i] = _mm512_fmadd_ps(qr[i][1], k1, s[i]);                                                          \
            s[i] = _mm512_fmadd_ps(qr[i][2], k2, s[i]);                                                          \
            s[i] = _mm512_fmadd_ps(qr[i][3], k3, s[i]);                                                          \
        }                                                                                                        \
        float x[16];                                                                                             \
        _mm512_storeu_ps(x, sum4(s));                                                                            \
        for (int i = 0; i < G; i++) {                                                                            \
            scores[(int64_t)(r0 + i) * n + t] = x[4 * i];                                                        \
            if (x[4 * i] > m[r0 + i] && t < limit[r0 + i]) m[r0 + i] = x[4 * i];                                 \
        }                                                                                                        \
    }                                                                                                            \
}

/* Rows [r0, r0 + G) of one head over positions [t0, t1): the probabilities in scores (row r, position t at
 * r * rs + t * ts) times the values, added to the unnormalized outputs acc [rows, DIM]. */
#define DEFINE_VALUES(NAME, LOAD, ELEM, G)                                                                       \
static inline void NAME(const ELEM *vh, int64_t rs, int64_t ts, int64_t t0, int64_t t1, int r0,                  \
                        const float *scores, float *acc) {                                                       \
    __m512 a[G][4];                                                                                              \
    for (int i = 0; i < G; i++)                                                                                  \
        for (int j = 0; j < 4; j++) a[i][j] = _mm512_loadu_ps(acc + (int64_t)(r0 + i) * DIM + 16 * j);           \
    for (int64_t t = t0; t < t1; t++) {                                                                          \
        const ELEM *vt = vh + t * DIM;                                                                           \
        __m512 v0 = LOAD(vt), v1 = LOAD(vt + 16), v2 = LOAD(vt + 32), v3 = LOAD(vt + 48);                        \
        for (int i = 0; i < G; i++) {                                                                            \
            __m512 p = _mm512_set1_ps(scores[(int64_t)(r0 + i) * rs + t * ts]);                                  \
            a[i][0] = _mm512_fmadd_ps(p, v0, a[i][0]);                                                           \
            a[i][1] = _mm512_fmadd_ps(p, v1, a[i][1]);                                                           \
            a[i][2] = _mm512_fmadd_ps(p, v2, a[i][2]);                                                           \
            a[i][3] = _mm512_fmadd_ps(p, v3, a[i][3]);                                                           \
        }                                                                                                        \
    }                                                                                                            \
    for (int i = 0; i < G; i++)                                                                                  \
        for (int j = 0; j < 4; j++) _mm512_storeu_ps(acc + (int64_t)(r0 + i) * DIM + 16 * j, a[i][j]);          \
}

/* The rows in groups of up to four (their queries or outputs held in registers), tile by tile. */
#define DEFINE_GROUPS(SUFFIX, LOAD, ELEM)                                                                        \
DEFINE_SCORES(scores1_##SUFFIX, LOAD, ELEM, 1) DEFINE_SCORES(scores2_##SUFFIX, LOAD, ELEM, 2)                    \
DEFINE_SCORES(scores3_##SUFFIX, LOAD, ELEM, 3) DEFINE_SCORES(scores4_##SUFFIX, LOAD, ELEM, 4)                    \
DEFINE_VALUES(values1_##SUFFIX, LOAD, ELEM, 1) DEFINE_VALUES(values2_##SUFFIX, LOAD, ELEM, 2)                    \
DEFINE_VALUES(values3_##SUFFIX, LOAD, ELEM, 3) DEFINE_VALUES(values4_##SUFFIX, LOAD, ELEM, 4)                    \
static void scores_##SUFFIX(const float *q, const ELEM *kh, int64_t n, int64_t t0, int64_t t1, int rows,         \
                            const int64_t *limit, float *scores, float *m) {                                     \
    for (int r0 = 0; r0 < rows; r0 += 4) {                                                                       \
        switch (rows - r0 < 4 ? rows - r0 : 4) {                                                                 \
        case 1: scores1_##SUFFIX(q, kh, n, t0, t1, r0, limit, scores, m); break;                                 \
        case 2: scores2_##SUFFIX(q, kh, n, t0, t1, r0, limit, scores, m); break;                                 \
        case 3: scores3_##SUFFIX(q, kh, n, t0, t1, r0, limit, scores, m); break;                                 \
        default: scores4_##SUFFIX(q, kh, n, t0, t1, r0, limit, scores, m);                                       \
        }                                                                                                        \
    }                                                                                                            \
}                                                                                                                \
static void values_##SUFFIX(const ELEM *vh, int64_t rs, int64_t ts, int64_t t0, int64_t t1, int rows,          \
                            const float *scores, float *acc) {                                                   \
    for (int r0 = 0; r0 < rows; r0 += 4) {                                                                       \
        switch (rows - r0 < 4 ? rows - r0 : 4) {                                                                 \
        case 1: values1_##SUFFIX(vh, rs, ts, t0, t1, r0, scores, acc); break;                                    \
        case 2: values2_##SUFFIX(vh, rs, ts, t0, t1, r0, scores, acc); break;                                    \
        case 3: values3_##SUFFIX(vh, rs, ts, t0, t1, r0, scores, acc); break;                                    \
        default: values4_##SUFFIX(vh, rs, ts, t0, t1, r0, scores, acc);                                          \
        }                                                                                                        \
    }                                                                                                            \
}                                                                                                                \
/* Many rows (LANE_ROWS or more) of one head over positions [begin, end), sixteen rows to a vector: scores at      \
 * t * w + r (w: the rows rounded up to 16), dot products of eight keys at a time with the transposed queries, each \
 * key element broadcast, no sum across a vector; the maximum over the positions each row sees into m, then the    \
 * exponentials (zero where a row does not see the position) and their sums into total. */                       \
static void lanes_##SUFFIX(const float *q, const ELEM *kh, int64_t begin, int64_t end, int rows,                 \
                           const int64_t *limit, float *scores, float *m, float *total) {                        \
    int nb = (rows + 15) / 16, w = 16 * nb;                                                                      \
    float qt[MAX_ROWS / 16][DIM][16] __attribute__((aligned(64)));                                               \
    float kf[8][DIM] __attribute__((aligned(64)));                                                               \
    float lanes[16] __attribute__((aligned(64)));                                                                \
    __m512i lim[MAX_ROWS / 16];                                                                                  \
    __m512 mv[MAX_ROWS / 16], sum[MAX_ROWS / 16];                                                                \
    for (int b = 0; b < nb; b++) {                                                                               \
        int32_t l[16];                                                                                           \
        for (int j = 0; j < 16; j++) {                                                                           \
            int r = 16 * b + j;                                                                                  \
            l[j] = r < rows ? (int32_t)limit[r] : 0;  /* a padding lane sees nothing */                          \
            for (int d = 0; d < DIM; d++) qt[b][d][j] = r < rows ? q[(int64_t)r * DIM + d] : 0.0f;               \
        }                                                                                                        \
        lim[b] = _mm512_loadu_si512(l);                                                                          \
        mv[b] = _mm512_set1_ps(-INFINITY);                                                                       \
        sum[b] = _mm512_setzero_ps();                                                                            \
    }                                                                                                            \
    for (int64_t t = begin; t < end; t += 8) {                                                                   \
        int nk = end - t < 8 ? (int)(end - t) : 8;                                                               \
        for (int kk = 0; kk < 8; kk++) {  /* past the end: the last key again, its scores not kept */            \
            const ELEM *kt = kh + (t + (kk < nk ? kk : nk - 1)) * DIM;                                           \
            for (int c = 0; c < 4; c++) _mm512_store_ps(kf[kk] + 16 * c, LOAD(kt + 16 * c));                     \
        }                                                                                                        \
        for (int b = 0; b < nb; b++) {                                                                           \
            __m512 a[8];                                                                                         \
            for (int kk = 0; kk < 8; kk++) a[kk] = _mm512_setzero_ps();                                          \
            for (int d = 0; d < DIM; d++) {                                                                      \
                __m512 qd = _mm512_load_ps(qt[b][d]);                                                            \
                for (int kk = 0; kk < 8; kk++) a[kk] = _mm512_fmadd_ps(_mm512_set1_ps(kf[kk][d]), qd, a[kk]);   \
            }                                                                                                    \
            for (int kk = 0; kk < nk; kk++) {                                                                    \
                _mm512_storeu_ps(scores + (t + kk) * w + 16 * b, a[kk]);                                         \
                __mmask16 seen = _mm512_cmpgt_epi32_mask(lim[b], _mm512_set1_epi32((int32_t)(t + kk)));          \
                mv[b] = _mm512_mask_max_ps(mv[b], seen, mv[b], a[kk]);                                           \
            }                                                                                                    \
        }                                                                                                        \
    }                                                                                                            \
    for (int b = 0; b < nb; b++) {  /* eight partial sums a row, as the row-major path's lanes keep sixteen */    \
        __m512 part8[8];                                                                                         \
        for (int i = 0; i < 8; i++) part8[i] = _mm512_setzero_ps();                                              \
        for (int64_t t = begin; t < end; t++) {                                                                  \
            float *s = scores + t * w + 16 * b;                                                                  \
            __mmask16 seen = _mm512_cmpgt_epi32_mask(lim[b], _mm512_set1_epi32((int32_t)t));                     \
            __m512 e = _mm512_maskz_mov_ps(seen, exp_ps(_mm512_sub_ps(_mm512_loadu_ps(s), mv[b])));              \
            _mm512_storeu_ps(s, e);                                                                              \
            part8[t & 7] = _mm512_add_ps(part8[t & 7], e);                                                       \
        }                                                                                                        \
        for (int i = 0; i < 8; i++) sum[b] = _mm512_add_ps(sum[b], part8[i]);                                    \
    }                                                                                                            \
    for (int b = 0; b < nb; b++) {                                                                               \
        _mm512_store_ps(lanes, mv[b]);                                                                           \
        for (int j = 0; j < 16 && 16 * b + j < rows; j++) m[16 * b + j] = lanes[j];                              \
        _mm512_store_ps(lanes, sum[b]);                                                                          \
        for (int j = 0; j < 16 && 16 * b + j < rows; j++) total[16 * b + j] = lanes[j];                          \
    }                                                                                                            \
}                                                                                                                \
/* Fewer rows than LANE_ROWS of one head over positions [begin, end): scores row-major ([rows, n]), tile by tile, \
 * four rows at a time; the maximum over the positions each row sees into m, then the exponentials (zero past a  \
 * row's limit) and their sums into total. */                                                                    \
static void rowmajor_##SUFFIX(const float *q, const ELEM *kh, int64_t n, int64_t begin, int64_t end, int rows,   \
                              const int64_t *limit, float *scores, float *m, float *total) {                     \
    for (int r = 0; r < rows; r++) m[r] = -INFINITY;                                                             \
    for (int64_t t0 = begin; t0 < end; t0 += TILE)                                                               \
        scores_##SUFFIX(q, kh, n, t0, t0 + TILE < end ? t0 + TILE : end, rows, limit, scores, m);                \
    for (int r = 0; r < rows; r++) {                                                                             \
        float *s = scores + r * n;                                                                               \
        int64_t seen = limit[r] < end ? (limit[r] > begin ? limit[r] : begin) : end;                             \
        for (int64_t t = seen; t < end; t++) s[t] = 0.0f;  /* past the row's limit: no weight */                 \
        __m512 mx = _mm512_set1_ps(m[r]), sum = _mm512_setzero_ps();                                             \
        int64_t t = begin;                                                                                       \
        for (; t + 16 <= seen; t += 16) {                                                                        \
            __m512 e = exp_ps(_mm512_sub_ps(_mm512_loadu_ps(s + t), mx));                                        \
            _mm512_storeu_ps(s + t, e);                                                                          \
            sum = _mm512_add_ps(sum, e);                                                                         \
        }                                                                                                        \
        if (t < seen) {                                                                                          \
            __mmask16 tail = (__mmask16)((1u << (seen - t)) - 1);                                                \
            __m512 e = _mm512_maskz_mov_ps(tail, exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, s + t), mx))); \
            _mm512_mask_storeu_ps(s + t, tail, e);                                                               \
            sum = _mm512_add_ps(sum, e);                                                                         \
        }                                                                                                        \
        total[r] = _mm512_reduce_add_ps(sum);                                                                    \
    }                                                                                                            \
}

DEFINE_GROUPS(bf16, load_bf16, uint16_t)
DEFINE_GROUPS(f32, load_f32, float)

/* Positions [begin, end) of every head. q [heads, rows, DIM] float32, already scaled; k, v: element (h, t, d) at
 * h * head_stride + t * DIM + d; limit[r]: row r sees positions [0, limit[r]); scores: [rows rounded up to 16, n]
 * float32 scratch (this chunk writes its positions, zero past a row's limit; row-major, or lanes_' layout); part:
 * per (head, row) DIM unnormalized outputs, then the maximum score (-inf where the chunk has no position the row
 * sees) and the sum of exponentials. */
#define DEFINE_HEADS(SUFFIX, ELEM)                                                                               \
static void heads_##SUFFIX(const float *q, const ELEM *k, const ELEM *v, int64_t head_stride, int64_t n,        \
                           int64_t begin, int64_t end, int heads, int rows, const int64_t *limit, float *scores, \
                           float *part) {                                                                        \
    for (int h = 0; h < heads; h++) {                                                                            \
        const ELEM *kh = k + h * head_stride, *vh = v + h * head_stride;                                         \
        const float *qh = q + (int64_t)h * rows * DIM;                                                           \
        float m[MAX_ROWS], total[MAX_ROWS], acc[MAX_ROWS * DIM];                                                 \
        int by_lanes = rows >= LANE_ROWS;  /* the scores' layout: sixteen rows to a vector, or row-major */      \
        int64_t rs = by_lanes ? 1 : n, ts = by_lanes ? 16 * ((rows + 15) / 16) : 1;                              \
        if (by_lanes)                                                                                            \
            lanes_##SUFFIX(qh, kh, begin, end, rows, limit, scores, m, total);                                   \
        else                                                                                                     \
            rowmajor_##SUFFIX(qh, kh, n, begin, end, rows, limit, scores, m, total);                             \
        for (int i = 0; i < rows * DIM; i++) acc[i] = 0.0f;                                                      \
        for (int64_t t0 = begin; t0 < end; t0 += TILE)                                                           \
            values_##SUFFIX(vh, rs, ts, t0, t0 + TILE < end ? t0 + TILE : end, rows, scores, acc);               \
        for (int r = 0; r < rows; r++) {                                                                         \
            float *pr = part + ((int64_t)h * rows + r) * (DIM + 2);                                              \
            for (int d = 0; d < DIM; d++) pr[d] = acc[r * DIM + d];                                              \
            pr[DIM] = m[r];                                                                                      \
            pr[DIM + 1] = total[r];                                                                              \
        }                                                                                                        \
    }                                                                                                            \
}

DEFINE_HEADS(bf16, uint16_t)
DEFINE_HEADS(f32, float)

/* limits[r] = how many leading positions row r of a boolean mask (bytes 0/1, rows `row_stride` bytes apart, n each)
 * sees, when each row sees exactly its first positions and at least one; returns 0, else -1. */
int mnesio_prefix_limits(const uint8_t *mask, int64_t rows, int64_t n, int64_t row_stride, int64_t *limits) {
    if (n < 1) return -1;
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *row = mask + r * row_stride;
        const uint8_t *hidden = memchr(row, 0, (size_t)n);
        int64_t limit = hidden ? hidden - row : n;
        if (limit < 1 || (hidden && memchr(hidden, 1, (size_t)(n - limit)))) return -1;
        limits[r] = limit;
    }
    return 0;
}

/* 1 when this CPU runs the kernel (AVX-512F), else 0: the caller checks it before the first call. */
int mnesio_decode_attention_supported(void) { return __builtin_cpu_supports("avx512f") ? 1 : 0; }

struct attention_job {
    const float *q;
    const void *k, *v;
    int64_t head_stride, n, per, stride;
    int heads, rows, kv_bits;
    const int64_t *limit;
    float *scores, *part;
};

static void attention_part(void *ctx, int c) {  /* positions [c * per, (c + 1) * per) of every head */
    const struct attention_job *j = ctx;
    int64_t begin = c * j->per, end = begin + j->per < j->n ? begin + j->per : j->n;
    if (j->kv_bits == 16)
        heads_bf16(j->q, (const uint16_t *)j->k, (const uint16_t *)j->v, j->head_stride, j->n, begin, end, j->heads, j->rows,
                   j->limit, j->scores, j->part + c * j->stride);
    else
        heads_f32(j->q, (const float *)j->k, (const float *)j->v, j->head_stride, j->n, begin, end, j->heads, j->rows,
                  j->limit, j->scores, j->part + c * j->stride);
}

/* out [heads, rows, DIM] = softmax(q k^T) v per head, row r over positions [0, limit[r]) (limit NULL: all n);
 * kv_bits 16 (bf16) or 32 (f32); part: threads * heads * rows * (DIM + 2) floats of scratch. Returns 0, or -1 for a
 * shape it does not take (a limit outside [1, n] included). */
int mnesio_decode_attention(const float *q, const void *k, const void *v, int64_t head_stride, int64_t n, int heads,
                            int rows, const int64_t *limits, int dim, int kv_bits, int threads, float *scores,
                            float *part, float *out) {
    if (dim != DIM || rows < 1 || rows > MAX_ROWS || n < 1 || heads < 1 || (kv_bits != 16 && kv_bits != 32)) return -1;
    int64_t limit[MAX_ROWS];
    for (int r = 0; r < rows; r++) {
        limit[r] = limits ? limits[r] : n;
        if (limit[r] < 1 || limit[r] > n) return -1;
    }
    if (threads < 1) threads = 1;
    if (threads > 64) threads = 64;
    if (n < 256 * (int64_t)threads) threads = 1;  /* a short cache: not worth a second thread */
    int64_t per = (n + threads - 1) / threads;
    int64_t stride = (int64_t)heads * rows * (DIM + 2);
    struct attention_job job = {q, k, v, head_stride, n, per, stride, heads, rows, kv_bits, limit, scores, part};
    run_parts(attention_part, &job, threads);
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

/* y [m, out] = x w^T for a few rows x [m, in] (float32, rows `in` apart) and w [out, in] (bf16 or f32, rows
 * contiguous), each weight read once from memory: blocks of 4 output rows split over `threads` parts; within a block
 * (its weights in L1) the input rows three at a time, two accumulators of 16 per output and input row, the even
 * sixteens of `in` into the first and the odd into the second, added and summed across lanes at the end. Every
 * output is so the same arithmetic whatever m and whatever row group it falls in: a row's result is its one-row
 * product's bit for bit (batched or alone). While a block computes, its row groups prefetch the next block's weight
 * rows into L1, a share each (without it the few rows' products waited on memory block by block: ~17% slower for 14
 * rows of SmolLM2's layers, 2 threads, ad hoc; the same bits). Returns 0, or -1 for a shape it does not take (in not
 * a multiple of 32). */
#define DEFINE_BLOCK(NAME, LOAD, ELEM, G)                                                                        \
static inline void NAME(const float *x, const ELEM *w, int64_t in, int64_t o, int outs, float *y, int64_t ldy,  \
                        const ELEM *pf, int pf_first, int pf_step) {                                             \
    __m512 a[G][4][2];                                                                                           \
    for (int g = 0; g < G; g++)                                                                                  \
        for (int r = 0; r < 4; r++) a[g][r][0] = a[g][r][1] = _mm512_setzero_ps();                               \
    for (int64_t i = 0; i < in; i += 32) {                                                                       \
        if (pf)  /* rows pf_first, + pf_step, ... of the next block's weights, on their way while this computes */ \
            for (int r = pf_first; r < 4; r += pf_step)                                                          \
                for (int64_t b = 0; b < 32 * (int64_t)sizeof(ELEM); b += 64)                                     \
                    _mm_prefetch((const char *)(pf + r * in + i) + b, _MM_HINT_T0);                              \
        for (int h = 0; h < 2; h++) {                                                                            \
            __m512 wv[4];                                                                                        \
            for (int r = 0; r < 4; r++) wv[r] = r < outs ? LOAD(w + (o + r) * in + i + 16 * h) : _mm512_setzero_ps(); \
            for (int g = 0; g < G; g++) {                                                                        \
                __m512 xv = _mm512_loadu_ps(x + g * in + i + 16 * h);                                            \
                for (int r = 0; r < 4; r++) a[g][r][h] = _mm512_fmadd_ps(wv[r], xv, a[g][r][h]);                 \
            }                                                                                                    \
        }                                                                                                        \
    }                                                                                                            \
    for (int g = 0; g < G; g++)                                                                                  \
        for (int r = 0; r < outs; r++) y[g * ldy + o + r] = _mm512_reduce_add_ps(_mm512_add_ps(a[g][r][0], a[g][r][1])); \
}
#define DEFINE_ROWS(SUFFIX, LOAD, ELEM)                                                                          \
DEFINE_BLOCK(block1_##SUFFIX, LOAD, ELEM, 1) DEFINE_BLOCK(block2_##SUFFIX, LOAD, ELEM, 2)                        \
DEFINE_BLOCK(block3_##SUFFIX, LOAD, ELEM, 3)                                                                     \
static void rows_##SUFFIX(const float *x, int m, const ELEM *w, int64_t in, int64_t o0, int64_t o1, int64_t ldy, \
                          float *y) {  /* outputs [o0, o1) of y [m, ldy] */                                       \
    for (int64_t o = o0; o < o1; o += 4) {                                                                       \
        int outs = o1 - o < 4 ? (int)(o1 - o) : 4;                                                               \
        int groups = (m + 2) / 3;  /* the row groups share the prefetch of the next block's 4 weight rows */      \
        const ELEM *pf = o + 8 <= o1 ? w + (o + 4) * in : NULL;  /* the next block, when this part has it */     \
        for (int g = 0; g < m; g += 3) {                                                                         \
            const float *xg = x + g * in;                                                                        \
            float *yg = y + g * ldy;                                                                             \
            int k = g / 3;                                                                                       \
            const ELEM *p = k < 4 ? pf : NULL;                                                                   \
            switch (m - g < 3 ? m - g : 3) {                                                                     \
            case 1: block1_##SUFFIX(xg, w, in, o, outs, yg, ldy, p, k, groups); break;                           \
            case 2: block2_##SUFFIX(xg, w, in, o, outs, yg, ldy, p, k, groups); break;                           \
            default: block3_##SUFFIX(xg, w, in, o, outs, yg, ldy, p, k, groups);                                 \
            }                                                                                                    \
        }                                                                                                        \
    }                                                                                                            \
}

DEFINE_ROWS(bf16, load_bf16, uint16_t)
DEFINE_ROWS(f32, load_f32, float)

/* Int8 codes: torch's _weight_int8pack_mm arithmetic (aten/src/ATen/native/cpu/int8mm_kernel.cpp, AVX-512): each
 * code widened and times its row's bf16 scale in f32, one accumulator of 16 per output and input row, 16 inputs a
 * step, summed as _mm512_reduce_add_ps sums, rounded to bf16; so every result is that kernel's bit for bit, whatever
 * m. Written as bf16 bits (out_bits 16) or as the bf16 value in f32 (32). Input rows four at a time per block. */
#define DEFINE_BLOCK_I8(NAME, G)                                                                                 \
static inline void NAME(const float *x, const int8_t *w, const uint16_t *scales, int64_t in, int64_t o, int outs, \
                        int out_bits, void *y, int64_t ldy) {                                                    \
    __m512 a[G][4], s[4];                                                                                        \
    for (int r = 0; r < 4; r++) s[r] = _mm512_set1_ps(r < outs ? bf16_float(scales[o + r]) : 0.0f);              \
    for (int g = 0; g < G; g++)                                                                                  \
        for (int r = 0; r < 4; r++) a[g][r] = _mm512_setzero_ps();                                               \
    for (int64_t i = 0; i < in; i += 16) {                                                                       \
        __m512 ws[4];                                                                                            \
        for (int r = 0; r < 4; r++) {                                                                            \
            const int8_t *wr = w + (o + (r < outs ? r : 0)) * in + i;                                            \
            ws[r] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)wr))), s[r]); \
        }                                                                                                        \
        for (int g = 0; g < G; g++) {                                                                            \
            __m512 xv = _mm512_loadu_ps(x + g * in + i);                                                         \
            for (int r = 0; r < 4; r++) a[g][r] = _mm512_fmadd_ps(xv, ws[r], a[g][r]);                           \
        }                                                                                                        \
    }                                                                                                            \
    for (int g = 0; g < G; g++)                                                                                  \
        for (int r = 0; r < outs; r++) {                                                                         \
            uint16_t bits = bf16_bits(_mm512_reduce_add_ps(a[g][r]));                                            \
            if (out_bits == 16)                                                                                  \
                ((uint16_t *)y)[g * ldy + o + r] = bits;                                                         \
            else                                                                                                 \
                ((float *)y)[g * ldy + o + r] = bf16_float(bits);                                                \
        }                                                                                                        \
}
DEFINE_BLOCK_I8(block1_i8, 1) DEFINE_BLOCK_I8(block2_i8, 2) DEFINE_BLOCK_I8(block3_i8, 3) DEFINE_BLOCK_I8(block4_i8, 4)

static void rows_i8(const float *x, int m, const int8_t *w, const uint16_t *scales, int64_t in, int64_t o0,
                    int64_t o1, int64_t ldy, int out_bits, void *y) {  /* outputs [o0, o1) of y [m, ldy] */
    for (int64_t o = o0; o < o1; o += 4) {
        int outs = o1 - o < 4 ? (int)(o1 - o) : 4;
        for (int g = 0; g < m; g += 4) {
            const float *xg = x + g * in;
            void *yg = (char *)y + (int64_t)g * ldy * (out_bits / 8);
            switch (m - g < 4 ? m - g : 4) {
            case 1: block1_i8(xg, w, scales, in, o, outs, out_bits, yg, ldy); break;
            case 2: block2_i8(xg, w, scales, in, o, outs, out_bits, yg, ldy); break;
            case 3: block3_i8(xg, w, scales, in, o, outs, out_bits, yg, ldy); break;
            default: block4_i8(xg, w, scales, in, o, outs, out_bits, yg, ldy);
            }
        }
    }
}

struct rows_job {
    const float *x;
    int m;  /* input rows, `in` apart */
    const void *w;
    int64_t in, out, per;
    int w_bits;
    void *y;
    const uint16_t *scales;  /* int8 codes: each output row's bf16 scale */
    int out_bits;  /* int8 codes: the output's bits (rows_i8) */
};

static void rows_part(void *ctx, int p) {  /* output rows [p * per, (p + 1) * per), per a multiple of 4 */
    const struct rows_job *j = ctx;
    int64_t o0 = p * j->per, o1 = o0 + j->per < j->out ? o0 + j->per : j->out;
    if (o0 >= o1) return;
    if (j->w_bits == 16)
        rows_bf16(j->x, j->m, (const uint16_t *)j->w, j->in, o0, o1, j->out, (float *)j->y);
    else if (j->w_bits == 32)
        rows_f32(j->x, j->m, (const float *)j->w, j->in, o0, o1, j->out, (float *)j->y);
    else
        rows_i8(j->x, j->m, (const int8_t *)j->w, j->scales, j->in, o0, o1, j->out, j->out_bits, j->y);
}

static void run_rows(struct rows_job *job, int threads) {  /* the output rows' blocks of 4 split over `threads` parts */
    if (threads < 1) threads = 1;
    if (threads > POOL_MAX + 1) threads = POOL_MAX + 1;
    job->per = ((job->out + 3) / 4 + threads - 1) / threads * 4;
    run_parts(rows_part, job, threads);
}

/* y [m, out] = x w^T (DEFINE_ROWS): m rows of x [m, in] float32, w_bits 16 (bf16) or 32 (f32). Returns 0, or -1. */
int mnesio_linear_rows(const float *x, int m, const void *w, int64_t in, int64_t out, int w_bits, int threads, float *y) {
    if (m < 1 || m > LINEAR_MAX_ROWS || in < 32 || in % 32 || out < 1 || (w_bits != 16 && w_bits != 32)) return -1;
    struct rows_job job = {x, m, w, in, out, 0, w_bits, y, NULL, 32};
    run_rows(&job, threads);
    return 0;
}

/* y [m, out] = x (codes * scales)^T for m rows x [m, in] (float32, rounded to bf16 here) and int8 codes [out, in] (rows
 * contiguous), a bf16 scale per output row: an Int8WeightLinear's product on bf16 activations as torch's kernel
 * computes and rounds it (rows_i8), written as bf16 (out_bits 16) or its value in f32 (32). Returns 0, or -1. */
int mnesio_linear_rows_int8(const float *x, int m, const int8_t *codes, const uint16_t *scales, int64_t in, int64_t out,
                            int threads, int out_bits, void *y) {
    if (m < 1 || m > LINEAR_MAX_ROWS || in < 32 || in % 32 || out < 1 || (out_bits != 16 && out_bits != 32)) return -1;
    int64_t n = (int64_t)m * in;
    float local[4096], *rows = n <= 4096 ? local : malloc((size_t)n * sizeof(float));
    if (!rows) return -1;
    for (int64_t i = 0; i < n; i++) rows[i] = bf16_float(bf16_bits(x[i]));  /* the rows the kernel multiplies */
    struct rows_job job = {rows, m, codes, in, out, 0, 8, y, scales, out_bits};
    run_rows(&job, threads);
    if (rows != local) free(rows);
    return 0;
}
