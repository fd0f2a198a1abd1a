/* kernels_avx512.c - AVX-512 (F/BW/VL/DQ + VNNI) level of rlai_matmul and
 * of the attention helpers. Compiled with those flags only for this file;
 * kernels.c selects this level only when cpuid reports all of them, VNNI
 * included, and XCR0 shows the OS saves the ZMM and opmask state.
 *
 * Quantized path, Q4_0 / Q4_1 / Q8_0 weights, every T (decode, batched
 * decode and prefill), 16 rows at a time, row i of the group in dword
 * lane i of every zmm. Weights packed at load (rlai_kernels_pack, the
 * CPU backend's weight_upload; layout in kernels_impl.h) already hold
 * pass 1's output, the raw planes and f16 headers of each group, in one
 * sequential stream (prefetched a group ahead): pass 1 is skipped
 * and pass 2 reads them in place (block_fields_pk). At one token pass 1
 * was most of the work (2026-12-07, twelfth entry of bench/RESULTS.md).
 * On the GGUF rows:
 *  - stage (pass 1): the 16 rows are streamed in 16-byte chunks; each
 *    chunk of the 16 rows goes through a 4x4 dword transpose inside each
 *    128-bit lane, giving 4 "raw planes" (dword q of all 16 rows) in
 *    per-thread scratch. The f16 block headers come out of the same
 *    transposes (no gather: vpgatherdd cost more than the rest of the
 *    packing). The last, partial chunk of a row is read with masked loads,
 *    so nothing past the row is touched. The next 16 rows are prefetched
 *    in step, as in the AVX2 matvec.
 *  - fields (pass 2): per block, 8 weight planes (plane k: elements
 *    4k..4k+3 of each row as unsigned bytes: Q4 nibbles, Q8_0 q ^ 0x80 =
 *    q + 128) and the rows' d and m as f32 (Q4_0: m = -8d) are picked out
 *    of the raw planes (Q4_0 / Q8_0 blocks are only 2-byte aligned: even
 *    blocks take a 16-bit shift across two raw planes).
 *  - dot products: the exact int32 block sums of the 16 rows for one token
 *    are 8 vpdpbusd (u8 weight plane x the token's activation dword,
 *    broadcast from memory), with no horizontal reduction; for Q8_0 the
 *    +128 bias is removed exactly by starting the sum at -128 * sum(q_x)
 *    (rlai_act.qsum, built by kernels.c for this level). Up to 2 * MM_NT
 *    tokens (decode, batched decode, verification) use the fields
 *    straight from registers, redone for each MM_NT tokens (fused_tokens);
 *    more tokens (prefill) store the planes once per 16-row group and
 *    rerun them from L1/L2 for every MM_NT tokens (pack_group +
 *    compute_group).
 *  - floats: each lane then takes the canonical per-output sequence of
 *    kernels_avx2.c,
 *        acc = fma((float)isum, d_w * d_x, acc); acc = fma(m_w, s_x, acc)
 *    so every output is bit-identical to the scalar reference and to the
 *    AVX2 kernels, whatever T, the token's position, the split or the
 *    thread count (batch invariance, tests/test_kernels.c).
 * Q5_0 / Q5_1, the f32 (precise) path and F32/F16/BF16 weights use the
 * AVX2 kernels (valid on every CPU this level is selected for). The
 * attention dot/mad helpers are 16-wide versions with the AVX2 helpers'
 * exact float sequences; the activation quantizer and SwiGLU give the
 * scalar reference's bits; the other vector helpers are the AVX2 ones. */
#include "kernels_impl.h"
#include "dtype.h"
#include "kernels_x86.h"

#include <immintrin.h>
#include <string.h>

#define AI __attribute__((always_inline)) static inline

#define MM_ROWS 16   /* rows per packed group: one per zmm lane */
#define MM_NT   8    /* tokens per compute pass over a packed group */
#define PLANE   64   /* bytes per plane (16 rows x 4 bytes) */
/* The few-token path prefetches packed groups PK_AHEAD groups ahead, into
 * L2 (each byte is read once; bench_kernels on a Zen 4 VM: ahead 1 beat 0,
 * 2, 3 and 4, and L2 beat L1, L3 and non-temporal at one token) */
#ifndef PK_HINT
#define PK_HINT _MM_HINT_T1
#endif
#ifndef PK_AHEAD
#define PK_AHEAD 1
#endif

AI __m128i ld128(const uint8_t *p)
{
    return _mm_loadu_si128((const __m128i *)(const void *)p);
}

/* Packed 16-row group in scratch: nb x 8 planes, d and m per block, and
 * the staging area of pack_group's first pass. */
typedef struct {
    uint8_t *w;    /* [nb][8][64] */
    float *d;      /* [nb][16] */
    float *m;      /* [nb][16] */
    uint8_t *raw;  /* [ceil(row_bytes / 16) * 4][64]: dword q of the 16 rows */
} packed;

static size_t packed_bytes(int64_t nb, size_t row_bytes)
{
    return (size_t)nb * (8 * PLANE + 2 * MM_ROWS * sizeof(float)) + (row_bytes + 15) / 16 * 4 * PLANE;
}

