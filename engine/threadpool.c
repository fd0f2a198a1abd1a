/* threadpool.c - persistent worker threads for data-parallel kernels.
 *
 * Dispatch: the caller publishes (fn, arg), sets the pending counter to
 * n_threads-1 and bumps an atomic generation counter. Workers notice the
 * new generation, claim their slot ith (CAS of the slot's generation),
 * run fn(arg, ith, nth) and decrement `pending`; the caller runs its own
 * share as thread 0 and then waits for pending == 0. No barrier object.
 *
 * Work stealing of whole slots: after its own share the caller claims
 * every slot no worker has claimed yet and runs fn for it itself. On an
 * oversubscribed machine (more runnable threads than cores) a worker that
 * is not currently scheduled therefore never delays a dispatch; the
 * caller only waits for workers that actually started. A worker that
 * wakes late finds its slot taken and does not touch fn/arg.
 *
 * Idle workers spin with a pause instruction for a short while, then
 * yield, and after RLAI_TP_SLEEP_NS of idleness sleep on a condition
 * variable, so an idle engine burns no CPU. The caller only touches the
 * mutex when at least one worker is asleep (sleepers counter), which
 * keeps back-to-back dispatches lock-free. */
#include "threadpool.h"
#include "rlai/engine.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

#define RLAI_TP_SPIN_NS   (200 * 1000L)      /* pure spinning (pause) */
#define RLAI_TP_SLEEP_NS  (3 * 1000 * 1000L) /* then yield until this, then sleep */

struct rlai_worker {
    struct rlai_threadpool *tp;
    pthread_t thread;
    int ith;
    _Alignas(64) atomic_uint claimed;   /* last generation whose slot was claimed */
};

struct rlai_threadpool {
    int n_threads;
    struct rlai_worker *workers;       /* n_threads-1 entries */

    /* current task; written by the caller before the generation bump */
    rlai_task_fn fn;
    void *arg;

    _Alignas(64) atomic_uint generation;
    _Alignas(64) atomic_int pending;   /* workers still running the task */
    _Alignas(64) atomic_int sleepers;  /* workers blocked (or about to block) on cond */
    atomic_bool stop;

    pthread_mutex_t mu;
    pthread_cond_t cond;
};

static long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

/* Waits until tp->generation differs from `seen`; returns the new value. */
static unsigned wait_generation(struct rlai_threadpool *tp, unsigned seen)
{
    unsigned g;
    long t0 = -1;
    for (unsigned spins = 0;; spins++) {
        g = atomic_load_explicit(&tp->generation, memory_order_acquire);
        if (g != seen)
            return g;
        if ((spins & 255u) != 255u) {
            cpu_relax();
            continue;
        }
        long t = now_ns();
        if (t0 < 0)
            t0 = t;
        long idle = t - t0;
        if (idle < RLAI_TP_SPIN_NS)
            continue;
        if (idle < RLAI_TP_SLEEP_NS) {
            sched_yield();
            continue;
        }
        /* Sleep. The sleepers increment and the generation re-check are
         * sequentially consistent, so the caller either sees us as a
         * sleeper (and broadcasts under the mutex) or we see its bump. */
        pthread_mutex_lock(&tp->mu);
        atomic_fetch_add(&tp->sleepers, 1);
        while ((g = atomic_load(&tp->generation)) == seen)
            pthread_cond_wait(&tp->cond, &tp->mu);
        atomic_fetch_sub(&tp->sleepers, 1);
        pthread_mutex_unlock(&tp->mu);
        return g;
    }
}

/* Claims worker slot w for generation g; false if already claimed. */
static bool claim(struct rlai_worker *w, unsigned g)
{
    unsigned cur = atomic_load_explicit(&w->claimed, memory_order_relaxed);
    while ((int)(g - cur) > 0) {
        if (atomic_compare_exchange_weak_explicit(&w->claimed, &cur, g,
                                                  memory_order_acq_rel, memory_order_relaxed))
            return true;
    }
    return false;
}

static void *worker_main(void *p)
{
    struct rlai_worker *w = p;
    struct rlai_threadpool *tp = w->tp;
    unsigned seen = 0;   /* generation starts at 0 */

    for (;;) {
        seen = wait_generation(tp, seen);
        if (atomic_load_explicit(&tp->stop, memory_order_acquire))
            break;
        /* A successful claim for `seen` means the caller is still inside
         * that dispatch (it cannot finish before every slot is done), so
         * fn and arg are the ones published with `seen`. */
        if (!claim(w, seen))
            continue;
        tp->fn(tp->arg, w->ith, tp->n_threads);
        atomic_fetch_sub_explicit(&tp->pending, 1, memory_order_release);
    }
    return NULL;
}

