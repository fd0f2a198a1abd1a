/* test_unicode.c - general categories, white space and strict UTF-8. */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "unicode.h"

START_TEST(test_categories)
{
    static const struct {
        uint32_t cp;
        enum rlai_ucat cat;
        bool ws;
    } cases[] = {
        {'A', RLAI_UCAT_LETTER, false},   {'z', RLAI_UCAT_LETTER, false},
        {'0', RLAI_UCAT_NUMBER, false},   {'9', RLAI_UCAT_NUMBER, false},
        {'!', RLAI_UCAT_PUNCT, false},    {'\'', RLAI_UCAT_PUNCT, false},
        {'_', RLAI_UCAT_PUNCT, false},    {'$', RLAI_UCAT_SYMBOL, false},
        {'+', RLAI_UCAT_SYMBOL, false},   {'`', RLAI_UCAT_SYMBOL, false},
        {' ', RLAI_UCAT_SEPARATOR, true}, {'\t', RLAI_UCAT_OTHER, true},
        {'\n', RLAI_UCAT_OTHER, true},    {'\r', RLAI_UCAT_OTHER, true},
        {0x0B, RLAI_UCAT_OTHER, true},    {0x0C, RLAI_UCAT_OTHER, true},
        {0x00, RLAI_UCAT_OTHER, false},   {0x1C, RLAI_UCAT_OTHER, false},
        {0x1F, RLAI_UCAT_OTHER, false},   {0x7F, RLAI_UCAT_OTHER, false},
        {0x85, RLAI_UCAT_OTHER, true},    {0xA0, RLAI_UCAT_SEPARATOR, true},   /* NBSP */
        {0xAD, RLAI_UCAT_OTHER, false},   /* soft hyphen, Cf */
        {0xBD, RLAI_UCAT_NUMBER, false},  /* ½ */
        {0xE9, RLAI_UCAT_LETTER, false},  /* é */
        {0xD7, RLAI_UCAT_SYMBOL, false},  /* × */
        {0x0301, RLAI_UCAT_MARK, false},  /* combining acute */
        {0x0664, RLAI_UCAT_NUMBER, false},/* Arabic-Indic digit four */
        {0x0627, RLAI_UCAT_LETTER, false},/* Arabic alef */
        {0x0E01, RLAI_UCAT_LETTER, false},/* Thai ko kai */
        {0x0E31, RLAI_UCAT_MARK, false},  /* Thai mai han-akat */
        {0x1680, RLAI_UCAT_SEPARATOR, true},
        {0x2003, RLAI_UCAT_SEPARATOR, true},
        {0x200B, RLAI_UCAT_OTHER, false}, /* zero width space is Cf, not \s */
        {0x200D, RLAI_UCAT_OTHER, false}, /* ZWJ */
        {0x2028, RLAI_UCAT_SEPARATOR, true},
        {0x2029, RLAI_UCAT_SEPARATOR, true},
        {0x202F, RLAI_UCAT_SEPARATOR, true},
        {0x205F, RLAI_UCAT_SEPARATOR, true},
        {0x2014, RLAI_UCAT_PUNCT, false}, /* em dash */
        {0x20AC, RLAI_UCAT_SYMBOL, false},/* € */
        {0x2164, RLAI_UCAT_NUMBER, false},/* Roman numeral five (Nl) */
        {0x3000, RLAI_UCAT_SEPARATOR, true},
        {0x3001, RLAI_UCAT_PUNCT, false}, /* ideographic comma */
        {0x4E2D, RLAI_UCAT_LETTER, false},/* 中 */
        {0xAC00, RLAI_UCAT_LETTER, false},/* 가 */
        {0xD800, RLAI_UCAT_OTHER, false}, /* surrogate */
        {0xE000, RLAI_UCAT_OTHER, false}, /* private use */
        {0xFE0F, RLAI_UCAT_MARK, false},  /* variation selector 16 */
        {0xFF10, RLAI_UCAT_NUMBER, false},/* fullwidth 0 */
        {0xFFFD, RLAI_UCAT_SYMBOL, false},
        {0x1F600, RLAI_UCAT_SYMBOL, false}, /* 😀 */
        {0x1F680, RLAI_UCAT_SYMBOL, false}, /* 🚀 */
        {0x1D7CE, RLAI_UCAT_NUMBER, false}, /* mathematical bold digit zero */
        {0x20000, RLAI_UCAT_LETTER, false}, /* CJK ext B */
        {0xE0100, RLAI_UCAT_MARK, false},
        {0xE01F0, RLAI_UCAT_OTHER, false},
        {0x10FFFF, RLAI_UCAT_OTHER, false},
        {0x110000, RLAI_UCAT_OTHER, false},
        {0xFFFFFFFF, RLAI_UCAT_OTHER, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ck_assert_msg(rlai_unicode_category(cases[i].cp) == cases[i].cat,
                      "U+%04X: category %d, expected %d", (unsigned)cases[i].cp,
                      (int)rlai_unicode_category(cases[i].cp), (int)cases[i].cat);
        ck_assert_msg(rlai_unicode_is_whitespace(cases[i].cp) == cases[i].ws,
                      "U+%04X: white space %d, expected %d", (unsigned)cases[i].cp,
                      (int)rlai_unicode_is_whitespace(cases[i].cp), (int)cases[i].ws);
    }
    /* The White_Space property has exactly 25 code points. */
    int n_ws = 0;
    for (uint32_t cp = 0; cp < 0x110000; cp++)
        n_ws += rlai_unicode_is_whitespace(cp);
    ck_assert_int_eq(n_ws, 25);
}
END_TEST

START_TEST(test_utf8_round_trip)
{
    char buf[4];
    /* plain checks in the loop: ck_assert marks a point per call (slow) */
    long bad = 0;
    uint32_t first_bad = 0;
    for (uint32_t cp = 0; cp < 0x110000; cp++) {
        if (cp >= 0xD800 && cp <= 0xDFFF)
            continue;
        int n = rlai_utf8_encode(cp, buf);
        int want = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
        uint32_t back = 0;
        if (n != want || rlai_utf8_decode(buf, (size_t)n, &back) != n || back != cp) {
            if (!bad++)
                first_bad = cp;
        }
    }
    ck_assert_msg(bad == 0, "%ld code points fail the round trip, first U+%04X", bad, (unsigned)first_bad);
    /* known encodings */
    ck_assert_int_eq(rlai_utf8_encode(0xE9, buf), 2);
    ck_assert(memcmp(buf, "\xc3\xa9", 2) == 0);
    ck_assert_int_eq(rlai_utf8_encode(0x4E2D, buf), 3);
    ck_assert(memcmp(buf, "\xe4\xb8\xad", 3) == 0);
    ck_assert_int_eq(rlai_utf8_encode(0x1F600, buf), 4);
    ck_assert(memcmp(buf, "\xf0\x9f\x98\x80", 4) == 0);
    /* code points that cannot be encoded become U+FFFD */
    ck_assert_int_eq(rlai_utf8_encode(0xD800, buf), 3);
    ck_assert(memcmp(buf, "\xef\xbf\xbd", 3) == 0);
    ck_assert_int_eq(rlai_utf8_encode(0x110000, buf), 3);
    ck_assert(memcmp(buf, "\xef\xbf\xbd", 3) == 0);
}
END_TEST

START_TEST(test_utf8_invalid)
{
    static const struct {
        const char *s;
        size_t len;
    } bad[] = {
        {"\x80", 1},                  /* lone continuation */
        {"\xbf", 1},
        {"\xff", 1}, {"\xfe", 1},     /* never valid */
        {"\xc0\x80", 2},              /* overlong NUL */
        {"\xc1\xbf", 2},              /* overlong */
        {"\xe0\x80\x80", 3},          /* overlong 3-byte */
        {"\xe0\x9f\xbf", 3},
        {"\xf0\x80\x80\x80", 4},      /* overlong 4-byte */
        {"\xf0\x8f\xbf\xbf", 4},
        {"\xed\xa0\x80", 3},          /* surrogate U+D800 */
        {"\xed\xbf\xbf", 3},          /* surrogate U+DFFF */
        {"\xf4\x90\x80\x80", 4},      /* U+110000 */
        {"\xf5\x80\x80\x80", 4},
        {"\xc3", 1},                  /* truncated */
        {"\xe4\xb8", 2},
        {"\xf0\x9f\x98", 3},
        {"\xc3\x41", 2},              /* bad continuation */
        {"\xe4\x41\xad", 3},
        {"\xf0\x9f\x41\x80", 4},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint32_t cp = 0;
        int n = rlai_utf8_decode(bad[i].s, bad[i].len, &cp);
        ck_assert_msg(n == 1 && cp == 0xFFFD, "case %zu: consumed %d, cp U+%04X", i, n, (unsigned)cp);
    }
    /* a valid sequence cut by len is truncated */
    uint32_t cp;
    ck_assert_int_eq(rlai_utf8_decode("\xe4\xb8\xad", 2, &cp), 1);
    ck_assert_uint_eq(cp, 0xFFFD);
    /* boundaries that are valid */
    ck_assert_int_eq(rlai_utf8_decode("\xed\x9f\xbf", 3, &cp), 3);
    ck_assert_uint_eq(cp, 0xD7FF);
    ck_assert_int_eq(rlai_utf8_decode("\xee\x80\x80", 3, &cp), 3);
    ck_assert_uint_eq(cp, 0xE000);
    ck_assert_int_eq(rlai_utf8_decode("\xf4\x8f\xbf\xbf", 4, &cp), 4);
    ck_assert_uint_eq(cp, 0x10FFFF);
    ck_assert_int_eq(rlai_utf8_decode("\xc2\x80", 2, &cp), 2);
    ck_assert_uint_eq(cp, 0x80);
    ck_assert_int_eq(rlai_utf8_decode("", 1, &cp), 1);   /* embedded NUL */
    ck_assert_uint_eq(cp, 0);
}
END_TEST

static Suite *unicode_suite(void)
{
    Suite *s = suite_create("unicode");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_categories);
    tcase_add_test(tc, test_utf8_round_trip);
    tcase_add_test(tc, test_utf8_invalid);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(unicode_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
