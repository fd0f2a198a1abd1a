/* test_json_escape.c - host/json_escape.c: string bodies exactly as cJSON
 * prints them (the HTTP front splices them into pre-rendered chunks). */
#include <check.h>
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "json_escape.h"

/* cJSON's printing of s (no NUL inside), quotes stripped. */
static char *cjson_body(const char *s)
{
    cJSON *j = cJSON_CreateString(s);
    ck_assert_ptr_nonnull(j);
    char *p = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    ck_assert_ptr_nonnull(p);
    size_t l = strlen(p);
    ck_assert(l >= 2 && p[0] == '"' && p[l - 1] == '"');
    memmove(p, p + 1, l - 2);
    p[l - 2] = 0;
    return p;
}

static void check_same(const char *s, size_t n)
{
    char *out = malloc(RLAI_JSON_ESCAPE_MAX(n) + 1);
    ck_assert_ptr_nonnull(out);
    size_t w = rlai_json_escape(s, n, out);
    ck_assert_uint_le(w, RLAI_JSON_ESCAPE_MAX(n));
    out[w] = 0;
    char *want = cjson_body(s);
    ck_assert_str_eq(out, want);
    free(want);
    free(out);
}

START_TEST(every_byte_as_cjson_prints_it)
{
    for (int c = 1; c < 256; c++) {
        char s[4] = { 'a', (char)c, 'z', 0 };
        check_same(s, 3);
    }
}
END_TEST

START_TEST(mixed_text_as_cjson_prints_it)
{
    const char *cases[] = {
        "", "plain words", "say \"hi\"\\ now", "tab\tnew\nline\r\n", "\b\f\x01\x1f\x7f",
        "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x90\x89", "\xff\xfe broken utf-8 passes as is", "</script>",
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        check_same(cases[i], strlen(cases[i]));
    /* random bytes, NUL left out (cJSON strings end at NUL) */
    unsigned x = 12345;
    for (int k = 0; k < 200; k++) {
        char s[64];
        int n = 1 + k % 63;
        for (int i = 0; i < n; i++) {
            x = x * 1103515245u + 12345u;
            s[i] = (char)(1 + (x >> 16) % 255);
        }
        s[n] = 0;
        check_same(s, (size_t)n);
    }
}
END_TEST

START_TEST(nul_is_escaped_not_dropped)
{
    char out[32];
    size_t w = rlai_json_escape("a\0b", 3, out);
    ck_assert_uint_eq(w, 8);
    ck_assert(memcmp(out, "a\\u0000b", 8) == 0);
    /* and the result parses back to the same bytes */
    char doc[40] = "\"";
    memcpy(doc + 1, out, w);
    memcpy(doc + 1 + w, "\"", 2);
    cJSON *j = cJSON_Parse(doc);
    ck_assert_ptr_nonnull(j);
    ck_assert(cJSON_IsString(j));
    cJSON_Delete(j);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("json_escape");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, every_byte_as_cjson_prints_it);
    tcase_add_test(tc, mixed_text_as_cjson_prints_it);
    tcase_add_test(tc, nul_is_escaped_not_dropped);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
