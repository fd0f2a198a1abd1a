/* test_dtype.c - element types: sizes, half/bfloat conversions, reference
 * dequantizers (hand-built blocks) and quantize->dequantize error bounds. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"

static uint32_t fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bitsf(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* deterministic PRNG (xorshift64*) */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd64(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ull;
}
static float rndf(float lo, float hi)
{
    return lo + (hi - lo) * (float)((rnd64() >> 40) * (1.0 / 16777216.0));
}

/* ------------------------------------------------------------------ */

START_TEST(test_sizes_names)
{
    ck_assert(rlai_dtype_supported(RLAI_DT_F32));
    ck_assert(rlai_dtype_supported(RLAI_DT_BF16));
    ck_assert(rlai_dtype_supported(RLAI_DT_Q5_1));
    ck_assert(!rlai_dtype_supported(RLAI_DT_Q8_1));   /* activation-only */
    ck_assert(!rlai_dtype_supported(12));
    ck_assert(!rlai_dtype_supported(999));
    ck_assert_str_eq(rlai_dtype_name(RLAI_DT_Q4_1), "q4_1");
    ck_assert_str_eq(rlai_dtype_name(RLAI_DT_BF16), "bf16");
    ck_assert_str_eq(rlai_dtype_name(RLAI_DT_Q8_1), "q8_1");
    ck_assert_str_eq(rlai_dtype_name(77), "unknown");

    const struct { uint32_t t; size_t be, bb; } tab[] = {
        { RLAI_DT_F32, 1, 4 }, { RLAI_DT_F16, 1, 2 }, { RLAI_DT_BF16, 1, 2 },
        { RLAI_DT_Q4_0, 32, 18 }, { RLAI_DT_Q4_1, 32, 20 }, { RLAI_DT_Q5_0, 32, 22 },
        { RLAI_DT_Q5_1, 32, 24 }, { RLAI_DT_Q8_0, 32, 34 }, { RLAI_DT_Q8_1, 32, 36 },
    };
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++) {
        ck_assert_uint_eq(rlai_dtype_block_elems(tab[i].t), tab[i].be);
        ck_assert_uint_eq(rlai_dtype_block_bytes(tab[i].t), tab[i].bb);
        ck_assert_uint_eq(rlai_dtype_row_bytes(tab[i].t, 576), 576 / tab[i].be * tab[i].bb);
    }
    ck_assert_uint_eq(rlai_dtype_row_bytes(RLAI_DT_Q4_1, 33), 0);   /* not a multiple */
    ck_assert_uint_eq(rlai_dtype_row_bytes(RLAI_DT_F16, 33), 66);
    ck_assert_uint_eq(rlai_dtype_row_bytes(1234, 32), 0);
    ck_assert_uint_eq(rlai_dtype_row_bytes(RLAI_DT_Q8_0, -32), 0);
    ck_assert_uint_eq(rlai_dtype_block_elems(55), 0);
    ck_assert_uint_eq(rlai_dtype_block_bytes(55), 0);
}
END_TEST

