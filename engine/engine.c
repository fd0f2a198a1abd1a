/* engine.c - the public embed API (include/rlai/engine.h): ties the GGUF
 * file, model, tokenizer, kernels, KV cache and sampler together and runs
 * single-sequence generation with streaming. */
#include "rlai/engine.h"
#include "chat.h"
#include "dtype.h"
#include "rlai/gguf.h"
#include "kernels.h"
#include "kv_cache.h"
#include "model.h"
#include "sampler.h"
#include "spec.h"
#include "grammar.h"
#include "textstream.h"
#include "threadpool.h"
#include "tokenizer.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define RLAI_MAX_BATCH 512          /* prefill chunk: tokens per forward call */
#define RLAI_DEFAULT_CTX_CAP 8192

/* One generation request (see the scheduler section below). */
typedef struct rlai_req {
    struct rlai_req *next;       /* queue or running list */
    uint64_t id;
    rlai_token *toks;            /* prompt followed by generated tokens */
    int n_toks, cap_toks;
    int n_prompt;
    int total;                   /* tokens this request may reach (prompt + max new, <= n_ctx) */
    rlai_kv_seq seq;
    rlai_sampler *smp;
    rlai_textstream *ts;
    rlai_gen_params gp;
    char **stops;                /* owned copies, NULL-terminated */
    rlai_token_cb on_token;
    rlai_done_cb on_done;
    void *user;
    int reserve;                 /* KV blocks it may still allocate (admission) */
    atomic_bool cancel;
    bool done;
    rlai_stop_reason stop;
    int status;
    rlai_gen_metrics mt;
    double t_submit, t_admit, t_first, t_prefill_end;
    double t_deadline;           /* monotonic ms; 0 = none (gen.timeout_ms) */
    int n_decode;                /* tokens emitted by decode steps (after the first) */
    rlai_spec_state spec;        /* adaptive draft length (spec.h) */
    int32_t draft[RLAI_SPEC_MAX_DRAFT];
    int n_draft;                 /* draft tokens fed this step */
    int row0;                    /* logits row of the last real token this step */
    bool lp_on;                  /* gen.top_logprobs >= 0 with on_logprobs */
    bool lp_ready;               /* lp holds the token sampled this step */
    float *lp_raw;               /* n_vocab: raw logits copied before sampling */
    rlai_token_logprobs lp;
    rlai_grammar_matcher *gm;    /* gen.grammar's matcher, or NULL */
    uint32_t *gmask;             /* allowed tokens of this step (bitset) */
    int gerr;                    /* mask failure of this step (< 0), else 0 */
} rlai_req;


struct rlai_engine {
    rlai_engine_params params;
    rlai_gguf *gguf;
    rlai_model *model;
    rlai_tokenizer *tok;
    rlai_kernels *kern;
    rlai_threadpool *tp;
    rlai_backend *be;
    rlai_kv_cache *kv;
    rlai_model_ctx *mctx;
    rlai_isa isa;
    char device[32];        /* params.device points here */
    int n_ctx;
    rlai_chat_style chat_style;
    char *default_system;   /* owned, may be NULL */
    char name[128];
    float *logits;          /* n_vocab (eval helpers) */

    /* scheduler: queue and running lists; the stepping thread owns the
     * running requests' state, qmu guards list membership and flags. */
    pthread_mutex_t qmu;
    pthread_cond_t qcv;
    pthread_mutex_t step_mu;     /* held for a whole step; pin/unpin take it
                                    too, so they are safe from any thread */
    rlai_req *queue;             /* FIFO of submitted, not admitted */
    rlai_req *running;           /* admitted, in order of admission */
    int n_queued, n_running;
    uint64_t next_id;
    bool wake;
    float *step_logits;          /* max_running rows of n_vocab */
    int step_logits_rows;
    rlai_engine_stats stats;     /* snapshot, under qmu */
    pthread_mutex_t gv_mu;       /* guards building gvocab */
    rlai_gvocab *gvocab;         /* token bytes and tries for grammars (built on first use) */
};

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

void rlai_engine_params_init(rlai_engine_params *p)
{
    memset(p, 0, sizeof(*p));
    p->isa = RLAI_ISA_AUTO;
    p->prefill_chunk = 512;
    p->max_running = 64;
    p->max_queue = 256;
    p->spec = RLAI_SPEC_AUTO;
    p->spec_max_draft = 8;
    p->spec_max_batch = 2;
}

int rlai_spec_mode_parse(const char *s)
{
    if (!s)
        return RLAI_ERR_INVALID_ARG;
    if (!strcmp(s, "auto"))
        return RLAI_SPEC_AUTO;
    if (!strcmp(s, "off"))
        return RLAI_SPEC_OFF;
    if (!strcmp(s, "ngram"))
        return RLAI_SPEC_NGRAM;
    if (!strcmp(s, "draft") || !strcmp(s, "self"))
        return RLAI_ERR_UNSUPPORTED;
    return RLAI_ERR_INVALID_ARG;
}

const char *rlai_spec_mode_error(int rc)
{
    return rc == RLAI_ERR_UNSUPPORTED
               ? "must be off, ngram or auto: draft-model and self-speculative drafting are not implemented"
               : "must be off, ngram or auto";
}

const char *rlai_stop_reason_name(rlai_stop_reason r)
{
    switch (r) {
    case RLAI_STOP_EOG: return "eog";
    case RLAI_STOP_MAX_TOKENS: return "max_tokens";
    case RLAI_STOP_STRING: return "stop_string";
    case RLAI_STOP_CONTEXT: return "context";
    case RLAI_STOP_CANCELLED: return "cancelled";
    case RLAI_STOP_TIMEOUT: return "timeout";
    default: return "";
    }
}

void rlai_gen_params_init(rlai_gen_params *p)
{
    memset(p, 0, sizeof(*p));
    p->sampling.temperature = 0.0f;
    p->sampling.top_p = 1.0f;
    p->sampling.repeat_penalty = 1.0f;
    p->sampling.repeat_last_n = 64;
    p->sampling.seed = 0x5eed;
    p->max_tokens = 256;
    p->top_logprobs = -1;
}

void rlai_sampler_params_product(rlai_sampler_params *s, uint64_t seed)
{
    memset(s, 0, sizeof(*s));
    s->temperature = RLAI_DEFAULT_TEMPERATURE;
    s->top_k = RLAI_DEFAULT_TOP_K;
    s->top_p = RLAI_DEFAULT_TOP_P;
    s->min_p = RLAI_DEFAULT_MIN_P;
    s->repeat_penalty = RLAI_DEFAULT_REPEAT_PENALTY;
    s->repeat_last_n = 64;
    s->seed = seed;
}

