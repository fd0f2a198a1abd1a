/* kernels_avx2.c - AVX2 + FMA + F16C kernels. Compiled with those flags
 * only for this file; called only after kernels.c has checked the CPU.
 *
 * Batch invariance: every output y[t][r] is bit-identical whatever T, the
 * token's position in the batch, the row/token split and the thread
 * count (continuous batching and the prefix cache rely on it). The
 * quantized kernels follow one canonical per-output float sequence (see
 * "the canonical per-output accumulation" below); the f32 path gives the
 * T == 1 (mv_float, mv_deq) and T > 1 (mm_f32: dot4_f32, dot1_f32) kernels
 * the same two 8-lane accumulators fed in the same order, the same
 * horizontal sum and the same scalar tail.
 *
 * Quantized path (activations quantized as described in kernels_impl.h):
 *  - T == 1 (decode): mv_u8 / mv_q8 take 8 rows at a time, one row per
 *    SIMD lane, streaming the 8 rows block by block with the next group
 *    prefetched in step. Per block the 8 rows' exact integer sums are
 *    formed with maddubs and a horizontal-add tree.
 *  - 1 < T <= RLAI_MV_MAX_T (batched decode): mv_small runs the same
 *    8-rows-in-lanes matvec for up to RLAI_MV_NT tokens per pass, sharing
 *    each 8-row group's unpacked weights and block scales (mvn_u8/mvn_q8).
 *  - T > RLAI_MV_MAX_T (prefill): per 16-row chunk the weight nibbles are unpacked
 *    once into u8 scratch with f32 d/m arrays, then 4-row x 8-token tiles
 *    (tile8) are computed with maddubs, one token per lane.
 * Q4_0/Q4_1/Q5_0/Q5_1 all use unsigned 0..31 weights with a per-block
 * "min" m (Q4_0: -8d, Q5_0: -16d); Q8_0 uses the sign trick.
 * f32 path (precise mode, F32/F16/BF16 weights): T == 1 streams rows and
 * converts/dequantizes in registers (mv_float, mv_deq); T > 1 converts
 * 16-row chunks to f32 scratch and dots them with FMA (mm_f32). Weight
 * dequantization here is bit-identical to rlai_dequantize_row. */
#include "kernels_impl.h"
#include "dtype.h"
#include "kernels_x86.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define AI __attribute__((always_inline)) static inline

/* ------------------------------------------------------------------ */
/* small helpers                                                       */

AI uint16_t ld16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

AI uint32_t ld32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

AI size_t blk_bytes(uint32_t type)
{
    switch (type) {
    case RLAI_DT_Q4_0: return sizeof(rlai_block_q4_0);
    case RLAI_DT_Q4_1: return sizeof(rlai_block_q4_1);
    case RLAI_DT_Q5_0: return sizeof(rlai_block_q5_0);
    case RLAI_DT_Q5_1: return sizeof(rlai_block_q5_1);
    default: return sizeof(rlai_block_q8_0);
    }
}

/* 16 packed nibbles -> 32 bytes in element order (low nibbles first). */
AI __m256i nibbles(const uint8_t *qs)
{
    __m128i q = _mm_loadu_si128((const __m128i *)qs);
    __m256i v = _mm256_set_m128i(_mm_srli_epi16(q, 4), q);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
}

/* 32 bits of qh -> 0x10 in byte j where bit j is set. */
AI __m256i qh_bytes(const uint8_t *qh)
{
    __m256i v = _mm256_set1_epi32((int)ld32(qh));
    const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                          2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bits = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    v = _mm256_shuffle_epi8(v, shuf);
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bits), bits);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

/* Unsigned 0..31 weights of one Q4_0/Q4_1/Q5_0/Q5_1 block. */
AI __m256i unpack_u8(uint32_t type, const uint8_t *blk)
{
    switch (type) {
    case RLAI_DT_Q4_0: return nibbles(blk + 2);
    case RLAI_DT_Q4_1: return nibbles(blk + 4);
    case RLAI_DT_Q5_0: return _mm256_or_si256(nibbles(blk + 6), qh_bytes(blk + 2));
    default:           return _mm256_or_si256(nibbles(blk + 8), qh_bytes(blk + 4));
    }
}

/* f32 d and m of a block (m per the file convention). */
AI void block_dm(uint32_t type, const uint8_t *blk, float *d, float *m)
{
    switch (type) {
    case RLAI_DT_Q4_1:
    case RLAI_DT_Q5_1: {
        __m128 v = _mm_cvtph_ps(_mm_cvtsi32_si128((int)ld32(blk)));
        *d = _mm_cvtss_f32(v);
        *m = _mm_cvtss_f32(_mm_movehdup_ps(v));
        return;
    }
    default: {
        float dd = _cvtsh_ss(ld16(blk));
        *d = dd;
        *m = type == RLAI_DT_Q4_0 ? -8.0f * dd : type == RLAI_DT_Q5_0 ? -16.0f * dd : 0.0f;
        return;
    }
    }
}

/* ------------------------------------------------------------------ */
/* activation quantization (bit-identical to rlai__quant_act_scalar)   */

AI __m256 round_half_away(__m256 v)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_andnot_ps(sign, _mm256_sub_ps(v, t));          /* |v - trunc(v)|, exact */
    __m256 up = _mm256_cmp_ps(f, _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    __m256 one = _mm256_or_ps(_mm256_and_ps(v, sign), _mm256_set1_ps(1.0f));
    return _mm256_add_ps(t, _mm256_and_ps(up, one));
}

void rlai__quant_act_avx2(const float *x, int64_t n, int8_t *q, float *ds)
{
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    const __m256 lim = _mm256_set1_ps(127.0f), nlim = _mm256_set1_ps(-127.0f);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t b = 0; b < n / RLAI_QK; b++, x += RLAI_QK, q += RLAI_QK) {
        __m256 v[4];
        __m256 mx = _mm256_setzero_ps();
        for (int i = 0; i < 4; i++) {
            v[i] = _mm256_loadu_ps(x + 8 * i);
            /* max(a, mx): a NaN lane keeps mx, like the scalar `a > amax` */
            mx = _mm256_max_ps(_mm256_and_ps(v[i], absmask), mx);
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        float amax = _mm_cvtss_f32(m4);
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        __m256 vid = _mm256_set1_ps(id);
        __m256i qi[4];
        __m256i sum = _mm256_setzero_si256();
        for (int i = 0; i < 4; i++) {
            __m256 s = _mm256_mul_ps(v[i], vid);
            __m256 ord = _mm256_cmp_ps(s, s, _CMP_ORD_Q);
            __m256 r = round_half_away(s);
            r = _mm256_min_ps(_mm256_max_ps(r, nlim), lim);
            r = _mm256_and_ps(r, ord);                                   /* NaN -> 0 */
            qi[i] = _mm256_cvtps_epi32(r);
            sum = _mm256_add_epi32(sum, qi[i]);
        }
        __m256i p01 = _mm256_packs_epi32(qi[0], qi[1]);
        __m256i p23 = _mm256_packs_epi32(qi[2], qi[3]);
        __m256i p = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p01, p23), perm);
        _mm256_storeu_si256((__m256i *)q, p);
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
        ds[2 * b] = d;
        ds[2 * b + 1] = d * (float)_mm_cvtsi128_si32(s4);
    }
}

