/* test_kv_cache.c - paged KV block pool: allocation, reference counts,
 * block tables, exhaustion, addressing; prefix cache: reuse, dedup,
 * collisions, LRU eviction, pins, copy-on-write, fork, and a randomized
 * run checked against the invariant checker and per-position markers. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "kv_cache.h"
#include "rlai/engine.h"

START_TEST(alloc_free_all)
{
    rlai_kv_cache *kv;
    ck_assert_int_eq(rlai_kv_cache_new(2, 8, 10, RLAI_DT_F16, &kv), 0);
    ck_assert_int_eq(rlai_kv_cache_n_free(kv), 10);
    int ids[10];
    bool seen[10] = { 0 };
    for (int i = 0; i < 10; i++) {
        ids[i] = rlai_kv_block_alloc(kv);
        ck_assert_int_ge(ids[i], 0);
        ck_assert_int_lt(ids[i], 10);
        ck_assert(!seen[ids[i]]);
        seen[ids[i]] = true;
        ck_assert_int_eq(rlai_kv_block_refcount(kv, ids[i]), 1);
    }
    ck_assert_int_eq(rlai_kv_block_alloc(kv), RLAI_ERR_KV_FULL);
    rlai_kv_block_ref(kv, ids[3]);
    rlai_kv_block_unref(kv, ids[3]);
    ck_assert_int_eq(rlai_kv_cache_n_free(kv), 0);   /* still referenced once */
    rlai_kv_block_unref(kv, ids[3]);
    ck_assert_int_eq(rlai_kv_cache_n_free(kv), 1);
    rlai_kv_block_unref(kv, ids[3]);                  /* double free is ignored */
    ck_assert_int_eq(rlai_kv_cache_n_free(kv), 1);
    ck_assert_int_eq(rlai_kv_block_alloc(kv), ids[3]);
    for (int i = 0; i < 10; i++)
        rlai_kv_block_unref(kv, ids[i]);
    ck_assert_int_eq(rlai_kv_cache_n_free(kv), 10);
    rlai_kv_cache_free(kv);
}
END_TEST

START_TEST(seq_reserve_and_release)
{
    rlai_kv_cache *kv;
    ck_assert_int_eq(rlai_kv_cache_new(1, 4, 8, RLAI_DT_F32, &kv), 0);
    rlai_kv_seq a, b;
    memset(&a, 0, sizeof(a));
    memset(&b, 0, sizeof(b));
    ck_assert_int_eq(rlai_kv_seq_reserve(kv, &a, 1), 0);
    ck_assert_int_eq(a.n_blocks, 1);
    ck_assert_int_eq(rlai_kv_seq_reserve(kv, &a, 16), 0);
    ck_assert_int_eq(a.n_blocks, 1);
    ck_assert_int_eq(rlai_kv_seq_reserve(kv, &a, 17), 0);
    ck_assert_int_eq(a.n_blocks, 2);
    ck_assert_int_eq(rlai_kv_seq_reserve(kv, &b, 16 * 6), 0);
    ck_assert_int_eq(rlai_kv_cache_n_free(kv), 0);
    /* Exhaustion leaves the table untouched. */
    ck_assert_int_eq(rlai_kv_seq_reserve(kv, &a, 16 * 3), RLAI_ERR_KV_FULL);
    ck_assert_int_eq(a.n_blocks, 2);
    rlai_kv_seq_release(kv, &b);
    ck_assert_int_eq(b.n_blocks, 0);
    ck_assert_ptr_null(b.blocks);
    ck_assert_int_eq(rlai_kv_cache_n_free(kv), 6);
    ck_assert_int_eq(rlai_kv_seq_reserve(kv, &a, 16 * 8), 0);
    ck_assert_int_eq(rlai_kv_cache_n_free(kv), 0);
    rlai_kv_seq_release(kv, &a);
    ck_assert_int_eq(rlai_kv_cache_n_free(kv), 8);
    rlai_kv_cache_free(kv);
}
END_TEST

START_TEST(addressing_is_disjoint)
{
    /* Two sequences write distinct values at every position of two layers;
     * everything reads back, so no two (seq, layer, pos) share storage. */
    rlai_kv_cache *kv;
    const int D = 6, L = 2, N = 40;
    ck_assert_int_eq(rlai_kv_cache_new(L, D, 8, RLAI_DT_F32, &kv), 0);
    rlai_kv_seq s[2];
    memset(s, 0, sizeof(s));
    ck_assert_int_eq(rlai_kv_seq_reserve(kv, &s[0], N), 0);
    ck_assert_int_eq(rlai_kv_seq_reserve(kv, &s[1], N), 0);
    for (int q = 0; q < 2; q++)
        for (int l = 0; l < L; l++)
            for (int p = 0; p < N; p++) {
                float *k = rlai_kv_k_at(kv, &s[q], l, p), *v = rlai_kv_v_at(kv, &s[q], l, p);
                for (int d = 0; d < D; d++) {
                    k[d] = (float)(q * 100000 + l * 10000 + p * 10 + d);
                    v[d] = -k[d];
                }
            }
    for (int q = 0; q < 2; q++)
        for (int l = 0; l < L; l++)
            for (int p = 0; p < N; p++) {
                float *k = rlai_kv_k_at(kv, &s[q], l, p), *v = rlai_kv_v_at(kv, &s[q], l, p);
                for (int d = 0; d < D; d++) {
                    ck_assert_float_eq(k[d], (float)(q * 100000 + l * 10000 + p * 10 + d));
                    ck_assert_float_eq(v[d], -k[d]);
                }
            }
    rlai_kv_seq_release(kv, &s[0]);
    rlai_kv_seq_release(kv, &s[1]);
    rlai_kv_cache_free(kv);
}
END_TEST

START_TEST(random_ops_keep_counts_consistent)
{
    /* Random reserve/release over several sequences: the free count always
     * equals the pool minus the blocks held by tables, and every held block
     * has refcount 1. */
    rlai_kv_cache *kv;
    const int NB = 64, NS = 6;
    ck_assert_int_eq(rlai_kv_cache_new(1, 2, NB, RLAI_DT_F16, &kv), 0);
    rlai_kv_seq s[6];
    memset(s, 0, sizeof(s));
    unsigned rng = 12345;
    for (int step = 0; step < 5000; step++) {
        rng = rng * 1103515245u + 12345u;
        int q = (int)((rng >> 16) % NS);
        int op = (int)((rng >> 8) % 4);
        if (op == 0) {
            rlai_kv_seq_release(kv, &s[q]);
        } else {
            int want = s[q].n_tokens + (int)((rng >> 4) % 40);
            if (rlai_kv_seq_reserve(kv, &s[q], want) == 0)
                s[q].n_tokens = want;
        }
        int held = 0;
        for (int i = 0; i < NS; i++) {
            held += s[i].n_blocks;
            for (int j = 0; j < s[i].n_blocks; j++)
                ck_assert_int_eq(rlai_kv_block_refcount(kv, s[i].blocks[j]), 1);
        }
        ck_assert_int_eq(rlai_kv_cache_n_free(kv), NB - held);
    }
    for (int i = 0; i < NS; i++)
        rlai_kv_seq_release(kv, &s[i]);
    ck_assert_int_eq(rlai_kv_cache_n_free(kv), NB);
    rlai_kv_cache_free(kv);
}
END_TEST

