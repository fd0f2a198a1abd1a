/* kernels_avx512.c - AVX-512 (F/BW/VL/DQ, optional VNNI) kernels.
 *
 * UNVERIFIED: the development machine has no AVX-512, so this file is only
 * compiled here, never executed. kernels.c selects it only when cpuid and
 * XCR0 report AVX-512F/BW/VL/DQ with OS-enabled ZMM state, and this code
 * uses vpdpbusd only when j->vnni is set (cpuid AVX512_VNNI).
 *
 * Implemented here: the quantized decode matvec (T == 1) for Q4_0, Q4_1
 * and Q8_0, two blocks per 512-bit register. Everything else (T > 1
 * tiles, Q5_x, the f32 path) delegates to the AVX2 kernels, which are
 * valid on any AVX-512 CPU. Numerics follow the same convention as the
 * AVX2 code (kernels_impl.h): unsigned nibbles with a per-block m term
 * (Q4_0: m = -8d), Q8_0 signed. No plain C integer dot loops live in this
 * file so the compiler cannot emit VNNI instructions behind our back. */
#include "kernels_impl.h"
#include "dtype.h"

#include <immintrin.h>
#include <string.h>

#define AI __attribute__((always_inline)) static inline

AI uint16_t ld16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

AI __m256i nibbles256(const uint8_t *qs)
{
    __m128i q = _mm_loadu_si128((const __m128i *)qs);
    __m256i v = _mm256_set_m128i(_mm_srli_epi16(q, 4), q);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
}

/* Two consecutive blocks' unpacked 4-bit weights (64 bytes). */
AI __m512i nibbles512(const uint8_t *qs0, const uint8_t *qs1)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(nibbles256(qs0)), nibbles256(qs1), 1);
}

/* Per-32-lane-group i32 sums of u8 x s8 products. */
AI __m512i dot_u8s8(__m512i u, __m512i s, bool vnni)
{
    if (vnni)
        return _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, s);
    return _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1));
}

AI __m512 scale2(float s0, float s1)
{
    return _mm512_insertf32x8(_mm512_set1_ps(s0), _mm256_set1_ps(s1), 1);
}

AI float hsum256(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* One block with 256-bit ops (odd block count tail). */
AI __m256 tail_u8(const uint8_t *qs, const int8_t *xq, float sc)
{
    __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(nibbles256(qs),
                                  _mm256_loadu_si256((const __m256i *)xq)), _mm256_set1_epi16(1));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(sc));
}

static void mv_q4(const rlai_mm_job *j, bool q4_1, int64_t r0, int64_t r1, int t)
{
    const size_t bs = q4_1 ? sizeof(rlai_block_q4_1) : sizeof(rlai_block_q4_0);
    const size_t qoff = q4_1 ? 4 : 2;
    const int64_t nb = j->nb;
    const int8_t *xq = j->act->q + (size_t)t * (size_t)j->cols;
    const float *ds = j->act->ds + (size_t)t * (size_t)nb * 2;
    float *y = j->y + (size_t)t * (size_t)j->ldy;
    const bool vnni = j->vnni;

    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *w = j->w + (size_t)r * j->row_bytes;
        __m512 acc = _mm512_setzero_ps();
        float macc = 0.0f;
        int64_t b = 0;
        for (; b + 2 <= nb; b += 2) {
            const uint8_t *b0 = w + (size_t)b * bs, *b1 = b0 + bs;
            float d0 = _cvtsh_ss(ld16(b0)), d1 = _cvtsh_ss(ld16(b1));
            float m0 = q4_1 ? _cvtsh_ss(ld16(b0 + 2)) : -8.0f * d0;
            float m1 = q4_1 ? _cvtsh_ss(ld16(b1 + 2)) : -8.0f * d1;
            __m512i u = nibbles512(b0 + qoff, b1 + qoff);
            __m512i x = _mm512_loadu_si512((const void *)(xq + 32 * b));
            __m512i p = dot_u8s8(u, x, vnni);
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p),
                                  scale2(d0 * ds[2 * b], d1 * ds[2 * b + 2]), acc);
            macc += m0 * ds[2 * b + 1] + m1 * ds[2 * b + 3];
        }
        float s = _mm512_reduce_add_ps(acc);
        if (b < nb) {
            const uint8_t *b0 = w + (size_t)b * bs;
            float d0 = _cvtsh_ss(ld16(b0));
            float m0 = q4_1 ? _cvtsh_ss(ld16(b0 + 2)) : -8.0f * d0;
            s += hsum256(tail_u8(b0 + qoff, xq + 32 * b, d0 * ds[2 * b]));
            macc += m0 * ds[2 * b + 1];
        }
        y[r] = s + macc;
    }
}

