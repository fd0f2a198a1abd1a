/* gen_capture.h - what the engine tests collect from one request: its
 * token ids (up to 256), and its single on_done (status and metrics).
 * Header-only test helper for test_scheduler.c, test_spec.c and
 * test_draft.c (Check's ck_assert is used, so include <check.h> first). */
#ifndef RLAI_TESTS_GEN_CAPTURE_H
#define RLAI_TESTS_GEN_CAPTURE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rlai/engine.h"

#define RESULT_MAX_TOKENS 256

typedef struct result {
    rlai_token toks[RESULT_MAX_TOKENS];
    int n;
    bool done;
    int status;
    rlai_gen_metrics m;
} result;

/* rlai_request_params.on_token: keeps the ids (user: a result). */
static inline int collect(void *user, rlai_token tok, const char *text, size_t len)
{
    (void)text;
    (void)len;
    result *r = user;
    if (tok >= 0 && r->n < RESULT_MAX_TOKENS)
        r->toks[r->n++] = tok;
    return 0;
}

/* rlai_request_params.on_done: checks it comes exactly once. */
static inline void done_cb(void *user, uint64_t id, int status, const rlai_gen_metrics *m)
{
    (void)id;
    result *r = user;
    ck_assert(!r->done);   /* exactly once */
    r->done = true;
    r->status = status;
    r->m = *m;
}

#endif
