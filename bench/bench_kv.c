/* bench_kv.c - paged KV cache and prefix cache costs (build in release).
 *
 *   bench_kv [--quick]
 *
 * Pool shaped like SmolLM2-135M (30 layers, kv_dim 192, f16 KV, 2048
 * blocks of 16 tokens). Prints one table, each figure the best of 5 runs:
 *  - baseline: malloc+free of a block-sized buffer (one layer's K rows of
 *    a block, and a whole block: K and V of every layer);
 *  - block alloc+free: one at a time in a tight loop, in batches of 1000,
 *    and with every allocation evicting the LRU cached block;
 *  - attach (and release) of a 1,500-token cached prefix;
 *  - commit per block: registering new blocks, and deduplicating against
 *    already-registered equal blocks;
 * then a fragmentation line for a serving workload of random prompt and
 * generation lengths over shared system prompts: KV bytes held by the
 * pool's used + cached blocks against the bytes the stored tokens need. */
#include "dtype.h"
#include "kv_cache.h"
#include "rlai/engine.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NL 30
#define KVD 192
#define NB 2048
#define REPS 5

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static uint64_t rng = 0x243F6A8885A308D3ull;
static uint32_t rnd(uint32_t m)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)((rng >> 11) % m);
}

static void die(const char *what, int rc)
{
    fprintf(stderr, "bench_kv: %s failed (%d)\n", what, rc);
    exit(1);
}

static void *volatile sink;

static double bench_malloc(size_t bytes, long iters)
{
    double best = 1e30;
    for (int r = 0; r < REPS; r++) {
        double t0 = now_ns();
        for (long i = 0; i < iters; i++) {
            unsigned char *p = malloc(bytes);
            if (!p)
                die("malloc", -1);
            p[0] = (unsigned char)i;
            sink = p;
            free(sink);
        }
        double t = (now_ns() - t0) / (double)iters;
        best = t < best ? t : best;
    }
    return best;
}

static double bench_alloc_tight(rlai_kv_cache *kv, long iters)
{
    double best = 1e30;
    for (int r = 0; r < REPS; r++) {
        double t0 = now_ns();
        for (long i = 0; i < iters; i++) {
            int b = rlai_kv_block_alloc(kv);
            rlai_kv_block_unref(kv, b);
        }
        double t = (now_ns() - t0) / (double)iters;
        best = t < best ? t : best;
    }
    return best;
}

static double bench_alloc_batch(rlai_kv_cache *kv, int batch, long rounds)
{
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)batch);
    if (!ids)
        die("malloc", -1);
    double best = 1e30;
    for (int r = 0; r < REPS; r++) {
        double t0 = now_ns();
        for (long k = 0; k < rounds; k++) {
            for (int i = 0; i < batch; i++)
                ids[i] = rlai_kv_block_alloc(kv);
            for (int i = batch - 1; i >= 0; i--)
                rlai_kv_block_unref(kv, ids[i]);
        }
        double t = (now_ns() - t0) / ((double)rounds * batch);
        best = t < best ? t : best;
    }
    free(ids);
    return best;
}

/* Fills the whole pool with cached one-block prompts (distinct tokens). */
static void fill_cached(rlai_kv_cache *kv, int32_t *serial)
{
    int32_t tok[RLAI_KV_BLOCK];
    for (int i = 0; i < NB; i++) {
        for (int j = 0; j < RLAI_KV_BLOCK; j++)
            tok[j] = (*serial)++;
        rlai_kv_seq s = { 0 };
        int rc = rlai_kv_seq_prepare_write(kv, &s, 0, RLAI_KV_BLOCK);
        if (rc < 0)
            die("prepare_write", rc);
        s.n_tokens = RLAI_KV_BLOCK;
        rlai_kv_prefix_commit(kv, &s, tok, RLAI_KV_BLOCK);
        rlai_kv_seq_release(kv, &s);
    }
}

static double bench_alloc_evict(rlai_kv_cache *kv)
{
    static int32_t ids[NB];
    int32_t serial = 1 << 20;
    double best = 1e30;
    for (int r = 0; r < REPS; r++) {
        fill_cached(kv, &serial);
        rlai_kv_stats st0, st1;
        rlai_kv_cache_stats(kv, &st0);
        double t0 = now_ns();
        for (int i = 0; i < NB; i++)
            ids[i] = rlai_kv_block_alloc(kv);
        for (int i = NB - 1; i >= 0; i--)
            rlai_kv_block_unref(kv, ids[i]);
        double t = (now_ns() - t0) / NB;
        rlai_kv_cache_stats(kv, &st1);
        if (st1.evictions - st0.evictions != NB)
            die("eviction count", -1);
        best = t < best ? t : best;
    }
    return best;
}