START_TEST(q8_0_rows_are_addressed_by_row_bytes)
{
    rlai_kv_cache *kv;
    /* kv_dim 64 = 2 blocks of 34 bytes per token row. */
    ck_assert_int_eq(rlai_kv_cache_new(2, 64, 4, RLAI_DT_Q8_0, &kv), 0);
    ck_assert_uint_eq(rlai_kv_cache_bytes(kv), 2u * 2 * 4 * 16 * 68);
    rlai_kv_seq s;
    memset(&s, 0, sizeof(s));
    ck_assert_int_eq(rlai_kv_seq_reserve(kv, &s, 20), 0);
    char *r0 = rlai_kv_k_at(kv, &s, 1, 0), *r1 = rlai_kv_k_at(kv, &s, 1, 1);
    ck_assert_int_eq((int)(r1 - r0), 68);
    float x[64], y[64];
    for (int i = 0; i < 64; i++)
        x[i] = (float)i / 8.0f - 4.0f;
    rlai_quantize_row(RLAI_DT_Q8_0, x, rlai_kv_v_at(kv, &s, 0, 17), 64);
    rlai_dequantize_row(RLAI_DT_Q8_0, rlai_kv_v_at(kv, &s, 0, 17), y, 64);
    for (int i = 0; i < 64; i++)
        ck_assert(fabsf(x[i] - y[i]) <= 4.0f / 127.0f);
    rlai_kv_seq_release(kv, &s);
    /* kv_dim not a multiple of 32 cannot be q8_0. */
    rlai_kv_cache_free(kv);
    ck_assert_int_eq(rlai_kv_cache_new(2, 48, 4, RLAI_DT_Q8_0, &kv), RLAI_ERR_UNSUPPORTED);
}
END_TEST

START_TEST(bad_arguments)
{
    rlai_kv_cache *kv = (rlai_kv_cache *)1;
    ck_assert_int_eq(rlai_kv_cache_new(0, 8, 8, RLAI_DT_F16, &kv), RLAI_ERR_INVALID_ARG);
    ck_assert_ptr_null(kv);
    ck_assert_int_eq(rlai_kv_cache_new(1, 8, 8, RLAI_DT_Q4_0, &kv), RLAI_ERR_UNSUPPORTED);
    ck_assert_int_eq(rlai_kv_cache_new(1, 8, 8, RLAI_DT_F16, &kv), 0);
    ck_assert_uint_eq(rlai_kv_cache_bytes(kv), 2u * 8 * 16 * 8 * 2);
    rlai_kv_seq s;
    memset(&s, 0, sizeof(s));
    ck_assert_int_eq(rlai_kv_seq_reserve(kv, &s, -1), RLAI_ERR_INVALID_ARG);
    rlai_kv_cache_free(kv);
}
END_TEST

/* ------------------------------------------------------------------
 * Prefix cache. All these use f32 KV, 2 layers of kv_dim 4, so positions
 * can be written with exact marker values and read back. */

/* Test-only hook of kv_cache.c (see there): the block-key hash used by
 * caches created while it is set. */
extern uint64_t (*rlai_kv_test_hash_hook)(uint64_t parent_key, const int32_t *tokens);

#define PL 2 /* layers */
#define PD 4 /* kv_dim */

/* The K value every sequence must see at (layer l, element d) of position
 * pos holding token tok; V is this + 0.5. Exact in f32 for tok < 10000,
 * pos < 1000. */
static float kval(int32_t tok, int pos, int l, int d)
{
    return (float)(((tok % 10000) * 131 + pos) * 8 + l * PD + d);
}

static void write_range(rlai_kv_cache *kv, const rlai_kv_seq *s, const int32_t *tok, int p0, int p1)
{
    for (int p = p0; p < p1; p++)
        for (int l = 0; l < PL; l++) {
            float *k = rlai_kv_k_at(kv, s, l, p), *v = rlai_kv_v_at(kv, s, l, p);
            for (int d = 0; d < PD; d++) {
                k[d] = kval(tok[p], p, l, d);
                v[d] = kval(tok[p], p, l, d) + 0.5f;
            }
        }
}

/* First position in [0, n) whose K/V differ from the markers, or -1. */
static int first_bad(rlai_kv_cache *kv, const rlai_kv_seq *s, const int32_t *tok, int n)
{
    for (int p = 0; p < n; p++)
        for (int l = 0; l < PL; l++) {
            const float *k = rlai_kv_k_at(kv, s, l, p), *v = rlai_kv_v_at(kv, s, l, p);
            for (int d = 0; d < PD; d++)
                if (k[d] != kval(tok[p], p, l, d) || v[d] != kval(tok[p], p, l, d) + 0.5f)
                    return p;
        }
    return -1;
}

static void assert_consistent(const rlai_kv_cache *kv, rlai_kv_seq *const *seqs, int n)
{
    char err[256];
    int rc = rlai_kv_cache_check(kv, seqs, n, err, sizeof(err));
    ck_assert_msg(rc == 0, "kv check: %s", err);
}

/* The engine's flow for a prompt: attach what is cached (leaving at least
 * one token to compute), compute the rest, commit. Returns tokens reused. */
static int run_prompt(rlai_kv_cache *kv, rlai_kv_seq *s, const int32_t *tok, int n)
{
    int m = rlai_kv_prefix_attach(kv, s, tok, n, n - 1);
    ck_assert_int_ge(m, 0);
    ck_assert_int_eq(rlai_kv_seq_prepare_write(kv, s, m, n), 0);
    write_range(kv, s, tok, m, n);
    s->n_tokens = n;
    rlai_kv_prefix_commit(kv, s, tok, n);
    ck_assert_int_eq(first_bad(kv, s, tok, n), -1);
    return m;
}

static rlai_kv_cache *new_cache(int n_blocks)
{
    rlai_kv_cache *kv;
    ck_assert_int_eq(rlai_kv_cache_new(PL, PD, n_blocks, RLAI_DT_F32, &kv), 0);
    return kv;
}

static void fill_tokens(int32_t *t, int n, int32_t base)
{
    for (int i = 0; i < n; i++)
        t[i] = base + i;
}

