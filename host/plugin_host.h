/* plugin_host.h - loads plugins (include/rlai/plugin.h), keeps the command
 * registry and runs command calls on worker threads.
 *
 * The host is transport-agnostic: whoever starts a call (the daemon for a
 * protocol `call`, the HTTP front, `rlai fit` in-process) passes a sink
 * that turns the call's output into frames, lines or HTTP chunks. Sink
 * callbacks run on the worker thread of the call; exactly one of done or
 * error ends every call that rlai_plugin_host_call() accepted.
 *
 * Threads: load/unload on one thread (the daemon's main thread);
 * rlai_plugin_host_call, _cancel, _commands_json and _find are thread-safe.
 */
#ifndef RLAI_HOST_PLUGIN_HOST_H
#define RLAI_HOST_PLUGIN_HOST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "rlai/engine.h"
#include "router.h"

struct rlai_metrics;

/* Deadline of a plugin call when neither the request, the manifest nor
 * the configuration gives one. */
#define RLAI_PLUGIN_DEFAULT_TIMEOUT_MS 60000

typedef struct rlai_plugin_host rlai_plugin_host;

/* Metrics of the engine jobs a call ran (the last generate of the call). */
typedef struct rlai_call_metrics {
    bool valid;                     /* false: the call ran no engine job */
    int prompt_tokens, reused_tokens, gen_tokens;
    int drafted_tokens, accepted_tokens;   /* speculative decoding */
    double queue_ms, ttft_ms, prefill_tps, decode_tps;
} rlai_call_metrics;

typedef struct rlai_call_sink {
    /* A text piece (whole UTF-8 characters). Returns 0, or non-zero when
     * the receiver is gone (the call is then cancelled). */
    int (*token)(void *user, const char *text, size_t len);
    /* One result value (borrowed for the callback). Returns 0, > 0 when
     * the receiver is gone (the call is cancelled), or a negative
     * rlai_error when this transport cannot carry the value (the call then
     * ends with that error and the plugin gets it back). */
    int (*result)(void *user, const cJSON *value);
    /* Terminal: success. m->valid tells whether metrics exist. */
    void (*done)(void *user, const char *stop, const rlai_call_metrics *m);
    /* Terminal: failure; code is a negative rlai_error. */
    void (*error)(void *user, int code, const char *msg);
    void *user;
} rlai_call_sink;

typedef struct rlai_plugin_host_params {
    rlai_engine *engine;            /* shared engine, borrowed; NULL = no model (engine
                                       jobs answer RLAI_ERR_NOT_IMPLEMENTED) */
    rlai_router *router;            /* borrowed; engine jobs are submitted through it; NULL =
                                       the host makes its own router in front of `engine` */
    int workers;                    /* worker threads; 0 = 4 */
    int max_queue;                  /* calls waiting for a worker; 0 = 64; past it calls
                                       are refused at once with RLAI_ERR_BUSY */
    int call_timeout_ms;            /* deadline of a call from its acceptance, unless the
                                       request or the manifest's "timeout_ms" gives one;
                                       0 = RLAI_PLUGIN_DEFAULT_TIMEOUT_MS, < 0 = none */
    int max_stuck;                  /* extra worker threads started to replace workers whose
                                       handler runs past its deadline; 0 = workers */
    struct rlai_metrics *metrics;   /* timed-out calls and stuck workers go here; borrowed,
                                       may be NULL, must outlive the host */
    int max_prompt_tokens;          /* limit for engine jobs; 0 = engine context */
    const cJSON *plugin_config;     /* {"<plugin name>": {overrides}} or NULL; copied */
    bool quiet;                     /* no info log lines (errors still go to stderr) */
} rlai_plugin_host_params;

/* Creates a host with no plugins and starts its workers. *out owned by the
 * caller (rlai_plugin_host_free). */
int rlai_plugin_host_new(const rlai_plugin_host_params *p, rlai_plugin_host **out);

/* Stops accepting calls, cancels the queued and running ones and waits up
 * to timeout_ms (< 0: for ever) for every worker to finish. Past that, the
 * calls still queued or running are ended by the host (done "cancelled"
 * to their sinks, so every caller gets its terminal) and their handlers
 * are left running. Returns the number of handlers still running (0 when
 * all ended). Idempotent: a second call returns the first one's count. */
int rlai_plugin_host_stop(rlai_plugin_host *h, int timeout_ms);

