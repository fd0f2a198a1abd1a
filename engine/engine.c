/* engine.c - the public embed API (include/rlai/engine.h), first half:
 * open and close (ties the GGUF file, model, tokenizer, kernels, backend
 * and KV cache together), tokenizer and chat templates, the synchronous
 * helpers on top of the scheduler, logits evaluation and embeddings. The
 * scheduler half (submit, step, cancel, pinning, the text request path)
 * is scheduler.c; the shared state is engine_impl.h. */
#include "engine_impl.h"
#include "vision.h"
#include "scheduler.h"
#include "dtype.h"
#include "rlai/clock.h"
#include "rlai/error.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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
    p->spec_lookup_min = RLAI_SPEC_LOOKUP_MIN;
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
    if (!strcmp(s, "draft"))
        return RLAI_SPEC_DRAFT;
    if (!strcmp(s, "self"))
        return RLAI_ERR_UNSUPPORTED;
    return RLAI_ERR_INVALID_ARG;
}

const char *rlai_spec_mode_error(int rc)
{
    return rc == RLAI_ERR_UNSUPPORTED
               ? "must be off, ngram, draft or auto: self-speculative drafting is not implemented"
               : "must be off, ngram, draft or auto";
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

int rlai_engine_open(const char *path, const rlai_engine_params *params,
                     rlai_engine **out, char *errbuf, size_t errbuf_len)
{
    char err[512] = "";
    *out = NULL;
    if (!path) {
        rlai_errf(errbuf, errbuf_len, 0, "%s", "no model path given");
        return RLAI_ERR_INVALID_ARG;
    }
    rlai_engine *e = calloc(1, sizeof(*e));
    if (!e)
        return RLAI_ERR_NOMEM;
    pthread_mutex_init(&e->qmu, NULL);
    pthread_cond_init(&e->qcv, NULL);
    pthread_mutex_init(&e->step_mu, NULL);
    pthread_mutex_init(&e->gv_mu, NULL);
    pthread_mutex_init(&e->vmu, NULL);
    e->image_token = -1;
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
    if (e->params.draft_model) {
        if ((rc = rlai_draft_open(e->params.draft_model, e->tok, e->be, RLAI_MAX_BATCH, n_ctx, blocks, kv_type,
                                  &e->draft, err, sizeof(err))) < 0)
            goto fail;
        e->params.draft_model = rlai_draft_path(e->draft);
    }
    {
        /* Kernel scratch for the widest input (n_ff or n_head*head_dim, of
         * the model and the draft) at a full prefill chunk, so matmuls never
         * allocate while generating. */
        int64_t cols = 0;
        for (int m = 0; m < 2; m++) {
            const rlai_hparams *h = m == 0 ? hp : e->draft ? rlai_draft_hparams(e->draft) : NULL;
            if (!h)
                continue;
            if (h->n_embd > cols)
                cols = h->n_embd;
            if (h->n_ff > cols)
                cols = h->n_ff;
            if ((int64_t)h->n_head * h->head_dim > cols)
                cols = (int64_t)h->n_head * h->head_dim;
        }
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
    if (e->params.spec == RLAI_SPEC_DRAFT && !e->draft) {
        snprintf(err, sizeof(err), "speculative mode 'draft' needs a draft model (draft_model)");
        rc = RLAI_ERR_INVALID_ARG;
        goto fail;
    }
    if (e->params.spec != RLAI_SPEC_OFF && e->params.spec != RLAI_SPEC_NGRAM && e->params.spec != RLAI_SPEC_DRAFT)
        e->params.spec = RLAI_SPEC_AUTO; /* per request: draft or ngram (scheduler.c) */
    if (e->params.spec_max_draft <= 0)
        e->params.spec_max_draft = 8;
    if (e->params.spec_max_draft > RLAI_SPEC_MAX_DRAFT)
        e->params.spec_max_draft = RLAI_SPEC_MAX_DRAFT;
    if (e->params.spec_max_batch == 0)
        e->params.spec_max_batch = 2;
    if (e->params.spec_lookup_min == 0)
        e->params.spec_lookup_min = RLAI_SPEC_LOOKUP_MIN;
    if (e->params.spec_lookup_min > RLAI_SPEC_NGRAM_MAX)
        e->params.spec_lookup_min = RLAI_SPEC_NGRAM_MAX;   /* longer matches are not measured */
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

void rlai_engine_close(rlai_engine *e)
{
    if (!e)
        return;
    /* Requests still queued or running are dropped without callbacks. */
    while (e->queue) {
        rlai_req *r = e->queue;
        e->queue = r->next;
        rlai_sched_req_free(e, r);
    }
    while (e->running) {
        rlai_req *r = e->running;
        e->running = r->next;
        rlai_sched_req_free(e, r);
    }
    free(e->step_logits);
    pthread_mutex_destroy(&e->qmu);
    pthread_mutex_destroy(&e->step_mu);
    pthread_mutex_destroy(&e->gv_mu);
    pthread_mutex_destroy(&e->vmu);
    rlai_vision_free(e->vision);
    rlai_kernels_free(e->vkern);
    rlai_threadpool_free(e->vtp);
    free(e->mmproj_path);
    rlai_gvocab_free(e->gvocab);
    pthread_cond_destroy(&e->qcv);
    rlai_draft_free(e->draft);
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
    info->draft_model = e->draft ? rlai_draft_path(e->draft) : NULL;
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

int rlai_engine_check_tokens(const rlai_engine *e, const rlai_token *toks, int n)
{
    if (!toks || n <= 0)
        return RLAI_ERR_INVALID_ARG;
    if (n >= e->n_ctx)
        return RLAI_ERR_CONTEXT_FULL;
    const rlai_hparams *hp = rlai_model_hparams(e->model);
    for (int i = 0; i < n; i++)
        if (toks[i] < 0 || toks[i] >= hp->n_vocab)
            return RLAI_ERR_INVALID_ARG;
    return 0;
}

int rlai_engine_eval_logits(rlai_engine *e, const rlai_token *toks, int n, float *logits)
{
    return rlai_engine_eval_logits_images(e, toks, n, NULL, 0, logits);
}

int rlai_engine_eval_logits_images(rlai_engine *e, const rlai_token *toks, int n,
                                   const rlai_image_rows *images, int n_images, float *logits)
{
    if (!e || !toks || n <= 0 || !logits || n_images < 0 || (n_images > 0 && !images))
        return RLAI_ERR_INVALID_ARG;
    size_t E = (size_t)rlai_model_hparams(e->model)->n_embd;
    for (int i = 0; i < n_images; i++) {
        if (!images[i].rows || images[i].n_rows <= 0 || images[i].pos < 0 || images[i].pos > n - images[i].n_rows)
            return RLAI_ERR_INVALID_ARG;
        for (int j = 0; j < i; j++)
            if (images[i].pos < images[j].pos + images[j].n_rows && images[j].pos < images[i].pos + images[i].n_rows)
                return RLAI_ERR_INVALID_ARG;
    }
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
        const float **embd = n_images > 0 ? calloc((size_t)n, sizeof(*embd)) : NULL;
        if (n_images > 0 && !embd)
            rc = RLAI_ERR_NOMEM;
        for (int i = 0; rc == 0 && i < n_images; i++)
            for (int j = 0; j < images[i].n_rows; j++)
                embd[images[i].pos + j] = images[i].rows + (size_t)j * E;
        rlai_batch b = { n, toks, pos, NULL, want, false, embd };
        if (rc == 0)
            rc = rlai_model_forward(e->mctx, e->kv, seqs, &b, logits);
        free(embd);
    }
    rlai_kv_seq_release(e->kv, &seq);
    free(pos);
    free(want);
    return rc;
}

/* ------------------------------------------------------------------
 * The vision encoder (engine/vision.h) */

int rlai_engine_load_mmproj(rlai_engine *e, const char *path, char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = 0;
    if (!e || !path)
        return RLAI_ERR_INVALID_ARG;
    pthread_mutex_lock(&e->vmu);
    int rc = 0;
    rlai_vision *v = NULL;
    rlai_kernels *k = NULL;
    rlai_threadpool *tp = NULL;
    char *copy = NULL;
    if (e->vision) {
        rc = RLAI_ERR_EXISTS;
        rlai_errf(err, errlen, 0, "a vision encoder is loaded already (%s)", e->mmproj_path);
        goto out;
    }
    if ((rc = rlai_vision_open_file(path, &v, err, errlen)) < 0)
        goto out;
    const rlai_hparams *hp = rlai_model_hparams(e->model);
    if (rlai_vision_get_hparams(v)->n_out != hp->n_embd) {
        rc = RLAI_ERR_INVALID_ARG;
        rlai_errf(err, errlen, 0, "vision: the projector's output width %d is not the model's n_embd %d "
                  "(an mmproj of another model?)", rlai_vision_get_hparams(v)->n_out, hp->n_embd);
        goto out;
    }
    int nth = rlai_threadpool_size(e->tp);
    if ((rc = rlai_kernels_new(e->isa, e->params.precise, &k)) < 0 ||
        (rc = rlai_threadpool_new(nth > 0 ? nth : 1, &tp)) < 0 || !(copy = strdup(path))) {
        rc = rc < 0 ? rc : RLAI_ERR_NOMEM;
        rlai_errf(err, errlen, 0, "vision: %s", rlai_strerror(rc));
        goto out;
    }
    e->vision = v;
    e->vkern = k;
    e->vtp = tp;
    e->mmproj_path = copy;
    static const char tok[] = "<image>";
    e->image_token = rlai_tokenizer_find(e->tok, tok, sizeof(tok) - 1);
    v = NULL;
    k = NULL;
    tp = NULL;
    copy = NULL;
out:
    pthread_mutex_unlock(&e->vmu);
    rlai_vision_free(v);
    rlai_kernels_free(k);
    rlai_threadpool_free(tp);
    free(copy);
    return rc;
}

int rlai_engine_vision_info(const rlai_engine *e, rlai_vision_info *out)
{
    if (!e || !out)
        return RLAI_ERR_INVALID_ARG;
    memset(out, 0, sizeof(*out));
    rlai_engine *me = (rlai_engine *)e;
    pthread_mutex_lock(&me->vmu);
    int rc = RLAI_ERR_NOT_FOUND;
    if (e->vision) {
        const rlai_vision_hparams *vh = rlai_vision_get_hparams(e->vision);
        out->n_tokens = vh->n_tokens;
        out->image_size = vh->image_size;
        out->image_token = e->image_token;
        out->image_token_text = "<image>";
        out->path = e->mmproj_path;
        out->weight_bytes = rlai_vision_weight_bytes(e->vision);
        rc = 0;
    }
    pthread_mutex_unlock(&me->vmu);
    return rc;
}

int rlai_engine_embed_image(rlai_engine *e, const uint8_t *img, int width, int height, size_t stride,
                            int channels, float *out)
{
    if (!e || !img || !out)
        return RLAI_ERR_INVALID_ARG;
    pthread_mutex_lock(&e->vmu);
    int rc = e->vision ? rlai_vision_embed_image(e->vision, e->vkern, e->vtp, img, width, height, stride,
                                                 channels, out)
                       : RLAI_ERR_NOT_IMPLEMENTED;
    pthread_mutex_unlock(&e->vmu);
    return rc;
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
    if (rlai_blocks_for(n) > rlai_kv_cache_n_free(e->kv) - committed)
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
        rlai_batch b = { n, toks, pos, NULL, want, true, NULL };
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
    if (!e || !out || (pooling != RLAI_POOL_MEAN && pooling != RLAI_POOL_LAST))
        return RLAI_ERR_INVALID_ARG;
    int rc0 = rlai_engine_check_tokens(e, toks, n);
    if (rc0 < 0)
        return rc0;
    const rlai_hparams *hp = rlai_model_hparams(e->model);
    pthread_mutex_lock(&e->step_mu);
    int rc = embed_locked(e, toks, n, pooling, out);
    rlai_sched_refresh_kv_stats(e);
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