static packed packed_of(void *scratch, int64_t nb)
{
    packed p;
    p.w = scratch;
    p.d = (float *)(void *)(p.w + (size_t)nb * 8 * PLANE);
    p.m = p.d + (size_t)nb * MM_ROWS;
    p.raw = (uint8_t *)(void *)(p.m + (size_t)nb * MM_ROWS);
    return p;
}

/* One 128-bit lane per row: lane L of v[g] = the 16 bytes at w[g + 4L] + o
 * (only the bytes in `mask`; the others read as zero and are not touched
 * in memory). After the in-lane 4x4 dword transpose, dword lane 4L + p of
 * a[k] holds dword k of row 4L + p: row i sits in dword lane i. */
AI void load_transpose(const uint8_t *const w[MM_ROWS], size_t o, __mmask16 mask, bool full, __m512i a[4])
{
    __m512i v[4];
#pragma GCC unroll 4
    for (int g = 0; g < 4; g++) {
        __m128i l[4];
#pragma GCC unroll 4
        for (int L = 0; L < 4; L++)
            l[L] = full ? ld128(w[g + 4 * L] + o) : _mm_maskz_loadu_epi8(mask, w[g + 4 * L] + o);
        __m512i t = _mm512_castsi128_si512(l[0]);
        t = _mm512_inserti32x4(t, l[1], 1);
        t = _mm512_inserti32x4(t, l[2], 2);
        v[g] = _mm512_inserti32x4(t, l[3], 3);
    }
    __m512i t0 = _mm512_unpacklo_epi32(v[0], v[1]), t1 = _mm512_unpackhi_epi32(v[0], v[1]);
    __m512i t2 = _mm512_unpacklo_epi32(v[2], v[3]), t3 = _mm512_unpackhi_epi32(v[2], v[3]);
    a[0] = _mm512_unpacklo_epi64(t0, t2);
    a[1] = _mm512_unpackhi_epi64(t0, t2);
    a[2] = _mm512_unpacklo_epi64(t1, t3);
    a[3] = _mm512_unpackhi_epi64(t1, t3);
}

#define MV_PREFETCH(pf, pfo, upto)                                       \
    do {                                                                 \
        for (; (pfo) < (upto); (pfo) += 64)                              \
            _mm_prefetch((const char *)((pf) + (pfo)), _MM_HINT_T0);     \
    } while (0)

AI __m512i raw_at(const packed *p, size_t q)
{
    return _mm512_load_si512(p->raw + q * PLANE);
}

/* Dword q of the 16 rows' data at byte offset 4q + 2 (a 2-byte shift:
 * Q4_0 / Q8_0 blocks are 2-byte aligned only). */
AI __m512i raw_at2(const packed *p, size_t q)
{
    return _mm512_or_si512(_mm512_srli_epi32(raw_at(p, q), 16), _mm512_slli_epi32(raw_at(p, q + 1), 16));
}

/* Row pointers of the 16-row group at r (rows past nr repeat the last
 * one: computed, never stored). Pass 1 of the packing: streams the rows
 * in 16-byte chunks and transposes each chunk of the 16 rows into 4 dword
 * planes in p->raw (the f16 block headers come out of the same
 * transposes), prefetching the following 16 rows in step. */
AI void stage_group(const rlai_mm_job *j, int64_t r, int nr, const packed *p)
{
    const size_t rb = j->row_bytes;
    const uint8_t *w0 = j->w + (size_t)r * rb;
    const uint8_t *w[MM_ROWS];
    for (int i = 0; i < MM_ROWS; i++)
        w[i] = w0 + (size_t)(i < nr ? i : nr - 1) * rb;
    const uint8_t *pf = w0 + (size_t)MM_ROWS * rb;
    size_t pfo = 0;
    const size_t full = rb / 16, tail = rb % 16;
    for (size_t c = 0; c < full; c++) {
        MV_PREFETCH(pf, pfo, MM_ROWS * 16 * (c + 1));
        __m512i a[4];
        load_transpose(w, 16 * c, 0xFFFF, true, a);
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++)
            _mm512_store_si512(p->raw + (4 * c + (size_t)k) * PLANE, a[k]);
    }
    if (tail) {   /* the row's last bytes: masked loads never read past it */
        MV_PREFETCH(pf, pfo, MM_ROWS * rb);
        __m512i a[4];
        load_transpose(w, 16 * full, (__mmask16)((1u << tail) - 1u), false, a);
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++)
            _mm512_store_si512(p->raw + (4 * full + (size_t)k) * PLANE, a[k]);
    }
}

AI size_t blk_bytes(uint32_t type)
{
    return type == RLAI_DT_Q4_0 ? sizeof(rlai_block_q4_0)
         : type == RLAI_DT_Q4_1 ? sizeof(rlai_block_q4_1) : sizeof(rlai_block_q8_0);
}

/* Pass 2 for block b: its 8 weight planes W (plane k: elements 4k..4k+3
 * of each row, unsigned) and the 16 rows' d and m (Q8_0: m unused). */
