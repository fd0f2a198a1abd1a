/* test_kv_cache.c - paged KV block pool: allocation, reference counts,
 * block tables, exhaustion, addressing. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "kv_cache.h"
#include "rlai/engine.h"

START_TEST(alloc_free_all)
{
    rlai_kv_cache *kv;
    ck_assert_int_eq(rlai_kv_cache_create(2, 8, 10, RLAI_DT_F16, &kv), 0);
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
    rlai_kv_cache_destroy(kv);
}
END_TEST

START_TEST(seq_reserve_and_release)
{
    rlai_kv_cache *kv;
    ck_assert_int_eq(rlai_kv_cache_create(1, 4, 8, RLAI_DT_F32, &kv), 0);
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
    rlai_kv_cache_destroy(kv);
}
END_TEST

START_TEST(addressing_is_disjoint)
{
    /* Two sequences write distinct values at every position of two layers;
     * everything reads back, so no two (seq, layer, pos) share storage. */
    rlai_kv_cache *kv;
    const int D = 6, L = 2, N = 40;
    ck_assert_int_eq(rlai_kv_cache_create(L, D, 8, RLAI_DT_F32, &kv), 0);
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
    rlai_kv_cache_destroy(kv);
}
END_TEST

START_TEST(random_ops_keep_counts_consistent)
{
    /* Random reserve/release over several sequences: the free count always
     * equals the pool minus the blocks held by tables, and every held block
     * has refcount 1. */
    rlai_kv_cache *kv;
    const int NB = 64, NS = 6;
    ck_assert_int_eq(rlai_kv_cache_create(1, 2, NB, RLAI_DT_F16, &kv), 0);
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
    rlai_kv_cache_destroy(kv);
}
END_TEST

START_TEST(bad_arguments)
{
    rlai_kv_cache *kv = (rlai_kv_cache *)1;
    ck_assert_int_eq(rlai_kv_cache_create(0, 8, 8, RLAI_DT_F16, &kv), RLAI_ERR_INVALID_ARG);
    ck_assert_ptr_null(kv);
    ck_assert_int_eq(rlai_kv_cache_create(1, 8, 8, RLAI_DT_Q4_0, &kv), RLAI_ERR_UNSUPPORTED);
    ck_assert_int_eq(rlai_kv_cache_create(1, 8, 8, RLAI_DT_F16, &kv), 0);
    ck_assert_uint_eq(rlai_kv_cache_bytes(kv), 2u * 8 * 16 * 8 * 2);
    rlai_kv_seq s;
    memset(&s, 0, sizeof(s));
    ck_assert_int_eq(rlai_kv_seq_reserve(kv, &s, -1), RLAI_ERR_INVALID_ARG);
    rlai_kv_cache_destroy(kv);
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
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
