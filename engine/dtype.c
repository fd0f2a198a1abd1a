/* dtype.c - ggml element types: sizes, scalar half/bfloat conversions,
 * reference dequantizers and quantizers.
 *
 * Everything here is portable scalar C; the SIMD kernels in kernels_*.c
 * must produce the same numbers as these functions (the tests compare
 * them). Block layouts: shared/reference/llama-gguf-facts.md §2. */
#include "dtype.h"

#include <math.h>
#include <string.h>

/* ------------------------------------------------------------------ */
/* type table                                                          */

bool rlai_dtype_supported(uint32_t t)
{
    switch (t) {
    case RLAI_DT_F32: case RLAI_DT_F16: case RLAI_DT_BF16:
    case RLAI_DT_Q4_0: case RLAI_DT_Q4_1: case RLAI_DT_Q5_0:
    case RLAI_DT_Q5_1: case RLAI_DT_Q8_0:
        return true;
    default:
        return false;
    }
}

const char *rlai_dtype_name(uint32_t t)
{
    switch (t) {
    case RLAI_DT_F32: return "f32";
    case RLAI_DT_F16: return "f16";
    case RLAI_DT_BF16: return "bf16";
    case RLAI_DT_Q4_0: return "q4_0";
    case RLAI_DT_Q4_1: return "q4_1";
    case RLAI_DT_Q5_0: return "q5_0";
    case RLAI_DT_Q5_1: return "q5_1";
    case RLAI_DT_Q8_0: return "q8_0";
    case RLAI_DT_Q8_1: return "q8_1";
    default: return "unknown";
    }
}

size_t rlai_dtype_block_elems(uint32_t t)
{
    switch (t) {
    case RLAI_DT_F32: case RLAI_DT_F16: case RLAI_DT_BF16:
        return 1;
    case RLAI_DT_Q4_0: case RLAI_DT_Q4_1: case RLAI_DT_Q5_0:
    case RLAI_DT_Q5_1: case RLAI_DT_Q8_0: case RLAI_DT_Q8_1:
        return RLAI_QK;
    default:
        return 0;
    }
}

size_t rlai_dtype_block_bytes(uint32_t t)
{
    switch (t) {
    case RLAI_DT_F32: return 4;
    case RLAI_DT_F16: return 2;
    case RLAI_DT_BF16: return 2;
    case RLAI_DT_Q4_0: return sizeof(rlai_block_q4_0);
    case RLAI_DT_Q4_1: return sizeof(rlai_block_q4_1);
    case RLAI_DT_Q5_0: return sizeof(rlai_block_q5_0);
    case RLAI_DT_Q5_1: return sizeof(rlai_block_q5_1);
    case RLAI_DT_Q8_0: return sizeof(rlai_block_q8_0);
    case RLAI_DT_Q8_1: return sizeof(rlai_block_q8_1);
    default: return 0;
    }
}

_Static_assert(sizeof(rlai_block_q4_0) == 18, "q4_0 layout");
_Static_assert(sizeof(rlai_block_q4_1) == 20, "q4_1 layout");
_Static_assert(sizeof(rlai_block_q5_0) == 22, "q5_0 layout");
_Static_assert(sizeof(rlai_block_q5_1) == 24, "q5_1 layout");
_Static_assert(sizeof(rlai_block_q8_0) == 34, "q8_0 layout");
_Static_assert(sizeof(rlai_block_q8_1) == 36, "q8_1 layout");

size_t rlai_dtype_row_bytes(uint32_t t, int64_t n)
{
    size_t be = rlai_dtype_block_elems(t);
    if (be == 0 || n < 0 || (uint64_t)n % be != 0)
        return 0;
    return (size_t)((uint64_t)n / be) * rlai_dtype_block_bytes(t);
}

/* ------------------------------------------------------------------ */
/* half and bfloat16                                                   */

static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float rlai_fp16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1Fu;
    uint32_t man = h & 0x3FFu;

    if (exp == 0x1F) {                     /* inf / nan: keep payload, quiet the nan */
        if (man)
            return bits_f32(sign | 0x7FC00000u | (man << 13));
        return bits_f32(sign | 0x7F800000u);
    }
    if (exp == 0) {
        if (man == 0)
            return bits_f32(sign);
        /* subnormal: man * 2^-24, exact in f32 */
        float v = (float)man * 0x1p-24f;
        return sign ? -v : v;
    }
    return bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