AI void block_fields(const packed *p, uint32_t type, int64_t b, __m512i W[8], __m512 *d, __m512 *m)
{
    const size_t o = (size_t)b * blk_bytes(type);
    const size_t q0 = o / 4;
    const bool odd = o % 4 != 0;   /* Q4_0 / Q8_0 odd blocks: header in the high half */
    /* f16 d in the low half of h, f16 m (Q4_1) in the high half */
    __m512i h = raw_at(p, q0);
    if (odd)
        h = _mm512_srli_epi32(h, 16);
    *d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h));
    if (type == RLAI_DT_Q8_0) {
        const __m512i x80 = _mm512_set1_epi8((char)0x80);
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            __m512i v = odd ? raw_at(p, q0 + 1 + (size_t)k) : raw_at2(p, q0 + (size_t)k);
            W[k] = _mm512_xor_si512(v, x80);
        }
        *m = _mm512_setzero_ps();
        return;
    }
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    *m = type == RLAI_DT_Q4_1 ? _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(h, 16)))
                              : _mm512_mul_ps(*d, _mm512_set1_ps(-8.0f));
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        /* qs byte 4k+e: low nibble = element 4k+e, high = 16+4k+e */
        __m512i v = type == RLAI_DT_Q4_1 || odd ? raw_at(p, q0 + 1 + (size_t)k) : raw_at2(p, q0 + (size_t)k);
        W[k] = _mm512_and_si512(v, m4);
        W[4 + k] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
    }
}

/* Block b's fields read from group G of the load-time packed weights
 * (rlai_kernels_pack, layout in kernels_impl.h): the same values
 * block_fields picks out of the raw planes staged from the GGUF rows. */
AI void block_fields_pk(const uint8_t *G, int64_t nb, uint32_t type, int64_t b, __m512i W[8], __m512 *d,
                        __m512 *m)
{
    const size_t pb = rlai__pk_plane_bytes(type);
    const uint8_t *pl = G + (size_t)b * pb;
    const uint8_t *hd = G + (size_t)nb * pb + (size_t)b * rlai__pk_hdr_bytes(type);
    *d = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(const void *)hd));
    if (type == RLAI_DT_Q8_0) {
        const __m512i x80 = _mm512_set1_epi8((char)0x80);
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++)
            W[k] = _mm512_xor_si512(_mm512_load_si512(pl + k * PLANE), x80);
        *m = _mm512_setzero_ps();
        return;
    }
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    *m = type == RLAI_DT_Q4_1 ? _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(const void *)(hd + 32)))
                              : _mm512_mul_ps(*d, _mm512_set1_ps(-8.0f));
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        __m512i v = _mm512_load_si512(pl + k * PLANE);
        W[k] = _mm512_and_si512(v, m4);
        W[4 + k] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
    }
}

/* Block b's fields: from the packed group G when there is one, else from
 * the raw planes stage_group left in p. */
AI void fields(const packed *p, const uint8_t *G, int64_t nb, uint32_t type, int64_t b, __m512i W[8], __m512 *d,
               __m512 *m)
{
    if (G)
        block_fields_pk(G, nb, type, b, W, d, m);
    else
        block_fields(p, type, b, W, d, m);
}

/* Packs rows [r, r + nr) for the multi-token kernel (G: their packed group,
 * or NULL to stage them from the GGUF rows). */
AI void pack_group(const rlai_mm_job *j, uint32_t type, int64_t r, int nr, const packed *p, const uint8_t *G)
{
    if (!G)
        stage_group(j, r, nr, p);
    for (int64_t b = 0; b < j->nb; b++) {
        __m512i W[8];
        __m512 d, m;
        fields(p, G, j->nb, type, b, W, &d, &m);
        uint8_t *pw = p->w + (size_t)b * 8 * PLANE;
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++)
            _mm512_store_si512(pw + k * PLANE, W[k]);
        _mm512_store_ps(p->d + 16 * b, d);
        _mm512_store_ps(p->m + 16 * b, m);
    }
}

/* acc + vpdpbusd(w, the dword at p broadcast to 16 lanes); the embedded
 * broadcast form, which GCC does not generate from the intrinsics. */
AI __m512i dpbusd_b(__m512i acc, __m512i w, const uint8_t *p)
{
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const uint32_t *)(const void *)p));
    return acc;
}

/* NT tokens [t, t + NT) over a packed group at rows [r, r + nr). */
AI void compute_group(const rlai_mm_job *j, bool q8, const packed *p, int64_t r, int nr,
                      int t, const int NT)
{
    const rlai_act *a = j->act;
    const int64_t nb = j->nb, cols = j->cols;
    const int8_t *xq = a->q + (size_t)t * (size_t)cols;
    const float *ds = a->ds + (size_t)t * (size_t)nb * 2;
    const int32_t *qs = q8 ? a->qsum + (size_t)t * (size_t)nb : NULL;
    __m512 acc[MM_NT];
#pragma GCC unroll 8
    for (int i = 0; i < NT; i++)
        acc[i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *pw = p->w + (size_t)b * 8 * PLANE;
        const uint8_t *xb = (const uint8_t *)(xq + 32 * b);
        __m512i s[MM_NT];
        /* exact: |sum| <= 32 * 255 * 127 */
#pragma GCC unroll 8
        for (int i = 0; i < NT; i++)
            s[i] = q8 ? _mm512_set1_epi32(-128 * qs[(size_t)i * (size_t)nb + (size_t)b]) : _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            __m512i W = _mm512_load_si512(pw + k * PLANE);
#pragma GCC unroll 8
            for (int i = 0; i < NT; i++)
                s[i] = dpbusd_b(s[i], W, xb + (size_t)i * (size_t)cols + 4 * k);
        }
        __m512 d = _mm512_load_ps(p->d + 16 * b);
        __m512 m = q8 ? _mm512_setzero_ps() : _mm512_load_ps(p->m + 16 * b);
#pragma GCC unroll 8
        for (int i = 0; i < NT; i++) {
            const float *dsb = ds + (size_t)i * (size_t)nb * 2 + 2 * b;
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[i]), _mm512_mul_ps(d, _mm512_set1_ps(dsb[0])), acc[i]);
            if (!q8)
                acc[i] = _mm512_fmadd_ps(m, _mm512_set1_ps(dsb[1]), acc[i]);
        }
    }
    const __mmask16 mask = (__mmask16)(nr >= MM_ROWS ? 0xFFFFu : (1u << nr) - 1u);
