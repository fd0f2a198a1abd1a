/* test_scheduler.c - continuous batching, prefix cache and admission
 * control on the real default model: batched and cached results equal the
 * lone, uncached ones token for token; a tiny KV budget ends every request
 * cleanly; cancel frees blocks; pinned prefixes are reused. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rlai/engine.h"
#include "gen_capture.h"

#define MODEL RLAI_MODELS_DIR "/SmolLM2-135M-Instruct.Q4_1.gguf"
#define NTOK 16

static rlai_engine *open_engine(int kv_blocks, int n_ctx)
{
    rlai_engine_params p;
    rlai_engine_params_init(&p);
    p.n_threads = 2;
    p.n_ctx = n_ctx;
    p.kv_blocks = kv_blocks;
    rlai_engine *e = NULL;
    char err[512];
    ck_assert_msg(rlai_engine_open(MODEL, &p, &e, err, sizeof(err)) == 0, "%s", err);
    return e;
}

static int tokenize(rlai_engine *e, const char *text, rlai_token *out, int cap)
{
    int n = rlai_engine_tokenize(e, text, strlen(text), true, true, out, cap);
    ck_assert_int_gt(n, 0);
    ck_assert_int_le(n, cap);
    return n;
}

static uint64_t submit(rlai_engine *e, const rlai_token *p, int n, int max_tokens, result *r)
{
    rlai_request_params rp;
    memset(&rp, 0, sizeof(rp));
    rp.prompt = p;
    rp.n_prompt = n;
    rlai_gen_params_init(&rp.gen);
    rp.gen.max_tokens = max_tokens;
    rp.gen.ignore_eos = true;
    rp.on_token = collect;
    rp.on_done = done_cb;
    rp.user = r;
    uint64_t id = 0;
    ck_assert_int_eq(rlai_engine_submit(e, &rp, &id), 0);
    return id;
}

static void run_until_idle(rlai_engine *e)
{
    int guard = 0;
    while (rlai_engine_step(e) > 0)
        ck_assert_int_lt(++guard, 100000);
}

static const char *prompts[8] = {
    "The lighthouse keeper looked at the sea and said",
    "List three fruits:",
    "In a distant kingdom, a young dragon",
    "The recipe for bread starts with",
    "Write a short poem about autumn leaves.",
    "Explain why the sky is blue in one sentence.",
    "My favourite board game is",
    "Once upon a time there was a robot who",
};

START_TEST(batched_equals_alone_and_cache_on_equals_off)
{
    rlai_engine *e = open_engine(0, 1024);
    rlai_token p[8][64];
    int n[8];
    for (int i = 0; i < 8; i++)
        n[i] = tokenize(e, prompts[i], p[i], 64);

    /* Alone, prefix cache off. */
    rlai_engine_set_prefix_cache(e, false);
    result alone;
    memset(&alone, 0, sizeof(alone));
    submit(e, p[0], n[0], NTOK, &alone);
    run_until_idle(e);
    ck_assert(alone.done && alone.status == 0);
    ck_assert_int_eq(alone.n, NTOK);

    /* Batched with 7 other streams, cache on (twice: the second run reuses
     * the cached prompt blocks of the first). */
    rlai_engine_set_prefix_cache(e, true);
    for (int round = 0; round < 2; round++) {
        result r[8];
        memset(r, 0, sizeof(r));
        for (int i = 0; i < 8; i++)
            submit(e, p[i], n[i], NTOK, &r[i]);
        run_until_idle(e);
        for (int i = 0; i < 8; i++) {
            ck_assert(r[i].done);
            ck_assert_int_eq(r[i].status, 0);
            ck_assert_int_eq(r[i].n, NTOK);
        }
        ck_assert_msg(memcmp(r[0].toks, alone.toks, sizeof(rlai_token) * NTOK) == 0,
                      "round %d: batched output differs from the lone run", round);
    }
    rlai_engine_close(e);
}
END_TEST