/* rlai_plugin_host_stop(h, -1) unless stop already ran, then, when no
 * handler runs any more, runs each plugin's fini, unpins what plugins
 * pinned, unloads and frees. When stop left handlers running, the host is
 * abandoned instead: nothing is freed or unloaded (a late handler still
 * finds its call, the host and its library) and the memory stays
 * reachable until the process exits. Accepts NULL; nulls *self_p. */
void rlai_plugin_host_free(rlai_plugin_host **self_p);

/* Loads one plugin folder (holding manifest.json). Returns 0, or a negative
 * error with a message naming the file and the problem in err. A failed
 * load leaves no trace (registrations undone, library unloaded). */
int rlai_plugin_host_load(rlai_plugin_host *h, const char *dir, char *err, size_t errlen);

/* Loads every sub-folder of `root` that holds a manifest.json, in name
 * order. Failures are logged to stderr and skipped. Returns the number of
 * plugins loaded, or a negative error when root cannot be read. */
int rlai_plugin_host_load_all(rlai_plugin_host *h, const char *root);

/* Starts a call of `command` with `params_json` (NULL or "" = {}).
 * Returns 0 when the call was queued: the sink then gets its terminal
 * callback exactly once, on a worker thread (possibly before this returns).
 * Returns a negative error and never calls the sink otherwise, with a
 * message in err: RLAI_ERR_NOT_FOUND (unknown command), RLAI_ERR_INVALID_ARG
 * (params not a JSON object), RLAI_ERR_NOT_IMPLEMENTED (command needs the
 * engine, none loaded), RLAI_ERR_BUSY (queue full), RLAI_ERR_CANCELLED
 * (host stopping). *call_id (may be NULL) receives a handle for cancel. */
int rlai_plugin_host_call(rlai_plugin_host *h, const char *command, const char *params_json,
                          const rlai_call_sink *sink, uint64_t *call_id, char *err, size_t errlen);

/* rlai_plugin_host_call with a deadline for this call: timeout_ms > 0
 * overrides the manifest's and the host's (0 = those). A call past its
 * deadline, queued or running, ends with RLAI_ERR_TIMEOUT and a message
 * naming the command and the deadline; a running handler keeps its worker
 * until it returns (its late output is dropped) and a replacement worker
 * serves the queue meanwhile (up to max_stuck of them). */
int rlai_plugin_host_call_timed(rlai_plugin_host *h, const char *command, const char *params_json,
                                int timeout_ms, const rlai_call_sink *sink, uint64_t *call_id, char *err,
                                size_t errlen);

/* Handlers running now / running past their deadline now. */
int rlai_plugin_host_running(rlai_plugin_host *h);
int rlai_plugin_host_stuck(rlai_plugin_host *h);

/* Asks a call to stop (its engine job is cancelled; the handler sees
 * cancelled() true). Returns 0 or RLAI_ERR_NOT_FOUND once its handler has
 * returned (a call that timed out counts as present while its handler
 * still runs). */
int rlai_plugin_host_cancel(rlai_plugin_host *h, uint64_t call_id);

/* The registry as JSON: {"commands": [{"name", "description",
 * "parameters" (schema object), "plugin", "streams"}...]} sorted by name.
 * Caller owns the result. */
cJSON *rlai_plugin_host_commands_json(rlai_plugin_host *h);

/* Loaded plugins as JSON: [{"name", "version", "description", "dir",
 * "commands": [names]}...]. Caller owns the result. */
cJSON *rlai_plugin_host_plugins_json(rlai_plugin_host *h);

/* Number of registered commands. */
int rlai_plugin_host_n_commands(rlai_plugin_host *h);

/* The chat models plugins offer (register_chat_model), in registration
 * order: [{"id", "plugin", "description" (when given)}...]. Caller owns
 * the result. */
cJSON *rlai_plugin_host_chat_models_json(rlai_plugin_host *h);

/* Looks up a chat model by its full name ("<plugin>/<id>") or, when
 * by_id, by the id alone (the first registered with that id). On success
 * returns 0 and malloc'd copies (caller frees): *name_out (full name),
 * *command and *params (the fixed params object; caller cJSON_Delete);
 * else RLAI_ERR_NOT_FOUND (or RLAI_ERR_NOMEM). */
int rlai_plugin_host_chat_model(rlai_plugin_host *h, const char *model, bool by_id, char **name_out, char **command,
                                cJSON **params);

/* Worker figures: threads alive now, handlers waiting for an engine job,
 * and extra threads started for those (any pointer may be NULL). */
void rlai_plugin_host_threads(rlai_plugin_host *h, int *alive, int *engine_waits, int *handoff);

#endif
