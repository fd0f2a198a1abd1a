/* test_draft.c - speculative decoding with a draft model (engine/draft.h)
 * on the real default model.
 *
 * Draft models, written at build time by tests/ref/make_draft.py from the
 * default model: layers8.gguf (its first 8 blocks: a different, cheaper
 * model with the same tokenizer, so drafts get rejected) and badvocab.gguf
 * (the same with one token's text changed). The default model itself also
 * serves as a draft: with batch-invariant kernels its proposals are the
 * target's own greedy choices, so every draft must be accepted.
 *
 * Checked: greedy output with drafts is token-for-token the plain output
 * (alone and under continuous batching); a draft equal to the target is
 * accepted in full; the draft cache after random accept/reject histories
 * passes its invariant check and proposes exactly what a fresh sequence
 * fed the same tokens proposes (rollback leaves no stale K/V); a draft with
 * another tokenizer, a missing file, and DRAFT without a draft model are
 * refused with a reason; AUTO drafts with the draft model for greedy and
 * sampled requests, a seeded sample coming out as without drafts; text that repeats an earlier passage is drafted by prompt
 * lookup beside the draft model (spec_lookup_min), and a request whose
 * draft model gives up goes on with prompt lookup; randomized requests
 * ending mid-draft (stop string, max_tokens, EOS, context end, a
 * cancelling client) end exactly as without drafts. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_impl.h"
#include "gen_capture.h"
#include "spec_endings.h"

#define MODEL RLAI_MODELS_DIR "/SmolLM2-135M-Instruct.Q4_1.gguf"
#define LAYERS8 RLAI_DRAFT_DATA "/layers8.gguf"
#define BADVOCAB RLAI_DRAFT_DATA "/badvocab.gguf"

#define NTOK 48

/* lookup_min: the engine's spec_lookup_min (0 = its default, -1 = the
 * draft model proposes every draft). */
static int open_with(const char *draft, rlai_spec_mode spec, int spec_max_batch, int lookup_min, rlai_engine **e,
                     char *err, size_t errlen)
{
    rlai_engine_params p;
    rlai_engine_params_init(&p);
    p.n_threads = 2;
    p.n_ctx = 1024;
    p.spec = spec;
    p.spec_max_batch = spec_max_batch;
    p.draft_model = draft;
    p.spec_lookup_min = lookup_min;
    return rlai_engine_open(MODEL, &p, e, err, errlen);
}

static rlai_engine *open_engine(const char *draft, rlai_spec_mode spec, int spec_max_batch, int lookup_min)
{
    rlai_engine *e = NULL;
    char err[768];
    ck_assert_msg(open_with(draft, spec, spec_max_batch, lookup_min, &e, err, sizeof(err)) == 0, "%s", err);
    return e;
}

static void submit_t(rlai_engine *e, const rlai_token *p, int n, int max_tokens, rlai_spec_mode spec,
                     float temperature, result *r)
{
    rlai_request_params rp;
    memset(&rp, 0, sizeof(rp));
    memset(r, 0, sizeof(*r));
    rp.prompt = p;
    rp.n_prompt = n;
    rlai_gen_params_init(&rp.gen);
    rp.gen.max_tokens = max_tokens;
    rp.gen.ignore_eos = true;
    rp.gen.spec = spec;
    rp.gen.sampling.temperature = temperature;
    rp.gen.sampling.seed = 7;
    rp.on_token = collect;
    rp.on_done = done_cb;
    rp.user = r;
    uint64_t id = 0;
    ck_assert_int_eq(rlai_engine_submit(e, &rp, &id), 0);
}

static void submit(rlai_engine *e, const rlai_token *p, int n, int max_tokens, rlai_spec_mode spec, result *r)
{
    submit_t(e, p, n, max_tokens, spec, 0.0f, r);
}

/* Runs the engine dry; then no target or draft K/V block may be in use
 * and the draft cache must pass its invariant check. */
static void run_until_idle(rlai_engine *e)
{
    int guard = 0;
    while (rlai_engine_step(e) > 0)
        ck_assert_int_lt(++guard, 100000);
    rlai_engine_stats st;
    rlai_engine_get_stats(e, &st);
    ck_assert_int_eq(st.running + st.queued, 0);
    ck_assert_int_eq(st.kv_blocks_used, 0);
    if (e->draft) {
        rlai_kv_stats ks;
        rlai_draft_kv_stats(e->draft, &ks);
        ck_assert_int_eq(ks.blocks_used, 0);
        char err[256];
        ck_assert_msg(rlai_draft_check(e->draft, NULL, 0, err, sizeof(err)) == 0, "%s", err);
    }
}

