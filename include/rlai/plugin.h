/* rlai/plugin.h - the RTX-LocalAI plugin ABI: the only header a plugin needs.
 *
 * A plugin is a shared object (.so / .dll) in its own folder next to a
 * manifest.json. The engine process (`rlai serve`) loads it at start and
 * calls its one entry point with a table of host functions. During that
 * call the plugin registers commands ("plugin.verb"); clients reach them
 * with the protocol's `call` request, `rlai call`, G-Assist and HTTP. All
 * plugins share one engine (model, KV cache, prefix cache, scheduler).
 *
 * Writing a plugin (see samples/plugin-template/ for a complete one):
 *
 *     #include <rlai/plugin.h>
 *     RLAI_PLUGIN_DECLARE();                  // the ABI record the host checks
 *
 *     static int hello(rlai_call *call, const cJSON *params, void *user) {
 *         const rlai_host_api *h = user;
 *         cJSON *r = cJSON_CreateObject();
 *         cJSON_AddStringToObject(r, "greeting", "hello");
 *         return h->reply_json(call, r);     // takes ownership of r
 *     }
 *
 *     RLAI_PLUGIN_EXPORT int rlai_plugin_init(const rlai_host_api *host,
 *                                             rlai_plugin *self, char **errmsg) {
 *         rlai_command_desc d = { .name = "demo.hello",
 *             .description = "Says hello.", .params_schema = "{\"type\":\"object\"}",
 *             .handler = hello, .user = (void *)host };
 *         return host->register_command(self, &d, sizeof d);
 *     }
 *
 * Loading, in order (the host refuses with a log line naming the file and
 * the values involved, and keeps serving without that plugin):
 *   1. manifest.json is read and validated (name, version, entry, ...).
 *   2. The entry file and manifest.json must be regular files (not
 *      symbolic links) owned by the user or root and not group/world-
 *      writable, and so must the plugin folder and its parent.
 *   3. dlopen(RTLD_NOW | RTLD_LOCAL); the symbol `rlai_plugin_abi_record`
 *      (from RLAI_PLUGIN_DECLARE) must exist; its major must equal the
 *      host's, its minor must not be newer than the host's, and its build
 *      signature must match.
 *   4. rlai_plugin_init() runs. It may register commands and set its state.
 *      If it returns non-zero, every registration it made is undone, the
 *      message in *errmsg (allocated with host->alloc; the host frees it) is
 *      logged, and the library is unloaded.
 *   5. At shutdown, after the last call has ended, the optional
 *      rlai_plugin_fini(state) runs, then the library is unloaded.
 *
 * ABI growth: rlai_host_api starts with abi_version and struct_size; new
 * members are only ever appended (each marked "since 1.x"). A plugin built
 * against a newer minor tests RLAI_HOST_HAS(host, member) before using a
 * member its host may lack. Structs the plugin passes in (command
 * descriptors, generation requests) are passed with their size, so an
 * older plugin's shorter struct keeps working. Structs the host fills
 * (rlai_gen_result) are written only up to the size they had in the ABI
 * minor the plugin was built for (its rlai_plugin_abi_record), so they can
 * grow too: an older plugin's shorter struct is never overrun.
 *
 * cJSON is part of the ABI: handlers receive and reply cJSON values, so a
 * plugin must be built against the same cJSON major version as the host
 * (RLAI_PLUGIN_SIGNATURE carries it and the host refuses a mismatch), and
 * values crossing the boundary are created and freed with the one cJSON
 * library the process has loaded (the host's).
 *
 * Threads: rlai_plugin_init and rlai_plugin_fini run on the host's main
 * thread. Command handlers run on the host's worker threads, several at a
 * time (one call per worker): a handler touching shared plugin state must
 * lock it. A handler may block (an engine job blocks its worker until it
 * ends; the host then starts a replacement worker when no other is idle,
 * so handlers waiting on the engine never starve the other calls); it
 * must not keep the call after it returns. Every call has a
 * deadline (request, manifest "timeout_ms", host default): past it the
 * call ends with RLAI_ERR_TIMEOUT for the client, cancelled() turns true
 * and later replies are dropped; a handler should check cancelled() and
 * return. Plugins run in the engine process with its privileges (no
 * isolation in this build; see docs/PLUGINS.md).
 *
 * Errors: functions return 0 (or a count) on success and a negative
 * rlai_error (rlai/error.h) on failure; host->strerror() names a code.
 * Nothing here sets errno.
 */
