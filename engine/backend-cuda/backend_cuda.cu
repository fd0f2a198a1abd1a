/* backend_cuda.cu - the CUDA backend (engine/backend.h), built as the
 * run-time module rlai-backend-cuda.so. UNVERIFIED on a GPU: it compiles
 * and links in CI, and its open path without a driver is tested; the
 * kernels have not yet been run on a device (see README.md here).
 *
 * Everything runs on one stream. Tensors are device memory (cudaMalloc).
 * Host metadata (token ids, positions, block tables, inv_freq) is staged
 * into device buffers owned by the instance with a stream-ordered copy
 * from host memory: cudaMemcpyAsync from pageable memory returns once the
 * source has been read, so the caller's arrays are only read during the
 * call, as backend.h requires.
 *
 * Errors inside void ops are sticky: the first CUDA error is recorded and
 * the next download/argmax/copy returns RLAI_ERR_IO (and the message is
 * printed once on stderr). */
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "backend.h"
#include "rlai/error.h"
}

#define KV_BLOCK 16   /* RLAI_KV_BLOCK in kv_cache.h */
#define QK 32

enum { DT_F32 = 0, DT_F16 = 1, DT_Q4_0 = 2, DT_Q4_1 = 3, DT_Q5_0 = 6, DT_Q5_1 = 7, DT_Q8_0 = 8, DT_BF16 = 30 };

static size_t row_bytes_of(uint32_t t, int64_t n)
{
    switch (t) {
    case DT_F32: return (size_t)n * 4;
    case DT_F16: case DT_BF16: return (size_t)n * 2;
    case DT_Q4_0: return (size_t)(n / QK) * 18;
    case DT_Q4_1: return (size_t)(n / QK) * 20;
    case DT_Q5_0: return (size_t)(n / QK) * 22;
    case DT_Q5_1: return (size_t)(n / QK) * 24;
    case DT_Q8_0: return (size_t)(n / QK) * 34;
    default: return 0;
    }
}

/* A growable device buffer for staged metadata, with a host copy of what
 * was last staged into it: model.c passes the same positions and tables to
 * rope, kv_store and attention of every layer, and restaging identical
 * bytes is skipped (each pageable copy may synchronise the stream). */
typedef struct dbuf {
    void *p;
    size_t cap;
    void *shadow;
    size_t shadow_n;
    bool valid;
} dbuf;

typedef struct cuda_backend {
    rlai_backend base;
    int device;
    int max_ctx;
    cudaStream_t stream;
    cudaError_t err;          /* first error seen (sticky) */
    bool reported;
    dbuf ids, pos, toff, tables, inv_freq, argmax;
    int32_t *h_toff;          /* host staging for flattened block tables */
    int32_t *h_tables;
    size_t h_toff_cap, h_tables_cap;
    char desc[192];
} cuda_backend;

static cuda_backend *cb(rlai_backend *be) { return (cuda_backend *)be; }

static void note(cuda_backend *c, cudaError_t e)
{
    if (e != cudaSuccess && c->err == cudaSuccess)
        c->err = e;
}

static void note_launch(cuda_backend *c) { note(c, cudaGetLastError()); }

static int status(cuda_backend *c)
{
    if (c->err == cudaSuccess)
        return 0;
    if (!c->reported) {
        fprintf(stderr, "rlai cuda backend: %s\n", cudaGetErrorString(c->err));
        c->reported = true;
    }
    return RLAI_ERR_IO;
}

/* Makes b hold at least n bytes (contents not kept). */
static int dbuf_reserve(cuda_backend *c, dbuf *b, size_t n)
{
    if (n <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < n)
        cap *= 2;
    b->valid = false;
    if (b->p) {
        note(c, cudaStreamSynchronize(c->stream));
        cudaFree(b->p);
        b->p = NULL;
        b->cap = 0;
    }
    cudaError_t e = cudaMalloc(&b->p, cap);
    if (e != cudaSuccess) {
        note(c, e);
        b->p = NULL;
        return RLAI_ERR_NOMEM;
    }
    b->cap = cap;
    return 0;
}

/* Copies n bytes of host metadata into b on the stream; returns the device
 * pointer or NULL on error. */