static void mv_q8(const rlai_mm_job *j, int64_t r0, int64_t r1, int t)
{
    const size_t bs = sizeof(rlai_block_q8_0);
    const int64_t nb = j->nb;
    const int8_t *xq = j->act->q + (size_t)t * (size_t)j->cols;
    const float *ds = j->act->ds + (size_t)t * (size_t)nb * 2;
    float *y = j->y + (size_t)t * (size_t)j->ldy;
    const bool vnni = j->vnni;

    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *w = j->w + (size_t)r * j->row_bytes;
        __m512 acc = _mm512_setzero_ps();
        int64_t b = 0;
        for (; b + 2 <= nb; b += 2) {
            const uint8_t *b0 = w + (size_t)b * bs, *b1 = b0 + bs;
            __m512i wv = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(b0 + 2))),
                _mm256_loadu_si256((const __m256i *)(b1 + 2)), 1);
            __m512i x = _mm512_loadu_si512((const void *)(xq + 32 * b));
            /* w*x = |w| * (x negated where w < 0) */
            __mmask64 neg = _mm512_movepi8_mask(wv);
            __m512i sx = _mm512_mask_sub_epi8(x, neg, _mm512_setzero_si512(), x);
            __m512i p = dot_u8s8(_mm512_abs_epi8(wv), sx, vnni);
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p),
                                  scale2(_cvtsh_ss(ld16(b0)) * ds[2 * b],
                                         _cvtsh_ss(ld16(b1)) * ds[2 * b + 2]), acc);
        }
        float s = _mm512_reduce_add_ps(acc);
        if (b < nb) {
            const uint8_t *b0 = w + (size_t)b * bs;
            __m256i wv = _mm256_loadu_si256((const __m256i *)(b0 + 2));
            __m256i x = _mm256_loadu_si256((const __m256i *)(xq + 32 * b));
            __m256i p = _mm256_maddubs_epi16(_mm256_abs_epi8(wv), _mm256_sign_epi8(x, wv));
            p = _mm256_madd_epi16(p, _mm256_set1_epi16(1));
            s += hsum256(_mm256_mul_ps(_mm256_cvtepi32_ps(p),
                                       _mm256_set1_ps(_cvtsh_ss(ld16(b0)) * ds[2 * b])));
        }
        y[r] = s;
    }
}

void rlai__mm_avx512(const rlai_mm_job *j, int64_t r0, int64_t r1, int t0, int t1, void *scratch)
{
    bool own = j->act && (t1 - t0 == 1 || !j->act->dv) &&
               (j->type == RLAI_DT_Q4_0 || j->type == RLAI_DT_Q4_1 || j->type == RLAI_DT_Q8_0);
    if (!own) {
        rlai__mm_avx2(j, r0, r1, t0, t1, scratch);
        return;
    }
    for (int t = t0; t < t1; t++) {
        if (j->type == RLAI_DT_Q8_0)
            mv_q8(j, r0, r1, t);
        else
            mv_q4(j, j->type == RLAI_DT_Q4_1, r0, r1, t);
    }
}
