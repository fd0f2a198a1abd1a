/* rlai/protocol.h - the RTX-LocalAI wire protocol (msgpack): message model,
 * encoder and validating decoder (implemented in proto/protocol.c).
 * proto/PROTOCOL.md is normative; this
 * header mirrors it.
 *
 * Every message is one msgpack map with at least "v" (protocol version,
 * uint), "id" (request id chosen by the client, uint64) and "type" (str).
 * Requests: hello generate chat call cancel commands stats tokenize.
 * Stream frames (engine -> client, same id as the request): token, result,
 * done, error. Every request ends with exactly one done or error.
 *
 * Ownership: a decoded rlai_msg owns copies of all its strings and arrays
 * (free with rlai_msg_free); nothing points into the input buffer. Encoding
 * appends to a caller-owned rlai_buf.
 */
#ifndef RLAI_PROTOCOL_H
#define RLAI_PROTOCOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rlai/error.h"

#define RLAI_PROTO_VERSION 1

/* Limits enforced by the decoder (a daemon may configure lower ones). */
#define RLAI_PROTO_MAX_FRAME (4u << 20)       /* bytes per message */
#define RLAI_PROTO_MAX_STR (1u << 20)          /* bytes per string (prompt, content, JSON) */
#define RLAI_PROTO_MAX_MESSAGES 256            /* chat messages */
#define RLAI_PROTO_MAX_STOPS 8                 /* stop strings */
#define RLAI_PROTO_MAX_LOGIT_BIAS 1024         /* logit_bias entries (the engine's limit) */
#define RLAI_PROTO_MAX_STOP_LEN 256
#define RLAI_PROTO_MAX_TOKENS_ARRAY 65536      /* ids in one token/result frame */
#define RLAI_PROTO_MAX_TOP_LOGPROBS 20         /* "top_logprobs" option, alternatives per token */
#define RLAI_PROTO_MAX_CALL_TIMEOUT_MS 86400000u /* call "timeout_ms" (one day) */
#define RLAI_PROTO_MAX_WHERE 80                /* done metrics "where" */
#define RLAI_PROTO_MAX_MODEL_NAME 256          /* "model" / "route" options */
#define RLAI_PROTO_MAX_DEPTH 16                /* array/map nesting in any field value (result "data") */

typedef enum rlai_msg_type {
    RLAI_MSG_INVALID = 0,
    /* requests */
    RLAI_MSG_HELLO, RLAI_MSG_GENERATE, RLAI_MSG_CHAT, RLAI_MSG_CALL, RLAI_MSG_CANCEL,
    RLAI_MSG_COMMANDS, RLAI_MSG_STATS, RLAI_MSG_TOKENIZE,
    /* stream frames */
    RLAI_MSG_TOKEN, RLAI_MSG_RESULT, RLAI_MSG_DONE, RLAI_MSG_ERROR,
} rlai_msg_type;

/* Protocol error codes carried in error frames ("code" int, "name" str):
 * enum rlai_wire_code (RLAI_PE_*), generated from RLAI_WIRE_CODE_MAP in
 * rlai/error.h, which also maps each engine error onto one of them
 * (rlai_err_wire_code). */
typedef enum rlai_wire_code rlai_proto_code;

/* Static upper-snake name ("BAD_FRAME") of a protocol code; "UNKNOWN" otherwise. */
const char *rlai_proto_code_name(int code);

typedef struct rlai_buf {
    unsigned char *data;   /* malloc'd, owned by the buf */
    size_t len, cap;
} rlai_buf;

void rlai_buf_init(rlai_buf *b);
void rlai_buf_free(rlai_buf *b);
void rlai_buf_reset(rlai_buf *b);          /* len = 0, keeps memory */

/* Sampling/generation options shared by generate and chat. A field absent
 * from the wire keeps the engine default (has_* false). */
/* Wire "spec" values (the same numbers as the engine's rlai_spec_mode). */
#define RLAI_MSG_SPEC_AUTO 0   /* "auto": the daemon's setting */
#define RLAI_MSG_SPEC_OFF 1    /* "off" */
#define RLAI_MSG_SPEC_NGRAM 2  /* "ngram": prompt-lookup drafting */
#define RLAI_MSG_SPEC_DRAFT 3  /* "draft": the daemon's draft model proposes */
#define RLAI_PROTO_MAX_DRAFT 16u

/* One "logit_bias" entry: a token id and the bias added to its logit
 * (-100..100; -100 bans it). Same layout as the engine's rlai_logit_bias. */
