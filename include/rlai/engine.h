/* rlai/engine.h - embed API of the RTX-LocalAI inference engine.
 *
 * The engine loads a GGUF model (memory-mapped), tokenizes, formats chat
 * prompts and generates tokens, streaming UTF-8 text through a callback.
 * It knows nothing about IPC or plugins and can be linked into any program.
 *
 * Conventions: every function that can fail returns 0 or a negative
 * rlai_error code; rlai_strerror() names it. Where a richer message helps
 * (loading a file), an optional caller-provided buffer receives it.
 * Ownership is stated on each function. Objects are not thread-safe unless
 * stated: one thread uses one rlai_engine at a time.
 */
#ifndef RLAI_ENGINE_H
#define RLAI_ENGINE_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "rlai/error.h"
#include "rlai/grammar.h"

typedef int32_t rlai_token;
typedef struct rlai_engine rlai_engine;

/* Instruction-set selection for CPU kernels. AUTO picks the best available
 * at run time; the others force a path (SCALAR always works, a forced SIMD
 * level the CPU lacks makes rlai_engine_open fail with RLAI_ERR_UNSUPPORTED). */
typedef enum rlai_isa {
    RLAI_ISA_AUTO = 0,
    RLAI_ISA_SCALAR = 1,
    RLAI_ISA_AVX2 = 2,
    RLAI_ISA_AVX512 = 3,
} rlai_isa;

/* Element type of the KV cache. */
typedef enum rlai_kv_type {
    RLAI_KV_F16 = 0,      /* default */
    RLAI_KV_Q8_0 = 1,     /* 8-bit blocks of 32: about half the memory of f16 */
} rlai_kv_type;

/* Speculative decoding (docs/SPECULATIVE.md). In engine params AUTO means
 * the built-in default: DRAFT when a draft model is loaded, else NGRAM,
 * for greedy and sampled requests alike (the output is the same token for
 * token with or without drafts; a seed gives the same text either way).
 * In gen params AUTO means "as the engine". */
typedef enum rlai_spec_mode {
    RLAI_SPEC_AUTO = 0,
    RLAI_SPEC_OFF = 1,
    RLAI_SPEC_NGRAM = 2,   /* prompt-lookup drafting, verified in one forward */
    RLAI_SPEC_DRAFT = 3,   /* a draft model proposes (engine params draft_model) */
} rlai_spec_mode;

/* Parses "off" / "ngram" / "draft" (and "auto"); returns the mode or
 * RLAI_ERR_UNSUPPORTED for "self" (self-speculative drafting is not
 * implemented) and RLAI_ERR_INVALID_ARG for anything else. */
int rlai_spec_mode_parse(const char *s);
/* Why rlai_spec_mode_parse refused a value, for a message that follows the
 * option's name: "must be off, ngram, draft or auto" (plus that
 * self-speculative drafting is not implemented, for RLAI_ERR_UNSUPPORTED).
 * Static string. */
const char *rlai_spec_mode_error(int rc);

typedef struct rlai_engine_params {
    int n_threads;        /* 0 = number of online CPUs */
    int prefill_chunk;    /* prompt tokens per step across requests; 0 = 512 */
    int max_running;      /* sequences decoded together; 0 = 64 */
    int max_queue;        /* waiting requests before submit says BUSY; 0 = 256 */
    int n_ctx;            /* max tokens per sequence; 0 = model's context length (capped at 8192) */
    int kv_blocks;        /* KV pool size in 16-token blocks; 0 = enough for one full n_ctx sequence */
    rlai_isa isa;         /* kernel selection */
    bool precise;         /* true: f32 activations with weights dequantized to f32
                             (reference-exact, slower) and an f32 KV cache (kv_type
                             ignored); false: activations quantized to 8 bits */
    rlai_kv_type kv_type; /* KV element type (default f16) */
    const char *device;   /* compute device: NULL/"auto" (CUDA when a GPU and the
                             CUDA backend module are present, else the CPU, with
                             one log line saying why when a GPU was seen), "cpu",
                             "cuda" or "cuda:N" (fails with RLAI_ERR_UNSUPPORTED
                             and a message when CUDA cannot be used). Copied.
                             `isa` applies to the CPU backend. */
    rlai_spec_mode spec;  /* speculative decoding (AUTO = draft with a draft model, else ngram) */
    int spec_max_draft;   /* longest draft per step; 0 = 8, at most 16 */
    int spec_max_batch;   /* drafting only while at most this many sequences
                             decode in a step; 0 = 2, < 0 = no limit */
    const char *draft_model; /* NULL, or a GGUF path: a smaller model with the
                             same tokenizer (checked at open) that proposes
                             drafts for RLAI_SPEC_DRAFT. Copied. */
    int spec_lookup_min;  /* with the draft model (RLAI_SPEC_DRAFT): a step whose
                             last tokens repeat an earlier passage of at least
                             this many tokens drafts that passage's continuation
                             (prompt lookup, no draft forward) instead of running
                             the draft model; 0 = 4, < 0 = never */
} rlai_engine_params;

