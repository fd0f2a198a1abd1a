/* http.h - the OpenAI-compatible HTTP front of `rlai serve` (libmicrohttpd).
 *
 * Routes (docs/SERVE.md has the details and examples):
 *   POST /v1/chat/completions   chat; "stream": true answers Server-Sent Events
 *   POST /v1/completions        raw-prompt completion, same streaming rules
 *   GET  /v1/models, /v1/models/{id}
 *   GET  /v1/plugins            the command registry
 *   POST /v1/plugins/{command}  a plugin command (body = params; SSE with
 *                               ?stream=true or Accept: text/event-stream)
 *   GET  /health, /metrics      liveness and Prometheus text
 * Errors use OpenAI's shape {"error": {"message", "type", "param", "code"}}.
 *
 * Threads: libmicrohttpd runs one thread per connection. Generations go to
 * the shared engine with rlai_engine_submit; their callbacks (on the
 * daemon's engine thread) only append text to a per-request queue under a
 * mutex and signal a condition variable, which the connection thread turns
 * into SSE chunks or one JSON body. A client that disconnects has its
 * engine request (or plugin call) cancelled: the connection thread watches
 * the socket for a hang-up while it waits, and a failed write ends the
 * request through libmicrohttpd's completion callback. A half-close
 * (shutdown(SHUT_WR)) is not a disconnect: a FIN is probed with one write
 * (an SSE comment, or an interim 100 Continue) and only a reset cancels.
 *
 * Guards: POST bodies must be application/json (415), strict JSON (UTF-8,
 * no \u0000, no trailing data), a request whose Origin is not in
 * cors_origins gets 403, and the Host header must be a loopback name while
 * the bind address is loopback (docs/SERVE.md, "Browser access and CORS").
 */
#ifndef RLAI_HOST_HTTP_H
#define RLAI_HOST_HTTP_H

#include <stdbool.h>
#include <stddef.h>

#include "metrics.h"
#include "plugin_host.h"
#include "rlai/engine.h"
#include "router.h"

typedef struct rlai_http rlai_http;

/* Defaults of the connection limits (docs/SERVE.md, "Connection limits"). */
#define RLAI_HTTP_DEFAULT_MAX_CONNECTIONS 256
#define RLAI_HTTP_DEFAULT_MAX_PER_IP 64      /* non-loopback binds only */
#define RLAI_HTTP_DEFAULT_HEADER_TIMEOUT_S 10


typedef struct rlai_http_params {
    const char *bind;             /* "ADDR:PORT": "127.0.0.1:5676", "localhost:8080",
                                     "[::1]:5676", "0.0.0.0:80"; port 0 = any free port */
    bool allow_remote;            /* permit a non-loopback bind address */
    rlai_engine *engine;          /* borrowed; someone else runs rlai_engine_step */
    rlai_router *router;          /* borrowed; every generation is submitted through it */
    const char *model_path;       /* the model file; its basename without .gguf is the model id */
    rlai_plugin_host *plugins;    /* borrowed; NULL = plugin routes answer 404 */
    rlai_metrics *metrics;        /* borrowed; may be NULL */
    size_t max_body;              /* request body limit in bytes (413 above); 0 = 4 MiB */
    int max_prompt_tokens;        /* 400 context_length_exceeded above; 0 = engine context */
    int max_inflight;             /* generations + plugin calls at once (429 above); 0 = 64 */
    int stop_wait_ms;             /* rlai_http_stop's longest wait for requests to end; 0 = 10 s */
    int request_timeout_s;        /* cap on every generation's wall clock (timeout_ms); 0 = none */
    int max_connections;          /* simultaneous connections; 0 = 256 */
    const char *const *cors_origins; /* browser origins allowed to call ("https://app.example:8443");
                                     a request with any other Origin header gets 403 */
    int n_cors_origins;
    int max_connections_per_ip;   /* connections from one client address; 0 = auto: none on a
                                     loopback bind (every local client is 127.0.0.1: the
                                     connection guard handles floods), 64 otherwise */
    int header_timeout_s;         /* a connection must deliver a whole request (headers and
                                     body) this long after accept or after its previous answer,
                                     else it is closed; 0 = 10 (host/conn_guard.h) */
    bool quiet;                   /* no per-request log lines (errors still go to stderr) */
    const char *api_key;          /* every route except GET /health and OPTIONS needs
                                     "Authorization: Bearer <api_key>" (401 invalid_api_key
                                     otherwise); NULL = no authentication. Copied. */
} rlai_http_params;

/* Binds p->bind and starts serving. p and its strings are copied; the
 * borrowed objects (engine, plugins, metrics) must outlive rlai_http_stop.
 * Returns 0 or a negative rlai_error with a message in err:
 * RLAI_ERR_INVALID_ARG (bad address, non-loopback without allow_remote),
 * RLAI_ERR_BUSY (address in use), RLAI_ERR_IO (other bind failures).
 * *out owned by the caller (rlai_http_stop). */
int rlai_http_start(const rlai_http_params *p, rlai_http **out, char *err, size_t errlen);

/* True when o is a usable CORS origin: http:// or https:// followed by a
 * host and an optional port, nothing else (no path, no "*"); one trailing
 * '/' is tolerated and dropped. */
bool rlai_http_origin_valid(const char *o);

/* The TCP port actually bound (useful with port 0). */
int rlai_http_port(const rlai_http *h);

/* Stops accepting connections, ends every running stream with an error
 * event (and cancels its engine request or plugin call), waits for the
 * engine callbacks of those requests to finish (the engine thread must
 * still be running), closes the connections and frees. Accepts NULL;
 * nulls *self_p. */
void rlai_http_stop(rlai_http **self_p);

#endif
