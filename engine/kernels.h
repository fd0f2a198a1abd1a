/* kernels.h - CPU compute kernels with run-time ISA dispatch.
 *
 * Weights are rows of any supported dtype (ne[0] = cols contiguous).
 * Scalar code is the reference; AVX2(+FMA+F16C) and AVX-512 (VNNI where
 * present) variants are selected at run time by rlai_kernels_select().
 */
#ifndef RLAI_KERNELS_H
#define RLAI_KERNELS_H

#include <stdint.h>
#include <stddef.h>
#include <stdbool.h>
#include "rlai/engine.h"
#include "threadpool.h"

typedef struct rlai_weight {
    uint32_t type;        /* rlai_dtype */
    int64_t rows;         /* output features (ne[1]) */
    int64_t cols;         /* input features (ne[0]) */
    const void *data;     /* rows * row_bytes(type, cols) bytes, not owned */
    /* Optional: the same rows in the kernels' load-time layout
     * (rlai_kernels_pack), used by the matmuls of a kernel context of
     * level packed_isa instead of data; NULL = none. Not owned. Zero-
     * initialised weights have none. */
    const void *packed;
    rlai_isa packed_isa;
} rlai_weight;

/* ISA levels actually usable on this CPU (bitmask of 1<<rlai_isa). */
unsigned rlai_kernels_available(void);
/* Resolves AUTO to the best available level; returns RLAI_ERR_UNSUPPORTED
 * if a forced level is not available. */
int rlai_kernels_resolve(rlai_isa want, rlai_isa *got);
const char *rlai_isa_name(rlai_isa isa);

typedef struct rlai_kernels rlai_kernels;  /* opaque per-engine kernel context (scratch buffers) */

/* Creates a kernel context for `isa` (already resolved) and the precision
 * mode. precise = true: activations stay f32 and weights are dequantized
 * to f32 (matches a float reference to ~1e-6 relative); false: activations
 * are quantized per 32-block to Q8_0 (or Q8_1 for Q4_1/Q5_1 weights) and
 * integer dot products are used. *out owned by caller. */
int rlai_kernels_new(rlai_isa isa, bool precise, rlai_kernels **out);
void rlai_kernels_free(rlai_kernels *k);

/* y[t*ldy + r] = sum_c W[r][c] * x[t*ldx + c]  for t < T, r < rows.
 * x: T x cols f32 (caller-owned), y: T x rows (caller-owned, ldy >= rows).
 * Work is split over the pool's threads. T may be 1 (decode) or large
 * (prefill); weights are streamed once per call for all T. */
void rlai_matmul(rlai_kernels *k, rlai_threadpool *tp, const rlai_weight *w,
                 const float *x, int64_t ldx, int T, float *y, int64_t ldy);

/* rlai_matmul of n (<= RLAI_MATMUL_N_MAX) weights on the same input x:
 * y[i] = w[i] x, each output bit-identical to rlai_matmul's. When the
 * weights share their type and width, x is quantized once and all the
 * products' work runs in one pass of the pool (a layer's Q/K/V, gate/up);
 * otherwise it is n rlai_matmul calls. w, y, ldy: n entries, caller-owned;
 * the y[i] must not overlap x or each other. */
#define RLAI_MATMUL_N_MAX 4
void rlai_matmul_n(rlai_kernels *k, rlai_threadpool *tp, const rlai_weight *const *w, int n,
                   const float *x, int64_t ldx, int T, float *const *y, const int64_t *ldy);

/* Load-time weight layout. On the AVX-512 level the quantized matmuls of
 * Q4_0 / Q4_1 / Q8_0 weights take each 16-row group as one zmm lane per
 * row; from the GGUF layout they transpose the rows on every call (at
 * one token that is most of the work). rlai_kernels_pack writes that
 * layout once, with the same bytes per weight (kernels_impl.h, "packed
 * weights"); matmuls whose weight has it read it instead, bit-identical.
 * rlai_kernels_packed_bytes: the bytes rlai_kernels_pack needs for w on
 * k's level and mode, or 0 when this level has no packed layout for w
 * (other levels, the precise mode, other types). */