uint16_t rlai_f32_to_fp16(float f)
{
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7FFFFFFFu;

    if (ax >= 0x7F800000u) {               /* inf or nan */
        if (ax == 0x7F800000u)
            return sign | 0x7C00u;
        /* quiet nan, keep the top payload bits */
        return (uint16_t)(sign | 0x7E00u | ((ax >> 13) & 0x3FFu));
    }
    if (ax >= 0x477FF000u)                 /* >= 65520: rounds to inf */
        return sign | 0x7C00u;
    if (ax < 0x38800000u) {                /* below 2^-14: subnormal or zero */
        if (ax < 0x33000000u)              /* <= 2^-25: rounds to zero (tie to even 0) */
            return sign;
        /* value = m * 2^(e-150) with implicit bit; result units of 2^-24 */
        uint32_t e = ax >> 23;
        uint32_t m = (ax & 0x7FFFFFu) | 0x800000u;
        uint32_t shift = 126u - e;         /* 14..25 for e in 101..112 */
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (q & 1u)))
            q++;
        return (uint16_t)(sign | q);       /* q may carry into the normal range: fine */
    }
    /* normal range: rebias exponent, round mantissa 23 -> 10 bits */
    uint32_t r = ax - 0x38000000u;         /* exponent 127 -> 15 */
    uint32_t q = r >> 13;
    uint32_t rem = r & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (q & 1u)))
        q++;                               /* carry into exponent is correct rounding */
    return (uint16_t)(sign | q);
}

float rlai_bf16_to_f32(uint16_t h)
{
    return bits_f32((uint32_t)h << 16);
}

uint16_t rlai_f32_to_bf16(float f)
{
    uint32_t x = f32_bits(f);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u)   /* nan: force quiet */
        return (uint16_t)((x >> 16) | 0x40u);
    uint32_t lsb = (x >> 16) & 1u;
    x += 0x7FFFu + lsb;                    /* round to nearest even */
    return (uint16_t)(x >> 16);
}

/* ------------------------------------------------------------------ */
/* dequantization                                                      */