/* A lore prefix of > 100 tokens (lore, NUL-terminated) and two questions
 * after it (q1, q2). */
static void lore_questions(char lore[2048], char q1[2300], char q2[2300])
{
    snprintf(lore, 2048, "<|im_start|>system\nYou are Captain Mara of the airship Wren. ");
    for (int i = 0; i < 6; i++)
        strcat(lore, "The Wren sails the cloud sea between the floating isles of Aster and Vell. ");
    strcat(lore, "<|im_end|>\n<|im_start|>user\n");
    snprintf(q1, 2300, "%sWho are you?<|im_end|>\n<|im_start|>assistant\n", lore);
    snprintf(q2, 2300, "%sWhere do you sail?<|im_end|>\n<|im_start|>assistant\n", lore);
}

START_TEST(prefix_reuse_is_reported_and_exact)
{
    rlai_engine *e = open_engine(0, 1024);
    /* A lore prefix of > 100 tokens, then two different questions. */
    char lore[2048], q1[2300], q2[2300];
    lore_questions(lore, q1, q2);
    rlai_token t1[600], t2[600], tl[600];
    int n1 = tokenize(e, q1, t1, 600), n2 = tokenize(e, q2, t2, 600), nl = tokenize(e, lore, tl, 600);
    ck_assert_int_gt(nl, 100);

    result cold, warm, ref;
    memset(&cold, 0, sizeof(cold));
    memset(&warm, 0, sizeof(warm));
    memset(&ref, 0, sizeof(ref));
    submit(e, t1, n1, 8, &cold);
    run_until_idle(e);
    ck_assert_int_eq(cold.m.reused_tokens, 0);
    submit(e, t2, n2, 8, &warm);
    run_until_idle(e);
    /* Every full block of the shared lore prefix is reused. */
    ck_assert_int_ge(warm.m.reused_tokens, (nl / 16) * 16 - 16);
    ck_assert_int_gt(warm.m.reused_tokens, 64);

    /* Same answer as computing q2 with the cache off. */
    rlai_engine_set_prefix_cache(e, false);
    submit(e, t2, n2, 8, &ref);
    run_until_idle(e);
    ck_assert_int_eq(ref.m.reused_tokens, 0);
    ck_assert_mem_eq(warm.toks, ref.toks, sizeof(rlai_token) * 8);

    /* Pin the lore: still reused after unrelated traffic. */
    rlai_engine_set_prefix_cache(e, true);
    int pinned = rlai_engine_pin_prefix(e, tl, nl);
    ck_assert_int_eq(pinned, (nl / 16) * 16);
    rlai_engine_stats st;
    rlai_engine_get_stats(e, &st);
    for (int i = 0; i < 8; i++) {
        rlai_token p[64];
        int n = tokenize(e, prompts[i], p, 64);
        result r;
        memset(&r, 0, sizeof(r));
        submit(e, p, n, 4, &r);
        run_until_idle(e);
    }
    rlai_engine_get_stats(e, &st);
    ck_assert_int_ge(st.kv_blocks_pinned, nl / 16);
    result again;
    memset(&again, 0, sizeof(again));
    submit(e, t1, n1, 8, &again);
    run_until_idle(e);
    ck_assert_int_ge(again.m.reused_tokens, pinned);
    ck_assert_mem_eq(again.toks, cold.toks, sizeof(rlai_token) * 8);
    ck_assert_int_eq(rlai_engine_unpin_prefix(e, tl, nl), pinned);
    rlai_engine_close(e);
}
END_TEST

/* Requests that arrive together with a long shared prompt ("n" choices,
 * agents with one system prompt): the first prefills it, the others wait
 * for its blocks in the prefix cache instead of computing them beside it,
 * and every answer equals the lone uncached one. */