static const char *prompts[4] = {
    "<|im_start|>user\nRepeat this sentence three times: The keeper of Harrow Bay lighthouse counted "
    "forty ships every night and wrote their names in a red book.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nRename the variable x to count:\nint f(int *a, int n) {\n    int x = 0;\n"
    "    for (int i = 0; i < n; i++)\n        x += a[i];\n    return x;\n}<|im_end|>\n"
    "<|im_start|>assistant\n",
    "<|im_start|>user\nQuote exactly: \"Mira the smith of Oakvale forged the silver key that opens the "
    "north gate.\"<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nTell me about your favourite season.<|im_end|>\n<|im_start|>assistant\n",
};

static int tokenize(rlai_engine *e, int i, rlai_token *p)
{
    int n = rlai_engine_tokenize(e, prompts[i], strlen(prompts[i]), true, true, p, 256);
    ck_assert_int_gt(n, 0);
    return n;
}

START_TEST(draft_equal_to_the_target_is_accepted_in_full)
{
    rlai_engine *e = open_engine(MODEL, RLAI_SPEC_OFF, 0, -1);
    rlai_model_info mi;
    rlai_engine_info(e, &mi);
    ck_assert_ptr_nonnull(mi.draft_model);
    ck_assert_str_eq(mi.draft_model, MODEL);
    rlai_token p[256];
    static result off, on;
    long drafted = 0;
    for (int i = 0; i < 4; i++) {
        int n = tokenize(e, i, p);
        submit(e, p, n, NTOK, RLAI_SPEC_OFF, &off);
        run_until_idle(e);
        ck_assert(off.done && off.status == 0 && off.n == NTOK);
        submit(e, p, n, NTOK, RLAI_SPEC_DRAFT, &on);
        run_until_idle(e);
        ck_assert(on.done && on.status == 0);
        ck_assert_int_eq(on.n, NTOK);
        for (int k = 0; k < NTOK; k++)
            ck_assert_msg(on.toks[k] == off.toks[k], "prompt %d: token %d differs (%d vs %d)", i, k, on.toks[k],
                          off.toks[k]);
        /* the draft's greedy choice is the target's: nothing is rejected
         * (how much it drafts depends on step timings: the engine pauses
         * a draft that costs more than it gives, as one this size does) */
        ck_assert_int_gt(on.m.drafted_tokens, 0);
        ck_assert_int_eq(on.m.accepted_tokens, on.m.drafted_tokens);
        drafted += on.m.drafted_tokens;
    }
    /* max_tokens is exact when a draft reaches past it */
    int n = tokenize(e, 0, p);
    submit(e, p, n, NTOK, RLAI_SPEC_OFF, &off);
    run_until_idle(e);
    for (int mt = 1; mt <= 5; mt++) {
        submit(e, p, n, mt, RLAI_SPEC_DRAFT, &on);
        run_until_idle(e);
        ck_assert_int_eq(on.n, mt);
        ck_assert_int_eq(on.m.stop, RLAI_STOP_MAX_TOKENS);
        ck_assert(memcmp(on.toks, off.toks, sizeof(rlai_token) * (size_t)mt) == 0);
    }
    rlai_engine_stats st;
    rlai_engine_get_stats(e, &st);
    ck_assert_int_ge((long)st.spec_drafted_total, drafted);
    rlai_engine_close(e);
}
END_TEST

