/* remote.h - the transfers to remote upstreams (issue 16): one libcurl
 * multi handle runs every remote request of the daemon (many streams on
 * one thread), with per-upstream concurrency limits, bounded retries
 * with backoff before the first token, the per-upstream circuit breaker,
 * deadlines, and cancel by removing the transfer (the upstream sees the
 * connection close).
 *
 * Leader/follower: the remote thread drives the transfers, except while a
 * thread that waits for a stream of its own (an HTTP connection thread)
 * drives them itself with rlai_remote_pump, so that the stream's data is
 * read, parsed and handed to its callbacks on the thread that writes it
 * to the client: one thread wake-up per piece instead of two
 * (docs/REMOTE.md, "What the route costs"). The driver uses libcurl's
 * multi-socket interface: it polls the sockets libcurl names itself and
 * tells libcurl which one is ready, so libcurl reads without polling it
 * again first.
 *
 * Callbacks (on_token with token id RLAI_REMOTE_TOKEN, on_done exactly
 * once, never after a failed submit) run on the driving thread: the remote
 * thread or one inside rlai_remote_pump. Never call rlai_remote_submit,
 * pump or free from them; cancel is safe anywhere.
 */
#ifndef RLAI_HOST_REMOTE_H
#define RLAI_HOST_REMOTE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "upstream.h"

typedef struct rlai_remote rlai_remote;
typedef struct rlai_route_request rlai_route_request;

/* Token id passed to on_token for remote text: the upstream's ids are
 * not the local model's, so none is given (fronts send no ids for it). */
#define RLAI_REMOTE_TOKEN ((rlai_token)-1)

/* Called once, on the remote thread, just before on_done of a request
 * that failed (status < 0), with a one-line reason (valid during the call). */
typedef void (*rlai_remote_error_cb)(void *user, uint64_t id, int status, const char *msg);

/* Copies the n upstream configs (checked with rlai_upstream_config_check),
 * reads their API keys and starts the transfer thread. *out owned by the
 * caller (rlai_remote_free). Returns 0 or a negative error with a message. */
int rlai_remote_new(const rlai_upstream_config *ups, int n, rlai_remote **out, char *err, size_t errlen);

/* Stops the thread. Requests still running end first with stop reason
 * CANCELLED (on_done called). NULL is fine. */
void rlai_remote_free(rlai_remote *r);

int rlai_remote_n_upstreams(const rlai_remote *r);
/* The i-th upstream's config (owned by r). */
const rlai_upstream_config *rlai_remote_upstream(const rlai_remote *r, int i);

/* True when upstream i would take a request now: its breaker is closed or
 * due for a trial, and its wait queue has room. */
bool rlai_remote_available(rlai_remote *r, int i);

/* Starts rq on upstream `up` as remote_model under the caller-chosen id
 * (unique among running remote requests). Nothing of rq is kept but a
 * copy of its body, callbacks and deadline; on_error (may be NULL) as
 * above. Returns 0, or RLAI_ERR_UNSUPPORTED / RLAI_ERR_INVALID_ARG (what
 * the remote cannot honour), RLAI_ERR_DISCONNECTED (breaker open),
 * RLAI_ERR_BUSY (queue full), RLAI_ERR_NOMEM, with a message; then
 * on_done is never called. Thread-safe. */
int rlai_remote_submit(rlai_remote *r, int up, const char *remote_model, const rlai_route_request *rq, uint64_t id,
                       rlai_remote_error_cb on_error, char *err, size_t errlen);

/* Asks request id to stop: its transfer is removed (the upstream sees the
 * connection close) and on_done follows with stop reason CANCELLED.
 * Thread-safe, callable from the callbacks too. Returns 0 or RLAI_ERR_NOT_FOUND. */
int rlai_remote_cancel(rlai_remote *r, uint64_t id);

/* Drives the transfers on the calling thread (every request's callbacks
 * may run on it) until ready(arg) returns true after a pass, timeout_ms
 * pass, or the remote stops. ready is called without any lock of r held,
 * so it may take the caller's own locks; the caller must hold no lock that
 * a callback takes. Only one thread pumps at a time: returns 0 at once
 * (nothing done, wait as usual) when another one is pumping, when r is
 * stopping, or without a thread; 1 after driving. Takes the transfers
 * from the remote thread (waking it if it polls); it takes them back
 * within 2 ms after the pump returns (up to 32 ms while the pumping
 * stream is the only request; a submit or cancel makes it look at once),
 * unless a pump comes back first.
 * Not from the callbacks. */
int rlai_remote_pump(rlai_remote *r, int timeout_ms, bool (*ready)(void *arg), void *arg);

/* Waits until no remote request is running (every on_done has returned)
 * or timeout_ms pass. Returns how many are still running. Thread-safe; not
 * from the callbacks. */
int rlai_remote_wait_idle(rlai_remote *r, int timeout_ms);

typedef struct rlai_upstream_stats {
    rlai_breaker_state breaker;
    int active, queued;
    uint64_t requests, ok, failed, cancelled, timeouts;  /* requests by how they ended */
    uint64_t attempts_failed, retries, breaker_opens, gen_pieces;
} rlai_upstream_stats;

/* Snapshot of upstream i (thread-safe). */
void rlai_remote_get_stats(rlai_remote *r, int i, rlai_upstream_stats *out);

#endif