START_TEST(test_fp16_known)
{
    const struct { float f; uint16_t h; } tab[] = {
        { 0.0f, 0x0000 }, { -0.0f, 0x8000 }, { 1.0f, 0x3C00 }, { -2.0f, 0xC000 },
        { 0.5f, 0x3800 }, { 65504.0f, 0x7BFF }, { -65504.0f, 0xFBFF },
        { 0x1p-14f, 0x0400 },                 /* smallest normal */
        { 0x1p-24f, 0x0001 },                 /* smallest subnormal */
        { 1023 * 0x1p-24f, 0x03FF },          /* largest subnormal */
        { 0.333251953125f, 0x3555 },          /* exact 1/3 approximation */
        { INFINITY, 0x7C00 }, { -INFINITY, 0xFC00 },
    };
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++) {
        ck_assert_uint_eq(rlai_f32_to_fp16(tab[i].f), tab[i].h);
        ck_assert_uint_eq(fbits(rlai_fp16_to_f32(tab[i].h)), fbits(tab[i].f));
    }
    /* rounding to nearest, ties to even */
    ck_assert_uint_eq(rlai_f32_to_fp16(0.1f), 0x2E66);
    ck_assert_uint_eq(rlai_f32_to_fp16(1.0f + 0x1p-11f), 0x3C00);          /* tie -> even (down) */
    ck_assert_uint_eq(rlai_f32_to_fp16(1.0f + 3 * 0x1p-11f), 0x3C02);      /* tie -> even (up) */
    ck_assert_uint_eq(rlai_f32_to_fp16(1.0f + 0x1p-11f + 0x1p-20f), 0x3C01);
    ck_assert_uint_eq(rlai_f32_to_fp16(65519.0f), 0x7BFF);
    ck_assert_uint_eq(rlai_f32_to_fp16(65520.0f), 0x7C00);                 /* tie -> inf */
    ck_assert_uint_eq(rlai_f32_to_fp16(1e10f), 0x7C00);
    ck_assert_uint_eq(rlai_f32_to_fp16(-1e10f), 0xFC00);
    /* subnormal rounding */
    ck_assert_uint_eq(rlai_f32_to_fp16(0x1p-25f), 0x0000);                 /* tie -> 0 */
    ck_assert_uint_eq(rlai_f32_to_fp16(-0x1p-25f), 0x8000);
    ck_assert_uint_eq(rlai_f32_to_fp16(0x1.000002p-25f), 0x0001);
    ck_assert_uint_eq(rlai_f32_to_fp16(3 * 0x1p-25f), 0x0002);             /* 1.5 units: tie -> 2 */
    ck_assert_uint_eq(rlai_f32_to_fp16(5 * 0x1p-25f), 0x0002);             /* 2.5 units: tie -> 2 */
    ck_assert_uint_eq(rlai_f32_to_fp16(1e-10f), 0x0000);
    ck_assert_uint_eq(rlai_f32_to_fp16(2047 * 0x1p-25f), 0x0400);          /* 1023.5 units -> normal */
    ck_assert_uint_eq(rlai_f32_to_fp16(0x1.ffcp-15f), 0x0400);             /* rounds up into normal */
    /* NaN stays NaN (quiet), sign kept */
    uint16_t hn = rlai_f32_to_fp16(NAN);
    ck_assert((hn & 0x7C00) == 0x7C00 && (hn & 0x03FF) != 0 && (hn & 0x0200));
    ck_assert(isnan(rlai_fp16_to_f32(0x7E00)));
    ck_assert(isnan(rlai_fp16_to_f32(0x7C01)));
    ck_assert(isnan(rlai_fp16_to_f32(0xFE00)) && signbit(rlai_fp16_to_f32(0xFE00)));
    ck_assert(isinf(rlai_fp16_to_f32(0x7C00)));
}
END_TEST

/* Exhaustive: every finite half decodes to its value and round-trips. */
START_TEST(test_fp16_exhaustive)
{
    for (uint32_t h = 0; h < 0x10000; h++) {
        uint32_t e = (h >> 10) & 0x1F, m = h & 0x3FF;
        float f = rlai_fp16_to_f32((uint16_t)h);
        if (e == 0x1F) {
            ck_assert(m ? isnan(f) : isinf(f));
            continue;
        }
        double v = e == 0 ? ldexp((double)m, -24) : ldexp(1024.0 + m, (int)e - 25);
        if (h & 0x8000)
            v = -v;
        ck_assert_msg((double)f == v, "h=%04x", h);
        ck_assert_uint_eq(rlai_f32_to_fp16(f), h);
    }
}
END_TEST