uint64_t rlai_fresh_seed(void)
{
    static atomic_ullong counter;
    uint64_t c = atomic_fetch_add(&counter, 1) + 1;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    x ^= c * 0x9E3779B97F4A7C15ull ^ (uint64_t)getpid() * 0xBF58476D1CE4E5B9ull;
    /* splitmix64 finaliser */
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static void set_err(char *err, size_t len, const char *msg)
{
    if (err && len)
        snprintf(err, len, "%s", msg);
}

int rlai_engine_open(const char *path, const rlai_engine_params *params,
                     rlai_engine **out, char *errbuf, size_t errbuf_len)
{
    char err[512] = "";
    *out = NULL;
    if (!path) {
        set_err(errbuf, errbuf_len, "no model path given");
        return RLAI_ERR_INVALID_ARG;
    }
    rlai_engine *e = calloc(1, sizeof(*e));
    if (!e)
        return RLAI_ERR_NOMEM;
    pthread_mutex_init(&e->qmu, NULL);
    pthread_cond_init(&e->qcv, NULL);
    pthread_mutex_init(&e->step_mu, NULL);
    pthread_mutex_init(&e->gv_mu, NULL);
    if (params)
        e->params = *params;
    else
        rlai_engine_params_init(&e->params);
    int rc = rlai_gguf_open_file(path, &e->gguf, err, sizeof(err));
    if (rc < 0)
        goto fail;
    if ((rc = rlai_model_load(e->gguf, &e->model, err, sizeof(err))) < 0)
        goto fail;
    if ((rc = rlai_tokenizer_load(e->gguf, &e->tok, err, sizeof(err))) < 0)
        goto fail;
    const rlai_hparams *hp = rlai_model_hparams(e->model);
    if (rlai_tokenizer_n_vocab(e->tok) > hp->n_vocab) {
        snprintf(err, sizeof(err), "model: tokenizer has %d tokens but the embedding only %d rows",
                 rlai_tokenizer_n_vocab(e->tok), hp->n_vocab);
        rc = RLAI_ERR_FORMAT;
        goto fail;
    }
    if ((rc = rlai_kernels_resolve(e->params.isa, &e->isa)) < 0) {
        snprintf(err, sizeof(err), "the requested instruction set (%s) is not available on this CPU",
                 rlai_isa_name(e->params.isa));
        goto fail;
    }
    if ((rc = rlai_kernels_new(e->isa, e->params.precise, &e->kern)) < 0)
        goto fail;
    int nt = e->params.n_threads;
    if (nt <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        nt = n > 0 ? (int)n : 1;
    }
    if (nt > 256)
        nt = 256;
    e->params.n_threads = nt;
    if ((rc = rlai_threadpool_new(nt, &e->tp)) < 0)
        goto fail;
    int n_ctx = e->params.n_ctx;
    if (n_ctx <= 0)
        n_ctx = hp->n_ctx_train < RLAI_DEFAULT_CTX_CAP ? hp->n_ctx_train : RLAI_DEFAULT_CTX_CAP;
    if (n_ctx > hp->n_ctx_train)
        fprintf(stderr, "rlai: warning: context %d exceeds the model's trained context %d\n", n_ctx,
                hp->n_ctx_train);
    if (n_ctx > (1 << 20)) {
        snprintf(err, sizeof(err), "context size %d too large", n_ctx);
        rc = RLAI_ERR_TOO_LARGE;
        goto fail;
    }
    e->n_ctx = n_ctx;
    e->params.n_ctx = n_ctx;
    int blocks = e->params.kv_blocks > 0 ? e->params.kv_blocks : (n_ctx + RLAI_KV_BLOCK - 1) / RLAI_KV_BLOCK;
    e->params.kv_blocks = blocks;
    /* The precise mode keeps K/V in f32 so the reference comparison sees
     * no cache rounding; the default stores f16. */
    uint32_t kv_type = e->params.precise ? RLAI_DT_F32
                       : e->params.kv_type == RLAI_KV_Q8_0 ? RLAI_DT_Q8_0 : RLAI_DT_F16;
    if (kv_type == RLAI_DT_Q8_0 && (hp->head_dim % 32 != 0 || hp->head_dim > 256)) {
        snprintf(err, sizeof(err), "q8_0 KV cache needs a head size that is a multiple of 32 (at most 256); "
                 "this model has %d", hp->head_dim);
        rc = RLAI_ERR_UNSUPPORTED;
        goto fail;
    }
    {
        rlai_backend_options bo = { .device = e->params.device, .kernels = e->kern, .pool = e->tp,
                                    .max_ctx = n_ctx };
        char note[600];
        if ((rc = rlai_backend_open(&bo, &e->be, err, sizeof(err), note, sizeof(note))) < 0)
            goto fail;
        if (note[0])
            fprintf(stderr, "rlai: %s\n", note);
        snprintf(e->device, sizeof(e->device), "%s", e->be->iface->name);
        e->params.device = e->device;
    }
    if ((rc = rlai_kv_cache_new_on(e->be, hp->n_layer, hp->n_head_kv * hp->head_dim, blocks, kv_type,
                                      &e->kv)) < 0)
        goto fail;
    if ((rc = rlai_model_ctx_new(e->model, e->be, RLAI_MAX_BATCH, n_ctx, &e->mctx)) < 0)
        goto fail;
    {
        /* Kernel scratch for the widest input (n_ff or n_head*head_dim) at a
         * full prefill chunk, so matmuls never allocate while generating. */
        int64_t cols = hp->n_embd;
        if (hp->n_ff > cols)
            cols = hp->n_ff;
        if ((int64_t)hp->n_head * hp->head_dim > cols)
            cols = (int64_t)hp->n_head * hp->head_dim;
        if ((rc = rlai_kernels_reserve(e->kern, nt, cols, RLAI_MAX_BATCH)) < 0)
            goto fail;
    }
    e->logits = malloc(sizeof(float) * (size_t)hp->n_vocab);
    if (!e->logits) {
        rc = RLAI_ERR_NOMEM;
        goto fail;
    }
    if (e->params.prefill_chunk <= 0)
        e->params.prefill_chunk = RLAI_MAX_BATCH;
    if (e->params.max_running <= 0)
        e->params.max_running = 64;
    if (e->params.max_queue <= 0)
        e->params.max_queue = 256;
    if (e->params.spec != RLAI_SPEC_OFF && e->params.spec != RLAI_SPEC_NGRAM)
        e->params.spec = RLAI_SPEC_OFF; /* AUTO: off until bench_spec shows it pays */
    if (e->params.spec_max_draft <= 0)
        e->params.spec_max_draft = 8;
    if (e->params.spec_max_draft > RLAI_SPEC_MAX_DRAFT)
        e->params.spec_max_draft = RLAI_SPEC_MAX_DRAFT;
    if (e->params.spec_max_batch == 0)
        e->params.spec_max_batch = 2;
    e->next_id = 1;
    rlai_gguf_str tmpl = { NULL, 0 };
    rlai_gguf_get_str(e->gguf, "tokenizer.chat_template", &tmpl);
    e->chat_style = rlai_chat_detect(tmpl.ptr, tmpl.len);
    e->default_system = tmpl.len ? rlai_chat_default_system(tmpl.ptr, tmpl.len) : NULL;
    rlai_gguf_str nm;
    if (rlai_gguf_get_str(e->gguf, "general.name", &nm) == 0)
        snprintf(e->name, sizeof(e->name), "%.*s", (int)(nm.len < 127 ? nm.len : 127), nm.ptr);
    *out = e;
    return 0;
fail:
    if (!err[0])
        snprintf(err, sizeof(err), "%s", rlai_strerror(rc));
    if (errbuf && errbuf_len)
        snprintf(errbuf, errbuf_len, "%s: %s", path, err);
    rlai_engine_close(e);
    return rc;
}

static void req_free(rlai_engine *e, rlai_req *r);

void rlai_engine_close(rlai_engine *e)
{
    if (!e)
        return;
    /* Requests still queued or running are dropped without callbacks. */
    while (e->queue) {
        rlai_req *r = e->queue;
        e->queue = r->next;
        req_free(e, r);
    }
    while (e->running) {
        rlai_req *r = e->running;
        e->running = r->next;
        req_free(e, r);
    }
    free(e->step_logits);
    pthread_mutex_destroy(&e->qmu);
    pthread_mutex_destroy(&e->step_mu);
    pthread_mutex_destroy(&e->gv_mu);
    rlai_gvocab_free(e->gvocab);
    pthread_cond_destroy(&e->qcv);
    rlai_model_ctx_free(e->mctx);
    rlai_kv_cache_free(e->kv);
    rlai_backend_free(e->be);
    rlai_threadpool_free(e->tp);
    rlai_kernels_free(e->kern);
    rlai_tokenizer_free(e->tok);
    rlai_model_free(e->model);
    rlai_gguf_close(e->gguf);
    free(e->default_system);
    free(e->logits);
    free(e);
}

void rlai_engine_info(const rlai_engine *e, rlai_model_info *info)
{
    const rlai_hparams *hp = rlai_model_hparams(e->model);
    memset(info, 0, sizeof(*info));
    info->arch = hp->arch;
    info->name = e->name;
    info->n_vocab = hp->n_vocab;
    info->n_embd = hp->n_embd;
    info->n_layer = hp->n_layer;
    info->n_head = hp->n_head;
    info->n_head_kv = hp->n_head_kv;
    info->n_ff = hp->n_ff;
    info->n_ctx_train = hp->n_ctx_train;
    info->head_dim = hp->head_dim;
    info->n_params = rlai_model_n_params(e->model);
    info->weight_bytes = rlai_model_weight_bytes(e->model);
    info->isa = rlai_isa_name(e->isa);
    info->device = e->device;
    info->n_threads = e->params.n_threads;
    info->n_ctx = e->n_ctx;
}

int rlai_engine_tokenize(const rlai_engine *e, const char *text, size_t len,
                         bool add_special, bool parse_special, rlai_token *out, int cap)
{
    if (!e || (!text && len) || cap < 0 || (cap > 0 && !out))
        return RLAI_ERR_INVALID_ARG;
    return rlai_tokenizer_encode(e->tok, text ? text : "", len, add_special, parse_special, out, cap);
}

int rlai_engine_detokenize(const rlai_engine *e, const rlai_token *toks, int n,
                           bool render_special, char *buf, size_t cap)
{
    if (!e || n < 0 || (n > 0 && !toks) || (cap > 0 && !buf))
        return RLAI_ERR_INVALID_ARG;
    return rlai_tokenizer_decode(e->tok, toks, n, render_special, buf, cap);
}

int rlai_engine_apply_chat(const rlai_engine *e, const rlai_chat_message *msgs,
                           int n_msgs, bool add_generation_prompt, char **out)
{
    if (!e || !out || n_msgs < 0 || (n_msgs > 0 && !msgs))
        return RLAI_ERR_INVALID_ARG;
    return rlai_chat_format(e->chat_style, e->default_system, msgs, n_msgs, add_generation_prompt, out);
}

/* Template text is tokenized with special tokens parsed, message content
 * without; BOS as tokenize_prompt adds it (never twice). */
int rlai_engine_tokenize_chat(const rlai_engine *e, const rlai_chat_message *msgs, int n_msgs,
                              bool add_generation_prompt, rlai_token **out, int *n_out)
{
    if (!e || !out || !n_out || n_msgs < 0 || (n_msgs > 0 && !msgs))
        return RLAI_ERR_INVALID_ARG;
    *out = NULL;
    *n_out = 0;
    char *text = NULL;
    rlai_chat_seg *segs = NULL;
    int n_segs = 0;
    int rc = rlai_chat_render(e->chat_style, e->default_system, msgs, n_msgs, add_generation_prompt, &text,
                              &segs, &n_segs);
    if (rc < 0)
        return rc;
    size_t len = strlen(text);
    rlai_tok_span *sp = malloc(sizeof(*sp) * (size_t)(n_segs > 0 ? n_segs : 1));
    rlai_token *toks = NULL;
    int n = RLAI_ERR_NOMEM;
    if (sp) {
        for (int i = 0; i < n_segs; i++)
            sp[i] = (rlai_tok_span){ segs[i].off, segs[i].len, !segs[i].content };
        n = rlai_tokenizer_encode_spans(e->tok, text, len, sp, n_segs, false, NULL, 0);
    }
    if (n >= 0) {
        toks = malloc(sizeof(rlai_token) * (size_t)(n + 1));
        if (!toks)
            n = RLAI_ERR_NOMEM;
    }
    if (n >= 0)
        n = rlai_tokenizer_encode_spans(e->tok, text, len, sp, n_segs, false, toks + 1, n);
    free(sp);
    free(segs);
    free(text);
    if (n < 0) {
        free(toks);
        return n;
    }
    int32_t bos = rlai_tokenizer_bos(e->tok);
    if (rlai_tokenizer_add_bos(e->tok) && bos >= 0 && !(n > 0 && toks[1] == bos)) {
        toks[0] = bos;
        n++;
    } else {
        memmove(toks, toks + 1, sizeof(rlai_token) * (size_t)n);
    }
    *out = toks;
    *n_out = n;
    return 0;
}

/* Tokenizes a prompt: special-token text parsed, BOS added when the model
 * asks for it and the text does not already start with it. *out malloc'd. */
static int tokenize_prompt(const rlai_engine *e, const char *prompt, rlai_token **out, int *n_out)
{
    size_t len = strlen(prompt);
    int n = rlai_tokenizer_encode(e->tok, prompt, len, false, true, NULL, 0);
    if (n < 0)
        return n;
    rlai_token *toks = malloc(sizeof(rlai_token) * (size_t)(n + 1));
    if (!toks)
        return RLAI_ERR_NOMEM;
    int off = 0;
    int32_t bos = rlai_tokenizer_bos(e->tok);
    int m = rlai_tokenizer_encode(e->tok, prompt, len, false, true, toks + 1, n);
    if (m < 0) {
        free(toks);
        return m;
    }
    if (rlai_tokenizer_add_bos(e->tok) && bos >= 0 && !(m > 0 && toks[1] == bos)) {
        toks[0] = bos;
        m++;
    } else {
        off = 1;
    }
    if (off)
        memmove(toks, toks + 1, sizeof(rlai_token) * (size_t)m);
    *out = toks;
    *n_out = m;
    return 0;
}

int rlai_engine_generate(rlai_engine *e, const char *prompt,
                         const rlai_gen_params *gp, rlai_token_cb cb, void *user,
                         rlai_gen_metrics *metrics)
{
    if (!e || !prompt)
        return RLAI_ERR_INVALID_ARG;
    rlai_token *toks;
    int n;
    int rc = tokenize_prompt(e, prompt, &toks, &n);
    if (rc < 0)
        return rc;
    rc = rlai_engine_generate_tokens(e, toks, n, gp, cb, user, metrics);
    free(toks);
    return rc;
}

/* ------------------------------------------------------------------ */
/* Scheduler: continuous batching with chunked prefill (engine.h).     */

static void req_free(rlai_engine *e, rlai_req *r)
{
    if (!r)
        return;
    rlai_kv_seq_release(e->kv, &r->seq);
    rlai_sampler_free(r->smp);
    rlai_grammar_matcher_free(r->gm);
    free(r->gmask);
    rlai_textstream_free(r->ts);
    free(r->lp_raw);
    if (r->stops)
        for (char **s = r->stops; *s; s++)
            free(*s);
    free(r->stops);
    free(r->toks);
    free(r);
}

static int blocks_for(int tokens)
{
    return (tokens + RLAI_KV_BLOCK - 1) / RLAI_KV_BLOCK;
}

int rlai_engine_submit(rlai_engine *e, const rlai_request_params *rp, uint64_t *id)
{
    if (!e || !rp || !rp->prompt || rp->n_prompt <= 0)
        return RLAI_ERR_INVALID_ARG;
    const rlai_hparams *hp = rlai_model_hparams(e->model);
    for (int i = 0; i < rp->n_prompt; i++)
        if (rp->prompt[i] < 0 || rp->prompt[i] >= hp->n_vocab)
            return RLAI_ERR_INVALID_ARG;
    if (rp->n_prompt >= e->n_ctx)
        return RLAI_ERR_CONTEXT_FULL;
    rlai_req *r = calloc(1, sizeof(*r));
    if (!r)
        return RLAI_ERR_NOMEM;
    r->gp = rp->gen;
    if ((int)r->gp.spec < RLAI_SPEC_AUTO || (int)r->gp.spec > RLAI_SPEC_NGRAM || r->gp.spec_max_draft < 0 ||
        r->gp.spec_max_draft > RLAI_SPEC_MAX_DRAFT) {
        free(r);
        return RLAI_ERR_INVALID_ARG;
    }
    r->lp_on = r->gp.on_logprobs && r->gp.top_logprobs >= 0;
    if (r->lp_on && r->gp.top_logprobs > RLAI_MAX_TOP_LOGPROBS) {
        free(r);
        return RLAI_ERR_INVALID_ARG;
    }
    {
        rlai_spec_mode mode = r->gp.spec == RLAI_SPEC_AUTO ? e->params.spec : r->gp.spec;
        int md = r->gp.spec_max_draft > 0 ? r->gp.spec_max_draft : e->params.spec_max_draft;
        /* Logprobs are taken from the one row each step samples: no drafts. */
        rlai_spec_state_init(&r->spec, mode == RLAI_SPEC_NGRAM && !r->lp_on ? md : 0);
    }
    int max_new = r->gp.max_tokens > 0 ? r->gp.max_tokens : e->n_ctx;
    long total = (long)rp->n_prompt + max_new;
    r->total = total > e->n_ctx ? e->n_ctx : (int)total;
    if (blocks_for(r->total) > rlai_kv_cache_n_blocks(e->kv)) {
        free(r);
        return RLAI_ERR_KV_FULL;
    }
    r->cap_toks = r->total + 1;
    r->toks = malloc(sizeof(rlai_token) * (size_t)r->cap_toks);
    int rc = r->toks ? 0 : RLAI_ERR_NOMEM;
    if (rc == 0 && r->lp_on && !(r->lp_raw = malloc(sizeof(float) * (size_t)hp->n_vocab)))
        rc = RLAI_ERR_NOMEM;
    if (rc == 0 && rp->gen.stop) {
        size_t n = 0;
        while (rp->gen.stop[n])
            n++;
        r->stops = calloc(n + 1, sizeof(char *));
        if (!r->stops)
            rc = RLAI_ERR_NOMEM;
        for (size_t i = 0; rc == 0 && i < n; i++)
            if (!(r->stops[i] = strdup(rp->gen.stop[i])))
                rc = RLAI_ERR_NOMEM;
        r->gp.stop = (const char *const *)r->stops;
    }
    if (rc == 0)
        rc = rlai_sampler_new(&r->gp.sampling, hp->n_vocab, &r->smp);
    if (rc == 0)
        rc = rlai_textstream_new(r->gp.stop, &r->ts);
    if (rc == 0 && rp->gen.grammar) {
        pthread_mutex_lock(&e->gv_mu);
        if (!e->gvocab)
            rc = rlai_gvocab_new(e->tok, &e->gvocab);
        pthread_mutex_unlock(&e->gv_mu);
        if (rc == 0)
            rc = rlai_grammar_matcher_new(rp->gen.grammar, &r->gm);
        if (rc == 0 && !(r->gmask = malloc(sizeof(uint32_t) * (size_t)rlai_gvocab_mask_words(e->gvocab))))
            rc = RLAI_ERR_NOMEM;
        r->gp.grammar = NULL;   /* the matcher holds the reference */
    }
    if (rc < 0) {
        req_free(e, r);
        return rc;
    }
    memcpy(r->toks, rp->prompt, sizeof(rlai_token) * (size_t)rp->n_prompt);
    r->n_toks = r->n_prompt = rp->n_prompt;
    for (int i = 0; i < rp->n_prompt; i++)
        rlai_sampler_accept(r->smp, rp->prompt[i]);
    r->on_token = rp->on_token;
    r->on_done = rp->on_done;
    r->user = rp->user;
    atomic_init(&r->cancel, false);
    r->t_submit = now_ms();
    if (r->gp.timeout_ms > 0)
        r->t_deadline = r->t_submit + (double)r->gp.timeout_ms;
    r->mt.prompt_tokens = rp->n_prompt;

    pthread_mutex_lock(&e->qmu);
    if (e->n_queued >= e->params.max_queue) {
        pthread_mutex_unlock(&e->qmu);
        req_free(e, r);
        return RLAI_ERR_BUSY;
    }
    r->id = e->next_id++;
    rlai_req **pp = &e->queue;
    while (*pp)
        pp = &(*pp)->next;
    *pp = r;
    e->n_queued++;
    e->stats.queued = e->n_queued;
    e->wake = true;
    pthread_cond_broadcast(&e->qcv);
    pthread_mutex_unlock(&e->qmu);
    if (id)
        *id = r->id;
    return 0;
}

int rlai_engine_cancel(rlai_engine *e, uint64_t id)
{
    int rc = RLAI_ERR_NOT_FOUND;
    pthread_mutex_lock(&e->qmu);
    for (int l = 0; l < 2 && rc; l++)
        for (rlai_req *r = l ? e->running : e->queue; r; r = r->next)
            if (r->id == id) {
                atomic_store(&r->cancel, true);
                rc = 0;
                break;
            }
    e->wake = true;
    pthread_cond_broadcast(&e->qcv);
    pthread_mutex_unlock(&e->qmu);
    return rc;
}

bool rlai_engine_wait_work(rlai_engine *e, int timeout_ms)
{
    pthread_mutex_lock(&e->qmu);
    if (!e->queue && !e->running && !e->wake) {
        if (timeout_ms < 0) {
            pthread_cond_wait(&e->qcv, &e->qmu);
        } else {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += timeout_ms / 1000;
            ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&e->qcv, &e->qmu, &ts);
        }
    }
    e->wake = false;
    bool work = e->queue || e->running;
    pthread_mutex_unlock(&e->qmu);
    return work;
}

