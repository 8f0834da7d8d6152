/* A Llama-style decoder's pass of a few tokens over a cache in one call: every layer's RMSNorms, projections, rotary
 * embedding, cache write, attention, SwiGLU and residual adds, with no Python between them (mnesio_layers_pass).
 *
 * Built into the kernels' library beside kernels.c, whose entry points do the products and the attention: the very
 * kernels the model's own forward calls for a few rows (kvengine/fused.py), so those results are the model's bit for
 * bit given the same inputs. The rest follows transformers' LlamaDecoderLayer op for op in f32 (the rotary embedding,
 * the cache's bf16 rounding, the attention's query and output roundings over a bf16 KV: the same bits); only the
 * RMSNorm's sum (in double here) and SiLU's exp (libm's) are not torch's vectorized ones. Driven by
 * kvengine/native_pass.py; design: docs/design/attention.md, "The decoder's pass in one call".
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

#define HEAD 64
#define MAX_PASS_ROWS 128  /* the attention kernel's packed query rows: a pass's tokens times the query heads per KV head */

enum { Q, K, V, O, GATE, UP, DOWN, PROJECTIONS };

struct mnesio_layer {  /* one decoder layer's operands (kvengine/native_pass.py's _Layer) */
    const float *norm_in, *norm_post;  /* the RMSNorms' weights [hidden] */
    const void *w[PROJECTIONS];  /* [out, in]: f32 (w_bits 32) or int8 codes (w_bits 8) */
    const uint16_t *scales[PROJECTIONS];  /* int8 codes: each output row's bf16 scale */
    void *k, *v;  /* the layer's cache buffers [kv_heads, capacity, HEAD]: f32 or bf16 (kv_bits) */
};

struct shape {
    int w_bits, kv_bits, hidden, heads, kv_heads, inter, m, threads;
    float eps, scale;
    int64_t capacity, length;
};

/* y = w * (x * rsqrt(mean(x^2) + eps)) per row, as LlamaRMSNorm computes it in f32 (the squares summed in double). */
static void rms_norm(const float *h, const float *w, int m, int n, float eps, float *y) {
    for (int i = 0; i < m; i++) {
        const float *x = h + (int64_t)i * n;
        double sum = 0.0;
        for (int d = 0; d < n; d++) {
            float square = x[d] * x[d];
            sum += square;
        }
        float r = 1.0f / sqrtf((float)(sum / n) + eps);
        for (int d = 0; d < n; d++) {
            float scaled = x[d] * r;
            y[(int64_t)i * n + d] = w[d] * scaled;
        }
    }
}

/* y [m, out] = x w^T through kernels.c's few-row products: f32 outputs, or bf16 bits (int8 codes, out_bits 16). */
static int linear(const struct mnesio_layer *layer, int which, const struct shape *s, const float *x, int64_t in,
                  int64_t out, int out_bits, void *y) {
    if (s->w_bits == 8)
        return mnesio_linear_rows_int8(x, s->m, layer->w[which], layer->scales[which], in, out, s->threads, out_bits, y);
    return mnesio_linear_rows(x, s->m, layer->w[which], in, out, 32, s->threads, y);
}

/* x * cos + rotate_half(x) * sin for every head of 64 of m rows (transformers' apply_rotary_pos_emb), in place. */
static void rope(float *x, int m, int heads, const float *cos, const float *sin) {
    float t[HEAD];
    for (int i = 0; i < m; i++)
        for (int h = 0; h < heads; h++) {
            float *xh = x + ((int64_t)i * heads + h) * HEAD;
            const float *c = cos + (int64_t)i * HEAD, *sn = sin + (int64_t)i * HEAD;
            for (int d = 0; d < HEAD; d++) {
                float turned = d < HEAD / 2 ? -xh[d + HEAD / 2] : xh[d - HEAD / 2];
                float a = xh[d] * c[d], b = turned * sn[d];
                t[d] = a + b;
            }
            memcpy(xh, t, sizeof t);
        }
}

static void store(void *buf, int kv_bits, int64_t at, float x) {  /* one cache element, rounded as copy_ rounds it */
    if (kv_bits == 16)
        ((uint16_t *)buf)[at] = bf16_bits(x);
    else
        ((float *)buf)[at] = x;
}