/* Fills defaults (all zero/auto, precise=false). */
void rlai_engine_params_init(rlai_engine_params *p);

/* Opens the GGUF model at `path`. On success *out owns a new engine that the
 * caller frees with rlai_engine_close(). On failure returns a negative code,
 * sets *out = NULL and writes a message naming the problem into errbuf
 * (if errbuf_len > 0). `params` may be NULL for defaults; it is copied. */
int rlai_engine_open(const char *path, const rlai_engine_params *params,
                     rlai_engine **out, char *errbuf, size_t errbuf_len);

/* Frees the engine and unmaps the model. Accepts NULL. */
void rlai_engine_close(rlai_engine *e);

typedef struct rlai_model_info {
    const char *arch;      /* "llama", "qwen2", ... (owned by the engine) */
    const char *name;      /* general.name or "" (owned by the engine) */
    int n_vocab, n_embd, n_layer, n_head, n_head_kv, n_ff, n_ctx_train, head_dim;
    uint64_t n_params;
    uint64_t weight_bytes;
    const char *isa;       /* CPU kernel path in use: "scalar", "avx2", "avx512" */
    int n_threads;
    int n_ctx;
    const char *device;    /* backend in use: "cpu", "cuda" (owned by the engine) */
    const char *draft_model; /* the draft model's path, or NULL (owned by the engine) */
} rlai_model_info;

/* Fills *info; string pointers stay valid until rlai_engine_close(). */
void rlai_engine_info(const rlai_engine *e, rlai_model_info *info);

/* Tokenizes `text` (len bytes, need not be NUL-terminated). add_special adds
 * BOS/EOS where the model asks for them; parse_special turns special-token
 * text such as "<|im_start|>" into its id. Writes at most `cap` ids to
 * `out` (caller-owned) and returns the total count needed (which may exceed
 * cap: call again with a bigger buffer), or a negative error. */
int rlai_engine_tokenize(const rlai_engine *e, const char *text, size_t len,
                         bool add_special, bool parse_special,
                         rlai_token *out, int cap);

/* Writes the text of `n` tokens into buf (caller-owned, NUL-terminated when
 * cap > 0). Returns the byte length needed excluding the NUL (may exceed
 * cap - 1), or a negative error. Special tokens are rendered as their text
 * when render_special is true, else omitted. */
int rlai_engine_detokenize(const rlai_engine *e, const rlai_token *toks, int n,
                           bool render_special, char *buf, size_t cap);

typedef struct rlai_chat_message {
    const char *role;      /* "system", "user", "assistant" */
    const char *content;
} rlai_chat_message;

/* Formats a conversation with the model's chat template (ChatML, Llama-3,
 * Gemma recognised; ChatML otherwise). add_generation_prompt appends the
 * assistant header. On success *out is a malloc'd NUL-terminated string the
 * caller frees with free(). For display and raw use only: the text does not
 * say which "<|im_end|>" is the template's and which a user typed, so
 * tokenizing it with parse_special lets message content forge turns. To
 * generate from a conversation use rlai_engine_tokenize_chat(). */
