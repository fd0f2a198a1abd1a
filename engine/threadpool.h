/* threadpool.h - a fixed pool of worker threads for data-parallel kernels.
 * rlai_threadpool_run() runs fn(arg, ith, nth) on every thread (the caller
 * is thread 0) and returns when all have finished. Workers spin briefly
 * before sleeping so back-to-back dispatches (hundreds per token) stay cheap.
 * One caller at a time. */
#ifndef RLAI_THREADPOOL_H
#define RLAI_THREADPOOL_H

typedef struct rlai_threadpool rlai_threadpool;
typedef void (*rlai_task_fn)(void *arg, int ith, int nth);

/* Creates n_threads-1 workers (n_threads >= 1). *out is owned by the caller. */
int rlai_threadpool_new(int n_threads, rlai_threadpool **out);
/* Joins workers and frees. Accepts NULL. */
void rlai_threadpool_free(rlai_threadpool *tp);
int rlai_threadpool_size(const rlai_threadpool *tp);
/* Runs fn on all threads; tp may be NULL (then fn(arg, 0, 1)). */
void rlai_threadpool_run(rlai_threadpool *tp, rlai_task_fn fn, void *arg);

#endif