#pragma GCC unroll 8
    for (int i = 0; i < NT; i++)
        _mm512_mask_storeu_ps(j->y + (size_t)(t + i) * (size_t)j->ldy + (size_t)r, mask, acc[i]);
}

/* Up to 2 * MM_NT tokens (decode, batched decode, speculative
 * verification): pass 1 stages the group once, then for every MM_NT
 * tokens pass 2 feeds the dot products directly from the raw planes
 * instead of storing the fields; the same operations as compute_group
 * (bit-identical to it). Redoing the fields for a second chunk of tokens
 * costs less than storing and reloading them (bench_kernels, 9-16
 * tokens), which is what a draft of 8 plus the pending token needs. */
AI void fused_tokens(const rlai_mm_job *j, uint32_t type, const packed *p, const uint8_t *G, int64_t r, int nr,
                     int t, const int NT)
{
    const bool q8 = type == RLAI_DT_Q8_0;
    const rlai_act *a = j->act;
    const int64_t nb = j->nb, cols = j->cols;
    const uint8_t *xq = (const uint8_t *)(a->q + (size_t)t * (size_t)cols);
    const float *ds = a->ds + (size_t)t * (size_t)nb * 2;
    const int32_t *qs = q8 ? a->qsum + (size_t)t * (size_t)nb : NULL;
    __m512 acc[MM_NT];
#pragma GCC unroll 8
    for (int i = 0; i < NT; i++)
        acc[i] = _mm512_setzero_ps();
    /* packed: the group PK_AHEAD groups on is prefetched in step */
    const size_t gb = rlai__pk_group_bytes(type, nb);
    const uint8_t *pf = G && PK_AHEAD > 0 ? G + PK_AHEAD * gb : NULL;
    size_t pfo = 0;
    for (int64_t b = 0; b < nb; b++) {
        __m512i W[8];
        __m512 d, m;
        if (pf)
            for (; pfo < gb * (size_t)(b + 1) / (size_t)nb; pfo += 64)
                _mm_prefetch((const char *)(pf + pfo), PK_HINT);
        fields(p, G, nb, type, b, W, &d, &m);
        const uint8_t *xb = xq + 32 * b;
        __m512i s[MM_NT];
#pragma GCC unroll 8
        for (int i = 0; i < NT; i++)
            s[i] = q8 ? _mm512_set1_epi32(-128 * qs[(size_t)i * (size_t)nb + (size_t)b]) : _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
#pragma GCC unroll 8
            for (int i = 0; i < NT; i++)
                s[i] = dpbusd_b(s[i], W[k], xb + (size_t)i * (size_t)cols + 4 * k);
        }
#pragma GCC unroll 8
        for (int i = 0; i < NT; i++) {
            const float *dsb = ds + (size_t)i * (size_t)nb * 2 + 2 * b;
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[i]), _mm512_mul_ps(d, _mm512_set1_ps(dsb[0])), acc[i]);
            if (!q8)
                acc[i] = _mm512_fmadd_ps(m, _mm512_set1_ps(dsb[1]), acc[i]);
        }
    }
    const __mmask16 mask = (__mmask16)(nr >= MM_ROWS ? 0xFFFFu : (1u << nr) - 1u);
#pragma GCC unroll 8
    for (int i = 0; i < NT; i++)
        _mm512_mask_storeu_ps(j->y + (size_t)(t + i) * (size_t)j->ldy + (size_t)r, mask, acc[i]);
}

#define FUSED_CASE(n)                                     \
    case n:                                               \
        fused_tokens(j, type, &p, G, r, nr, t, n);        \
        break
#define COMPUTE_CASE(n)                                   \
    case n:                                               \
        compute_group(j, q8, &p, r, nr, t, n);            \
        break