void rlai_engine_wakeup(rlai_engine *e)
{
    pthread_mutex_lock(&e->qmu);
    e->wake = true;
    pthread_cond_broadcast(&e->qcv);
    pthread_mutex_unlock(&e->qmu);
}

void rlai_engine_set_prefix_cache(rlai_engine *e, bool on)
{
    rlai_kv_cache_set_prefix_caching(e->kv, on);
}

void rlai_engine_get_stats(rlai_engine *e, rlai_engine_stats *out)
{
    pthread_mutex_lock(&e->qmu);
    *out = e->stats;
    pthread_mutex_unlock(&e->qmu);
}

/* Marks a request finished (stepping thread). Streams what the text
 * stream still holds unless a stop string or cancel ended it. */
static void req_finish(rlai_engine *e, rlai_req *r, rlai_stop_reason stop, int status)
{
    if (r->done)
        return;
    r->done = true;
    r->stop = stop;
    r->status = status;
    if (status == 0 && stop != RLAI_STOP_STRING && stop != RLAI_STOP_CANCELLED && r->on_token) {
        const char *txt;
        size_t len;
        rlai_textstream_flush(r->ts, &txt, &len);
        if (len)
            r->on_token(r->user, -1, txt, len);
    }
    double t_end = now_ms();
    rlai_gen_metrics *m = &r->mt;
    m->stop = stop;
    m->queue_ms = r->t_admit > 0 ? r->t_admit - r->t_submit : t_end - r->t_submit;
    if (r->t_prefill_end > 0) {
        m->prefill_ms = r->t_prefill_end - (r->t_admit > 0 ? r->t_admit : r->t_submit);
        int computed = r->n_prompt - m->reused_tokens;
        m->prefill_tps = m->prefill_ms > 0 ? computed / (m->prefill_ms / 1e3) : 0;
    }
    if (r->t_first > 0) {
        m->ttft_ms = r->t_first - r->t_submit;
        m->decode_ms = t_end - r->t_first;
        m->decode_tps = r->n_decode > 0 && m->decode_ms > 0 ? r->n_decode / (m->decode_ms / 1e3) : 0;
    }
    rlai_kv_seq_release(e->kv, &r->seq);
    (void)e;
}

