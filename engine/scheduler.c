/* scheduler.c - the scheduler half of the engine object (engine.h):
 * submit and cancel, admission control against the KV pool, continuous
 * batching with chunked prefill interleaved with decode, sampling with
 * grammar masks and logprobs, speculative draft verification and KV
 * rollback, request deadlines, prefix pinning, and the one text request
 * path (rlai_engine_submit_text). The engine's state is engine_impl.h;
 * open/close and the synchronous helpers are in engine.c. */
#include "engine_impl.h"
#include "scheduler.h"
#include "vision.h"
#include "rlai/clock.h"
#include "rlai/deadline.h"
#include "rlai/error.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void rlai_sched_req_free(rlai_engine *e, rlai_req *r)
{
    if (!r)
        return;
    rlai_kv_seq_release(e->kv, &r->seq);
    rlai_draft_seq_release(e->draft, &r->dseq);
    rlai_sampler_free(r->smp);
    rlai_grammar_matcher_free(r->gm);
    free(r->gmask);
    rlai_textstream_free(r->ts);
    free(r->lp_raw);
    free(r->lb);
    free(r->pred);
    free(r->plp_buf);
    if (r->stops)
        for (char **s = r->stops; *s; s++)
            free(*s);
    free(r->stops);
    for (int i = 0; i < r->n_imgs; i++)
        free(r->imgs[i].rows);
    free(r->imgs);
    free(r->keys);
    free(r->toks);
    free(r);
}

/* ---- image rows (engine/vision.h) and their prefix-cache keys */

/* The key of image row j of an image with content hash h: a negative id
 * (never a real token) mixing both (splitmix64's finaliser). */