/* ------------------------------------------------------------------ */
/* quantized path: the canonical per-output accumulation               */
/*
 * Batch invariance: every output y[t][r] is produced by the same scalar
 * sequence of float operations whatever T, the token's position in the
 * batch, the row/token split or the thread count:
 *
 *     acc = 0
 *     for b = 0 .. nb-1:                       (in block order)
 *         isum = sum_{e<32} wq[b][e] * xq[t][b][e]   (exact int32)
 *         acc  = fma((float)isum, d_w[b] * d_x[b], acc)
 *         acc  = fma(m_w[b], s_x[b], acc)      (not for Q8_0)
 *     y = acc
 *
 * The block's integer sum is exact however it is reduced, so only the
 * float chain matters, and it is computed one output per SIMD lane: the
 * T == 1 and small-batch matvecs put 8 rows in the 8 lanes (mv_u8 / mv_q8,
 * mvn_u8 / mvn_q8, which share mv_u8/mv_q8's lane layout), the tiled
 * T > 1 kernel 8 tokens (tile8). Each lane sees exactly the sequence above
 * (products are commutative, the mul and the fmas are single roundings). */

/* Software prefetch of [p, p + n). Prefetching past the end of the data
 * is harmless on x86. */
AI void prefetch_range(const uint8_t *p, size_t n)
{
    for (size_t o = 0; o < n; o += 64)
        _mm_prefetch((const char *)(p + o), _MM_HINT_T0);
}

/* One-row streams (f32 path): prefetch about 2 KiB, at least a row, ahead. */
AI void prefetch_row(const uint8_t *row, size_t rb)
{
    prefetch_range(row, rb);
}

static size_t pf_bytes(size_t rb)
{
    size_t rows = (2048 + rb - 1) / rb;
    return rows * rb;
}

/* 0x10 bytes for the 5th bits of one block in two rows, in the pair order
 * used by mv_u8: lo = [row0 bits 0-15 | row1 bits 0-15], hi = [row0 bits
 * 16-31 | row1 bits 16-31]. */
AI void qh_pair(const uint8_t *qh0, const uint8_t *qh1, __m256i *lo, __m256i *hi)
{
    __m256i v = _mm256_set1_epi64x((long long)((uint64_t)ld32(qh0) | (uint64_t)ld32(qh1) << 32));
    const __m256i slo = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                         4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5);
    const __m256i shi = _mm256_setr_epi8(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
                                         6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7);
    const __m256i bits = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i x10 = _mm256_set1_epi8(0x10);
    __m256i l = _mm256_shuffle_epi8(v, slo), h = _mm256_shuffle_epi8(v, shi);
    *lo = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(l, bits), bits), x10);
    *hi = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(h, bits), bits), x10);
}

/* Block scales of 8 rows: g holds each row's first header dword (f16 d in
 * the low half, f16 m in the high half for Q4_1/Q5_1). Returns d as f32
 * and, for the types with an m term, m (Q4_0: -8d, Q5_0: -16d). */
AI __m256 split_dm(uint32_t type, __m256i g, __m256 *m)
{
    const __m256i shuf = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15,
                                          0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
    __m256i h = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(g, shuf), 0xD8);
    __m256 d = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
    if (type == RLAI_DT_Q4_1 || type == RLAI_DT_Q5_1)
        *m = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
    else if (type == RLAI_DT_Q4_0)
        *m = _mm256_mul_ps(d, _mm256_set1_ps(-8.0f));
    else if (type == RLAI_DT_Q5_0)
        *m = _mm256_mul_ps(d, _mm256_set1_ps(-16.0f));
    else
        *m = _mm256_setzero_ps();
    return d;
}

/* First header dword of block offset o in rows w[lane[0..7]]. */
AI __m256i hdr8(const uint8_t *const w[8], const int lane[8], size_t o)
{
    __m128i v[8];
    for (int i = 0; i < 8; i++)
        v[i] = _mm_cvtsi32_si128((int)ld32(w[lane[i]] + o));
    __m128i a = _mm_unpacklo_epi64(_mm_unpacklo_epi32(v[0], v[1]), _mm_unpacklo_epi32(v[2], v[3]));
    __m128i c = _mm_unpacklo_epi64(_mm_unpacklo_epi32(v[4], v[5]), _mm_unpacklo_epi32(v[6], v[7]));
    return _mm256_set_m128i(c, a);
}

/* Stores the first nr lanes of v to y[0 .. nr). */
AI void store_rows(float *y, __m256 v, int nr)
{
    if (nr == 8) {
        _mm256_storeu_ps(y, v);
        return;
    }
    float out[8];
    _mm256_storeu_ps(out, v);
    for (int i = 0; i < nr; i++)
        y[i] = out[i];
}

/* Row pointers of an 8-row group starting at r; rows past r1 repeat the
 * last row (computed, never stored). Returns the number of valid rows. */
AI int row_group(const rlai_mm_job *j, int64_t r, int64_t r1, const uint8_t *w[8])
{
    int nr = (int)(r1 - r < 8 ? r1 - r : 8);
    for (int i = 0; i < 8; i++) {
        int ri = i < nr ? i : nr - 1;
        w[i] = j->w + (size_t)(r + ri) * j->row_bytes;
    }
    return nr;
}

/* Rows are streamed 8 at a time, interleaved block by block. The next
 * group (8 contiguous rows) is prefetched in step with the blocks, 8*bs
 * bytes per block, so that the prefetches are spread over the loop (the
 * hardware prefetcher alone reaches only ~40% of DRAM bandwidth here; a
 * burst of prefetches at the start of each group stalls, and prefetching
 * in the demand order costs more instructions than it saves). Measured on
 * the dev VM: one group ahead beats two and fixed 1-4 KiB distances.
 * Prefetching past the end of the data is harmless on x86. */
#define MV_PREFETCH(pf, pfo, upto)                                       \
    do {                                                                 \
        for (; (pfo) < (upto); (pfo) += 64)                              \
            _mm_prefetch((const char *)((pf) + (pfo)), _MM_HINT_T0);     \
    } while (0)

/* Matvec (T == 1) for the 4/5-bit types: 8 rows at a time, one per lane.
 * Rows are taken in pairs (one 256-bit unpack covers the same block of two
 * rows); the reduction leaves the rows in lane order 0,2,4,6,1,3,5,7. */
AI void mv_u8(const rlai_mm_job *j, uint32_t type, int64_t r0, int64_t r1, int t)
{
    static const int lane[8] = { 0, 2, 4, 6, 1, 3, 5, 7 };
    const size_t bs = blk_bytes(type);
    const size_t qoff = type == RLAI_DT_Q4_0 ? 2 : type == RLAI_DT_Q4_1 ? 4 : type == RLAI_DT_Q5_0 ? 6 : 8;
    const bool has_qh = type == RLAI_DT_Q5_0 || type == RLAI_DT_Q5_1;
    const size_t qhoff = type == RLAI_DT_Q5_0 ? 2 : 4;
    const size_t rb = j->row_bytes;
    const int64_t nb = j->nb;
    const int8_t *xq = j->act->q + (size_t)t * (size_t)j->cols;
    const float *ds = j->act->ds + (size_t)t * (size_t)nb * 2;
    float *y = j->y + (size_t)t * (size_t)j->ldy;
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i unperm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);

    for (int64_t r = r0; r < r1; r += 8) {
        const uint8_t *w[8];
        int nr = row_group(j, r, r1, w);
        const uint8_t *pf = w[0] + 8 * rb;
        size_t pfo = 0;
        __m256 acc = _mm256_setzero_ps();
        size_t o = 0;
        for (int64_t b = 0; b < nb; b++, o += bs) {
            MV_PREFETCH(pf, pfo, 8 * (o + bs));
            __m256i x0 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(xq + 32 * b)));
            __m256i x1 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(xq + 32 * b + 16)));
            __m256i p[4];
            for (int k = 0; k < 4; k++) {
                const uint8_t *a = w[2 * k] + o, *c = w[2 * k + 1] + o;
                __m256i v = _mm256_loadu2_m128i((const __m128i *)(c + qoff), (const __m128i *)(a + qoff));
                __m256i lo = _mm256_and_si256(v, m4);
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                if (has_qh) {
                    __m256i hl, hh;
                    qh_pair(a + qhoff, c + qhoff, &hl, &hh);
                    lo = _mm256_or_si256(lo, hl);
                    hi = _mm256_or_si256(hi, hh);
                }
                /* |each 16-bit lane| <= 4 * 31 * 127 */
                p[k] = _mm256_add_epi16(_mm256_maddubs_epi16(lo, x0), _mm256_maddubs_epi16(hi, x1));
            }
            __m256i s01 = _mm256_madd_epi16(_mm256_hadd_epi16(p[0], p[1]), ones);
            __m256i s23 = _mm256_madd_epi16(_mm256_hadd_epi16(p[2], p[3]), ones);
            __m256i isum = _mm256_hadd_epi32(s01, s23);
            __m256 m;
            __m256 d = split_dm(type, hdr8(w, lane, o), &m);
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(d, _mm256_set1_ps(ds[2 * b])), acc);
            acc = _mm256_fmadd_ps(m, _mm256_set1_ps(ds[2 * b + 1]), acc);
        }
        store_rows(y + r, _mm256_permutevar8x32_ps(acc, unperm), nr);
    }
}