static inline uint16_t rd16(const uint16_t *p)
{
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline uint32_t rd_qh(const uint8_t qh[4])
{
    return (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
}

void rlai_dequantize_row(uint32_t t, const void *src, float *dst, int64_t n)
{
    const uint8_t *p = src;
    int64_t nb = n / RLAI_QK;

    switch (t) {
    case RLAI_DT_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    case RLAI_DT_F16:
        for (int64_t i = 0; i < n; i++)
            dst[i] = rlai_fp16_to_f32(rd16((const uint16_t *)(p + 2 * i)));
        return;
    case RLAI_DT_BF16:
        for (int64_t i = 0; i < n; i++)
            dst[i] = rlai_bf16_to_f32(rd16((const uint16_t *)(p + 2 * i)));
        return;
    case RLAI_DT_Q4_0:
        for (int64_t b = 0; b < nb; b++, p += sizeof(rlai_block_q4_0), dst += RLAI_QK) {
            rlai_block_q4_0 blk;
            memcpy(&blk, p, sizeof blk);
            float d = rlai_fp16_to_f32(blk.d);
            for (int j = 0; j < 16; j++) {
                dst[j] = (float)((blk.qs[j] & 0xF) - 8) * d;
                dst[j + 16] = (float)((blk.qs[j] >> 4) - 8) * d;
            }
        }
        return;
    case RLAI_DT_Q4_1:
        for (int64_t b = 0; b < nb; b++, p += sizeof(rlai_block_q4_1), dst += RLAI_QK) {
            rlai_block_q4_1 blk;
            memcpy(&blk, p, sizeof blk);
            float d = rlai_fp16_to_f32(blk.d), m = rlai_fp16_to_f32(blk.m);
            for (int j = 0; j < 16; j++) {
                dst[j] = (float)(blk.qs[j] & 0xF) * d + m;
                dst[j + 16] = (float)(blk.qs[j] >> 4) * d + m;
            }
        }
        return;
    case RLAI_DT_Q5_0:
        for (int64_t b = 0; b < nb; b++, p += sizeof(rlai_block_q5_0), dst += RLAI_QK) {
            rlai_block_q5_0 blk;
            memcpy(&blk, p, sizeof blk);
            float d = rlai_fp16_to_f32(blk.d);
            uint32_t qh = rd_qh(blk.qh);
            for (int j = 0; j < 16; j++) {
                int lo = (blk.qs[j] & 0xF) | (int)((qh >> j) & 1u) << 4;
                int hi = (blk.qs[j] >> 4) | (int)((qh >> (j + 16)) & 1u) << 4;
                dst[j] = (float)(lo - 16) * d;
                dst[j + 16] = (float)(hi - 16) * d;
            }
        }
        return;
    case RLAI_DT_Q5_1:
        for (int64_t b = 0; b < nb; b++, p += sizeof(rlai_block_q5_1), dst += RLAI_QK) {
            rlai_block_q5_1 blk;
            memcpy(&blk, p, sizeof blk);
            float d = rlai_fp16_to_f32(blk.d), m = rlai_fp16_to_f32(blk.m);
            uint32_t qh = rd_qh(blk.qh);
            for (int j = 0; j < 16; j++) {
                int lo = (blk.qs[j] & 0xF) | (int)((qh >> j) & 1u) << 4;
                int hi = (blk.qs[j] >> 4) | (int)((qh >> (j + 16)) & 1u) << 4;
                dst[j] = (float)lo * d + m;
                dst[j + 16] = (float)hi * d + m;
            }
        }
        return;
    case RLAI_DT_Q8_0:
        for (int64_t b = 0; b < nb; b++, p += sizeof(rlai_block_q8_0), dst += RLAI_QK) {
            rlai_block_q8_0 blk;
            memcpy(&blk, p, sizeof blk);
            float d = rlai_fp16_to_f32(blk.d);
            for (int j = 0; j < RLAI_QK; j++)
                dst[j] = (float)blk.qs[j] * d;
        }
        return;
    case RLAI_DT_Q8_1:
        for (int64_t b = 0; b < nb; b++, p += sizeof(rlai_block_q8_1), dst += RLAI_QK) {
            rlai_block_q8_1 blk;
            memcpy(&blk, p, sizeof blk);
            float d = rlai_fp16_to_f32(blk.d);
            for (int j = 0; j < RLAI_QK; j++)
                dst[j] = (float)blk.qs[j] * d;
        }
        return;
    default:
        /* unknown type: nothing sensible to write; leave dst zeroed */
        memset(dst, 0, (size_t)n * sizeof(float));
        return;
    }
}

/* ------------------------------------------------------------------ */
/* reference quantizers (ggml semantics)                               */

/* Clamps in float before converting so NaN/out-of-range inputs are
 * never undefined behaviour; truncates like ggml's (int8_t) casts. */
static inline int trunc_clamp(float v, int hi)
{
    if (!(v > 0.0f))
        return 0;
    if (v >= (float)hi)
        return hi;
    return (int)v;
}

static void quant_q4_0(const float *x, rlai_block_q4_0 *y)
{
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < RLAI_QK; j++) {
        float a = fabsf(x[j]);
        if (a > amax) { amax = a; max = x[j]; }
    }
    float d = max / -8.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    y->d = rlai_f32_to_fp16(d);
    for (int j = 0; j < 16; j++) {
        int q0 = trunc_clamp(x[j] * id + 8.5f, 15);
        int q1 = trunc_clamp(x[j + 16] * id + 8.5f, 15);
        y->qs[j] = (uint8_t)(q0 | q1 << 4);
    }
}

static void quant_q4_1(const float *x, rlai_block_q4_1 *y)
{
    float min = x[0], max = x[0];
    for (int j = 1; j < RLAI_QK; j++) {
        if (x[j] < min) min = x[j];
        if (x[j] > max) max = x[j];
    }
    float d = (max - min) / 15.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    y->d = rlai_f32_to_fp16(d);
    y->m = rlai_f32_to_fp16(min);
    for (int j = 0; j < 16; j++) {
        int q0 = trunc_clamp((x[j] - min) * id + 0.5f, 15);
        int q1 = trunc_clamp((x[j + 16] - min) * id + 0.5f, 15);
        y->qs[j] = (uint8_t)(q0 | q1 << 4);
    }
}

static void put_qh(uint8_t dst[4], uint32_t qh)
{
    dst[0] = (uint8_t)qh; dst[1] = (uint8_t)(qh >> 8);
    dst[2] = (uint8_t)(qh >> 16); dst[3] = (uint8_t)(qh >> 24);
}

static void quant_q5_0(const float *x, rlai_block_q5_0 *y)
{
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < RLAI_QK; j++) {
        float a = fabsf(x[j]);
        if (a > amax) { amax = a; max = x[j]; }
    }
    float d = max / -16.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    uint32_t qh = 0;
    y->d = rlai_f32_to_fp16(d);
    for (int j = 0; j < 16; j++) {
        int q0 = trunc_clamp(x[j] * id + 16.5f, 31);
        int q1 = trunc_clamp(x[j + 16] * id + 16.5f, 31);
        y->qs[j] = (uint8_t)((q0 & 0xF) | (q1 & 0xF) << 4);
        qh |= (uint32_t)(q0 >> 4) << j;
        qh |= (uint32_t)(q1 >> 4) << (j + 16);
    }
    put_qh(y->qh, qh);
}

