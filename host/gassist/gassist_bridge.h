/* gassist_bridge.h - one G-Assist plugin session: protocol V2 on a pair of
 * file descriptors on one side, the RTX-LocalAI engine (`rlai serve`, over
 * ZeroMQ or the named pipe) on the other.
 *
 * Threads. gassist_bridge_run() is the reader: it reads every frame from
 * the input, answers `ping` at once (also while a command streams), acks
 * `input` at once, and queues initialize / execute / input work for one
 * worker thread, which owns the engine connection. Frames are written
 * whole under the writer's mutex, so the two threads never interleave.
 *
 * What goes where (shared/reference/g-assist-protocol.md section 3):
 *   execute {function, arguments}  ->  protocol `call` {command, params}
 *   engine `token` frames          ->  `stream` {request_id, data}
 *   engine `result` frames          ->  collected; shown in `complete`.data when
 *                                      nothing was streamed (a text field, else
 *                                      a Markdown list, never raw JSON)
 *   engine `done`                  ->  `complete` {success:true, keep_session}
 *   engine `error`, no engine,     ->  `error` {request_id, code, message}
 *   busy, deadline                     (-32601, -32602, -1, -2, -3); NOT_FOUND
 *                                      is -32601 only when a fresh registry
 *                                      lacks the command, else -32602
 * A streaming command whose parameter schema has a "session" property is
 * conversational (loremaster.talk): the bridge picks a session id,
 * `complete` keeps the session (passthrough) and each later `input` calls
 * the same command with the first turn's arguments, the same "session" id
 * and the user's text in the text parameter ("message" for LoreMaster),
 * until the user says exit/quit/bye or the session nears G-Assist's
 * 5-minute limit. A non-streaming command with a "session" parameter
 * (loremaster.reset) gets the latest conversation's id.
 *
 * Every request gets its answer before the engine's deadlines: the bridge
 * ends an execute or input with error -2 after execute_timeout_ms (under
 * the engine's 30 s) and cancels the engine call.
 */
#ifndef GASSIST_BRIDGE_H
#define GASSIST_BRIDGE_H

#include <stdio.h>

typedef struct gassist_bridge gassist_bridge;

enum gassist_log_level {
    GASSIST_LOG_NONE = 0,
    GASSIST_LOG_ERROR = 1,
    GASSIST_LOG_WARNING = 2,
    GASSIST_LOG_INFO = 3,
    GASSIST_LOG_DEBUG = 4,
};

typedef struct gassist_bridge_config {
    const char *endpoint;          /* engine endpoint; NULL = the default ZeroMQ one (copied) */
    int in_fd, out_fd;             /* protocol input and output (borrowed, not closed) */
    int connect_timeout_ms;        /* engine hello round trip; <= 0 = 2000 */
    int execute_timeout_ms;        /* end of execute/input from arrival; <= 0 = 25000 */
    int session_limit_ms;          /* a passthrough conversation's total; <= 0 = 280000 */
    FILE *log;                     /* log lines (borrowed); NULL = none */
    int log_level;                 /* lines written to log at this level or below */
    int notify_level;              /* lines also sent as `log` notifications */
    const char *name;              /* plugin name for initialize; NULL = "rlai" (copied) */
} gassist_bridge_config;

/* Exit statuses of gassist_bridge_run. */
enum gassist_bridge_status {
    GASSIST_EXIT_OK = 0,           /* shutdown received, or the input ended cleanly */
    GASSIST_EXIT_PROTOCOL = 3,     /* the input stream was lost (truncated, not V2
                                      framing) or the output was closed */
};

/* Creates a bridge (no thread started yet). *out owned by the caller
 * (gassist_bridge_destroy). Returns 0 or RLAI_ERR_NOMEM. */
int gassist_bridge_new(const gassist_bridge_config *cfg, gassist_bridge **out);

/* Starts the worker, runs the reader loop on the calling thread until
 * shutdown or end of input, stops the worker (cancelling an engine call in
 * flight; waits at most ~1.5 s for it) and returns a gassist_bridge_status.
 * Call once. */
int gassist_bridge_run(gassist_bridge *b);

/* Frees the bridge. Accepts NULL; nulls *self_p. */
void gassist_bridge_destroy(gassist_bridge **self_p);

#endif