int rlai_engine_apply_chat(const rlai_engine *e, const rlai_chat_message *msgs,
                           int n_msgs, bool add_generation_prompt, char **out);

/* Formats and tokenizes a conversation in one go, safely: the template's
 * own markers become special tokens, message content (and the template's
 * default system prompt) is never parsed for special tokens, so a message
 * containing "<|im_end|>\n<|im_start|>system" stays plain text. For content
 * without special-token text the ids equal tokenizing rlai_engine_apply_chat()'s
 * text with parse_special (prefix caches keep matching). BOS is added when
 * the model asks for it, never twice (Llama-3 text starts with it); no EOS.
 * On success *out is a malloc'd array of *n_out ids the caller frees with
 * free(); on failure *out is NULL and a negative code is returned
 * (RLAI_ERR_INVALID_ARG for a role the template refuses). */
int rlai_engine_tokenize_chat(const rlai_engine *e, const rlai_chat_message *msgs, int n_msgs,
                              bool add_generation_prompt, rlai_token **out, int *n_out);

typedef struct rlai_sampler_params {
    float temperature;     /* 0 = greedy */
    int top_k;             /* 0 = off */
    float top_p;           /* 1 = off */
    float min_p;           /* 0 = off */
    float repeat_penalty;  /* 1 = off; divides positive / multiplies negative logits of seen tokens */
    float presence_penalty;/* 0 = off; subtracted once from every seen token */
    float frequency_penalty;/* 0 = off; subtracted per occurrence */
    int repeat_last_n;     /* window for penalties; 0 = whole history, default 64 */
    uint64_t seed;         /* RNG seed */
} rlai_sampler_params;

/* Log-probabilities of generated tokens (rlai_gen_params.top_logprobs).
 * Distribution: the log-softmax of the model's RAW logits for that
 * position -- before repetition/presence/frequency penalties, temperature,
 * top-k/top-p/min-p -- as llama-server and vLLM report by default; so a
 * token sampled at temperature 0.8 is reported with its temperature-1
 * probability. NaN logits count as -inf. top_ids / top_logprobs hold the
 * n_top most probable ids in descending order (ties: lower id first); the
 * sampled token need not be among them. */
#define RLAI_MAX_TOP_LOGPROBS 20
typedef struct rlai_token_logprobs {
    rlai_token token;          /* the sampled (emitted) token */
    float logprob;             /* its log-probability (natural log, <= 0) */
    int n_top;                 /* entries in top_ids / top_logprobs */
    rlai_token top_ids[RLAI_MAX_TOP_LOGPROBS];
    float top_logprobs[RLAI_MAX_TOP_LOGPROBS];
    bool prompt;               /* a prompt token's entry (rlai_gen_params.prompt_logprobs):
                                  `token` is the prompt's, not sampled; the first prompt
                                  token has no distribution before it: logprob NaN, n_top 0 */
} rlai_token_logprobs;

/* Called on the stepping thread once per emitted token, just before the
 * token callback of the same token (not for an end-of-generation token
 * that ends the request). *lp is valid during the call only. */
typedef void (*rlai_logprobs_cb)(void *user, const rlai_token_logprobs *lp);

/* Product sampling defaults, used by every front end (HTTP, CLI, wire
 * protocol, SDK docs, LoreMaster's fallback): docs/DEFAULTS.md says why.
 * rlai_gen_params_init() stays greedy (the engine's neutral default for
 * tests and embedders); rlai_sampler_params_product() applies these. */
#define RLAI_DEFAULT_TEMPERATURE 0.8f
#define RLAI_DEFAULT_TOP_K 40
#define RLAI_DEFAULT_TOP_P 0.95f
#define RLAI_DEFAULT_MIN_P 0.05f
#define RLAI_DEFAULT_REPEAT_PENALTY 1.0f
#define RLAI_DEFAULT_MAX_TOKENS 256