START_TEST(prefix_same_prompt_reuses_full_blocks)
{
    rlai_kv_cache *kv = new_cache(16);
    int32_t tok[40];
    fill_tokens(tok, 40, 100);
    rlai_kv_seq a = { 0 }, b = { 0 }, c = { 0 };
    ck_assert_int_eq(run_prompt(kv, &a, tok, 40), 0);
    ck_assert_int_eq(a.n_committed, 2);
    ck_assert(a.last_key != 0);
    ck_assert_int_eq(run_prompt(kv, &b, tok, 40), 32);
    ck_assert_int_eq(b.n_committed, 2);
    ck_assert_int_eq(b.blocks[0], a.blocks[0]);
    ck_assert_int_eq(b.blocks[1], a.blocks[1]);
    ck_assert_int_ne(b.blocks[2], a.blocks[2]);   /* partial block stays private */
    ck_assert(b.last_key == a.last_key);
    ck_assert_int_eq(rlai_kv_block_refcount(kv, a.blocks[0]), 2);
    rlai_kv_seq *all[] = { &a, &b };
    assert_consistent(kv, all, 2);
    ck_assert_int_eq(first_bad(kv, &a, tok, 40), -1);

    rlai_kv_stats st;
    rlai_kv_cache_stats(kv, &st);
    ck_assert_uint_eq(st.lookups, 2);
    ck_assert_uint_eq(st.tokens_reused, 32);
    ck_assert_int_eq(st.blocks_used, 4);
    ck_assert_int_eq(st.blocks_free, 12);

    rlai_kv_seq_release(kv, &a);
    rlai_kv_seq_release(kv, &b);
    rlai_kv_cache_stats(kv, &st);
    ck_assert_int_eq(st.blocks_used, 0);
    ck_assert_int_eq(st.blocks_cached, 2);
    ck_assert_int_eq(st.blocks_free, 14);
    ck_assert_int_eq(rlai_kv_cache_n_free(kv), 16);   /* cached blocks are allocatable */
    assert_consistent(kv, NULL, 0);

    /* A whole-prompt match when max_tokens allows it; max_tokens rounds
     * down to whole blocks. */
    ck_assert_int_eq(rlai_kv_prefix_attach(kv, &c, tok, 32, 32), 32);
    ck_assert_int_eq(c.n_tokens, 32);
    ck_assert_int_eq(first_bad(kv, &c, tok, 32), -1);
    ck_assert_int_eq(rlai_kv_prefix_attach(kv, &c, tok, 32, 32), RLAI_ERR_INVALID_ARG); /* not empty */
    rlai_kv_seq_release(kv, &c);
    ck_assert_int_eq(rlai_kv_prefix_attach(kv, &c, tok, 40, 31), 16);
    ck_assert_int_eq(c.n_committed, 1);
    rlai_kv_seq_release(kv, &c);
    ck_assert_int_eq(rlai_kv_prefix_attach(kv, &c, tok, 15, 40), 0);
    rlai_kv_seq_release(kv, &c);
    rlai_kv_cache_free(kv);
}
END_TEST

START_TEST(prefix_commit_dedups_concurrent_blocks)
{
    rlai_kv_cache *kv = new_cache(16);
    int32_t tok[36];
    fill_tokens(tok, 36, 7);
    rlai_kv_seq a = { 0 }, b = { 0 };
    /* Both compute the prompt before either commits. */
    ck_assert_int_eq(rlai_kv_prefix_attach(kv, &a, tok, 36, 35), 0);
    ck_assert_int_eq(rlai_kv_prefix_attach(kv, &b, tok, 36, 35), 0);
    ck_assert_int_eq(rlai_kv_seq_prepare_write(kv, &a, 0, 36), 0);
    ck_assert_int_eq(rlai_kv_seq_prepare_write(kv, &b, 0, 36), 0);
    write_range(kv, &a, tok, 0, 36);
    write_range(kv, &b, tok, 0, 36);
    a.n_tokens = b.n_tokens = 36;
    ck_assert_int_eq(rlai_kv_cache_n_free(kv), 10);
    rlai_kv_prefix_commit(kv, &a, tok, 36);
    rlai_kv_prefix_commit(kv, &b, tok, 36);
    ck_assert_int_eq(b.n_committed, 2);
    ck_assert_int_eq(b.blocks[0], a.blocks[0]);
    ck_assert_int_eq(b.blocks[1], a.blocks[1]);
    ck_assert_int_ne(b.blocks[2], a.blocks[2]);
    ck_assert_int_eq(rlai_kv_cache_n_free(kv), 12);   /* b's two copies went back */
    ck_assert_int_eq(first_bad(kv, &b, tok, 36), -1);
    rlai_kv_seq *all[] = { &a, &b };
    assert_consistent(kv, all, 2);
    /* Committing again is a no-op. */
    rlai_kv_prefix_commit(kv, &b, tok, 36);
    assert_consistent(kv, all, 2);
    rlai_kv_seq_release(kv, &a);
    rlai_kv_seq_release(kv, &b);
    assert_consistent(kv, NULL, 0);
    rlai_kv_cache_free(kv);
}
END_TEST

START_TEST(prefix_shares_only_common_blocks)
{
    rlai_kv_cache *kv = new_cache(16);
    int32_t p[48], q[48];
    fill_tokens(p, 48, 300);
    memcpy(q, p, sizeof(q));
    q[20] = 9999;                      /* differs in block 1 only */
    rlai_kv_seq a = { 0 }, b = { 0 };
    ck_assert_int_eq(run_prompt(kv, &a, p, 48), 0);
    ck_assert_int_eq(a.n_committed, 3);
    ck_assert_int_eq(run_prompt(kv, &b, q, 48), 16);
    ck_assert_int_eq(b.n_committed, 3);
    ck_assert_int_eq(b.blocks[0], a.blocks[0]);
    ck_assert_int_ne(b.blocks[1], a.blocks[1]);
    ck_assert_int_ne(b.blocks[2], a.blocks[2]);   /* same tokens, different parent */
    ck_assert(b.last_key != a.last_key);
    rlai_kv_seq *all[] = { &a, &b };
    assert_consistent(kv, all, 2);
    ck_assert_int_eq(first_bad(kv, &a, p, 48), -1);
    ck_assert_int_eq(first_bad(kv, &b, q, 48), -1);
    rlai_kv_seq_release(kv, &a);
    rlai_kv_seq_release(kv, &b);
    rlai_kv_cache_free(kv);
}
END_TEST

static uint64_t constant_hash(uint64_t parent_key, const int32_t *tokens)
{
    (void)parent_key;
    (void)tokens;
    return 42;
}

START_TEST(prefix_forced_collision_never_matches_other_prompt)
{
    rlai_kv_test_hash_hook = constant_hash;
    rlai_kv_cache *kv = new_cache(16);
    rlai_kv_test_hash_hook = NULL;      /* the cache keeps its hash */
    int32_t p[32], q[32];
    fill_tokens(p, 32, 500);
    memcpy(q, p, sizeof(q));
    q[3] = 1;                           /* block 0 differs, block 1 equal */
    rlai_kv_seq a = { 0 }, b = { 0 }, c = { 0 };
    ck_assert_int_eq(run_prompt(kv, &a, p, 32), 0);
    ck_assert_int_eq(a.last_key, 42);
    ck_assert_int_eq(rlai_kv_prefix_attach(kv, &b, q, 32, 32), 0);
    ck_assert_int_eq(rlai_kv_seq_prepare_write(kv, &b, 0, 32), 0);
    write_range(kv, &b, q, 0, 32);
    b.n_tokens = 32;
    rlai_kv_prefix_commit(kv, &b, q, 32);
    ck_assert_int_eq(b.n_committed, 2);
    /* Every key collides, parent keys included: the blocks stay apart. */
    ck_assert_int_ne(b.blocks[0], a.blocks[0]);
    ck_assert_int_ne(b.blocks[1], a.blocks[1]);
    rlai_kv_seq *all[] = { &a, &b };
    assert_consistent(kv, all, 2);
    rlai_kv_seq_release(kv, &a);
    rlai_kv_seq_release(kv, &b);
    /* Both prompts still find exactly their own chains. */
    ck_assert_int_eq(rlai_kv_prefix_attach(kv, &c, q, 32, 32), 32);
    ck_assert_int_eq(first_bad(kv, &c, q, 32), -1);
    rlai_kv_seq_release(kv, &c);
    ck_assert_int_eq(rlai_kv_prefix_attach(kv, &c, p, 32, 32), 32);
    ck_assert_int_eq(first_bad(kv, &c, p, 32), -1);
    rlai_kv_seq_release(kv, &c);
    int32_t r[32];
    memcpy(r, p, sizeof(r));
    r[31] = 2;
    ck_assert_int_eq(rlai_kv_prefix_attach(kv, &c, r, 32, 32), 16);
    rlai_kv_seq_release(kv, &c);
    assert_consistent(kv, NULL, 0);
    rlai_kv_cache_free(kv);
}
END_TEST