START_TEST(concurrent_shared_prompts_prefill_once)
{
    rlai_engine *e = open_engine(0, 1024);
    char lore[2048], q[2][2300];
    lore_questions(lore, q[0], q[1]);
    rlai_token t[2][600], tl[600];
    int n[2] = { tokenize(e, q[0], t[0], 600), tokenize(e, q[1], t[1], 600) };
    int nl = tokenize(e, lore, tl, 600);
    result ref[2];
    rlai_engine_set_prefix_cache(e, false);
    for (int i = 0; i < 2; i++) {
        memset(&ref[i], 0, sizeof(ref[i]));
        submit(e, t[i], n[i], 8, &ref[i]);
        run_until_idle(e);
    }
    /* off: nothing is shared, all four prefill in the same step */
    result r[4];
    memset(r, 0, sizeof(r));
    for (int i = 0; i < 4; i++)
        submit(e, t[i % 2], n[i % 2], 8, &r[i]);
    ck_assert_int_gt(rlai_engine_step(e), 0);
    rlai_engine_stats st;
    rlai_engine_get_stats(e, &st);
    ck_assert_int_eq(st.running, 4);
    run_until_idle(e);
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(r[i].m.reused_tokens, 0);
    /* on: two copies of each prompt at once; the first prefills, the other
     * three take its blocks (the same prompt: all but the last block's) */
    rlai_engine_set_prefix_cache(e, true);
    memset(r, 0, sizeof(r));
    for (int i = 0; i < 4; i++)
        submit(e, t[i / 2], n[i / 2], 8, &r[i]);
    ck_assert_int_gt(rlai_engine_step(e), 0);
    rlai_engine_get_stats(e, &st);
    ck_assert_int_eq(st.running, 1);             /* the others wait for its blocks */
    ck_assert_int_eq(st.queued, 3);
    run_until_idle(e);
    ck_assert_int_eq(r[0].m.reused_tokens, 0);
    ck_assert_int_eq(r[1].m.reused_tokens, (n[0] - 1) / 16 * 16);
    for (int i = 2; i < 4; i++)
        ck_assert_int_ge(r[i].m.reused_tokens, (nl / 16) * 16 - 16);
    ck_assert_int_eq(r[3].m.reused_tokens, (n[1] - 1) / 16 * 16);
    for (int i = 0; i < 4; i++) {
        ck_assert(r[i].done && r[i].status == 0 && r[i].n == 8);
        ck_assert_mem_eq(r[i].toks, ref[i / 2].toks, sizeof(rlai_token) * 8);
    }
    /* short prompts that share less than a block are admitted together */
    rlai_token p[4][64];
    memset(r, 0, sizeof(r));
    for (int i = 0; i < 4; i++)
        submit(e, p[i], tokenize(e, prompts[i], p[i], 64), 4, &r[i]);
    ck_assert_int_gt(rlai_engine_step(e), 0);
    rlai_engine_get_stats(e, &st);
    ck_assert_int_eq(st.running, 4);
    run_until_idle(e);
    rlai_engine_close(e);
}
END_TEST

