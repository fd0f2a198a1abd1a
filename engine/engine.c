/* engine.c - the public embed API (include/rlai/engine.h): ties the GGUF
 * file, model, tokenizer, kernels, KV cache and sampler together and runs
 * single-sequence generation with streaming. */
#include "rlai/engine.h"
#include "chat.h"
#include "dtype.h"
#include "gguf.h"
#include "kernels.h"
#include "kv_cache.h"
#include "model.h"
#include "sampler.h"
#include "textstream.h"
#include "threadpool.h"
#include "tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define RLAI_MAX_BATCH 512          /* prefill chunk: tokens per forward call */
#define RLAI_DEFAULT_CTX_CAP 8192

struct rlai_engine {
    rlai_engine_params params;
    rlai_gguf *gguf;
    rlai_model *model;
    rlai_tokenizer *tok;
    rlai_kernels *kern;
    rlai_threadpool *tp;
    rlai_kv_cache *kv;
    rlai_model_ctx *mctx;
    rlai_isa isa;
    int n_ctx;
    rlai_chat_style chat_style;
    char *default_system;   /* owned, may be NULL */
    char name[128];
    float *logits;          /* n_vocab */
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
    if ((rc = rlai_kernels_create(e->isa, e->params.precise, &e->kern)) < 0)
        goto fail;
    int nt = e->params.n_threads;
    if (nt <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        nt = n > 0 ? (int)n : 1;
    }
    if (nt > 256)
        nt = 256;
    e->params.n_threads = nt;
    if ((rc = rlai_threadpool_create(nt, &e->tp)) < 0)
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
    uint32_t kv_type = e->params.precise ? RLAI_DT_F32 : RLAI_DT_F16;
    if ((rc = rlai_kv_cache_create(hp->n_layer, hp->n_head_kv * hp->head_dim, blocks, kv_type, &e->kv)) < 0)
        goto fail;
    if ((rc = rlai_model_ctx_create(e->model, e->kern, e->tp, RLAI_MAX_BATCH, n_ctx, &e->mctx)) < 0)
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
    rlai_model_ctx_free(e->mctx);
    rlai_kv_cache_destroy(e->kv);
    rlai_threadpool_destroy(e->tp);
    rlai_kernels_destroy(e->kern);
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

int rlai_engine_generate_tokens(rlai_engine *e, const rlai_token *prompt, int n_prompt,
                                const rlai_gen_params *gpp, rlai_token_cb cb, void *user,
                                rlai_gen_metrics *metrics)
{
    if (!e || n_prompt <= 0 || !prompt)
        return RLAI_ERR_INVALID_ARG;
    const rlai_hparams *hp = rlai_model_hparams(e->model);
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= hp->n_vocab)
            return RLAI_ERR_INVALID_ARG;
    if (n_prompt >= e->n_ctx)
        return RLAI_ERR_CONTEXT_FULL;
    rlai_gen_params gp;
    if (gpp)
        gp = *gpp;
    else
        rlai_gen_params_init(&gp);

    double t0 = now_ms();
    rlai_gen_metrics mt;
    memset(&mt, 0, sizeof(mt));
    mt.prompt_tokens = n_prompt;