static void *stage(cuda_backend *c, dbuf *b, const void *src, size_t n)
{
    if (dbuf_reserve(c, b, n ? n : 4) < 0)
        return NULL;
    if (c->err != cudaSuccess)
        return NULL;
    if (!n || (b->valid && b->shadow_n == n && memcmp(b->shadow, src, n) == 0))
        return b->p;   /* already there */
    b->valid = false;
    void *sh = realloc(b->shadow, n);
    if (sh) {
        b->shadow = sh;
        memcpy(sh, src, n);
    }
    note(c, cudaMemcpyAsync(b->p, src, n, cudaMemcpyHostToDevice, c->stream));
    if (c->err != cudaSuccess)
        return NULL;
    if (sh) {
        b->shadow_n = n;
        b->valid = true;
    }
    return b->p;
}

static int grow_host(int32_t **p, size_t *cap, size_t n)
{
    if (n <= *cap)
        return 0;
    size_t nc = *cap ? *cap : 256;
    while (nc < n)
        nc *= 2;
    int32_t *q = (int32_t *)realloc(*p, nc * sizeof(int32_t));
    if (!q)
        return RLAI_ERR_NOMEM;
    *p = q;
    *cap = nc;
    return 0;
}

/* Stages positions and block tables of rows: row i's table starts at
 * d_toff[i] in d_tables. Consecutive rows sharing a table share a copy. */
static int stage_rows(cuda_backend *c, const rlai_paged_rows *rows, const int32_t **d_pos,
                      const int32_t **d_toff, const int32_t **d_tables)
{
    int n = rows->n;
    if (grow_host(&c->h_toff, &c->h_toff_cap, (size_t)n) < 0)
        return RLAI_ERR_NOMEM;
    size_t total = 0;
    /* first pass: size (a shared table is copied with the largest block count of its run) */
    for (int i = 0; i < n;) {
        int j = i, need = rows->pos[i] / KV_BLOCK + 1;
        while (j + 1 < n && rows->tables[j + 1] == rows->tables[i]) {
            j++;
            int nb = rows->pos[j] / KV_BLOCK + 1;
            need = nb > need ? nb : need;
        }
        total += (size_t)need;
        i = j + 1;
    }
    if (grow_host(&c->h_tables, &c->h_tables_cap, total ? total : 1) < 0)
        return RLAI_ERR_NOMEM;
    size_t at = 0;
    for (int i = 0; i < n;) {
        int j = i, need = rows->pos[i] / KV_BLOCK + 1;
        while (j + 1 < n && rows->tables[j + 1] == rows->tables[i]) {
            j++;
            int nb = rows->pos[j] / KV_BLOCK + 1;
            need = nb > need ? nb : need;
        }
        memcpy(c->h_tables + at, rows->tables[i], sizeof(int32_t) * (size_t)need);
        for (int k = i; k <= j; k++)
            c->h_toff[k] = (int32_t)at;
        at += (size_t)need;
        i = j + 1;
    }
    *d_pos = (const int32_t *)stage(c, &c->pos, rows->pos, sizeof(int32_t) * (size_t)n);
    *d_toff = (const int32_t *)stage(c, &c->toff, c->h_toff, sizeof(int32_t) * (size_t)n);
    *d_tables = (const int32_t *)stage(c, &c->tables, c->h_tables, sizeof(int32_t) * at);
    return *d_pos && *d_toff && *d_tables ? 0 : RLAI_ERR_IO;
}

/* ------------------------------------------------------------ device math */

__device__ __forceinline__ float h2f(const uint8_t *p)
{
    uint16_t u = (uint16_t)(p[0] | (p[1] << 8));
    return __half2float(__ushort_as_half(u));
}

/* Element c of a row of type t, dequantized exactly as dtype.c does it
 * (no contraction into FMA: __fmul_rn / __fadd_rn). */