static bool past_deadline(const rlai_req *r, double now)
{
    return r->t_deadline > 0 && now >= r->t_deadline;
}

/* Admits queued requests FIFO while the pool can hold them (stepping thread). */
static void admit(rlai_engine *e, rlai_req **finished)
{
    int committed = 0;
    for (rlai_req *r = e->running; r; r = r->next)
        committed += r->reserve;
    pthread_mutex_lock(&e->qmu);
    /* Cancelled and timed-out requests leave the queue wherever they are. */
    double now = now_ms();
    for (rlai_req **pp = &e->queue; *pp;) {
        rlai_req *r = *pp;
        bool late = past_deadline(r, now);
        if (atomic_load(&r->cancel) || late) {
            *pp = r->next;
            e->n_queued--;
            r->next = *finished;
            *finished = r;
            req_finish(e, r, late && !atomic_load(&r->cancel) ? RLAI_STOP_TIMEOUT : RLAI_STOP_CANCELLED, 0);
        } else {
            pp = &r->next;
        }
    }
    while (e->queue && e->n_running < e->params.max_running) {
        rlai_req *r = e->queue;
        /* Reuse the longest cached prefix, keeping the last prompt token to
         * compute (its logits start generation). */
        int reused = rlai_kv_prefix_attach(e->kv, &r->seq, r->toks, r->n_prompt, r->n_prompt - 1);
        if (reused < 0)
            reused = 0;
        int need = blocks_for(r->total) - r->seq.n_blocks;
        if (need > rlai_kv_cache_n_free(e->kv) - committed) {
            rlai_kv_seq_release(e->kv, &r->seq);
            break;   /* FIFO: wait until running requests free blocks */
        }
        e->queue = r->next;
        e->n_queued--;
        r->reserve = need;
        committed += need;
        r->mt.reused_tokens = reused;
        r->t_admit = now_ms();
        r->next = NULL;
        rlai_req **pp = &e->running;
        while (*pp)
            pp = &(*pp)->next;
        *pp = r;
        e->n_running++;
        e->stats.prompt_tokens_total += (uint64_t)r->n_prompt;
        e->stats.prompt_tokens_reused_total += (uint64_t)reused;
        e->stats.requests_total++;
    }
    pthread_mutex_unlock(&e->qmu);
}