START_TEST(prefix_caching_off_matches_nothing)
{
    rlai_kv_cache *kv = new_cache(16);
    int32_t tok[40];
    fill_tokens(tok, 40, 1);
    rlai_kv_seq a = { 0 }, b = { 0 };
    rlai_kv_cache_set_prefix_caching(kv, false);
    ck_assert_int_eq(run_prompt(kv, &a, tok, 40), 0);
    ck_assert_int_eq(a.n_committed, 0);
    rlai_kv_seq_release(kv, &a);
    rlai_kv_stats st;
    rlai_kv_cache_stats(kv, &st);
    ck_assert_int_eq(st.blocks_cached, 0);
    ck_assert_int_eq(st.blocks_free, 16);

    rlai_kv_cache_set_prefix_caching(kv, true);
    ck_assert_int_eq(run_prompt(kv, &a, tok, 40), 0);
    rlai_kv_seq_release(kv, &a);
    rlai_kv_cache_set_prefix_caching(kv, false);
    ck_assert_int_eq(run_prompt(kv, &b, tok, 40), 0);      /* cached but off */
    rlai_kv_seq_release(kv, &b);
    rlai_kv_cache_set_prefix_caching(kv, true);
    ck_assert_int_eq(run_prompt(kv, &b, tok, 40), 32);
    rlai_kv_seq_release(kv, &b);
    rlai_kv_cache_stats(kv, &st);
    ck_assert_uint_eq(st.lookups, 4);
    ck_assert_uint_eq(st.tokens_reused, 32);
    assert_consistent(kv, NULL, 0);
    rlai_kv_cache_free(kv);
}
END_TEST

START_TEST(prefix_eviction_is_lru)
{
    rlai_kv_cache *kv = new_cache(4);
    int32_t t[3][16];
    int id[3];
    rlai_kv_seq s = { 0 };
    for (int i = 0; i < 3; i++) {
        fill_tokens(t[i], 16, 1000 * (i + 1));
        ck_assert_int_eq(run_prompt(kv, &s, t[i], 16), 0);
        id[i] = s.blocks[0];
        rlai_kv_seq_release(kv, &s);            /* LRU: 0, 1, 2 */
    }
    ck_assert_int_eq(rlai_kv_prefix_attach(kv, &s, t[0], 16, 16), 16);
    rlai_kv_seq_release(kv, &s);                /* LRU: 1, 2, 0 */
    ck_assert_int_eq(rlai_kv_cache_n_free(kv), 4);
    int h[4];
    h[0] = rlai_kv_block_alloc(kv);             /* the free one, no eviction */
    ck_assert_int_ge(h[0], 0);
    rlai_kv_stats st;
    rlai_kv_cache_stats(kv, &st);
    ck_assert_uint_eq(st.evictions, 0);
    h[1] = rlai_kv_block_alloc(kv);
    h[2] = rlai_kv_block_alloc(kv);
    h[3] = rlai_kv_block_alloc(kv);
    ck_assert_int_eq(h[1], id[1]);
    ck_assert_int_eq(h[2], id[2]);
    ck_assert_int_eq(h[3], id[0]);
    ck_assert_int_eq(rlai_kv_block_alloc(kv), RLAI_ERR_KV_FULL);
    rlai_kv_cache_stats(kv, &st);
    ck_assert_uint_eq(st.evictions, 3);
    ck_assert_int_eq(st.blocks_cached, 0);
    ck_assert_int_eq(rlai_kv_prefix_attach(kv, &s, t[0], 16, 16), 0); /* evicted: gone */
    rlai_kv_seq_release(kv, &s);
    for (int i = 0; i < 4; i++)
        rlai_kv_block_unref(kv, h[i]);
    ck_assert_int_eq(rlai_kv_cache_n_free(kv), 4);

    /* A released prefix loses its deepest blocks first. */
    int32_t long_t[64];
    fill_tokens(long_t, 64, 5);
    ck_assert_int_eq(run_prompt(kv, &s, long_t, 64), 0);
    int32_t ids[4];
    memcpy(ids, s.blocks, sizeof(ids));
    rlai_kv_seq_release(kv, &s);
    for (int i = 3; i >= 0; i--) {
        ck_assert_int_eq(rlai_kv_block_alloc(kv), ids[i]);
        ck_assert_int_eq(rlai_kv_prefix_attach(kv, &s, long_t, 64, 64), 16 * i);
        rlai_kv_seq_release(kv, &s);
    }
    for (int i = 0; i < 4; i++)
        rlai_kv_block_unref(kv, ids[i]);
    assert_consistent(kv, NULL, 0);
    rlai_kv_cache_free(kv);
}
END_TEST

START_TEST(prefix_pins_survive_pressure)
{
    rlai_kv_cache *kv = new_cache(6);
    int32_t tok[40];
    fill_tokens(tok, 40, 77);
    rlai_kv_seq s = { 0 };
    ck_assert_int_eq(run_prompt(kv, &s, tok, 40), 0);
    ck_assert_int_eq(rlai_kv_prefix_pin(kv, tok, 40), 32);   /* pinned while in use */
    rlai_kv_seq_release(kv, &s);
    ck_assert_int_eq(rlai_kv_prefix_pin(kv, tok, 40), 32);   /* nests */
    rlai_kv_stats st;
    rlai_kv_cache_stats(kv, &st);
    ck_assert_int_eq(st.blocks_pinned, 2);
    ck_assert_int_eq(st.blocks_cached, 2);
    ck_assert_int_eq(rlai_kv_cache_n_free(kv), 4);           /* pinned ones are not allocatable */

    int32_t held[6];
    rlai_kv_seq press = { held, 0, 6, 0, 0, 0 };
    for (int i = 0; i < 4; i++)
        held[press.n_blocks++] = rlai_kv_block_alloc(kv);
    ck_assert_int_eq(rlai_kv_block_alloc(kv), RLAI_ERR_KV_FULL);
    rlai_kv_seq *all[] = { &press };
    assert_consistent(kv, all, 1);
    ck_assert_int_eq(rlai_kv_prefix_attach(kv, &s, tok, 40, 40), 32);
    ck_assert_int_eq(first_bad(kv, &s, tok, 32), -1);
    rlai_kv_seq_release(kv, &s);

    ck_assert_int_eq(rlai_kv_prefix_unpin(kv, tok, 32), 32);
    ck_assert_int_eq(rlai_kv_block_alloc(kv), RLAI_ERR_KV_FULL); /* still pinned once */
    ck_assert_int_eq(rlai_kv_prefix_unpin(kv, tok, 32), 32);
    ck_assert_int_eq(rlai_kv_prefix_unpin(kv, tok, 32), 0);      /* nothing left to undo */
    rlai_kv_cache_stats(kv, &st);
    ck_assert_int_eq(st.blocks_pinned, 0);
    ck_assert_int_eq(rlai_kv_cache_n_free(kv), 2);
    assert_consistent(kv, all, 1);
    /* Now evictable, deepest first. */
    int b1 = rlai_kv_block_alloc(kv);
    ck_assert_int_ge(b1, 0);
    ck_assert_int_eq(rlai_kv_prefix_attach(kv, &s, tok, 40, 40), 16);
    rlai_kv_seq_release(kv, &s);
    held[press.n_blocks++] = b1;
    held[press.n_blocks++] = rlai_kv_block_alloc(kv);
    ck_assert_int_ge(held[5], 0);
    ck_assert_int_eq(rlai_kv_prefix_pin(kv, tok, 40), 0);
    assert_consistent(kv, all, 1);
    for (int i = 0; i < press.n_blocks; i++)
        rlai_kv_block_unref(kv, held[i]);
    ck_assert_int_eq(rlai_kv_cache_n_free(kv), 6);
    rlai_kv_cache_free(kv);
}
END_TEST

