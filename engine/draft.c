/* draft.c - the draft model of speculative decoding (see draft.h). */
#include "draft.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "rlai/error.h"
#include "rlai/gguf.h"
#include "spec.h"

struct rlai_draft {
    char *path;
    rlai_gguf *gguf;
    rlai_model *model;
    rlai_tokenizer *tok;          /* the draft's own (equal to the target's) */
    const rlai_tokenizer *target;
    rlai_model_ctx *mctx;
    rlai_kv_cache *kv;
    int n_ctx, n_vocab;           /* n_vocab: the tokenizer's (argmax range) */
    float *logits;                /* the model's n_vocab floats */
};

/* The first token whose decoded bytes differ, or -1 when the two
 * tokenizers agree on every token, BOS and EOS. */
static int first_difference(const rlai_tokenizer *a, const rlai_tokenizer *b, char *why, size_t whylen)
{
    int n = rlai_tokenizer_n_vocab(a);
    if (n != rlai_tokenizer_n_vocab(b)) {
        snprintf(why, whylen, "it has %d tokens, the model %d", rlai_tokenizer_n_vocab(b), n);
        return 0;
    }
    if (rlai_tokenizer_bos(a) != rlai_tokenizer_bos(b) || rlai_tokenizer_eos(a) != rlai_tokenizer_eos(b)) {
        snprintf(why, whylen, "its BOS/EOS are %d/%d, the model's %d/%d", (int)rlai_tokenizer_bos(b),
                 (int)rlai_tokenizer_eos(b), (int)rlai_tokenizer_bos(a), (int)rlai_tokenizer_eos(a));
        return 0;
    }
    char pa[256], pb[256];
    for (int id = 0; id < n; id++) {
        int la = rlai_tokenizer_token_to_piece(a, id, true, pa, sizeof(pa));
        int lb = rlai_tokenizer_token_to_piece(b, id, true, pb, sizeof(pb));
        if (la != lb || (la > 0 && memcmp(pa, pb, (size_t)(la < (int)sizeof(pa) ? la : (int)sizeof(pa)))) ||
            rlai_tokenizer_is_eog(a, id) != rlai_tokenizer_is_eog(b, id)) {
            snprintf(why, whylen, "token %d differs (\"%.*s\" there, \"%.*s\" in the model)", id,
                     lb > 0 && lb < 40 ? lb : 0, pb, la > 0 && la < 40 ? la : 0, pa);
            return id;
        }
    }
    return -1;
}

int rlai_draft_open(const char *path, const rlai_tokenizer *target, rlai_backend *be, int max_batch,
                    int n_ctx, int kv_blocks, uint32_t kv_dtype, rlai_draft **out, char *err,
                    size_t errlen)
{
    if (!out)
        return RLAI_ERR_INVALID_ARG;
    *out = NULL;
    if (!path || !target || !be || max_batch < 1 || n_ctx < 1 || kv_blocks < 1)
        return rlai_errf(err, errlen, RLAI_ERR_INVALID_ARG, "draft model: invalid arguments");
    rlai_draft *d = calloc(1, sizeof(*d));
    if (!d || !(d->path = strdup(path))) {
        free(d);
        return rlai_errf(err, errlen, RLAI_ERR_NOMEM, "draft model: out of memory");
    }
    d->target = target;
    d->n_ctx = n_ctx;
    char msg[300] = "";
    int rc = rlai_gguf_open_file(path, &d->gguf, msg, sizeof(msg));
    if (rc == 0)
        rc = rlai_model_load(d->gguf, &d->model, msg, sizeof(msg));
    if (rc == 0)
        rc = rlai_tokenizer_load(d->gguf, &d->tok, msg, sizeof(msg));
    if (rc < 0) {
        rlai_errf(err, errlen, rc, "draft model %s: %s", path, msg[0] ? msg : rlai_strerror(rc));
        rlai_draft_free(d);
        return rc;
    }
    const rlai_hparams *hp = rlai_model_hparams(d->model);
    char why[200];
    if (first_difference(target, d->tok, why, sizeof(why)) >= 0) {
        rlai_draft_free(d);
        return rlai_errf(err, errlen, RLAI_ERR_INVALID_ARG,
                         "draft model %s: its tokenizer is not the model's (%s); a draft must share "
                         "the model's vocabulary", path, why);
    }
    d->n_vocab = rlai_tokenizer_n_vocab(d->tok);
    if (d->n_vocab > hp->n_vocab) {
        rlai_draft_free(d);
        return rlai_errf(err, errlen, RLAI_ERR_FORMAT,
                         "draft model %s: tokenizer has %d tokens but the embedding only %d rows", path,
                         d->n_vocab, hp->n_vocab);
    }
    if (!(d->logits = malloc(sizeof(float) * (size_t)hp->n_vocab)))
        rc = RLAI_ERR_NOMEM;
    if (rc == 0)
        rc = rlai_kv_cache_new_on(be, hp->n_layer, hp->n_head_kv * hp->head_dim, kv_blocks, kv_dtype, &d->kv);
    if (rc == 0)
        rc = rlai_model_ctx_new(d->model, be, max_batch, n_ctx, &d->mctx);
    if (rc < 0) {
        rlai_errf(err, errlen, rc, "draft model %s: %s", path, rlai_strerror(rc));
        rlai_draft_free(d);
        return rc;
    }
    *out = d;
    return 0;
}

void rlai_draft_free(rlai_draft *d)
{
    if (!d)
        return;
    rlai_model_ctx_free(d->mctx);
    rlai_kv_cache_free(d->kv);
    rlai_tokenizer_free(d->tok);
    rlai_model_free(d->model);
    rlai_gguf_close(d->gguf);
    free(d->logits);
    free(d->path);
    free(d);
}