/* Random floats: the result is the nearest half, ties to even. */
START_TEST(test_fp16_nearest_random)
{
    for (int i = 0; i < 200000; i++) {
        /* exponents spanning subnormal..overflow range of half */
        float f = bitsf((uint32_t)(rnd64() & 0x807FFFFFu) | (uint32_t)(100 + rnd64() % 44) << 23);
        uint16_t h = rlai_f32_to_fp16(f);
        double a = fabs((double)f);
        if (a >= 65520.0) {
            ck_assert_uint_eq(h & 0x7FFF, 0x7C00);
            continue;
        }
        ck_assert_uint_eq(h & 0x8000, signbit(f) ? 0x8000 : 0);
        uint16_t mag = h & 0x7FFF;
        double v = fabs((double)rlai_fp16_to_f32(mag));
        double err = fabs(a - v);
        double up = mag < 0x7BFF ? fabs(a - fabs((double)rlai_fp16_to_f32(mag + 1))) : INFINITY;
        double dn = mag > 0 ? fabs(a - fabs((double)rlai_fp16_to_f32(mag - 1))) : INFINITY;
        ck_assert_msg(err <= up && err <= dn, "f=%a h=%04x", (double)f, h);
        if (err == up || err == dn)
            ck_assert_msg((mag & 1) == 0, "tie not even: f=%a h=%04x", (double)f, h);
    }
}
END_TEST

START_TEST(test_bf16)
{
    ck_assert_uint_eq(rlai_f32_to_bf16(1.0f), 0x3F80);
    ck_assert_uint_eq(rlai_f32_to_bf16(-2.0f), 0xC000);
    ck_assert_uint_eq(rlai_f32_to_bf16(bitsf(0x3F808000u)), 0x3F80);   /* tie -> even down */
    ck_assert_uint_eq(rlai_f32_to_bf16(bitsf(0x3F818000u)), 0x3F82);   /* tie -> even up */
    ck_assert_uint_eq(rlai_f32_to_bf16(bitsf(0x3F808001u)), 0x3F81);
    ck_assert_uint_eq(rlai_f32_to_bf16(bitsf(0x3F807FFFu)), 0x3F80);
    ck_assert_uint_eq(rlai_f32_to_bf16(INFINITY), 0x7F80);
    ck_assert_uint_eq(rlai_f32_to_bf16(-INFINITY), 0xFF80);
    ck_assert_uint_eq(rlai_f32_to_bf16(bitsf(0x7F7FFFFFu)), 0x7F80);   /* max float rounds to inf */
    ck_assert_uint_eq(rlai_f32_to_bf16(bitsf(0x00000001u)), 0x0000);   /* tiny subnormal */
    ck_assert_uint_eq(rlai_f32_to_bf16(bitsf(0x00018000u)), 0x0002);   /* subnormal tie -> even */
    /* NaN: stays NaN and becomes quiet, even a signalling one whose
     * payload lives only in the low bits */
    uint16_t n1 = rlai_f32_to_bf16(bitsf(0x7F800001u));
    ck_assert((n1 & 0x7F80) == 0x7F80 && (n1 & 0x0040));
    uint16_t n2 = rlai_f32_to_bf16(bitsf(0xFFC00000u));
    ck_assert_uint_eq(n2, 0xFFC0);
    ck_assert(isnan(rlai_bf16_to_f32(n1)));
    ck_assert_uint_eq(fbits(rlai_bf16_to_f32(0x3F80)), 0x3F800000u);
    ck_assert_uint_eq(fbits(rlai_bf16_to_f32(0x8001)), 0x80010000u);
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = rlai_bf16_to_f32((uint16_t)h);
        if (!isnan(f))
            ck_assert_uint_eq(rlai_f32_to_bf16(f), h);
    }
}
END_TEST

/* ------------------------------------------------------------------ */
/* hand-built blocks                                                   */

static void put16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }

