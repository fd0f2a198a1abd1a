/* config.h - `rlai serve` configuration: defaults, a JSON file (cJSON) and
 * command-line flags that override it.
 *
 * File format (every key optional):
 *   { "model": "PATH", "threads": 2, "context": 4096, "kv_blocks": 0, "kv_type": "f16",
 *     "device": "auto", "spec": "auto", "spec_max_draft": 8,
 *     "endpoints": { "zmq": "ipc://...", "zmq_tcp": "tcp://127.0.0.1:5677",
 *                    "pipe": "PATH", "http": "127.0.0.1:5676", "allow_remote": false },
 *     "limits": { "max_frame_bytes": 4194304, "max_prompt_tokens": 4096,
 *                 "max_inflight_per_client": 8, "max_inflight_total": 64,
 *                 "request_timeout_s": 0 },
 *     "prefix_cache": true,
 *     "shutdown_timeout_s": 5,
 *     "auth": { "enabled": true, "api_key": "KEY", "api_key_file": "PATH" },
 *     "http": { "cors_origins": ["https://app.example"], "max_connections": 256,
 *               "max_connections_per_ip": 64 },
 *     "plugins": { "dir": "PATH", "enabled": true, "workers": 4, "max_queue": 64,
 *                  "call_timeout_s": 60,
 *                  "config": { "<plugin>": { overrides of its manifest config } } },
 *     "upstreams": [ { "name": "cluster", "base_url": "http://10.0.0.5:8000/v1",
 *                      "api_key_env": "CLUSTER_KEY", "models": { "llama-70b": "meta-llama/..." },
 *                      "spill_model": "...", "max_concurrency": 16, ... } ],
 *     "routing": { "spill_queued": 0, "spill_long_prompts": true, "affinity": true } }
 * (upstreams and routing: docs/REMOTE.md, host/upstream.h)
 * An endpoint set to "" (or null) is disabled.
 */
#ifndef RLAI_HOST_CONFIG_H
#define RLAI_HOST_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Default address of the HTTP front. When it is taken (another engine),
 * the daemon serves without HTTP and says so; any other address must bind. */
#define RLAI_HTTP_DEFAULT "127.0.0.1:5676"

