/* clock.h - the one monotonic clock of the engine and the host.
 *
 * CLOCK_MONOTONIC, unaffected by wall-clock changes: for deadlines,
 * timeouts and the per-request metrics. Part of the small common library
 * (rlai_common) that the engine, the codec, the transports and the host
 * share. Thread-safe, no state. */
#ifndef RLAI_CLOCK_H
#define RLAI_CLOCK_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Monotonic time in milliseconds (fractional) / whole milliseconds /
 * seconds, from an arbitrary origin. */
double rlai_clock_ms(void);
int64_t rlai_clock_ms_int(void);
double rlai_clock_s(void);

#ifdef __cplusplus
}
#endif
#endif