AI void mm_q(const rlai_mm_job *j, uint32_t type, int64_t r0, int64_t r1, int t0, int t1, void *scratch)
{
    const bool q8 = type == RLAI_DT_Q8_0;
    packed p = packed_of(scratch, j->nb);
    const size_t gb = rlai__pk_group_bytes(type, j->nb);
    for (int64_t r = r0; r < r1; r += MM_ROWS) {
        int nr = (int)(r1 - r < MM_ROWS ? r1 - r : MM_ROWS);
        /* r0 is a multiple of RLAI_ROW_TILE = MM_ROWS: a whole group */
        const uint8_t *G = j->wp ? j->wp + (size_t)(r / MM_ROWS) * gb : NULL;
        if (t1 - t0 <= 2 * MM_NT) {
            if (!G)
                stage_group(j, r, nr, &p);
            for (int t = t0; t < t1; t += MM_NT) {
                switch (t1 - t < MM_NT ? t1 - t : MM_NT) {
                FUSED_CASE(1);
                FUSED_CASE(2);
                FUSED_CASE(3);
                FUSED_CASE(4);
                FUSED_CASE(5);
                FUSED_CASE(6);
                FUSED_CASE(7);
                FUSED_CASE(8);
                default: break;
                }
            }
            continue;
        }
        pack_group(j, type, r, nr, &p, G);
        for (int t = t0; t < t1; t += MM_NT) {
            int nt = t1 - t < MM_NT ? t1 - t : MM_NT;
            switch (nt) {
            COMPUTE_CASE(1);
            COMPUTE_CASE(2);
            COMPUTE_CASE(3);
            COMPUTE_CASE(4);
            COMPUTE_CASE(5);
            COMPUTE_CASE(6);
            COMPUTE_CASE(7);
            COMPUTE_CASE(8);
            default: break;
            }
        }
    }
}
#undef COMPUTE_CASE
#undef FUSED_CASE

_Static_assert(MM_NT == 8, "COMPUTE_CASE list covers 1..8 tokens");
_Static_assert(MM_ROWS == RLAI_PK_ROWS && MM_ROWS == RLAI_ROW_TILE, "a work unit is one packed group");

void rlai__mm_avx512(const rlai_mm_job *j, int64_t r0, int64_t r1, int t0, int t1, void *scratch)
{
    /* the scratch holds a packed group for any quant row (about 37 bytes
     * per column against 64); checked anyway */
    const bool packable = j->act && packed_bytes(j->nb, j->row_bytes) <= rlai__scratch_bytes(j->cols);
    if (packable) {
        switch (j->type) {
        case RLAI_DT_Q4_0: mm_q(j, RLAI_DT_Q4_0, r0, r1, t0, t1, scratch); return;
        case RLAI_DT_Q4_1: mm_q(j, RLAI_DT_Q4_1, r0, r1, t0, t1, scratch); return;
        case RLAI_DT_Q8_0:
            if (j->act->qsum) {
                mm_q(j, RLAI_DT_Q8_0, r0, r1, t0, t1, scratch);
                return;
            }
            break;
        default: break;
        }
    }
    rlai__mm_avx2(j, r0, r1, t0, t1, scratch);
}

/* ------------------------------------------------------------------ */
/* activation quantization (bit-identical to rlai__quant_act_scalar)   */

/* Rounds half away from zero (roundf) lane by lane: trunc, then one more
 * step away from zero where the dropped fraction is >= 0.5 (exact). */
AI __m512 round_half_away16(__m512 v)
{
    const __m512 sign = _mm512_set1_ps(-0.0f);
    __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_andnot_ps(sign, _mm512_sub_ps(v, t));
    __mmask16 up = _mm512_cmp_ps_mask(f, _mm512_set1_ps(0.5f), _CMP_GE_OQ);
    __m512 one = _mm512_or_ps(_mm512_and_ps(v, sign), _mm512_set1_ps(1.0f));
    return _mm512_mask_add_ps(t, up, t, one);
}

/* Block b's 32 values as quantized int8 with reciprocal scale id; returns
 * their exact sum. */
AI int quant_block16(const float *x, float id, int8_t *q)
{
    const __m512 lim = _mm512_set1_ps(127.0f), nlim = _mm512_set1_ps(-127.0f);
    __m512 vid = _mm512_set1_ps(id);
    __m512i qi[2];
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        __m512 s = _mm512_mul_ps(_mm512_loadu_ps(x + 16 * h), vid);
        __mmask16 ord = _mm512_cmp_ps_mask(s, s, _CMP_ORD_Q);
        __m512 r = round_half_away16(s);
        r = _mm512_min_ps(_mm512_max_ps(r, nlim), lim);
        qi[h] = _mm512_maskz_cvtps_epi32(ord, r);                      /* NaN -> 0 */
    }
    _mm_storeu_si128((__m128i *)(void *)q, _mm512_cvtepi32_epi8(qi[0]));
    _mm_storeu_si128((__m128i *)(void *)(q + 16), _mm512_cvtepi32_epi8(qi[1]));
    return _mm512_reduce_add_epi32(_mm512_add_epi32(qi[0], qi[1]));
}

/* max |x| of a block; a NaN lane keeps the running maximum, like the
 * scalar `a > amax` (vmaxps returns its second operand on a NaN). */
AI float block_amax16(const float *x)
{
    const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
    __m512 mx = _mm512_max_ps(_mm512_and_ps(_mm512_loadu_ps(x), absmask), _mm512_setzero_ps());
    mx = _mm512_max_ps(_mm512_and_ps(_mm512_loadu_ps(x + 16), absmask), mx);
    return _mm512_reduce_max_ps(mx);   /* no NaN left: any order gives the maximum */
}