/* Handles the logits of a request's newest position: sample, stream, stop. */
/* Parallel phase of sampling: every row's sampler is independent (own
 * RNG, candidates and history), so rows are sampled on the thread pool and
 * the result is the same as sampling them one after the other. */
typedef struct sample_job {
    const rlai_gvocab *gv;
    rlai_req **rows;
    const float *logits;
    size_t n_vocab;
    int n_rows;
    int32_t *out;
} sample_job;

/* Grammar: logits of tokens the grammar refuses become -inf before the
 * sampling chain. Returns the allowed count or a negative error (in r->gerr). */
static int grammar_mask(const rlai_gvocab *gv, rlai_req *r, float *lg, size_t n_vocab)
{
    int c = rlai_grammar_matcher_mask(r->gm, gv, r->gmask);
    if (c <= 0) {
        r->gerr = c < 0 ? c : RLAI_ERR_INVALID_ARG;
        return r->gerr;
    }
    const uint32_t *mk = r->gmask;
    for (size_t t = 0; t < n_vocab; t++)
        if (!((mk[t >> 5] >> (t & 31)) & 1))
            lg[t] = -INFINITY;
    return c;
}

static bool grammar_allows(const rlai_req *r, int32_t tok)
{
    return tok >= 0 && ((r->gmask[tok >> 5] >> (tok & 31)) & 1);
}

static void sample_rows(void *arg, int ith, int nth)
{
    sample_job *j = arg;
    for (int i = ith; i < j->n_rows; i += nth) {
        rlai_req *r = j->rows[i];
        float *lg = (float *)j->logits + (size_t)r->row0 * j->n_vocab;
        if (r->lp_on)
            memcpy(r->lp_raw, lg, sizeof(float) * j->n_vocab);   /* the sampler modifies lg */
        if (r->gm && grammar_mask(j->gv, r, lg, j->n_vocab) < 0) {
            j->out[i] = -1;
            continue;
        }
        j->out[i] = r->n_draft > 0 ? rlai_sampler_sample_draft(r->smp, lg, r->draft[0])
                                   : rlai_sampler_sample(r->smp, lg);
        if (r->lp_on) {
            rlai_logprobs_compute(r->lp_raw, (int)j->n_vocab, j->out[i], r->gp.top_logprobs, &r->lp);
            r->lp_ready = true;
        }
    }
}

/* Serial phase: record the sampled token, stream it, stop. */
static void req_sample(rlai_engine *e, rlai_req *r, int32_t tok)
{
    if (r->t_first == 0)
        r->t_first = now_ms();
    if (r->gm) {
        if (tok >= 0 && !grammar_allows(r, tok)) {
            /* every allowed logit was -inf: take the first allowed token */
            int32_t t = 0, nv = rlai_gvocab_n_vocab(e->gvocab);
            while (t < nv && !grammar_allows(r, t))
                t++;
            tok = t < nv ? t : -1;
        }
        int grc = tok < 0 ? (r->gerr ? r->gerr : RLAI_ERR_INVALID_ARG)
                          : rlai_grammar_matcher_accept_token(r->gm, e->gvocab, tok);
        if (grc < 0) {
            req_finish(e, r, RLAI_STOP_NONE, grc);
            return;
        }
        if (rlai_tokenizer_is_eog(e->tok, tok)) {   /* allowed only when complete */
            req_finish(e, r, RLAI_STOP_EOG, 0);
            return;
        }
    }
    if (!r->gp.ignore_eos && rlai_tokenizer_is_eog(e->tok, tok)) {
        req_finish(e, r, RLAI_STOP_EOG, 0);
        return;
    }
    if (r->lp_on && r->lp_ready && r->lp.token == tok) {
        r->gp.on_logprobs(r->gp.logprobs_user, &r->lp);
        r->lp_ready = false;
    }
    rlai_sampler_accept(r->smp, tok);
    r->toks[r->n_toks++] = tok;
    r->mt.gen_tokens++;
    char piece[256];
    int plen = rlai_tokenizer_token_to_piece(e->tok, tok, false, piece, sizeof(piece));
    char *big = NULL;
    const char *pp = piece;
    if (plen > (int)sizeof(piece)) {
        big = malloc((size_t)plen);
        if (big) {
            rlai_tokenizer_token_to_piece(e->tok, tok, false, big, (size_t)plen);
            pp = big;
        } else {
            plen = 0;
        }
    }
    if (plen < 0)
        plen = 0;
    const char *txt;
    size_t tlen;
    bool stopped = rlai_textstream_push(r->ts, pp, (size_t)plen, &txt, &tlen);
    free(big);
    if (r->on_token && r->on_token(r->user, tok, txt, tlen) != 0) {
        req_finish(e, r, RLAI_STOP_CANCELLED, 0);
        return;
    }
    if (stopped)
        req_finish(e, r, RLAI_STOP_STRING, 0);
    else if (r->gm && rlai_grammar_matcher_done(r->gm))
        req_finish(e, r, RLAI_STOP_EOG, 0);
    else if (r->gp.max_tokens > 0 && r->mt.gen_tokens >= r->gp.max_tokens)
        req_finish(e, r, RLAI_STOP_MAX_TOKENS, 0);
    else if (r->n_toks >= r->total || r->n_toks >= e->n_ctx)
        req_finish(e, r, r->n_toks >= e->n_ctx ? RLAI_STOP_CONTEXT : RLAI_STOP_MAX_TOKENS, 0);
}

/* Speculative verification (serial phase): `tok` was sampled from the
 * request's first logits row (with the draft rule when it drafted). Emits
 * it, and while it equals the draft token of that row, samples the next
 * row and emits that too: the accepted draft prefix plus one corrected or
 * bonus token, each through req_sample (stop strings, EOG, max_tokens and
 * cancel end the run at that token). Then the K/V of rejected draft
 * positions is dropped by truncating the block table (no copy) and the
 * accepted full blocks are committed to the prefix cache. Returns the
 * number of tokens emitted. */