typedef struct rlai_config {
    char *model;             /* all strings malloc'd, owned by the config */
    int threads;             /* 0 = all CPUs */
    int context;             /* 0 = model's (capped at 8192) */
    int kv_blocks;           /* 0 = one full context */
    bool kv_q8_0;            /* KV cache in q8_0 instead of f16 ("kv_type": "q8_0") */
    char *device;            /* "device": auto|cpu|cuda|cuda:N; NULL = auto */
    int spec;                /* "spec" / --spec: rlai_spec_mode (auto|off|ngram); 0 = auto */
    int spec_max_draft;      /* "spec_max_draft" / --spec-max-draft: 1..16; 0 = engine's (8) */
    int spec_lookup_min;     /* "spec_lookup_min" / --spec-lookup-min: with a draft model, prompt
                                lookup drafts text repeating an earlier passage of this many
                                tokens (1..8); -1 = never; 0 = engine's (4) */
    char *zmq;               /* NULL = disabled */
    char *zmq_tcp;           /* NULL = disabled (default) */
    char *pipe;              /* NULL = disabled */
    char *http;              /* "ADDR:PORT" of the HTTP front; NULL = disabled */
    bool allow_remote;       /* permit a non-loopback zmq_tcp address */
    size_t max_frame;
    int max_prompt_tokens;
    int max_inflight_client;
    int max_inflight_total;
    int request_timeout_s;   /* wall-clock cap per generation (wire, HTTP); 0 = none (default) */
    bool no_prefix_cache;    /* "prefix_cache": false / --no-prefix-cache */
    char *plugins_dir;       /* "plugins": {"dir"}; NULL = the default folder */
    char **plugin_dirs_extra; /* --plugins DIR (repeatable): folders loaded after plugins_dir (malloc'd) */
    int n_plugin_dirs_extra;
    bool plugins_off;        /* "plugins": {"enabled": false} / --no-plugins */
    int plugin_workers;      /* "plugins": {"workers"}; 0 = 4 */
    char *plugin_config;     /* "plugins": {"config": {...}} as JSON text, or NULL */
    int plugin_call_timeout_s; /* "plugins": {"call_timeout_s"}: deadline of a plugin call
                                  (request and manifest may set their own); 0 = none; default 60 */
    int plugin_max_queue;    /* "plugins": {"max_queue"}: calls waiting for a worker before
                                BUSY; 0 = limits.max_inflight_total */
    int shutdown_timeout_s;  /* "shutdown_timeout_s": SIGTERM to exit at most (plus the
                                server's socket teardown); default 5 */
    bool auth_off;           /* "auth": {"enabled": false} / --no-auth: HTTP and zmq_tcp keyless */
    char *api_key;           /* "auth": {"api_key"}; NULL = env RLAI_API_KEY, then the key file */
    char *api_key_file;      /* "auth": {"api_key_file"} / --api-key-file; NULL = default file */
    /* "http": {...}, the HTTP front (docs/SERVE.md) */
    char **cors_origins;     /* "cors_origins" / --cors-origin: browser origins allowed (malloc'd) */
    int n_cors_origins;
    int http_max_connections;        /* "max_connections" / --max-connections */
    int http_max_connections_per_ip; /* "max_connections_per_ip" / --max-connections-per-ip; 0 = auto */
    int http_header_timeout_s;       /* "header_timeout_s": seconds to deliver a whole request; default 10 */
    char *mmproj;            /* "mmproj" / --mmproj: a vision projector GGUF loaded with the
                                model (engine/vision.h, docs/SCREEN.md "Vision"); NULL = none */
    char *draft_model;       /* "draft_model" / --draft-model: a GGUF with the model's tokenizer
                                that drafts for speculative decoding; NULL = none */
    /* remote upstreams and routing (docs/REMOTE.md) */
    struct rlai_upstream_config *upstreams;  /* "upstreams": [...] (malloc'd, host/upstream.h) */
    int n_upstreams;
    int route_spill_queued;          /* "routing": {"spill_queued"}: 0 = never spill on queue length */
    bool route_no_spill_long;        /* "routing": {"spill_long_prompts": false} */
    bool route_no_affinity;          /* "routing": {"affinity": false} */
} rlai_config;

/* Fills defaults: default model path, default private endpoints, limits.
 * Returns 0 or RLAI_ERR_NOMEM. */
int rlai_config_defaults(rlai_config *c, const char *default_model);

/* Reads a JSON config file over the current values. Unknown keys and wrong
 * types are errors naming the key (a typo must not be silently ignored).
 * Returns 0, RLAI_ERR_IO or RLAI_ERR_FORMAT with a message in err. */
int rlai_config_load_file(rlai_config *c, const char *path, char *err, size_t errlen);

/* Same over a JSON text (for tests). */
int rlai_config_load_json(rlai_config *c, const char *json, char *err, size_t errlen);

/* Effective deadline of a generation in ms: the smaller non-zero of the
 * request's own timeout_ms (0 = none) and the configured cap cap_s
 * (limits.request_timeout_s, 0 = none); 0 = no deadline. */
uint64_t rlai_config_timeout_ms(uint64_t requested_ms, int cap_s);

/* Checks the final values: positive limits, loopback-only TCP unless
 * allow_remote. Returns 0 or RLAI_ERR_INVALID_ARG with a message. */
int rlai_config_validate(const rlai_config *c, char *err, size_t errlen);

/* Appends a copy of origin to c->cors_origins. Returns 0 or RLAI_ERR_NOMEM. */
int rlai_config_add_cors_origin(rlai_config *c, const char *origin);

/* Empties c->cors_origins. */
void rlai_config_clear_cors_origins(rlai_config *c);

/* Appends a copy of dir to plugin_dirs_extra (owned by the config).
 * Returns 0 or RLAI_ERR_NOMEM. */
int rlai_config_add_plugin_dir(rlai_config *c, const char *dir);

/* Replaces a string field (copies s; NULL or "" disables). */
int rlai_config_set_str(char **field, const char *s);

void rlai_config_free(rlai_config *c);

#endif