START_TEST(prefix_prepare_write_copies_shared_block)
{
    rlai_kv_cache *kv = new_cache(16);
    int32_t tok[32], tok2[32];
    fill_tokens(tok, 32, 40);
    rlai_kv_seq a = { 0 }, b = { 0 };
    ck_assert_int_eq(run_prompt(kv, &a, tok, 32), 0);
    ck_assert_int_eq(rlai_kv_prefix_attach(kv, &b, tok, 32, 32), 32);
    int32_t shared1 = a.blocks[1];
    ck_assert_int_eq(rlai_kv_seq_prepare_write(kv, &b, 20, 24), 0);
    ck_assert_int_eq(b.blocks[0], a.blocks[0]);
    ck_assert_int_ne(b.blocks[1], shared1);
    ck_assert_int_eq(a.blocks[1], shared1);
    ck_assert_int_eq(b.n_committed, 1);
    ck_assert(b.last_key != 0 && b.last_key != a.last_key);
    ck_assert_int_eq(rlai_kv_block_refcount(kv, b.blocks[1]), 1);
    ck_assert_int_eq(first_bad(kv, &b, tok, 32), -1);           /* copy is identical */
    rlai_kv_seq *all[] = { &a, &b };
    assert_consistent(kv, all, 2);
    memcpy(tok2, tok, sizeof(tok2));
    for (int p = 20; p < 24; p++)
        tok2[p] = 4000 + p;
    write_range(kv, &b, tok2, 20, 24);
    ck_assert_int_eq(first_bad(kv, &b, tok2, 32), -1);
    ck_assert_int_eq(first_bad(kv, &a, tok, 32), -1);           /* original unchanged */
    /* Re-committing b registers its new block 1 under its new tokens. */
    rlai_kv_prefix_commit(kv, &b, tok2, 32);
    ck_assert_int_eq(b.n_committed, 2);
    assert_consistent(kv, all, 2);

    /* A private but registered block is copied too (it stays cached). */
    rlai_kv_seq_release(kv, &b);
    ck_assert_int_eq(rlai_kv_block_refcount(kv, a.blocks[1]), 1);
    ck_assert_int_eq(rlai_kv_seq_prepare_write(kv, &a, 31, 32), 0);
    ck_assert_int_ne(a.blocks[1], shared1);
    ck_assert_int_eq(a.n_committed, 1);
    assert_consistent(kv, all, 1);
    ck_assert_int_eq(first_bad(kv, &a, tok, 32), -1);
    ck_assert_int_eq(rlai_kv_prefix_attach(kv, &b, tok, 32, 32), 32);
    ck_assert_int_eq(b.blocks[1], shared1);
    ck_assert_int_eq(rlai_kv_seq_prepare_write(kv, &b, 0, 0), 0);   /* empty range */
    assert_consistent(kv, all, 2);
    rlai_kv_seq_release(kv, &a);
    rlai_kv_seq_release(kv, &b);
    rlai_kv_cache_free(kv);
}
END_TEST

START_TEST(prefix_fork_then_write_partial_block)
{
    rlai_kv_cache *kv = new_cache(16);
    int32_t ta[24], tb[24];
    fill_tokens(ta, 24, 60);
    rlai_kv_seq a = { 0 }, b = { 0 };
    ck_assert_int_eq(run_prompt(kv, &a, ta, 20), 0);
    ck_assert_int_eq(a.n_committed, 1);
    ck_assert_int_eq(rlai_kv_seq_fork(kv, &a, &b), 0);
    ck_assert_int_eq(rlai_kv_seq_fork(kv, &a, &b), RLAI_ERR_INVALID_ARG);
    ck_assert_int_eq(b.n_tokens, 20);
    ck_assert_int_eq(b.n_committed, 1);
    ck_assert(b.last_key == a.last_key);
    ck_assert_int_eq(rlai_kv_block_refcount(kv, a.blocks[1]), 2);
    rlai_kv_seq *all[] = { &a, &b };
    assert_consistent(kv, all, 2);
    memcpy(tb, ta, sizeof(tb));
    tb[20] = 8888;
    int32_t partial = a.blocks[1];
    ck_assert_int_eq(rlai_kv_seq_prepare_write(kv, &b, 20, 21), 0);
    ck_assert_int_ne(b.blocks[1], partial);
    ck_assert_int_eq(b.blocks[0], a.blocks[0]);
    ck_assert_int_eq(b.n_committed, 1);          /* block 0 untouched */
    write_range(kv, &b, tb, 20, 21);
    b.n_tokens = 21;
    ck_assert_int_eq(rlai_kv_seq_prepare_write(kv, &a, 20, 21), 0);
    ck_assert_int_eq(a.blocks[1], partial);      /* now private: no copy */
    write_range(kv, &a, ta, 20, 21);
    a.n_tokens = 21;
    ck_assert_int_eq(first_bad(kv, &a, ta, 21), -1);
    ck_assert_int_eq(first_bad(kv, &b, tb, 21), -1);
    assert_consistent(kv, all, 2);
    rlai_kv_seq_release(kv, &a);
    rlai_kv_seq_release(kv, &b);
    assert_consistent(kv, NULL, 0);
    rlai_kv_cache_free(kv);
}
END_TEST

static bool same_table(const rlai_kv_seq *s, const int32_t *ids, int n_blocks, int n_committed)
{
    return s->n_blocks == n_blocks && s->n_committed == n_committed &&
           (n_blocks == 0 || memcmp(s->blocks, ids, sizeof(int32_t) * (size_t)n_blocks) == 0);
}

