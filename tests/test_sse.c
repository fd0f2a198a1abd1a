/* test_sse.c - the incremental SSE parser (host/sse.c): events split at
 * every byte, line ends LF / CR LF / CR (also split between feeds), data
 * lines joined, comments and unknown fields ignored, the BOM, limits,
 * stopping from the callback. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sse.h"
#include "rlai/error.h"

typedef struct rec {
    char out[4096];       /* "event|data;" per event */
    int n;
    int stop_at;          /* stop (return 7) at this event number, 0 = never */
} rec;

static int on_event(void *user, const char *event, const char *data, size_t len)
{
    rec *r = user;
    ck_assert_uint_eq(strlen(data), len);
    size_t o = strlen(r->out);
    snprintf(r->out + o, sizeof(r->out) - o, "%s|%s;", event, data);
    r->n++;
    return r->stop_at && r->n == r->stop_at ? 7 : 0;
}

/* Feeds text in pieces of `step` bytes. */
static void feed_all(rlai_sse *p, const char *text, size_t step)
{
    size_t n = strlen(text);
    for (size_t i = 0; i < n; i += step) {
        size_t k = n - i < step ? n - i : step;
        ck_assert_int_eq(rlai_sse_feed(p, text + i, k), 0);
    }
}

static const char *STREAM =
    "\xEF\xBB\xBF: a comment\r\n"
    "data: {\"a\":1}\r\n\r\n"
    "event: note\n"
    "data:first\n"
    "data:  second\n"
    "id: 3\n"
    "retry: 10\n"
    "bogus: x\n"
    "\n"
    "data\r\r"                       /* a field with no colon: empty data */
    "event: lonely\n\n"              /* no data: not dispatched */
    "data: [DONE]\n\n";

static const char *EXPECT = "|{\"a\":1};note|first\n second;|;|[DONE];";

START_TEST(every_split_gives_the_same_events)
{
    for (size_t step = 1; step <= strlen(STREAM); step++) {
        rec r = { .out = "" };
        rlai_sse *p = NULL;
        ck_assert_int_eq(rlai_sse_new(0, on_event, &r, &p), 0);
        feed_all(p, STREAM, step);
        ck_assert_msg(!strcmp(r.out, EXPECT), "step %zu: got %s", step, r.out);
        ck_assert_int_eq(r.n, 4);
        ck_assert_int_eq(rlai_sse_pending(p), 0);
        rlai_sse_free(p);
    }
}
END_TEST

START_TEST(unfinished_event_is_pending_not_dispatched)
{
    rec r = { .out = "" };
    rlai_sse *p = NULL;
    ck_assert_int_eq(rlai_sse_new(0, on_event, &r, &p), 0);
    feed_all(p, "data: one\n\ndata: two", 3);
    ck_assert_str_eq(r.out, "|one;");
    ck_assert_int_ne(rlai_sse_pending(p), 0);
    feed_all(p, "\n", 1);
    ck_assert_int_ne(rlai_sse_pending(p), 0);   /* data seen, no blank line yet */
    feed_all(p, "\n", 1);
    ck_assert_str_eq(r.out, "|one;|two;");
    ck_assert_int_eq(rlai_sse_pending(p), 0);
    rlai_sse_reset(p);
    feed_all(p, "data: x", 7);
    rlai_sse_reset(p);
    ck_assert_int_eq(rlai_sse_pending(p), 0);
    feed_all(p, "\n", 1);                      /* the reset dropped "data: x" */
    ck_assert_str_eq(r.out, "|one;|two;");
    rlai_sse_free(p);
}
END_TEST

START_TEST(lines_longer_than_the_limit_are_refused)
{
    rec r = { .out = "" };
    rlai_sse *p = NULL;
    ck_assert_int_eq(rlai_sse_new(16, on_event, &r, &p), 0);
    ck_assert_int_eq(rlai_sse_feed(p, "data: 0123456789", 16), 0);
    ck_assert_int_eq(rlai_sse_feed(p, "A", 1), RLAI_ERR_TOO_LARGE);
    ck_assert_int_eq(rlai_sse_feed(p, "\n\n", 2), RLAI_ERR_TOO_LARGE);   /* sticky */
    ck_assert_int_eq(r.n, 0);
    rlai_sse_reset(p);
    /* many short data lines: the joined data hits the limit too */
    ck_assert_int_eq(rlai_sse_feed(p, "data: 12345\ndata: 12345\n", 24), 0);
    ck_assert_int_eq(rlai_sse_feed(p, "data: 12345\n", 12), RLAI_ERR_TOO_LARGE);
    rlai_sse_free(p);
}
END_TEST

START_TEST(callback_stops_the_feed)
{
    rec r = { .out = "", .stop_at = 1 };
    rlai_sse *p = NULL;
    ck_assert_int_eq(rlai_sse_new(0, on_event, &r, &p), 0);
    const char *s = "data: a\n\ndata: b\n\n";
    ck_assert_int_eq(rlai_sse_feed(p, s, strlen(s)), 7);
    ck_assert_str_eq(r.out, "|a;");
    ck_assert_int_eq(rlai_sse_new(0, NULL, NULL, &(rlai_sse *){ NULL }), RLAI_ERR_INVALID_ARG);
    ck_assert_int_eq(rlai_sse_feed(p, NULL, 1), RLAI_ERR_INVALID_ARG);
    rlai_sse_free(p);
    rlai_sse_free(NULL);
}
END_TEST

START_TEST(partial_bom_is_text)
{
    rec r = { .out = "" };
    rlai_sse *p = NULL;
    ck_assert_int_eq(rlai_sse_new(0, on_event, &r, &p), 0);
    /* EF BB then 'd': not a BOM, the two bytes start an unknown field name */
    feed_all(p, "\xEF\xBB" "data: x\n\ndata: y\n\n", 1);
    ck_assert_str_eq(r.out, "|y;");
    rlai_sse_free(p);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("sse");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, every_split_gives_the_same_events);
    tcase_add_test(tc, unfinished_event_is_pending_not_dispatched);
    tcase_add_test(tc, lines_longer_than_the_limit_are_refused);
    tcase_add_test(tc, callback_stops_the_feed);
    tcase_add_test(tc, partial_bom_is_text);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
