/* kv_cache.c - paged KV block pool (see kv_cache.h). */
#include "kv_cache.h"
#include "rlai/engine.h"
#include "dtype.h"

#include <stdlib.h>
#include <string.h>

struct rlai_kv_cache {
    int n_layer;
    int kv_dim;
    int n_blocks;
    int n_free;
    uint32_t dtype;
    size_t esize;          /* bytes per element */
    int32_t *free_stack;   /* ids of free blocks; top at n_free-1 */
    uint32_t *refcount;
    unsigned char **k;     /* per layer */
    unsigned char **v;
};

int rlai_kv_cache_create(int n_layer, int kv_dim, int n_blocks, uint32_t dtype,
                         rlai_kv_cache **out)
{
    *out = NULL;
    if (n_layer <= 0 || kv_dim <= 0 || n_blocks <= 0)
        return RLAI_ERR_INVALID_ARG;
    size_t esize;
    if (dtype == RLAI_DT_F16)
        esize = 2;
    else if (dtype == RLAI_DT_F32)
        esize = 4;
    else
        return RLAI_ERR_UNSUPPORTED;
    size_t per_layer = (size_t)n_blocks * RLAI_KV_BLOCK * (size_t)kv_dim;
    if (per_layer / (size_t)n_blocks / RLAI_KV_BLOCK != (size_t)kv_dim)
        return RLAI_ERR_TOO_LARGE;
    rlai_kv_cache *kv = calloc(1, sizeof(*kv));
    if (!kv)
        return RLAI_ERR_NOMEM;
    kv->n_layer = n_layer;
    kv->kv_dim = kv_dim;
    kv->n_blocks = n_blocks;
    kv->dtype = dtype;
    kv->esize = esize;
    kv->free_stack = malloc(sizeof(int32_t) * (size_t)n_blocks);
    kv->refcount = calloc((size_t)n_blocks, sizeof(uint32_t));
    kv->k = calloc((size_t)n_layer, sizeof(*kv->k));
    kv->v = calloc((size_t)n_layer, sizeof(*kv->v));
    if (!kv->free_stack || !kv->refcount || !kv->k || !kv->v)
        goto nomem;
    for (int l = 0; l < n_layer; l++) {
        /* calloc of a large size is served by fresh zero pages: nothing
         * becomes resident until a block is written. */
        kv->k[l] = calloc(per_layer, esize);
        kv->v[l] = calloc(per_layer, esize);
        if (!kv->k[l] || !kv->v[l])
            goto nomem;
    }
    /* Lowest ids on top so allocation order is 0, 1, 2, ... */
    for (int i = 0; i < n_blocks; i++)
        kv->free_stack[i] = n_blocks - 1 - i;
    kv->n_free = n_blocks;
    *out = kv;
    return 0;
nomem:
    rlai_kv_cache_destroy(kv);
    return RLAI_ERR_NOMEM;
}

void rlai_kv_cache_destroy(rlai_kv_cache *kv)
{
    if (!kv)
        return;
    for (int l = 0; l < kv->n_layer; l++) {
        if (kv->k) free(kv->k[l]);
        if (kv->v) free(kv->v[l]);
    }
    free(kv->k);
    free(kv->v);
    free(kv->free_stack);
    free(kv->refcount);
    free(kv);
}

uint32_t rlai_kv_cache_dtype(const rlai_kv_cache *kv) { return kv->dtype; }
int rlai_kv_cache_n_blocks(const rlai_kv_cache *kv) { return kv->n_blocks; }
int rlai_kv_cache_n_free(const rlai_kv_cache *kv) { return kv->n_free; }

size_t rlai_kv_cache_bytes(const rlai_kv_cache *kv)
{
    return 2u * (size_t)kv->n_layer * (size_t)kv->n_blocks * RLAI_KV_BLOCK *
           (size_t)kv->kv_dim * kv->esize;
}

int rlai_kv_block_alloc(rlai_kv_cache *kv)
{
    if (kv->n_free == 0)
        return RLAI_ERR_KV_FULL;
    int32_t b = kv->free_stack[--kv->n_free];
    kv->refcount[b] = 1;
    return b;
}

void rlai_kv_block_ref(rlai_kv_cache *kv, int32_t block)
{
    kv->refcount[block]++;
}

void rlai_kv_block_unref(rlai_kv_cache *kv, int32_t block)
{
    if (kv->refcount[block] == 0)
        return; /* double free: ignore rather than corrupt the free list */
    if (--kv->refcount[block] == 0)
        kv->free_stack[kv->n_free++] = block;
}

int rlai_kv_block_refcount(const rlai_kv_cache *kv, int32_t block)
{
    return (int)kv->refcount[block];
}

int rlai_kv_seq_reserve(rlai_kv_cache *kv, rlai_kv_seq *seq, int n_tokens)
{
    if (n_tokens < 0)
        return RLAI_ERR_INVALID_ARG;
    int need = (n_tokens + RLAI_KV_BLOCK - 1) / RLAI_KV_BLOCK;
    if (need <= seq->n_blocks)
        return 0;
    if (need - seq->n_blocks > kv->n_free)
        return RLAI_ERR_KV_FULL;
    if (need > seq->cap) {
        int cap = seq->cap ? seq->cap : 8;
        while (cap < need)
            cap *= 2;
        int32_t *nb = realloc(seq->blocks, sizeof(int32_t) * (size_t)cap);
        if (!nb)
            return RLAI_ERR_NOMEM;
        seq->blocks = nb;
        seq->cap = cap;
    }
    while (seq->n_blocks < need)
        seq->blocks[seq->n_blocks++] = rlai_kv_block_alloc(kv); /* cannot fail: checked n_free */
    return 0;
}

void rlai_kv_seq_release(rlai_kv_cache *kv, rlai_kv_seq *seq)
{
    for (int i = 0; i < seq->n_blocks; i++)
        rlai_kv_block_unref(kv, seq->blocks[i]);
    free(seq->blocks);
    memset(seq, 0, sizeof(*seq));
}

static inline size_t kv_offset(const rlai_kv_cache *kv, const rlai_kv_seq *seq, int pos)
{
    int32_t b = seq->blocks[pos / RLAI_KV_BLOCK];
    return ((size_t)b * RLAI_KV_BLOCK + (size_t)(pos % RLAI_KV_BLOCK)) * (size_t)kv->kv_dim *
           kv->esize;
}

void *rlai_kv_k_at(rlai_kv_cache *kv, const rlai_kv_seq *seq, int layer, int pos)
{
    return kv->k[layer] + kv_offset(kv, seq, pos);
}

void *rlai_kv_v_at(rlai_kv_cache *kv, const rlai_kv_seq *seq, int layer, int pos)
{
    return kv->v[layer] + kv_offset(kv, seq, pos);
}