START_TEST(tiny_kv_budget_ends_every_request)
{
    /* 12 blocks = 192 tokens: each request needs 1-2 blocks of prompt plus
     * 24 new tokens, so only some fit at once; the rest wait. One request
     * needs more than the pool and is refused at once. */
    rlai_engine *e = open_engine(12, 1024);
    enum { N = 20 };
    result r[N];
    memset(r, 0, sizeof(r));
    rlai_token p[64];
    for (int i = 0; i < N; i++) {
        int n = tokenize(e, prompts[i % 8], p, 64);
        submit(e, p, n, 24, &r[i]);
    }
    rlai_token big[300];
    for (int i = 0; i < 300; i++)
        big[i] = 100 + i;
    rlai_request_params rp;
    memset(&rp, 0, sizeof(rp));
    rp.prompt = big;
    rp.n_prompt = 300;
    rlai_gen_params_init(&rp.gen);
    ck_assert_int_eq(rlai_engine_submit(e, &rp, NULL), RLAI_ERR_KV_FULL);
    rlai_engine_stats st;
    int max_running = 0, guard = 0;
    while (rlai_engine_step(e) > 0) {
        rlai_engine_get_stats(e, &st);
        if (st.running > max_running)
            max_running = st.running;
        ck_assert_int_le(st.kv_blocks_used, 12);
        ck_assert_int_lt(++guard, 100000);
    }
    ck_assert_int_gt(max_running, 1);      /* batching happened */
    ck_assert_int_lt(max_running, N);      /* and admission held some back */
    for (int i = 0; i < N; i++) {
        ck_assert_msg(r[i].done, "request %d never finished", i);
        ck_assert_int_eq(r[i].status, 0);
        ck_assert_int_eq(r[i].n, 24);
    }
    rlai_engine_get_stats(e, &st);
    ck_assert_int_eq(st.kv_blocks_used, 0);
    rlai_engine_close(e);
}
END_TEST

START_TEST(cancel_frees_blocks_within_a_step)
{
    rlai_engine *e = open_engine(0, 1024);
    rlai_token p[64];
    int n = tokenize(e, prompts[2], p, 64);
    result a, b;
    memset(&a, 0, sizeof(a));
    memset(&b, 0, sizeof(b));
    uint64_t ida = submit(e, p, n, 200, &a);
    uint64_t idb = submit(e, p, n, 200, &b);
    for (int i = 0; i < 4; i++)
        rlai_engine_step(e);
    ck_assert_int_eq(rlai_engine_cancel(e, ida), 0);
    rlai_engine_step(e);
    ck_assert(a.done);
    ck_assert_int_eq(a.m.stop, RLAI_STOP_CANCELLED);
    ck_assert(!b.done);
    ck_assert_int_eq(rlai_engine_cancel(e, idb), 0);
    rlai_engine_step(e);
    ck_assert(b.done);
    ck_assert_int_eq(rlai_engine_cancel(e, idb), RLAI_ERR_NOT_FOUND);
    rlai_engine_stats st;
    rlai_engine_get_stats(e, &st);
    ck_assert_int_eq(st.kv_blocks_used, 0);
    ck_assert_int_eq(st.running + st.queued, 0);
    rlai_engine_close(e);
}
END_TEST

static uint64_t submit_timeout(rlai_engine *e, const rlai_token *p, int n, int max_tokens, uint64_t timeout_ms,
                               result *r)
{
    rlai_request_params rp;
    memset(&rp, 0, sizeof(rp));
    rp.prompt = p;
    rp.n_prompt = n;
    rlai_gen_params_init(&rp.gen);
    rp.gen.max_tokens = max_tokens;
    rp.gen.ignore_eos = true;
    rp.gen.timeout_ms = timeout_ms;
    rp.on_token = collect;
    rp.on_done = done_cb;
    rp.user = r;
    uint64_t id = 0;
    ck_assert_int_eq(rlai_engine_submit(e, &rp, &id), 0);
    return id;
}