size_t rlai_kernels_packed_bytes(const rlai_kernels *k, const rlai_weight *w);
/* Writes w's rows (w->data) in the packed layout into dst, n bytes (64-byte
 * aligned, caller-owned, n >= rlai_kernels_packed_bytes(k, w)), split over
 * the pool's threads (tp may be NULL: the calling thread). Returns 0,
 * RLAI_ERR_UNSUPPORTED when k has no packed layout for w, or
 * RLAI_ERR_INVALID_ARG. The caller then sets w->packed = dst and
 * w->packed_isa = rlai_kernels_isa(k), and keeps dst while w is used. */
int rlai_kernels_pack(const rlai_kernels *k, rlai_threadpool *tp, const rlai_weight *w, void *dst, size_t n);
/* The ISA level k runs. */
rlai_isa rlai_kernels_isa(const rlai_kernels *k);

/* Copies row `r` of w, dequantized, into dst (cols floats); from the
 * packed copy when w has one (same values), else from data. */
void rlai_weight_get_row(const rlai_weight *w, int64_t r, float *dst);

/* Small vector helpers used by attention (dispatch on the same ISA). */
float rlai_vec_dot_f16_f32(rlai_kernels *k, int n, const uint16_t *a, const float *b);
/* y[i] += s * x[i] */
void rlai_vec_mad_f16(rlai_kernels *k, int n, float *y, const uint16_t *x, float s);
void rlai_f32_to_f16_row(rlai_kernels *k, const float *src, uint16_t *dst, int n);


/* Added by the kernels owner (append-only): preallocates the context's
 * scratch for up to n_threads threads and the quantized-activation buffer
 * for up to max_T tokens of max_cols columns, so later rlai_matmul calls
 * within those limits never allocate. Returns 0, RLAI_ERR_NOMEM or
 * RLAI_ERR_INVALID_ARG. (rlai_matmul grows the buffers itself when needed;
 * if that allocation fails it writes NaN to y instead of crashing.) */
int rlai_kernels_reserve(rlai_kernels *k, int n_threads, int64_t max_cols, int max_T);

/* Attention helpers over rows of an f16 KV block (row j at k + j*stride):
 * out[j] = scale * dot(q, row_j) for j < n (d elements each). */
void rlai_attn_dot_f16(rlai_kernels *k, int n, int d, const uint16_t *rows, size_t stride,
                       const float *q, float scale, float *out);
/* y[0..d) += sum_j p[j] * row_j. */
void rlai_attn_mad_f16(rlai_kernels *k, int n, int d, const uint16_t *rows, size_t stride,
                       const float *p, float *y);
/* The same two helpers for nq queries over one block of m rows (row j at
 * rows + j*stride), as speculative verification rows and the heads of a
 * grouped-query group read the same K/V: the rows are converted once and
 * shared. Each query's results are bit-identical to the one-query helper's
 * on that query alone, whatever nq and the grouping:
 *   dot: out[qi][j] = scale * dot(q[qi], row_j) for j < m;
 *   mad: y[qi][0..d) += sum over j < min(mq[qi], m) of p[qi][j] * row_j.
 * Arrays of nq pointers, caller-owned; out and y must not overlap. */
void rlai_attn_dot_f16_multi(rlai_kernels *k, int m, int d, const uint16_t *rows, size_t stride, int nq,
                             const float *const *q, float scale, float *const *out);
void rlai_attn_mad_f16_multi(rlai_kernels *k, int m, int d, const uint16_t *rows, size_t stride, int nq,
                             const int *mq, const float *const *p, float *const *y);
/* x[i] = exp(x[i] - max) for i < n; returns the sum (relative error of
 * each exp below 2e-7 on the SIMD path). */
float rlai_vec_exp_sum(rlai_kernels *k, int n, float *x, float max);
/* gate[i] = silu(gate[i]) * up[i] for i < n, silu(x) = x / (1 + expf(-x)),
 * with exactly glibc's expf on every level (kernels_impl.h); the same
 * element gives the same result wherever it sits in the arrays. Both
 * arrays caller-owned, not overlapping. */
void rlai_vec_swiglu(rlai_kernels *k, size_t n, float *gate, const float *up);

#endif
