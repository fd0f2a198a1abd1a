/* router.h - the one generation path of the host.
 *
 * Every front that runs a text generation (the wire protocol in daemon.c,
 * the HTTP front in http.c, plugin handlers through plugin_host.c) submits
 * it here: chat messages or a prompt, the per-front prompt limit, the
 * generation parameters and the engine callbacks (rlai_text_request). The
 * router decides where it runs; today that is always the local engine
 * (rlai_engine_submit_text: template, tokenize, limits, submit), and
 * remote upstreams (issue 16) plug in behind the same call. Callbacks keep
 * the engine's contract wherever the request runs: on_token for each
 * piece of text, then on_done exactly once, never after a failed submit.
 */
#ifndef RLAI_HOST_ROUTER_H
#define RLAI_HOST_ROUTER_H

#include <stddef.h>
#include <stdint.h>
#include "rlai/engine.h"

typedef struct rlai_router rlai_router;

typedef struct rlai_route_request {
    rlai_text_request text;           /* borrowed for the call (engine.h) */
    const char *model;                /* model name asked for; NULL or "" = the local model */
    const char *response_format;      /* JSON text the grammar in text.rp.gen was built from, or
                                         NULL; a remote upstream is given this instead of the mask */
} rlai_route_request;

/* Creates a router in front of `engine` (borrowed; must outlive the
 * router). *out is owned by the caller (rlai_router_free). Returns 0 or
 * RLAI_ERR_INVALID_ARG / RLAI_ERR_NOMEM. */
int rlai_router_new(rlai_engine *engine, rlai_router **out);

/* Frees the router (NULL is fine). Every routed request must have ended
 * (on_done) before. */
void rlai_router_free(rlai_router *r);

/* Submits rq where it should run. On success returns 0, *id (routed
 * request id, for rlai_router_cancel) and *n_prompt (may be NULL; the
 * prompt tokens counted, or 0 when the place it runs does not say yet).
 * On failure returns a negative rlai_error with a one-line reason in err
 * (may be NULL) and on_done is never called. Thread-safe; never call it
 * from an engine callback. */
int rlai_router_submit(rlai_router *r, const rlai_route_request *rq, uint64_t *id, int *n_prompt,
                       char *err, size_t errlen);

/* Asks a routed request to stop (stop reason CANCELLED, on_done follows).
 * Thread-safe, callable from any thread but an engine callback. Returns 0
 * or RLAI_ERR_NOT_FOUND. */
int rlai_router_cancel(rlai_router *r, uint64_t id);

/* The local engine behind the router (borrowed). */
rlai_engine *rlai_router_engine(const rlai_router *r);

#endif