/* Sums the element halves of 8 outputs: a = [o0..o3 of elements 0-15 |
 * o0..o3 of elements 16-31], b the same for o4..o7 -> [o0 .. o7]. */
AI __m256i join_halves(__m256i a, __m256i b)
{
    return _mm256_add_epi32(_mm256_blend_epi32(a, b, 0xF0), _mm256_permute2x128_si256(a, b, 0x21));
}

/* Matvec (T == 1) for Q8_0: 8 rows at a time, one per lane. */
static void mv_q8(const rlai_mm_job *j, int64_t r0, int64_t r1, int t)
{
    static const int lane[8] = { 0, 1, 2, 3, 4, 5, 6, 7 };
    const size_t bs = sizeof(rlai_block_q8_0);
    const size_t rb = j->row_bytes;
    const int64_t nb = j->nb;
    const int8_t *xq = j->act->q + (size_t)t * (size_t)j->cols;
    const float *ds = j->act->ds + (size_t)t * (size_t)nb * 2;
    float *y = j->y + (size_t)t * (size_t)j->ldy;
    const __m256i ones = _mm256_set1_epi16(1);

    for (int64_t r = r0; r < r1; r += 8) {
        const uint8_t *w[8];
        int nr = row_group(j, r, r1, w);
        const uint8_t *pf = w[0] + 8 * rb;
        size_t pfo = 0;
        __m256 acc = _mm256_setzero_ps();
        size_t o = 0;
        for (int64_t b = 0; b < nb; b++, o += bs) {
            MV_PREFETCH(pf, pfo, 8 * (o + bs));
            __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + 32 * b));
            __m256i s[8];
            for (int i = 0; i < 8; i++) {
                __m256i wv = _mm256_loadu_si256((const __m256i *)(w[i] + o + 2));
                s[i] = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(wv), _mm256_sign_epi8(xv, wv)), ones);
            }
            __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
            __m256i c = _mm256_hadd_epi32(_mm256_hadd_epi32(s[4], s[5]), _mm256_hadd_epi32(s[6], s[7]));
            __m256i isum = join_halves(a, c);
            __m256 m;   /* zero for Q8_0: no m term */
            __m256 d = split_dm(RLAI_DT_Q8_0, hdr8(w, lane, o), &m);
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(d, _mm256_set1_ps(ds[2 * b])), acc);
        }
        store_rows(y + r, acc, nr);
    }
}

/* Small-batch matvec (1 < T <= RLAI_MV_MAX_T): mv_u8 / mv_q8 for NT tokens
 * at once. Same 8-rows-in-8-lanes layout, same per-lane float sequence as
 * the T == 1 kernels (so bit-identical to them); the unpacked weights and
 * the per-block row scales are shared by the NT tokens. Row groups are
 * streamed once (prefetched as in mv_u8); further token groups of the same
 * row group rerun from L1. */
AI void mvn_u8(const rlai_mm_job *j, uint32_t type, const uint8_t *const w[8], int64_t r, int nr,
                int t, const int NT, const uint8_t *pf, size_t *pfo)
{
    static const int lane[8] = { 0, 2, 4, 6, 1, 3, 5, 7 };
    const size_t bs = blk_bytes(type);
    const size_t qoff = type == RLAI_DT_Q4_0 ? 2 : type == RLAI_DT_Q4_1 ? 4 : type == RLAI_DT_Q5_0 ? 6 : 8;
    const bool has_qh = type == RLAI_DT_Q5_0 || type == RLAI_DT_Q5_1;
    const size_t qhoff = type == RLAI_DT_Q5_0 ? 2 : 4;
    const int64_t nb = j->nb, cols = j->cols;
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i unperm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const int8_t *xq = j->act->q + (size_t)t * (size_t)cols;
    const float *ds = j->act->ds + (size_t)t * (size_t)nb * 2;
    size_t po = *pfo;
    __m256 acc[8];
    for (int k = 0; k < NT; k++)
        acc[k] = _mm256_setzero_ps();
    size_t o = 0;
    for (int64_t b = 0; b < nb; b++, o += bs) {
        MV_PREFETCH(pf, po, 8 * (o + bs));
        __m256i lo[4], hi[4];
        for (int k = 0; k < 4; k++) {
            const uint8_t *a = w[2 * k] + o, *c = w[2 * k + 1] + o;
            __m256i v = _mm256_loadu2_m128i((const __m128i *)(c + qoff), (const __m128i *)(a + qoff));
            lo[k] = _mm256_and_si256(v, m4);
            hi[k] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            if (has_qh) {
                __m256i hl, hh;
                qh_pair(a + qhoff, c + qhoff, &hl, &hh);
                lo[k] = _mm256_or_si256(lo[k], hl);
                hi[k] = _mm256_or_si256(hi[k], hh);
            }
        }
        __m256 m;
        __m256 d = split_dm(type, hdr8(w, lane, o), &m);
        for (int i = 0; i < NT; i++) {
            const int8_t *xb = xq + (size_t)i * (size_t)cols + 32 * b;
            const float *dsb = ds + (size_t)i * (size_t)nb * 2 + 2 * b;
            __m256i x0 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)xb));
            __m256i x1 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(xb + 16)));
            __m256i p[4];
            for (int k = 0; k < 4; k++)
                p[k] = _mm256_add_epi16(_mm256_maddubs_epi16(lo[k], x0), _mm256_maddubs_epi16(hi[k], x1));
            __m256i s01 = _mm256_madd_epi16(_mm256_hadd_epi16(p[0], p[1]), ones);
            __m256i s23 = _mm256_madd_epi16(_mm256_hadd_epi16(p[2], p[3]), ones);
            __m256i isum = _mm256_hadd_epi32(s01, s23);
            acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(d, _mm256_set1_ps(dsb[0])), acc[i]);
            acc[i] = _mm256_fmadd_ps(m, _mm256_set1_ps(dsb[1]), acc[i]);
        }
    }
    *pfo = po;
    for (int i = 0; i < NT; i++)
        store_rows(j->y + (size_t)(t + i) * (size_t)j->ldy + r, _mm256_permutevar8x32_ps(acc[i], unperm), nr);
}