START_TEST(prefix_exhaustion_leaves_tables_intact)
{
    rlai_kv_cache *kv = new_cache(4);
    int32_t tok[64];
    fill_tokens(tok, 64, 11);
    rlai_kv_seq a = { 0 }, b = { 0 }, c = { 0 };
    ck_assert_int_eq(run_prompt(kv, &a, tok, 48), 0);
    ck_assert_int_eq(a.n_committed, 3);
    int32_t ids[3];
    memcpy(ids, a.blocks, sizeof(ids));
    ck_assert_int_eq(rlai_kv_seq_reserve(kv, &b, 32), RLAI_ERR_KV_FULL);
    ck_assert_int_eq(b.n_blocks, 0);
    ck_assert_int_eq(rlai_kv_seq_prepare_write(kv, &b, 0, 32), RLAI_ERR_KV_FULL);
    ck_assert_int_eq(b.n_blocks, 0);
    ck_assert_int_eq(rlai_kv_seq_prepare_write(kv, &a, 40, 70), RLAI_ERR_KV_FULL);
    ck_assert(same_table(&a, ids, 3, 3));
    ck_assert_int_eq(rlai_kv_seq_prepare_write(kv, &a, 47, 49), RLAI_ERR_KV_FULL); /* copy + new */
    ck_assert(same_table(&a, ids, 3, 3));
    ck_assert_int_eq(rlai_kv_seq_fork(kv, &a, &c), 0);
    ck_assert_int_eq(rlai_kv_seq_prepare_write(kv, &c, 0, 48), RLAI_ERR_KV_FULL);
    ck_assert(same_table(&c, ids, 3, 3));
    ck_assert_int_eq(first_bad(kv, &c, tok, 48), -1);
    rlai_kv_seq *all[] = { &a, &b, &c };
    assert_consistent(kv, all, 3);
    ck_assert_int_eq(rlai_kv_seq_prepare_write(kv, &c, 33, 40), 0);  /* one copy fits */
    ck_assert_int_eq(c.n_committed, 2);
    ck_assert_int_ne(c.blocks[2], ids[2]);
    ck_assert_int_eq(rlai_kv_cache_n_free(kv), 0);
    ck_assert_int_eq(rlai_kv_block_alloc(kv), RLAI_ERR_KV_FULL);
    assert_consistent(kv, all, 3);
    ck_assert_int_eq(first_bad(kv, &c, tok, 48), -1);
    rlai_kv_seq_release(kv, &a);
    rlai_kv_seq_release(kv, &c);
    ck_assert_int_eq(rlai_kv_cache_n_free(kv), 4);
    ck_assert_int_eq(rlai_kv_seq_reserve(kv, &b, 64), 0);            /* evicts all */
    rlai_kv_stats st;
    rlai_kv_cache_stats(kv, &st);
    ck_assert_uint_eq(st.evictions, 3);
    assert_consistent(kv, all, 3);
    rlai_kv_seq_release(kv, &b);
    rlai_kv_cache_free(kv);
}
END_TEST

/* Randomized: many sequences over a small pool, drawn from a few token
 * documents that share prefixes, with every operation of the API. After
 * each step the invariant checker runs and every live sequence's KV must
 * hold exactly the markers of its own tokens, and every pinned prefix must
 * still attach in full. */
#define RN_BLOCKS 48
#define RN_DOCS 6
#define RN_DOCLEN 112
#define RN_MAXTOK 160
#define RN_SEQS 8
#define RN_PINS 4

struct rseq {
    bool live;
    int doc;
    rlai_kv_seq s;
    int32_t tok[RN_MAXTOK];
};

struct rpin {
    int doc, n;
};

static uint64_t rn_state;
static uint32_t rn(uint32_t m)
{
    rn_state ^= rn_state << 13;
    rn_state ^= rn_state >> 7;
    rn_state ^= rn_state << 17;
    return (uint32_t)((rn_state >> 11) % m);
}

static int32_t rn_next_token(const int32_t (*docs)[RN_DOCLEN], int doc, int pos)
{
    if (pos < RN_DOCLEN && rn(10) < 8)
        return docs[doc][pos];
    return 1 + (int32_t)rn(40);
}