static void quant_q5_1(const float *x, rlai_block_q5_1 *y)
{
    float min = x[0], max = x[0];
    for (int j = 1; j < RLAI_QK; j++) {
        if (x[j] < min) min = x[j];
        if (x[j] > max) max = x[j];
    }
    float d = (max - min) / 31.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    uint32_t qh = 0;
    y->d = rlai_f32_to_fp16(d);
    y->m = rlai_f32_to_fp16(min);
    for (int j = 0; j < 16; j++) {
        int q0 = trunc_clamp((x[j] - min) * id + 0.5f, 31);
        int q1 = trunc_clamp((x[j + 16] - min) * id + 0.5f, 31);
        y->qs[j] = (uint8_t)((q0 & 0xF) | (q1 & 0xF) << 4);
        qh |= (uint32_t)(q0 >> 4) << j;
        qh |= (uint32_t)(q1 >> 4) << (j + 16);
    }
    put_qh(y->qh, qh);
}

/* Q8 rounding: roundf (half away from zero) as in ggml's reference,
 * clamped to [-127, 127]; NaN maps to 0. */
static inline int8_t q8_round(float v)
{
    if (v != v)
        return 0;
    float r = roundf(v);
    if (r > 127.0f)
        r = 127.0f;
    if (r < -127.0f)
        r = -127.0f;
    return (int8_t)r;
}

static float quant_q8(const float *x, int8_t *qs, int *sum)
{
    float amax = 0.0f;
    for (int j = 0; j < RLAI_QK; j++) {
        float a = fabsf(x[j]);
        if (a > amax) amax = a;
    }
    float d = amax / 127.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    int s = 0;
    for (int j = 0; j < RLAI_QK; j++) {
        qs[j] = q8_round(x[j] * id);
        s += qs[j];
    }
    *sum = s;
    return d;
}

void rlai_quantize_row(uint32_t t, const float *src, void *dst, int64_t n)
{
    uint8_t *p = dst;
    int64_t nb = n / RLAI_QK;

    switch (t) {
    case RLAI_DT_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    case RLAI_DT_F16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = rlai_f32_to_fp16(src[i]);
            memcpy(p + 2 * i, &h, 2);
        }
        return;
    case RLAI_DT_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = rlai_f32_to_bf16(src[i]);
            memcpy(p + 2 * i, &h, 2);
        }
        return;
    default:
        break;
    }

    for (int64_t b = 0; b < nb; b++, src += RLAI_QK) {
        switch (t) {
        case RLAI_DT_Q4_0: {
            rlai_block_q4_0 y;
            quant_q4_0(src, &y);
            memcpy(p, &y, sizeof y);
            p += sizeof y;
            break;
        }
        case RLAI_DT_Q4_1: {
            rlai_block_q4_1 y;
            quant_q4_1(src, &y);
            memcpy(p, &y, sizeof y);
            p += sizeof y;
            break;
        }
        case RLAI_DT_Q5_0: {
            rlai_block_q5_0 y;
            quant_q5_0(src, &y);
            memcpy(p, &y, sizeof y);
            p += sizeof y;
            break;
        }
        case RLAI_DT_Q5_1: {
            rlai_block_q5_1 y;
            quant_q5_1(src, &y);
            memcpy(p, &y, sizeof y);
            p += sizeof y;
            break;
        }
        case RLAI_DT_Q8_0: {
            rlai_block_q8_0 y;
            int s;
            y.d = rlai_f32_to_fp16(quant_q8(src, y.qs, &s));
            memcpy(p, &y, sizeof y);
            p += sizeof y;
            break;
        }
        case RLAI_DT_Q8_1: {
            rlai_block_q8_1 y;
            int s;
            float d = quant_q8(src, y.qs, &s);
            y.d = rlai_f32_to_fp16(d);
            y.s = rlai_f32_to_fp16(d * (float)s);
            memcpy(p, &y, sizeof y);
            p += sizeof y;
            break;
        }
        default:
            return;   /* unknown type: leave dst untouched */
        }
    }
}