/* Not a timed test: the sleeps only make sure a deadline has passed. */
START_TEST(deadline_ends_request_with_timeout_and_frees_blocks)
{
    rlai_engine *e = open_engine(0, 1024);
    rlai_token pa[64], pb[64], pc[64];
    int na = tokenize(e, prompts[3], pa, 64);
    int nb = tokenize(e, prompts[4], pb, 64);
    int nc = tokenize(e, prompts[5], pc, 64);
    result a, b, c;
    memset(&a, 0, sizeof(a));
    memset(&b, 0, sizeof(b));
    memset(&c, 0, sizeof(c));
    /* Running: a deadline passes while it streams. */
    submit_timeout(e, pa, na, 200, 5000, &a);
    submit(e, pb, nb, 24, &b);   /* no deadline */
    rlai_engine_step(e);
    rlai_engine_step(e);
    rlai_engine_stats before;
    rlai_engine_get_stats(e, &before);
    ck_assert_msg(!a.done, "two steps took over 5 s");
    usleep(5100 * 1000);
    rlai_engine_step(e);
    ck_assert(a.done);
    ck_assert_int_eq(a.status, 0);
    ck_assert_int_eq(a.m.stop, RLAI_STOP_TIMEOUT);
    ck_assert_str_eq(rlai_stop_reason_name(a.m.stop), "timeout");
    ck_assert_int_lt(a.m.gen_tokens, 200);
    rlai_engine_stats after;
    rlai_engine_get_stats(e, &after);
    if (!before.kv_blocks_used)
        ck_abort_msg("no blocks in use while streaming");
    ck_assert_int_lt(after.kv_blocks_used, before.kv_blocks_used);
    /* Queued: a deadline that passed before admission. */
    submit_timeout(e, pc, nc, 8, 1, &c);
    usleep(10 * 1000);
    rlai_engine_step(e);
    ck_assert(c.done);
    ck_assert_int_eq(c.m.stop, RLAI_STOP_TIMEOUT);
    ck_assert_int_eq(c.m.gen_tokens, 0);
    /* The request without a deadline is unaffected. */
    ck_assert(!b.done);
    run_until_idle(e);
    ck_assert(b.done && b.status == 0);
    ck_assert_int_eq(b.m.stop, RLAI_STOP_MAX_TOKENS);
    ck_assert_int_eq(b.n, 24);
    rlai_engine_get_stats(e, &after);
    ck_assert_int_eq(after.kv_blocks_used, 0);
    ck_assert_int_eq(after.running + after.queued, 0);
    rlai_engine_close(e);
}
END_TEST

/* rlai_engine_submit_text, the request path of every front: a chat or a
 * prompt gives the same tokens as tokenizing it by hand and submitting;
 * its refusals carry a code and a reason, and never call on_done. */
