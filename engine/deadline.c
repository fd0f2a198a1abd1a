/* deadline.c - absolute deadlines for condition variables (rlai/deadline.h). */
#include "rlai/deadline.h"

void rlai_deadline_in(struct timespec *ts, clockid_t clock, int64_t ms)
{
    clock_gettime(clock, ts);
    if (ms < 0)
        ms = 0;
    ts->tv_sec += (time_t)(ms / 1000);
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}