__device__ __forceinline__ float deq1(uint32_t t, const uint8_t *row, int64_t c)
{
    int64_t b = c / QK;
    int j = (int)(c % QK);
    switch (t) {
    case DT_F32: return ((const float *)row)[c];
    case DT_F16: return __half2float(__ushort_as_half(((const uint16_t *)row)[c]));
    case DT_BF16: return __uint_as_float((uint32_t)((const uint16_t *)row)[c] << 16);
    case DT_Q4_0: {
        const uint8_t *k = row + b * 18;
        int q = j < 16 ? (k[2 + j] & 0xF) : (k[2 + j - 16] >> 4);
        return __fmul_rn((float)(q - 8), h2f(k));
    }
    case DT_Q4_1: {
        const uint8_t *k = row + b * 20;
        int q = j < 16 ? (k[4 + j] & 0xF) : (k[4 + j - 16] >> 4);
        return __fadd_rn(__fmul_rn((float)q, h2f(k)), h2f(k + 2));
    }
    case DT_Q5_0: {
        const uint8_t *k = row + b * 22;
        uint32_t qh = (uint32_t)k[2] | (uint32_t)k[3] << 8 | (uint32_t)k[4] << 16 | (uint32_t)k[5] << 24;
        int q = (j < 16 ? (k[6 + j] & 0xF) : (k[6 + j - 16] >> 4)) | (int)((qh >> j) & 1u) << 4;
        return __fmul_rn((float)(q - 16), h2f(k));
    }
    case DT_Q5_1: {
        const uint8_t *k = row + b * 24;
        uint32_t qh = (uint32_t)k[4] | (uint32_t)k[5] << 8 | (uint32_t)k[6] << 16 | (uint32_t)k[7] << 24;
        int q = (j < 16 ? (k[8 + j] & 0xF) : (k[8 + j - 16] >> 4)) | (int)((qh >> j) & 1u) << 4;
        return __fadd_rn(__fmul_rn((float)q, h2f(k)), h2f(k + 2));
    }
    case DT_Q8_0: {
        const uint8_t *k = row + b * 34;
        return __fmul_rn((float)(int8_t)k[2 + j], h2f(k));
    }
    default: return 0.0f;
    }
}

__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Block-wide reduction of blockDim.x (multiple of 32, <= 1024) threads. */
__device__ float block_sum(float v, float *sh)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    float r = 0.0f;
    for (int i = 0; i < nw; i++) r += sh[i];
    return r;
}

__device__ float block_max(float v, float *sh)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    float r = -INFINITY;
    for (int i = 0; i < nw; i++) r = fmaxf(r, sh[i]);
    return r;
}

/* ------------------------------------------------------------ kernels */

__global__ void k_get_rows(uint32_t t, const uint8_t *w, size_t rb, int64_t cols, const int32_t *ids, float *dst)
{
    int i = blockIdx.x;
    const uint8_t *row = w + (size_t)ids[i] * rb;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
        dst[(size_t)i * cols + c] = deq1(t, row, c);
}

__global__ void k_rmsnorm(float *dst, const float *x, const float *w, int d, float eps)
{
    __shared__ double sh[32];
    const float *xr = x + (size_t)blockIdx.x * d;
    float *yr = dst + (size_t)blockIdx.x * d;
    double ss = 0.0;
    for (int i = threadIdx.x; i < d; i += blockDim.x)
        ss += (double)xr[i] * xr[i];
    for (int o = 16; o > 0; o >>= 1)
        ss += __shfl_xor_sync(0xffffffffu, ss, o);
    int lane = threadIdx.x & 31, wi = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (lane == 0) sh[wi] = ss;
    __syncthreads();
    double tot = 0.0;
    for (int i = 0; i < nw; i++) tot += sh[i];
    float scale = (float)(1.0 / sqrt(tot / d + eps));
    __syncthreads();   /* every thread has read sh before dst (which may be x) is written */
    for (int i = threadIdx.x; i < d; i += blockDim.x)
        yr[i] = __fmul_rn(__fmul_rn(xr[i], scale), w[i]);
}

/* Matmul, every T: one warp per R output rows (R = 1 for decode-sized T,
 * 4 for prefill), lanes stride the columns (adjacent lanes read adjacent
 * bytes of a block), MM_T tokens per warp (blockIdx.y picks the tokens).
 * Every output (token t, row r) is computed by the same instruction
 * sequence whatever T, the row group or the token chunk it falls in: lane l
 * sums w[r][c] * x[t][c] over c = l, l + 32, ... in order with one fma per
 * term, then the warp's xor-butterfly adds the 32 partial sums. So a row's
 * result does not depend on the other rows of the batch (batch invariance:
 * speculative verification, continuous batching and prefill give the same
 * bits as decoding the token alone), as on the CPU. */