/* One layer of the pass: h [m, hidden] (the residual stream) updated in place; `scratch` holds the work buffers. */
static int layer_pass(const struct mnesio_layer *layer, const struct shape *s, const int64_t *limits, const float *cos,
                      const float *sin, float *h, float *scratch) {
    const int m = s->m, hidden = s->hidden, kvh = s->kv_heads, groups = s->heads / s->kv_heads, rows = groups * m;
    const int64_t qn = (int64_t)s->heads * HEAD, kn = (int64_t)kvh * HEAD, n = s->length + m;
    float *x = scratch, *q = x + (int64_t)m * hidden, *k = q + m * qn, *v = k + m * kn, *attn = v + m * kn;
    float *qp = attn + m * qn, *out = qp + m * qn, *gate = out + m * qn, *up = gate + (int64_t)m * s->inter;
    float *scores = up + (int64_t)m * s->inter, *part = scores + (int64_t)(rows + 15) / 16 * 16 * n;
    const int v_bits = s->w_bits == 8 ? s->kv_bits : 32;  /* bf16w8's value projection returns the bf16 KV itself */

    rms_norm(h, layer->norm_in, m, hidden, s->eps, x);
    if (linear(layer, Q, s, x, hidden, qn, 32, q) || linear(layer, K, s, x, hidden, kn, 32, k)
        || linear(layer, V, s, x, hidden, kn, v_bits, v))
        return -1;
    rope(q, m, s->heads, cos, sin);
    rope(k, m, kvh, cos, sin);
    for (int j = 0; j < kvh; j++)  /* the new positions into the cache: [j, length + i, :] */
        for (int i = 0; i < m; i++) {
            int64_t at = ((int64_t)j * s->capacity + s->length + i) * HEAD, from = ((int64_t)i * kvh + j) * HEAD;
            for (int d = 0; d < HEAD; d++) store(layer->k, s->kv_bits, at + d, k[from + d]);
            if (v_bits == 16)
                memcpy((uint16_t *)layer->v + at, (const uint16_t *)v + from, HEAD * sizeof(uint16_t));
            else
                for (int d = 0; d < HEAD; d++) store(layer->v, s->kv_bits, at + d, v[from + d]);
        }
    for (int j = 0; j < kvh; j++)  /* packed queries (kvengine/attention.py): row g * m + i of KV head j is head j * groups + g */
        for (int g = 0; g < groups; g++)
            for (int i = 0; i < m; i++)
                for (int d = 0; d < HEAD; d++) {
                    float value = q[((int64_t)i * s->heads + j * groups + g) * HEAD + d];
                    if (s->kv_bits == 16) value = bf16_float(bf16_bits(value));  /* the query in the values' dtype */
                    qp[(((int64_t)j * groups + g) * m + i) * HEAD + d] = value * s->scale;
                }
    if (mnesio_decode_attention(qp, layer->k, layer->v, s->capacity * HEAD, n, kvh, rows, limits, HEAD, s->kv_bits,
                                s->threads, scores, part, out))
        return -1;
    for (int j = 0; j < kvh; j++)  /* [kv_heads, rows, HEAD] back to [m, heads * HEAD], in the values' dtype */
        for (int g = 0; g < groups; g++)
            for (int i = 0; i < m; i++)
                for (int d = 0; d < HEAD; d++) {
                    float value = out[(((int64_t)j * groups + g) * m + i) * HEAD + d];
                    attn[((int64_t)i * s->heads + j * groups + g) * HEAD + d] =
                        s->kv_bits == 16 ? bf16_float(bf16_bits(value)) : value;
                }
    if (linear(layer, O, s, attn, qn, hidden, 32, x)) return -1;
    for (int64_t e = 0; e < (int64_t)m * hidden; e++) h[e] = h[e] + x[e];
    rms_norm(h, layer->norm_post, m, hidden, s->eps, x);
    if (linear(layer, GATE, s, x, hidden, s->inter, 32, gate) || linear(layer, UP, s, x, hidden, s->inter, 32, up))
        return -1;
    for (int64_t e = 0; e < (int64_t)m * s->inter; e++) {
        float silu = gate[e] / (1.0f + expf(-gate[e]));
        gate[e] = silu * up[e];
    }
    if (linear(layer, DOWN, s, gate, s->inter, hidden, 32, x)) return -1;
    for (int64_t e = 0; e < (int64_t)m * hidden; e++) h[e] = h[e] + x[e];
    return 0;
}

/* The pass of m tokens at positions [length, length + m) through `num_layers` layers: h [m, hidden] f32 in and out
 * (the embeddings in, the last layer's residual stream out), cos and sin [m, HEAD] (the rotary table of those
 * positions), token i seeing the cache's positions up to its own; each layer's keys and values written into its
 * buffers at those positions. w_bits 32 (f32 weights, f32 KV) or 8 (int8 codes; the KV f32 or bf16, kv_bits); query
 * heads a multiple of the KV heads, head size 64; `scale` the attention's (head_dim ** -0.5). Returns 0, -1 for a
 * shape it does not take (before writing anything), -2 if out of memory. */
int mnesio_layers_pass(const struct mnesio_layer *layers, int num_layers, int w_bits, int kv_bits, int hidden, int heads,
                       int kv_heads, int inter, float eps, float scale, int64_t capacity, int64_t length, int m,
                       const float *cos, const float *sin, int threads, float *h) {
    if (num_layers < 1 || (w_bits != 8 && w_bits != 32) || (kv_bits != 16 && kv_bits != 32) || (w_bits == 32 && kv_bits != 32)
        || kv_heads < 1 || heads < kv_heads || heads % kv_heads || m < 1 || m > LINEAR_MAX_ROWS
        || (int64_t)m * (heads / kv_heads) > MAX_PASS_ROWS
        || hidden < 32 || hidden % 32 || inter < 32 || inter % 32 || (heads * HEAD) % 32 || length < 0
        || length + m > capacity)
        return -1;
    if (threads < 1) threads = 1;
    if (threads > 64) threads = 64;
    const int rows = (heads / kv_heads) * m;
    const int64_t n = length + m, qn = (int64_t)heads * HEAD, kn = (int64_t)kv_heads * HEAD;
    const int64_t floats = (int64_t)m * hidden + 4 * m * qn + 2 * m * kn + 2 * (int64_t)m * inter
                           + (int64_t)(rows + 15) / 16 * 16 * n + (int64_t)threads * kv_heads * rows * (HEAD + 2);
    float *scratch = malloc((size_t)floats * sizeof(float));
    if (!scratch) return -2;
    int64_t limits[MAX_PASS_ROWS];
    for (int r = 0; r < rows; r++) limits[r] = length + r % m + 1;  /* packed row g * m + i is token i */
    struct shape s = {w_bits, kv_bits, hidden, heads, kv_heads, inter, m, threads, eps, scale, capacity, length};
    int rc = 0;
    for (int l = 0; l < num_layers && !rc; l++) rc = layer_pass(layers + l, &s, limits, cos, sin, h, scratch);
    free(scratch);
    return rc;
}