START_TEST(test_hand_q4_0)
{
    uint8_t blk[18];
    put16(blk, 0x3800);                         /* d = 0.5 */
    for (int j = 0; j < 16; j++)
        blk[2 + j] = (uint8_t)(j | ((15 - j) << 4));
    float out[32];
    rlai_dequantize_row(RLAI_DT_Q4_0, blk, out, 32);
    /* x[j] = ((qs&15) - 8) * 0.5, x[j+16] = ((qs>>4) - 8) * 0.5 */
    ck_assert(out[0] == -4.0f && out[1] == -3.5f && out[8] == 0.0f && out[15] == 3.5f);
    ck_assert(out[16] == 3.5f && out[17] == 3.0f && out[24] == -0.5f && out[31] == -4.0f);
    for (int j = 0; j < 16; j++) {
        ck_assert(out[j] == (float)(j - 8) * 0.5f);
        ck_assert(out[j + 16] == (float)(7 - j) * 0.5f);
    }
}
END_TEST

START_TEST(test_hand_q4_1)
{
    uint8_t blk[20];
    put16(blk, 0x3400);                         /* d = 0.25 */
    put16(blk + 2, 0xBC00);                     /* m = -1.0 */
    for (int j = 0; j < 16; j++)
        blk[4 + j] = (uint8_t)(((j * 3) % 16) | ((j % 4) << 4));
    float out[32];
    rlai_dequantize_row(RLAI_DT_Q4_1, blk, out, 32);
    ck_assert(out[0] == -1.0f);                 /* 0*0.25 - 1 */
    ck_assert(out[1] == -0.25f);                /* 3*0.25 - 1 */
    ck_assert(out[5] == 2.75f);                 /* 15*0.25 - 1 */
    ck_assert(out[6] == -0.5f);                 /* (18%16=2)*0.25 - 1 */
    ck_assert(out[16] == -1.0f && out[19] == -0.25f && out[23] == -0.25f);
    for (int j = 0; j < 16; j++) {
        ck_assert(out[j] == (float)((j * 3) % 16) * 0.25f - 1.0f);
        ck_assert(out[j + 16] == (float)(j % 4) * 0.25f - 1.0f);
    }
}
END_TEST

START_TEST(test_hand_q5_0)
{
    uint8_t blk[22];
    put16(blk, 0x4000);                         /* d = 2.0 */
    uint32_t qh = 0x80010001u;                  /* bits 0, 16, 31 */
    memcpy(blk + 2, &qh, 4);                    /* little-endian host */
    for (int j = 0; j < 16; j++)
        blk[6 + j] = (uint8_t)(j | (j << 4));
    float out[32];
    rlai_dequantize_row(RLAI_DT_Q5_0, blk, out, 32);
    ck_assert(out[0] == 0.0f);                  /* (0|16 - 16)*2 */
    ck_assert(out[1] == -30.0f);                /* (1 - 16)*2 */
    ck_assert(out[15] == -2.0f);                /* (15-16)*2 */
    ck_assert(out[16] == 0.0f);                 /* (0|16 - 16)*2 */
    ck_assert(out[17] == -30.0f);
    ck_assert(out[31] == 30.0f);                /* (15|16 - 16)*2 */
}
END_TEST

START_TEST(test_hand_q5_1)
{
    uint8_t blk[24];
    put16(blk, 0x3C00);                         /* d = 1.0 */
    put16(blk + 2, 0x4200);                     /* m = 3.0 */
    uint32_t qh = 0x0000FFFFu;                  /* first 16 elements get +16 */
    memcpy(blk + 4, &qh, 4);
    for (int j = 0; j < 16; j++)
        blk[8 + j] = (uint8_t)((15 - j) | (2 << 4));
    float out[32];
    rlai_dequantize_row(RLAI_DT_Q5_1, blk, out, 32);
    ck_assert(out[0] == 34.0f);                 /* (15|16)*1 + 3 */
    ck_assert(out[15] == 19.0f);                /* (0|16) + 3 */
    ck_assert(out[16] == 5.0f && out[31] == 5.0f);   /* 2 + 3 */
    for (int j = 0; j < 16; j++)
        ck_assert(out[j] == (float)(31 - j + 3));
}
END_TEST

