/* conn_guard.h - keeps slow clients (slowloris) from holding the HTTP
 * front's connection slots.
 *
 * Every connection is tracked from accept to close. A connection is
 * "waiting" until its whole request (headers and body) has arrived, and
 * again after each answer while it idles in keep-alive; it is "busy"
 * while its request is processed (a generation or a stream that may run for
 * minutes is never cut by the guard). Two rules:
 *   - a waiting connection gets request_timeout_ms to deliver a complete
 *     request, counted from accept or from the end of its previous answer;
 *     past that a reaper thread shuts its socket down;
 *   - when more than max_conns connections are open, each new one evicts
 *     the connection that has been waiting longest (never a busy one), so a
 *     flood of slow connections cannot lock out a client that sends its
 *     request promptly.
 * Per-address limits cannot tell local users apart (every local client is
 * 127.0.0.1), which is why eviction, not a per-address cap, is the defence.
 *
 * Thread-safe: callbacks come from libmicrohttpd's connection threads.
 */
#ifndef RLAI_CONN_GUARD_H
#define RLAI_CONN_GUARD_H

#include <stdbool.h>
#include <stdint.h>

typedef struct rlai_conn_guard rlai_conn_guard;
typedef struct rlai_conn_slot rlai_conn_slot;

/* Starts a guard and its reaper thread. *out is owned by the caller and
 * freed with rlai_conn_guard_free. Returns 0, RLAI_ERR_INVALID_ARG or
 * RLAI_ERR_NOMEM. */
int rlai_conn_guard_new(int max_conns, int request_timeout_ms, rlai_conn_guard **out);

/* Stops the reaper and frees the guard and any slots still tracked;
 * sets *g = NULL. Accepts NULL and *g == NULL. Call after the server that
 * feeds it has stopped. */
void rlai_conn_guard_free(rlai_conn_guard **g);

/* A connection was accepted on socket fd: returns its slot (owned by the
 * guard until rlai_conn_guard_closed), or NULL when out of memory (the
 * connection is then simply not guarded). May evict the longest-waiting
 * connection. */
rlai_conn_slot *rlai_conn_guard_opened(rlai_conn_guard *g, int fd);

/* The connection of `slot` was closed (slot may be NULL): the slot is freed. */
void rlai_conn_guard_closed(rlai_conn_guard *g, rlai_conn_slot *slot);

/* The connection's request has fully arrived (busy = true) or its answer
 * has ended (busy = false: waiting again, the timeout restarts). */
void rlai_conn_guard_set_busy(rlai_conn_guard *g, rlai_conn_slot *slot, bool busy);

/* Totals since start: connections shut for sending too slowly, and
 * connections evicted to make room. */
void rlai_conn_guard_counts(rlai_conn_guard *g, uint64_t *timed_out, uint64_t *evicted, int *open);

#endif