/* One entry of rlai_gen_params.logit_bias (OpenAI's logit_bias). */
typedef struct rlai_logit_bias {
    rlai_token token;
    float bias;                /* in [-RLAI_LOGIT_BIAS_MAX, RLAI_LOGIT_BIAS_MAX]; the lowest bans */
} rlai_logit_bias;
#define RLAI_MAX_LOGIT_BIAS 1024
#define RLAI_LOGIT_BIAS_MAX 100.0f

typedef struct rlai_gen_params {
    rlai_sampler_params sampling;
    int max_tokens;                 /* 0 = until context end */
    const char *const *stop;        /* NULL-terminated list of stop strings, or NULL */
    bool ignore_eos;                /* keep going past end-of-generation tokens */
    uint64_t timeout_ms;            /* wall-clock limit RELATIVE to rlai_engine_submit
                                       (queue time included), 0 = none; past it the
                                       request ends within one scheduler step with
                                       RLAI_STOP_TIMEOUT (status 0, text so far kept) */
    rlai_spec_mode spec;            /* AUTO = engine's setting; OFF / NGRAM / DRAFT override
                                       it (DRAFT without a loaded draft model: submit
                                       fails with RLAI_ERR_UNSUPPORTED) */
    int spec_max_draft;             /* 0 = engine's; else 1..16 (lowers or raises the cap) */
    int top_logprobs;               /* -1 = off (default); 0..RLAI_MAX_TOP_LOGPROBS: report
                                       each emitted token's logprob and this many top
                                       alternatives through on_logprobs (needs on_logprobs;
                                       the request still drafts: every verification row is
                                       scored as its plain decoding step) */
    rlai_logprobs_cb on_logprobs;   /* NULL = no logprobs */
    void *logprobs_user;            /* passed to on_logprobs */
    const rlai_grammar *grammar;    /* NULL = free text; else every sampled token keeps
                                       the output a prefix of a sentence of the grammar,
                                       end-of-generation is allowed only when the text is
                                       complete and generation stops (RLAI_STOP_EOG) when
                                       nothing can follow. The request still drafts (text the
                                       grammar forces first; every verification row is masked
                                       as its plain decoding step). The engine takes its own
                                       reference at submit: the caller may unref it
                                       afterwards. */
    bool prompt_logprobs;           /* with top_logprobs >= 0 and on_logprobs: also report
                                       every PROMPT token, in order, before the first
                                       generated one (entry.prompt true): token i's
                                       log-probability after tokens 0..i-1 and the top
                                       alternatives there (OpenAI completions "echo" with
                                       "logprobs", used for perplexity and loglikelihood
                                       scoring). Every prompt position then needs its logits:
                                       the request reuses no prefix-cache blocks (its blocks
                                       are still cached for others) and prefills in chunks of
                                       at most RLAI_PROMPT_LOGPROBS_CHUNK tokens. Image prompts
                                       are refused (RLAI_ERR_UNSUPPORTED). */
    const rlai_logit_bias *logit_bias; /* n_logit_bias entries or NULL (caller-owned; copied
                                       at submit). Each bias is added to its token's logit
                                       before the grammar mask, penalties, temperature and
                                       the filters, so it moves greedy choices too; a bias of
                                       -RLAI_LOGIT_BIAS_MAX bans the token (its logit becomes
                                       -inf). Logprobs stay those of the raw logits. A token
                                       listed twice: its last entry counts. Submit fails with
                                       RLAI_ERR_INVALID_ARG for a token outside the vocabulary,
                                       a bias that is not finite or outside the range, or
                                       more than RLAI_MAX_LOGIT_BIAS entries. */
    int n_logit_bias;
    const char *prediction;         /* NULL or NUL-terminated UTF-8 text the output is
                                       expected to repeat (OpenAI's predicted outputs: the
                                       file an edit request returns with a few changes);
                                       caller-owned, tokenized and copied at submit. While
                                       the request drafts (spec not OFF), prompt lookup also
                                       drafts from it: its start right after the prompt,
                                       and after each deviation from where the output meets
                                       it again. Drafts are verified as always, so the output
                                       is exactly that without a prediction; only the speed
                                       changes. Without its own spec_max_draft such a request
                                       drafts up to 16 tokens a step (not the engine's
                                       default of 8). Submit fails with RLAI_ERR_TOO_LARGE past
                                       RLAI_MAX_PREDICTION_TOKENS tokens (or
                                       RLAI_MAX_PREDICTION_BYTES bytes). */
} rlai_gen_params;