START_TEST(test_hand_q8)
{
    uint8_t blk[34];
    put16(blk, 0xB400);                         /* d = -0.25 */
    for (int j = 0; j < 32; j++)
        blk[2 + j] = (uint8_t)(int8_t)(j * 8 - 128);
    float out[32];
    rlai_dequantize_row(RLAI_DT_Q8_0, blk, out, 32);
    ck_assert(out[0] == 32.0f);                 /* -128 * -0.25 */
    ck_assert(out[16] == -0.0f && out[16] == 0.0f);
    ck_assert(out[31] == -30.0f);               /* 120 * -0.25 */

    uint8_t b1[36];
    put16(b1, 0x3800);                          /* d = 0.5 */
    put16(b1 + 2, 0x0000);
    for (int j = 0; j < 32; j++)
        b1[4 + j] = (uint8_t)(int8_t)(j - 16);
    rlai_dequantize_row(RLAI_DT_Q8_1, b1, out, 32);
    ck_assert(out[0] == -8.0f && out[16] == 0.0f && out[31] == 7.5f);
}
END_TEST

START_TEST(test_hand_float_types)
{
    float out[3];
    uint16_t h[3] = { 0x3C00, 0xC500, 0x0001 };   /* 1, -5, 2^-24 */
    rlai_dequantize_row(RLAI_DT_F16, h, out, 3);
    ck_assert(out[0] == 1.0f && out[1] == -5.0f && out[2] == 0x1p-24f);
    uint16_t b[3] = { 0x3F80, 0xC0A0, 0x4049 };   /* 1, -5, 3.140625 */
    rlai_dequantize_row(RLAI_DT_BF16, b, out, 3);
    ck_assert(out[0] == 1.0f && out[1] == -5.0f && out[2] == 3.140625f);
    float f[3] = { 1.5f, -0.0f, 1e30f };
    rlai_dequantize_row(RLAI_DT_F32, f, out, 3);
    ck_assert(memcmp(out, f, sizeof f) == 0);
}
END_TEST

/* ------------------------------------------------------------------ */
/* reference quantizers                                                */

