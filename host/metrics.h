/* metrics.h - daemon-wide counters and histograms, rendered in the
 * Prometheus text exposition format for `GET /metrics`.
 *
 * Every transport feeds the same object: the HTTP front for its requests
 * and generations, the daemon's router for generate/chat completions over
 * ZeroMQ and the named pipe (transport label "ipc"). Engine-wide figures
 * (KV blocks, running/queued) come from rlai_engine_get_stats at render
 * time, so they always match `rlai stats`.
 *
 * Thread-safe: every function may be called from any thread (one mutex;
 * each call holds it for a few hundred nanoseconds at most). Labels are
 * short static names chosen by the caller; at most 64 distinct
 * (endpoint, transport) pairs and 8 transports are tracked, further ones
 * are folded into endpoint "other" / transport "other".
 */
#ifndef RLAI_HOST_METRICS_H
#define RLAI_HOST_METRICS_H

#include <stddef.h>
#include "rlai/engine.h"

typedef struct rlai_metrics rlai_metrics;

/* Creates an empty metrics object. *out owned by the caller
 * (rlai_metrics_free). Returns 0 or RLAI_ERR_NOMEM. */
int rlai_metrics_new(rlai_metrics **out);

/* Frees the object. Accepts NULL; nulls *self_p. */
void rlai_metrics_free(rlai_metrics **self_p);

/* Counts one request: endpoint e.g. "chat_completions", "generate";
 * transport "http" or "ipc". Strings are copied. m may be NULL (no-op). */
void rlai_metrics_count_request(rlai_metrics *m, const char *endpoint, const char *transport);

/* Counts one plugin call that ended with TIMEOUT (command name copied,
 * sanitised; past 63 distinct names they count as "other"). m may be NULL. */
void rlai_metrics_count_plugin_timeout(rlai_metrics *m, const char *command);

/* Counts one plugin call received on `transport` ("http", "ipc"): in
 * rlai_requests_total{endpoint="plugin_call"} and in
 * rlai_plugin_calls_total{command,transport} (command sanitised as for
 * timeouts; past 63 distinct pairs they count as "other"). m may be NULL. */
void rlai_metrics_count_plugin_call(rlai_metrics *m, const char *command, const char *transport);

/* Sets the gauge of plugin handlers running past their deadline. m may be NULL. */
void rlai_metrics_set_plugin_workers_stuck(rlai_metrics *m, int n);

/* Counts one HTTP response by status code (200, 400, ...). m may be NULL. */
void rlai_metrics_count_http_status(rlai_metrics *m, int status);

/* Records one finished generation on `transport`: status < 0 counts an
 * error; otherwise gm (borrowed) feeds the TTFT and decode-rate
 * histograms (when at least one / two tokens were generated) and the
 * token counters. m may be NULL. */
void rlai_metrics_observe_generation(rlai_metrics *m, const char *transport, int status,
                                     const rlai_gen_metrics *gm);

/* Renders everything as Prometheus text. es (may be NULL) supplies the
 * engine gauges; uptime_s the process uptime. Returns a malloc'd
 * NUL-terminated string the caller frees, or NULL when out of memory. */
char *rlai_metrics_render(rlai_metrics *m, const rlai_engine_stats *es, double uptime_s);

#endif