static int req_verify(rlai_engine *e, rlai_req *r, int32_t tok, float *logits, size_t n_vocab)
{
    int nd = r->n_draft, acc = 0, emitted = 0;
    int p0 = r->seq.n_tokens - 1;   /* position of the token fed this step */
    for (int j = 0;; j++) {
        bool hit = j < nd && tok == r->draft[j];
        req_sample(e, r, tok);
        emitted++;
        if (r->done || !hit)
            break;
        acc++;
        float *lg = logits + (size_t)(r->row0 + j + 1) * n_vocab;
        tok = j + 1 < nd ? rlai_sampler_sample_draft(r->smp, lg, r->draft[j + 1])
                         : rlai_sampler_sample(r->smp, lg);
    }
    if (nd > 0) {
        rlai_spec_feedback(&r->spec, nd, acc);
        r->mt.drafted_tokens += nd;
        r->mt.accepted_tokens += acc;
        if (!r->done) {
            /* positions p0..p0+acc hold the fed token and the accepted
             * drafts; everything after is rejected */
            r->seq.n_tokens = p0 + 1 + acc;
            int dropped = rlai_kv_seq_truncate(e->kv, &r->seq, r->seq.n_tokens);
            if (dropped > 0)
                r->reserve += dropped;
            rlai_kv_prefix_commit(e->kv, &r->seq, r->toks, r->seq.n_tokens);
        }
        r->n_draft = 0;
    }
    return emitted;
}

/* Tokens a request feeds this step: its decode token, or a prompt chunk
 * taken from the step's prefill budget. */
static int step_take(const rlai_req *r, int *budget)
{
    int pending = r->n_toks - r->seq.n_tokens;
    if (pending <= 1)
        return pending;
    int t = pending < *budget ? pending : *budget;
    if (t < 0)
        t = 0;
    *budget -= t;
    return t;
}

static int step_locked(rlai_engine *e)
{
    rlai_req *finished = NULL;
    /* Cancelled and timed-out running requests end now: their KV is freed this step. */
    double t_now = now_ms();
    for (rlai_req *r = e->running; r; r = r->next)
        if (atomic_load(&r->cancel))
            req_finish(e, r, RLAI_STOP_CANCELLED, 0);
        else if (past_deadline(r, t_now))
            req_finish(e, r, RLAI_STOP_TIMEOUT, 0);
    admit(e, &finished);

    /* Build one batch: one decode token per streaming request (plus its
     * speculative draft, when it has one), prefill chunks for the others
     * within the per-step prompt budget. */
    const rlai_hparams *hp = rlai_model_hparams(e->model);
    int budget = e->params.prefill_chunk, n = 0, n_want = 0, n_seqs = 0, n_dec = 0;
    for (rlai_req *r = e->running; r; r = r->next)
        if (!r->done && r->n_toks - r->seq.n_tokens == 1 && r->n_toks > r->n_prompt)
            n_dec++;
    /* Drafting pays only while decode is bandwidth-bound: with more than a
     * few decoding sequences the extra tokens are no longer nearly free. */
    bool spec_ok = e->params.spec_max_batch < 0 || n_dec <= e->params.spec_max_batch;
    for (rlai_req *r = e->running; r; r = r->next) {
        if (r->done)
            continue;
        r->n_draft = 0;
        int t = step_take(r, &budget);
        if (t == 1 && r->n_toks > r->n_prompt && spec_ok && !r->gm) {
            int g = rlai_spec_next_gamma(&r->spec);
            int room = r->total - r->n_toks; /* KV positions reserved beyond the pending token */
            if (g > room)
                g = room;
            if (g > 0)
                r->n_draft = rlai_spec_ngram_draft(r->toks, r->n_toks, g, r->draft, NULL);
        }
        n += t + r->n_draft;
        n_want += t > 0 && r->seq.n_tokens + t == r->n_toks ? 1 + r->n_draft : 0;
        n_seqs++;
    }
    int rc = 0;
    if (n > 0) {
        if (e->step_logits_rows < n_want) {
            float *nl = realloc(e->step_logits, sizeof(float) * (size_t)n_want * (size_t)hp->n_vocab);
            if (!nl)
                return RLAI_ERR_NOMEM;
            e->step_logits = nl;
            e->step_logits_rows = n_want;
        }
        int32_t *tokens = malloc(sizeof(int32_t) * (size_t)n);
        int32_t *pos = malloc(sizeof(int32_t) * (size_t)n);
        int32_t *sidx = malloc(sizeof(int32_t) * (size_t)n);
        bool *want = malloc(sizeof(bool) * (size_t)n);
        rlai_kv_seq **seqs = malloc(sizeof(rlai_kv_seq *) * (size_t)n_seqs);
        rlai_req **rows = malloc(sizeof(rlai_req *) * (size_t)n_seqs);
        int *take = malloc(sizeof(int) * (size_t)n_seqs);
        int n_rows = 0, wi = 0;
        if (!tokens || !pos || !sidx || !want || !seqs || !rows || !take) {
            rc = RLAI_ERR_NOMEM;
        } else {
            budget = e->params.prefill_chunk;
            int k = 0, si = 0;
            for (rlai_req *r = e->running; r; r = r->next) {
                if (r->done)
                    continue;
                int t = step_take(r, &budget);
                take[si] = 0;
                if (t <= 0) {
                    continue;
                }
                int nd = r->n_draft;
                int p0 = r->seq.n_tokens, before = r->seq.n_blocks;
                int wrc = rlai_kv_seq_prepare_write(e->kv, &r->seq, p0, p0 + t + nd);
                if (wrc < 0) {
                    req_finish(e, r, RLAI_STOP_NONE, wrc);
                    continue;
                }
                r->reserve -= r->seq.n_blocks - before;
                if (r->reserve < 0)
                    r->reserve = 0;
                seqs[si] = &r->seq;
                take[si] = t;
                for (int j = 0; j < t + nd; j++) {
                    tokens[k] = j < t ? r->toks[p0 + j] : r->draft[j - t];
                    pos[k] = p0 + j;
                    sidx[k] = si;
                    want[k] = p0 + j >= r->n_toks - 1;  /* the last real token and every draft token */
                    if (want[k] && j == t - 1) {
                        r->row0 = wi;
                        rows[n_rows++] = r;
                    }
                    wi += want[k];
                    k++;
                }
                si++;
            }
            if (k > 0) {
                rlai_batch b = { k, tokens, pos, sidx, want, false };
                rc = rlai_model_forward(e->mctx, e->kv, seqs, &b, e->step_logits);
            }
            if (rc == 0) {
                si = 0;
                for (rlai_req *r = e->running; r; r = r->next) {
                    if (r->done || si >= n_seqs || seqs[si] != &r->seq)
                        continue;
                    r->seq.n_tokens += take[si];
                    rlai_kv_prefix_commit(e->kv, &r->seq, r->toks, r->seq.n_tokens);
                    if (r->seq.n_tokens == r->n_prompt && r->t_prefill_end == 0)
                        r->t_prefill_end = now_ms();
                    si++;
                }
                int32_t sampled_stack[64];
                int32_t *sampled = n_rows <= 64 ? sampled_stack : malloc(sizeof(int32_t) * (size_t)n_rows);
                if (sampled) {
                    sample_job sj = { e->gvocab, rows, e->step_logits, (size_t)hp->n_vocab, n_rows, sampled };
                    rlai_threadpool_run(n_rows > 1 ? e->tp : NULL, sample_rows, &sj);
                }
                for (int i = 0; i < n_rows; i++) {
                    rlai_req *r = rows[i];
                    bool decode = r->seq.n_tokens > r->n_prompt;
                    if (r->t_prefill_end == 0)
                        r->t_prefill_end = now_ms();
                    if (!sampled) {
                        req_finish(e, r, RLAI_STOP_NONE, RLAI_ERR_NOMEM);
                        continue;
                    }
                    int emitted = req_verify(e, r, sampled[i], e->step_logits, (size_t)hp->n_vocab);
                    if (decode)
                        r->n_decode += emitted;
                }
                if (sampled != sampled_stack)
                    free(sampled);
            } else {
                for (rlai_req *r = e->running; r; r = r->next)
                    req_finish(e, r, RLAI_STOP_NONE, rc);
            }
        }
        free(tokens);
        free(pos);
        free(sidx);
        free(want);
        free(seqs);
        free(rows);
        free(take);
    }

    /* Unlink finished requests, then call on_done outside the lock. */
    pthread_mutex_lock(&e->qmu);
    rlai_req **pp = &e->running;
    while (*pp) {
        rlai_req *r = *pp;
        if (r->done) {
            *pp = r->next;
            e->n_running--;
            r->next = finished;
            finished = r;
        } else {
            pp = &r->next;
        }
    }
    rlai_kv_stats ks;
    rlai_kv_cache_stats(e->kv, &ks);
    e->stats.running = e->n_running;
    e->stats.queued = e->n_queued;
    e->stats.kv_blocks_total = ks.blocks_total;
    e->stats.kv_blocks_free = ks.blocks_free;
    e->stats.kv_blocks_used = ks.blocks_used;
    e->stats.kv_blocks_cached = ks.blocks_cached;
    e->stats.kv_blocks_pinned = ks.blocks_pinned;
    e->stats.steps++;
    int left = e->n_running + e->n_queued;
    pthread_mutex_unlock(&e->qmu);
    while (finished) {
        rlai_req *r = finished;
        finished = r->next;
        pthread_mutex_lock(&e->qmu);
        e->stats.gen_tokens_total += (uint64_t)r->mt.gen_tokens;
        e->stats.spec_drafted_total += (uint64_t)r->mt.drafted_tokens;
        e->stats.spec_accepted_total += (uint64_t)r->mt.accepted_tokens;
        pthread_mutex_unlock(&e->qmu);
        if (r->on_done)
            r->on_done(r->user, r->id, r->status, &r->mt);
        req_free(e, r);
    }
    return rc < 0 ? rc : left;
}