static void mvn_q8(const rlai_mm_job *j, const uint8_t *const w[8], int64_t r, int nr,
                   int t, const int NT, const uint8_t *pf, size_t *pfo)
{
    static const int lane[8] = { 0, 1, 2, 3, 4, 5, 6, 7 };
    const size_t bs = sizeof(rlai_block_q8_0);
    const int64_t nb = j->nb, cols = j->cols;
    const __m256i ones = _mm256_set1_epi16(1);
    const int8_t *xq = j->act->q + (size_t)t * (size_t)cols;
    const float *ds = j->act->ds + (size_t)t * (size_t)nb * 2;
    size_t po = *pfo;
    __m256 acc[8];
    for (int k = 0; k < NT; k++)
        acc[k] = _mm256_setzero_ps();
    size_t o = 0;
    for (int64_t b = 0; b < nb; b++, o += bs) {
        MV_PREFETCH(pf, po, 8 * (o + bs));
        __m256 m;   /* zero for Q8_0: no m term */
        __m256 d = split_dm(RLAI_DT_Q8_0, hdr8(w, lane, o), &m);
        (void)m;
        for (int i = 0; i < NT; i++) {
            __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + (size_t)i * (size_t)cols + 32 * b));
            __m256i s[8];
            for (int k = 0; k < 8; k++) {
                __m256i wv = _mm256_loadu_si256((const __m256i *)(w[k] + o + 2));
                s[k] = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(wv), _mm256_sign_epi8(xv, wv)), ones);
            }
            __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
            __m256i c = _mm256_hadd_epi32(_mm256_hadd_epi32(s[4], s[5]), _mm256_hadd_epi32(s[6], s[7]));
            __m256i isum = join_halves(a, c);
            acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum),
                                     _mm256_mul_ps(d, _mm256_set1_ps(ds[(size_t)i * (size_t)nb * 2 + 2 * b])), acc[i]);
        }
    }
    *pfo = po;
    for (int i = 0; i < NT; i++)
        store_rows(j->y + (size_t)(t + i) * (size_t)j->ldy + r, acc[i], nr);
}

/* Small-batch entry: per 8-row group, tokens [t0, t1) in groups of
 * RLAI_MV_NT and one smaller tail group. The row group is streamed from
 * memory by the first token group (with the next group prefetched); the
 * others rerun it from L1. */
#define MVN_CASE(n)                                                  \
    case n:                                                          \
        if (q8)                                                      \
            mvn_q8(j, w, r, nr, t, n, pf, &pfo);                     \
        else                                                         \
            mvn_u8(j, type, w, r, nr, t, n, pf, &pfo);               \
        break
AI void mv_small(const rlai_mm_job *j, uint32_t type, int64_t r0, int64_t r1, int t0, int t1)
{
    const bool q8 = type == RLAI_DT_Q8_0;
    for (int64_t r = r0; r < r1; r += 8) {
        const uint8_t *w[8];
        int nr = row_group(j, r, r1, w);
        const uint8_t *pf = w[0] + 8 * j->row_bytes;
        size_t pfo = 0;
        for (int t = t0; t < t1; t += RLAI_MV_NT) {
            int nt = t1 - t < RLAI_MV_NT ? t1 - t : RLAI_MV_NT;
            switch (nt) {
            MVN_CASE(1);
            MVN_CASE(2);
            MVN_CASE(3);
            MVN_CASE(4);
#if RLAI_MV_NT > 4
            MVN_CASE(5);
            MVN_CASE(6);
            MVN_CASE(7);
            MVN_CASE(8);
#endif
            default: break;
            }
        }
    }
}
#undef MVN_CASE

/* ------------------------------------------------------------------ */
/* tiled matmul (T > 1)                                                */

/* Scratch layout for one 16-row chunk. */
typedef struct {
    uint8_t *u;    /* [16][cols] unpacked weights */
    float *dw;     /* [16][nb] */
    float *mw;     /* [16][nb] */
} tile_scratch;

static tile_scratch tile_scratch_of(void *scratch, int64_t cols, int64_t nb)
{
    tile_scratch s;
    s.u = scratch;
    s.dw = (float *)((uint8_t *)scratch + (size_t)RLAI_ROW_TILE * (size_t)cols);
    s.mw = s.dw + (size_t)RLAI_ROW_TILE * (size_t)nb;
    return s;
}

/* Unpacks rows [r, r+nr) into the tile scratch; rows nr..15 zeroed. */
AI void unpack_rows(const rlai_mm_job *j, uint32_t type, int64_t r, int nr, const tile_scratch *s)
{
    const int64_t nb = j->nb, cols = j->cols;
    const size_t bs = blk_bytes(type);
    for (int i = 0; i < RLAI_ROW_TILE; i++) {
        uint8_t *u = s->u + (size_t)i * (size_t)cols;
        float *dw = s->dw + (size_t)i * (size_t)nb, *mw = s->mw + (size_t)i * (size_t)nb;
        if (i >= nr) {
            memset(u, 0, (size_t)cols);
            memset(dw, 0, (size_t)nb * sizeof(float));
            memset(mw, 0, (size_t)nb * sizeof(float));
            continue;
        }
        const uint8_t *w = j->w + (size_t)(r + i) * j->row_bytes;
        for (int64_t b = 0; b < nb; b++, w += bs) {
            __m256i v = type == RLAI_DT_Q8_0 ? _mm256_loadu_si256((const __m256i *)(w + 2))
                                             : unpack_u8(type, w);
            _mm256_storeu_si256((__m256i *)(u + 32 * b), v);
            block_dm(type, w, &dw[b], &mw[b]);
        }
    }
}

/* Exact block sums of one unpacked weight block w with 8 tokens' blocks
 * (xb, xb + cols, ... xb + 7 cols): lane i = token i. */
AI __m256i isum8_tok(uint32_t type, __m256i w, const int8_t *xb, int64_t cols)
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i lo, hi;   /* [tokens 0-3 | 0-3] for elements 0-15 | 16-31, and tokens 4-7 */
    if (type == RLAI_DT_Q8_0) {
        __m256i aw = _mm256_abs_epi8(w);
        __m256i s[8];
        for (int i = 0; i < 8; i++) {
            __m256i xv = _mm256_loadu_si256((const __m256i *)(xb + (size_t)i * (size_t)cols));
            s[i] = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(xv, w)), ones);
        }
        lo = _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
        hi = _mm256_hadd_epi32(_mm256_hadd_epi32(s[4], s[5]), _mm256_hadd_epi32(s[6], s[7]));
    } else {
        __m256i p[8];
        for (int i = 0; i < 8; i++)
            p[i] = _mm256_maddubs_epi16(w, _mm256_loadu_si256((const __m256i *)(xb + (size_t)i * (size_t)cols)));
        /* 16-bit sums of 8 products: |.| <= 8 * 31 * 127 < 32768 */
        lo = _mm256_madd_epi16(_mm256_hadd_epi16(_mm256_hadd_epi16(p[0], p[1]),
                                                 _mm256_hadd_epi16(p[2], p[3])), ones);
        hi = _mm256_madd_epi16(_mm256_hadd_epi16(_mm256_hadd_epi16(p[4], p[5]),
                                                 _mm256_hadd_epi16(p[6], p[7])), ones);
    }
    return join_halves(lo, hi);
}

/* One block step of the canonical sequence for row r of a tile. The
 * empty asm keeps the activations as memory operands: letting GCC hoist
 * the 8 x vectors into registers for all rows of the tile makes it spill. */
#define TILE_STEP(acc, r)                                                               \
    do {                                                                                \
        const int8_t *xb_ = xq + 32 * b;                                                \
        __asm__ volatile("" : "+r"(xb_));                                               \
        __m256i w_ = _mm256_loadu_si256((const __m256i *)(u + (size_t)(r) * (size_t)cols + 32 * b)); \
        __m256i is_ = isum8_tok(type, w_, xb_, cols);                                   \
        __m256 sc_ = _mm256_mul_ps(_mm256_broadcast_ss(dw + (size_t)(r) * (size_t)nb + b), dvb); \
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is_), sc_, acc);                      \
        if (type != RLAI_DT_Q8_0)                                                       \
            acc = _mm256_fmadd_ps(_mm256_broadcast_ss(mw + (size_t)(r) * (size_t)nb + b), svb, acc); \
    } while (0)

