/* test_json_int.c - host/json_int.c: exact 64-bit integers from JSON text. */
#include <check.h>
#include <stdint.h>
#include <string.h>

#include "json_int.h"

static int find(const char *js, const char *key, uint64_t *v, int *neg)
{
    return rlai_json_find_int(js, strlen(js), key, v, neg);
}

START_TEST(reads_top_level_integers_exactly)
{
    uint64_t v = 0;
    int neg = 0;
    ck_assert_int_eq(find("{\"seed\": 18446744073709551615}", "seed", &v, &neg), 1);
    ck_assert(v == UINT64_MAX && !neg);
    ck_assert_int_eq(find("{\"a\":{\"seed\":1},\"s\":\"\\\"seed\\\": 2\",\"seed\":9007199254740993}", "seed", &v, &neg),
                     1);
    ck_assert(v == 9007199254740993ull);
    ck_assert_int_eq(find("{\"seed\":-1}", "seed", &v, &neg), 1);
    ck_assert(v == UINT64_MAX && neg);
    ck_assert_int_eq(find("{\"seed\":-9223372036854775808}", "seed", &v, &neg), 1);
    ck_assert(v == (uint64_t)INT64_MIN);
    ck_assert_int_eq(find("{\"x\":[1,{\"seed\":3}], \"se\\/ed\": 4}", "se/ed", &v, &neg), 1);
    ck_assert(v == 4);
    ck_assert_int_eq(find("{\"x\":[1,{\"seed\":3}]}", "seed", &v, &neg), 0);
    ck_assert_int_eq(find("{\"seed\":null}", "seed", &v, &neg), 0);
}
END_TEST

START_TEST(refuses_what_is_not_an_int64)
{
    uint64_t v;
    ck_assert_int_eq(find("{\"seed\": 18446744073709551616}", "seed", &v, NULL), -1);
    ck_assert_int_eq(find("{\"seed\": -9223372036854775809}", "seed", &v, NULL), -1);
    ck_assert_int_eq(find("{\"seed\": 1.5}", "seed", &v, NULL), -1);
    ck_assert_int_eq(find("{\"seed\": 1e3}", "seed", &v, NULL), -1);
    ck_assert_int_eq(find("{\"seed\": \"5\"}", "seed", &v, NULL), -1);
    ck_assert_int_eq(find("{\"seed\": true}", "seed", &v, NULL), -1);
    char t[24];
    ck_assert_int_eq(rlai_json_find_int_text("{\"seed\":123}", 12, "seed", t, sizeof(t)), 1);
    ck_assert_str_eq(t, "123");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("json_int");
    TCase *tc = tcase_create("scan");
    tcase_add_test(tc, reads_top_level_integers_exactly);
    tcase_add_test(tc, refuses_what_is_not_an_int64);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