#ifndef RLAI_PLUGIN_H
#define RLAI_PLUGIN_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "rlai/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ABI version this header describes. A host accepts a plugin with the same
 * major and a minor not newer than its own. */
#define RLAI_PLUGIN_ABI_MAJOR 1
#define RLAI_PLUGIN_ABI_MINOR 4
#define RLAI_PLUGIN_ABI_VERSION ((uint32_t)(RLAI_PLUGIN_ABI_MAJOR << 16 | RLAI_PLUGIN_ABI_MINOR))

/* Build signature: what must agree between host and plugin beyond the
 * version numbers (pointer size, cJSON's major version). */
#define RLAI_PLUGIN_STR2_(x) #x
#define RLAI_PLUGIN_STR_(x) RLAI_PLUGIN_STR2_(x)
#define RLAI_PLUGIN_SIGNATURE \
    "rlai-abi p" RLAI_PLUGIN_STR_(__SIZEOF_POINTER__) " cjson" RLAI_PLUGIN_STR_(CJSON_VERSION_MAJOR)

#if defined(_WIN32)
#define RLAI_PLUGIN_EXPORT __declspec(dllexport)
#else
#define RLAI_PLUGIN_EXPORT __attribute__((visibility("default")))
#endif

/* The record the host reads before calling init. */
typedef struct rlai_plugin_abi {
    uint32_t major;
    uint32_t minor;
    const char *signature;          /* RLAI_PLUGIN_SIGNATURE at build time */
} rlai_plugin_abi;

/* Put once in a plugin's sources, at file scope. */
#define RLAI_PLUGIN_DECLARE()                                                  \
    RLAI_PLUGIN_EXPORT const rlai_plugin_abi rlai_plugin_abi_record = {        \
        RLAI_PLUGIN_ABI_MAJOR, RLAI_PLUGIN_ABI_MINOR, RLAI_PLUGIN_SIGNATURE }

typedef struct rlai_plugin rlai_plugin;   /* the host's handle of a loaded plugin (borrowed) */
typedef struct rlai_call rlai_call;       /* one command call in progress (borrowed) */

/* ------------------------------------------------------------------
 * Commands
 * ------------------------------------------------------------------ */

/* A command handler. Runs on a worker thread. `params` is the caller's
 * JSON object (never NULL; {} when the caller sent none), borrowed for the
 * call; it has passed the command's params_schema (calls that do not are
 * refused by the host with RLAI_ERR_INVALID_ARG and never reach here). `user` is the descriptor's user pointer.
 *
 * The handler answers through the call: any number of host->stream_text()
 * pieces and host->reply_json() results, in any order, then returns 0 (the
 * host sends `done`). Returning a negative rlai_error, or calling
 * host->reply_error() first, ends the call with an `error` frame instead;
 * a handler that returns an error without calling reply_error gets a
 * message made from host->strerror(code). Exactly one terminal frame is
 * sent per call, whatever the handler does. */
typedef int (*rlai_command_fn)(rlai_call *call, const cJSON *params, void *user);

enum rlai_command_flags {
    RLAI_CMD_STREAMS = 1u << 0,     /* sends text pieces (informative for clients) */
    RLAI_CMD_USES_ENGINE = 1u << 1, /* runs engine jobs: refused when no model is loaded */
};

typedef struct rlai_command_desc {
    const char *name;           /* "plugin.verb": the manifest's name, '.', a verb of
                                   [a-z0-9_]; copied */
    const char *description;    /* written for a language model choosing a tool; copied */
    const char *params_schema;  /* JSON Schema of the params object, as JSON text (an
                                   object); NULL = {"type":"object"}; copied. The host
                                   enforces it before calling the handler (the subset
                                   in docs/PLUGINS.md, "Parameter schemas"; extra keys
                                   pass unless "additionalProperties": false) */
    rlai_command_fn handler;    /* required */
    void *user;                 /* passed to the handler */
    uint32_t flags;             /* rlai_command_flags */
} rlai_command_desc;