#define MM_T 8
#define MM_WARPS 8
template <int R>
__global__ void k_matmul(uint32_t t, const uint8_t *w, size_t rb, int64_t rows, int64_t cols,
                         const float *x, int64_t ldx, int T, float *y, int64_t ldy)
{
    int64_t r0 = ((int64_t)blockIdx.x * MM_WARPS + (threadIdx.x >> 5)) * R;
    int lane = threadIdx.x & 31;
    int t0 = blockIdx.y * MM_T;
    if (r0 >= rows || t0 >= T)
        return;                                   /* the whole warp: same r0 and t0 */
    int nt = T - t0 < MM_T ? T - t0 : MM_T;
    const uint8_t *row[R];
#pragma unroll
    for (int i = 0; i < R; i++)
        row[i] = w + (size_t)(r0 + i < rows ? r0 + i : rows - 1) * rb;   /* past the end: computed, not stored */
    const float *xt = x + (size_t)t0 * ldx;
    float acc[R][MM_T];
#pragma unroll
    for (int i = 0; i < R; i++)
#pragma unroll
        for (int k = 0; k < MM_T; k++) acc[i][k] = 0.0f;
    for (int64_t c = lane; c < cols; c += 32) {
        float wv[R];
#pragma unroll
        for (int i = 0; i < R; i++) wv[i] = deq1(t, row[i], c);
#pragma unroll
        for (int k = 0; k < MM_T; k++)
            if (k < nt) {
                float xv = xt[(size_t)k * ldx + c];
#pragma unroll
                for (int i = 0; i < R; i++) acc[i][k] = __fmaf_rn(wv[i], xv, acc[i][k]);
            }
    }
#pragma unroll
    for (int i = 0; i < R; i++)
#pragma unroll
        for (int k = 0; k < MM_T; k++)
            if (k < nt) {
                float s = warp_sum(acc[i][k]);
                if (lane == 0 && r0 + i < rows) y[(size_t)(t0 + k) * ldy + r0 + i] = s;
            }
}

__global__ void k_add_row(float *x, const float *b, int n, int d)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (size_t)n * d) x[i] = __fadd_rn(x[i], b[i % d]);
}

__global__ void k_add(float *x, const float *y, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = __fadd_rn(x[i], y[i]);
}

__global__ void k_swiglu(float *g, const float *u, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = g[i];
        g[i] = __fmul_rn(__fdiv_rn(v, __fadd_rn(1.0f, expf(-v))), u[i]);
    }
}

/* One thread per (row, head, pair). Angles in double like the CPU. */
__global__ void k_rope(float *x, int n, int H, int D, int n_rot, int neox, const float *inv_freq, const int32_t *pos)
{
    int half = n_rot / 2;
    size_t id = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (size_t)n * H * half) return;
    int i = (int)(id % half);
    size_t rh = id / half;                      /* row * H + head */
    int row = (int)(rh / H);
    double ang = (double)pos[row] * inv_freq[i];
    float c = (float)cos(ang), s = (float)sin(ang);
    float *v = x + rh * D;
    int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
    float x0 = v[i0], x1 = v[i1];
    v[i0] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    v[i1] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
}

__device__ __forceinline__ uint8_t *page_row(uint8_t *base, size_t row_bytes, const int32_t *table, int p)
{
    return base + ((size_t)table[p / KV_BLOCK] * KV_BLOCK + (size_t)(p % KV_BLOCK)) * row_bytes;
}

/* One block per row: K and V converted to the cache type. For q8_0 each
 * warp quantizes 32-value blocks as dtype.c's reference does. */
__global__ void k_kv_store(uint8_t *kp, uint8_t *vp, size_t row_bytes, uint32_t dt, int kvd,
                           const int32_t *pos, const int32_t *toff, const int32_t *tables,
                           const float *k, const float *v)
{
    int i = blockIdx.x;
    const int32_t *table = tables + toff[i];
    for (int which = 0; which < 2; which++) {
        const float *src = (which ? v : k) + (size_t)i * kvd;
        uint8_t *dst = page_row(which ? vp : kp, row_bytes, table, pos[i]);
        if (dt == DT_F32) {
            for (int j = threadIdx.x; j < kvd; j += blockDim.x) ((float *)dst)[j] = src[j];
        } else if (dt == DT_F16) {
            for (int j = threadIdx.x; j < kvd; j += blockDim.x)
                ((__half *)dst)[j] = __float2half_rn(src[j]);
        } else {   /* q8_0 */
            int lane = threadIdx.x & 31, nw = blockDim.x >> 5;
            for (int b = threadIdx.x >> 5; b < kvd / QK; b += nw) {
                float xv = src[b * QK + lane];
                float amax = warp_max(fabsf(xv));
                float d = amax / 127.0f;
                float id = d != 0.0f ? 1.0f / d : 0.0f;
                float r = roundf(xv * id);
                r = r != r ? 0.0f : fminf(127.0f, fmaxf(-127.0f, r));
                uint8_t *blk = dst + (size_t)b * 34;
                blk[2 + lane] = (uint8_t)(int8_t)r;
                if (lane == 0) {
                    uint16_t h = __half_as_ushort(__float2half_rn(d));
                    blk[0] = (uint8_t)(h & 0xFF);
                    blk[1] = (uint8_t)(h >> 8);
                }
            }
        }
    }
}