static int32_t image_key(uint64_t h, int j)
{
    uint64_t z = h + 0x9E3779B97F4A7C15ull * (uint64_t)(j + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return -(int32_t)(z & 0x7FFFFFFFu) - 1;
}

const int32_t *rlai_sched_keys(rlai_req *r)
{
    if (!r->keys)
        return r->toks;
    /* the generated tail follows the prompt's keys */
    memcpy(r->keys + r->n_prompt, r->toks + r->n_prompt, sizeof(int32_t) * (size_t)(r->n_toks - r->n_prompt));
    return r->keys;
}

const float *rlai_sched_image_row(const rlai_engine *e, const rlai_req *r, int p)
{
    const rlai_hparams *hp = rlai_model_hparams(e->model);
    for (int i = 0; i < r->n_imgs; i++)
        if (p >= r->imgs[i].pos && p < r->imgs[i].pos + r->imgs[i].n_rows)
            return r->imgs[i].rows + (size_t)(p - r->imgs[i].pos) * (size_t)hp->n_embd;
    return NULL;
}

/* Checks and copies rp's images into r (n_prompt already set), with the keys. */
static int req_take_images(rlai_engine *e, rlai_req *r, const rlai_request_params *rp)
{
    if (rp->n_images == 0)
        return 0;
    if (rp->n_images < 0 || rp->n_images > 1024 || !rp->images)
        return RLAI_ERR_INVALID_ARG;
    const rlai_image_rows *im = rp->images;
    for (int i = 0; i < rp->n_images; i++) {
        if (!im[i].rows || im[i].n_rows <= 0 || im[i].pos < 0 || im[i].pos > rp->n_prompt - im[i].n_rows)
            return RLAI_ERR_INVALID_ARG;
        for (int j = 0; j < i; j++)
            if (im[i].pos < im[j].pos + im[j].n_rows && im[j].pos < im[i].pos + im[i].n_rows)
                return RLAI_ERR_INVALID_ARG;
    }
    size_t E = (size_t)rlai_model_hparams(e->model)->n_embd;
    if (!(r->imgs = calloc((size_t)rp->n_images, sizeof(*r->imgs))) ||
        !(r->keys = malloc(sizeof(int32_t) * (size_t)r->cap_toks)))
        return RLAI_ERR_NOMEM;
    memcpy(r->keys, rp->prompt, sizeof(int32_t) * (size_t)rp->n_prompt);
    for (int i = 0; i < rp->n_images; i++) {
        size_t n = (size_t)im[i].n_rows * E;
        rlai_req_image *ri = &r->imgs[i];
        if (!(ri->rows = malloc(sizeof(float) * n)))
            return RLAI_ERR_NOMEM;
        r->n_imgs = i + 1;
        memcpy(ri->rows, im[i].rows, sizeof(float) * n);
        ri->pos = im[i].pos;
        ri->n_rows = im[i].n_rows;
        ri->hash = rlai_vision_hash_rows(ri->rows, n);
        for (int j = 0; j < ri->n_rows; j++)
            r->keys[ri->pos + j] = image_key(ri->hash, j);
    }
    return 0;
}


/* 0 when gp's logit biases are valid for a vocabulary of n_vocab tokens,
 * else RLAI_ERR_INVALID_ARG with why in err (may be NULL). */
static int check_logit_bias(const rlai_gen_params *gp, int n_vocab, char *err, size_t errlen)
{
    int n = gp->n_logit_bias;
    if (n < 0 || n > RLAI_MAX_LOGIT_BIAS || (n > 0 && !gp->logit_bias))
        return rlai_errf(err, errlen, RLAI_ERR_INVALID_ARG, "logit_bias: 0 to %d entries", RLAI_MAX_LOGIT_BIAS);
    for (int i = 0; i < n; i++) {
        const rlai_logit_bias *b = &gp->logit_bias[i];
        if (b->token < 0 || b->token >= n_vocab)
            return rlai_errf(err, errlen, RLAI_ERR_INVALID_ARG, "logit_bias token %d is not in [0, %d)",
                             (int)b->token, n_vocab);
        if (!(b->bias >= -RLAI_LOGIT_BIAS_MAX && b->bias <= RLAI_LOGIT_BIAS_MAX))
            return rlai_errf(err, errlen, RLAI_ERR_INVALID_ARG, "logit_bias of token %d is not in [-100, 100]",
                             (int)b->token);
    }
    return 0;
}

/* Checks and copies gp's logit biases into r->lb: one entry a token (the
 * last one given), in the order given. */
static int req_take_logit_bias(rlai_req *r, const rlai_gen_params *gp, int n_vocab)
{
    int rc = check_logit_bias(gp, n_vocab, NULL, 0), n = gp->n_logit_bias;
    if (rc < 0 || n == 0)
        return rc;
    if (!(r->lb = malloc(sizeof(*r->lb) * (size_t)n)))
        return RLAI_ERR_NOMEM;
    for (int i = 0; i < n; i++) {
        bool later = false;
        for (int j = i + 1; j < n && !later; j++)
            later = gp->logit_bias[j].token == gp->logit_bias[i].token;
        if (!later)
            r->lb[r->n_lb++] = gp->logit_bias[i];
    }
    return 0;
}

_Static_assert(RLAI_MAX_PREDICTION_TOKENS <= RLAI_SPEC_MAX_PREDICTION - RLAI_SPEC_NGRAM_MAX,
               "a prediction and the prompt's tail fit the drafter's limit");

/* 0 when a prediction text is within RLAI_MAX_PREDICTION_BYTES and
 * RLAI_MAX_PREDICTION_TOKENS, else RLAI_ERR_TOO_LARGE with why in err (may
 * be NULL), or the tokenizer's error. A token holds at least one byte
 * (+1: SentencePiece's leading space), so only a text of more bytes than
 * the token limit is tokenized to count. */
static int check_prediction(const rlai_engine *e, const char *text, char *err, size_t errlen)
{
    size_t len = strlen(text);
    if (len > RLAI_MAX_PREDICTION_BYTES)
        return rlai_errf(err, errlen, RLAI_ERR_TOO_LARGE, "prediction has %zu bytes; the limit is %u", len,
                         (unsigned)RLAI_MAX_PREDICTION_BYTES);
    if (len + 1 <= (size_t)RLAI_MAX_PREDICTION_TOKENS)
        return 0;
    int n = rlai_tokenizer_encode(e->tok, text, len, false, false, NULL, 0);
    if (n < 0)
        return rlai_errf(err, errlen, n, "prediction: %s", rlai_strerror(n));
    if (n > RLAI_MAX_PREDICTION_TOKENS)
        return rlai_errf(err, errlen, RLAI_ERR_TOO_LARGE, "prediction has %d tokens; the limit is %d", n,
                         RLAI_MAX_PREDICTION_TOKENS);
    return 0;
}

/* r->pred = the prompt's last RLAI_SPEC_NGRAM_MAX tokens (so the prompt's
 * end matches and drafts the prediction's start), then gp's prediction
 * (no BOS, special-token text kept as text), tokenized once. */
static int req_take_prediction(rlai_engine *e, rlai_req *r, const rlai_request_params *rp)
{
    const char *text = rp->gen.prediction;
    if (!text || !*text)
        return 0;
    int rc = check_prediction(e, text, NULL, 0);
    if (rc < 0)
        return rc;
    size_t len = strlen(text);
    int cap = len + 1 < (size_t)RLAI_MAX_PREDICTION_TOKENS ? (int)len + 1 : RLAI_MAX_PREDICTION_TOKENS;
    int tail = rp->n_prompt < RLAI_SPEC_NGRAM_MAX ? rp->n_prompt : RLAI_SPEC_NGRAM_MAX;
    if (!(r->pred = malloc(sizeof(int32_t) * (size_t)(tail + cap))))
        return RLAI_ERR_NOMEM;
    memcpy(r->pred, rp->prompt + rp->n_prompt - tail, sizeof(int32_t) * (size_t)tail);
    int n = rlai_tokenizer_encode(e->tok, text, len, false, false, r->pred + tail, cap);
    if (n < 0)
        return n;
    if (n > cap)
        return RLAI_ERR_TOO_LARGE;   /* check_prediction counted the same text */
    r->n_pred = tail + n;
    return 0;
}

int rlai_engine_submit(rlai_engine *e, const rlai_request_params *rp, uint64_t *id)
{
    if (!e || !rp)
        return RLAI_ERR_INVALID_ARG;
    int rc0 = rlai_engine_check_tokens(e, rp->prompt, rp->n_prompt);
    if (rc0 < 0)
        return rc0;
    const rlai_hparams *hp = rlai_model_hparams(e->model);
    rlai_req *r = calloc(1, sizeof(*r));
    if (!r)
        return RLAI_ERR_NOMEM;
    r->gp = rp->gen;
    if ((int)r->gp.spec < RLAI_SPEC_AUTO || (int)r->gp.spec > RLAI_SPEC_DRAFT || r->gp.spec_max_draft < 0 ||
        r->gp.spec_max_draft > RLAI_SPEC_MAX_DRAFT) {
        free(r);
        return RLAI_ERR_INVALID_ARG;
    }
    if (r->gp.spec == RLAI_SPEC_DRAFT && !e->draft) {
        free(r);
        return RLAI_ERR_UNSUPPORTED;   /* no draft model loaded */
    }
    r->lp_on = r->gp.on_logprobs && r->gp.top_logprobs >= 0;
    if (r->lp_on && r->gp.top_logprobs > RLAI_MAX_TOP_LOGPROBS) {
        free(r);
        return RLAI_ERR_INVALID_ARG;
    }
    r->plp = r->lp_on && r->gp.prompt_logprobs;
    if (r->plp && rp->n_images > 0) {
        free(r);
        return RLAI_ERR_UNSUPPORTED;   /* image rows have no token to score */
    }
    {
        rlai_spec_mode mode = r->gp.spec == RLAI_SPEC_AUTO ? e->params.spec : r->gp.spec;
        /* The built-in default: drafts, greedy or sampled. The output does
         * not change either way: batch-invariant kernels, and each emitted
         * token takes the draw plain decoding takes (sampler.h;
         * tests/test_spec.c); the cost-aware pausing (spec.c) stops drafts
         * that do not pay. */
        if (mode == RLAI_SPEC_AUTO)
            mode = e->draft ? RLAI_SPEC_DRAFT : RLAI_SPEC_NGRAM;
        int md = r->gp.spec_max_draft > 0 ? r->gp.spec_max_draft : e->params.spec_max_draft;
        /* A request that brings a prediction says its answer mostly
         * repeats it: its drafts may grow to the hard cap (the length
         * still grows only while whole drafts are accepted). bench_spec
         * --predict-output: an exact prediction gave 3.4-4.0x at 8 and
         * 3.8-4.7x at 16 per case. */
        if (r->gp.spec_max_draft <= 0 && r->gp.prediction && r->gp.prediction[0])
            md = RLAI_SPEC_MAX_DRAFT;
        /* Grammar and logprobs requests draft too: each verification row
         * is masked and scored as its plain decoding step (sample_row).
         * The draft model sees text only: image prompts draft by prompt
         * lookup (unless that is off with the draft model too). */
        r->use_draft = mode == RLAI_SPEC_DRAFT && rp->n_images == 0;
        bool on = (mode == RLAI_SPEC_NGRAM || mode == RLAI_SPEC_DRAFT) &&
                  !(mode == RLAI_SPEC_DRAFT && rp->n_images > 0 && e->params.spec_lookup_min < 0);
        rlai_spec_state_init(&r->spec, on ? md : 0);
        rlai_spec_state_init(&r->lspec, on && r->use_draft && e->params.spec_lookup_min > 0 ? md : 0);
    }
    r->lookup_near = -1;
    r->draft_from = -1;
    int max_new = r->gp.max_tokens > 0 ? r->gp.max_tokens : e->n_ctx;
    long total = (long)rp->n_prompt + max_new;
    r->total = total > e->n_ctx ? e->n_ctx : (int)total;
    if (rlai_blocks_for(r->total) > rlai_kv_cache_n_blocks(e->kv)) {
        free(r);
        return RLAI_ERR_KV_FULL;
    }
    r->cap_toks = r->total + 1;
    r->toks = malloc(sizeof(rlai_token) * (size_t)r->cap_toks);
    int rc = r->toks ? 0 : RLAI_ERR_NOMEM;
    if (rc == 0 && r->lp_on && !(r->lp_raw = malloc(sizeof(float) * (size_t)hp->n_vocab)))
        rc = RLAI_ERR_NOMEM;
    if (rc == 0 && r->plp && !(r->plp_buf = malloc(sizeof(rlai_token_logprobs) * RLAI_PROMPT_LOGPROBS_CHUNK)))
        rc = RLAI_ERR_NOMEM;
    if (rc == 0)
        rc = req_take_logit_bias(r, &rp->gen, hp->n_vocab);
    r->gp.logit_bias = NULL;     /* r->lb holds them */
    r->gp.n_logit_bias = 0;
    if (rc == 0 && r->spec.max_draft > 0)
        rc = req_take_prediction(e, r, rp);
    else if (rc == 0 && rp->gen.prediction)
        rc = check_prediction(e, rp->gen.prediction, NULL, 0);   /* unused (no drafting), still checked */
    r->gp.prediction = NULL;     /* r->pred holds it */
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
        rlai_sched_req_free(e, r);
        return rc;
    }
    memcpy(r->toks, rp->prompt, sizeof(rlai_token) * (size_t)rp->n_prompt);
    r->n_toks = r->n_prompt = rp->n_prompt;
    if ((rc = req_take_images(e, r, rp)) < 0) {
        rlai_sched_req_free(e, r);
        return rc;
    }
    for (int i = 0; i < rp->n_prompt; i++)
        rlai_sampler_accept(r->smp, rp->prompt[i]);
    r->on_token = rp->on_token;
    r->on_done = rp->on_done;
    r->user = rp->user;
    atomic_init(&r->cancel, false);
    r->t_submit = rlai_clock_ms();
    if (r->gp.timeout_ms > 0)
        r->t_deadline = r->t_submit + (double)r->gp.timeout_ms;
    r->mt.prompt_tokens = rp->n_prompt;

    pthread_mutex_lock(&e->qmu);
    if (e->n_queued >= e->params.max_queue) {
        pthread_mutex_unlock(&e->qmu);
        rlai_sched_req_free(e, r);
        return RLAI_ERR_BUSY;
    }
    r->id = e->next_id++;
    /* Read before the unlock: once queued, the scheduler may finish and
     * free r before this thread runs again. */
    if (id)
        *id = r->id;
    rlai_req **pp = &e->queue;
    while (*pp)
        pp = &(*pp)->next;
    *pp = r;
    e->n_queued++;
    e->stats.queued = e->n_queued;
    e->wake = true;
    pthread_cond_broadcast(&e->qcv);
    pthread_mutex_unlock(&e->qmu);
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
            rlai_deadline_in(&ts, CLOCK_REALTIME, timeout_ms);
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
    double t_end = rlai_clock_ms();
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
    rlai_draft_seq_release(e->draft, &r->dseq);
    (void)e;
}