/* 4 rows x 8 tokens over the full K: acc[r] lane i = row r, token i.
 * xq: the 8 tokens' rows (cols apart); dv/sv: their d_x/s_x per block. */
AI void tile8(uint32_t type, const uint8_t *u, const float *dw, const float *mw, int64_t cols,
              int64_t nb, const int8_t *xq, const float *dv, const float *sv, __m256 acc[4])
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t b = 0; b < nb; b++) {
        __m256 dvb = _mm256_loadu_ps(dv + 8 * b);
        __m256 svb = _mm256_loadu_ps(sv + 8 * b);
        TILE_STEP(a0, 0);
        TILE_STEP(a1, 1);
        TILE_STEP(a2, 2);
        TILE_STEP(a3, 3);
    }
    acc[0] = a0;
    acc[1] = a1;
    acc[2] = a2;
    acc[3] = a3;
}

AI void mm_tiled(const rlai_mm_job *j, uint32_t type, int64_t r0, int64_t r1,
                 int t0, int t1, void *scratch)
{
    const int64_t cols = j->cols, nb = j->nb;
    const rlai_act *a = j->act;
    tile_scratch s = tile_scratch_of(scratch, cols, nb);

    for (int64_t rc = r0; rc < r1; rc += RLAI_ROW_TILE) {
        int nr = (int)(r1 - rc < RLAI_ROW_TILE ? r1 - rc : RLAI_ROW_TILE);
        unpack_rows(j, type, rc, nr, &s);
        for (int t = t0; t < t1; t += 8) {
            int ntok = t1 - t < 8 ? t1 - t : 8;
            const int8_t *xq = a->q + (size_t)t * (size_t)cols;
            const float *dv = a->dv + (size_t)(t / 8) * (size_t)nb * 8;
            const float *sv = a->sv + (size_t)(t / 8) * (size_t)nb * 8;
            for (int rt = 0; rt < nr; rt += 4) {
                __m256 acc[4];
                tile8(type, s.u + (size_t)rt * (size_t)cols, s.dw + (size_t)rt * (size_t)nb,
                      s.mw + (size_t)rt * (size_t)nb, cols, nb, xq, dv, sv, acc);
                int nrow = nr - rt < 4 ? nr - rt : 4;
                float out[8];
                for (int r = 0; r < nrow; r++) {
                    _mm256_storeu_ps(out, acc[r]);
                    for (int i = 0; i < ntok; i++)
                        j->y[(size_t)(t + i) * (size_t)j->ldy + (size_t)(rc + rt + r)] = out[i];
                }
            }
        }
    }
}

/* ------------------------------------------------------------------ */
/* f32 path                                                            */

/* One block of any quant type as 4 x 8 f32, exactly rlai_dequantize_row's
 * values: q*d is exact, so fma(q, d, m) equals the reference q*d + m. */
AI void block_f32(uint32_t type, const uint8_t *blk, __m256 v[4])
{
    if (type == RLAI_DT_Q8_0) {
        __m256 d = _mm256_set1_ps(_cvtsh_ss(ld16(blk)));
        for (int k = 0; k < 4; k++) {
            __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 2 + 8 * k)));
            v[k] = _mm256_mul_ps(_mm256_cvtepi32_ps(q), d);
        }
        return;
    }
    float d, m;
    __m256i u = unpack_u8(type, blk);
    block_dm(type, blk, &d, &m);
    __m256 vd = _mm256_set1_ps(d), vm = _mm256_set1_ps(m);
    __m128i lo = _mm256_castsi256_si128(u), hi = _mm256_extracti128_si256(u, 1);
    __m128i parts[4] = { lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8) };
    for (int k = 0; k < 4; k++)
        v[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(parts[k])), vd, vm);
}

/* Precise-mode T == 1 for the quant types: dequantize in registers and
 * dot with the f32 activations (row streamed once, prefetched). */
AI void mv_deq(const rlai_mm_job *j, uint32_t type, int64_t r0, int64_t r1, int t)
{
    const size_t bs = blk_bytes(type);
    const size_t rb = j->row_bytes;
    const int64_t nb = j->nb;
    const float *x = j->x + (size_t)t * (size_t)j->ldx;
    float *y = j->y + (size_t)t * (size_t)j->ldy;
    const size_t pf = pf_bytes(rb);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *w = j->w + (size_t)r * rb;
        prefetch_row(w + pf, rb);
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++, w += bs) {
            __m256 v[4];
            block_f32(type, w, v);
            const float *xb = x + 32 * b;
            a0 = _mm256_fmadd_ps(v[0], _mm256_loadu_ps(xb), a0);
            a1 = _mm256_fmadd_ps(v[1], _mm256_loadu_ps(xb + 8), a1);
            a0 = _mm256_fmadd_ps(v[2], _mm256_loadu_ps(xb + 16), a0);
            a1 = _mm256_fmadd_ps(v[3], _mm256_loadu_ps(xb + 24), a1);
        }
        y[r] = hsum8(_mm256_add_ps(a0, a1));
    }
}

/* Converts one weight row of any supported type to f32 (exactly like
 * rlai_dequantize_row). */
static void row_to_f32(uint32_t type, const uint8_t *src, float *dst, int64_t n)
{
    int64_t i = 0;
    switch (type) {
    case RLAI_DT_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    case RLAI_DT_F16:
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + 2 * i))));
        for (; i < n; i++)
            dst[i] = rlai_fp16_to_f32(ld16(src + 2 * i));
        return;
    case RLAI_DT_BF16:
        for (; i + 8 <= n; i += 8) {
            __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + 2 * i)));
            _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
        }
        for (; i < n; i++)
            dst[i] = rlai_bf16_to_f32(ld16(src + 2 * i));
        return;
    case RLAI_DT_Q8_0:
        for (int64_t b = 0; b < n / RLAI_QK; b++, src += sizeof(rlai_block_q8_0)) {
            __m256 d = _mm256_set1_ps(_cvtsh_ss(ld16(src)));
            for (int k = 0; k < 4; k++) {
                __m256i v = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(src + 2 + 8 * k)));
                _mm256_storeu_ps(dst + 32 * b + 8 * k, _mm256_mul_ps(_mm256_cvtepi32_ps(v), d));
            }
        }
        return;
    default: {
        const size_t bs = blk_bytes(type);
        for (int64_t b = 0; b < n / RLAI_QK; b++, src += bs) {
            __m256 v[4];
            switch (type) {   /* constant per call: let the branch predictor handle it */
            case RLAI_DT_Q4_0: block_f32(RLAI_DT_Q4_0, src, v); break;
            case RLAI_DT_Q4_1: block_f32(RLAI_DT_Q4_1, src, v); break;
            case RLAI_DT_Q5_0: block_f32(RLAI_DT_Q5_0, src, v); break;
            default:           block_f32(RLAI_DT_Q5_1, src, v); break;
            }
            for (int k = 0; k < 4; k++)
                _mm256_storeu_ps(dst + 32 * b + 8 * k, v[k]);
        }
        return;
    }
    }
}