/* ------------------------------------------------------------------
 * Engine jobs
 * ------------------------------------------------------------------ */

typedef struct rlai_plugin_message {
    const char *role;               /* "system", "user", "assistant" */
    const char *content;
} rlai_plugin_message;

/* What to generate. Zero-initialise, then set what you need: a field left
 * at 0 / NULL takes the engine default. Pass sizeof(rlai_gen_request). */
/* One entry of rlai_gen_request.logit_bias (since 1.4; OpenAI's logit_bias). */
typedef struct rlai_plugin_logit_bias {
    int32_t token;                  /* a token id of the model (host->tokenize) */
    float bias;                     /* -100..100, added to the token's logit; -100 bans it */
} rlai_plugin_logit_bias;

typedef struct rlai_gen_request {
    const char *prompt;             /* raw prompt (special-token text parsed), or NULL */
    const rlai_plugin_message *messages; /* or a conversation, formatted with the
                                       model's chat template (generation prompt added);
                                       content is never parsed for special tokens */
    int n_messages;
    int max_tokens;                 /* 0 = 256 */
    float temperature;              /* 0 = greedy */
    int top_k;                      /* 0 = off */
    float top_p;                    /* 0 = off (1.0) */
    float min_p;                    /* 0 = off */
    float repeat_penalty;           /* 0 = off (1.0) */
    uint64_t seed;
    const char *const *stop;        /* NULL-terminated stop strings, or NULL */
    bool stream;                    /* forward every text piece to the caller as a
                                       `token` frame while generating */
    const char *response_format;    /* added later in 1.1 (older plugins pass a smaller
                                       req_size and do not have it): JSON text of an
                                       OpenAI response_format object ({"type":"json_object"}
                                       or {"type":"json_schema","json_schema":{"schema":..}}),
                                       or NULL; the output is then JSON valid under it
                                       (docs/STRUCTURED.md). A bad or unsupported schema
                                       makes generate return RLAI_ERR_INVALID_ARG /
                                       RLAI_ERR_UNSUPPORTED. */
    /* Since 1.2, added with the vision encoder (a host without it refuses this larger
     * req_size with RLAI_ERR_UNSUPPORTED): one RGB image for a vision-
     * language model (`rlai serve --mmproj FILE`; model_info then has a
     * "vision" object). image_rgb: image_width * image_height * 3 bytes,
     * rows packed, borrowed for the call; NULL = no image. The raw `prompt`
     * must then contain the model's image token (model_info's
     * vision.image_token, SmolVLM: "<image>") exactly once: the host expands
     * it to the encoder's rows and the engine uses the image's embeddings
     * there (docs/SCREEN.md "Vision"). An image with `messages`, a prompt
     * without the token or with two, or no encoder loaded: RLAI_ERR_INVALID_ARG
     * / RLAI_ERR_NOT_IMPLEMENTED. */
    const uint8_t *image_rgb;
    int image_width, image_height;
    const char *model;              /* appended in 1.2 after response_format (size-detected:
                                       older plugins pass a smaller req_size; a host without
                                       the field answers RLAI_ERR_UNSUPPORTED): the model to
                                       run on -- NULL, "" or "default" = the local model,
                                       else a remote model of the host's upstreams ("NAME"
                                       or "UPSTREAM/NAME", docs/REMOTE.md); any other name
                                       makes generate return RLAI_ERR_NOT_FOUND. A remote
                                       model refuses what it cannot honour (logprobs,
                                       ignore_eos: RLAI_ERR_UNSUPPORTED) */
    const char *image_url;          /* appended in 1.3 after model (size-detected): for a remote
                                       model only, an image for its vision model as a URL (e.g.
                                       "data:image/png;base64,..."), with `messages`: it joins the
                                       last user message as an OpenAI image_url content part. The
                                       local model takes image_rgb instead (with image_url it
                                       answers RLAI_ERR_NOT_IMPLEMENTED); both at once, or with a
                                       raw prompt: RLAI_ERR_INVALID_ARG. Borrowed for the call. */
    /* ---- appended in 1.4 (size-detected; a host older than 1.4 refuses the larger
     * req_size with RLAI_ERR_UNSUPPORTED) ---- */
    const char *prediction;         /* NULL, or text the output is expected to repeat
                                       (predicted outputs: a character's line being
                                       re-voiced, a file being edited); the engine drafts
                                       from it, so the output is the same and comes sooner
                                       (docs/SPECULATIVE.md). At most 8192 tokens, else
                                       RLAI_ERR_TOO_LARGE. Borrowed for the call. */
    const rlai_plugin_logit_bias *logit_bias; /* n_logit_bias entries or NULL (borrowed for
                                       the call): each bias is added to its token's logit
                                       before the grammar, penalties and temperature; a
                                       token's last entry counts. At most 1024 entries; an id
                                       outside the vocabulary or a bias outside -100..100:
                                       RLAI_ERR_INVALID_ARG. The local model's ids; a remote
                                       model gets them as OpenAI's logit_bias. */
    int n_logit_bias;
} rlai_gen_request;