static bool past_deadline(const rlai_req *r, double now)
{
    return r->t_deadline > 0 && now >= r->t_deadline;
}

/* Whether queued request r's prompt shares whole K/V blocks, beyond those
 * it could take from the prefix cache now, with a prompt a running request
 * is still prefilling. Then r waits: that request commits the blocks to
 * the prefix cache as its forward computes them, and r attaches them
 * instead of computing the same K/V beside it. "n" choices of one prompt,
 * or agents sending one long system prompt at once, prefill it once. The
 * wait costs r nothing on a compute-bound machine (computing the shared
 * tokens again would take at least as long) and it stays FIFO. Off with
 * prefix caching, and for prompt-logprobs requests (they reuse nothing). */
static bool prefix_in_flight(const rlai_engine *e, const rlai_req *r)
{
    if (r->plp || !rlai_kv_cache_prefix_caching(e->kv))
        return false;
    const int32_t *a = r->keys ? r->keys : r->toks;
    int limit = r->n_prompt - 1;   /* attach keeps the last prompt token to compute */
    for (const rlai_req *q = e->running; q; q = q->next) {
        if (q->done || q->seq.n_tokens >= q->n_prompt)
            continue;
        const int32_t *b = q->keys ? q->keys : q->toks;
        int m = limit < q->n_prompt ? limit : q->n_prompt, c = 0;
        while (c < m && a[c] == b[c])
            c++;
        int shareable = c / RLAI_KV_BLOCK * RLAI_KV_BLOCK;
        if (shareable > q->seq.n_tokens)
            return true;
    }
    return false;
}

