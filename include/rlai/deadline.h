/* deadline.h - absolute deadlines for pthread_cond_timedwait.
 *
 * A condition variable waits until an absolute time on its own clock
 * (CLOCK_REALTIME by default, CLOCK_MONOTONIC when set with
 * pthread_condattr_setclock). Part of rlai_common; not installed. */
#ifndef RLAI_DEADLINE_H
#define RLAI_DEADLINE_H

#include <stdint.h>
#include <time.h>

/* Writes into *ts the time `ms` milliseconds (>= 0) from now on `clock`.
 * ts is caller-owned. */
void rlai_deadline_in(struct timespec *ts, clockid_t clock, int64_t ms);

#endif