/* Value d of head slice kvh of a cache row. */
__device__ __forceinline__ float kv_get(uint32_t dt, const uint8_t *row, int kvh, int D, int d)
{
    if (dt == DT_F32) return ((const float *)row)[kvh * D + d];
    if (dt == DT_F16) return __half2float(((const __half *)row)[kvh * D + d]);
    const uint8_t *blk = row + ((size_t)kvh * (D / QK) + d / QK) * 34;
    return (float)(int8_t)blk[2 + d % QK] * h2f(blk);
}

/* Paged causal attention, one block of ATT_T threads per (row, head):
 * online softmax over chunks of ATT_T positions; thread t scores position
 * j0 + t, threads d < D accumulate output element d. */
#define ATT_T 256
__global__ void k_attention(const uint8_t *kp, const uint8_t *vp, size_t row_bytes, uint32_t dt,
                            const int32_t *pos, const int32_t *toff, const int32_t *tables,
                            int H, int group, int D, const float *q, float *out)
{
    __shared__ float sc[ATT_T];
    __shared__ float qs[256];
    __shared__ float red[32];
    int i = blockIdx.x / H, h = blockIdx.x % H, kvh = h / group;
    const int32_t *table = tables + toff[i];
    int n = pos[i] + 1;
    const float *qi = q + ((size_t)i * H + h) * D;
    for (int d = threadIdx.x; d < D; d += blockDim.x) qs[d] = qi[d];
    __syncthreads();
    float scale = 1.0f / sqrtf((float)D);
    float m = -INFINITY, l = 0.0f, acc = 0.0f;
    int d = threadIdx.x;
    for (int j0 = 0; j0 < n; j0 += ATT_T) {
        int j = j0 + threadIdx.x;
        float s = -INFINITY;
        if (j < n) {
            const uint8_t *kr = page_row((uint8_t *)kp, row_bytes, table, j);
            float a = 0.0f;
            for (int e = 0; e < D; e++) a += qs[e] * kv_get(dt, kr, kvh, D, e);
            s = a * scale;
        }
        float cm = block_max(s, red);
        float mn = fmaxf(m, cm);
        float f = m == -INFINITY ? 0.0f : expf(m - mn);
        float p = j < n ? expf(s - mn) : 0.0f;
        __syncthreads();
        sc[threadIdx.x] = p;
        float ps = block_sum(p, red);   /* contains the barrier that publishes sc */
        l = l * f + ps;
        if (d < D) {
            float a = acc * f;
            int m2 = n - j0 < ATT_T ? n - j0 : ATT_T;
            for (int t = 0; t < m2; t++) {
                const uint8_t *vr = page_row((uint8_t *)vp, row_bytes, table, j0 + t);
                a += sc[t] * kv_get(dt, vr, kvh, D, d);
            }
            acc = a;
        }
        m = mn;
        __syncthreads();
    }
    if (d < D) out[((size_t)i * H + h) * D + d] = acc / l;
}

/* One block per row: the lowest index of the maximum. */
__global__ void k_argmax(const float *logits, int V, int32_t *out)
{
    __shared__ float bv[32];
    __shared__ int bi[32];
    const float *r = logits + (size_t)blockIdx.x * V;
    float best = -INFINITY;
    int idx = 0x7fffffff;
    for (int j = threadIdx.x; j < V; j += blockDim.x)
        if (r[j] > best) { best = r[j]; idx = j; }
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, best, o);
        int oi = __shfl_xor_sync(0xffffffffu, idx, o);
        if (ov > best || (ov == best && oi < idx)) { best = ov; idx = oi; }
    }
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (lane == 0) { bv[w] = best; bi[w] = idx; }
    __syncthreads();
    if (threadIdx.x == 0) {
        /* thread 0 holds warp 0's result, which is bv[0] */
        for (int k = 1; k < nw; k++)
            if (bv[k] > best || (bv[k] == best && bi[k] < idx)) { best = bv[k]; idx = bi[k]; }
        out[blockIdx.x] = idx == 0x7fffffff ? 0 : idx;
    }
}

/* ------------------------------------------------------------ interface */

static unsigned blocks_for(size_t n, unsigned per) { return (unsigned)((n + per - 1) / per); }