const rlai_hparams *rlai_draft_hparams(const rlai_draft *d)
{
    return rlai_model_hparams(d->model);
}

const char *rlai_draft_path(const rlai_draft *d)
{
    return d->path;
}

uint64_t rlai_draft_weight_bytes(const rlai_draft *d)
{
    return rlai_model_weight_bytes(d->model);
}

/* Lowest id of the largest logit among the tokenizer's ids. */
static int32_t argmax(const float *lg, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (lg[i] > lg[best])
            best = i;
    return best;
}

static int feed(rlai_draft *d, rlai_draft_seq *s, const int32_t *toks, int p0, int n)
{
    int32_t pos_stack[64];
    int32_t *pos = n <= 64 ? pos_stack : malloc(sizeof(int32_t) * (size_t)n);
    if (!pos)
        return RLAI_ERR_NOMEM;
    for (int i = 0; i < n; i++)
        pos[i] = p0 + i;
    rlai_kv_seq *seqs[1] = { &s->seq };
    rlai_batch b = { n, toks, pos, NULL, NULL, false, NULL };
    int rc = rlai_model_forward(d->mctx, d->kv, seqs, &b, d->logits);
    if (pos != pos_stack)
        free(pos);
    if (rc == 0) {
        memcpy(s->fed + p0, toks, sizeof(int32_t) * (size_t)n);
        s->seq.n_tokens = p0 + n;
    }
    return rc;
}

/* Makes s hold the draft K/V of toks[0..n) with room for gamma - 1 more
 * positions (gamma - 1 draft tokens); d->logits then holds the row after
 * toks[n - 1]. */
static int sync(rlai_draft *d, rlai_draft_seq *s, const int32_t *toks, int n, int gamma)
{
    if (n + gamma - 1 > d->n_ctx)
        return RLAI_ERR_CONTEXT_FULL;
    if (s->cap < n + gamma) {
        int cap = s->cap ? s->cap : 256;
        while (cap < n + gamma)
            cap *= 2;
        int32_t *f = realloc(s->fed, sizeof(int32_t) * (size_t)cap);
        if (!f)
            return RLAI_ERR_NOMEM;
        s->fed = f;
        s->cap = cap;
    }
    /* Keep the longest fed prefix that agrees with toks (at most n - 1
     * tokens: the last one is always fed, its logits give the first draft). */
    int keep = 0;
    if (s->seq.n_tokens == 0) {
        int a = rlai_kv_prefix_attach(d->kv, &s->seq, toks, n, n - 1);
        if (a < 0)
            return a;
        memcpy(s->fed, toks, sizeof(int32_t) * (size_t)a);
        keep = a;
    } else {
        int lim = s->seq.n_tokens < n - 1 ? s->seq.n_tokens : n - 1;
        while (keep < lim && s->fed[keep] == toks[keep])
            keep++;
        if (keep < s->seq.n_tokens) {
            int rc = rlai_kv_seq_truncate(d->kv, &s->seq, keep);
            if (rc < 0)
                return rc;
        }
    }
    int rc = rlai_kv_seq_prepare_write(d->kv, &s->seq, keep, n + gamma - 1);
    if (rc < 0)
        return rc;
    if ((rc = feed(d, s, toks + keep, keep, n - keep)) < 0)
        return rc;
    /* toks are the request's tokens (accepted, never drafts): their full
     * blocks may serve other requests with the same prefix */
    rlai_kv_prefix_commit(d->kv, &s->seq, toks, n);
    return 0;
}

int rlai_draft_sync(rlai_draft *d, rlai_draft_seq *s, const int32_t *toks, int n)
{
    if (!d || !s || !toks || n < 1)
        return RLAI_ERR_INVALID_ARG;
    return sync(d, s, toks, n, 1);
}

int rlai_draft_propose(rlai_draft *d, rlai_draft_seq *s, const int32_t *toks, int n, int gamma,
                       int32_t *out)
{
    if (!d || !s || !toks || !out || n < 1 || gamma < 1 || gamma > RLAI_SPEC_MAX_DRAFT)
        return RLAI_ERR_INVALID_ARG;
    int rc = sync(d, s, toks, n, gamma);
    if (rc < 0)
        return rc;
    int k = 0;
    for (;;) {
        out[k] = argmax(d->logits, d->n_vocab);
        if (++k == gamma || rlai_tokenizer_is_eog(d->tok, out[k - 1]))
            break;
        if ((rc = feed(d, s, &out[k - 1], n + k - 1, 1)) < 0)
            return rc;
    }
    return k;
}

void rlai_draft_seq_release(rlai_draft *d, rlai_draft_seq *s)
{
    if (!s)
        return;
    if (d)
        rlai_kv_seq_release(d->kv, &s->seq);
    free(s->fed);
    memset(s, 0, sizeof(*s));
}

void rlai_draft_kv_stats(const rlai_draft *d, rlai_kv_stats *out)
{
    rlai_kv_cache_stats(d->kv, out);
}

int rlai_draft_check(const rlai_draft *d, rlai_draft_seq *const *seqs, int n_seqs, char *err, size_t errlen)
{
    rlai_kv_seq *tab[64];
    if (n_seqs < 0 || n_seqs > 64)
        return RLAI_ERR_INVALID_ARG;
    for (int i = 0; i < n_seqs; i++)
        tab[i] = &seqs[i]->seq;
    return rlai_kv_cache_check(d->kv, tab, n_seqs, err, errlen);
}
