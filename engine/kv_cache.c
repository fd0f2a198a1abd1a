/* kv_cache.c - paged KV block pool with a prefix cache (see kv_cache.h).
 *
 * Every block is in exactly one state:
 *   free    on free_stack: refcount 0, unregistered, unpinned;
 *   used    refcount > 0 (registered or not);
 *   cached  registered with refcount 0. Unpinned cached blocks sit on the
 *           LRU list (head = least recently used = next to evict); pinned
 *           ones are on no list and cannot be evicted.
 * Registered blocks are in a chained hash index over block ids (bucket =
 * key & mask, intrusive `hnext`). A registered block's identity is (key,
 * parent key, parent serial, 16 tokens), where `serial` is a number unique
 * to each registration: a child names the exact registration of its parent,
 * so even a forced 64-bit key collision in a parent cannot join two
 * prompts' chains, and the children of an evicted parent simply become
 * unreachable and age out of the LRU list. Every operation is O(1) per
 * block (expected, for the hash lookups).
 */
#include "kv_cache.h"
#include "rlai/engine.h"
#include "dtype.h"
#include "backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef uint64_t (*kv_hash_fn)(uint64_t parent_key, const int32_t *tokens);

/* Test-only hook, declared in no header (tests reach it with `extern`):
 * when non-NULL at rlai_kv_cache_new time, the new cache uses it as its
 * block-key hash instead of the built-in one, so tests can force
 * collisions. A cache keeps the function it was created with. */
uint64_t (*rlai_kv_test_hash_hook)(uint64_t parent_key, const int32_t *tokens) = NULL;

struct kv_meta {
    uint64_t key;            /* valid while registered; never 0 */
    uint64_t parent_key;     /* key of the parent block, 0 for block 0 */
    uint64_t serial;         /* unique per registration */
    uint64_t parent_serial;  /* serial of the parent block, 0 for block 0 */
    int32_t lru_prev, lru_next;
    int32_t hnext;           /* next block id in the hash bucket, -1 ends */
    uint32_t pin;
    bool registered;
    bool on_lru;
    int32_t tokens[RLAI_KV_BLOCK];
};

struct rlai_kv_cache {
    int n_layer;
    int kv_dim;
    int n_blocks;
    int n_free;
    uint32_t dtype;
    size_t row_bytes;      /* bytes of one token's K (or V) row in one layer */
    size_t block_bytes;    /* bytes of one block in one layer's K (or V) */
    int32_t *free_stack;   /* ids of free blocks; top at n_free-1 */
    uint32_t *refcount;
    unsigned char **k;     /* per layer */
    unsigned char **v;
    rlai_backend *be;      /* owner of the page arrays; NULL = host calloc */

    struct kv_meta *meta;  /* per block */
    int32_t *buckets;      /* hash heads, -1 = empty */
    size_t bucket_mask;
    int32_t lru_head, lru_tail;
    int n_lru;             /* cached, unpinned blocks (evictable) */
    int n_used;            /* refcount > 0 */
    int n_registered;
    int n_pinned;          /* pin > 0 */
    uint64_t next_serial;
    bool prefix_on;
    kv_hash_fn hash;
    uint64_t lookups, tokens_reused, evictions;
};

/* ---- block key hash: xxh64-style rounds over the 64 token bytes, seeded
 * with the parent key. */

#define KP1 0x9E3779B185EBCA87ull
#define KP2 0xC2B2AE3D27D4EB4Full
#define KP3 0x165667B19E3779F9ull
#define KP4 0x85EBCA77C2B2AE63ull

static inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static inline uint64_t kv_round(uint64_t acc, uint64_t lane)
{
    acc += lane * KP2;
    acc = rotl64(acc, 31);
    return acc * KP1;
}

static inline uint64_t kv_merge(uint64_t h, uint64_t v)
{
    h ^= kv_round(0, v);
    return h * KP1 + KP4;
}

static uint64_t kv_hash_default(uint64_t parent, const int32_t *t)
{
    uint64_t v[4] = { parent + KP1 + KP2, parent + KP2, parent, parent - KP1 };
    for (int s = 0; s < 2; s++)
        for (int j = 0; j < 4; j++) {
            int i = 8 * s + 2 * j;
            uint64_t lane = (uint64_t)(uint32_t)t[i] | ((uint64_t)(uint32_t)t[i + 1] << 32);
            v[j] = kv_round(v[j], lane);
        }
    uint64_t h = rotl64(v[0], 1) + rotl64(v[1], 7) + rotl64(v[2], 12) + rotl64(v[3], 18);
    for (int j = 0; j < 4; j++)
        h = kv_merge(h, v[j]);
    h += 64;
    h ^= h >> 33;
    h *= KP2;
    h ^= h >> 29;
    h *= KP3;
    h ^= h >> 32;
    return h;
}