/* Limits of rlai_gen_params.prediction. */
#define RLAI_MAX_PREDICTION_TOKENS 8192
#define RLAI_MAX_PREDICTION_BYTES (1u << 20)

/* Prompt tokens per step of a prompt_logprobs request (its logits rows). */
#define RLAI_PROMPT_LOGPROBS_CHUNK 64

/* Defaults: greedy, penalties off, max_tokens 256, no stop strings,
 * no logprobs. */
void rlai_gen_params_init(rlai_gen_params *p);

/* Sets the product sampling defaults (RLAI_DEFAULT_*: temperature 0.8,
 * top_k 40, top_p 0.95, min_p 0.05, penalties off) and `seed`. */
void rlai_sampler_params_product(rlai_sampler_params *s, uint64_t seed);

/* A fresh seed for one request: wall clock, a process-wide counter and the
 * pid mixed (not predictable across requests). Thread-safe. */
uint64_t rlai_fresh_seed(void);

typedef enum rlai_stop_reason {
    RLAI_STOP_NONE = 0,
    RLAI_STOP_EOG = 1,         /* end-of-generation token */
    RLAI_STOP_MAX_TOKENS = 2,
    RLAI_STOP_STRING = 3,      /* a stop string matched (not emitted) */
    RLAI_STOP_CONTEXT = 4,     /* context length reached */
    RLAI_STOP_CANCELLED = 5,   /* callback returned non-zero */
    RLAI_STOP_TIMEOUT = 6,     /* rlai_gen_params.timeout_ms passed */
} rlai_stop_reason;

/* Wire name of a stop reason: "eog", "max_tokens", "stop_string",
 * "context", "cancelled", "timeout", or "" for NONE (static strings). */
const char *rlai_stop_reason_name(rlai_stop_reason r);

typedef struct rlai_gen_metrics {
    int prompt_tokens;
    int reused_tokens;         /* prompt tokens taken from the prefix cache */
    double queue_ms;           /* submit to admission */
    int gen_tokens;
    double ttft_ms;            /* from call start to first token sampled */
    double prefill_ms;
    double decode_ms;
    double prefill_tps;        /* prompt tokens / prefill seconds */
    double decode_tps;         /* (gen_tokens-1) / decode seconds */
    int drafted_tokens;        /* speculative draft tokens verified */
    int accepted_tokens;       /* of those, accepted (emitted without a forward of their own) */
    rlai_stop_reason stop;
    int lookup_tokens;         /* of drafted_tokens, those proposed by prompt lookup
                                  while a draft model was in use (spec_lookup_min) */
} rlai_gen_metrics;

/* Stream callback: `text` holds `len` bytes of whole UTF-8 characters (a
 * multi-byte character is never split across calls; len may be 0 when a
 * token ends mid-character). `tok` is the sampled id. Return 0 to continue,
 * non-zero to stop (the call then returns 0 with stop = RLAI_STOP_CANCELLED). */
typedef int (*rlai_token_cb)(void *user, rlai_token tok, const char *text, size_t len);

/* Generates a continuation of `prompt` (raw text; special-token text is
 * parsed, BOS added if the model wants it). Streams pieces through cb (may
 * be NULL). metrics may be NULL. Returns 0 or a negative error. */
int rlai_engine_generate(rlai_engine *e, const char *prompt,
                         const rlai_gen_params *gp, rlai_token_cb cb, void *user,
                         rlai_gen_metrics *metrics);

/* As rlai_engine_generate, but from token ids (caller-owned, copied). */
int rlai_engine_generate_tokens(rlai_engine *e, const rlai_token *prompt, int n_prompt,
                                const rlai_gen_params *gp, rlai_token_cb cb, void *user,
                                rlai_gen_metrics *metrics);

