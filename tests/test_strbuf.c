/* test_strbuf.c - rlai/strbuf.h: growth, printf past the capacity, take,
 * and the sticky out-of-memory state. */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rlai/error.h"
#include "rlai/strbuf.h"

START_TEST(appends_grow_and_stay_terminated)
{
    rlai_strbuf b = { 0 };
    ck_assert_int_eq(rlai_strbuf_str(&b, "data: "), 0);
    ck_assert_int_eq(rlai_strbuf_add(&b, "x\0y", 3), 0);   /* bytes, NUL included */
    ck_assert_uint_eq(b.len, 9);
    ck_assert(memcmp(b.p, "data: x\0y", 9) == 0);
    ck_assert_int_eq(b.p[b.len], 0);
    for (int i = 0; i < 1000; i++)
        ck_assert_int_eq(rlai_strbuf_add(&b, "0123456789", 10), 0);
    ck_assert_uint_eq(b.len, 10009);
    ck_assert_uint_gt(b.cap, b.len);
    ck_assert_int_eq(b.p[b.len], 0);
    ck_assert(memcmp(b.p + 10009 - 10, "0123456789", 10) == 0);
    size_t len = b.len;
    ck_assert_int_eq(rlai_strbuf_grow(&b, 100000), 0);
    ck_assert_uint_ge(b.cap, len + 100001);
    ck_assert_uint_eq(b.len, len);
    ck_assert_int_eq(rlai_strbuf_add(&b, NULL, 0), 0);
    rlai_strbuf_free(&b);
    ck_assert_ptr_null(b.p);
    ck_assert_uint_eq(b.len + b.cap, 0);
    rlai_strbuf_free(NULL);
}
END_TEST

START_TEST(printf_past_the_capacity)
{
    rlai_strbuf b = { 0 };
    ck_assert_int_eq(rlai_strbuf_printf(&b, "%s", ""), 0);
    ck_assert_ptr_nonnull(b.p);                     /* an empty text, not NULL */
    ck_assert_str_eq(b.p, "");
    char big[3000];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = 0;
    ck_assert_int_eq(rlai_strbuf_printf(&b, "%d:%s:%llu\n", 42, big, 18446744073709551615ull), 0);
    ck_assert_uint_eq(b.len, 3 + 2999 + 1 + 20 + 1);
    ck_assert(strncmp(b.p, "42:aaa", 6) == 0);
    ck_assert_str_eq(b.p + b.len - 22, ":18446744073709551615\n");
    ck_assert_int_eq(rlai_strbuf_printf(&b, "%s", "z"), 0);
    ck_assert_int_eq(b.p[b.len - 1], 'z');
    char *t = rlai_strbuf_take(&b);
    ck_assert_ptr_nonnull(t);
    ck_assert_uint_eq(strlen(t), 3 + 2999 + 1 + 20 + 1 + 1);
    ck_assert_ptr_null(b.p);
    free(t);
    ck_assert_ptr_null(rlai_strbuf_take(&b));       /* nothing added: NULL */
}
END_TEST

START_TEST(out_of_memory_is_sticky)
{
    rlai_strbuf b = { 0 };
    ck_assert_int_eq(rlai_strbuf_str(&b, "kept"), 0);
    ck_assert_int_eq(rlai_strbuf_grow(&b, SIZE_MAX - 4), RLAI_ERR_NOMEM);
    ck_assert(b.oom);
    ck_assert_str_eq(b.p, "kept");                  /* what it had stays */
    ck_assert_int_eq(rlai_strbuf_str(&b, "more"), RLAI_ERR_NOMEM);
    ck_assert_int_eq(rlai_strbuf_printf(&b, "%d", 1), RLAI_ERR_NOMEM);
    ck_assert_uint_eq(b.len, 4);
    ck_assert_ptr_null(rlai_strbuf_take(&b));       /* a failed text is not handed out */
    ck_assert(!b.oom && !b.p);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("strbuf");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, appends_grow_and_stay_terminated);
    tcase_add_test(tc, printf_past_the_capacity);
    tcase_add_test(tc, out_of_memory_is_sticky);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