/* Publishes the current fn/arg/stop to the workers and wakes sleepers.
 * Returns the new generation. */
static unsigned publish(struct rlai_threadpool *tp)
{
    atomic_store_explicit(&tp->pending, tp->n_threads - 1, memory_order_relaxed);
    unsigned g = atomic_fetch_add(&tp->generation, 1) + 1;   /* seq_cst: release + order vs sleepers */
    if (atomic_load(&tp->sleepers) > 0) {
        pthread_mutex_lock(&tp->mu);
        pthread_cond_broadcast(&tp->cond);
        pthread_mutex_unlock(&tp->mu);
    }
    return g;
}

static void wait_done(struct rlai_threadpool *tp)
{
    for (unsigned spins = 0;
         atomic_load_explicit(&tp->pending, memory_order_acquire) != 0; spins++) {
        if (spins < 20000u)
            cpu_relax();
        else
            sched_yield();   /* a worker was probably descheduled */
    }
}

int rlai_threadpool_new(int n_threads, rlai_threadpool **out)
{
    if (!out)
        return RLAI_ERR_INVALID_ARG;
    *out = NULL;
    if (n_threads < 1 || n_threads > 1024)
        return RLAI_ERR_INVALID_ARG;

    struct rlai_threadpool *tp = calloc(1, sizeof *tp);
    if (!tp)
        return RLAI_ERR_NOMEM;
    tp->n_threads = n_threads;
    atomic_init(&tp->generation, 0u);
    atomic_init(&tp->pending, 0);
    atomic_init(&tp->sleepers, 0);
    atomic_init(&tp->stop, false);
    if (pthread_mutex_init(&tp->mu, NULL) != 0) {
        free(tp);
        return RLAI_ERR_NOMEM;
    }
    if (pthread_cond_init(&tp->cond, NULL) != 0) {
        pthread_mutex_destroy(&tp->mu);
        free(tp);
        return RLAI_ERR_NOMEM;
    }
    if (n_threads > 1) {
        tp->workers = calloc((size_t)(n_threads - 1), sizeof *tp->workers);
        if (!tp->workers) {
            pthread_cond_destroy(&tp->cond);
            pthread_mutex_destroy(&tp->mu);
            free(tp);
            return RLAI_ERR_NOMEM;
        }
        for (int i = 0; i < n_threads - 1; i++) {
            tp->workers[i].tp = tp;
            tp->workers[i].ith = i + 1;
            atomic_init(&tp->workers[i].claimed, 0u);
            if (pthread_create(&tp->workers[i].thread, NULL, worker_main, &tp->workers[i]) != 0) {
                /* stop the ones already started */
                tp->n_threads = i + 1;
                rlai_threadpool_free(tp);
                return RLAI_ERR_NOMEM;
            }
        }
    }
    *out = tp;
    return RLAI_OK;
}

void rlai_threadpool_free(rlai_threadpool *tp)
{
    if (!tp)
        return;
    if (tp->n_threads > 1) {
        atomic_store_explicit(&tp->stop, true, memory_order_relaxed);
        publish(tp);   /* workers see the new generation, then stop */
        for (int i = 0; i < tp->n_threads - 1; i++)
            pthread_join(tp->workers[i].thread, NULL);
    }
    free(tp->workers);
    pthread_cond_destroy(&tp->cond);
    pthread_mutex_destroy(&tp->mu);
    free(tp);
}

int rlai_threadpool_size(const rlai_threadpool *tp)
{
    return tp ? tp->n_threads : 1;
}

void rlai_threadpool_run(rlai_threadpool *tp, rlai_task_fn fn, void *arg)
{
    if (!fn)
        return;
    if (!tp || tp->n_threads == 1) {
        fn(arg, 0, 1);
        return;
    }
    tp->fn = fn;
    tp->arg = arg;
    unsigned g = publish(tp);
    fn(arg, 0, tp->n_threads);
    for (int i = 0; i < tp->n_threads - 1; i++) {
        if (claim(&tp->workers[i], g)) {
            fn(arg, i + 1, tp->n_threads);
            atomic_fetch_sub_explicit(&tp->pending, 1, memory_order_relaxed);
        }
    }
    wait_done(tp);
}