/* Admits queued requests FIFO while the pool can hold them (stepping thread). */
static void admit(rlai_engine *e, rlai_req **finished)
{
    int committed = 0;
    for (rlai_req *r = e->running; r; r = r->next)
        committed += r->reserve;
    pthread_mutex_lock(&e->qmu);
    /* Cancelled and timed-out requests leave the queue wherever they are. */
    double now = rlai_clock_ms();
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
        if (prefix_in_flight(e, r))
            break;   /* FIFO: admitted once a running prefill has committed the shared blocks */
        /* Reuse the longest cached prefix, keeping the last prompt token to
         * compute (its logits start generation). Prompt logprobs need the
         * logits of every prompt position: nothing is reused. */
        int reused = r->plp ? 0
                            : rlai_kv_prefix_attach(e->kv, &r->seq, rlai_sched_keys(r), r->n_prompt, r->n_prompt - 1);
        if (reused < 0)
            reused = 0;
        int need = rlai_blocks_for(r->total) - r->seq.n_blocks;
        if (need > rlai_kv_cache_n_free(e->kv) - committed) {
            rlai_kv_seq_release(e->kv, &r->seq);
            break;   /* FIFO: wait until running requests free blocks */
        }
        e->queue = r->next;
        e->n_queued--;
        r->reserve = need;
        committed += need;
        r->mt.reused_tokens = reused;
        r->t_admit = rlai_clock_ms();
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

/* Samples request r's next token from its logits row lg (modified): the
 * logit biases, the grammar mask of the matcher's present state, then the sampling
 * chain, then the token's logprobs from the raw row. A drafting row too:
 * its draft is accepted iff this token equals it (the coupled rejection
 * rule, sampler.h), and each later verification row is sampled the same
 * way once the tokens before it are accepted (req_verify), so masks and
 * logprobs are those of plain decoding. Returns -1 when the grammar gives
 * no token (r->gerr says why). */
static int32_t sample_row(const rlai_gvocab *gv, rlai_req *r, float *lg, size_t n_vocab)
{
    if (r->lp_on)
        memcpy(r->lp_raw, lg, sizeof(float) * n_vocab);   /* the sampler modifies lg */
    for (int i = 0; i < r->n_lb; i++) {
        float *x = &lg[r->lb[i].token];
        *x = r->lb[i].bias <= -RLAI_LOGIT_BIAS_MAX ? -INFINITY : *x + r->lb[i].bias;
    }
    if (r->gm && grammar_mask(gv, r, lg, n_vocab) < 0)
        return -1;
    int32_t tok = rlai_sampler_sample(r->smp, lg);
    if (r->gm && !grammar_allows(r, tok)) {
        /* every allowed logit was -inf (or NaN): take the first allowed token */
        int32_t t = 0, nv = rlai_gvocab_n_vocab(gv);
        while (t < nv && !grammar_allows(r, t))
            t++;
        if (t >= nv) {
            r->gerr = RLAI_ERR_INVALID_ARG;
            return -1;
        }
        tok = t;
    }
    if (r->lp_on) {
        rlai_logprobs_compute(r->lp_raw, (int)n_vocab, tok, r->gp.top_logprobs, &r->lp);
        r->lp_ready = true;
    }
    return tok;
}

static void sample_rows(void *arg, int ith, int nth)
{
    sample_job *j = arg;
    for (int i = ith; i < j->n_rows; i += nth) {
        rlai_req *r = j->rows[i];
        j->out[i] = sample_row(j->gv, r, (float *)j->logits + (size_t)r->row0 * j->n_vocab, j->n_vocab);
    }
}

/* Serial phase: record the sampled token, stream it, stop. */
static void req_sample(rlai_engine *e, rlai_req *r, int32_t tok)
{
    if (r->t_first == 0)
        r->t_first = rlai_clock_ms();
    if (r->gm) {
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

/* The draft model stops serving request r (its pool or context is
 * exhausted, or its drafts kept costing more than they gave): its draft K/V
 * is freed and r goes on with prompt-lookup drafts, fresh (or none when
 * spec_lookup_min < 0). */
static void draft_fallback(rlai_engine *e, rlai_req *r)
{
    rlai_draft_seq_release(e->draft, &r->dseq);
    r->use_draft = false;
    r->draft_lookup = false;
    r->spec = r->lspec;   /* drafting off when prompt lookup is (max_draft 0) */
}

/* Grammar-forced draft: the text every continuation of the grammar's
 * state starts with (a required property's key, the rest of a literal),
 * tokenized, without its last token (the model may join it to the bytes
 * that follow, as in `":`). Nearly always accepted, so it skips the
 * adaptive length: at most max_draft tokens, and room. True when there is
 * one. */
static bool forced_draft(rlai_engine *e, rlai_req *r, int room)
{
    /* 32 bytes hold a draft of max_draft tokens of a key or literal, and
     * bound the probe: 256 steps of the matcher per byte, up to 3 ms with
     * a thousand 80-byte enum values sharing their start (1-12 us for
     * ordinary schemas) */
    char fb[32];
    int nb = rlai_grammar_matcher_forced(r->gm, fb, (int)sizeof(fb));
    if (nb < 2)
        return false;
    int32_t ids[32];
    int nt = rlai_tokenizer_encode(e->tok, fb, (size_t)nb, false, false, ids, 32);
    if (nt < 2 || nt > 32)
        return false;
    int n = nt - 1;
    if (n > r->spec.max_draft)
        n = r->spec.max_draft;
    if (n > room)
        n = room;
    if (n <= 0)
        return false;
    memcpy(r->draft, ids, sizeof(int32_t) * (size_t)n);
    r->n_draft = n;
    r->draft_forced = true;
    return true;
}

/* Chooses request r's draft for this step (r->n_draft tokens in r->draft;
 * 0 = none). With the draft model, a context that repeats an earlier
 * passage of at least spec_lookup_min tokens (lore, quotes, code being
 * edited) is drafted by prompt lookup, for free, with its own adaptive
 * length (r->lspec); the draft model proposes the rest (r->spec). A
 * grammar request whose state forces text drafts that first. */
static void step_draft(rlai_engine *e, rlai_req *r)
{
    /* it may still emit total - n_toks tokens (the pending one was emitted
     * already) and a step emits at most the draft plus one */
    int room = r->total - r->n_toks - 1;
    r->draft_lookup = false;
    r->draft_forced = false;
    r->draft_ms = 0;
    if (room <= 0)
        return;
    if (r->gm && r->spec.max_draft > 0 && forced_draft(e, r, room))
        return;
    if (r->use_draft && r->lspec.max_draft > 0) {
        int32_t cand[RLAI_SPEC_MAX_DRAFT];
        int L = 0;
        int from = -1;
        int nc = rlai_spec_lookup_draft(r->toks, r->n_toks, r->pred, r->n_pred, RLAI_SPEC_MAX_DRAFT,
                                        r->lookup_near, cand, &L, &from);
        if (nc > 0 && L >= e->params.spec_lookup_min) {
            int g = rlai_spec_next_gamma(&r->lspec);
            if (g > room)
                g = room;
            if (g > 0) {
                r->n_draft = nc < g ? nc : g;
                memcpy(r->draft, cand, sizeof(int32_t) * (size_t)r->n_draft);
                r->draft_lookup = true;
                r->draft_from = from;
                return;
            }
        }
    }
    int g = rlai_spec_next_gamma(&r->spec);
    if (g > room)
        g = room;
    if (g <= 0)
        return;
    if (!r->use_draft) {
        r->n_draft = rlai_spec_lookup_draft(r->toks, r->n_toks, r->pred, r->n_pred, g, r->lookup_near, r->draft,
                                            NULL, &r->draft_from);
        return;
    }
    double t0 = rlai_clock_ms();
    int nd = rlai_draft_propose(e->draft, &r->dseq, r->toks, r->n_toks, g, r->draft);
    r->draft_ms = rlai_clock_ms() - t0;
    if (nd < 0) {
        draft_fallback(e, r);   /* the draft's pool or context is exhausted */
        nd = 0;
    }
    r->n_draft = nd;
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
static int req_verify(rlai_engine *e, rlai_req *r, int32_t tok, float *logits, size_t n_vocab,
                      double fwd_ms)
{
    int nd = r->n_draft, acc = 0, emitted = 0;
    int p0 = r->seq.n_tokens - 1;   /* position of the token fed this step */
    for (int j = 0;; j++) {
        bool hit = j < nd && tok == r->draft[j];
        req_sample(e, r, tok);
        emitted++;
        acc += hit;   /* a right draft counts even when its token ends the request */
        if (r->done || !hit)
            break;
        /* checked against draft[j + 1] next */
        tok = sample_row(e->gvocab, r, logits + (size_t)(r->row0 + j + 1) * n_vocab, n_vocab);
    }
    if (nd > 0) {
        r->mt.drafted_tokens += nd;
        r->mt.accepted_tokens += acc;
        if (!r->draft_forced) {   /* the grammar's own text does not teach the drafters */
            double cost = rlai_spec_cost_of(&e->spec_cost, 1 + nd);
            /* A draft model's forwards come on top, in the same units: the
             * verification's time stands for `cost` plain steps. */
            if (r->use_draft && fwd_ms > 0)
                cost *= 1.0 + r->draft_ms / fwd_ms;
            rlai_spec_feedback(r->draft_lookup ? &r->lspec : &r->spec, nd, acc, cost);
            if (r->draft_lookup || !r->use_draft)
                r->lookup_near = rlai_spec_near_after(r->lookup_near, r->draft_from, acc);
            if (r->draft_lookup)
                r->mt.lookup_tokens += nd;
            else if (r->use_draft && rlai_spec_gave_up(&r->spec))
                draft_fallback(e, r);   /* the draft model does not pay for this request */
        }
        if (!r->done) {
            /* positions p0..p0+acc hold the fed token and the accepted
             * drafts; everything after is rejected */
            r->seq.n_tokens = p0 + 1 + acc;
            int dropped = rlai_kv_seq_truncate(e->kv, &r->seq, r->seq.n_tokens);
            if (dropped > 0)
                r->reserve += dropped;
            rlai_kv_prefix_commit(e->kv, &r->seq, rlai_sched_keys(r), r->seq.n_tokens);
        }
        r->n_draft = 0;
    }
    return emitted;
}

/* Prompt positions among the t tokens request r feeds from position
 * seq.n_tokens whose logits score the NEXT prompt token (the last prompt
 * position's logits are the first sampling row instead). */
static int plp_rows(const rlai_req *r, int t)
{
    int p0 = r->seq.n_tokens, end = r->n_prompt - 1;
    int n = (p0 + t < end ? p0 + t : end) - p0;
    return n > 0 ? n : 0;
}

/* The log-softmax passes of a chunk's prompt rows, on the thread pool
 * (each row is independent; the callbacks run afterwards, in order). */
typedef struct plp_job {
    const rlai_req *r;
    const float *logits;
    int n_vocab;
    rlai_token_logprobs *out;
} plp_job;

static void plp_rows_run(void *arg, int ith, int nth)
{
    plp_job *j = arg;
    const rlai_req *r = j->r;
    int p0 = r->seq.n_tokens;
    for (int i = ith; i < r->plp_n; i += nth) {
        const float *lg = j->logits + (size_t)(r->plp_row0 + i) * (size_t)j->n_vocab;
        rlai_logprobs_compute(lg, j->n_vocab, r->toks[p0 + i + 1], r->gp.top_logprobs, &j->out[i]);
        j->out[i].prompt = true;
    }
}

/* Prompt logprobs of this step's chunk (before seq.n_tokens advances): an
 * entry without a distribution for prompt token 0, then for each scored
 * position p the log-probability of prompt token p + 1 (raw logits, as for
 * generated tokens). */
static void plp_emit(rlai_engine *e, rlai_req *r, const float *logits, int n_vocab)
{
    int p0 = r->seq.n_tokens;
    if (p0 == 0) {
        rlai_token_logprobs lp;
        memset(&lp, 0, sizeof(lp));
        lp.token = r->toks[0];
        lp.logprob = NAN;
        lp.prompt = true;
        r->gp.on_logprobs(r->gp.logprobs_user, &lp);
    }
    if (r->plp_n == 0)
        return;   /* a decode step */
    plp_job j = { r, logits, n_vocab, r->plp_buf };
    rlai_threadpool_run(r->plp_n > 1 ? e->tp : NULL, plp_rows_run, &j);
    for (int i = 0; i < r->plp_n; i++)
        r->gp.on_logprobs(r->gp.logprobs_user, &r->plp_buf[i]);
    r->plp_n = 0;
}

/* Tokens a request feeds this step: its decode token, or a prompt chunk
 * taken from the step's prefill budget. */
static int step_take(const rlai_req *r, int *budget)
{
    int pending = r->n_toks - r->seq.n_tokens;
    if (pending <= 1)
        return pending;
    int t = pending < *budget ? pending : *budget;
    if (r->plp && t > RLAI_PROMPT_LOGPROBS_CHUNK)
        t = RLAI_PROMPT_LOGPROBS_CHUNK;   /* one logits row per prompt token */
    if (t < 0)
        t = 0;
    *budget -= t;
    return t;
}

static int step_locked(rlai_engine *e)
{
    rlai_req *finished = NULL;
    /* Cancelled and timed-out running requests end now: their KV is freed this step. */
    double t_now = rlai_clock_ms();
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
        if (t == 1 && r->n_toks > r->n_prompt && spec_ok) {
            step_draft(e, r);
        }
        n += t + r->n_draft;
        n_want += t > 0 && r->seq.n_tokens + t == r->n_toks ? 1 + r->n_draft : 0;
        if (r->plp && t > 0)
            n_want += plp_rows(r, t);
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
        const float **embd = NULL;              /* image rows of this batch, if any */
        bool need_embd = false;
        for (rlai_req *r = e->running; r; r = r->next)
            need_embd |= !r->done && r->n_imgs > 0 && r->seq.n_tokens < r->n_prompt;
        if (need_embd)
            embd = calloc((size_t)n, sizeof(*embd));
        rlai_kv_seq **seqs = malloc(sizeof(rlai_kv_seq *) * (size_t)n_seqs);
        rlai_req **rows = malloc(sizeof(rlai_req *) * (size_t)n_seqs);
        int *take = malloc(sizeof(int) * (size_t)n_seqs);
        int n_rows = 0, wi = 0;
        double fwd_ms = 0;
        if (!tokens || !pos || !sidx || !want || !seqs || !rows || !take || (need_embd && !embd)) {
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
                r->plp_n = r->plp ? plp_rows(r, t) : 0;
                r->plp_row0 = wi;
                for (int j = 0; j < t + nd; j++) {
                    tokens[k] = j < t ? r->toks[p0 + j] : r->draft[j - t];
                    if (embd && j < t && p0 + j < r->n_prompt)
                        embd[k] = rlai_sched_image_row(e, r, p0 + j);
                    pos[k] = p0 + j;
                    sidx[k] = si;
                    /* the last real token and every draft token (and the
                     * prompt positions of a prompt-logprobs request) */
                    want[k] = p0 + j >= r->n_toks - 1 || j < r->plp_n;
                    if (j == t - 1 && p0 + j >= r->n_toks - 1) {   /* the sampling row */
                        r->row0 = wi;
                        rows[n_rows++] = r;
                    }
                    wi += want[k];
                    k++;
                }
                si++;
            }
            if (k > 0) {
                rlai_batch b = { k, tokens, pos, sidx, want, false, embd };
                double t0 = rlai_clock_ms();
                rc = rlai_model_forward(e->mctx, e->kv, seqs, &b, e->step_logits);
                fwd_ms = rlai_clock_ms() - t0;
                /* one decoding sequence: its step time teaches the cost of draft rows */
                if (rc == 0 && si == 1 && take[0] == 1 && n_rows == 1 && rows[0]->seq.n_tokens >= rows[0]->n_prompt)
                    rlai_spec_cost_observe(&e->spec_cost, k, rlai_clock_ms() - t0);
            }
            if (rc == 0) {
                si = 0;
                for (rlai_req *r = e->running; r; r = r->next) {
                    if (r->done || si >= n_seqs || seqs[si] != &r->seq)
                        continue;
                    if (r->plp)
                        plp_emit(e, r, e->step_logits, hp->n_vocab);
                    r->seq.n_tokens += take[si];
                    rlai_kv_prefix_commit(e->kv, &r->seq, rlai_sched_keys(r), r->seq.n_tokens);
                    if (r->seq.n_tokens == r->n_prompt && r->t_prefill_end == 0) {
                        /* the draft model's prefill belongs to the prompt's */
                        if (r->use_draft && r->spec.max_draft > 0 &&
                            rlai_draft_sync(e->draft, &r->dseq, r->toks, r->n_prompt) < 0)
                            draft_fallback(e, r);
                        r->t_prefill_end = rlai_clock_ms();
                    }
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
                        r->t_prefill_end = rlai_clock_ms();
                    if (!sampled) {
                        req_finish(e, r, RLAI_STOP_NONE, RLAI_ERR_NOMEM);
                        continue;
                    }
                    int emitted = req_verify(e, r, sampled[i], e->step_logits, (size_t)hp->n_vocab, fwd_ms);
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
        free(embd);
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
        rlai_sched_req_free(e, r);
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
        rlai_batch b = { n, toks + from, pos, NULL, want, false, NULL };
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
void rlai_sched_refresh_kv_stats(rlai_engine *e)
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
        if (rlai_blocks_for(full) - seq.n_blocks > rlai_kv_cache_n_free(e->kv) - committed)
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
    if (!e)
        return RLAI_ERR_INVALID_ARG;
    int rc0 = rlai_engine_check_tokens(e, toks, n);
    if (rc0 < 0)
        return rc0;
    pthread_mutex_lock(&e->step_mu);
    int rc = pin_locked(e, toks, n);
    rlai_sched_refresh_kv_stats(e);
    pthread_mutex_unlock(&e->step_mu);
    return rc;
}

int rlai_engine_unpin_prefix(rlai_engine *e, const rlai_token *toks, int n)
{
    if (!e || !toks || n <= 0)
        return RLAI_ERR_INVALID_ARG;
    pthread_mutex_lock(&e->step_mu);
    int rc = rlai_kv_prefix_unpin(e->kv, toks, n);
    rlai_sched_refresh_kv_stats(e);
    pthread_mutex_unlock(&e->step_mu);
    return rc;
}

/* ------------------------------------------------------------------
 * The one request path: text or chat -> tokens -> limits -> submit. */

/* rq's image: the prompt's one image token becomes the encoder's n_tokens
 * positions (*toks / *n replaced), *rows the image's rows (owned by the
 * caller), *img describing them. */
static int text_image(rlai_engine *e, const rlai_text_request *rq, bool text, rlai_token **toks, int *n,
                      float **rows, rlai_image_rows *img, char *err, size_t errlen)
{
    if (!text)
        return rlai_errf(err, errlen, RLAI_ERR_INVALID_ARG,
                         "an image needs a raw prompt holding the image token <image> (not chat messages)");
    rlai_vision_info vi;
    if (rlai_engine_vision_info(e, &vi) < 0)
        return rlai_errf(err, errlen, RLAI_ERR_NOT_IMPLEMENTED,
                         "no vision encoder is loaded (start rlai serve with --mmproj FILE)");
    if (vi.image_token < 0)
        return rlai_errf(err, errlen, RLAI_ERR_INVALID_ARG, "the model's vocabulary has no <image> token");
    if (rq->image_width <= 0 || rq->image_height <= 0 || rq->image_width > 16384 || rq->image_height > 16384)
        return rlai_errf(err, errlen, RLAI_ERR_INVALID_ARG, "image size %dx%d is out of range",
                         rq->image_width, rq->image_height);
    int at = -1, count = 0;
    for (int i = 0; i < *n; i++)
        if ((*toks)[i] == vi.image_token) {
            at = i;
            count++;
        }
    if (count != 1)
        return rlai_errf(err, errlen, RLAI_ERR_INVALID_ARG,
                         "the prompt must hold the image token <image> exactly once (it has %d)", count);
    int m = *n + vi.n_tokens - 1;
    rlai_token *nt = malloc(sizeof(rlai_token) * (size_t)m);
    size_t E = (size_t)rlai_model_hparams(e->model)->n_embd;
    float *r = malloc(sizeof(float) * (size_t)vi.n_tokens * E);
    if (!nt || !r) {
        free(nt);
        free(r);
        return rlai_errf(err, errlen, RLAI_ERR_NOMEM, "%s", rlai_strerror(RLAI_ERR_NOMEM));
    }
    int rc = rlai_engine_embed_image(e, rq->image_rgb, rq->image_width, rq->image_height,
                                     (size_t)rq->image_width * 3, 3, r);
    if (rc < 0) {
        free(nt);
        free(r);
        return rlai_errf(err, errlen, rc, "image encoding failed: %s", rlai_strerror(rc));
    }
    memcpy(nt, *toks, sizeof(rlai_token) * (size_t)at);
    for (int j = 0; j < vi.n_tokens; j++)
        nt[at + j] = vi.image_token;
    memcpy(nt + at + vi.n_tokens, *toks + at + 1, sizeof(rlai_token) * (size_t)(*n - at - 1));
    free(*toks);
    *toks = nt;
    *n = m;
    *rows = r;
    img->rows = r;
    img->n_rows = vi.n_tokens;
    img->pos = at;
    return 0;
}

int rlai_engine_submit_text(rlai_engine *e, const rlai_text_request *rq, uint64_t *id, int *n_prompt,
                            char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = 0;
    if (n_prompt)
        *n_prompt = -1;
    if (!e || !rq || !id)
        return rlai_errf(err, errlen, RLAI_ERR_INVALID_ARG, "invalid argument");
    bool chat = rq->messages && rq->n_messages > 0;
    bool text = rq->prompt != NULL;
    if (chat && text)
        return rlai_errf(err, errlen, RLAI_ERR_INVALID_ARG, "give either chat messages or a prompt");
    rlai_token *toks = NULL;           /* owned here (chat, text) */
    const rlai_token *use;
    int n = 0, rc;
    if (chat) {
        rc = rlai_engine_tokenize_chat(e, rq->messages, rq->n_messages, true, &toks, &n);
        if (rc == RLAI_ERR_INVALID_ARG)
            return rlai_errf(err, errlen, rc, "chat messages rejected by the template (roles: system, user, assistant)");
        if (rc < 0)
            return rlai_errf(err, errlen, rc, "%s", rlai_strerror(rc));
        use = toks;
    } else if (text) {
        size_t len = strlen(rq->prompt);
        n = rlai_engine_tokenize(e, rq->prompt, len, true, true, NULL, 0);
        if (n < 0)
            return rlai_errf(err, errlen, n, "%s", rlai_strerror(n));
        toks = malloc(sizeof(rlai_token) * (size_t)(n > 0 ? n : 1));
        if (!toks)
            return rlai_errf(err, errlen, RLAI_ERR_NOMEM, "%s", rlai_strerror(RLAI_ERR_NOMEM));
        n = rlai_engine_tokenize(e, rq->prompt, len, true, true, toks, n);
        if (n < 0) {
            free(toks);
            return rlai_errf(err, errlen, n, "%s", rlai_strerror(n));
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
                return rlai_errf(err, errlen, RLAI_ERR_INVALID_ARG, "prompt token %d is %d; ids are in [0, %d)", i,
                                 (int)use[i], hp->n_vocab);
    }
    float *img_rows = NULL;            /* owned here */
    rlai_image_rows img;
    if (rq->image_rgb) {
        if (!toks)
            return rlai_errf(err, errlen, RLAI_ERR_INVALID_ARG,
                             "an image needs a raw prompt holding the image token <image>");
        if ((rc = text_image(e, rq, text, &toks, &n, &img_rows, &img, err, errlen)) < 0) {
            free(toks);
            return rc;
        }
        use = toks;
    }
    if (n_prompt)
        *n_prompt = n;
    int limit = rq->max_prompt_tokens > 0 ? rq->max_prompt_tokens : e->n_ctx - 1;
    if (n == 0) {
        free(toks);
        return rlai_errf(err, errlen, RLAI_ERR_INVALID_ARG, "empty prompt");
    }
    if (n > limit) {
        free(toks);
        free(img_rows);
        return rlai_errf(err, errlen, RLAI_ERR_TOO_LARGE, "prompt has %d tokens; the limit is %d", n, limit);
    }
    if ((rc = check_logit_bias(&rq->rp.gen, rlai_model_hparams(e->model)->n_vocab, err, errlen)) < 0) {
        free(toks);
        free(img_rows);
        return rc;
    }
    if (rq->rp.gen.prediction && (rc = check_prediction(e, rq->rp.gen.prediction, err, errlen)) < 0) {
        free(toks);
        free(img_rows);
        return rc;
    }
    if (rq->rp.gen.spec == RLAI_SPEC_DRAFT && !e->draft) {
        free(toks);
        free(img_rows);
        return rlai_errf(err, errlen, RLAI_ERR_UNSUPPORTED,
                         "spec 'draft' needs a draft model, and none is loaded (rlai serve --draft-model FILE)");
    }
    rlai_request_params rp = rq->rp;
    rp.prompt = use;
    rp.n_prompt = n;
    if (img_rows) {
        rp.images = &img;
        rp.n_images = 1;
    }
    rc = rlai_engine_submit(e, &rp, id);
    free(toks);
    free(img_rows);
    if (rc < 0)
        return rlai_errf(err, errlen, rc, "%s", rlai_strerror(rc));
    return 0;
}
