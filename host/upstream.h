/* upstream.h - one remote OpenAI-compatible engine (issue 16): its
 * configuration, API key, circuit breaker, the request body sent to it
 * and the decoding of the chunks it streams back. The transfers
 * themselves run in host/remote.c; the routing decision in host/router.c.
 * docs/REMOTE.md documents the configuration keys.
 */
#ifndef RLAI_HOST_UPSTREAM_H
#define RLAI_HOST_UPSTREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rlai/engine.h"

typedef struct cJSON cJSON;

typedef struct rlai_route_request rlai_route_request;

/* A model name shown to clients and the name the upstream knows it by. */
typedef struct rlai_upstream_model {
    char *name;                 /* malloc'd */
    char *remote;               /* malloc'd */
} rlai_upstream_model;

/* One "upstreams" entry of the config (docs/REMOTE.md). Strings malloc'd,
 * owned by the struct (rlai_upstream_config_clear). */
typedef struct rlai_upstream_config {
    char *name;                 /* "name": label in /metrics, stats and "UPSTREAM/MODEL" names */
    char *base_url;             /* "base_url": http(s)://host:port/v1 (the OpenAI base URL) */
    char *api_key_env;          /* "api_key_env": name of an environment variable holding the key */
    char *api_key_file;         /* "api_key_file": a file holding the key (mode 0600 or stricter) */
    rlai_upstream_model *models;/* "models": {"shown name": "upstream's name"} */
    int n_models;
    char *spill_model;          /* "spill_model": the upstream's name of the LOCAL model; requests for
                                   the local model may spill here. NULL = takes no spills */
    int max_concurrency;        /* "max_concurrency": streams at once (default 16) */
    int max_queue;              /* "max_queue": requests waiting for a stream slot (default 64) */
    int connect_timeout_ms;     /* "connect_timeout_ms" (default 5000) */
    int first_token_timeout_ms; /* "first_token_timeout_ms": an attempt without a first token by then
                                   fails (and may be retried) (default 60000) */
    int stall_timeout_ms;       /* "stall_timeout_ms": no byte for this long mid-stream = failure
                                   (default 30000) */
    int max_retries;            /* "max_retries": extra attempts before the first token (default 2) */
    int retry_backoff_ms;       /* "retry_backoff_ms": first backoff, doubled per retry (default 200) */
    int breaker_failures;       /* "breaker_failures": consecutive failed attempts that open the
                                   breaker (default 5) */
    int breaker_cooldown_ms;    /* "breaker_cooldown_ms": open time before one trial (default 10000) */
    char *proxy;                /* "proxy": an HTTP(S) proxy URL; NULL = none (the environment's
                                   http_proxy / https_proxy are NOT used) */
    char *ca_file;              /* "ca_file": PEM file of the CA certificate(s) that sign an https
                                   upstream's certificate (a cluster's own CA); NULL = the system's
                                   trust store. The certificate and host name are always verified */
    bool sampling_extras;       /* "sampling_extras": also send top_k, min_p, repetition_penalty
                                   (vLLM, SGLang, llama.cpp, rlai accept them) (default true) */
} rlai_upstream_config;

/* Fills the defaults above (no strings). */
void rlai_upstream_config_init(rlai_upstream_config *c);

/* Frees the strings and zeroes *c. */
void rlai_upstream_config_clear(rlai_upstream_config *c);

/* Deep copy of src into *dst (zeroed first). Returns 0 or RLAI_ERR_NOMEM
 * (then *dst is cleared). */
int rlai_upstream_config_copy(rlai_upstream_config *dst, const rlai_upstream_config *src);

/* Checks a config entry: a name of [A-Za-z0-9_.-], an http:// or https://
 * base_url, at most one key source, positive limits. Returns 0 or
 * RLAI_ERR_INVALID_ARG with a message naming the key. */
int rlai_upstream_config_check(const rlai_upstream_config *c, char *err, size_t errlen);

/* Reads the API key of c: the environment variable api_key_env, else the
 * file api_key_file (refused when group or others may read or write it,
 * or it is not a regular file), else none (*key = NULL). Surrounding
 * white space is trimmed. *key malloc'd, owned by the caller. Returns 0,
 * RLAI_ERR_NOT_FOUND (the variable is unset or empty), RLAI_ERR_IO or
 * RLAI_ERR_INVALID_ARG (permissions) with a message. */