static inline uint64_t block_key(const rlai_kv_cache *kv, uint64_t parent, const int32_t *t)
{
    uint64_t h = kv->hash(parent, t);
    return h ? h : 1; /* 0 means "no parent" */
}

/* ---- LRU list of evictable (cached, unpinned) blocks */

static void lru_unlink(rlai_kv_cache *kv, int32_t b)
{
    struct kv_meta *m = &kv->meta[b];
    if (m->lru_prev >= 0)
        kv->meta[m->lru_prev].lru_next = m->lru_next;
    else
        kv->lru_head = m->lru_next;
    if (m->lru_next >= 0)
        kv->meta[m->lru_next].lru_prev = m->lru_prev;
    else
        kv->lru_tail = m->lru_prev;
    m->lru_prev = m->lru_next = -1;
    m->on_lru = false;
    kv->n_lru--;
}

/* Inserts b before `at` (or at the most-recent end when at < 0). */
static void lru_insert_before(rlai_kv_cache *kv, int32_t b, int32_t at)
{
    struct kv_meta *m = &kv->meta[b];
    int32_t prev = at >= 0 ? kv->meta[at].lru_prev : kv->lru_tail;
    m->lru_prev = prev;
    m->lru_next = at;
    if (prev >= 0)
        kv->meta[prev].lru_next = b;
    else
        kv->lru_head = b;
    if (at >= 0)
        kv->meta[at].lru_prev = b;
    else
        kv->lru_tail = b;
    m->on_lru = true;
    kv->n_lru++;
}

/* ---- hash index */

static int32_t hash_find(const rlai_kv_cache *kv, uint64_t key, uint64_t parent_key,
                         uint64_t parent_serial, const int32_t *tokens)
{
    for (int32_t b = kv->buckets[key & kv->bucket_mask]; b >= 0; b = kv->meta[b].hnext) {
        const struct kv_meta *m = &kv->meta[b];
        if (m->key == key && m->parent_key == parent_key && m->parent_serial == parent_serial &&
            memcmp(m->tokens, tokens, sizeof(m->tokens)) == 0)
            return b;
    }
    return -1;
}

static void block_register(rlai_kv_cache *kv, int32_t b, uint64_t key, uint64_t parent_key,
                           uint64_t parent_serial, const int32_t *tokens)
{
    struct kv_meta *m = &kv->meta[b];
    m->key = key;
    m->parent_key = parent_key;
    m->parent_serial = parent_serial;
    m->serial = ++kv->next_serial;
    memcpy(m->tokens, tokens, sizeof(m->tokens));
    m->registered = true;
    size_t h = key & kv->bucket_mask;
    m->hnext = kv->buckets[h];
    kv->buckets[h] = b;
    kv->n_registered++;
}

static void block_unregister(rlai_kv_cache *kv, int32_t b)
{
    struct kv_meta *m = &kv->meta[b];
    int32_t *pp = &kv->buckets[m->key & kv->bucket_mask];
    while (*pp != b)
        pp = &kv->meta[*pp].hnext;
    *pp = m->hnext;
    m->hnext = -1;
    m->registered = false;
    m->key = m->parent_key = m->serial = m->parent_serial = 0;
    kv->n_registered--;
}

/* ---- pool */

int rlai_kv_cache_new(int n_layer, int kv_dim, int n_blocks, uint32_t dtype,
                         rlai_kv_cache **out)
{
    return rlai_kv_cache_new_on(NULL, n_layer, kv_dim, n_blocks, dtype, out);
}

static void *pages_alloc(rlai_backend *be, size_t n, size_t size)
{
    if (size && n > SIZE_MAX / size)
        return NULL;
    if (!be)
        return calloc(n, size);
    void *p;
    return be->iface->buffer_alloc(be, n * size, &p) < 0 ? NULL : p;
}

static void pages_free(rlai_backend *be, void *p)
{
    if (!be)
        free(p);
    else
        be->iface->buffer_free(be, p);
}

