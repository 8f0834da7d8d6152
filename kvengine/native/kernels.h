/* The fused kernels' entry points that kernels.c defines and layers.c calls, and their shared bf16 roundings. */
#ifndef MNESIO_KERNELS_H
#define MNESIO_KERNELS_H
#include <stdint.h>
#include <string.h>

#define LINEAR_MAX_ROWS 64  /* the most input rows the linear kernels take (a pass's tokens in layers.c) */

int mnesio_decode_attention(const float *q, const void *k, const void *v, int64_t head_stride, int64_t n, int heads,
                            int rows, const int64_t *limits, int dim, int kv_bits, int threads, float *scores,
                            float *part, float *out);
int mnesio_linear_rows(const float *x, int m, const void *w, int64_t in, int64_t out, int w_bits, int threads, float *y);
int mnesio_linear_rows_int8(const float *x, int m, const int8_t *codes, const uint16_t *scales, int64_t in, int64_t out,
                            int threads, int out_bits, void *y);

/* f32 -> bf16 bits, rounding to nearest even (c10::BFloat16's rounding; a NaN becomes a quiet NaN). */
static inline uint16_t bf16_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7FC0;
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

static inline float bf16_float(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
#endif