/* ------------------------------------------------------------------
 * Concurrent requests: continuous batching with chunked prefill.
 *
 * rlai_engine_submit() queues a request and returns at once (thread-safe).
 * One thread drives the engine with rlai_engine_step(): each step runs ONE
 * forward pass over every running sequence together -- a decode token for
 * each streaming request plus prefill chunks of new prompts (at most
 * prefill_chunk prompt tokens per step, default 512), so weights are read
 * once per step and a long prompt never stalls running streams.
 *
 * Admission control: a request is admitted only when the KV pool can hold
 * its whole prompt plus max_tokens (capped by the context); until then it
 * waits in a queue of at most max_queue requests (beyond that, submit says
 * RLAI_ERR_BUSY). A request that could never fit the pool fails at once
 * with RLAI_ERR_KV_FULL. Admitted requests are never preempted, so running
 * sequences are never corrupted and memory never grows past the pool.
 *
 * Prefix cache: full 16-token blocks of every sequence are registered; a
 * new request reuses the longest cached prefix (reported as
 * reused_tokens) and prefills only the rest.
 *
 * Callbacks run on the thread that calls rlai_engine_step(). on_done is
 * called exactly once per submitted request (status 0 or a negative error),
 * after which the request id is forgotten.
 * ------------------------------------------------------------------ */

typedef void (*rlai_done_cb)(void *user, uint64_t id, int status, const rlai_gen_metrics *m);

/* Rows that replace the input embeddings of prompt positions pos ..
 * pos + n_rows - 1: n_rows * n_embd floats (the model's n_embd), e.g. one
 * image from rlai_engine_embed_image (a vision-language model). */
typedef struct rlai_image_rows {
    const float *rows;
    int n_rows;
    int pos;
} rlai_image_rows;

typedef struct rlai_request_params {
    const rlai_token *prompt;   /* copied */
    int n_prompt;
    rlai_gen_params gen;        /* stop strings are copied */
    rlai_token_cb on_token;     /* may be NULL */
    rlai_done_cb on_done;       /* may be NULL */
    void *user;
    const rlai_image_rows *images; /* NULL, or n_images images (rows copied at submit;
                                    inside the prompt, not overlapping, else
                                    RLAI_ERR_INVALID_ARG). Their positions' KV is
                                    keyed in the prefix cache by a hash of the rows,
                                    so only the same image reuses it. */
    int n_images;
} rlai_request_params;

/* Queues a request; *id receives its id (> 0). Thread-safe. Returns 0,
 * RLAI_ERR_INVALID_ARG, RLAI_ERR_CONTEXT_FULL (prompt >= context),
 * RLAI_ERR_KV_FULL (can never fit the pool) or RLAI_ERR_BUSY (queue full). */
int rlai_engine_submit(rlai_engine *e, const rlai_request_params *rp, uint64_t *id);

/* The one request path of every front (wire, HTTP, plugins): chat
 * messages, raw text or token ids -> template -> tokens -> prompt limit ->
 * submit. Exactly one prompt form is set: `messages` (n_messages >= 1; the
 * chat template is applied with the generation prompt, message content is
 * never parsed for special tokens), `prompt` (raw text: special-token text
 * parsed, BOS as the model wants), or neither, and then rp.prompt /
 * rp.n_prompt are the prompt's token ids (used as given). `rp` is what
 * rlai_engine_submit takes; with messages or prompt its prompt and
 * n_prompt are ignored (filled here). */
typedef struct rlai_text_request {
    const rlai_chat_message *messages;  /* borrowed for the call */
    int n_messages;
    const char *prompt;                 /* borrowed for the call */
    int max_prompt_tokens;              /* 0 = the context length - 1 */
    rlai_request_params rp;
    const uint8_t *image_rgb;           /* NULL, or one RGB image (image_width * image_height * 3
                                           bytes, borrowed for the call) for the vision encoder
                                           (rlai_engine_load_mmproj): the raw `prompt` must hold
                                           the image token ("<image>") exactly once; it becomes
                                           the encoder's n_tokens positions with the image's rows
                                           (rp.images is ignored). RLAI_ERR_NOT_IMPLEMENTED
                                           without an encoder, RLAI_ERR_INVALID_ARG with messages
                                           or no / two image tokens. */
    int image_width, image_height;
} rlai_text_request;