typedef struct rlai_msg_logit_bias {
    int32_t token;
    float bias;
} rlai_msg_logit_bias;

typedef struct rlai_msg_gen {
    int32_t max_tokens;            bool has_max_tokens;
    float temperature;             bool has_temperature;
    int32_t top_k;                 bool has_top_k;
    float top_p;                   bool has_top_p;
    float min_p;                   bool has_min_p;
    float repeat_penalty;          bool has_repeat_penalty;
    float presence_penalty;        bool has_presence_penalty;
    float frequency_penalty;       bool has_frequency_penalty;
    uint64_t seed;                 bool has_seed;
    bool ignore_eos;
    uint32_t timeout_ms;           bool has_timeout_ms;   /* 0 = none */
    int32_t spec;                  bool has_spec;         /* "spec": RLAI_MSG_SPEC_* */
    uint32_t spec_max_draft;       bool has_spec_max_draft; /* 1..RLAI_PROTO_MAX_DRAFT */
    uint32_t top_logprobs;         bool has_top_logprobs;   /* 0..RLAI_PROTO_MAX_TOP_LOGPROBS: token
                                                               frames carry "logprobs" */
    char **stop;                   /* n_stop strings */
    uint32_t n_stop;
    char *response_format;         /* JSON text of an OpenAI response_format object
                                      (docs/STRUCTURED.md), or NULL; owned */
    char *model;                   /* "model": where it runs (docs/REMOTE.md), or NULL = local; owned */
    char *route;                   /* "route": auto|local|remote|UPSTREAM, or NULL = auto; owned */
    bool prompt_logprobs;          /* "prompt_logprobs" (needs top_logprobs): the prompt tokens'
                                      log-probabilities come first, in "prompt_logprobs" frames */
    rlai_msg_logit_bias *logit_bias; /* "logit_bias": n_logit_bias entries in wire order; owned */
    uint32_t n_logit_bias;
    char *prediction;              /* "prediction": text the output is expected to repeat
                                      (predicted outputs, docs/SPECULATIVE.md), or NULL; owned */
} rlai_msg_gen;

typedef struct rlai_msg_chat_message {
    char *role;
    char *content;
} rlai_msg_chat_message;

/* One token's log-probabilities in a token frame's "logprobs" (PROTOCOL.md
 * 6.1): the raw-logit log-softmax of the token and of the n_top best ids. */
typedef struct rlai_msg_logprob {
    int32_t token;
    float logprob;
    uint32_t n_top;
    int32_t top_ids[RLAI_PROTO_MAX_TOP_LOGPROBS];
    float top_logprobs[RLAI_PROTO_MAX_TOP_LOGPROBS];
} rlai_msg_logprob;

/* One token's log-probabilities from a remote model (PROTOCOL.md 6.1): the
 * upstream gives token text, not ids of the local model. All pointers are
 * borrowed for the encode call. Text that is not valid UTF-8 is sent with
 * U+FFFD in place of each bad byte; `bytes` (NULL = not sent) are the
 * token's exact bytes when the upstream gave them. */
typedef struct rlai_msg_text_logprob {
    const char *text;
    size_t text_len;
    const uint8_t *bytes;
    size_t n_bytes;
    double logprob;
    uint32_t n_top;
    const char *top_text[RLAI_PROTO_MAX_TOP_LOGPROBS];
    size_t top_len[RLAI_PROTO_MAX_TOP_LOGPROBS];
    double top_logprobs[RLAI_PROTO_MAX_TOP_LOGPROBS];
} rlai_msg_text_logprob;

typedef struct rlai_msg_metrics {
    double queue_ms, ttft_ms, prefill_tps, decode_tps;
    uint32_t prompt_tokens, gen_tokens, reused_tokens;
    uint32_t drafted_tokens, accepted_tokens;   /* speculative decoding; 0 when off */
    char where[RLAI_PROTO_MAX_WHERE + 1];       /* "where": "local" or "upstream:NAME" (docs/REMOTE.md);
                                                   "" = not said (not sent) */
} rlai_msg_metrics;