AI float ldf(const float *p)
{
    float v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* Dot products of 4 f32 rows with x (n arbitrary). */
static void dot4_f32(const float *const w[4], const float *x, int64_t n, float out[4])
{
    __m256 a[4][2];
    for (int r = 0; r < 4; r++)
        a[r][0] = a[r][1] = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + 16 <= n; c += 16) {
        __m256 x0 = _mm256_loadu_ps(x + c), x1 = _mm256_loadu_ps(x + c + 8);
        for (int r = 0; r < 4; r++) {
            a[r][0] = _mm256_fmadd_ps(_mm256_loadu_ps(w[r] + c), x0, a[r][0]);
            a[r][1] = _mm256_fmadd_ps(_mm256_loadu_ps(w[r] + c + 8), x1, a[r][1]);
        }
    }
    for (; c + 8 <= n; c += 8) {
        __m256 x0 = _mm256_loadu_ps(x + c);
        for (int r = 0; r < 4; r++)
            a[r][0] = _mm256_fmadd_ps(_mm256_loadu_ps(w[r] + c), x0, a[r][0]);
    }
    for (int r = 0; r < 4; r++) {
        float s = hsum8(_mm256_add_ps(a[r][0], a[r][1]));
        for (int64_t k = c; k < n; k++)
            s = fmaf(ldf(w[r] + k), x[k], s);
        out[r] = s;
    }
}

static float dot1_f32(const float *w, const float *x, int64_t n)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + 16 <= n; c += 16) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + c), _mm256_loadu_ps(x + c), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + c + 8), _mm256_loadu_ps(x + c + 8), a1);
    }
    for (; c + 8 <= n; c += 8)
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + c), _mm256_loadu_ps(x + c), a0);
    float s = hsum8(_mm256_add_ps(a0, a1));
    for (; c < n; c++)
        s = fmaf(ldf(w + c), x[c], s);
    return s;
}

/* 8 weights of a float-type row as f32. */
AI __m256 load8_w(uint32_t type, const uint8_t *row, int64_t c)
{
    if (type == RLAI_DT_F16)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 2 * c)));
    if (type == RLAI_DT_BF16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(row + 2 * c))), 16));
    return _mm256_loadu_ps((const float *)(const void *)(row + 4 * c));
}

AI float load1_w(uint32_t type, const uint8_t *row, int64_t c)
{
    if (type == RLAI_DT_F16)
        return rlai_fp16_to_f32(ld16(row + 2 * c));
    if (type == RLAI_DT_BF16)
        return rlai_bf16_to_f32(ld16(row + 2 * c));
    float v;
    memcpy(&v, row + 4 * c, 4);
    return v;
}

/* T == 1 for F32/F16/BF16 weights: stream each row once, converting in
 * registers, with software prefetch. */
AI void mv_float(const rlai_mm_job *j, uint32_t type, int64_t r0, int64_t r1, int t)
{
    const size_t rb = j->row_bytes;
    const int64_t n = j->cols;
    const float *x = j->x + (size_t)t * (size_t)j->ldx;
    float *y = j->y + (size_t)t * (size_t)j->ldy;
    const size_t pf = pf_bytes(rb);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *w = j->w + (size_t)r * rb;
        prefetch_row(w + pf, rb);
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        int64_t c = 0;
        for (; c + 16 <= n; c += 16) {
            a0 = _mm256_fmadd_ps(load8_w(type, w, c), _mm256_loadu_ps(x + c), a0);
            a1 = _mm256_fmadd_ps(load8_w(type, w, c + 8), _mm256_loadu_ps(x + c + 8), a1);
        }
        for (; c + 8 <= n; c += 8)
            a0 = _mm256_fmadd_ps(load8_w(type, w, c), _mm256_loadu_ps(x + c), a0);
        float s = hsum8(_mm256_add_ps(a0, a1));
        for (; c < n; c++)
            s = fmaf(load1_w(type, w, c), x[c], s);
        y[r] = s;
    }
}

static void mm_f32(const rlai_mm_job *j, int64_t r0, int64_t r1, int t0, int t1, void *scratch)
{
    const int64_t cols = j->cols;
    float *buf = scratch;
    for (int64_t rc = r0; rc < r1; rc += RLAI_ROW_TILE) {
        int nr = (int)(r1 - rc < RLAI_ROW_TILE ? r1 - rc : RLAI_ROW_TILE);
        const float *rows[RLAI_ROW_TILE];
        for (int i = 0; i < nr; i++) {
            const uint8_t *src = j->w + (size_t)(rc + i) * j->row_bytes;
            if (j->type == RLAI_DT_F32) {
                rows[i] = (const float *)(const void *)src;   /* read with loadu/memcpy only */
            } else {
                float *dst = buf + (size_t)i * (size_t)cols;
                row_to_f32(j->type, src, dst, cols);
                rows[i] = dst;
            }
        }
        for (int t = t0; t < t1; t++) {
            const float *xt = j->x + (size_t)t * (size_t)j->ldx;
            float *yt = j->y + (size_t)t * (size_t)j->ldy + rc;
            int i = 0;
            for (; i + 4 <= nr; i += 4)
                dot4_f32(rows + i, xt, cols, yt + i);
            for (; i < nr; i++)
                yt[i] = dot1_f32(rows[i], xt, cols);
        }
    }
}

/* ------------------------------------------------------------------ */
/* entry                                                               */

void rlai__mm_avx2(const rlai_mm_job *j, int64_t r0, int64_t r1, int t0, int t1, void *scratch)
{
    if (!j->act) {
        if (t1 - t0 == 1 && j->type == RLAI_DT_F16)
            mv_float(j, RLAI_DT_F16, r0, r1, t0);
        else if (t1 - t0 == 1 && j->type == RLAI_DT_BF16)
            mv_float(j, RLAI_DT_BF16, r0, r1, t0);
        else if (t1 - t0 == 1 && j->type == RLAI_DT_F32)
            mv_float(j, RLAI_DT_F32, r0, r1, t0);
        else if (t1 - t0 == 1 && j->type == RLAI_DT_Q4_0)
            mv_deq(j, RLAI_DT_Q4_0, r0, r1, t0);
        else if (t1 - t0 == 1 && j->type == RLAI_DT_Q4_1)
            mv_deq(j, RLAI_DT_Q4_1, r0, r1, t0);
        else if (t1 - t0 == 1 && j->type == RLAI_DT_Q5_0)
            mv_deq(j, RLAI_DT_Q5_0, r0, r1, t0);
        else if (t1 - t0 == 1 && j->type == RLAI_DT_Q5_1)
            mv_deq(j, RLAI_DT_Q5_1, r0, r1, t0);
        else if (t1 - t0 == 1 && j->type == RLAI_DT_Q8_0)
            mv_deq(j, RLAI_DT_Q8_0, r0, r1, t0);
        else
            mm_f32(j, r0, r1, t0, t1, scratch);
        return;
    }
    if (t1 - t0 > 1 && j->T <= RLAI_MV_MAX_T) {
        switch (j->type) {
        case RLAI_DT_Q4_0: mv_small(j, RLAI_DT_Q4_0, r0, r1, t0, t1); break;
        case RLAI_DT_Q4_1: mv_small(j, RLAI_DT_Q4_1, r0, r1, t0, t1); break;
        case RLAI_DT_Q5_0: mv_small(j, RLAI_DT_Q5_0, r0, r1, t0, t1); break;
        case RLAI_DT_Q5_1: mv_small(j, RLAI_DT_Q5_1, r0, r1, t0, t1); break;
        default:           mv_small(j, RLAI_DT_Q8_0, r0, r1, t0, t1); break;
        }
        return;
    }
    if (t1 - t0 == 1 || !j->act->dv) {
        for (int t = t0; t < t1; t++) {
            switch (j->type) {
            case RLAI_DT_Q4_0: mv_u8(j, RLAI_DT_Q4_0, r0, r1, t); break;
            case RLAI_DT_Q4_1: mv_u8(j, RLAI_DT_Q4_1, r0, r1, t); break;
            case RLAI_DT_Q5_0: mv_u8(j, RLAI_DT_Q5_0, r0, r1, t); break;
            case RLAI_DT_Q5_1: mv_u8(j, RLAI_DT_Q5_1, r0, r1, t); break;
            default:           mv_q8(j, r0, r1, t); break;
            }
        }
        return;
    }
    switch (j->type) {
    case RLAI_DT_Q4_0: mm_tiled(j, RLAI_DT_Q4_0, r0, r1, t0, t1, scratch); break;
    case RLAI_DT_Q4_1: mm_tiled(j, RLAI_DT_Q4_1, r0, r1, t0, t1, scratch); break;
    case RLAI_DT_Q5_0: mm_tiled(j, RLAI_DT_Q5_0, r0, r1, t0, t1, scratch); break;
    case RLAI_DT_Q5_1: mm_tiled(j, RLAI_DT_Q5_1, r0, r1, t0, t1, scratch); break;
    default:           mm_tiled(j, RLAI_DT_Q8_0, r0, r1, t0, t1, scratch); break;
    }
}