/* Builds the prompt of `rq` and submits it; *id as rlai_engine_submit.
 * Returns 0, or a negative code with a one-line reason in err (may be
 * NULL): RLAI_ERR_INVALID_ARG (more than one prompt form or none, a role
 * the template refuses, an empty prompt, a token id out of range),
 * RLAI_ERR_TOO_LARGE (more prompt tokens than max_prompt_tokens),
 * RLAI_ERR_TOKENIZER, or any error of rlai_engine_submit. *n_prompt (may
 * be NULL) receives the number of prompt tokens as soon as it is known,
 * also when the request is then refused (empty: 0; too long: the count),
 * and -1 when the prompt could not be built. Nothing of rq is kept but
 * what submit copies; on_done is called only when 0 is returned.
 * Thread-safe as submit. */
int rlai_engine_submit_text(rlai_engine *e, const rlai_text_request *rq, uint64_t *id, int *n_prompt,
                            char *err, size_t errlen);

/* A request whose gen.timeout_ms has passed (queued or running) ends at the
 * start of the next step with RLAI_STOP_TIMEOUT (status 0) and its KV
 * blocks are released, as for a cancel.
 *
 * Asks a request to stop; it ends within one step with stop reason
 * RLAI_STOP_CANCELLED (status 0) and its KV blocks are released. Thread-safe.
 * Returns 0 or RLAI_ERR_NOT_FOUND. */
int rlai_engine_cancel(rlai_engine *e, uint64_t id);

/* Runs one scheduler step. Returns the number of requests still queued or
 * running afterwards (0 = idle), or a negative error. Call from one thread. */
int rlai_engine_step(rlai_engine *e);

/* Blocks until there is work for rlai_engine_step() or timeout_ms passes
 * (< 0: forever) or rlai_engine_wakeup() is called. Returns true if there
 * is work. */
bool rlai_engine_wait_work(rlai_engine *e, int timeout_ms);
void rlai_engine_wakeup(rlai_engine *e);

/* Engine-wide figures (thread-safe snapshot). */
typedef struct rlai_engine_stats {
    int running, queued;
    int kv_blocks_total, kv_blocks_free, kv_blocks_used, kv_blocks_cached, kv_blocks_pinned;
    uint64_t prompt_tokens_total, prompt_tokens_reused_total, gen_tokens_total, requests_total;
    uint64_t steps;
    uint64_t spec_drafted_total, spec_accepted_total;  /* speculative draft tokens */
} rlai_engine_stats;
void rlai_engine_get_stats(rlai_engine *e, rlai_engine_stats *out);

/* Scheduler knobs (call before submitting). prefix_cache: on by default. */
void rlai_engine_set_prefix_cache(rlai_engine *e, bool on);

/* Computes (if needed) and pins the KV of a token prefix so it is never
 * evicted: later requests starting with it prefill only what follows.
 * Thread-safe: it runs between two scheduler steps (it waits for a step in
 * progress, and the prefill of an uncached prefix delays the next step).
 * Never call it from an engine callback (on_token / on_done). Blocks that
 * admitted requests may still need are never taken: when the pool cannot
 * hold the prefix besides them it returns RLAI_ERR_KV_FULL. Returns the
 * number of tokens pinned (whole blocks only; 0 for a prefix shorter than
 * one block) or a negative error. unpin undoes one pin of the same
 * tokens (same thread rules). */
int rlai_engine_pin_prefix(rlai_engine *e, const rlai_token *toks, int n);
int rlai_engine_unpin_prefix(rlai_engine *e, const rlai_token *toks, int n);

/* Embeddings (docs/SERVE.md, /v1/embeddings). The hidden state is the
 * model's final-norm output (after the last RMSNorm, before the LM head),
 * one n_embd vector per position. */
