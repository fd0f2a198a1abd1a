/* test_threadpool.c - dispatch correctness, back-to-back runs, sleeping
 * workers waking up, destroy while idle. */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "threadpool.h"
#include "rlai/engine.h"

static void sleep_ms(int ms)
{
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
    nanosleep(&ts, NULL);
}

struct count_arg {
    atomic_int calls[16];
    atomic_int bad_nth;
    int expect_nth;
    long gen;
    long seen[16];     /* each thread writes its own slot */
};

static void count_fn(void *p, int ith, int nth)
{
    struct count_arg *a = p;
    if (nth != a->expect_nth || ith < 0 || ith >= nth)
        atomic_fetch_add(&a->bad_nth, 1);
    else {
        atomic_fetch_add(&a->calls[ith], 1);
        a->seen[ith] = a->gen;   /* plain write: must be visible after run returns */
    }
}

START_TEST(test_single_thread)
{
    rlai_threadpool *tp = NULL;
    ck_assert_int_eq(rlai_threadpool_new(1, &tp), RLAI_OK);
    ck_assert_ptr_nonnull(tp);
    ck_assert_int_eq(rlai_threadpool_size(tp), 1);
    struct count_arg a;
    memset(&a, 0, sizeof a);
    a.expect_nth = 1;
    for (int i = 0; i < 1000; i++)
        rlai_threadpool_run(tp, count_fn, &a);
    ck_assert_int_eq(atomic_load(&a.calls[0]), 1000);
    ck_assert_int_eq(atomic_load(&a.bad_nth), 0);
    rlai_threadpool_free(tp);

    /* NULL pool runs inline */
    memset(&a, 0, sizeof a);
    a.expect_nth = 1;
    rlai_threadpool_run(NULL, count_fn, &a);
    ck_assert_int_eq(atomic_load(&a.calls[0]), 1);
    ck_assert_int_eq(rlai_threadpool_size(NULL), 1);
    rlai_threadpool_free(NULL);
}
END_TEST

START_TEST(test_invalid)
{
    rlai_threadpool *tp = (rlai_threadpool *)&tp;
    ck_assert_int_eq(rlai_threadpool_new(0, &tp), RLAI_ERR_INVALID_ARG);
    ck_assert_ptr_null(tp);
    ck_assert_int_eq(rlai_threadpool_new(-3, &tp), RLAI_ERR_INVALID_ARG);
    ck_assert_int_eq(rlai_threadpool_new(2, NULL), RLAI_ERR_INVALID_ARG);
}
END_TEST

/* Caller is thread 0 and runs on the calling thread. */
static pthread_t g_caller;
static atomic_int g_caller_ok;
static void caller_fn(void *p, int ith, int nth)
{
    (void)p; (void)nth;
    if (ith == 0 && pthread_equal(pthread_self(), g_caller))
        atomic_fetch_add(&g_caller_ok, 1);
}

START_TEST(test_back_to_back)
{
    for (int n = 2; n <= 4; n++) {
        rlai_threadpool *tp = NULL;
        ck_assert_int_eq(rlai_threadpool_new(n, &tp), RLAI_OK);
        ck_assert_int_eq(rlai_threadpool_size(tp), n);
        struct count_arg a;
        memset(&a, 0, sizeof a);
        a.expect_nth = n;
        const int iters = 20000;
        for (int i = 0; i < iters; i++) {
            a.gen = i + 1;
            rlai_threadpool_run(tp, count_fn, &a);
            for (int t = 0; t < n; t++)
                ck_assert_int_eq(a.seen[t], i + 1);   /* all finished before return */
        }
        for (int t = 0; t < n; t++)
            ck_assert_int_eq(atomic_load(&a.calls[t]), iters);
        ck_assert_int_eq(atomic_load(&a.bad_nth), 0);

        g_caller = pthread_self();
        atomic_store(&g_caller_ok, 0);
        rlai_threadpool_run(tp, caller_fn, NULL);
        ck_assert_int_eq(atomic_load(&g_caller_ok), 1);
        rlai_threadpool_free(tp);
    }
}
END_TEST

/* A real data-parallel job: partial sums per thread. */
struct sum_arg {
    const int32_t *v;
    int n;
    int64_t part[8];
};

static void sum_fn(void *p, int ith, int nth)
{
    struct sum_arg *a = p;
    int i0 = (int)((int64_t)a->n * ith / nth), i1 = (int)((int64_t)a->n * (ith + 1) / nth);
    int64_t s = 0;
    for (int i = i0; i < i1; i++)
        s += a->v[i];
    a->part[ith] = s;
}