START_TEST(a_different_draft_is_verified_and_rolled_back)
{
    rlai_engine *e = open_engine(LAYERS8, RLAI_SPEC_OFF, 0, -1);
    rlai_token p[256];
    static result off, on;
    long drafted = 0, accepted = 0;
    for (int i = 0; i < 4; i++) {
        int n = tokenize(e, i, p);
        submit(e, p, n, NTOK, RLAI_SPEC_OFF, &off);
        run_until_idle(e);
        submit(e, p, n, NTOK, RLAI_SPEC_DRAFT, &on);
        run_until_idle(e);
        ck_assert(on.done && on.status == 0 && on.n == NTOK);
        ck_assert_msg(memcmp(on.toks, off.toks, sizeof(rlai_token) * NTOK) == 0,
                      "prompt %d: output with the 8-layer draft differs from plain decoding", i);
        ck_assert_int_le(on.m.accepted_tokens, on.m.drafted_tokens);
        drafted += on.m.drafted_tokens;
        accepted += on.m.accepted_tokens;
    }
    ck_assert_int_gt(drafted, 0);
    ck_assert_int_lt(accepted, drafted);   /* rejections happened and were rolled back */
    rlai_engine_close(e);
}
END_TEST

/* Random histories of accepted and rejected drafts on two sequences that
 * share a prompt prefix: after each step the draft cache is consistent,
 * and a sequence that went through truncations proposes exactly what a
 * fresh one fed the same tokens proposes. */
START_TEST(rollback_keeps_the_draft_cache_consistent)
{
    rlai_engine *e = open_engine(LAYERS8, RLAI_SPEC_OFF, 0, -1);
    rlai_draft *d = e->draft;
    rlai_token base[256];
    int nb = tokenize(e, 0, base);
    static int32_t toks[2][512];
    int n[2] = { nb, nb - 5 };
    memcpy(toks[0], base, sizeof(int32_t) * (size_t)nb);
    memcpy(toks[1], base, sizeof(int32_t) * (size_t)nb);
    rlai_draft_seq s[2], fresh;
    memset(s, 0, sizeof(s));
    uint64_t rng = 12345;
    for (int it = 0; it < 40; it++) {
        int i = it & 1;
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        int gamma = 1 + (int)((rng >> 33) % 6);
        int32_t out[RLAI_SPEC_MAX_DRAFT], out2[RLAI_SPEC_MAX_DRAFT];
        int k = rlai_draft_propose(d, &s[i], toks[i], n[i], gamma, out);
        ck_assert_int_ge(k, 1);
        ck_assert_int_le(k, gamma);
        rlai_draft_seq *all[3] = { &s[0], &s[1] };
        char err[256];
        ck_assert_msg(rlai_draft_check(d, all, 2, err, sizeof(err)) == 0, "step %d: %s", it, err);
        memset(&fresh, 0, sizeof(fresh));
        ck_assert_int_eq(rlai_draft_propose(d, &fresh, toks[i], n[i], gamma, out2), k);
        ck_assert_msg(memcmp(out, out2, sizeof(int32_t) * (size_t)k) == 0,
                      "step %d: a rolled-back sequence proposes differently from a fresh one", it);
        rlai_draft_seq_release(d, &fresh);
        /* accept a random prefix of the draft, then a token of our own */
        int acc = (int)((rng >> 40) % (unsigned)(k + 1));
        for (int j = 0; j < acc; j++)
            toks[i][n[i]++] = out[j];
        toks[i][n[i]++] = 100 + (int32_t)((rng >> 20) % 5000);
        ck_assert_int_lt(n[i] + RLAI_SPEC_MAX_DRAFT, 500);
    }
    rlai_kv_stats ks;
    rlai_draft_kv_stats(d, &ks);
    ck_assert_int_gt((long)ks.tokens_reused, 0);   /* the fresh sequences hit the draft's prefix cache */
    rlai_draft_seq_release(d, &s[0]);
    rlai_draft_seq_release(d, &s[1]);
    rlai_draft_kv_stats(d, &ks);
    ck_assert_int_eq(ks.blocks_used, 0);
    char err[256];
    ck_assert_msg(rlai_draft_check(d, NULL, 0, err, sizeof(err)) == 0, "%s", err);
    rlai_engine_close(e);
}
END_TEST

START_TEST(drafts_under_continuous_batching)
{
    rlai_engine *e = open_engine(MODEL, RLAI_SPEC_OFF, -1, -1);
    static rlai_token p[4][256];
    int n[4];
    static result alone[4], r[4];
    for (int i = 0; i < 4; i++) {
        n[i] = tokenize(e, i, p[i]);
        submit(e, p[i], n[i], NTOK, RLAI_SPEC_OFF, &alone[i]);
        run_until_idle(e);
    }
    for (int i = 0; i < 4; i++)
        submit(e, p[i], n[i], NTOK, RLAI_SPEC_DRAFT, &r[i]);
    run_until_idle(e);
    for (int i = 0; i < 4; i++) {
        ck_assert(r[i].done && r[i].status == 0 && r[i].n == NTOK);
        ck_assert_msg(memcmp(r[i].toks, alone[i].toks, sizeof(rlai_token) * NTOK) == 0,
                      "prompt %d: batched draft-model output differs from the lone plain run", i);
        ck_assert_int_gt(r[i].m.drafted_tokens, 0);
        ck_assert_int_eq(r[i].m.accepted_tokens, r[i].m.drafted_tokens);
    }
    rlai_engine_close(e);
}
END_TEST