/* The scalar steps per block: amax, d = amax / 127, id = 1 / d (0 when d
 * is 0), q = round-half-away(x * id) clamped to +-127 (NaN -> 0), the
 * exact int sum, ds = (d, d * sum). Sixteen blocks at a time, the two
 * divisions of all sixteen in one vdivps each (the same IEEE operations
 * lane by lane): done one block at a time, their latency bounded the
 * loop. */
void rlai__quant_act_avx512(const float *x, int64_t n, int8_t *q, float *ds)
{
    const int64_t nb = n / RLAI_QK;
    int64_t b = 0;
    for (; b + 16 <= nb; b += 16) {
        const float *xb = x + b * RLAI_QK;
        float am[16] __attribute__((aligned(64))), dv[16] __attribute__((aligned(64)));
        float iv[16] __attribute__((aligned(64)));
        for (int j = 0; j < 16; j++)
            am[j] = block_amax16(xb + j * RLAI_QK);
        __m512 d = _mm512_div_ps(_mm512_load_ps(am), _mm512_set1_ps(127.0f));
        __mmask16 nz = _mm512_cmp_ps_mask(d, _mm512_setzero_ps(), _CMP_NEQ_UQ);
        __m512 id = _mm512_maskz_div_ps(nz, _mm512_set1_ps(1.0f), d);
        _mm512_store_ps(dv, d);
        _mm512_store_ps(iv, id);
        for (int j = 0; j < 16; j++) {
            int sum = quant_block16(xb + j * RLAI_QK, iv[j], q + (b + j) * RLAI_QK);
            ds[2 * (b + j)] = dv[j];
            ds[2 * (b + j) + 1] = dv[j] * (float)sum;
        }
    }
    for (; b < nb; b++) {
        float d = block_amax16(x + b * RLAI_QK) / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        int sum = quant_block16(x + b * RLAI_QK, id, q + b * RLAI_QK);
        ds[2 * b] = d;
        ds[2 * b + 1] = d * (float)sum;
    }
}

/* ------------------------------------------------------------------ */
/* attention helpers: the AVX2 helpers' exact float sequences, 16 wide */

/* rlai__attn_dot_f16_avx2 keeps two 8-lane sums, s0 over elements
 * 16i..16i+7 and s1 over 16i+8..16i+15 (a last group of 8 goes to s0);
 * one zmm holds [s0 | s1] and takes the same fmas, so the results are
 * bit-identical to the AVX2 (and scalar) helper. */
void rlai__attn_dot_f16_avx512(int n, int d, const uint16_t *k, size_t stride, const float *q, float scale,
                               float *out)
{
    if (d % 8 != 0 || d > 256) {
        rlai__attn_dot_f16_avx2(n, d, k, stride, q, scale, out);
        return;
    }
    for (int j = 0; j < n; j++) {
        const uint16_t *r = k + (size_t)j * stride;
        __m512 s = _mm512_setzero_ps();
        int i = 0;
        for (; i + 16 <= d; i += 16)
            s = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(r + i))),
                                _mm512_loadu_ps(q + i), s);
        __m256 s0 = _mm512_castps512_ps256(s), s1 = _mm512_extractf32x8_ps(s, 1);
        if (i < d)
            s0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(r + i))),
                                 _mm256_loadu_ps(q + i), s0);
        out[j] = scale * hsum8(_mm256_add_ps(s0, s1));
    }
}

/* y[e] = fma(p_j, row_j[e], y[e]) for j in order: element-wise, so any
 * width gives the AVX2 helper's results. */
/* y += sum_j p[j] * v row j for d = 16 nv (+ 8 when half), y kept in
 * registers. Inlined with constant nv / half where the caller knows them,
 * so the inner loop has no trip-count tests; the arithmetic is the same on
 * every path. */
AI void mad_f16_rows16(const int nv, const bool half, int n, const uint16_t *v, size_t stride, const float *p,
                       float *y)
{
    __m512 acc[16];
    __m256 acc8 = half ? _mm256_loadu_ps(y + 16 * nv) : _mm256_setzero_ps();
    for (int c = 0; c < nv; c++)
        acc[c] = _mm512_loadu_ps(y + 16 * c);
    for (int j = 0; j < n; j++) {
        const uint16_t *r = v + (size_t)j * stride;
        __m512 pj = _mm512_set1_ps(p[j]);
        for (int c = 0; c < nv; c++)
            acc[c] = _mm512_fmadd_ps(pj, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(r + 16 * c))),
                                     acc[c]);
        if (half)
            acc8 = _mm256_fmadd_ps(_mm512_castps512_ps256(pj),
                                   _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(r + 16 * nv))), acc8);
    }
    for (int c = 0; c < nv; c++)
        _mm512_storeu_ps(y + 16 * c, acc[c]);
    if (half)
        _mm256_storeu_ps(y + 16 * nv, acc8);
}

void rlai__attn_mad_f16_avx512(int n, int d, const uint16_t *v, size_t stride, const float *p, float *y)
{
    if (d % 8 != 0 || d > 256) {
        rlai__attn_mad_f16_avx2(n, d, v, stride, p, y);
        return;
    }
    if (d == 64)
        mad_f16_rows16(4, false, n, v, stride, p, y);   /* the usual head size */
    else
        mad_f16_rows16(d / 16, d % 16 != 0, n, v, stride, p, y);
}