typedef enum rlai_pooling {
    RLAI_POOL_MEAN = 0,   /* mean over every position (BOS included when present) */
    RLAI_POOL_LAST = 1,   /* the last position's vector */
} rlai_pooling;

/* Evaluates `n` tokens as one fresh sequence (no prefix cache, nothing
 * kept) and writes the pooled hidden state to out (caller-owned, n_embd
 * floats, see rlai_model_info), L2-normalised to length 1 when normalize
 * is true (as OpenAI returns embeddings). Thread-safe: it runs between two
 * scheduler steps (as rlai_engine_pin_prefix; never from an engine
 * callback) and never takes KV blocks admitted requests may still need
 * (RLAI_ERR_BUSY when the pool is short now). Returns 0,
 * RLAI_ERR_INVALID_ARG (bad ids, n <= 0, bad pooling),
 * RLAI_ERR_CONTEXT_FULL (n >= context), RLAI_ERR_BUSY or RLAI_ERR_NOMEM. */
int rlai_engine_embed(rlai_engine *e, const rlai_token *toks, int n, rlai_pooling pooling, bool normalize,
                      float *out);

/* Evaluates `n` tokens as one fresh sequence and writes the logits of every
 * position into `logits` (caller-owned, n * n_vocab floats, row-major).
 * For testing against a reference implementation. */
int rlai_engine_eval_logits(rlai_engine *e, const rlai_token *toks, int n, float *logits);

/* ------------------------------------------------------------------
 * Images: a vision-language model's encoder (engine/vision.h; SigLIP +
 * Idefics3 projector from a llama.cpp mmproj GGUF, as SmolVLM ships).
 * docs/SCREEN.md "Vision" says how to point it at real files. */

/* Loads the vision encoder from an mmproj GGUF (once per engine; call
 * before submitting image requests). Its projection width must equal the
 * model's n_embd. The model's image token is looked up as "<image>" in
 * its vocabulary (-1 in the info when absent: then only rlai_image_rows
 * with explicit positions work). Returns 0 or a negative error with a
 * message in err (RLAI_ERR_FORMAT / RLAI_ERR_UNSUPPORTED naming the key
 * or tensor, RLAI_ERR_INVALID_ARG for a width mismatch, RLAI_ERR_EXISTS
 * when one is loaded already). */
int rlai_engine_load_mmproj(rlai_engine *e, const char *path, char *err, size_t errlen);

typedef struct rlai_vision_info {
    int n_tokens;          /* rows per image */
    int image_size;        /* the encoder's input side, pixels */
    rlai_token image_token;/* id of "<image>" in the vocabulary, or -1 */
    const char *image_token_text;  /* "<image>" (static) */
    const char *path;      /* the mmproj file (owned by the engine) */
    uint64_t weight_bytes;
} rlai_vision_info;

/* Fills *out and returns 0, or RLAI_ERR_NOT_FOUND when no encoder is
 * loaded. */
int rlai_engine_vision_info(const rlai_engine *e, rlai_vision_info *out);

/* Encodes one 8-bit image (width x height pixels of `channels` bytes, 3 =
 * RGB or 4 = RGBA; rows `stride` bytes apart; caller-owned, read only)
 * into out (caller-owned, n_tokens * n_embd floats). Thread-safe: encodes
 * run one at a time on the encoder's own kernel context and threads (not
 * the scheduler's). Returns 0, RLAI_ERR_NOT_IMPLEMENTED (no encoder),
 * RLAI_ERR_INVALID_ARG or RLAI_ERR_NOMEM. */
int rlai_engine_embed_image(rlai_engine *e, const uint8_t *img, int width, int height, size_t stride,
                            int channels, float *out);

/* As rlai_engine_eval_logits, with image rows in place of the input
 * embeddings of their positions (for testing against a reference). */
int rlai_engine_eval_logits_images(rlai_engine *e, const rlai_token *toks, int n,
                                   const rlai_image_rows *images, int n_images, float *logits);

#ifdef __cplusplus
}
#endif
#endif