START_TEST(submit_text_equals_manual_path_and_refuses_clearly)
{
    rlai_engine *e = open_engine(0, 512);
    rlai_chat_message msgs[2] = { { "system", "You are terse." }, { "user", "Name a colour." } };
    rlai_token *ct = NULL;
    int nct = 0;
    ck_assert_int_eq(rlai_engine_tokenize_chat(e, msgs, 2, true, &ct, &nct), 0);
    rlai_token pt[64];
    int npt = tokenize(e, prompts[0], pt, 64);

    result manual[2], viatext[3];
    memset(manual, 0, sizeof manual);
    memset(viatext, 0, sizeof viatext);
    submit(e, ct, nct, NTOK, &manual[0]);
    submit(e, pt, npt, NTOK, &manual[1]);
    run_until_idle(e);

    rlai_text_request rq;
    memset(&rq, 0, sizeof rq);
    rlai_gen_params_init(&rq.rp.gen);
    rq.rp.gen.sampling.temperature = 0;
    rq.rp.gen.max_tokens = NTOK;
    rq.rp.gen.ignore_eos = true;
    rq.rp.on_token = collect;
    rq.rp.on_done = done_cb;
    char err[256];
    uint64_t id = 0;
    int np = -1;
    rq.messages = msgs;
    rq.n_messages = 2;
    rq.rp.user = &viatext[0];
    ck_assert_int_eq(rlai_engine_submit_text(e, &rq, &id, &np, err, sizeof err), 0);
    ck_assert_int_eq(np, nct);
    rq.messages = NULL;
    rq.n_messages = 0;
    rq.prompt = prompts[0];
    rq.rp.user = &viatext[1];
    ck_assert_int_eq(rlai_engine_submit_text(e, &rq, &id, &np, err, sizeof err), 0);
    ck_assert_int_eq(np, npt);
    rq.prompt = NULL;             /* the same prompt as token ids */
    rq.rp.prompt = pt;
    rq.rp.n_prompt = npt;
    rq.rp.user = &viatext[2];
    ck_assert_int_eq(rlai_engine_submit_text(e, &rq, &id, &np, err, sizeof err), 0);
    ck_assert_int_eq(np, npt);
    run_until_idle(e);
    for (int i = 0; i < 3; i++) {
        const result *want = &manual[i == 2 ? 1 : i];
        ck_assert(viatext[i].done && viatext[i].status == 0);
        ck_assert_int_eq(viatext[i].n, want->n);
        ck_assert_int_eq(viatext[i].m.prompt_tokens, want->m.prompt_tokens);
        ck_assert_mem_eq(viatext[i].toks, want->toks, sizeof(rlai_token) * (size_t)want->n);
    }
    rlai_model_info info;
    rlai_engine_info(e, &info);
    rlai_token badtok[2] = { pt[0], (rlai_token)info.n_vocab };
    rq.rp.prompt = badtok;
    rq.rp.n_prompt = 2;
    ck_assert_int_eq(rlai_engine_submit_text(e, &rq, &id, &np, err, sizeof err), RLAI_ERR_INVALID_ARG);
    ck_assert_msg(strstr(err, "ids are in") != NULL, "%s", err);
    rq.rp.prompt = NULL;          /* no prompt form at all */
    rq.rp.n_prompt = 0;
    ck_assert_int_eq(rlai_engine_submit_text(e, &rq, &id, &np, err, sizeof err), RLAI_ERR_INVALID_ARG);
    ck_assert_int_eq(np, 0);
    rq.prompt = prompts[0];

    result never;
    memset(&never, 0, sizeof never);
    rq.rp.user = &never;
    rq.max_prompt_tokens = 3;   /* prompts[0] has more */
    ck_assert_int_eq(rlai_engine_submit_text(e, &rq, &id, &np, err, sizeof err), RLAI_ERR_TOO_LARGE);
    ck_assert_int_eq(np, npt);  /* the count is known even when refused */
    ck_assert_msg(strstr(err, "the limit is 3") != NULL, "%s", err);
    rq.max_prompt_tokens = 0;
    rq.prompt = "";
    ck_assert_int_eq(rlai_engine_submit_text(e, &rq, &id, NULL, err, sizeof err), RLAI_ERR_INVALID_ARG);
    ck_assert_str_eq(err, "empty prompt");
    rq.messages = msgs;   /* both set */
    rq.n_messages = 2;
    rq.prompt = prompts[0];
    ck_assert_int_eq(rlai_engine_submit_text(e, &rq, &id, NULL, err, sizeof err), RLAI_ERR_INVALID_ARG);
    rq.prompt = NULL;
    rlai_chat_message bad[1] = { { "narrator", "hello" } };
    rq.messages = bad;
    rq.n_messages = 1;
    ck_assert_int_eq(rlai_engine_submit_text(e, &rq, &id, NULL, err, sizeof err), RLAI_ERR_INVALID_ARG);
    ck_assert_msg(strstr(err, "template") != NULL, "%s", err);
    ck_assert_int_eq(rlai_engine_step(e), 0);
    ck_assert(!never.done);
    free(ct);
    rlai_engine_close(e);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("scheduler");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 1200);
    tcase_add_test(tc, batched_equals_alone_and_cache_on_equals_off);
    tcase_add_test(tc, prefix_reuse_is_reported_and_exact);
    tcase_add_test(tc, concurrent_shared_prompts_prefill_once);
    tcase_add_test(tc, tiny_kv_budget_ends_every_request);
    tcase_add_test(tc, cancel_frees_blocks_within_a_step);
    tcase_add_test(tc, deadline_ends_request_with_timeout_and_frees_blocks);
    tcase_add_test(tc, submit_text_equals_manual_path_and_refuses_clearly);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