/* ---- several queries over one f16 KV block (verification rows,
 * grouped-query heads): kernels_avx2.c's multi helpers with one 16-lane
 * FMA where they issue two 8-lane ones. The dot's zmm holds [s0 | s1] of
 * the AVX2 helper (elements 16i..16i+7 | 16i+8..16i+15; a last group of 8
 * goes to s0) and the mad is element-wise, so every query's results are
 * bit-identical to rlai__attn_dot_f16_avx2's / _mad_'s on it alone. */

#define MULTI_ROWS 16

/* m rows of d f16 (d % 8 == 0) to f32, d floats apart, 64-byte aligned
 * when d % 16 == 0. */
static void block_to_f32_16(int m, int d, const uint16_t *src, size_t stride, float *dst)
{
    for (int j = 0; j < m; j++) {
        const uint16_t *r = src + (size_t)j * stride;
        float *o = dst + (size_t)j * d;
        int i = 0;
        for (; i + 16 <= d; i += 16)
            _mm512_storeu_ps(o + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(r + i))));
        if (i < d)
            _mm256_storeu_ps(o + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(r + i))));
    }
}

/* [s0 | s1] of a zmm, plus the last 8 elements' fma into s0, summed as
 * the AVX2 helper sums them: s0 + s1. */
AI __m256 halves_sum(__m512 s, const float *r, const float *q, int i, int d)
{
    __m256 s0 = _mm512_castps512_ps256(s), s1 = _mm512_extractf32x8_ps(s, 1);
    if (i < d)
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(r + i), _mm256_loadu_ps(q + i), s0);
    return _mm256_add_ps(s0, s1);
}

/* out[j] = scale * dot(q, kf row j) for j < m, kf: m rows of d f32. */
static void dot_rows_f32_16(int m, int d, const float *kf, const float *q, float scale, float *out)
{
    const __m128 sc = _mm_set1_ps(scale);
    int j = 0;
    for (; j + 4 <= m; j += 4) {
        const float *r0 = kf + (size_t)j * d, *r1 = r0 + d, *r2 = r1 + d, *r3 = r2 + d;
        __m512 a = _mm512_setzero_ps(), b = a, c = a, e = a;
        int i = 0;
        for (; i + 16 <= d; i += 16) {
            __m512 qv = _mm512_loadu_ps(q + i);
            a = _mm512_fmadd_ps(_mm512_loadu_ps(r0 + i), qv, a);
            b = _mm512_fmadd_ps(_mm512_loadu_ps(r1 + i), qv, b);
            c = _mm512_fmadd_ps(_mm512_loadu_ps(r2 + i), qv, c);
            e = _mm512_fmadd_ps(_mm512_loadu_ps(r3 + i), qv, e);
        }
        __m128 s = hsum8x4(halves_sum(a, r0, q, i, d), halves_sum(b, r1, q, i, d), halves_sum(c, r2, q, i, d),
                           halves_sum(e, r3, q, i, d));
        _mm_storeu_ps(out + j, _mm_mul_ps(sc, s));
    }
    for (; j < m; j++) {
        const float *r = kf + (size_t)j * d;
        __m512 a = _mm512_setzero_ps();
        int i = 0;
        for (; i + 16 <= d; i += 16)
            a = _mm512_fmadd_ps(_mm512_loadu_ps(r + i), _mm512_loadu_ps(q + i), a);
        out[j] = scale * hsum8(halves_sum(a, r, q, i, d));
    }
}

void rlai__attn_dot_f16_multi_avx512(int m, int d, const uint16_t *k, size_t stride, int nq,
                                     const float *const *q, float scale, float *const *out)
{
    if (d % 8 != 0 || d > 256 || nq < 2) {
        for (int qi = 0; qi < nq; qi++)
            rlai__attn_dot_f16_avx512(m, d, k, stride, q[qi], scale, out[qi]);
        return;
    }
    _Alignas(64) float kf[MULTI_ROWS * 256];
    for (int j0 = 0; j0 < m; j0 += MULTI_ROWS) {
        int mb = m - j0 < MULTI_ROWS ? m - j0 : MULTI_ROWS;
        block_to_f32_16(mb, d, k + (size_t)j0 * stride, stride, kf);
        for (int qi = 0; qi < nq; qi++)
            dot_rows_f32_16(mb, d, kf, q[qi], scale, out[qi] + j0);
    }
}

/* y += sum_j p[j] * row j over rows already in f32 (d = 16 nv, + 8 when
 * half): element-wise FMAs in j order, as every mad helper. */
AI void mad_f32_rows16(const int nv, const bool half, int n, const float *vf, int d, const float *p, float *y)
{
    __m512 acc[8];
    __m256 acc8 = half ? _mm256_loadu_ps(y + 16 * nv) : _mm256_setzero_ps();
    for (int c = 0; c < nv; c++)
        acc[c] = _mm512_loadu_ps(y + 16 * c);
    for (int j = 0; j < n; j++) {
        __m512 pj = _mm512_set1_ps(p[j]);
        const float *r = vf + (size_t)j * d;
        for (int c = 0; c < nv; c++)
            acc[c] = _mm512_fmadd_ps(pj, _mm512_loadu_ps(r + 16 * c), acc[c]);
        if (half)
            acc8 = _mm256_fmadd_ps(_mm512_castps512_ps256(pj), _mm256_loadu_ps(r + 16 * nv), acc8);
    }
    for (int c = 0; c < nv; c++)
        _mm512_storeu_ps(y + 16 * c, acc[c]);
    if (half)
        _mm256_storeu_ps(y + 16 * nv, acc8);
}

