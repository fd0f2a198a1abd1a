/* clock.c - the one monotonic clock (rlai/clock.h). */
#include "rlai/clock.h"

#include <time.h>

double rlai_clock_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

int64_t rlai_clock_ms_int(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

double rlai_clock_s(void)
{
    return rlai_clock_ms() / 1e3;
}