static void cu_free(rlai_backend *be)
{
    cuda_backend *c = cb(be);
    if (!c)
        return;
    cudaStreamSynchronize(c->stream);
    dbuf *bufs[] = { &c->ids, &c->pos, &c->toff, &c->tables, &c->inv_freq, &c->argmax };
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) {
        cudaFree(bufs[i]->p);
        free(bufs[i]->shadow);
    }
    cudaStreamDestroy(c->stream);
    free(c->h_toff);
    free(c->h_tables);
    free(c);
}

static const char *cu_describe(rlai_backend *be) { return cb(be)->desc; }

static int cu_buffer_alloc(rlai_backend *be, size_t size, void **out)
{
    cuda_backend *c = cb(be);
    *out = NULL;
    void *p;
    if (cudaMalloc(&p, size ? size : 1) != cudaSuccess) {
        cudaGetLastError();   /* an allocation failure is not sticky */
        return RLAI_ERR_NOMEM;
    }
    note(c, cudaMemsetAsync(p, 0, size ? size : 1, c->stream));
    *out = p;
    return 0;
}

static void cu_buffer_free(rlai_backend *be, void *buf)
{
    (void)be;
    if (buf)
        cudaFree(buf);   /* synchronises the device */
}

static int cu_upload(rlai_backend *be, void *buf, size_t off, const void *src, size_t n)
{
    cuda_backend *c = cb(be);
    note(c, cudaMemcpyAsync((char *)buf + off, src, n, cudaMemcpyHostToDevice, c->stream));
    return status(c);
}

static int cu_download(rlai_backend *be, const void *buf, size_t off, void *dst, size_t n)
{
    cuda_backend *c = cb(be);
    note(c, cudaMemcpyAsync(dst, (const char *)buf + off, n, cudaMemcpyDeviceToHost, c->stream));
    note(c, cudaStreamSynchronize(c->stream));
    return status(c);
}

static int cu_copy(rlai_backend *be, void *dst, size_t dst_off, const void *src, size_t src_off, size_t n)
{
    cuda_backend *c = cb(be);
    note(c, cudaMemcpyAsync((char *)dst + dst_off, (const char *)src + src_off, n, cudaMemcpyDeviceToDevice,
                            c->stream));
    return status(c);
}

static int cu_weight_upload(rlai_backend *be, const rlai_weight *host, rlai_weight *dev)
{
    cuda_backend *c = cb(be);
    size_t rb = row_bytes_of(host->type, host->cols);
    if (!rb || host->rows <= 0)
        return RLAI_ERR_UNSUPPORTED;
    size_t n = rb * (size_t)host->rows;
    void *p;
    if (cudaMalloc(&p, n) != cudaSuccess) {
        cudaGetLastError();
        return RLAI_ERR_NOMEM;
    }
    note(c, cudaMemcpyAsync(p, host->data, n, cudaMemcpyHostToDevice, c->stream));
    int rc = status(c);
    if (rc < 0) {
        cudaFree(p);
        return rc;
    }
    *dev = *host;
    dev->data = p;
    dev->packed = NULL;   /* a CPU kernels' layout of the host rows: not for this backend */
    return 0;
}

static void cu_weight_free(rlai_backend *be, rlai_weight *dev)
{
    (void)be;
    if (dev->data)
        cudaFree((void *)dev->data);
    dev->data = NULL;
}

static void cu_get_rows(rlai_backend *be, const rlai_weight *w, const int32_t *ids, int n, float *dst)
{
    cuda_backend *c = cb(be);
    if (n <= 0)
        return;
    const int32_t *d_ids = (const int32_t *)stage(c, &c->ids, ids, sizeof(int32_t) * (size_t)n);
    if (!d_ids)
        return;
    k_get_rows<<<n, 256, 0, c->stream>>>(w->type, (const uint8_t *)w->data, row_bytes_of(w->type, w->cols),
                                         w->cols, d_ids, dst);
    note_launch(c);
}

static void cu_rmsnorm(rlai_backend *be, float *dst, const float *x, const float *w, int n, int d, float eps)
{
    cuda_backend *c = cb(be);
    if (n <= 0)
        return;
    k_rmsnorm<<<n, 256, 0, c->stream>>>(dst, x, w, d, eps);
    note_launch(c);
}