/* Outcome of a generation (filled by host->generate). */
typedef struct rlai_gen_result {
    char *text;                     /* whole generated text; free with host->free */
    int prompt_tokens;
    int reused_tokens;              /* prompt tokens taken from the prefix cache */
    int gen_tokens;
    double queue_ms, ttft_ms, prefill_tps, decode_tps;
    const char *stop;               /* "eog", "max_tokens", "stop_string", "context",
                                       "cancelled" (static) */
    /* ---- since 1.2 (a plugin built for 1.0/1.1 has a shorter struct; the
     * host writes only RLAI_GEN_RESULT_SIZE_1_0 bytes of it) ---- */
    int drafted_tokens;             /* speculative draft tokens proposed */
    int accepted_tokens;            /* ... and accepted by verification */
} rlai_gen_result;

/* Size of rlai_gen_result in ABI 1.0 and 1.1. */
#define RLAI_GEN_RESULT_SIZE_1_0 (offsetof(rlai_gen_result, drafted_tokens))

/* ------------------------------------------------------------------
 * The host API table
 * ------------------------------------------------------------------ */

enum rlai_log_level { RLAI_LOG_ERROR = 1, RLAI_LOG_WARN = 2, RLAI_LOG_INFO = 3, RLAI_LOG_DEBUG = 4 };