START_TEST(test_parallel_sum)
{
    enum { N = 100003 };
    int32_t *v = malloc(N * sizeof *v);
    ck_assert_ptr_nonnull(v);
    int64_t want = 0;
    for (int i = 0; i < N; i++) {
        v[i] = (int32_t)((i * 2654435761u) >> 16) - 30000;
        want += v[i];
    }
    rlai_threadpool *tp = NULL;
    ck_assert_int_eq(rlai_threadpool_new(3, &tp), RLAI_OK);
    for (int rep = 0; rep < 300; rep++) {
        struct sum_arg a = { .v = v, .n = N - rep };
        rlai_threadpool_run(tp, sum_fn, &a);
        int64_t got = a.part[0] + a.part[1] + a.part[2];
        int64_t w = want;
        for (int i = N - rep; i < N; i++)
            w -= v[i];
        ck_assert(got == w);
    }
    rlai_threadpool_free(tp);
    free(v);
}
END_TEST

/* Workers go to sleep after a few ms idle and must wake up for the next
 * dispatch; destroy works on sleeping and on spinning workers. */
START_TEST(test_sleep_wake_destroy)
{
    rlai_threadpool *tp = NULL;
    ck_assert_int_eq(rlai_threadpool_new(2, &tp), RLAI_OK);
    struct count_arg a;
    memset(&a, 0, sizeof a);
    a.expect_nth = 2;
    for (int round = 0; round < 5; round++) {
        rlai_threadpool_run(tp, count_fn, &a);
        sleep_ms(round % 2 ? 1 : 25);   /* 25 ms: workers are asleep */
    }
    ck_assert_int_eq(atomic_load(&a.calls[0]), 5);
    ck_assert_int_eq(atomic_load(&a.calls[1]), 5);

    /* idle workers should not burn CPU: over 100 ms of idleness the
     * process uses far less than 100 ms of CPU time */
    sleep_ms(20);
    struct timespec c0, c1;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
    sleep_ms(100);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
    double cpu_ms = (c1.tv_sec - c0.tv_sec) * 1e3 + (c1.tv_nsec - c0.tv_nsec) / 1e6;
    ck_assert_msg(cpu_ms < 30.0, "idle pool used %.1f ms CPU in 100 ms", cpu_ms);

    rlai_threadpool_free(tp);   /* workers asleep */

    ck_assert_int_eq(rlai_threadpool_new(4, &tp), RLAI_OK);
    rlai_threadpool_run(tp, count_fn, &(struct count_arg){ .expect_nth = 4 });
    rlai_threadpool_free(tp);   /* workers still spinning */

    ck_assert_int_eq(rlai_threadpool_new(3, &tp), RLAI_OK);
    rlai_threadpool_free(tp);   /* never used */
}
END_TEST


/* Thread 0 waits until slot 1 has run, so slot 1 cannot be stolen by the
 * caller: this forces a real worker to run it (also right after the
 * workers fell asleep, which checks the condvar wake-up). */
struct handoff_arg {
    atomic_int flag;
    atomic_int timeout;
    atomic_int on_other_thread;
    pthread_t caller;
};

static void handoff_fn(void *p, int ith, int nth)
{
    struct handoff_arg *a = p;
    (void)nth;
    if (ith == 1) {
        if (!pthread_equal(pthread_self(), a->caller))
            atomic_fetch_add(&a->on_other_thread, 1);
        atomic_store(&a->flag, 1);
    } else if (ith == 0) {
        struct timespec t0, t;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        while (!atomic_load(&a->flag)) {
            clock_gettime(CLOCK_MONOTONIC, &t);
            if (t.tv_sec - t0.tv_sec > 20) {
                atomic_store(&a->timeout, 1);
                break;
            }
        }
    }
}

START_TEST(test_worker_runs)
{
    rlai_threadpool *tp = NULL;
    ck_assert_int_eq(rlai_threadpool_new(2, &tp), RLAI_OK);
    for (int i = 0; i < 60; i++) {
        struct handoff_arg a = { .caller = pthread_self() };
        rlai_threadpool_run(tp, handoff_fn, &a);
        ck_assert_int_eq(atomic_load(&a.timeout), 0);
        ck_assert_int_eq(atomic_load(&a.on_other_thread), 1);
        if (i % 20 == 19)
            sleep_ms(30);   /* let the worker go to sleep */
    }
    rlai_threadpool_free(tp);
}
END_TEST

static Suite *tp_suite(void)
{
    Suite *s = suite_create("threadpool");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_single_thread);
    tcase_add_test(tc, test_invalid);
    tcase_add_test(tc, test_back_to_back);
    tcase_add_test(tc, test_parallel_sum);
    tcase_add_test(tc, test_sleep_wake_destroy);
    tcase_add_test(tc, test_worker_runs);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(tp_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