typedef struct rlai_msg {
    rlai_msg_type type;
    uint32_t version;
    uint64_t id;
    union {
        struct { char *client; } hello;                         /* client may be NULL */
        struct { char *prompt; rlai_msg_gen gen; } generate;
        struct { rlai_msg_chat_message *messages; uint32_t n_messages; rlai_msg_gen gen; } chat;
        struct { char *command; char *params_json;             /* params_json: JSON text, NULL = {} */
                 uint32_t timeout_ms; } call;                  /* 0 = absent: the daemon's deadline */
        struct { uint64_t target; } cancel;
        struct { char *text; bool add_special, parse_special; } tokenize;
        struct { char *text; int32_t *tokens; uint32_t n_tokens; } token;
        /* result: arbitrary msgpack value, kept encoded (data, len). */
        struct { unsigned char *data; size_t len; } result;
        struct { char *stop; rlai_msg_metrics metrics; bool has_metrics; } done;
        struct { int32_t code; char *name; char *msg; } error;
    } u;
} rlai_msg;

/* Decodes one message. On success fills *out (caller frees with
 * rlai_msg_free) and returns 0. On failure returns a negative
 * rlai_proto_code (-RLAI_PE_BAD_FRAME, ...), writes a human message into
 * err (may be NULL), and sets out->id / out->type / out->version when they
 * could be read (so the daemon can address its error frame to the right
 * request; id is 0 otherwise); *out then owns nothing (rlai_msg_free is
 * optional). Unknown extra fields are ignored (forward compatibility);
 * a version other than RLAI_PROTO_VERSION is -RLAI_PE_BAD_VERSION. Strings
 * must be valid UTF-8 without NUL. Never reads outside buf[0..len). */
int rlai_proto_decode(const void *buf, size_t len, rlai_msg *out, char *err, size_t errlen);

/* Frees what a decoded or hand-built message owns. Accepts NULL. */
void rlai_msg_free(rlai_msg *m);

/* Appends the msgpack encoding of m to out. Returns 0 or a negative
 * rlai_proto_code (-RLAI_PE_BAD_REQUEST for an invalid message,
 * -RLAI_PE_TOO_LARGE for one over a limit, -RLAI_PE_INTERNAL on allocation
 * failure); on failure out is left as it was. m is not modified. "v" is
 * m->version, or RLAI_PROTO_VERSION when that is 0. */
int rlai_proto_encode(const rlai_msg *m, rlai_buf *out);

/* Convenience encoders for the daemon's hot path (no rlai_msg needed). */
/* As rlai_proto_encode_token, with a "logprobs" array of n_lp entries
 * (borrowed; none when n_lp is 0). -inf logprobs are written as -9999. */
int rlai_proto_encode_token_lp(rlai_buf *out, uint64_t id, const char *text, size_t len, const int32_t *tokens,
                               uint32_t n_tokens, const rlai_msg_logprob *lp, uint32_t n_lp);
int rlai_proto_encode_token(rlai_buf *out, uint64_t id, const char *text, size_t len,
                            const int32_t *tokens, uint32_t n_tokens);
/* A token frame with no text and no ids carrying the prompt tokens'
 * log-probabilities of a request with "prompt_logprobs" (PROTOCOL.md 6.1):
 * a "prompt_logprobs" array of n_lp (>= 1) entries {token, logprob, top}
 * as in "logprobs"; an entry with a NaN logprob (the first prompt token:
 * nothing precedes it) is sent with logprob nil and top []. lp borrowed.
 * Returns 0 or a negative protocol code. */
int rlai_proto_encode_prompt_logprobs(rlai_buf *out, uint64_t id, const rlai_msg_logprob *lp, uint32_t n_lp);
/* A remote model's token frame: text, no ids ("tokens" is empty), and a
 * "logprobs" array of n_lp text entries {text, logprob, top: [[text,
 * logprob], ...], bytes?} (PROTOCOL.md 6.1; lp borrowed). Returns 0 or a
 * negative protocol code (text not valid UTF-8, too many entries). */
int rlai_proto_encode_token_text_lp(rlai_buf *out, uint64_t id, const char *text, size_t len,
                                    const rlai_msg_text_logprob *lp, uint32_t n_lp);
int rlai_proto_encode_done(rlai_buf *out, uint64_t id, const char *stop, const rlai_msg_metrics *m);
/* error: code >= 1; name from rlai_proto_code_name; msg (NULL = "") is cut
 * to RLAI_PROTO_MAX_STR and bytes that are not valid UTF-8 become '?'. */
int rlai_proto_encode_error(rlai_buf *out, uint64_t id, int code, const char *msg);
/* result with a pre-encoded msgpack value (copied). */
int rlai_proto_encode_result(rlai_buf *out, uint64_t id, const void *data, size_t len);

/* Name of a type as on the wire ("generate"), or NULL for INVALID. */
const char *rlai_msg_type_name(rlai_msg_type t);

#endif