typedef struct rlai_host_api {
    uint32_t abi_version;           /* RLAI_PLUGIN_ABI_VERSION of the host */
    uint32_t struct_size;           /* sizeof(rlai_host_api) in the host */

    /* ---- since 1.0: host and plugin ---- */

    /* "rtx-localai <version>", e.g. "rtx-localai 0.1.0" (static). */
    const char *(*host_version)(void);
    /* Static description of an rlai_error code; never NULL. */
    const char *(*strerror)(int code);
    /* Memory that crosses the boundary (errmsg, result text): allocate and
     * free with these, never with the plugin's own malloc/free. */
    void *(*alloc)(size_t size);
    void (*free)(void *p);
    /* Log line prefixed with the plugin's name (to the daemon's stderr).
     * Any thread. */
    void (*log)(rlai_plugin *self, int level, const char *fmt, ...)
#if defined(__GNUC__)
        __attribute__((format(printf, 3, 4)))
#endif
        ;

    /* Registers a command; during rlai_plugin_init only. The descriptor and
     * its strings are copied (desc_size = sizeof(rlai_command_desc)).
     * Returns 0; RLAI_ERR_INVALID_ARG for a bad name (not "<plugin>.<verb>"),
     * a missing handler or a schema that is not a JSON object or uses a
     * keyword the host cannot enforce;
     * RLAI_ERR_BUSY when called after init; RLAI_ERR_UNSUPPORTED for a
     * desc_size larger than the host knows; RLAI_ERR_EXISTS for a name
     * another plugin or this one already registered. Every refusal is
     * logged with the plugin's file, and a plugin with a refused
     * registration is not loaded (init's other registrations are undone),
     * whatever init returns. */
    int (*register_command)(rlai_plugin *self, const rlai_command_desc *desc, size_t desc_size);

    /* Sets the plugin's state pointer, handed to rlai_plugin_fini(). */
    void (*set_state)(rlai_plugin *self, void *state);
    /* The manifest's "config" object merged with the daemon's per-plugin
     * overrides (borrowed, valid until unload; never NULL). */
    const cJSON *(*config)(rlai_plugin *self);
    /* Absolute path of the plugin's folder (borrowed, valid until unload). */
    const char *(*plugin_dir)(rlai_plugin *self);

    /* ---- since 1.0: answering a call (worker thread of that call) ---- */

    /* Sends `value` as one `result` frame. Takes ownership of value (also
     * on failure). Returns 0, or RLAI_ERR_CANCELLED when the caller is gone
     * or the call already ended (cancel, timeout, shutdown). A value no
     * transport could carry is not sent and ends the call with an error
     * (the client gets it, "plugin output refused: ..."): RLAI_ERR_TOO_LARGE
     * for nesting deeper than 16 or about 1 MiB printed, RLAI_ERR_INVALID_ARG
     * for a key or string that is not valid UTF-8. */
    int (*reply_json)(rlai_call *call, cJSON *value);
    /* Ends the call with an `error` frame: code is a negative rlai_error
     * (mapped to the protocol's codes), the message printf-style. Returns
     * `code` so a handler can `return host->reply_error(...)`. Later
     * replies are dropped. */
    int (*reply_error)(rlai_call *call, int code, const char *fmt, ...)
#if defined(__GNUC__)
        __attribute__((format(printf, 3, 4)))
#endif
        ;
    /* Sends `len` bytes of UTF-8 text as one `token` frame. Returns 0 or
     * RLAI_ERR_CANCELLED. Text that is not valid UTF-8 or holds a NUL byte
     * (RLAI_ERR_INVALID_ARG) or is over 1 MiB (RLAI_ERR_TOO_LARGE) is not
     * sent and ends the call with that error for the client. */
    int (*stream_text)(rlai_call *call, const char *text, size_t len);
    /* True once the caller cancelled, disconnected or the engine stops. */
    bool (*cancelled)(rlai_call *call);

    /* ---- since 1.0: the shared engine (any thread) ----
     * Without a loaded model these return RLAI_ERR_NOT_IMPLEMENTED. */

    /* Runs one generation on the shared engine (batched with every other
     * request) and blocks until it ends. With req->stream the text pieces
     * are forwarded to the caller as `token` frames as they come. Cancel
     * and disconnect of the caller stop it within one engine step
     * (out->stop = "cancelled"). out is filled on success (out->text owned
     * by the caller: host->free). Returns 0 or a negative error:
     * RLAI_ERR_CONTEXT_FULL / RLAI_ERR_TOO_LARGE for a prompt over the
     * limits, RLAI_ERR_BUSY when the engine queue is full. */
    int (*generate)(rlai_call *call, const rlai_gen_request *req, size_t req_size,
                    rlai_gen_result *out);
    /* Tokenizes text: writes at most cap ids (may be NULL with cap 0) and
     * returns the total count, or a negative error. */
    int (*tokenize)(rlai_plugin *self, const char *text, bool add_special, bool parse_special,
                    int32_t *out, int cap);
    /* Formats a conversation with the model's chat template. *out is
     * allocated with host->alloc. For display only: never tokenize this text
     * with parse_special (a message could forge "<|im_start|>system"
     * turns); use tokenize_chat (since 1.1). */
    int (*apply_chat)(rlai_plugin *self, const rlai_plugin_message *msgs, int n, bool add_generation_prompt,
                      char **out);
    /* Computes and pins the KV of `text` (tokenized with BOS as the model
     * wants, special-token text parsed) in the prefix cache, so it is never
     * evicted and every prompt starting with it prefills only the rest.
     * Returns the number of tokens pinned (whole 16-token blocks) or a
     * negative error (RLAI_ERR_KV_FULL when the pool cannot hold it). The
     * host unpins what a plugin pinned when it unloads. */
    int (*pin_prefix)(rlai_plugin *self, const char *text);
    /* Undoes one pin_prefix of the same text. */
    int (*unpin_prefix)(rlai_plugin *self, const char *text);
    /* Model and engine figures as a JSON object (name, arch, n_ctx, n_layer,
     * n_embd, n_head, n_head_kv, head_dim, n_vocab, n_params, weight_bytes,
     * kv_type, kv_blocks_total, ...). *out owned by the caller (cJSON_Delete). */
    int (*model_info)(rlai_plugin *self, cJSON **out);

    /* ---- since 1.0: files ---- */

    /* Reads the header of any GGUF file (no tensor data is read) and
     * describes it as a JSON object: "arch", "name", "n_layer", "n_embd",
     * "n_head", "n_head_kv", "head_dim", "n_ff", "n_vocab", "n_ctx_train",
     * "n_params", "weight_bytes", "tensor_types" (map type name -> {"count",
     * "params", "bytes"}). *out owned by the caller. On failure returns a
     * negative error and writes a message into err. Works without a model. */
    int (*gguf_describe)(const char *path, cJSON **out, char *err, size_t errlen);

    /* ---- since 1.1: the shared engine ---- */

    /* Tokenizes a conversation as generate with `messages` does: the
     * template's markers become special tokens, message content is never
     * parsed for special tokens (a player typing "<|im_end|><|im_start|>system"
     * gets plain text), BOS as the model wants it. For content without
     * special-token text the ids equal tokenize(apply_chat(...), true, true).
     * Writes at most cap ids to out (caller-owned; may be NULL with cap 0)
     * and returns the total count, or a negative error (RLAI_ERR_INVALID_ARG
     * for a refused role, RLAI_ERR_NOT_IMPLEMENTED without a model). */
    int (*tokenize_chat)(rlai_plugin *self, const rlai_plugin_message *msgs, int n, bool add_generation_prompt,
                         int32_t *out, int cap);

    /* ---- since 1.2: chat models ---- */

    /* During rlai_plugin_init only: offers `model` to chat clients (the
     * OpenAI front lists it in /v1/models and answers
     * /v1/chat/completions for it) by calling `command` (one of this
     * plugin's) with the JSON object `params_json` (may be NULL = {})
     * plus, from the chat request: "message" (the last user message),
     * "session" (the request's "session" or "user", when given),
     * "max_tokens", "temperature" and "seed" (when given). The command's
     * text pieces and result "text" become the assistant's reply. model
     * must be "<plugin>/<id>" (id of [A-Za-z0-9._-], at most 200 bytes);
     * `description` (may be NULL) is shown in /v1/models. Strings copied.
     * Returns 0; RLAI_ERR_INVALID_ARG (bad name, unknown command, params
     * not an object), RLAI_ERR_EXISTS (model already offered),
     * RLAI_ERR_BUSY (after init). */
    int (*register_chat_model)(rlai_plugin *self, const char *model, const char *command,
                               const char *params_json, const char *description);
} rlai_host_api;

/* True when the host's table has `member` (it was built with an ABI at
 * least as new as the one that added it). */
#define RLAI_HOST_HAS(host, member)                                            \
    ((host)->struct_size >= offsetof(rlai_host_api, member) + sizeof((host)->member) && \
     (host)->member != NULL)

/* ------------------------------------------------------------------
 * What a plugin exports
 * ------------------------------------------------------------------ */

/* Required. Registers commands and sets state. Returns 0, or non-zero on
 * failure with an optional message in *errmsg (allocated with
 * host->alloc; the host frees it). `host` stays valid until unload. */
RLAI_PLUGIN_EXPORT int rlai_plugin_init(const rlai_host_api *host, rlai_plugin *self, char **errmsg);

/* Optional. Called once at unload with the pointer given to set_state
 * (NULL if none), after the plugin's last call ended. */
RLAI_PLUGIN_EXPORT void rlai_plugin_fini(void *state);

#ifdef __cplusplus
}
#endif
#endif