int rlai_engine_step(rlai_engine *e)
{
    pthread_mutex_lock(&e->step_mu);
    int rc = step_locked(e);
    pthread_mutex_unlock(&e->step_mu);
    return rc;
}

/* Synchronous generation on top of the scheduler: submit, then step until
 * this request is done (other submitted requests advance too). */
typedef struct sync_wait {
    rlai_token_cb cb;
    void *user;
    bool done;
    int status;
    rlai_gen_metrics m;
} sync_wait;

static int sync_token(void *user, rlai_token tok, const char *text, size_t len)
{
    sync_wait *w = user;
    return w->cb ? w->cb(w->user, tok, text, len) : 0;
}

static void sync_done(void *user, uint64_t id, int status, const rlai_gen_metrics *m)
{
    (void)id;
    sync_wait *w = user;
    w->done = true;
    w->status = status;
    w->m = *m;
}

int rlai_engine_generate_tokens(rlai_engine *e, const rlai_token *prompt, int n_prompt,
                                const rlai_gen_params *gpp, rlai_token_cb cb, void *user,
                                rlai_gen_metrics *metrics)
{
    if (!e)
        return RLAI_ERR_INVALID_ARG;
    sync_wait w = { cb, user, false, 0, { 0 } };
    rlai_request_params rp;
    memset(&rp, 0, sizeof(rp));
    rp.prompt = prompt;
    rp.n_prompt = n_prompt;
    if (gpp)
        rp.gen = *gpp;
    else
        rlai_gen_params_init(&rp.gen);
    rp.on_token = sync_token;
    rp.on_done = sync_done;
    rp.user = &w;
    int rc = rlai_engine_submit(e, &rp, NULL);
    if (rc < 0)
        return rc;
    while (!w.done) {
        rc = rlai_engine_step(e);
        if (rc < 0 && !w.done)
            return rc;
    }
    if (metrics)
        *metrics = w.m;
    return w.status;
}

/* Runs the forward pass over tokens[from..to) of seq without logits. */
static int prefill_no_logits(rlai_engine *e, rlai_kv_seq *seq, const rlai_token *toks, int from, int to)
{
    int n = to - from;
    if (n <= 0)
        return 0;
    int rc = rlai_kv_seq_prepare_write(e->kv, seq, from, to);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)n);
    bool *want = calloc((size_t)n, sizeof(bool));
    if (rc == 0 && (!pos || !want))
        rc = RLAI_ERR_NOMEM;
    if (rc == 0) {
        for (int i = 0; i < n; i++)
            pos[i] = from + i;
        rlai_kv_seq *seqs[1] = { seq };
        rlai_batch b = { n, toks + from, pos, NULL, want, false };
        rc = rlai_model_forward(e->mctx, e->kv, seqs, &b, NULL);
        if (rc == 0) {
            seq->n_tokens = to;
            rlai_kv_prefix_commit(e->kv, seq, toks, to);
        }
    }
    free(pos);
    free(want);
    return rc;
}

/* Copies the KV pool figures into the stats snapshot (under step_mu). */
static void refresh_kv_stats(rlai_engine *e)
{
    rlai_kv_stats ks;
    rlai_kv_cache_stats(e->kv, &ks);
    pthread_mutex_lock(&e->qmu);
    e->stats.kv_blocks_total = ks.blocks_total;
    e->stats.kv_blocks_free = ks.blocks_free;
    e->stats.kv_blocks_used = ks.blocks_used;
    e->stats.kv_blocks_cached = ks.blocks_cached;
    e->stats.kv_blocks_pinned = ks.blocks_pinned;
    pthread_mutex_unlock(&e->qmu);
}

static int pin_locked(rlai_engine *e, const rlai_token *toks, int n)
{
    int full = n / RLAI_KV_BLOCK * RLAI_KV_BLOCK;
    if (full == 0)
        return 0;
    rlai_kv_seq seq;
    memset(&seq, 0, sizeof(seq));
    int have = rlai_kv_prefix_attach(e->kv, &seq, toks, full, full);
    int rc = have < 0 ? have : 0;
    if (rc == 0 && have < full) {
        /* Never take blocks that admitted requests may still need. */
        int committed = 0;
        for (rlai_req *r = e->running; r; r = r->next)
            committed += r->reserve;
        if (blocks_for(full) - seq.n_blocks > rlai_kv_cache_n_free(e->kv) - committed)
            rc = RLAI_ERR_KV_FULL;
        else
            rc = prefill_no_logits(e, &seq, toks, have, full);
    }
    if (rc == 0)
        rc = rlai_kv_prefix_pin(e->kv, toks, full);
    rlai_kv_seq_release(e->kv, &seq);
    return rc < 0 ? rc : full;
}

int rlai_engine_pin_prefix(rlai_engine *e, const rlai_token *toks, int n)
{
    if (!e || !toks || n <= 0)
        return RLAI_ERR_INVALID_ARG;
    if (n >= e->n_ctx)
        return RLAI_ERR_CONTEXT_FULL;
    const rlai_hparams *hp = rlai_model_hparams(e->model);
    for (int i = 0; i < n; i++)
        if (toks[i] < 0 || toks[i] >= hp->n_vocab)
            return RLAI_ERR_INVALID_ARG;
    pthread_mutex_lock(&e->step_mu);
    int rc = pin_locked(e, toks, n);
    refresh_kv_stats(e);
    pthread_mutex_unlock(&e->step_mu);
    return rc;
}

int rlai_engine_unpin_prefix(rlai_engine *e, const rlai_token *toks, int n)
{
    if (!e || !toks || n <= 0)
        return RLAI_ERR_INVALID_ARG;
    pthread_mutex_lock(&e->step_mu);
    int rc = rlai_kv_prefix_unpin(e->kv, toks, n);
    refresh_kv_stats(e);
    pthread_mutex_unlock(&e->step_mu);
    return rc;
}