/* ------------------------------------------------------------------ */
/* f16 vector helpers                                                  */

float rlai__dot_f16_f32_avx2(int n, const uint16_t *a, const float *b)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(a + i))),
                             _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(a + i + 8))),
                             _mm256_loadu_ps(b + i + 8), s1);
    }
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(a + i))),
                             _mm256_loadu_ps(b + i), s0);
    float s = hsum8(_mm256_add_ps(s0, s1));
    for (; i < n; i++)
        s = fmaf(rlai_fp16_to_f32(a[i]), b[i], s);
    return s;
}

void rlai__mad_f16_avx2(int n, float *y, const uint16_t *x, float s)
{
    __m256 vs = _mm256_set1_ps(s);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 xv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i)));
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(vs, xv, _mm256_loadu_ps(y + i)));
    }
    for (; i < n; i++)
        y[i] = fmaf(s, rlai_fp16_to_f32(x[i]), y[i]);
}

void rlai__f32_to_f16_avx2(const float *src, uint16_t *dst, int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++)
        dst[i] = rlai_f32_to_fp16(src[i]);
}

/* ------------------------------------------------------------------ */
/* attention helpers                                                   */

void rlai__attn_dot_f16_avx2(int n, int d, const uint16_t *k, size_t stride, const float *q, float scale,
                             float *out)
{
    if (d % 8 != 0 || d > 256) {
        rlai__attn_dot_f16_scalar(n, d, k, stride, q, scale, out);
        return;
    }
    for (int j = 0; j < n; j++) {
        const uint16_t *r = k + (size_t)j * stride;
        __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
        int i = 0;
        for (; i + 16 <= d; i += 16) {
            s0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(r + i))),
                                 _mm256_loadu_ps(q + i), s0);
            s1 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(r + i + 8))),
                                 _mm256_loadu_ps(q + i + 8), s1);
        }
        if (i < d)
            s0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(r + i))),
                                 _mm256_loadu_ps(q + i), s0);
        out[j] = scale * hsum8(_mm256_add_ps(s0, s1));
    }
}

/* y[0..8nv) += sum_j p[j] * v row j, y kept in registers across all rows
 * (nv <= 16 ymm). Inlined with a constant nv where the caller knows it, so
 * the inner loop is nv FMAs with no trip-count tests; the arithmetic is the
 * same for every nv path. */
AI void mad_f16_rows(const int nv, int n, const uint16_t *v, size_t stride, const float *p, float *y)
{
    __m256 acc[16];
    for (int c = 0; c < nv; c++)
        acc[c] = _mm256_loadu_ps(y + 8 * c);
    for (int j = 0; j < n; j++) {
        const uint16_t *r = v + (size_t)j * stride;
        __m256 pj = _mm256_set1_ps(p[j]);
        for (int c = 0; c < nv; c++)
            acc[c] = _mm256_fmadd_ps(pj, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(r + 8 * c))), acc[c]);
    }
    for (int c = 0; c < nv; c++)
        _mm256_storeu_ps(y + 8 * c, acc[c]);
}

void rlai__attn_mad_f16_avx2(int n, int d, const uint16_t *v, size_t stride, const float *p, float *y)
{
    if (d % 8 != 0 || d > 128) {
        rlai__attn_mad_f16_scalar(n, d, v, stride, p, y);
        return;
    }
    if (d == 64)
        mad_f16_rows(8, n, v, stride, p, y);   /* the usual head size: a constant trip count */
    else
        mad_f16_rows(d / 8, n, v, stride, p, y);
}

/* exp(x) for x <= 0 (softmax inputs): x = k*ln2 + r, |r| <= ln2/2,
 * exp(r) by a degree-6 polynomial, 2^k through the exponent bits. */
AI __m256 exp256(__m256 x)
{
    const __m256 lo = _mm256_set1_ps(-87.3f);
    __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_max_ps(x, lo);
    __m256 kf = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(kf, _mm256_set1_ps(0.693145751953125f), x);
    r = _mm256_fnmadd_ps(kf, _mm256_set1_ps(1.428606765330187045e-06f), r);
    __m256 p = _mm256_set1_ps(1.0f / 720.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(kf), _mm256_set1_epi32(127)), 23);
    __m256 res = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(under, res);
}

float rlai__exp_sum_avx2(int n, float *x, float max)
{
    __m256 vmax = _mm256_set1_ps(max), sum = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), vmax));
        _mm256_storeu_ps(x + i, e);
        sum = _mm256_add_ps(sum, e);
    }
    float s = hsum8(sum);
    for (; i < n; i++) {
        x[i] = expf(x[i] - max);
        s += x[i];
    }
    return s;
}

/* ---- several queries over one f16 KV block (speculative verification,
 * grouped-query heads). The block is converted to f32 once; each query's
 * arithmetic is then exactly rlai__attn_dot_f16_avx2's / _mad_'s (the
 * conversion is exact, the FMAs and the horizontal sum pair the same
 * operands in the same order), so results do not depend on how queries
 * are grouped. */

#define MULTI_ROWS 16

static void block_to_f32(int m, int d, const uint16_t *src, size_t stride, float *dst)
{
    for (int j = 0; j < m; j++)
        for (int i = 0; i < d; i += 8)
            _mm256_store_ps(dst + (size_t)j * d + i,
                            _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(src + (size_t)j * stride + i))));
}