int rlai_kv_cache_new_on(rlai_backend *be, int n_layer, int kv_dim, int n_blocks, uint32_t dtype,
                            rlai_kv_cache **out)
{
    *out = NULL;
    if (be && !be->iface->host_memory && !be->iface->copy)
        return RLAI_ERR_UNSUPPORTED;
    if (n_layer <= 0 || kv_dim <= 0 || n_blocks <= 0)
        return RLAI_ERR_INVALID_ARG;
    size_t row_bytes;
    if (dtype == RLAI_DT_F16)
        row_bytes = 2 * (size_t)kv_dim;
    else if (dtype == RLAI_DT_F32)
        row_bytes = 4 * (size_t)kv_dim;
    else if (dtype == RLAI_DT_Q8_0 && kv_dim % RLAI_QK == 0)
        row_bytes = rlai_dtype_row_bytes(RLAI_DT_Q8_0, kv_dim);
    else
        return RLAI_ERR_UNSUPPORTED;
    size_t per_layer = (size_t)n_blocks * RLAI_KV_BLOCK * (size_t)kv_dim;
    if (per_layer / (size_t)n_blocks / RLAI_KV_BLOCK != (size_t)kv_dim)
        return RLAI_ERR_TOO_LARGE;
    rlai_kv_cache *kv = calloc(1, sizeof(*kv));
    if (!kv)
        return RLAI_ERR_NOMEM;
    kv->be = be;
    kv->n_layer = n_layer;
    kv->kv_dim = kv_dim;
    kv->n_blocks = n_blocks;
    kv->dtype = dtype;
    kv->row_bytes = row_bytes;
    kv->block_bytes = (size_t)RLAI_KV_BLOCK * row_bytes;
    kv->lru_head = kv->lru_tail = -1;
    kv->prefix_on = true;
    kv->hash = rlai_kv_test_hash_hook ? rlai_kv_test_hash_hook : kv_hash_default;
    size_t nbuckets = 16;
    while (nbuckets < 2 * (size_t)n_blocks)
        nbuckets *= 2;
    kv->bucket_mask = nbuckets - 1;
    kv->free_stack = malloc(sizeof(int32_t) * (size_t)n_blocks);
    kv->refcount = calloc((size_t)n_blocks, sizeof(uint32_t));
    kv->meta = calloc((size_t)n_blocks, sizeof(*kv->meta));
    kv->buckets = malloc(sizeof(int32_t) * nbuckets);
    kv->k = calloc((size_t)n_layer, sizeof(*kv->k));
    kv->v = calloc((size_t)n_layer, sizeof(*kv->v));
    if (!kv->free_stack || !kv->refcount || !kv->meta || !kv->buckets || !kv->k || !kv->v)
        goto nomem;
    for (size_t i = 0; i < nbuckets; i++)
        kv->buckets[i] = -1;
    for (int i = 0; i < n_blocks; i++)
        kv->meta[i].lru_prev = kv->meta[i].lru_next = kv->meta[i].hnext = -1;
    for (int l = 0; l < n_layer; l++) {
        /* calloc of a large size is served by fresh zero pages: nothing
         * becomes resident until a block is written. */
        kv->k[l] = pages_alloc(be, (size_t)n_blocks, kv->block_bytes);
        kv->v[l] = pages_alloc(be, (size_t)n_blocks, kv->block_bytes);
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
    rlai_kv_cache_free(kv);
    return RLAI_ERR_NOMEM;
}

void rlai_kv_cache_free(rlai_kv_cache *kv)
{
    if (!kv)
        return;
    for (int l = 0; l < kv->n_layer; l++) {
        if (kv->k) pages_free(kv->be, kv->k[l]);
        if (kv->v) pages_free(kv->be, kv->v[l]);
    }
    free(kv->k);
    free(kv->v);
    free(kv->free_stack);
    free(kv->refcount);
    free(kv->meta);
    free(kv->buckets);
    free(kv);
}

uint32_t rlai_kv_cache_dtype(const rlai_kv_cache *kv) { return kv->dtype; }
int rlai_kv_cache_n_blocks(const rlai_kv_cache *kv) { return kv->n_blocks; }
int rlai_kv_cache_n_free(const rlai_kv_cache *kv) { return kv->n_free + kv->n_lru; }

size_t rlai_kv_cache_bytes(const rlai_kv_cache *kv)
{
    return 2u * (size_t)kv->n_layer * (size_t)kv->n_blocks * kv->block_bytes;
}

int rlai_kv_block_alloc(rlai_kv_cache *kv)
{
    int32_t b;
    if (kv->n_free > 0) {
        b = kv->free_stack[--kv->n_free];
    } else if (kv->lru_head >= 0) {
        b = kv->lru_head;
        lru_unlink(kv, b);
        block_unregister(kv, b);
        kv->evictions++;
    } else {
        return RLAI_ERR_KV_FULL;
    }
    kv->refcount[b] = 1;
    kv->n_used++;
    return b;
}

void rlai_kv_block_ref(rlai_kv_cache *kv, int32_t block)
{
    if (kv->refcount[block] == 0) {
        if (!kv->meta[block].registered)
            return; /* a free block: ignore rather than corrupt the free list */
        if (kv->meta[block].on_lru)
            lru_unlink(kv, block);
        kv->n_used++;
    }
    kv->refcount[block]++;
}

/* Drops one reference; at zero a registered block becomes cached, placed
 * in the LRU list just before `lru_at` (< 0: most recent end) unless
 * pinned; an unregistered one is freed. */
static void block_unref_at(rlai_kv_cache *kv, int32_t block, int32_t lru_at)
{
    if (kv->refcount[block] == 0)
        return; /* double free: ignore rather than corrupt the free list */
    if (--kv->refcount[block] != 0)
        return;
    kv->n_used--;
    if (!kv->meta[block].registered)
        kv->free_stack[kv->n_free++] = block;
    else if (kv->meta[block].pin == 0)
        lru_insert_before(kv, block, lru_at);
}

void rlai_kv_block_unref(rlai_kv_cache *kv, int32_t block)
{
    block_unref_at(kv, block, -1);
}

int rlai_kv_block_refcount(const rlai_kv_cache *kv, int32_t block)
{
    return (int)kv->refcount[block];
}

/* Makes seq's table hold at least `need` entries. */
static int seq_grow(rlai_kv_seq *seq, int need)
{
    if (need <= seq->cap)
        return 0;
    int cap = seq->cap ? seq->cap : 8;
    while (cap < need)
        cap *= 2;
    int32_t *nb = realloc(seq->blocks, sizeof(int32_t) * (size_t)cap);
    if (!nb)
        return RLAI_ERR_NOMEM;
    seq->blocks = nb;
    seq->cap = cap;
    return 0;
}

int rlai_kv_seq_reserve(rlai_kv_cache *kv, rlai_kv_seq *seq, int n_tokens)
{
    if (n_tokens < 0)
        return RLAI_ERR_INVALID_ARG;
    int need = (n_tokens + RLAI_KV_BLOCK - 1) / RLAI_KV_BLOCK;
    if (need <= seq->n_blocks)
        return 0;
    if (need - seq->n_blocks > rlai_kv_cache_n_free(kv))
        return RLAI_ERR_KV_FULL;
    if (seq_grow(seq, need) < 0)
        return RLAI_ERR_NOMEM;
    while (seq->n_blocks < need)
        seq->blocks[seq->n_blocks++] = rlai_kv_block_alloc(kv); /* cannot fail: checked above */
    return 0;
}

void rlai_kv_seq_release(rlai_kv_cache *kv, rlai_kv_seq *seq)
{
    /* Last block first: a prefix's deeper blocks become cached before (are
     * older than) their parents, so eviction trims prefixes from the end. */
    for (int i = seq->n_blocks - 1; i >= 0; i--)
        rlai_kv_block_unref(kv, seq->blocks[i]);
    free(seq->blocks);
    memset(seq, 0, sizeof(*seq));
}

static inline size_t kv_offset(const rlai_kv_cache *kv, const rlai_kv_seq *seq, int pos)
{
    int32_t b = seq->blocks[pos / RLAI_KV_BLOCK];
    return ((size_t)b * RLAI_KV_BLOCK + (size_t)(pos % RLAI_KV_BLOCK)) * kv->row_bytes;
}

void rlai_kv_cache_layer_view(rlai_kv_cache *kv, int layer, void **k, void **v, size_t *row_bytes)
{
    *k = kv->k[layer];
    *v = kv->v[layer];
    *row_bytes = kv->row_bytes;
}

void *rlai_kv_k_at(rlai_kv_cache *kv, const rlai_kv_seq *seq, int layer, int pos)
{
    return kv->k[layer] + kv_offset(kv, seq, pos);
}

void *rlai_kv_v_at(rlai_kv_cache *kv, const rlai_kv_seq *seq, int layer, int pos)
{
    return kv->v[layer] + kv_offset(kv, seq, pos);
}

/* ---- prefix cache */

void rlai_kv_cache_set_prefix_caching(rlai_kv_cache *kv, bool on)
{
    kv->prefix_on = on;
}

bool rlai_kv_cache_prefix_caching(const rlai_kv_cache *kv)
{
    return kv->prefix_on;
}

int rlai_kv_prefix_attach(rlai_kv_cache *kv, rlai_kv_seq *seq, const int32_t *tokens, int n,
                          int max_tokens)
{
    if (seq->n_blocks != 0 || n < 0)
        return RLAI_ERR_INVALID_ARG;
    kv->lookups++;
    int lim = n < max_tokens ? n : max_tokens;
    int nb = kv->prefix_on && lim > 0 ? lim / RLAI_KV_BLOCK : 0;
    uint64_t pkey = 0, pserial = 0;
    int i;
    for (i = 0; i < nb; i++) {
        const int32_t *t = tokens + (size_t)i * RLAI_KV_BLOCK;
        uint64_t key = block_key(kv, pkey, t);
        int32_t b = hash_find(kv, key, pkey, pserial, t);
        if (b < 0)
            break;
        if (seq_grow(seq, i + 1) < 0) {
            rlai_kv_seq_release(kv, seq);
            return RLAI_ERR_NOMEM;
        }
        rlai_kv_block_ref(kv, b);
        seq->blocks[seq->n_blocks++] = b;
        pkey = key;
        pserial = kv->meta[b].serial;
    }
    seq->n_tokens = i * RLAI_KV_BLOCK;
    seq->n_committed = i;
    seq->last_key = pkey;
    kv->tokens_reused += (uint64_t)i * RLAI_KV_BLOCK;
    return i * RLAI_KV_BLOCK;
}

void rlai_kv_prefix_commit(rlai_kv_cache *kv, rlai_kv_seq *seq, const int32_t *tokens, int n_tokens)
{
    if (!kv->prefix_on || n_tokens <= 0)
        return;
    int full = n_tokens / RLAI_KV_BLOCK;
    if (full > seq->n_blocks)
        full = seq->n_blocks;
    for (int i = seq->n_committed; i < full; i++) {
        const int32_t *t = tokens + (size_t)i * RLAI_KV_BLOCK;
        const struct kv_meta *parent = i ? &kv->meta[seq->blocks[i - 1]] : NULL;
        if (parent && !parent->registered)
            break; /* inconsistent table (n_committed edited by hand): nothing to chain to */
        uint64_t pkey = parent ? parent->key : 0, pserial = parent ? parent->serial : 0;
        uint64_t key = block_key(kv, pkey, t);
        int32_t own = seq->blocks[i];
        int32_t b = hash_find(kv, key, pkey, pserial, t);
        if (b >= 0) {
            if (b != own) { /* an equal block exists: share it, drop ours */
                rlai_kv_block_ref(kv, b);
                seq->blocks[i] = b;
                rlai_kv_block_unref(kv, own);
            }
        } else if (kv->meta[own].registered) {
            /* Our block is registered under another identity (a sharer
             * committed different tokens for it): it cannot be re-keyed,
             * and nothing after it can chain to it. */
            break;
        } else {
            /* A block shared after a fork is registered as well: shared
             * blocks are never written (prepare_write copies them), so
             * every sharer holds the same content. */
            block_register(kv, own, key, pkey, pserial, t);
        }
        seq->n_committed = i + 1;
        seq->last_key = key;
    }
}

static inline bool needs_copy(const rlai_kv_cache *kv, int32_t b)
{
    return kv->refcount[b] > 1 || kv->meta[b].registered;
}

int rlai_kv_seq_prepare_write(rlai_kv_cache *kv, rlai_kv_seq *seq, int pos0, int pos1)
{
    if (pos0 < 0 || pos1 < pos0)
        return RLAI_ERR_INVALID_ARG;
    if (pos1 == pos0)
        return 0;
    int b0 = pos0 / RLAI_KV_BLOCK;
    int b1 = (pos1 - 1) / RLAI_KV_BLOCK + 1; /* exclusive */
    int have = b1 < seq->n_blocks ? b1 : seq->n_blocks;
    int need = b1 > seq->n_blocks ? b1 - seq->n_blocks : 0;
    for (int i = b0; i < have; i++)
        need += needs_copy(kv, seq->blocks[i]);
    /* Each copy frees or caches its source only after taking its new
     * block, so `need` blocks must be obtainable now. */
    if (need > rlai_kv_cache_n_free(kv))
        return RLAI_ERR_KV_FULL;
    if (seq_grow(seq, b1) < 0)
        return RLAI_ERR_NOMEM;
    for (int i = b0; i < have; i++) {
        int32_t old = seq->blocks[i];
        if (!needs_copy(kv, old))
            continue;
        int32_t nb = rlai_kv_block_alloc(kv); /* cannot fail: checked above; never evicts `old` (refcount > 0) */
        size_t so = (size_t)old * kv->block_bytes, d = (size_t)nb * kv->block_bytes;
        for (int l = 0; l < kv->n_layer; l++) {
            if (kv->be && !kv->be->iface->host_memory) {
                kv->be->iface->copy(kv->be, kv->k[l], d, kv->k[l], so, kv->block_bytes);
                kv->be->iface->copy(kv->be, kv->v[l], d, kv->v[l], so, kv->block_bytes);
                continue;
            }
            memcpy(kv->k[l] + d, kv->k[l] + so, kv->block_bytes);
            memcpy(kv->v[l] + d, kv->v[l] + so, kv->block_bytes);
        }
        seq->blocks[i] = nb;
        rlai_kv_block_unref(kv, old);
    }
    while (seq->n_blocks < b1)
        seq->blocks[seq->n_blocks++] = rlai_kv_block_alloc(kv);
    if (b0 < seq->n_committed) {
        seq->n_committed = b0;
        seq->last_key = b0 ? kv->meta[seq->blocks[b0 - 1]].key : 0;
    }
    return 0;
}

int rlai_kv_seq_truncate(rlai_kv_cache *kv, rlai_kv_seq *seq, int n_tokens)
{
    if (n_tokens < 0 || n_tokens > seq->n_blocks * RLAI_KV_BLOCK)
        return RLAI_ERR_INVALID_ARG;
    int keep = (n_tokens + RLAI_KV_BLOCK - 1) / RLAI_KV_BLOCK;
    int dropped = seq->n_blocks - keep;
    /* last block first, as in release: deeper blocks age out first */
    while (seq->n_blocks > keep)
        rlai_kv_block_unref(kv, seq->blocks[--seq->n_blocks]);
    seq->n_tokens = n_tokens;
    int full = n_tokens / RLAI_KV_BLOCK;
    if (seq->n_committed > full) {
        seq->n_committed = full;
        seq->last_key = full ? kv->meta[seq->blocks[full - 1]].key : 0;
    }
    return dropped;
}

int rlai_kv_seq_fork(rlai_kv_cache *kv, const rlai_kv_seq *src, rlai_kv_seq *dst)
{
    if (dst->n_blocks != 0 || src == dst)
        return RLAI_ERR_INVALID_ARG;
    if (seq_grow(dst, src->n_blocks) < 0)
        return RLAI_ERR_NOMEM;
    for (int i = 0; i < src->n_blocks; i++) {
        rlai_kv_block_ref(kv, src->blocks[i]);
        dst->blocks[i] = src->blocks[i];
    }
    dst->n_blocks = src->n_blocks;
    dst->n_tokens = src->n_tokens;
    dst->n_committed = src->n_committed;
    dst->last_key = src->last_key;
    return 0;
}

int rlai_kv_prefix_pin(rlai_kv_cache *kv, const int32_t *tokens, int n)
{
    uint64_t pkey = 0, pserial = 0;
    int i;
    for (i = 0; i < n / RLAI_KV_BLOCK; i++) {
        const int32_t *t = tokens + (size_t)i * RLAI_KV_BLOCK;
        uint64_t key = block_key(kv, pkey, t);
        int32_t b = hash_find(kv, key, pkey, pserial, t);
        if (b < 0)
            break;
        struct kv_meta *m = &kv->meta[b];
        if (m->pin++ == 0) {
            kv->n_pinned++;
            if (m->on_lru)
                lru_unlink(kv, b);
        }
        pkey = key;
        pserial = m->serial;
    }
    return i * RLAI_KV_BLOCK;
}

int rlai_kv_prefix_unpin(rlai_kv_cache *kv, const int32_t *tokens, int n)
{
    uint64_t pkey = 0, pserial = 0;
    int32_t at = -1; /* each deeper block goes before its parent in the LRU list */
    int i;
    for (i = 0; i < n / RLAI_KV_BLOCK; i++) {
        const int32_t *t = tokens + (size_t)i * RLAI_KV_BLOCK;
        uint64_t key = block_key(kv, pkey, t);
        int32_t b = hash_find(kv, key, pkey, pserial, t);
        if (b < 0 || kv->meta[b].pin == 0)
            break;
        struct kv_meta *m = &kv->meta[b];
        if (--m->pin == 0) {
            kv->n_pinned--;
            if (kv->refcount[b] == 0) {
                lru_insert_before(kv, b, at);
                at = b;
            }
        }
        pkey = key;
        pserial = m->serial;
    }
    return i * RLAI_KV_BLOCK;
}

void rlai_kv_cache_stats(const rlai_kv_cache *kv, rlai_kv_stats *out)
{
    out->blocks_total = kv->n_blocks;
    out->blocks_free = kv->n_free;
    out->blocks_used = kv->n_used;
    out->blocks_cached = kv->n_blocks - kv->n_free - kv->n_used;
    out->blocks_pinned = kv->n_pinned;
    out->lookups = kv->lookups;
    out->tokens_reused = kv->tokens_reused;
    out->evictions = kv->evictions;
}

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            if (err && errlen)                                                                     \
                snprintf(err, errlen, __VA_ARGS__);                                                \
            rc = RLAI_ERR_FORMAT;                                                                  \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

int rlai_kv_cache_check(const rlai_kv_cache *kv, rlai_kv_seq *const *seqs, int n_seqs,
                        char *err, size_t errlen)
{
    const int N = kv->n_blocks;
    int rc = 0;
    uint32_t *refs = calloc((size_t)N, sizeof(uint32_t));
    unsigned char *mark = calloc((size_t)N, 1); /* bit 1: on free stack, bit 2: in hash */
    if (!refs || !mark) {
        free(refs);
        free(mark);
        return RLAI_ERR_NOMEM;
    }
    if (err && errlen)
        err[0] = '\0';

    /* Block tables: counts, shapes, committed chains. */
    for (int s = 0; s < n_seqs; s++) {
        const rlai_kv_seq *q = seqs[s];
        if (!q)
            continue;
        CHECK(q->n_blocks >= 0 && q->n_blocks <= q->cap && (q->cap == 0 || q->blocks),
              "seq %d: n_blocks %d, cap %d", s, q->n_blocks, q->cap);
        CHECK(q->n_tokens >= 0 && q->n_tokens <= q->n_blocks * RLAI_KV_BLOCK,
              "seq %d: n_tokens %d exceeds %d blocks", s, q->n_tokens, q->n_blocks);
        CHECK(q->n_committed >= 0 && q->n_committed <= q->n_blocks,
              "seq %d: n_committed %d of %d blocks", s, q->n_committed, q->n_blocks);
        for (int i = 0; i < q->n_blocks; i++) {
            int32_t b = q->blocks[i];
            CHECK(b >= 0 && b < N, "seq %d block %d: bad id %d", s, i, (int)b);
            refs[b]++;
        }
        for (int i = 0; i < q->n_committed; i++) {
            const struct kv_meta *m = &kv->meta[q->blocks[i]];
            const struct kv_meta *p = i ? &kv->meta[q->blocks[i - 1]] : NULL;
            CHECK(m->registered, "seq %d: committed block %d (id %d) not registered", s, i,
                  (int)q->blocks[i]);
            CHECK(m->parent_key == (p ? p->key : 0) && m->parent_serial == (p ? p->serial : 0),
                  "seq %d: committed block %d does not chain to block %d", s, i, i - 1);
        }
        uint64_t lk = q->n_committed ? kv->meta[q->blocks[q->n_committed - 1]].key : 0;
        CHECK(q->last_key == lk, "seq %d: last_key does not match block %d", s, q->n_committed - 1);
    }

    /* Free stack. */
    CHECK(kv->n_free >= 0 && kv->n_free <= N, "n_free %d", kv->n_free);
    for (int i = 0; i < kv->n_free; i++) {
        int32_t b = kv->free_stack[i];
        CHECK(b >= 0 && b < N, "free stack slot %d: bad id %d", i, (int)b);
        CHECK(!(mark[b] & 1), "block %d twice on the free stack", (int)b);
        mark[b] |= 1;
        const struct kv_meta *m = &kv->meta[b];
        CHECK(kv->refcount[b] == 0 && !m->registered && m->pin == 0 && !m->on_lru,
              "free block %d: refcount %u, registered %d, pin %u, on_lru %d", (int)b,
              kv->refcount[b], m->registered, m->pin, m->on_lru);
    }

    /* Per-block states. */
    int used = 0, cached = 0, pinned = 0, registered = 0, evictable = 0;
    for (int b = 0; b < N; b++) {
        const struct kv_meta *m = &kv->meta[b];
        CHECK(kv->refcount[b] == refs[b], "block %d: refcount %u but %u table references", b,
              kv->refcount[b], refs[b]);
        bool is_free = mark[b] & 1;
        if (kv->refcount[b] > 0)
            used++;
        else if (m->registered)
            cached++;
        else
            CHECK(is_free, "block %d: unreferenced, unregistered and not free (leaked)", b);
        CHECK(m->pin == 0 || m->registered, "block %d: pinned but not registered", b);
        pinned += m->pin > 0;
        registered += m->registered;
        bool want_lru = m->registered && kv->refcount[b] == 0 && m->pin == 0;
        CHECK(m->on_lru == want_lru, "block %d: on_lru %d, expected %d", b, m->on_lru, want_lru);
        evictable += want_lru;
        if (m->registered) {
            CHECK(m->key != 0 && m->key == block_key(kv, m->parent_key, m->tokens),
                  "block %d: key does not hash its parent key and tokens", b);
            CHECK(m->serial > m->parent_serial && m->serial <= kv->next_serial,
                  "block %d: serial %llu, parent serial %llu", b, (unsigned long long)m->serial,
                  (unsigned long long)m->parent_serial);
            CHECK((m->parent_key == 0) == (m->parent_serial == 0),
                  "block %d: parent key and serial disagree on being a root", b);
        }
    }
    CHECK(kv->n_free + used + cached == N, "free %d + used %d + cached %d != %d blocks",
          kv->n_free, used, cached, N);
    CHECK(used == kv->n_used && pinned == kv->n_pinned && registered == kv->n_registered &&
              evictable == kv->n_lru,
          "counters: used %d/%d pinned %d/%d registered %d/%d evictable %d/%d", used, kv->n_used,
          pinned, kv->n_pinned, registered, kv->n_registered, evictable, kv->n_lru);

    /* LRU list: well linked, exactly the evictable blocks. */
    int steps = 0;
    int32_t prev = -1;
    for (int32_t b = kv->lru_head; b >= 0; b = kv->meta[b].lru_next) {
        CHECK(b < N && steps < N, "LRU list: bad id or cycle");
        CHECK(kv->meta[b].on_lru && kv->meta[b].lru_prev == prev, "LRU list: block %d badly linked",
              (int)b);
        prev = b;
        steps++;
    }
    CHECK(kv->lru_tail == prev && steps == kv->n_lru, "LRU list: tail %d / %d entries vs %d",
          (int)kv->lru_tail, steps, kv->n_lru);

    /* Hash index: exactly the registered blocks, each findable as itself
     * (so no two registered blocks share an identity). */
    steps = 0;
    for (size_t h = 0; h <= kv->bucket_mask; h++) {
        for (int32_t b = kv->buckets[h]; b >= 0; b = kv->meta[b].hnext) {
            CHECK(b < N && steps < N, "hash index: bad id or cycle in bucket %zu", h);
            const struct kv_meta *m = &kv->meta[b];
            CHECK(m->registered && (m->key & kv->bucket_mask) == h && !(mark[b] & 2),
                  "hash index: block %d misplaced or unregistered", (int)b);
            mark[b] |= 2;
            CHECK(hash_find(kv, m->key, m->parent_key, m->parent_serial, m->tokens) == b,
                  "hash index: block %d duplicates another registered block", (int)b);
            steps++;
        }
    }
    CHECK(steps == registered, "hash index holds %d blocks, %d registered", steps, registered);
out:
    free(refs);
    free(mark);
    return rc;
}
