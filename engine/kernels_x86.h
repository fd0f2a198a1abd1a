/* kernels_x86.h - horizontal sums shared by kernels_avx2.c and
 * kernels_avx512.c (include only from files built with -mavx2). Their
 * addition orders are part of the canonical float sequences that make
 * every kernel level bit-identical (kernels.c's scalar helpers repeat
 * them), so there is one copy. */
#ifndef RLAI_KERNELS_X86_H
#define RLAI_KERNELS_X86_H

#include <immintrin.h>

/* (v0+v4 + v2+v6) + (v1+v5 + v3+v7) */
static inline __attribute__((always_inline)) float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* hsum8 of four vectors at once: {hsum8(a), hsum8(b), hsum8(c), hsum8(d)}
 * with each sum's additions exactly those of hsum8 (lo+hi halves, then
 * lanes 0+2 and 1+3, then those two). */
static inline __attribute__((always_inline)) __m128 hsum8x4(__m256 a, __m256 b, __m256 c, __m256 d)
{
    __m256 tab = _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
    __m256 tcd = _mm256_add_ps(_mm256_permute2f128_ps(c, d, 0x20), _mm256_permute2f128_ps(c, d, 0x31));
    __m256 u = _mm256_add_ps(_mm256_shuffle_ps(tab, tcd, _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm256_shuffle_ps(tab, tcd, _MM_SHUFFLE(3, 2, 3, 2)));
    __m256 r = _mm256_add_ps(_mm256_shuffle_ps(u, u, _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm256_shuffle_ps(u, u, _MM_SHUFFLE(3, 1, 3, 1)));
    /* r = [ra, rc, ra, rc | rb, rd, rb, rd] */
    return _mm_unpacklo_ps(_mm256_castps256_ps128(r), _mm256_extractf128_ps(r, 1));
}

#endif