START_TEST(auto_uses_the_draft_model_greedy_and_sampled)
{
    rlai_engine *e = open_engine(MODEL, RLAI_SPEC_AUTO, 0, -1);
    rlai_token p[256];
    int n = tokenize(e, 3, p);   /* free chat: little for n-gram lookup to copy */
    static result on, cold, hot, hot2;
    rlai_kv_stats ks;
    rlai_draft_kv_stats(e->draft, &ks);
    ck_assert_int_eq(ks.blocks_cached, 0);
    submit(e, p, n, NTOK, RLAI_SPEC_AUTO, &on);
    run_until_idle(e);
    ck_assert(on.done && on.status == 0 && on.n == NTOK);
    ck_assert_int_gt(on.m.drafted_tokens, 0);
    ck_assert_int_eq(on.m.accepted_tokens, on.m.drafted_tokens);
    /* the draft model ran: its cache holds the prompt's full blocks */
    rlai_draft_kv_stats(e->draft, &ks);
    ck_assert_int_ge(ks.blocks_cached, n / RLAI_KV_BLOCK);
    /* sampled AUTO and DRAFT requests draft too, and with the default seed
     * they give the sampled output of plain decoding */
    submit_t(e, p, n, NTOK, RLAI_SPEC_OFF, 0.8f, &cold);
    run_until_idle(e);
    ck_assert(cold.done && cold.status == 0 && cold.n == NTOK);
    ck_assert_int_eq(cold.m.drafted_tokens, 0);
    submit_t(e, p, n, NTOK, RLAI_SPEC_AUTO, 0.8f, &hot);
    run_until_idle(e);
    ck_assert(hot.done && hot.status == 0 && hot.n == NTOK);
    ck_assert_int_gt(hot.m.drafted_tokens, 0);
    ck_assert_int_gt(hot.m.accepted_tokens, 0);
    ck_assert(memcmp(hot.toks, cold.toks, sizeof(rlai_token) * NTOK) == 0);
    submit_t(e, p, n, NTOK, RLAI_SPEC_DRAFT, 0.8f, &hot2);
    run_until_idle(e);
    ck_assert(hot2.done && hot2.status == 0 && hot2.n == NTOK);
    ck_assert_int_gt(hot2.m.drafted_tokens, 0);
    ck_assert(memcmp(hot2.toks, cold.toks, sizeof(rlai_token) * NTOK) == 0);
    rlai_engine_close(e);
}
END_TEST

/* Randomized requests that end mid-draft, every way a request can end
 * (spec_endings.h), give with the 8-layer draft model and prompt lookup
 * beside it exactly what they give without, several decoding at once;
 * afterwards no target or draft block is in use and the draft cache
 * passes its check (run_until_idle). */
START_TEST(random_requests_end_the_same_with_the_draft_model)
{
    rlai_engine *big = open_engine(LAYERS8, RLAI_SPEC_OFF, -1, 0);
    rlai_engine *small = spec_endings_small_engine(MODEL, RLAI_SPEC_OFF, LAYERS8);
    static rlai_token p[4][256];
    int n[4];
    for (int i = 0; i < 4; i++)
        n[i] = tokenize(big, i, p[i]);
    ck_assert_int_gt(spec_endings_check(big, small, p, n, RLAI_SPEC_DRAFT, run_until_idle), 0);
    rlai_engine_close(big);
    rlai_engine_close(small);
}
END_TEST

/* With the draft model, text that repeats an earlier passage is drafted
 * by prompt lookup (spec_lookup_min), the rest by the draft model; the
 * output stays the plain greedy output. The 8-layer draft's own proposals
 * are almost never right, so what gets accepted comes from lookup: with
 * lookup off (-1) the same requests accept fewer tokens, and none of
 * their drafts count as lookup. When the draft model gives up (it keeps
 * failing), the request goes on drafting by prompt lookup. */