int rlai_upstream_read_key(const rlai_upstream_config *c, char **key, char *err, size_t errlen);

/* ---- circuit breaker (one per upstream; times in ms of any monotonic clock) */
typedef enum rlai_breaker_state {
    RLAI_BREAKER_CLOSED = 0,
    RLAI_BREAKER_OPEN = 1,
    RLAI_BREAKER_HALF_OPEN = 2,
} rlai_breaker_state;

typedef struct rlai_breaker {
    rlai_breaker_state state;
    int fails;                  /* consecutive failed attempts */
    int threshold, cooldown_ms;
    uint64_t opened_at;
    bool trial_out;             /* half-open: the one trial attempt is running */
    uint64_t opens_total;
} rlai_breaker;

void rlai_breaker_init(rlai_breaker *b, int threshold, int cooldown_ms);
/* May an attempt start now? CLOSED: yes. OPEN: no until cooldown_ms have
 * passed, then the breaker turns HALF_OPEN and lets exactly one trial
 * through (true, trial_out set). HALF_OPEN: no while the trial runs. */
bool rlai_breaker_allow(rlai_breaker *b, uint64_t now_ms);
/* Same question without changing anything (for a submit that only wants
 * to know whether to refuse at once). */
bool rlai_breaker_would_allow(const rlai_breaker *b, uint64_t now_ms);
/* An attempt reached its first token (or ended well): CLOSED, fails = 0. */
void rlai_breaker_success(rlai_breaker *b);
/* An attempt failed (connect error, 5xx, 429, malformed or stalled
 * stream): counts; HALF_OPEN or threshold reached -> OPEN at now_ms. */
void rlai_breaker_failure(rlai_breaker *b, uint64_t now_ms);
/* Static name: "closed", "open", "half_open". */
const char *rlai_breaker_state_name(rlai_breaker_state s);

/* ---- the request sent upstream */

/* Builds the JSON body for rq sent to an upstream as remote_model: chat
 * messages -> a chat-completions body, a prompt -> a completions body;
 * stream true with usage; temperature, top_p, max_tokens, seed, stop,
 * presence/frequency penalties when set (and, when extras is true, top_k
 * and min_p always -- 0 = off -- and repetition_penalty when not 1), so
 * the upstream's own defaults never replace the request's; response_format parsed from
 * rq->response_format. *chat says which endpoint. *body malloc'd (caller
 * frees). Returns 0, RLAI_ERR_NOMEM, or RLAI_ERR_UNSUPPORTED with a
 * message for what a remote model cannot honour (top_logprobs without
 * rq->on_remote_logprobs, a grammar without response_format, ignore_eos
 * without extras). */
int rlai_upstream_build_body(const rlai_route_request *rq, const char *remote_model, bool extras, char **body,
                             bool *chat, char *err, size_t errlen);

/* One decoded stream chunk. text is malloc'd (or NULL when the chunk has
 * none); the caller frees it. */
typedef struct rlai_upstream_delta {
    char *text;
    size_t len;
    cJSON *logprobs;            /* NULL, or the chunk's tokens' log-probabilities as a cJSON array of
                                   chat entries {token, logprob, bytes, top_logprobs: [{token,
                                   logprob, bytes}]} (completions' legacy arrays converted); the
                                   caller owns it (cJSON_Delete) */
    cJSON *tool_calls;          /* NULL, or the chunk's delta.tool_calls array (a copy; the caller
                                   owns it) */
    rlai_stop_reason finish;    /* NONE, or EOG / STRING / MAX_TOKENS from finish_reason */
    int prompt_tokens, completion_tokens;   /* from "usage", -1 when absent */
    int accepted_prediction, rejected_prediction;   /* usage.completion_tokens_details, -1 when absent */
} rlai_upstream_delta;

/* Decodes the data of one SSE event (len bytes): chat chunks
 * (choices[0].delta.content, .tool_calls) or completion chunks
 * (choices[0].text), choices[0].logprobs, finish_reason, usage. Returns 0, 1 for the "[DONE]" sentinel,
 * RLAI_ERR_FORMAT (not JSON or not a chunk; msg says why) or
 * RLAI_ERR_DISCONNECTED (the upstream sent an {"error": ...} object; msg has its
 * message). msg may be NULL. */
int rlai_upstream_parse_chunk(const char *data, size_t len, rlai_upstream_delta *out, char *msg, size_t msglen);

#endif