    rlai_sampler *smp = NULL;
    rlai_textstream *ts = NULL;
    rlai_kv_seq seq;
    memset(&seq, 0, sizeof(seq));
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)n_prompt);
    int rc = pos ? 0 : RLAI_ERR_NOMEM;
    if (rc == 0)
        rc = rlai_sampler_create(&gp.sampling, hp->n_vocab, &smp);
    if (rc == 0)
        rc = rlai_textstream_create(gp.stop, &ts);
    if (rc == 0)
        rc = rlai_kv_seq_reserve(e->kv, &seq, n_prompt + 1);
    if (rc < 0)
        goto done;

    for (int i = 0; i < n_prompt; i++) {
        pos[i] = i;
        rlai_sampler_accept(smp, prompt[i]);
    }
    rlai_kv_seq *seqs[1] = { &seq };
    rlai_batch b = { n_prompt, prompt, pos, NULL, NULL };
    if ((rc = rlai_model_forward(e->mctx, e->kv, seqs, &b, e->logits)) < 0)
        goto done;
    seq.n_tokens = n_prompt;
    double t_prefill = now_ms();
    mt.prefill_ms = t_prefill - t0;

    int n_decode = 0;
    double t_first = 0;
    char piece[256];
    for (;;) {
        int32_t tok = rlai_sampler_sample(smp, e->logits);
        if (mt.gen_tokens == 0) {
            t_first = now_ms();
            mt.ttft_ms = t_first - t0;
        }
        if (!gp.ignore_eos && rlai_tokenizer_is_eog(e->tok, tok)) {
            mt.stop = RLAI_STOP_EOG;
            break;
        }
        rlai_sampler_accept(smp, tok);
        mt.gen_tokens++;
        int plen = rlai_tokenizer_token_to_piece(e->tok, tok, false, piece, sizeof(piece));
        char *big = NULL;
        const char *pp = piece;
        if (plen > (int)sizeof(piece)) {
            big = malloc((size_t)plen);
            if (!big) {
                rc = RLAI_ERR_NOMEM;
                goto done;
            }
            rlai_tokenizer_token_to_piece(e->tok, tok, false, big, (size_t)plen);
            pp = big;
        }
        if (plen < 0)
            plen = 0;
        const char *txt;
        size_t tlen;
        bool stopped = rlai_textstream_push(ts, pp, (size_t)plen, &txt, &tlen);
        free(big);
        if (cb && cb(user, tok, txt, tlen) != 0) {
            mt.stop = RLAI_STOP_CANCELLED;
            break;
        }
        if (stopped) {
            mt.stop = RLAI_STOP_STRING;
            break;
        }
        if (gp.max_tokens > 0 && mt.gen_tokens >= gp.max_tokens) {
            mt.stop = RLAI_STOP_MAX_TOKENS;
            break;
        }
        int p = seq.n_tokens;
        if (p + 1 >= e->n_ctx) {
            mt.stop = RLAI_STOP_CONTEXT;
            break;
        }
        if ((rc = rlai_kv_seq_reserve(e->kv, &seq, p + 1)) < 0)
            goto done;
        int32_t one_pos = p;
        rlai_batch db = { 1, &tok, &one_pos, NULL, NULL };
        if ((rc = rlai_model_forward(e->mctx, e->kv, seqs, &db, e->logits)) < 0)
            goto done;
        seq.n_tokens = p + 1;
        n_decode++;
    }
    if (mt.stop != RLAI_STOP_STRING && mt.stop != RLAI_STOP_CANCELLED) {
        const char *txt;
        size_t tlen;
        rlai_textstream_flush(ts, &txt, &tlen);
        if (tlen && cb)
            cb(user, -1, txt, tlen);
    }
    double t_end = now_ms();
    mt.decode_ms = mt.gen_tokens > 0 ? t_end - t_first : 0;
    mt.prefill_tps = mt.prefill_ms > 0 ? n_prompt / (mt.prefill_ms / 1e3) : 0;
    mt.decode_tps = n_decode > 0 && mt.decode_ms > 0 ? n_decode / (mt.decode_ms / 1e3) : 0;
done:
    rlai_kv_seq_release(e->kv, &seq);
    rlai_textstream_free(ts);
    rlai_sampler_free(smp);
    free(pos);
    if (metrics)
        *metrics = mt;
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
        rlai_batch b = { n, toks, pos, NULL, want };
        rc = rlai_model_forward(e->mctx, e->kv, seqs, &b, logits);
    }
    rlai_kv_seq_release(e->kv, &seq);
    free(pos);
    free(want);
    return rc;
}