static void cu_matmul(rlai_backend *be, const rlai_weight *w, const float *x, int64_t ldx, int T,
                      float *y, int64_t ldy)
{
    cuda_backend *c = cb(be);
    if (T <= 0 || w->rows <= 0)
        return;
    size_t rb = row_bytes_of(w->type, w->cols);
    /* decode-sized batches (one token, a verification, a few sequences):
     * a warp per row, most warps in flight; larger T: 4 rows per warp,
     * each weight element dequantized once per 8 tokens for 4 outputs.
     * Same arithmetic per output either way (k_matmul). */
    unsigned tchunks = (unsigned)((T + MM_T - 1) / MM_T);
    if (T <= 2 * MM_T) {
        dim3 grid(blocks_for((size_t)w->rows, MM_WARPS), tchunks);
        k_matmul<1><<<grid, MM_WARPS * 32, 0, c->stream>>>(w->type, (const uint8_t *)w->data, rb, w->rows,
                                                           w->cols, x, ldx, T, y, ldy);
    } else {
        dim3 grid(blocks_for((size_t)w->rows, MM_WARPS * 4), tchunks);
        k_matmul<4><<<grid, MM_WARPS * 32, 0, c->stream>>>(w->type, (const uint8_t *)w->data, rb, w->rows,
                                                           w->cols, x, ldx, T, y, ldy);
    }
    note_launch(c);
}

static void cu_add_row(rlai_backend *be, float *x, const float *b, int n, int d)
{
    cuda_backend *c = cb(be);
    size_t N = (size_t)n * d;
    if (!N)
        return;
    k_add_row<<<blocks_for(N, 256), 256, 0, c->stream>>>(x, b, n, d);
    note_launch(c);
}

static void cu_add(rlai_backend *be, float *x, const float *y, size_t n)
{
    cuda_backend *c = cb(be);
    if (!n)
        return;
    k_add<<<blocks_for(n, 256), 256, 0, c->stream>>>(x, y, n);
    note_launch(c);
}

static void cu_swiglu(rlai_backend *be, float *gate, const float *up, size_t n)
{
    cuda_backend *c = cb(be);
    if (!n)
        return;
    k_swiglu<<<blocks_for(n, 256), 256, 0, c->stream>>>(gate, up, n);
    note_launch(c);
}

static void cu_rope(rlai_backend *be, float *x, int n, int n_heads, int head_dim, int n_rot,
                    rlai_rope_mode mode, const float *inv_freq, const int32_t *pos)
{
    cuda_backend *c = cb(be);
    size_t N = (size_t)n * n_heads * (size_t)(n_rot / 2);
    if (!N)
        return;
    const float *d_inv = (const float *)stage(c, &c->inv_freq, inv_freq, sizeof(float) * (size_t)(n_rot / 2));
    const int32_t *d_pos = (const int32_t *)stage(c, &c->pos, pos, sizeof(int32_t) * (size_t)n);
    if (!d_inv || !d_pos)
        return;
    k_rope<<<blocks_for(N, 256), 256, 0, c->stream>>>(x, n, n_heads, head_dim, n_rot, mode == RLAI_ROPE_NEOX,
                                                      d_inv, d_pos);
    note_launch(c);
}

static void cu_kv_store(rlai_backend *be, const rlai_kv_layer_view *kv, const rlai_paged_rows *rows,
                        const float *k, const float *v)
{
    cuda_backend *c = cb(be);
    if (rows->n <= 0)
        return;
    const int32_t *d_pos, *d_toff, *d_tables;
    if (stage_rows(c, rows, &d_pos, &d_toff, &d_tables) < 0)
        return;
    k_kv_store<<<rows->n, 128, 0, c->stream>>>((uint8_t *)kv->k, (uint8_t *)kv->v, kv->row_bytes, kv->dtype,
                                               kv->kv_dim, d_pos, d_toff, d_tables, k, v);
    note_launch(c);
}

static void cu_attention(rlai_backend *be, const rlai_kv_layer_view *kv, const rlai_paged_rows *rows,
                         int n_head, int n_head_kv, int head_dim, const float *q, float *out)
{
    cuda_backend *c = cb(be);
    if (rows->n <= 0)
        return;
    if (head_dim > 256 || head_dim > ATT_T) {
        note(c, cudaErrorInvalidValue);   /* head_dim above 256: not supported by this kernel */
        return;
    }
    const int32_t *d_pos, *d_toff, *d_tables;
    if (stage_rows(c, rows, &d_pos, &d_toff, &d_tables) < 0)
        return;
    k_attention<<<rows->n * n_head, ATT_T, 0, c->stream>>>((const uint8_t *)kv->k, (const uint8_t *)kv->v,
                                                           kv->row_bytes, kv->dtype, d_pos, d_toff, d_tables,
                                                           n_head, n_head / n_head_kv, head_dim, q, out);
    note_launch(c);
}