void rlai__attn_mad_f16_multi_avx512(int m, int d, const uint16_t *v, size_t stride, int nq, const int *mq,
                                     const float *const *p, float *const *y)
{
    if (d % 8 != 0 || d > 128 || nq < 2) {
        for (int qi = 0; qi < nq; qi++)
            rlai__attn_mad_f16_avx512(mq[qi] < m ? mq[qi] : m, d, v, stride, p[qi], y[qi]);
        return;
    }
    _Alignas(64) float vf[MULTI_ROWS * 128];
    for (int j0 = 0; j0 < m; j0 += MULTI_ROWS) {
        int mb = m - j0 < MULTI_ROWS ? m - j0 : MULTI_ROWS;
        block_to_f32_16(mb, d, v + (size_t)j0 * stride, stride, vf);
        for (int qi = 0; qi < nq; qi++) {
            int n = (mq[qi] < m ? mq[qi] : m) - j0;
            n = n < mb ? n : mb;
            if (n <= 0)
                continue;
            if (d == 64)
                mad_f32_rows16(4, false, n, vf, 64, p[qi] + j0, y[qi]);   /* constant trip count */
            else
                mad_f32_rows16(d / 16, d % 16 != 0, n, vf, d, p[qi] + j0, y[qi]);
        }
    }
}

/* ---- SwiGLU with glibc's expf (kernels_impl.h), 8 lanes in double. */

/* e^x for 8 floats in [RLAI_EXPF_LO, RLAI_EXPF_HI], still in double:
 * rlai__expf_ref's operations lane by lane (the table lookup is two
 * two-register permutes and a blend instead of a gather). */
AI __m512d expf_pd8(__m256 x, const __m512i tab[4])
{
    const __m512d inv = _mm512_set1_pd(RLAI_EXPF_INVLN2N), sh = _mm512_set1_pd(RLAI_EXPF_SHIFT);
    __m512d xd = _mm512_cvtps_pd(x);
    __m512d kd = _mm512_fmadd_pd(inv, xd, sh);
    __m512i ki = _mm512_castpd_si512(kd);
    kd = _mm512_sub_pd(kd, sh);
    __m512d r = _mm512_fmsub_pd(inv, xd, kd);
    __m512i t0 = _mm512_permutex2var_epi64(tab[0], ki, tab[1]);   /* entries 0-15 by bits 0-3 */
    __m512i t1 = _mm512_permutex2var_epi64(tab[2], ki, tab[3]);   /* entries 16-31 */
    __m512i t = _mm512_mask_blend_epi64(_mm512_test_epi64_mask(ki, _mm512_set1_epi64(16)), t0, t1);
    t = _mm512_add_epi64(t, _mm512_slli_epi64(ki, 47));
    __m512d p = _mm512_fmadd_pd(_mm512_set1_pd(RLAI_EXPF_C0), r, _mm512_set1_pd(RLAI_EXPF_C1));
    __m512d r2 = _mm512_mul_pd(r, r);
    __m512d y = _mm512_fmadd_pd(_mm512_set1_pd(RLAI_EXPF_C2), r, _mm512_set1_pd(1.0));
    y = _mm512_fmadd_pd(p, r2, y);
    return _mm512_mul_pd(y, _mm512_castsi512_pd(t));
}

void rlai__swiglu_avx512(size_t n, float *gate, const float *up)
{
    const __m512 lo = _mm512_set1_ps(RLAI_EXPF_LO), hi = _mm512_set1_ps(RLAI_EXPF_HI);
    const __m512 one = _mm512_set1_ps(1.0f), sign = _mm512_set1_ps(-0.0f);
    __m512i tab[4];
    for (int q = 0; q < 4; q++)
        tab[q] = _mm512_loadu_si512((const void *)(rlai__expf_tab + 8 * q));
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 g = _mm512_loadu_ps(gate + i);
        __m512 x = _mm512_xor_ps(g, sign);
        /* NaN, or outside the range of the polynomial path: the AVX2
         * level's reference fallback, same results */
        if (_mm512_cmp_ps_mask(x, lo, _CMP_NGE_UQ) | _mm512_cmp_ps_mask(x, hi, _CMP_NLE_UQ)) {
            rlai__swiglu_avx2(16, gate + i, up + i);
            continue;
        }
        __m256 e0 = _mm512_cvtpd_ps(expf_pd8(_mm512_castps512_ps256(x), tab));
        __m256 e1 = _mm512_cvtpd_ps(expf_pd8(_mm512_extractf32x8_ps(x, 1), tab));
        __m512 e = _mm512_insertf32x8(_mm512_castps256_ps512(e0), e1, 1);
        __m512 y = _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(one, e)), _mm512_loadu_ps(up + i));
        _mm512_storeu_ps(gate + i, y);
    }
    rlai__swiglu_avx2(n - i, gate + i, up + i);
}