int main(int argc, char **argv)
{
    bool quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    long iters = quick ? 200000 : 5000000;
    rlai_kv_cache *kv;
    int rc = rlai_kv_cache_new(NL, KVD, NB, RLAI_DT_F16, &kv);
    if (rc < 0)
        die("create", rc);
    size_t layer_block = (size_t)RLAI_KV_BLOCK * KVD * 2;
    size_t full_block = 2 * NL * layer_block;
    size_t tok_bytes = 2u * NL * KVD * 2;

    printf("KV pool: %d layers x kv_dim %d, f16, %d blocks of %d tokens (%.1f MiB reserved)\n", NL,
           KVD, NB, RLAI_KV_BLOCK, (double)rlai_kv_cache_bytes(kv) / 1048576.0);
    printf("%-52s %12s\n", "operation", "cost");
    printf("%-52s %9.1f ns   (baseline)\n", "malloc+free, one layer's K of a block (6 KiB)",
           bench_malloc(layer_block, iters));
    printf("%-52s %9.1f ns   (baseline)\n", "malloc+free, whole block K+V all layers (360 KiB)",
           bench_malloc(full_block, iters / 20));
    printf("%-52s %9.1f ns\n", "block alloc+free, tight loop", bench_alloc_tight(kv, iters));
    printf("%-52s %9.1f ns\n", "block alloc+free, batches of 1000",
           bench_alloc_batch(kv, 1000, iters / 1000));
    printf("%-52s %9.1f ns\n", "block alloc+free, every alloc evicts (LRU)", bench_alloc_evict(kv));

    /* Attach of a 1,500-token cached prefix. */
    static int32_t tok[2048];
    for (int i = 0; i < 2048; i++)
        tok[i] = 1000 + i;
    const int P = 1500;
    rlai_kv_seq s = { 0 };
    if ((rc = rlai_kv_seq_prepare_write(kv, &s, 0, P)) < 0)
        die("prepare_write", rc);
    s.n_tokens = P;
    rlai_kv_prefix_commit(kv, &s, tok, P);
    rlai_kv_seq_release(kv, &s);
    int natt = quick ? 2000 : 50000;
    double best_att = 1e30, best_rel = 1e30;
    for (int r = 0; r < REPS; r++) {
        double ta = 0, tr = 0;
        for (int i = 0; i < natt; i++) {
            double t0 = now_ns();
            int m = rlai_kv_prefix_attach(kv, &s, tok, P, P);
            double t1 = now_ns();
            if (m != P / RLAI_KV_BLOCK * RLAI_KV_BLOCK)
                die("attach", m);
            rlai_kv_seq_release(kv, &s);
            tr += now_ns() - t1;
            ta += t1 - t0;
        }
        best_att = ta / natt < best_att ? ta / natt : best_att;
        best_rel = tr / natt < best_rel ? tr / natt : best_rel;
    }
    printf("%-52s %9.2f us   (%d blocks, %.1f ns/block)\n", "attach 1,500-token cached prefix",
           best_att / 1000.0, P / RLAI_KV_BLOCK, best_att / (P / RLAI_KV_BLOCK));
    printf("%-52s %9.2f us\n", "release of that sequence", best_rel / 1000.0);

    /* Commit cost per block: new registrations, then dedup against them. */
    int ncom = quick ? 50 : 2000;
    int nblk = P / RLAI_KV_BLOCK;
    double best_new = 1e30, best_dup = 1e30;
    for (int r = 0; r < REPS; r++) {
        double tn = 0, td = 0;
        for (int i = 0; i < ncom; i++) {
            tok[0] = 1 << 24 | (r * ncom + i); /* a new prompt each time */
            rlai_kv_seq a = { 0 }, b = { 0 };
            if ((rc = rlai_kv_seq_prepare_write(kv, &a, 0, P)) < 0 ||
                (rc = rlai_kv_seq_prepare_write(kv, &b, 0, P)) < 0)
                die("prepare_write", rc);
            a.n_tokens = b.n_tokens = P;
            double t0 = now_ns();
            rlai_kv_prefix_commit(kv, &a, tok, P);
            double t1 = now_ns();
            rlai_kv_prefix_commit(kv, &b, tok, P);
            double t2 = now_ns();
            tn += t1 - t0;
            td += t2 - t1;
            rlai_kv_seq_release(kv, &b);
            rlai_kv_seq_release(kv, &a);
        }
        best_new = tn / ncom / nblk < best_new ? tn / ncom / nblk : best_new;
        best_dup = td / ncom / nblk < best_dup ? td / ncom / nblk : best_dup;
    }
    printf("%-52s %9.1f ns\n", "commit per block, registering", best_new);
    printf("%-52s %9.1f ns\n", "commit per block, dedup onto a registered block", best_dup);
    rlai_kv_cache_free(kv);

    /* Fragmentation: 4 shared system prompts of 200-600 tokens, requests
     * of a system prompt (or none) + 1..1500 user tokens, then 1..300
     * generated tokens in steps of 1..32; up to 24 live requests; run
     * until 2000 requests have finished. */
    if ((rc = rlai_kv_cache_new(NL, KVD, NB, RLAI_DT_F16, &kv)) < 0)
        die("create", rc);
    enum { LIVE = 24, MAXT = 2200 };
    static int32_t sys[4][600];
    int sys_len[4];
    for (int i = 0; i < 4; i++) {
        sys_len[i] = 200 + (int)rnd(401);
        for (int j = 0; j < 600; j++)
            sys[i][j] = (int32_t)rnd(50000);
    }
    static int32_t req_tok[LIVE][MAXT];
    rlai_kv_seq live[LIVE];
    int gen_left[LIVE];
    memset(live, 0, sizeof(live));
    memset(gen_left, 0, sizeof(gen_left));
    int finished = 0, rejected = 0;
    uint64_t prompt_tokens = 0;
    while (finished < (quick ? 200 : 2000)) {
        int q = (int)rnd(LIVE);
        rlai_kv_seq *sq = &live[q];
        if (sq->n_blocks == 0) {
            int sp = (int)rnd(5), n = 0;
            if (sp < 4)
                for (; n < sys_len[sp]; n++)
                    req_tok[q][n] = sys[sp][n];
            int user = 1 + (int)rnd(1500);
            for (int j = 0; j < user; j++, n++)
                req_tok[q][n] = (int32_t)rnd(50000);
            int m = rlai_kv_prefix_attach(kv, sq, req_tok[q], n, n - 1);
            if (m < 0 || rlai_kv_seq_prepare_write(kv, sq, m, n) < 0) {
                rlai_kv_seq_release(kv, sq);
                rejected++;
                continue;
            }
            sq->n_tokens = n;
            rlai_kv_prefix_commit(kv, sq, req_tok[q], n);
            prompt_tokens += (uint64_t)n;
            gen_left[q] = 1 + (int)rnd(300);
        } else {
            int k = 1 + (int)rnd(32);
            k = k < gen_left[q] ? k : gen_left[q];
            int n = sq->n_tokens;
            if (rlai_kv_seq_prepare_write(kv, sq, n, n + k) < 0) {
                rlai_kv_seq_release(kv, sq); /* preempted */
                rejected++;
                continue;
            }
            for (int j = 0; j < k; j++)
                req_tok[q][n + j] = (int32_t)rnd(50000);
            sq->n_tokens = n + k;
            rlai_kv_prefix_commit(kv, sq, req_tok[q], sq->n_tokens);
            if ((gen_left[q] -= k) == 0) {
                rlai_kv_seq_release(kv, sq);
                finished++;
            }
        }
    }
    /* Valid tokens per block: full for blocks below a holder's n_tokens/16
     * and for cached blocks, else the partial count. */
    static int valid[NB];
    memset(valid, 0, sizeof(valid));
    int live_n = 0, live_tokens = 0;
    for (int q = 0; q < LIVE; q++) {
        rlai_kv_seq *sq = &live[q];
        live_n += sq->n_blocks > 0;
        live_tokens += sq->n_tokens;
        for (int i = 0; i < sq->n_blocks; i++) {
            int v = sq->n_tokens - i * RLAI_KV_BLOCK;
            v = v > RLAI_KV_BLOCK ? RLAI_KV_BLOCK : v;
            if (v > valid[sq->blocks[i]])
                valid[sq->blocks[i]] = v;
        }
    }
    rlai_kv_stats st;
    rlai_kv_cache_stats(kv, &st);
    long need_tokens = (long)st.blocks_cached * RLAI_KV_BLOCK;
    for (int b = 0; b < NB; b++)
        need_tokens += valid[b];
    long held_tokens = (long)(st.blocks_used + st.blocks_cached) * RLAI_KV_BLOCK;
    printf("\nfragmentation (%d requests done, %d preempted/rejected, %d live holding %d tokens):\n",
           finished, rejected, live_n, live_tokens);
    printf("  pool used+cached: %d+%d blocks = %.1f MiB held; tokens stored need %.1f MiB "
           "-> %.2f%% slack\n",
           st.blocks_used, st.blocks_cached, (double)held_tokens * (double)tok_bytes / 1048576.0,
           (double)need_tokens * (double)tok_bytes / 1048576.0,
           100.0 * (double)(held_tokens - need_tokens) / (double)need_tokens);
    printf("  live tables reference %d tokens of KV stored in %d used blocks (sharing x%.2f); "
           "prefix reuse %.1f%% of %llu prompt tokens\n",
           live_tokens, st.blocks_used,
           st.blocks_used ? (double)live_tokens / ((double)st.blocks_used * RLAI_KV_BLOCK) : 0.0,
           prompt_tokens ? 100.0 * (double)st.tokens_reused / (double)prompt_tokens : 0.0,
           (unsigned long long)prompt_tokens);
    for (int q = 0; q < LIVE; q++)
        rlai_kv_seq_release(kv, &live[q]);
    rlai_kv_cache_free(kv);
    return 0;
}