START_TEST(test_quantize_exact)
{
    float x[32];
    uint8_t buf[64];
    float out[32];

    /* Q4_0: integers -8..7 with max |x| = -8 give d = 1, q = x + 8 */
    for (int j = 0; j < 32; j++)
        x[j] = (float)(j % 16 - 8);
    rlai_quantize_row(RLAI_DT_Q4_0, x, buf, 32);
    uint16_t d;
    memcpy(&d, buf, 2);
    ck_assert_uint_eq(d, 0x3C00);
    for (int j = 0; j < 16; j++)
        ck_assert_uint_eq(buf[2 + j], (uint8_t)((j % 16) | (j % 16) << 4));
    rlai_dequantize_row(RLAI_DT_Q4_0, buf, out, 32);
    ck_assert(memcmp(out, x, sizeof x) == 0);

    /* Q4_1: 0..15 -> d = 1, m = 0 */
    for (int j = 0; j < 32; j++)
        x[j] = (float)(j / 2);
    rlai_quantize_row(RLAI_DT_Q4_1, x, buf, 32);
    rlai_dequantize_row(RLAI_DT_Q4_1, buf, out, 32);
    ck_assert(memcmp(out, x, sizeof x) == 0);

    /* Q5_0: -16..15 */
    for (int j = 0; j < 32; j++)
        x[j] = (float)(j - 16);
    rlai_quantize_row(RLAI_DT_Q5_0, x, buf, 32);
    rlai_dequantize_row(RLAI_DT_Q5_0, buf, out, 32);
    ck_assert(memcmp(out, x, sizeof x) == 0);

    /* Q5_1: 10..41 -> d = 1, m = 10 */
    for (int j = 0; j < 32; j++)
        x[j] = (float)(41 - j);
    rlai_quantize_row(RLAI_DT_Q5_1, x, buf, 32);
    rlai_dequantize_row(RLAI_DT_Q5_1, buf, out, 32);
    ck_assert(memcmp(out, x, sizeof x) == 0);

    /* Q8_0: amax 127 -> d = 1; 2.5 rounds away from zero to 3 */
    for (int j = 0; j < 32; j++)
        x[j] = (float)(j * 8 - 127);
    x[5] = 2.5f;
    x[6] = -2.5f;
    rlai_quantize_row(RLAI_DT_Q8_0, x, buf, 32);
    ck_assert_int_eq((int8_t)buf[2], -127);
    ck_assert_int_eq((int8_t)buf[2 + 5], 3);
    ck_assert_int_eq((int8_t)buf[2 + 6], -3);
    ck_assert_int_eq((int8_t)buf[2 + 31], 121);

    /* Q8_1: s = d * sum(q) */
    for (int j = 0; j < 32; j++)
        x[j] = j == 0 ? 127.0f : 1.0f;
    rlai_quantize_row(RLAI_DT_Q8_1, x, buf, 32);
    uint16_t s;
    memcpy(&d, buf, 2);
    memcpy(&s, buf + 2, 2);
    ck_assert_uint_eq(d, 0x3C00);
    ck_assert(rlai_fp16_to_f32(s) == 158.0f);   /* 127 + 31 */

    /* all-zero block: d = 0, values 0 */
    memset(x, 0, sizeof x);
    const uint32_t types[] = { RLAI_DT_Q4_0, RLAI_DT_Q4_1, RLAI_DT_Q5_0, RLAI_DT_Q5_1, RLAI_DT_Q8_0, RLAI_DT_Q8_1 };
    for (size_t i = 0; i < 6; i++) {
        rlai_quantize_row(types[i], x, buf, 32);
        rlai_dequantize_row(types[i], buf, out, 32);
        for (int j = 0; j < 32; j++)
            ck_assert(out[j] == 0.0f);
    }
}
END_TEST

/* Bound on |x - deq(quant(x))| for one block, from the quantizer rules
 * (step d, f16 rounding of d and m: relative 2^-11 each). */
static double block_bound(uint32_t t, const float *x)
{
    double amax = 0, mn = x[0], mx = x[0];
    for (int j = 0; j < 32; j++) {
        amax = fmax(amax, fabs(x[j]));
        mn = fmin(mn, x[j]);
        mx = fmax(mx, x[j]);
    }
    const double u = 0x1p-11, sub = 0x1p-25;   /* f16 relative / subnormal absolute */
#define DERR(d) fmax(fabs(d) * u, sub)
    switch (t) {
    case RLAI_DT_Q4_0: { double d = amax / 8; return d + 8 * DERR(d); }   /* clamp at +8 costs one step */
    case RLAI_DT_Q5_0: { double d = amax / 16; return d + 16 * DERR(d); }
    case RLAI_DT_Q4_1: { double d = (mx - mn) / 15; return d * 0.5 + 15 * DERR(d) + DERR(mn); }
    case RLAI_DT_Q5_1: { double d = (mx - mn) / 31; return d * 0.5 + 31 * DERR(d) + DERR(mn); }
    case RLAI_DT_Q8_0:
    case RLAI_DT_Q8_1: { double d = amax / 127; return d * 0.5 + 127 * DERR(d); }
#undef DERR
    default: return 0;
    }
}

/* block_bound plus slack for f32 rounding inside the quantizer */
static double block_bound_slack(uint32_t t, const float *x)
{
    double amax = 0;
    for (int j = 0; j < 32; j++)
        amax = fmax(amax, fabs(x[j]));
    return block_bound(t, x) * (1.0 + 1e-4) + 1e-6 * amax;
}