static int cu_argmax(rlai_backend *be, const float *logits, int n, int n_vocab, int32_t *out)
{
    cuda_backend *c = cb(be);
    if (n <= 0)
        return 0;
    if (dbuf_reserve(c, &c->argmax, sizeof(int32_t) * (size_t)n) < 0)
        return RLAI_ERR_NOMEM;
    k_argmax<<<n, 256, 0, c->stream>>>(logits, n_vocab, (int32_t *)c->argmax.p);
    note_launch(c);
    note(c, cudaMemcpyAsync(out, c->argmax.p, sizeof(int32_t) * (size_t)n, cudaMemcpyDeviceToHost, c->stream));
    note(c, cudaStreamSynchronize(c->stream));
    return status(c);
}

static rlai_backend_i make_iface(void)
{
    rlai_backend_i I;
    memset(&I, 0, sizeof(I));
    I.version = RLAI_BACKEND_IFACE_VERSION;
    I.struct_size = sizeof(rlai_backend_i);
    I.name = "cuda";
    I.host_memory = false;
    I.free = cu_free;
    I.describe = cu_describe;
    I.buffer_alloc = cu_buffer_alloc;
    I.buffer_free = cu_buffer_free;
    I.upload = cu_upload;
    I.download = cu_download;
    I.copy = cu_copy;
    I.weight_upload = cu_weight_upload;
    I.weight_free = cu_weight_free;
    I.get_rows = cu_get_rows;
    I.rmsnorm = cu_rmsnorm;
    I.matmul = cu_matmul;
    I.add_row = cu_add_row;
    I.add = cu_add;
    I.swiglu = cu_swiglu;
    I.rope = cu_rope;
    I.kv_store = cu_kv_store;
    I.attention = cu_attention;
    I.argmax = cu_argmax;
    return I;
}

static const rlai_backend_i cuda_iface = make_iface();

extern "C" __attribute__((visibility("default"))) int
rlai_backend_module_open(uint32_t iface_version, int device_index, int max_ctx, rlai_backend **out,
                         char *err, size_t errlen)
{
    *out = NULL;
    if (iface_version != RLAI_BACKEND_IFACE_VERSION) {
        snprintf(err, errlen, "module built for backend interface %d, engine has %u", RLAI_BACKEND_IFACE_VERSION,
                 iface_version);
        return RLAI_ERR_UNSUPPORTED;
    }
    if (max_ctx <= 0) {
        snprintf(err, errlen, "max_ctx must be positive");
        return RLAI_ERR_INVALID_ARG;
    }
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        snprintf(err, errlen, "no usable CUDA driver or device (%s: %s)", cudaGetErrorName(e), cudaGetErrorString(e));
        return RLAI_ERR_UNSUPPORTED;
    }
    if (device_index < 0 || device_index >= count) {
        snprintf(err, errlen, "device cuda:%d does not exist (%d CUDA device%s)", device_index, count,
                 count == 1 ? "" : "s");
        return RLAI_ERR_UNSUPPORTED;
    }
    cudaDeviceProp prop;
    if ((e = cudaSetDevice(device_index)) != cudaSuccess ||
        (e = cudaGetDeviceProperties(&prop, device_index)) != cudaSuccess) {
        snprintf(err, errlen, "cuda:%d: %s", device_index, cudaGetErrorString(e));
        return RLAI_ERR_UNSUPPORTED;
    }
    cuda_backend *c = (cuda_backend *)calloc(1, sizeof(*c));
    if (!c) {
        snprintf(err, errlen, "out of memory");
        return RLAI_ERR_NOMEM;
    }
    c->base.iface = &cuda_iface;
    c->device = device_index;
    c->max_ctx = max_ctx;
    if ((e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) != cudaSuccess) {
        snprintf(err, errlen, "cuda:%d: cannot create a stream: %s", device_index, cudaGetErrorString(e));
        free(c);
        return RLAI_ERR_UNSUPPORTED;
    }
    snprintf(c->desc, sizeof(c->desc), "cuda:%d %.100s, sm_%d%d, %zu MiB", device_index, prop.name, prop.major,
             prop.minor, (size_t)(prop.totalGlobalMem >> 20));
    *out = &c->base;
    return 0;
}
