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
#include <stdbool.h>
#include "rlai/engine.h"

typedef struct rlai_router rlai_router;
typedef struct cJSON cJSON;

typedef struct rlai_route_request {
    rlai_text_request text;           /* borrowed for the call (engine.h) */
    const char *model;                /* model name asked for; NULL or "" = the local model */
    const char *response_format;      /* JSON text the grammar in text.rp.gen was built from, or
                                         NULL; a remote upstream is given this instead of the mask */
    /* -- remote upstreams (issue 16, docs/REMOTE.md); all optional (zero = defaults) -- */
    const char *route;                /* per-request override: NULL/""/"auto" = the policy, "local" = the
                                         local engine only, "remote" = an upstream (the spill ones for the
                                         local model), or an upstream's name */
    const char *affinity_key;         /* prefix-affinity key (e.g. a pinned lore prefix); NULL = the
                                         first message's content when its role is "system" */
    char *where;                      /* out (may be NULL): on success, where it runs: "local" or
                                         "upstream:NAME" (NUL-terminated, truncated to where_len) */
    size_t where_len;
    void (*on_error)(void *user, uint64_t id, int status, const char *msg);
                                      /* may be NULL: for a remote request that fails, called once
                                         just before on_done (status < 0) with a one-line reason */
    void (*on_remote_logprobs)(void *user, cJSON *entries);
                                      /* may be NULL: a remote request that asks for logprobs
                                         (text.rp.gen.top_logprobs >= 0 with on_logprobs) needs it,
                                         else it is refused. Called on the driving thread with the
                                         upstream's log-probabilities of a chunk's tokens, before
                                         that chunk's text: a cJSON array (the callee owns it) of
                                         {token, logprob, bytes, top_logprobs: [{token, logprob,
                                         bytes}]} (host/upstream.h) */
    const char *image_url;            /* NULL, or an image URL for a remote vision model (a plugin's
                                         rlai_gen_request.image_url): joins the last user message of
                                         text.messages as an image_url part; the local engine refuses
                                         it (RLAI_ERR_NOT_IMPLEMENTED) */
    /* -- a chat with tools for a remote model (the HTTP front): forwarded as they are -- */
    const char *messages_json;        /* NULL, or the chat's "messages" as JSON text: the upstream gets
                                         them unchanged (tool calls and results included) instead of
                                         text.messages, which the router still reads (affinity) */
    const char *forward_json;         /* NULL, or a JSON object whose members join the upstream's body
                                         unchanged ("tools", "tool_choice", "parallel_tool_calls") */
    void (*on_remote_tool_calls)(void *user, cJSON *deltas);
                                      /* may be NULL: a chunk's delta.tool_calls (the streamed call
                                         fragments [{index, id, type, function: {name, arguments}}]),
                                         on the driving thread before that chunk's text; the callee
                                         owns the array */
} rlai_route_request;

/* *n_prompt of rlai_router_submit when the refusal came from the routing
 * decision or a remote upstream (no local prompt count; err says why). */
#define RLAI_ROUTER_REFUSED_REMOTE (-2)

/* Routed ids of remote requests have this bit set (engine ids never do). */
#define RLAI_ROUTER_REMOTE_BIT (UINT64_C(1) << 63)

/* Token id given to on_token for text from a remote upstream (its ids are
 * not the local model's): fronts send no token ids for it. */
#define RLAI_ROUTER_REMOTE_TOKEN ((rlai_token)-1)

/* Routing policy ("routing" in the config, docs/REMOTE.md). */
typedef struct rlai_route_policy {
    int spill_queued;                 /* spill a local-model request to an upstream with a spill_model
                                         when the local engine has at least this many queued (0 = never) */
    bool spill_long_prompts;          /* spill a prompt the local engine refuses as too long
                                         (context, prompt limit) (default true) */
    bool affinity;                    /* prefix affinity among upstreams (default true); false = least
                                         loaded */
} rlai_route_policy;

void rlai_route_policy_init(rlai_route_policy *p);

struct rlai_upstream_config;

/* Creates a router in front of `engine` (borrowed; must outlive the
 * router). *out is owned by the caller (rlai_router_free). Returns 0 or
 * RLAI_ERR_INVALID_ARG / RLAI_ERR_NOMEM. */
int rlai_router_new(rlai_engine *engine, rlai_router **out);

/* Adds the remote upstreams (copied; their API keys are read now) and the
 * policy (copied; NULL = defaults). Call once, before the first submit.
 * Returns 0 or a negative error with a message naming the bad key. */
int rlai_router_set_upstreams(rlai_router *r, const struct rlai_upstream_config *ups, int n,
                              const rlai_route_policy *policy, char *err, size_t errlen);

/* Number of remote model names (the "models" keys of every upstream) and
 * the i-th (borrowed, valid until rlai_router_free); NULL past the end. */
int rlai_router_n_remote_models(const rlai_router *r);
const char *rlai_router_remote_model(const rlai_router *r, int i, const char **upstream);

/* True when `model` names a remote model: a "models" key of an upstream
 * or "UPSTREAM/NAME" for a configured upstream. */
bool rlai_router_is_remote_model(const rlai_router *r, const char *model);

/* Prometheus text of the routing counters and upstream health (appended
 * to /metrics), malloc'd (caller frees); "" when there are no upstreams;
 * NULL when out of memory. */
char *rlai_router_render_metrics(rlai_router *r);

/* Upstream health for `rlai stats`: a malloc'd JSON object text
 * {"NAME": {"breaker", "active", "waiting", "requests", "ok", "failed",
 * "cancelled", "timeouts", "retries", "attempts_failed", "breaker_opens"}}
 * ({} without upstreams; caller frees), or NULL when out of memory. */
char *rlai_router_upstreams_json(rlai_router *r);

/* Waits until no remote request is running (their on_done returned), at
 * most timeout_ms; call after cancelling them at shutdown, before the
 * transports that their callbacks write to stop. Returns how many are
 * left (0 without upstreams). */
int rlai_router_wait_remote(rlai_router *r, int timeout_ms);

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

/* While waiting for routed request id's output on a thread that will
 * write it (an HTTP connection thread): for a remote request, drives the
 * remote transfers on this thread until ready(arg), timeout_ms or stop
 * (rlai_remote_pump: hold no lock a callback takes). Returns 1 when it
 * drove, 0 when the caller should wait as usual (a local request, no
 * upstreams, or another thread is pumping). */
int rlai_router_pump(rlai_router *r, uint64_t id, int timeout_ms, bool (*ready)(void *arg), void *arg);

/* The local engine behind the router (borrowed). */
rlai_engine *rlai_router_engine(const rlai_router *r);

#endif