START_TEST(prefix_randomized_operations)
{
    rn_state = 0x9E3779B97F4A7C15ull;
    rlai_kv_cache *kv = new_cache(RN_BLOCKS);
    static int32_t docs[RN_DOCS][RN_DOCLEN];
    for (int d = 0; d < RN_DOCS; d++) {
        int keep = d ? (int)rn(RN_DOCLEN) : 0;
        int from = d ? (int)rn((uint32_t)d) : 0;
        for (int i = 0; i < RN_DOCLEN; i++)
            docs[d][i] = i < keep ? docs[from][i] : 1 + (int32_t)rn(40);
    }
    static struct rseq sq[RN_SEQS];
    memset(sq, 0, sizeof(sq));
    struct rpin pins[RN_PINS];
    int n_pins = 0;
    int32_t held[RN_BLOCKS];
    rlai_kv_seq press = { held, 0, RN_BLOCKS, 0, 0, 0 };
    int n_full = 0, n_cow = 0, n_forks = 0, n_pinned_ops = 0;
    char err[256];

    for (int step = 0; step < 20000; step++) {
        int op = (int)rn(20);
        int q = (int)rn(RN_SEQS);
        struct rseq *r = &sq[q];
        if (op < 4) {                                    /* start */
            if (r->live)
                continue;
            r->live = true;
            r->doc = (int)rn(RN_DOCS);
            int n = 1 + (int)rn(RN_DOCLEN);
            memcpy(r->tok, docs[r->doc], sizeof(int32_t) * RN_DOCLEN);
            int m = rlai_kv_prefix_attach(kv, &r->s, r->tok, n, n - 1);
            ck_assert_int_ge(m, 0);
            ck_assert_int_eq(m % 16, 0);
            ck_assert_int_lt(m, n);
            ck_assert_int_eq(r->s.n_tokens, m);
            int rc = rlai_kv_seq_prepare_write(kv, &r->s, m, n);
            if (rc == RLAI_ERR_KV_FULL) {
                ck_assert_int_eq(r->s.n_blocks, m / 16);
                ck_assert_int_eq(first_bad(kv, &r->s, r->tok, m), -1);
                n_full++;
                rlai_kv_seq_release(kv, &r->s);
                r->live = false;
            } else {
                ck_assert_int_eq(rc, 0);
                write_range(kv, &r->s, r->tok, m, n);
                r->s.n_tokens = n;
                if (rn(4))
                    rlai_kv_prefix_commit(kv, &r->s, r->tok, n);
            }
        } else if (op < 9) {                             /* extend or rewrite */
            if (!r->live)
                continue;
            int n = r->s.n_tokens;
            int p0 = (op < 7 || n == 0) ? n : (int)rn((uint32_t)n);
            int k = 1 + (int)rn(40);
            if (p0 + k > RN_MAXTOK)
                k = RN_MAXTOK - p0;
            if (k <= 0)
                continue;
            int32_t saved[RN_MAXTOK / 16 + 1];
            int nb = r->s.n_blocks, nc = r->s.n_committed;
            memcpy(saved, r->s.blocks, sizeof(int32_t) * (size_t)nb);
            uint64_t lk = r->s.last_key;
            int rc = rlai_kv_seq_prepare_write(kv, &r->s, p0, p0 + k);
            if (rc == RLAI_ERR_KV_FULL) {
                ck_assert(same_table(&r->s, saved, nb, nc));
                ck_assert(r->s.last_key == lk);
                n_full++;
            } else {
                ck_assert_int_eq(rc, 0);
                for (int i = 0; i < nb && i < r->s.n_blocks; i++)
                    n_cow += saved[i] != r->s.blocks[i];
                for (int p = p0; p < p0 + k; p++)
                    r->tok[p] = rn_next_token((const int32_t (*)[RN_DOCLEN])docs, r->doc, p);
                write_range(kv, &r->s, r->tok, p0, p0 + k);
                r->s.n_tokens = p0 + k;
                if (rn(4))
                    rlai_kv_prefix_commit(kv, &r->s, r->tok, r->s.n_tokens);
            }
        } else if (op < 11) {                            /* fork */
            struct rseq *d = &sq[rn(RN_SEQS)];
            if (!r->live || d->live)
                continue;
            ck_assert_int_eq(rlai_kv_seq_fork(kv, &r->s, &d->s), 0);
            d->live = true;
            d->doc = r->doc;
            memcpy(d->tok, r->tok, sizeof(d->tok));
            n_forks++;
        } else if (op < 13) {                            /* finish / cancel */
            if (!r->live)
                continue;
            if (op == 11)
                rlai_kv_prefix_commit(kv, &r->s, r->tok, r->s.n_tokens);
            rlai_kv_seq_release(kv, &r->s);
            r->live = false;
        } else if (op == 13) {                           /* pin */
            int d = (int)rn(RN_DOCS), n = 1 + (int)rn(RN_DOCLEN);
            int p = rlai_kv_prefix_pin(kv, docs[d], n);
            ck_assert_int_ge(p, 0);
            ck_assert_int_eq(p % 16, 0);
            ck_assert_int_le(p, n);
            if (p > 0 && n_pins < RN_PINS) {
                pins[n_pins++] = (struct rpin){ d, p };
                n_pinned_ops++;
            } else if (p > 0) {
                ck_assert_int_eq(rlai_kv_prefix_unpin(kv, docs[d], p), p);
            }
        } else if (op == 14) {                           /* unpin */
            if (n_pins == 0)
                continue;
            int i = (int)rn((uint32_t)n_pins);
            ck_assert_int_eq(rlai_kv_prefix_unpin(kv, docs[pins[i].doc], pins[i].n), pins[i].n);
            pins[i] = pins[--n_pins];
        } else if (op < 17) {                            /* allocation pressure */
            int want = 1 + (int)rn(12);
            for (int i = 0; i < want; i++) {
                int b = rlai_kv_block_alloc(kv);
                if (b < 0) {
                    ck_assert_int_eq(b, RLAI_ERR_KV_FULL);
                    ck_assert_int_eq(rlai_kv_cache_n_free(kv), 0);
                    break;
                }
                held[press.n_blocks++] = b;
            }
        } else if (op < 19) {                            /* relieve pressure */
            int drop = (int)rn((uint32_t)press.n_blocks + 1);
            while (drop-- > 0)
                rlai_kv_block_unref(kv, held[--press.n_blocks]);
        } else {                                         /* late commit */
            if (r->live)
                rlai_kv_prefix_commit(kv, &r->s, r->tok, r->s.n_tokens);
        }

        rlai_kv_seq *all[RN_SEQS + 1];
        int n_all = 0;
        for (int i = 0; i < RN_SEQS; i++)
            if (sq[i].live)
                all[n_all++] = &sq[i].s;
        all[n_all++] = &press;
        int rc = rlai_kv_cache_check(kv, all, n_all, err, sizeof(err));
        ck_assert_msg(rc == 0, "step %d op %d: %s", step, op, err);
        for (int i = 0; i < RN_SEQS; i++)
            if (sq[i].live) {
                int bad = first_bad(kv, &sq[i].s, sq[i].tok, sq[i].s.n_tokens);
                ck_assert_msg(bad < 0, "step %d op %d: seq %d wrong KV at %d", step, op, i, bad);
            }
        for (int i = 0; i < n_pins; i++) {
            rlai_kv_seq probe = { 0 };
            int m = rlai_kv_prefix_attach(kv, &probe, docs[pins[i].doc], pins[i].n, pins[i].n);
            ck_assert_msg(m == pins[i].n, "step %d: pinned %d tokens, attach finds %d", step,
                          pins[i].n, m);
            ck_assert_int_eq(first_bad(kv, &probe, docs[pins[i].doc], m), -1);
            rlai_kv_seq_release(kv, &probe);
        }
    }

    rlai_kv_stats st;
    rlai_kv_cache_stats(kv, &st);
    ck_assert_uint_gt(st.evictions, 100);
    ck_assert_uint_gt(st.tokens_reused, 1000);
    ck_assert_int_gt(n_full, 10);
    ck_assert_int_gt(n_cow, 10);
    ck_assert_int_gt(n_forks, 10);
    ck_assert_int_gt(n_pinned_ops, 10);

    for (int i = 0; i < RN_SEQS; i++)
        rlai_kv_seq_release(kv, &sq[i].s);
    while (press.n_blocks > 0)
        rlai_kv_block_unref(kv, held[--press.n_blocks]);
    for (int i = 0; i < n_pins; i++)
        ck_assert_int_eq(rlai_kv_prefix_unpin(kv, docs[pins[i].doc], pins[i].n), pins[i].n);
    assert_consistent(kv, NULL, 0);
    rlai_kv_cache_stats(kv, &st);
    ck_assert_int_eq(st.blocks_used, 0);
    ck_assert_int_eq(st.blocks_pinned, 0);
    ck_assert_int_eq(rlai_kv_cache_n_free(kv), RN_BLOCKS);
    rlai_kv_cache_free(kv);
}
END_TEST

/* Speculative decoding's rollback: truncate drops whole blocks past the
 * kept length without copying, cuts the committed chain, and a registered
 * block left partly in use is copied (not overwritten) on the next write. */