START_TEST(repeated_text_is_drafted_by_lookup_beside_the_draft_model)
{
    rlai_engine *e = open_engine(LAYERS8, RLAI_SPEC_OFF, 0, 0);
    rlai_engine *only = open_engine(LAYERS8, RLAI_SPEC_OFF, 0, -1);
    ck_assert_int_eq(e->params.spec_lookup_min, RLAI_SPEC_LOOKUP_MIN);
    rlai_token p[256];
    static result on, on_only;
    const int copy_prompts[2] = { 0, 2 };   /* repeat a sentence; quote a sentence */
    long acc = 0, acc_only = 0, lookup = 0;
    for (int c = 0; c < 2; c++) {
        int n = tokenize(e, copy_prompts[c], p);
        submit(e, p, n, 2 * NTOK, RLAI_SPEC_DRAFT, &on);
        run_until_idle(e);
        submit(only, p, n, 2 * NTOK, RLAI_SPEC_DRAFT, &on_only);
        run_until_idle(only);
        ck_assert(on.done && on.status == 0 && on.n == 2 * NTOK);
        ck_assert(on_only.done && on_only.status == 0 && on_only.n == 2 * NTOK);
        /* the draft model alone gives the plain output (a_different_draft_...),
         * so the two must agree token for token */
        ck_assert_msg(memcmp(on.toks, on_only.toks, sizeof(rlai_token) * 2 * NTOK) == 0,
                      "prompt %d: output with lookup beside the draft model differs from the draft model's", c);
        ck_assert_int_le(on.m.lookup_tokens, on.m.drafted_tokens);
        ck_assert_int_le(on.m.accepted_tokens, on.m.drafted_tokens);
        ck_assert_int_eq(on_only.m.lookup_tokens, 0);
        acc += on.m.accepted_tokens;
        acc_only += on_only.m.accepted_tokens;
        lookup += on.m.lookup_tokens;
    }
    /* measured: 22 tokens drafted by lookup, 23 accepted against 0 */
    ck_assert_int_ge(lookup, 8);
    ck_assert_msg(acc >= 8 && acc > acc_only, "accepted with lookup %ld, draft model only %ld", acc, acc_only);
    rlai_engine_close(only);
    rlai_engine_close(e);
}
END_TEST

START_TEST(bad_drafts_are_refused_with_a_reason)
{
    rlai_engine *e = NULL;
    char err[768] = "";
    ck_assert_int_eq(open_with(BADVOCAB, RLAI_SPEC_AUTO, 0, 0, &e, err, sizeof(err)), RLAI_ERR_INVALID_ARG);
    ck_assert_ptr_null(e);
    ck_assert_msg(strstr(err, "tokenizer is not the model's") && strstr(err, "token 300 differs"), "%s", err);
    err[0] = '\0';
    ck_assert_int_eq(open_with(RLAI_DRAFT_DATA "/missing.gguf", RLAI_SPEC_AUTO, 0, 0, &e, err, sizeof(err)),
                     RLAI_ERR_IO);
    ck_assert_msg(strstr(err, "draft model") && strstr(err, "missing.gguf"), "%s", err);
    /* a file that is not a model at all */
    err[0] = '\0';
    ck_assert_int_lt(open_with(RLAI_TESTDATA "/README.md", RLAI_SPEC_AUTO, 0, 0, &e, err, sizeof(err)), 0);
    ck_assert_ptr_nonnull(strstr(err, "draft model"));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("draft");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 1200);
    tcase_add_test(tc, bad_drafts_are_refused_with_a_reason);
    tcase_add_test(tc, draft_equal_to_the_target_is_accepted_in_full);
    tcase_add_test(tc, a_different_draft_is_verified_and_rolled_back);
    tcase_add_test(tc, rollback_keeps_the_draft_cache_consistent);
    tcase_add_test(tc, drafts_under_continuous_batching);
    tcase_add_test(tc, auto_uses_the_draft_model_greedy_and_sampled);
    tcase_add_test(tc, repeated_text_is_drafted_by_lookup_beside_the_draft_model);
    tcase_add_test(tc, random_requests_end_the_same_with_the_draft_model);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