/* out[j] = scale * dot(q, kf row j) for j < m, kf: m rows of d f32. */
static void dot_rows_f32(int m, int d, const float *kf, const float *q, float scale, float *out)
{
    const __m128 sc = _mm_set1_ps(scale);
    int j = 0;
    for (; j + 4 <= m; j += 4) {
        const float *r0 = kf + (size_t)j * d, *r1 = r0 + d, *r2 = r1 + d, *r3 = r2 + d;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, b0 = a0, b1 = a0, c0 = a0, c1 = a0, e0 = a0, e1 = a0;
        int i = 0;
        for (; i + 16 <= d; i += 16) {
            __m256 qa = _mm256_loadu_ps(q + i), qb = _mm256_loadu_ps(q + i + 8);
            a0 = _mm256_fmadd_ps(_mm256_load_ps(r0 + i), qa, a0);
            b0 = _mm256_fmadd_ps(_mm256_load_ps(r1 + i), qa, b0);
            c0 = _mm256_fmadd_ps(_mm256_load_ps(r2 + i), qa, c0);
            e0 = _mm256_fmadd_ps(_mm256_load_ps(r3 + i), qa, e0);
            a1 = _mm256_fmadd_ps(_mm256_load_ps(r0 + i + 8), qb, a1);
            b1 = _mm256_fmadd_ps(_mm256_load_ps(r1 + i + 8), qb, b1);
            c1 = _mm256_fmadd_ps(_mm256_load_ps(r2 + i + 8), qb, c1);
            e1 = _mm256_fmadd_ps(_mm256_load_ps(r3 + i + 8), qb, e1);
        }
        if (i < d) {
            __m256 qa = _mm256_loadu_ps(q + i);
            a0 = _mm256_fmadd_ps(_mm256_load_ps(r0 + i), qa, a0);
            b0 = _mm256_fmadd_ps(_mm256_load_ps(r1 + i), qa, b0);
            c0 = _mm256_fmadd_ps(_mm256_load_ps(r2 + i), qa, c0);
            e0 = _mm256_fmadd_ps(_mm256_load_ps(r3 + i), qa, e0);
        }
        __m128 s = hsum8x4(_mm256_add_ps(a0, a1), _mm256_add_ps(b0, b1), _mm256_add_ps(c0, c1),
                           _mm256_add_ps(e0, e1));
        _mm_storeu_ps(out + j, _mm_mul_ps(sc, s));
    }
    for (; j < m; j++) {
        const float *r = kf + (size_t)j * d;
        __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
        int i = 0;
        for (; i + 16 <= d; i += 16) {
            s0 = _mm256_fmadd_ps(_mm256_load_ps(r + i), _mm256_loadu_ps(q + i), s0);
            s1 = _mm256_fmadd_ps(_mm256_load_ps(r + i + 8), _mm256_loadu_ps(q + i + 8), s1);
        }
        if (i < d)
            s0 = _mm256_fmadd_ps(_mm256_load_ps(r + i), _mm256_loadu_ps(q + i), s0);
        out[j] = scale * hsum8(_mm256_add_ps(s0, s1));
    }
}

void rlai__attn_dot_f16_multi_avx2(int m, int d, const uint16_t *k, size_t stride, int nq, const float *const *q,
                                   float scale, float *const *out)
{
    if (d % 8 != 0 || d > 256 || nq < 2) {
        for (int qi = 0; qi < nq; qi++)
            rlai__attn_dot_f16_avx2(m, d, k, stride, q[qi], scale, out[qi]);
        return;
    }
    _Alignas(32) float kf[MULTI_ROWS * 256];
    for (int j0 = 0; j0 < m; j0 += MULTI_ROWS) {
        int mb = m - j0 < MULTI_ROWS ? m - j0 : MULTI_ROWS;
        block_to_f32(mb, d, k + (size_t)j0 * stride, stride, kf);
        for (int qi = 0; qi < nq; qi++)
            dot_rows_f32(mb, d, kf, q[qi], scale, out[qi] + j0);
    }
}

/* mad_f16_rows over rows already converted to f32 (8nv floats each,
 * aligned): the same FMAs on the same values. */
AI void mad_f32_rows(const int nv, int n, const float *vf, const float *p, float *y)
{
    __m256 acc[16];
    for (int c = 0; c < nv; c++)
        acc[c] = _mm256_loadu_ps(y + 8 * c);
    for (int j = 0; j < n; j++) {
        __m256 pj = _mm256_set1_ps(p[j]);
        const float *r = vf + (size_t)j * 8 * nv;
        for (int c = 0; c < nv; c++)
            acc[c] = _mm256_fmadd_ps(pj, _mm256_load_ps(r + 8 * c), acc[c]);
    }
    for (int c = 0; c < nv; c++)
        _mm256_storeu_ps(y + 8 * c, acc[c]);
}

void rlai__attn_mad_f16_multi_avx2(int m, int d, const uint16_t *v, size_t stride, int nq, const int *mq,
                                   const float *const *p, float *const *y)
{
    if (d % 8 != 0 || d > 128 || nq < 2) {
        for (int qi = 0; qi < nq; qi++)
            rlai__attn_mad_f16_avx2(mq[qi] < m ? mq[qi] : m, d, v, stride, p[qi], y[qi]);
        return;
    }
    _Alignas(32) float vf[MULTI_ROWS * 128];
    const int nv = d / 8;
    for (int j0 = 0; j0 < m; j0 += MULTI_ROWS) {
        int mb = m - j0 < MULTI_ROWS ? m - j0 : MULTI_ROWS;
        block_to_f32(mb, d, v + (size_t)j0 * stride, stride, vf);
        for (int qi = 0; qi < nq; qi++) {
            int n = (mq[qi] < m ? mq[qi] : m) - j0;
            n = n < mb ? n : mb;
            if (n <= 0)
                continue;
            if (nv == 8)
                mad_f32_rows(8, n, vf, p[qi] + j0, y[qi]);   /* d = 64: constant trip count */
            else
                mad_f32_rows(nv, n, vf, p[qi] + j0, y[qi]);
        }
    }
}

/* ---- SwiGLU with glibc's expf (kernels_impl.h), 4 lanes in double. */

/* e^x for 4 floats in [RLAI_EXPF_LO, RLAI_EXPF_HI], still in double:
 * rlai__expf_ref's operations lane by lane. */
AI __m256d expf_pd4(__m128 x)
{
    const __m256d inv = _mm256_set1_pd(RLAI_EXPF_INVLN2N), sh = _mm256_set1_pd(RLAI_EXPF_SHIFT);
    __m256d xd = _mm256_cvtps_pd(x);
    __m256d kd = _mm256_fmadd_pd(inv, xd, sh);
    __m256i ki = _mm256_castpd_si256(kd);
    kd = _mm256_sub_pd(kd, sh);
    __m256d r = _mm256_fmsub_pd(inv, xd, kd);
    __m256i idx = _mm256_and_si256(ki, _mm256_set1_epi64x(31));
    __m256i t = _mm256_i64gather_epi64((const long long *)(const void *)rlai__expf_tab, idx, 8);
    t = _mm256_add_epi64(t, _mm256_slli_epi64(ki, 47));
    __m256d p = _mm256_fmadd_pd(_mm256_set1_pd(RLAI_EXPF_C0), r, _mm256_set1_pd(RLAI_EXPF_C1));
    __m256d r2 = _mm256_mul_pd(r, r);
    __m256d y = _mm256_fmadd_pd(_mm256_set1_pd(RLAI_EXPF_C2), r, _mm256_set1_pd(1.0));
    y = _mm256_fmadd_pd(p, r2, y);
    return _mm256_mul_pd(y, _mm256_castsi256_pd(t));
}

static void swiglu_ref(size_t n, float *gate, const float *up)
{
    for (size_t i = 0; i < n; i++)
        gate[i] = gate[i] / (1.0f + rlai__expf_ref(-gate[i])) * up[i];
}

void rlai__swiglu_avx2(size_t n, float *gate, const float *up)
{
    const __m256 lo = _mm256_set1_ps(RLAI_EXPF_LO), hi = _mm256_set1_ps(RLAI_EXPF_HI);
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 g = _mm256_loadu_ps(gate + i);
        __m256 x = _mm256_xor_ps(g, sign);
        /* NaN, or outside the range of the polynomial path: the reference */
        __m256 out = _mm256_or_ps(_mm256_cmp_ps(x, lo, _CMP_NGE_UQ), _mm256_cmp_ps(x, hi, _CMP_NLE_UQ));
        if (_mm256_movemask_ps(out)) {
            swiglu_ref(8, gate + i, up + i);
            continue;
        }
        __m128 e0 = _mm256_cvtpd_ps(expf_pd4(_mm256_castps256_ps128(x)));
        __m128 e1 = _mm256_cvtpd_ps(expf_pd4(_mm256_extractf128_ps(x, 1)));
        __m256 e = _mm256_set_m128(e1, e0);
        __m256 y = _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), _mm256_loadu_ps(up + i));
        _mm256_storeu_ps(gate + i, y);
    }
    swiglu_ref(n - i, gate + i, up + i);
}