START_TEST(test_roundtrip_bounds)
{
    const uint32_t types[] = { RLAI_DT_F32, RLAI_DT_F16, RLAI_DT_BF16, RLAI_DT_Q4_0, RLAI_DT_Q4_1,
                               RLAI_DT_Q5_0, RLAI_DT_Q5_1, RLAI_DT_Q8_0, RLAI_DT_Q8_1 };
    enum { N = 32 * 64 };
    static float x[N], y[N];
    static uint8_t buf[N * 4 + 64];
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        uint32_t t = types[ti];
        for (int rep = 0; rep < 4; rep++) {
            float scale = rep == 0 ? 1.0f : rep == 1 ? 1e-3f : rep == 2 ? 30.0f : 1.0f;
            float off = rep == 3 ? 5.0f : 0.0f;
            for (int i = 0; i < N; i++)
                x[i] = off + scale * rndf(-1.0f, 1.0f);
            rlai_quantize_row(t, x, buf, N);
            rlai_dequantize_row(t, buf, y, N);
            double sum_err = 0, sum_step = 0;
            for (int b = 0; b < N / 32; b++) {
                double bound = rlai_dtype_block_elems(t) == 32 ? block_bound_slack(t, x + 32 * b) : 0;
                for (int j = 0; j < 32; j++) {
                    int i = 32 * b + j;
                    double e = fabs((double)x[i] - y[i]);
                    double lim = t == RLAI_DT_F32 ? 0 : t == RLAI_DT_F16 ? fmax(fabs(x[i]) * 0x1p-11, 0x1p-25)
                               : t == RLAI_DT_BF16 ? fabs(x[i]) * 0x1p-8 : bound;
                    ck_assert_msg(e <= lim, "type %s rep %d i %d: |%g - %g| > %g",
                                  rlai_dtype_name(t), rep, i, (double)x[i], (double)y[i], lim);
                    sum_err += e;
                    sum_step += bound;
                }
            }
            /* on average the error is well below the worst case */
            if (rlai_dtype_block_elems(t) == 32)
                ck_assert_msg(sum_err < 0.7 * sum_step, "%s mean error too large", rlai_dtype_name(t));
        }
    }
}
END_TEST

START_TEST(test_quantize_hostile)
{
    /* NaN / inf / huge values must not crash or trip sanitizers */
    float x[64];
    uint8_t buf[64 * 4];
    float y[64];
    const uint32_t types[] = { RLAI_DT_Q4_0, RLAI_DT_Q4_1, RLAI_DT_Q5_0, RLAI_DT_Q5_1, RLAI_DT_Q8_0, RLAI_DT_Q8_1 };
    for (int i = 0; i < 64; i++)
        x[i] = (float)i;
    x[3] = NAN;
    x[40] = INFINITY;
    x[41] = -1e38f;
    for (size_t i = 0; i < 6; i++) {
        rlai_quantize_row(types[i], x, buf, 64);
        rlai_dequantize_row(types[i], buf, y, 64);
    }
}
END_TEST

static Suite *dtype_suite(void)
{
    Suite *s = suite_create("dtype");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_sizes_names);
    tcase_add_test(tc, test_fp16_known);
    tcase_add_test(tc, test_fp16_exhaustive);
    tcase_add_test(tc, test_fp16_nearest_random);
    tcase_add_test(tc, test_bf16);
    tcase_add_test(tc, test_hand_q4_0);
    tcase_add_test(tc, test_hand_q4_1);
    tcase_add_test(tc, test_hand_q5_0);
    tcase_add_test(tc, test_hand_q5_1);
    tcase_add_test(tc, test_hand_q8);
    tcase_add_test(tc, test_hand_float_types);
    tcase_add_test(tc, test_quantize_exact);
    tcase_add_test(tc, test_roundtrip_bounds);
    tcase_add_test(tc, test_quantize_hostile);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(dtype_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