int rlai_engine_eval_logits(rlai_engine *e, const rlai_token *toks, int n, float *logits)
{
    if (!e || !toks || n <= 0 || !logits)
        return RLAI_ERR_INVALID_ARG;
    if (n >= e->n_ctx)
        return RLAI_ERR_CONTEXT_FULL;
    rlai_kv_seq seq;
    memset(&seq, 0, sizeof(seq));
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)n);
    bool *want = malloc(sizeof(bool) * (size_t)n);
    int rc = pos && want ? 0 : RLAI_ERR_NOMEM;
    if (rc == 0)
        rc = rlai_kv_seq_reserve(e->kv, &seq, n);
    if (rc == 0) {
        for (int i = 0; i < n; i++) {
            pos[i] = i;
            want[i] = true;
        }
        rlai_kv_seq *seqs[1] = { &seq };
        rlai_batch b = { n, toks, pos, NULL, want, false };
        rc = rlai_model_forward(e->mctx, e->kv, seqs, &b, logits);
    }
    rlai_kv_seq_release(e->kv, &seq);
    free(pos);
    free(want);
    return rc;
}

/* ------------------------------------------------------------------
 * The one request path: text or chat -> tokens -> limits -> submit. */

static int text_fail(char *err, size_t errlen, int rc, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return rc;
}

int rlai_engine_submit_text(rlai_engine *e, const rlai_text_request *rq, uint64_t *id, int *n_prompt,
                            char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = 0;
    if (n_prompt)
        *n_prompt = -1;
    if (!e || !rq || !id)
        return text_fail(err, errlen, RLAI_ERR_INVALID_ARG, "invalid argument");
    bool chat = rq->messages && rq->n_messages > 0;
    bool text = rq->prompt != NULL;
    if (chat && text)
        return text_fail(err, errlen, RLAI_ERR_INVALID_ARG, "give either chat messages or a prompt");
    rlai_token *toks = NULL;           /* owned here (chat, text) */
    const rlai_token *use;
    int n = 0, rc;
    if (chat) {
        rc = rlai_engine_tokenize_chat(e, rq->messages, rq->n_messages, true, &toks, &n);
        if (rc == RLAI_ERR_INVALID_ARG)
            return text_fail(err, errlen, rc, "chat messages rejected by the template (roles: system, user, assistant)");
        if (rc < 0)
            return text_fail(err, errlen, rc, "%s", rlai_strerror(rc));
        use = toks;
    } else if (text) {
        size_t len = strlen(rq->prompt);
        n = rlai_engine_tokenize(e, rq->prompt, len, true, true, NULL, 0);
        if (n < 0)
            return text_fail(err, errlen, n, "%s", rlai_strerror(n));
        toks = malloc(sizeof(rlai_token) * (size_t)(n > 0 ? n : 1));
        if (!toks)
            return text_fail(err, errlen, RLAI_ERR_NOMEM, "%s", rlai_strerror(RLAI_ERR_NOMEM));
        n = rlai_engine_tokenize(e, rq->prompt, len, true, true, toks, n);
        if (n < 0) {
            free(toks);
            return text_fail(err, errlen, n, "%s", rlai_strerror(n));
        }
        use = toks;
    } else {
        use = rq->rp.prompt;
        n = use ? rq->rp.n_prompt : 0;
        if (n < 0)
            n = 0;
        const rlai_hparams *hp = rlai_model_hparams(e->model);
        for (int i = 0; i < n; i++)
            if (use[i] < 0 || use[i] >= hp->n_vocab)
                return text_fail(err, errlen, RLAI_ERR_INVALID_ARG, "prompt token %d is %d; ids are in [0, %d)", i,
                                 (int)use[i], hp->n_vocab);
    }
    if (n_prompt)
        *n_prompt = n;
    int limit = rq->max_prompt_tokens > 0 ? rq->max_prompt_tokens : e->n_ctx - 1;
    if (n == 0) {
        free(toks);
        return text_fail(err, errlen, RLAI_ERR_INVALID_ARG, "empty prompt");
    }
    if (n > limit) {
        free(toks);
        return text_fail(err, errlen, RLAI_ERR_TOO_LARGE, "prompt has %d tokens; the limit is %d", n, limit);
    }
    rlai_request_params rp = rq->rp;
    rp.prompt = use;
    rp.n_prompt = n;
    rc = rlai_engine_submit(e, &rp, id);
    free(toks);
    if (rc < 0)
        return text_fail(err, errlen, rc, "%s", rlai_strerror(rc));
    return 0;
}

/* Pooled final-norm hidden state of a fresh sequence (engine.h). Holds
 * step_mu for the forward pass, so it never runs inside a scheduler step;
 * its KV blocks come only from what admitted requests do not reserve. */
static int embed_locked(rlai_engine *e, const rlai_token *toks, int n, rlai_pooling pooling, float *out)
{
    const rlai_hparams *hp = rlai_model_hparams(e->model);
    int E = hp->n_embd;
    int committed = 0;
    for (rlai_req *r = e->running; r; r = r->next)
        committed += r->reserve;
    if (blocks_for(n) > rlai_kv_cache_n_free(e->kv) - committed)
        return RLAI_ERR_BUSY;
    int rows = pooling == RLAI_POOL_MEAN ? n : 1;
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)n);
    bool *want = malloc(sizeof(bool) * (size_t)n);
    float *hid = malloc(sizeof(float) * (size_t)rows * (size_t)E);
    rlai_kv_seq seq;
    memset(&seq, 0, sizeof(seq));
    int rc = pos && want && hid ? 0 : RLAI_ERR_NOMEM;
    if (rc == 0)
        rc = rlai_kv_seq_reserve(e->kv, &seq, n);
    if (rc == 0) {
        for (int i = 0; i < n; i++) {
            pos[i] = i;
            want[i] = pooling == RLAI_POOL_MEAN || i == n - 1;
        }
        rlai_kv_seq *seqs[1] = { &seq };
        rlai_batch b = { n, toks, pos, NULL, want, true };
        rc = rlai_model_forward(e->mctx, e->kv, seqs, &b, hid);
    }
    if (rc == 0) {
        for (int k = 0; k < E; k++) {
            double acc = 0;
            for (int i = 0; i < rows; i++)
                acc += hid[(size_t)i * E + k];
            out[k] = (float)(acc / rows);
        }
    }
    rlai_kv_seq_release(e->kv, &seq);
    free(pos);
    free(want);
    free(hid);
    return rc;
}

int rlai_engine_embed(rlai_engine *e, const rlai_token *toks, int n, rlai_pooling pooling, bool normalize,
                      float *out)
{
    if (!e || !toks || n <= 0 || !out || (pooling != RLAI_POOL_MEAN && pooling != RLAI_POOL_LAST))
        return RLAI_ERR_INVALID_ARG;
    if (n >= e->n_ctx)
        return RLAI_ERR_CONTEXT_FULL;
    const rlai_hparams *hp = rlai_model_hparams(e->model);
    for (int i = 0; i < n; i++)
        if (toks[i] < 0 || toks[i] >= hp->n_vocab)
            return RLAI_ERR_INVALID_ARG;
    pthread_mutex_lock(&e->step_mu);
    int rc = embed_locked(e, toks, n, pooling, out);
    refresh_kv_stats(e);
    pthread_mutex_unlock(&e->step_mu);
    if (rc == 0 && normalize) {
        double ss = 0;
        for (int k = 0; k < hp->n_embd; k++)
            ss += (double)out[k] * out[k];
        if (ss > 0) {
            double inv = 1.0 / sqrt(ss);
            for (int k = 0; k < hp->n_embd; k++)
                out[k] = (float)(out[k] * inv);
        }
    }
    return rc;
}
