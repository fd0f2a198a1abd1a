/* engine_impl.h - the engine's shared state, private to engine/.
 *
 * struct rlai_engine and one generation request (rlai_req), seen by the
 * two halves of the engine object: engine.c (open/close, tokenizer and
 * chat, synchronous helpers, eval, embeddings) and scheduler.c (submit,
 * cancel, continuous batching, speculative verification, prefix pinning).
 * Nothing outside engine/ includes it. */
#ifndef RLAI_ENGINE_IMPL_H
#define RLAI_ENGINE_IMPL_H

#include "rlai/engine.h"
#include "backend.h"
#include "chat.h"
#include "draft.h"
#include "grammar.h"
#include "kernels.h"
#include "kv_cache.h"
#include "model.h"
#include "sampler.h"
#include "spec.h"
#include "textstream.h"
#include "threadpool.h"
#include "tokenizer.h"
#include "rlai/gguf.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

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
    rlai_spec_state spec;        /* adaptive draft length (spec.h) of its drafter */
    rlai_spec_state lspec;       /* with the draft model: that of its prompt-lookup drafts */
    int32_t draft[RLAI_SPEC_MAX_DRAFT];
    int n_draft;                 /* draft tokens fed this step */
    bool use_draft;              /* drafts come from the draft model (RLAI_SPEC_DRAFT) */
    bool draft_lookup;           /* ... but this step's came from prompt lookup */
    bool draft_forced;           /* ... or is the grammar's forced text (no feedback) */
    int draft_from;              /* a lookup draft: index in toks of its first token */
    int lookup_near;             /* where the copy of accepted lookups goes on (-1: none; spec.h) */
    double draft_ms;             /* what proposing this step's draft took */
    rlai_draft_seq dseq;         /* its state in the draft model */
    int row0;                    /* logits row of the last real token this step */
    bool lp_on;                  /* gen.top_logprobs >= 0 with on_logprobs */
    bool lp_ready;               /* lp holds the token sampled this step */
    float *lp_raw;               /* n_vocab: raw logits copied before sampling */
    rlai_logit_bias *lb;         /* gp.logit_bias, copied (one entry a token) */
    int n_lb;
    int32_t *pred;               /* the prompt's last tokens, then gp.prediction's (owned) */
    int n_pred;
    bool plp;                    /* prompt logprobs (gen.prompt_logprobs with lp_on) */
    int plp_row0, plp_n;         /* this step: logits rows of its prompt positions */
    rlai_token_logprobs *plp_buf;/* RLAI_PROMPT_LOGPROBS_CHUNK entries (plp only) */
    rlai_token_logprobs lp;
    rlai_grammar_matcher *gm;    /* gen.grammar's matcher, or NULL */
    uint32_t *gmask;             /* allowed tokens of this step (bitset) */
    int gerr;                    /* mask failure of this step (< 0), else 0 */
    struct rlai_req_image *imgs; /* owned copies of the request's image rows, or NULL */
    int n_imgs;
    int32_t *keys;               /* prefix-cache keys of toks (image positions hashed), or NULL */
} rlai_req;

/* One image of a request: its rows (owned) and their content hash. */
typedef struct rlai_req_image {
    int pos, n_rows;
    float *rows;                 /* n_rows * n_embd */
    uint64_t hash;
} rlai_req_image;


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
    rlai_draft *draft;           /* speculative draft model, or NULL */
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
    rlai_spec_cost spec_cost;    /* what draft rows cost here, from step times (spec.h) */
    rlai_engine_stats stats;     /* snapshot, under qmu */
    pthread_mutex_t gv_mu;       /* guards building gvocab */
    rlai_gvocab *gvocab;         /* token bytes and tries for grammars (built on first use) */
    /* vision encoder (rlai_engine_load_mmproj): encodes run one at a time
     * under vmu, on their own kernel context and threads */
    pthread_mutex_t vmu;
    struct rlai_vision *vision;  /* NULL = none */
    rlai_kernels *vkern;
    rlai_threadpool *vtp;
    char *mmproj_path;
    rlai_token image_token;      /* "<image>" in the vocabulary, or -1 */
};

/* The prefix-cache keys of a request's tokens [0, n_toks): its tokens with
 * each image position replaced by a negative id derived from the image's
 * hash and the row (scheduler.c). r->toks itself when it has no image. */
const int32_t *rlai_sched_keys(rlai_req *r);
/* The input row of token position p of r (an image row), or NULL. */
const float *rlai_sched_image_row(const rlai_engine *e, const rlai_req *r, int p);

/* 0 when toks[0..n) is a usable prompt for a fresh sequence: n >= 1
 * (else RLAI_ERR_INVALID_ARG), shorter than the context (else
 * RLAI_ERR_CONTEXT_FULL), every id in the vocabulary (else
 * RLAI_ERR_INVALID_ARG). engine.c. */
int rlai_engine_check_tokens(const rlai_engine *e, const rlai_token *toks, int n);

/* KV blocks that hold `tokens` tokens. */
static inline int rlai_blocks_for(int tokens)
{
    return (tokens + RLAI_KV_BLOCK - 1) / RLAI_KV_BLOCK;
}

#endif