START_TEST(truncate_rolls_back_without_copy)
{
    rlai_kv_cache *kv = new_cache(16);
    int32_t tok[64];
    fill_tokens(tok, 64, 500);
    rlai_kv_seq a = { 0 }, b = { 0 };
    ck_assert_int_eq(run_prompt(kv, &a, tok, 40), 0);     /* 2 committed blocks + 1 partial */
    ck_assert_int_eq(rlai_kv_seq_truncate(kv, &a, -1), RLAI_ERR_INVALID_ARG);
    ck_assert_int_eq(rlai_kv_seq_truncate(kv, &a, 49), RLAI_ERR_INVALID_ARG); /* beyond 3 blocks */
    int32_t keep0 = a.blocks[0], keep1 = a.blocks[1];
    /* grow by a "draft" of 20 tokens into 2 more blocks, then reject all */
    ck_assert_int_eq(rlai_kv_seq_prepare_write(kv, &a, 40, 60), 0);
    ck_assert_int_eq(a.n_blocks, 4);
    ck_assert_int_eq(rlai_kv_seq_truncate(kv, &a, 40), 1);
    ck_assert_int_eq(a.n_blocks, 3);
    ck_assert_int_eq(a.n_tokens, 40);
    ck_assert_int_eq(a.n_committed, 2);
    ck_assert_int_eq(a.blocks[0], keep0);                   /* no copy */
    ck_assert_int_eq(a.blocks[1], keep1);
    ck_assert_int_eq(first_bad(kv, &a, tok, 40), -1);
    rlai_kv_seq *all[] = { &a, &b };
    assert_consistent(kv, all, 1);

    /* Truncate into the committed chain: block 1 stays registered (b
     * shares it), a's next write there copies it, b keeps its K/V. */
    ck_assert_int_eq(run_prompt(kv, &b, tok, 40), 32);
    ck_assert_int_eq(rlai_kv_seq_truncate(kv, &a, 20), 1);
    ck_assert_int_eq(a.n_committed, 1);
    assert_consistent(kv, all, 2);
    int32_t other[64];
    memcpy(other, tok, sizeof(tok));
    for (int i = 20; i < 64; i++)
        other[i] = 9000 + i;
    ck_assert_int_eq(rlai_kv_seq_prepare_write(kv, &a, 20, 40), 0);
    ck_assert_int_ne(a.blocks[1], keep1);                   /* copied on write */
    write_range(kv, &a, other, 20, 40);
    a.n_tokens = 40;
    rlai_kv_prefix_commit(kv, &a, other, 40);
    ck_assert_int_eq(first_bad(kv, &a, other, 40), -1);
    ck_assert_int_eq(first_bad(kv, &b, tok, 40), -1);
    assert_consistent(kv, all, 2);
    rlai_kv_seq_release(kv, &a);
    rlai_kv_seq_release(kv, &b);
    assert_consistent(kv, NULL, 0);
    rlai_kv_cache_free(kv);
}
END_TEST

/* Random speculative steps on three sequences that share a prefix: each
 * step writes the fed token plus a random draft, accepts a random prefix
 * of it, truncates and commits only accepted tokens. After every step the
 * invariant checker passes and every sequence's K/V equal its true
 * tokens; restarted sequences re-attach cached blocks whose K/V are those
 * of the true tokens (a block holding rejected draft K/V never got
 * registered). */
#define SPN 3
#define SPLEN 240
static int32_t sp_true(int s, int p)
{
    return p < 24 + 16 * s ? 1000 + p % 37 : 2000 * (s + 1) + p;
}

START_TEST(spec_random_accept_reject_keeps_cache_consistent)
{
    rlai_kv_cache *kv = new_cache(64);
    srand(1234);
    rlai_kv_seq seq[SPN];
    memset(seq, 0, sizeof(seq));
    static int32_t tok[SPN][SPLEN + 32], wtok[SPLEN + 32];
    int n_toks[SPN];
    rlai_kv_seq *all[SPN];
    for (int s = 0; s < SPN; s++) {
        for (int p = 0; p < SPLEN + 32; p++)
            tok[s][p] = sp_true(s, p);
        all[s] = &seq[s];
        run_prompt(kv, &seq[s], tok[s], 20);   /* prompt of 20; 20 pending = token at 20 */
        seq[s].n_tokens = 20;
        n_toks[s] = 21;
    }
    int restarts = 0, accepted_total = 0, rejected_total = 0, reused = 0;
    for (int step = 0; step < 600; step++) {
        int s = rand() % SPN;
        rlai_kv_seq *q = &seq[s];
        int p0 = q->n_tokens;                       /* == n_toks - 1 */
        ck_assert_int_eq(p0, n_toks[s] - 1);
        int k = rand() % 7;
        if (p0 + 1 + k > SPLEN) {
            /* finished: release and start again from the cache */
            rlai_kv_seq_release(kv, q);
            /* run_prompt attaches the cached blocks and checks their K/V */
            reused += run_prompt(kv, q, tok[s], 20 + rand() % 150);
            n_toks[s] = q->n_tokens + 1;
            restarts++;
            assert_consistent(kv, all, SPN);
            continue;
        }
        int a = k ? rand() % (k + 1) : 0;           /* accepted draft tokens */
        memcpy(wtok, tok[s], sizeof(wtok));
        for (int j = 0; j < k; j++)                 /* draft: true up to a, then wrong */
            wtok[p0 + 1 + j] = j < a ? tok[s][p0 + 1 + j] : 7000 + rand() % 50;
        ck_assert_int_eq(rlai_kv_seq_prepare_write(kv, q, p0, p0 + 1 + k), 0);
        write_range(kv, q, wtok, p0, p0 + 1 + k);
        q->n_tokens = p0 + 1;
        rlai_kv_prefix_commit(kv, q, tok[s], q->n_tokens);
        /* accept a drafts + 1 corrected/bonus token */
        n_toks[s] = p0 + 1 + a + 1;
        q->n_tokens = p0 + 1 + a;
        ck_assert_int_ge(rlai_kv_seq_truncate(kv, q, q->n_tokens), 0);
        rlai_kv_prefix_commit(kv, q, tok[s], q->n_tokens);
        ck_assert_int_eq(q->n_blocks, (q->n_tokens + 15) / 16);
        accepted_total += a;
        rejected_total += k - a;
        ck_assert_int_eq(first_bad(kv, q, tok[s], q->n_tokens), -1);
        assert_consistent(kv, all, SPN);
    }
    ck_assert_int_gt(restarts, 3);
    ck_assert_int_gt(reused, 0);
    ck_assert_int_gt(accepted_total, 100);
    ck_assert_int_gt(rejected_total, 100);
    for (int s = 0; s < SPN; s++) {
        rlai_kv_seq_release(kv, &seq[s]);
        /* every cached block of the true stream holds the true K/V */
        rlai_kv_seq c = { 0 };
        int m = rlai_kv_prefix_attach(kv, &c, tok[s], SPLEN, SPLEN);
        ck_assert_int_ge(m, 16);
        ck_assert_int_eq(first_bad(kv, &c, tok[s], m), -1);
        rlai_kv_seq_release(kv, &c);
    }
    assert_consistent(kv, NULL, 0);
    rlai_kv_cache_free(kv);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("kv_cache");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, alloc_free_all);
    tcase_add_test(tc, seq_reserve_and_release);
    tcase_add_test(tc, addressing_is_disjoint);
    tcase_add_test(tc, random_ops_keep_counts_consistent);
    tcase_add_test(tc, bad_arguments);
    tcase_add_test(tc, q8_0_rows_are_addressed_by_row_bytes);
    tcase_add_test(tc, prefix_same_prompt_reuses_full_blocks);
    tcase_add_test(tc, prefix_commit_dedups_concurrent_blocks);
    tcase_add_test(tc, prefix_shares_only_common_blocks);
    tcase_add_test(tc, prefix_forced_collision_never_matches_other_prompt);
    tcase_add_test(tc, prefix_caching_off_matches_nothing);
    tcase_add_test(tc, prefix_eviction_is_lru);
    tcase_add_test(tc, prefix_pins_survive_pressure);
    tcase_add_test(tc, prefix_prepare_write_copies_shared_block);
    tcase_add_test(tc, prefix_fork_then_write_partial_block);
    tcase_add_test(tc, prefix_exhaustion_leaves_tables_intact);
    tcase_add_test(tc, prefix_randomized_operations);
    tcase_add_test(tc, truncate_rolls_back_without_copy);
    tcase_add_test(tc, spec_random_accept_reject_keeps_cache_consistent);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
