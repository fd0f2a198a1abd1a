/* tokenizer.c - byte-level BPE ("gpt2") and SentencePiece ("llama")
 * tokenizers built from GGUF tokenizer.* metadata.
 *
 * Behaviour follows llama.cpp's llama-vocab as described in
 * shared/reference/llama-gguf-facts.md §4/§5:
 *  - special-token partition (longest text first; CONTROL/UNKNOWN only when
 *    parse_special, USER_DEFINED always);
 *  - BPE: pre-tokenizer split (hand-written matchers for the GPT-2,
 *    digits+GPT-2, llama3 and qwen2 regexes; regexes applied sequentially,
 *    gaps kept), GPT-2 byte-to-unicode map, merges lowest rank first with the
 *    leftmost pair winning ties, optional ignore_merges, per-byte fallback;
 *  - SPM: "▁" for spaces, optional space prefix, bigram merges by score
 *    (highest first, leftmost on ties), <0xXX> byte fallback.
 *
 * Invalid UTF-8 in the input is classified like U+FFFD by the
 * pre-tokenizer but its original bytes are kept, so byte-level BPE still
 * round-trips arbitrary bytes.
 *
 * All strings (vocabulary tokens plus merge parts/results that are not
 * tokens) are interned in one table; merges map a pair of string ids to a
 * (rank, result id) with an open-addressing hash table, so BPE runs on ids.
 */
#include "tokenizer.h"
#include "hash.h"
#include "rlai/error.h"
#include "unicode.h"
#include "rlai/engine.h"

#include <limits.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { KIND_BPE = 1, KIND_SPM = 2 };
enum { PRE_GPT2 = 1, PRE_DIGITS_GPT2 = 2, PRE_LLAMA3 = 3, PRE_QWEN2 = 4 };

/* Largest input accepted by encode (offsets are kept in 32 bits and SPM
 * escaping may triple the size). */
#define TOK_MAX_INPUT ((size_t)512 << 20)

struct mslot {
    uint64_t key;      /* (left id << 32) | right id; UINT64_MAX = empty */
    int32_t rank;
    int32_t res;       /* string id of the merged text */
};

struct rlai_tokenizer {
    int kind, pre;
    bool ignore_merges, add_bos, add_eos, add_space_prefix;
    int32_t n_vocab;
    int32_t bos, eos, unk, eot, eom;

    /* Interned strings: ids 0..n_vocab-1 are the tokens, then extras. */
    char *sblob;
    size_t sblob_len, sblob_cap;
    uint32_t *soff, *slen, *shash;
    int32_t n_str, str_cap;
    int32_t *smap;            /* open addressing: string id or -1 */
    size_t smap_mask;

    struct mslot *mmap;       /* merge ranks (BPE) */
    size_t mmap_mask;

    uint8_t *attr;            /* enum rlai_token_attr per token */
    float *scores;            /* SPM scores */
    uint8_t *eog;             /* 1 if end-of-generation */

    /* Decoded bytes of every token (before the render_special rule). */
    char *pblob;
    uint32_t *poff, *plen;

    int32_t byte_sym[256];    /* BPE: string id of the mapped char of byte b */
    int32_t byte_tok[256];    /* token for a single byte (fallback) */
    char bmap[256][3];        /* BPE: UTF-8 of the byte's mapped code point */
    uint8_t bmap_len[256];

    int32_t *special;         /* special-token candidates, longest first */
    int32_t n_special;
};

/* ------------------------------------------------------------------ */
/* helpers                                                              */

static uint32_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = rlai_hash_bytes(s, n);
    return (uint32_t)(h ^ (h >> 32));
}

static size_t pow2_at_least(size_t n)
{
    size_t c = 16;
    while (c < n)
        c <<= 1;
    return c;
}

/* ------------------------------------------------------------------ */
/* string interning                                                     */

static int32_t str_find_h(const rlai_tokenizer *t, const char *s, size_t n, uint32_t h)
{
    size_t i = h & t->smap_mask;
    for (;;) {
        int32_t id = t->smap[i];
        if (id < 0)
            return -1;
        if (t->shash[id] == h && t->slen[id] == n && memcmp(t->sblob + t->soff[id], s, n) == 0)
            return id;
        i = (i + 1) & t->smap_mask;
    }
}

static int32_t str_find(const rlai_tokenizer *t, const char *s, size_t n)
{
    return str_find_h(t, s, n, hash_bytes(s, n));
}

static int smap_rehash(rlai_tokenizer *t, size_t cap)
{
    int32_t *m = malloc(cap * sizeof *m);
    if (!m)
        return RLAI_ERR_NOMEM;
    memset(m, 0xff, cap * sizeof *m);
    size_t mask = cap - 1;
    for (size_t i = 0; i <= t->smap_mask && t->smap; i++) {
        int32_t id = t->smap[i];
        if (id < 0)
            continue;
        size_t j = t->shash[id] & mask;
        while (m[j] >= 0)
            j = (j + 1) & mask;
        m[j] = id;
    }
    free(t->smap);
    t->smap = m;
    t->smap_mask = mask;
    return 0;
}

/* Appends a new string entry (no map update). Returns its id or an error. */
static int32_t str_append(rlai_tokenizer *t, const char *s, size_t n, uint32_t h)
{
    if (n > UINT32_MAX || t->sblob_len + n > UINT32_MAX || t->n_str == INT32_MAX)
        return RLAI_ERR_TOO_LARGE;
    if (t->n_str == t->str_cap) {
        int32_t nc = t->str_cap ? t->str_cap : 1024;
        nc = nc > INT32_MAX / 2 ? INT32_MAX : nc * 2;
        uint32_t *a = realloc(t->soff, (size_t)nc * sizeof *a);
        if (!a)
            return RLAI_ERR_NOMEM;
        t->soff = a;
        a = realloc(t->slen, (size_t)nc * sizeof *a);
        if (!a)
            return RLAI_ERR_NOMEM;
        t->slen = a;
        a = realloc(t->shash, (size_t)nc * sizeof *a);
        if (!a)
            return RLAI_ERR_NOMEM;
        t->shash = a;
        t->str_cap = nc;
    }
    if (t->sblob_len + n > t->sblob_cap) {
        size_t nc = t->sblob_cap ? t->sblob_cap : 4096;
        while (nc < t->sblob_len + n)
            nc *= 2;
        char *b = realloc(t->sblob, nc);
        if (!b)
            return RLAI_ERR_NOMEM;
        t->sblob = b;
        t->sblob_cap = nc;
    }
    if (n)
        memcpy(t->sblob + t->sblob_len, s, n);
    int32_t id = t->n_str++;
    t->soff[id] = (uint32_t)t->sblob_len;
    t->slen[id] = (uint32_t)n;
    t->shash[id] = h;
    t->sblob_len += n;
    return id;
}

static int smap_insert_id(rlai_tokenizer *t, int32_t id, bool replace)
{
    if ((size_t)t->n_str * 2 > t->smap_mask + 1) {
        int rc = smap_rehash(t, (t->smap_mask + 1) * 2);
        if (rc)
            return rc;
    }
    uint32_t h = t->shash[id];
    size_t i = h & t->smap_mask;
    for (;;) {
        int32_t o = t->smap[i];
        if (o < 0) {
            t->smap[i] = id;
            return 0;
        }
        if (t->shash[o] == h && t->slen[o] == t->slen[id] &&
            memcmp(t->sblob + t->soff[o], t->sblob + t->soff[id], t->slen[id]) == 0) {
            if (replace)
                t->smap[i] = id;
            return 0;
        }
        i = (i + 1) & t->smap_mask;
    }
}

/* Returns the id of s, adding it as an extra string if absent. */
static int32_t str_intern(rlai_tokenizer *t, const char *s, size_t n)
{
    uint32_t h = hash_bytes(s, n);
    int32_t id = str_find_h(t, s, n, h);
    if (id >= 0)
        return id;
    id = str_append(t, s, n, h);
    if (id < 0)
        return id;
    int rc = smap_insert_id(t, id, false);
    return rc ? rc : id;
}

/* ------------------------------------------------------------------ */
/* merges map                                                           */

static const struct mslot *merge_find(const rlai_tokenizer *t, int32_t a, int32_t b)
{
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t i = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 32) & t->mmap_mask;
    for (;;) {
        const struct mslot *s = &t->mmap[i];
        if (s->key == key)
            return s;
        if (s->key == UINT64_MAX)
            return NULL;
        i = (i + 1) & t->mmap_mask;
    }
}

static void merge_insert(rlai_tokenizer *t, int32_t a, int32_t b, int32_t rank, int32_t res)
{
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t i = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 32) & t->mmap_mask;
    for (;;) {
        struct mslot *s = &t->mmap[i];
        if (s->key == key)
            return;            /* first (lowest) rank wins */
        if (s->key == UINT64_MAX) {
            s->key = key;
            s->rank = rank;
            s->res = res;
            return;
        }
        i = (i + 1) & t->mmap_mask;
    }
}

/* ------------------------------------------------------------------ */
/* GPT-2 byte <-> unicode map                                           */

static bool byte_is_direct(int b)
{
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

/* Fills cp_of[256] with the mapped code point of each byte. */
static void byte_map(uint32_t cp_of[256])
{
    uint32_t next = 256;
    for (int b = 0; b < 256; b++)
        cp_of[b] = byte_is_direct(b) ? (uint32_t)b : next++;
}

/* ------------------------------------------------------------------ */
/* load                                                                 */

static const struct {
    const char *name;
    int pre;
} pre_names[] = {
    {"gpt-2", PRE_GPT2}, {"phi-2", PRE_GPT2}, {"mpt", PRE_GPT2}, {"olmo", PRE_GPT2},
    {"jais", PRE_GPT2}, {"roberta-bpe", PRE_GPT2}, {"gigachat", PRE_GPT2},
    {"jina-es", PRE_GPT2}, {"jina-de", PRE_GPT2}, {"jina-v1-en", PRE_GPT2},
    {"jina-v2-es", PRE_GPT2}, {"jina-v2-de", PRE_GPT2}, {"jina-v2-code", PRE_GPT2},
    {"smollm", PRE_DIGITS_GPT2}, {"starcoder", PRE_DIGITS_GPT2}, {"refact", PRE_DIGITS_GPT2},
    {"command-r", PRE_DIGITS_GPT2}, {"codeshell", PRE_DIGITS_GPT2}, {"exaone", PRE_DIGITS_GPT2},
    {"minerva-7b", PRE_DIGITS_GPT2},
    {"llama3", PRE_LLAMA3}, {"llama-v3", PRE_LLAMA3}, {"llama-bpe", PRE_LLAMA3},
    {"falcon3", PRE_LLAMA3},
    {"qwen2", PRE_QWEN2}, {"deepseek-r1-qwen", PRE_QWEN2}, {"megrez", PRE_QWEN2},
    {"stablelm2", PRE_QWEN2},
};

static atomic_flag default_pre_warned = ATOMIC_FLAG_INIT;

static bool str_eq(const char *p, size_t n, const char *lit)
{
    size_t m = strlen(lit);
    return n == m && memcmp(p, lit, n) == 0;
}

/* Reads an optional token-id key; leaves *id unchanged when absent or out
 * of range. */
static int read_id(const rlai_gguf *g, const char *key, int32_t n_vocab, int32_t *id)
{
    uint32_t v;
    int rc = rlai_gguf_get_u32(g, key, &v);
    if (rc == RLAI_ERR_NOT_FOUND)
        return 0;
    if (rc == 0) {
        if (v < (uint32_t)n_vocab)
            *id = (int32_t)v;
        return 0;
    }
    int32_t s;
    rc = rlai_gguf_get_i32(g, key, &s);    /* e.g. -1 stored as i32 */
    if (rc == 0) {
        if (s < 0)
            *id = -1;
        return 0;
    }
    return rc;
}

static int read_bool(const rlai_gguf *g, const char *key, bool *b)
{
    int rc = rlai_gguf_get_bool(g, key, b);
    return rc == RLAI_ERR_NOT_FOUND ? 0 : rc;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

/* Computes the decoded bytes of every token into t->pblob. */
static int build_pieces(rlai_tokenizer *t)
{
    size_t total = 0;
    for (int32_t i = 0; i < t->n_vocab; i++)
        total += t->slen[i];
    if (total > UINT32_MAX)
        return RLAI_ERR_TOO_LARGE;
    t->pblob = malloc(total ? total : 1);
    t->poff = malloc((size_t)t->n_vocab * sizeof *t->poff);
    t->plen = malloc((size_t)t->n_vocab * sizeof *t->plen);
    if (!t->pblob || !t->poff || !t->plen)
        return RLAI_ERR_NOMEM;

    int inv[0x144];
    uint32_t cp_of[256];
    byte_map(cp_of);
    for (int i = 0; i < 0x144; i++)
        inv[i] = -1;
    for (int b = 0; b < 256; b++)
        inv[cp_of[b]] = b;

    size_t o = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        const char *s = t->sblob + t->soff[i];
        size_t n = t->slen[i];
        int a = t->attr[i];
        t->poff[i] = (uint32_t)o;
        if (a == RLAI_TOKEN_CONTROL || a == RLAI_TOKEN_USER_DEFINED || a == RLAI_TOKEN_UNKNOWN) {
            memcpy(t->pblob + o, s, n);
            o += n;
        } else if (a == RLAI_TOKEN_UNUSED) {
            /* nothing */
        } else if (t->kind == KIND_SPM) {
            if (a == RLAI_TOKEN_BYTE) {
                int hi = n == 6 ? hexval(s[3]) : -1, lo = n == 6 ? hexval(s[4]) : -1;
                if (hi >= 0 && lo >= 0 && memcmp(s, "<0x", 3) == 0 && s[5] == '>')
                    t->pblob[o++] = (char)(hi * 16 + lo);
            } else {
                for (size_t k = 0; k < n;) {
                    if (k + 3 <= n && (unsigned char)s[k] == 0xE2 && (unsigned char)s[k + 1] == 0x96 &&
                        (unsigned char)s[k + 2] == 0x81) {
                        t->pblob[o++] = ' ';
                        k += 3;
                    } else {
                        t->pblob[o++] = s[k++];
                    }
                }
            }
        } else if (a == RLAI_TOKEN_NORMAL) {
            /* BPE: inverse byte map; code points outside it are copied. */
            for (size_t k = 0; k < n;) {
                uint32_t cp;
                int l = rlai_utf8_decode(s + k, n - k, &cp);
                if (cp < 0x144 && inv[cp] >= 0) {
                    t->pblob[o++] = (char)inv[cp];
                } else {
                    memcpy(t->pblob + o, s + k, (size_t)l);
                    o += (size_t)l;
                }
                k += (size_t)l;
            }
        }
        t->plen[i] = (uint32_t)(o - t->poff[i]);
    }
    return 0;
}

static int cmp_special(const void *pa, const void *pb, void *ctx)
{
    const rlai_tokenizer *t = ctx;
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    if (t->slen[a] != t->slen[b])
        return t->slen[a] > t->slen[b] ? -1 : 1;
    return a < b ? -1 : a > b;
}

static const char *const eog_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
    "<|eom_id|>", "<EOT>", "_<EOT>",
    /* FIM pad / repo / file-separator tokens (llama.cpp adds them to EOG) */
    "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>",
    "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>",
    "<|file_sep|>",
};
static const char *const eot_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
    "<EOT>", "_<EOT>", "<\xef\xbd\x9c" "end\xe2\x96\x81" "of\xe2\x96\x81" "sentence\xef\xbd\x9c>",
};

static int load_impl(rlai_tokenizer *t, const rlai_gguf *g, char *err, size_t errlen)
{
    int rc;
    rlai_gguf_str model;
    rc = rlai_gguf_get_str(g, "tokenizer.ggml.model", &model);
    if (rc) {
        rlai_errf(err, errlen, 0, "tokenizer.ggml.model is %s", rc == RLAI_ERR_NOT_FOUND ? "missing" : "not a string");
        return rc == RLAI_ERR_NOT_FOUND ? RLAI_ERR_FORMAT : rc;
    }
    if (str_eq(model.ptr, model.len, "gpt2")) {
        t->kind = KIND_BPE;
    } else if (str_eq(model.ptr, model.len, "llama")) {
        t->kind = KIND_SPM;
    } else {
        rlai_errf(err, errlen, 0, "unsupported tokenizer model '%.*s'", (int)(model.len > 64 ? 64 : model.len), model.ptr);
        return RLAI_ERR_UNSUPPORTED;
    }

    if (t->kind == KIND_BPE) {
        rlai_gguf_str pre;
        rc = rlai_gguf_get_str(g, "tokenizer.ggml.pre", &pre);
        if (rc == RLAI_ERR_NOT_FOUND || (rc == 0 && str_eq(pre.ptr, pre.len, "default"))) {
            t->pre = PRE_GPT2;
            if (!atomic_flag_test_and_set(&default_pre_warned))
                fprintf(stderr, "rlai tokenizer: warning: tokenizer.ggml.pre missing; using the GPT-2 "
                                "pre-tokenizer (generation quality may be degraded)\n");
        } else if (rc) {
            rlai_errf(err, errlen, 0, "tokenizer.ggml.pre is not a string");
            return rc;
        } else {
            for (size_t i = 0; i < sizeof pre_names / sizeof pre_names[0]; i++)
                if (str_eq(pre.ptr, pre.len, pre_names[i].name))
                    t->pre = pre_names[i].pre;
            if (!t->pre) {
                rlai_errf(err, errlen, 0, "unsupported pre-tokenizer '%.*s' (tokenizer.ggml.pre)",
                        (int)(pre.len > 64 ? 64 : pre.len), pre.ptr);
                return RLAI_ERR_UNSUPPORTED;
            }
        }
        if (t->pre == PRE_LLAMA3) {
            t->ignore_merges = true;
            t->add_bos = true;
        }
    } else {
        t->add_bos = true;
        t->add_space_prefix = true;
    }

    /* tokens */
    rlai_gguf_str *toks = NULL;
    uint64_t n_tok = 0;
    rc = rlai_gguf_get_str_array(g, "tokenizer.ggml.tokens", &toks, &n_tok);
    if (rc) {
        rlai_errf(err, errlen, 0, "tokenizer.ggml.tokens is %s",
                rc == RLAI_ERR_NOT_FOUND ? "missing" : "not an array of strings");
        return rc == RLAI_ERR_NOT_FOUND ? RLAI_ERR_FORMAT : rc;
    }
    if (n_tok == 0 || n_tok > (uint64_t)INT32_MAX / 4) {
        free(toks);
        rlai_errf(err, errlen, 0, "tokenizer.ggml.tokens has %llu entries", (unsigned long long)n_tok);
        return RLAI_ERR_FORMAT;
    }
    t->n_vocab = (int32_t)n_tok;
    rc = smap_rehash(t, pow2_at_least(n_tok * 2 + 1024));
    for (uint64_t i = 0; rc == 0 && i < n_tok; i++) {
        int32_t id = str_append(t, toks[i].ptr, toks[i].len, hash_bytes(toks[i].ptr, toks[i].len));
        if (id < 0)
            rc = id;
        else if (toks[i].len > 0)
            rc = smap_insert_id(t, id, true);    /* duplicates: last id wins */
    }
    free(toks);
    if (rc) {
        rlai_errf(err, errlen, 0, "cannot store the vocabulary");
        return rc;
    }

    /* attributes, scores */
    t->attr = malloc((size_t)t->n_vocab);
    t->eog = calloc((size_t)t->n_vocab, 1);
    t->scores = calloc((size_t)t->n_vocab, sizeof *t->scores);
    if (!t->attr || !t->eog || !t->scores)
        return RLAI_ERR_NOMEM;
    memset(t->attr, RLAI_TOKEN_NORMAL, (size_t)t->n_vocab);
    uint32_t et;
    uint64_t n;
    const void *data;
    rc = rlai_gguf_get_array(g, "tokenizer.ggml.token_type", &et, &n, &data);
    if (rc == 0) {
        if (n != n_tok || (et != RLAI_GGUF_I32 && et != RLAI_GGUF_U32)) {
            rlai_errf(err, errlen, 0, "tokenizer.ggml.token_type: %llu entries of type %u for %llu tokens",
                    (unsigned long long)n, et, (unsigned long long)n_tok);
            return RLAI_ERR_FORMAT;
        }
        for (uint64_t i = 0; i < n; i++) {
            int32_t v;
            memcpy(&v, (const char *)data + i * 4, 4);
            t->attr[i] = (uint8_t)(v >= 1 && v <= 6 ? v : RLAI_TOKEN_NORMAL);
        }
    } else if (rc != RLAI_ERR_NOT_FOUND) {
        rlai_errf(err, errlen, 0, "tokenizer.ggml.token_type is not an array");
        return rc;
    }
    rc = rlai_gguf_get_array(g, "tokenizer.ggml.scores", &et, &n, &data);
    if (rc == 0) {
        if (n != n_tok || et != RLAI_GGUF_F32) {
            rlai_errf(err, errlen, 0, "tokenizer.ggml.scores: %llu entries of type %u for %llu tokens",
                    (unsigned long long)n, et, (unsigned long long)n_tok);
            return RLAI_ERR_FORMAT;
        }
        memcpy(t->scores, data, (size_t)n * 4);
    } else if (rc != RLAI_ERR_NOT_FOUND) {
        rlai_errf(err, errlen, 0, "tokenizer.ggml.scores is not an array");
        return rc;
    }

    /* merges */
    if (t->kind == KIND_BPE) {
        rlai_gguf_str *mg = NULL;
        uint64_t n_mg = 0;
        rc = rlai_gguf_get_str_array(g, "tokenizer.ggml.merges", &mg, &n_mg);
        if (rc) {
            rlai_errf(err, errlen, 0, "tokenizer.ggml.merges is %s (required for gpt2 tokenizers)",
                    rc == RLAI_ERR_NOT_FOUND ? "missing" : "not an array of strings");
            return rc == RLAI_ERR_NOT_FOUND ? RLAI_ERR_FORMAT : rc;
        }
        if (n_mg > (uint64_t)INT32_MAX / 4) {
            free(mg);
            rlai_errf(err, errlen, 0, "too many merges (%llu)", (unsigned long long)n_mg);
            return RLAI_ERR_FORMAT;
        }
        size_t cap = pow2_at_least((size_t)n_mg * 2 + 16);
        t->mmap = malloc(cap * sizeof *t->mmap);
        if (!t->mmap) {
            free(mg);
            return RLAI_ERR_NOMEM;
        }
        for (size_t i = 0; i < cap; i++)
            t->mmap[i].key = UINT64_MAX;
        t->mmap_mask = cap - 1;
        char *cat = NULL;
        size_t cat_cap = 0;
        for (uint64_t i = 0; i < n_mg && rc == 0; i++) {
            const char *s = mg[i].ptr;
            size_t len = mg[i].len;
            const char *sp = len > 1 ? memchr(s + 1, ' ', len - 1) : NULL;
            if (!sp || sp + 1 == s + len)
                continue;            /* malformed: ignored */
            size_t la = (size_t)(sp - s), lb = len - la - 1;
            if (la + lb > cat_cap) {
                char *c2 = realloc(cat, la + lb);
                if (!c2) {
                    rc = RLAI_ERR_NOMEM;
                    break;
                }
                cat = c2;
                cat_cap = la + lb;
            }
            int32_t a = str_intern(t, s, la);
            int32_t b = a < 0 ? a : str_intern(t, sp + 1, lb);
            if (a < 0 || b < 0) {
                rc = a < 0 ? a : b;
                break;
            }
            memcpy(cat, s, la);
            memcpy(cat + la, sp + 1, lb);
            int32_t ab = str_intern(t, cat, la + lb);
            if (ab < 0) {
                rc = ab;
                break;
            }
            merge_insert(t, a, b, (int32_t)i, ab);
        }
        free(cat);
        free(mg);
        if (rc) {
            rlai_errf(err, errlen, 0, "cannot store the merges");
            return rc;
        }
    }

    /* special ids */
    t->bos = t->eos = t->unk = t->eot = t->eom = -1;
    if (t->kind == KIND_SPM) {
        t->bos = 1 < t->n_vocab ? 1 : -1;
        t->eos = 2 < t->n_vocab ? 2 : -1;
        t->unk = 0;
    }
    if ((rc = read_id(g, "tokenizer.ggml.bos_token_id", t->n_vocab, &t->bos)) ||
        (rc = read_id(g, "tokenizer.ggml.eos_token_id", t->n_vocab, &t->eos)) ||
        (rc = read_id(g, "tokenizer.ggml.unknown_token_id", t->n_vocab, &t->unk)) ||
        (rc = read_id(g, "tokenizer.ggml.eot_token_id", t->n_vocab, &t->eot)) ||
        (rc = read_id(g, "tokenizer.ggml.eom_token_id", t->n_vocab, &t->eom))) {
        rlai_errf(err, errlen, 0, "a tokenizer.ggml.*_token_id key has a bad type");
        return rc;
    }
    if ((rc = read_bool(g, "tokenizer.ggml.add_bos_token", &t->add_bos)) ||
        (rc = read_bool(g, "tokenizer.ggml.add_eos_token", &t->add_eos))) {
        rlai_errf(err, errlen, 0, "tokenizer.ggml.add_bos_token/add_eos_token is not a bool");
        return rc;
    }
    if (t->kind == KIND_SPM && (rc = read_bool(g, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix))) {
        rlai_errf(err, errlen, 0, "tokenizer.ggml.add_space_prefix is not a bool");
        return rc;
    }
    if (t->add_bos && t->bos < 0)
        t->add_bos = false;
    if (t->add_eos && t->eos < 0)
        t->add_eos = false;

    /* EOT auto-detection and the EOG set (by token text, as llama.cpp) */
    if (t->eot < 0) {
        for (size_t k = 0; k < sizeof eot_texts / sizeof eot_texts[0] && t->eot < 0; k++) {
            int32_t id = str_find(t, eot_texts[k], strlen(eot_texts[k]));
            if (id >= 0 && id < t->n_vocab)
                t->eot = id;
        }
    }
    if (t->eot >= 0)
        t->attr[t->eot] = RLAI_TOKEN_CONTROL;
    for (size_t k = 0; k < sizeof eog_texts / sizeof eog_texts[0]; k++) {
        int32_t id = str_find(t, eog_texts[k], strlen(eog_texts[k]));
        if (id >= 0 && id < t->n_vocab) {
            t->eog[id] = 1;
            t->attr[id] = RLAI_TOKEN_CONTROL;
        }
    }
    if (t->eos >= 0)
        t->eog[t->eos] = 1;
    if (t->eot >= 0)
        t->eog[t->eot] = 1;
    if (t->eom >= 0)
        t->eog[t->eom] = 1;

    /* special-token candidates, longest text first */
    t->special = malloc((size_t)t->n_vocab * sizeof *t->special);
    if (!t->special)
        return RLAI_ERR_NOMEM;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        int a = t->attr[i];
        if ((a == RLAI_TOKEN_CONTROL || a == RLAI_TOKEN_USER_DEFINED || a == RLAI_TOKEN_UNKNOWN) && t->slen[i] > 0)
            t->special[t->n_special++] = i;
    }
    qsort_r(t->special, (size_t)t->n_special, sizeof *t->special, cmp_special, t);

    /* byte tables */
    if (t->kind == KIND_BPE) {
        uint32_t cp_of[256];
        byte_map(cp_of);
        for (int b = 0; b < 256; b++) {
            t->bmap_len[b] = (uint8_t)rlai_utf8_encode(cp_of[b], t->bmap[b]);
            t->byte_sym[b] = str_find(t, t->bmap[b], t->bmap_len[b]);
            t->byte_tok[b] = t->byte_sym[b] < t->n_vocab ? t->byte_sym[b] : -1;
        }
    } else {
        static const char hex[] = "0123456789ABCDEF";
        for (int b = 0; b < 256; b++) {
            char s[6] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>'};
            int32_t id = str_find(t, s, 6);
            if (id < 0 || id >= t->n_vocab) {
                char c = (char)b;
                id = str_find(t, &c, 1);
            }
            if (id < 0 || id >= t->n_vocab)
                id = t->unk;
            t->byte_tok[b] = id;
            t->byte_sym[b] = -1;
        }
    }

    rc = build_pieces(t);
    if (rc) {
        rlai_errf(err, errlen, 0, "cannot build token pieces");
        return rc;
    }
    return 0;
}

/* On success *out is owned by the caller (rlai_tokenizer_free). Nothing in
 * *out points into g. */
int rlai_tokenizer_load(const rlai_gguf *g, rlai_tokenizer **out, char *err, size_t errlen)
{
    if (!out)
        return RLAI_ERR_INVALID_ARG;
    *out = NULL;
    if (!g) {
        rlai_errf(err, errlen, 0, "no gguf");
        return RLAI_ERR_INVALID_ARG;
    }
    if (err && errlen)
        err[0] = '\0';
    rlai_tokenizer *t = calloc(1, sizeof *t);
    if (!t)
        return RLAI_ERR_NOMEM;
    int rc = load_impl(t, g, err, errlen);
    if (rc) {
        if (err && errlen && !err[0])
            rlai_errf(err, errlen, 0, "tokenizer: %s", rlai_strerror(rc));
        rlai_tokenizer_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

/* Frees everything the tokenizer owns. Accepts NULL. */
void rlai_tokenizer_free(rlai_tokenizer *t)
{
    if (!t)
        return;
    free(t->sblob);
    free(t->soff);
    free(t->slen);
    free(t->shash);
    free(t->smap);
    free(t->mmap);
    free(t->attr);
    free(t->scores);
    free(t->eog);
    free(t->pblob);
    free(t->poff);
    free(t->plen);
    free(t->special);
    free(t);
}

/* Getters: read-only, nothing allocated or transferred; NULL-safe. */
int rlai_tokenizer_n_vocab(const rlai_tokenizer *t) { return t ? t->n_vocab : 0; }
int32_t rlai_tokenizer_bos(const rlai_tokenizer *t) { return t ? t->bos : -1; }
int32_t rlai_tokenizer_eos(const rlai_tokenizer *t) { return t ? t->eos : -1; }
bool rlai_tokenizer_add_bos(const rlai_tokenizer *t) { return t && t->add_bos; }
bool rlai_tokenizer_add_eos(const rlai_tokenizer *t) { return t && t->add_eos; }

bool rlai_tokenizer_is_eog(const rlai_tokenizer *t, int32_t id)
{
    return t && id >= 0 && id < t->n_vocab && t->eog[id];
}

/* Attribute (enum rlai_token_attr) or RLAI_ERR_INVALID_ARG. */
int rlai_tokenizer_attr(const rlai_tokenizer *t, int32_t id)
{
    if (!t || id < 0 || id >= t->n_vocab)
        return RLAI_ERR_INVALID_ARG;
    return t->attr[id];
}

/* text is caller-owned, need not be NUL-terminated. */
int32_t rlai_tokenizer_find(const rlai_tokenizer *t, const char *text, size_t len)
{
    if (!t || (!text && len))
        return -1;
    int32_t id = str_find(t, text, len);
    return id >= 0 && id < t->n_vocab ? id : -1;
}

/* ------------------------------------------------------------------ */
/* encode: scratch state                                                */

enum { F_LETTER = 1, F_NUMBER = 2, F_WS = 4, F_IN = 8 };

struct bsym {           /* BPE symbol */
    int32_t id, prev, next;
    uint32_t start, n;
};
struct bpair {          /* BPE heap entry */
    int32_t rank, left, right, res;
    uint32_t size;
};
struct ssym {           /* SPM symbol */
    int32_t prev, next;
    uint32_t start, n;
};
struct spair {          /* SPM heap entry */
    float score;
    int32_t left, right;
    uint32_t size;
};

struct enc {
    const rlai_tokenizer *t;
    int32_t *out;
    int cap;
    size_t n_out;
    int err;

    /* current fragment, decoded */
    const char *text;
    uint32_t *cp;
    uint8_t *fl;
    uint32_t *off;          /* byte offset of code point i; off[n] = end */

    struct bsym *bs;
    size_t bs_cap;
    struct bpair *bh;
    size_t bh_n, bh_cap;
    struct ssym *ss;
    size_t ss_cap;
    struct spair *sh;
    size_t sh_n, sh_cap;
    char *buf;
    size_t buf_cap;
};

static void emit(struct enc *e, int32_t id)
{
    if (e->n_out < (size_t)e->cap)
        e->out[e->n_out] = id;
    e->n_out++;
}

static bool grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return true;
    size_t nc = *cap ? *cap : 64;
    while (nc < need)
        nc *= 2;
    void *q = realloc(*p, nc * elem);
    if (!q)
        return false;
    *p = q;
    *cap = nc;
    return true;
}

/* --- BPE heap: lowest rank first, then leftmost --- */
static bool bpair_less(const struct bpair *a, const struct bpair *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static bool bheap_push(struct enc *e, struct bpair p)
{
    if (!grow((void **)&e->bh, &e->bh_cap, e->bh_n + 1, sizeof *e->bh))
        return false;
    size_t i = e->bh_n++;
    while (i > 0) {
        size_t par = (i - 1) / 2;
        if (!bpair_less(&p, &e->bh[par]))
            break;
        e->bh[i] = e->bh[par];
        i = par;
    }
    e->bh[i] = p;
    return true;
}

static struct bpair bheap_pop(struct enc *e)
{
    struct bpair top = e->bh[0];
    struct bpair last = e->bh[--e->bh_n];
    size_t i = 0, n = e->bh_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && bpair_less(&e->bh[c + 1], &e->bh[c]))
            c++;
        if (!bpair_less(&e->bh[c], &last))
            break;
        e->bh[i] = e->bh[c];
        i = c;
    }
    if (n)
        e->bh[i] = last;
    return top;
}

static void bpe_add_pair(struct enc *e, int32_t l, int32_t r)
{
    if (l < 0 || r < 0)
        return;
    const struct bsym *a = &e->bs[l], *b = &e->bs[r];
    if (a->id < 0 || b->id < 0)
        return;
    const struct mslot *m = merge_find(e->t, a->id, b->id);
    if (!m)
        return;
    struct bpair p = {m->rank, l, r, m->res, a->n + b->n};
    if (!bheap_push(e, p))
        e->err = RLAI_ERR_NOMEM;
}

/* BPE over one pre-tokenized piece (raw bytes p[0..len)). */
static void bpe_piece(struct enc *e, const char *p, size_t len)
{
    const rlai_tokenizer *t = e->t;
    if (len == 0)
        return;
    const unsigned char *u = (const unsigned char *)p;
    if (t->ignore_merges) {
        if (!grow((void **)&e->buf, &e->buf_cap, len * 2, 1)) {
            e->err = RLAI_ERR_NOMEM;
            return;
        }
        size_t o = 0;
        for (size_t i = 0; i < len; i++) {
            memcpy(e->buf + o, t->bmap[u[i]], t->bmap_len[u[i]]);
            o += t->bmap_len[u[i]];
        }
        int32_t id = str_find(t, e->buf, o);
        if (id >= 0 && id < t->n_vocab) {
            emit(e, id);
            return;
        }
    }
    if (!grow((void **)&e->bs, &e->bs_cap, len, sizeof *e->bs)) {
        e->err = RLAI_ERR_NOMEM;
        return;
    }
    struct bsym *s = e->bs;
    for (size_t i = 0; i < len; i++) {
        s[i].id = t->byte_sym[u[i]];
        s[i].prev = (int32_t)i - 1;
        s[i].next = i + 1 < len ? (int32_t)i + 1 : -1;
        s[i].start = (uint32_t)i;
        s[i].n = 1;
    }
    e->bh_n = 0;
    for (size_t i = 1; i < len; i++)
        bpe_add_pair(e, (int32_t)i - 1, (int32_t)i);
    while (e->bh_n && !e->err) {
        struct bpair q = bheap_pop(e);
        struct bsym *l = &s[q.left], *r = &s[q.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != q.size)
            continue;       /* stale */
        l->id = q.res;
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0)
            s[r->next].prev = q.left;
        bpe_add_pair(e, l->prev, q.left);
        bpe_add_pair(e, q.left, l->next);
    }
    for (int32_t i = 0; i != -1; i = s[i].next) {
        if (s[i].id >= 0 && s[i].id < t->n_vocab) {
            emit(e, s[i].id);
        } else {
            for (uint32_t k = s[i].start; k < s[i].start + s[i].n; k++)
                if (t->byte_tok[u[k]] >= 0)
                    emit(e, t->byte_tok[u[k]]);
        }
    }
}

/* --- pre-tokenizers (over code points [ini, end) of the fragment) --- */

static inline uint8_t F(const struct enc *e, size_t pos, size_t end)
{
    return pos < end ? e->fl[pos] : 0;
}

static void piece(struct enc *e, size_t a, size_t b)
{
    if (b > a)
        bpe_piece(e, e->text + e->off[a], e->off[b] - e->off[a]);
}

/* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static void split_gpt2(struct enc *e, size_t ini, size_t end)
{
    const uint32_t *cp = e->cp;
    size_t pos = ini;
    while (pos < end && !e->err) {
        uint32_t c = cp[pos];
        size_t start = pos;
        if (c == '\'' && pos + 1 < end) {
            uint32_t c1 = cp[pos + 1];
            if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') {
                piece(e, pos, pos + 2);
                pos += 2;
                continue;
            }
            if (pos + 2 < end) {
                uint32_t c2 = cp[pos + 2];
                if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) {
                    piece(e, pos, pos + 3);
                    pos += 3;
                    continue;
                }
            }
        }
        uint8_t f2 = c == ' ' ? F(e, pos + 1, end) : F(e, pos, end);
        if (f2 & (F_LETTER | F_NUMBER)) {
            uint8_t want = f2 & (F_LETTER | F_NUMBER);
            pos += c == ' ';
            while (F(e, pos, end) & want)
                pos++;
            piece(e, start, pos);
            continue;
        }
        if ((f2 & F_IN) && !(f2 & (F_WS | F_LETTER | F_NUMBER))) {
            pos += c == ' ';
            for (;;) {
                uint8_t f = F(e, pos, end);
                if (!(f & F_IN) || (f & (F_WS | F_LETTER | F_NUMBER)))
                    break;
                pos++;
            }
            piece(e, start, pos);
            continue;
        }
        size_t nws = 0;
        while (F(e, pos + nws, end) & F_WS)
            nws++;
        if (nws > 1 && pos + nws < end) {
            pos += nws - 1;            /* \s+(?!\S): last space joins the next word */
        } else if (nws > 0) {
            pos += nws;
        } else {
            pos++;
        }
        piece(e, start, pos);
    }
}

/* \p{N} isolated, then the GPT-2 regex on the gaps (smollm, starcoder ...). */
static void split_digits_gpt2(struct enc *e, size_t ini, size_t end)
{
    size_t seg = ini;
    for (size_t pos = ini; pos < end && !e->err; pos++) {
        if (e->fl[pos] & F_NUMBER) {
            if (seg < pos)
                split_gpt2(e, seg, pos);
            piece(e, pos, pos + 1);
            seg = pos + 1;
        }
    }
    if (seg < end && !e->err)
        split_gpt2(e, seg, end);
}

static uint32_t lower_ascii(uint32_t c)
{
    return c >= 'A' && c <= 'Z' ? c + 32 : c;
}

/* llama3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
 *         ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * qwen2: the same with \p{N} instead of \p{N}{1,3}. */
static void split_llama3(struct enc *e, size_t ini, size_t end, size_t max_digits)
{
    const uint32_t *cp = e->cp;
    size_t pos = ini;
    while (pos < end && !e->err) {
        uint32_t c = cp[pos];
        uint8_t f = e->fl[pos];
        size_t start = pos;
        if (c == '\'' && pos + 1 < end) {
            uint32_t c1 = lower_ascii(cp[pos + 1]);
            if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') {
                piece(e, pos, pos + 2);
                pos += 2;
                continue;
            }
            if (pos + 2 < end) {
                uint32_t c2 = lower_ascii(cp[pos + 2]);
                if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) {
                    piece(e, pos, pos + 3);
                    pos += 3;
                    continue;
                }
            }
        }
        if (!(c == '\r' || c == '\n' || (f & F_NUMBER)) &&
            ((f & F_LETTER) || (F(e, pos + 1, end) & F_LETTER))) {
            pos++;
            while (F(e, pos, end) & F_LETTER)
                pos++;
            piece(e, start, pos);
            continue;
        }
        if (f & F_NUMBER) {
            size_t n = 0;
            while (n < max_digits && (F(e, pos, end) & F_NUMBER)) {
                pos++;
                n++;
            }
            piece(e, start, pos);
            continue;
        }
        uint8_t f2 = c == ' ' ? F(e, pos + 1, end) : f;
        if (!(f2 & (F_WS | F_LETTER | F_NUMBER))) {
            pos += c == ' ';
            for (;;) {
                uint8_t g = F(e, pos, end);
                if (!(g & F_IN) || (g & (F_WS | F_LETTER | F_NUMBER)))
                    break;
                pos++;
            }
            while (pos < end && (cp[pos] == '\r' || cp[pos] == '\n'))
                pos++;
            piece(e, start, pos);
            continue;
        }
        size_t nws = 0, last_rn = 0;
        while (F(e, pos + nws, end) & F_WS) {
            if (cp[pos + nws] == '\r' || cp[pos + nws] == '\n')
                last_rn = pos + nws + 1;
            nws++;
        }
        if (last_rn) {
            pos = last_rn;                 /* \s*[\r\n]+ */
        } else if (nws > 1 && pos + nws < end) {
            pos += nws - 1;                /* \s+(?!\S) */
        } else if (nws > 0) {
            pos += nws;                    /* \s+ */
        } else {
            pos++;
        }
        piece(e, start, pos);
    }
}

/* Decodes text[0..len) into e->cp/fl/off; returns the code point count. */
static size_t decode_fragment(struct enc *e, const char *text, size_t len)
{
    size_t n = 0, i = 0;
    e->text = text;
    while (i < len) {
        uint32_t c;
        int l = rlai_utf8_decode(text + i, len - i, &c);
        uint8_t f = F_IN;
        enum rlai_ucat k = rlai_unicode_category(c);
        f |= k == RLAI_UCAT_LETTER ? F_LETTER : k == RLAI_UCAT_NUMBER ? F_NUMBER : 0;
        /* outside Latin-1 every white-space code point is a separator */
        if ((c < 256 || k == RLAI_UCAT_SEPARATOR) && rlai_unicode_is_whitespace(c))
            f |= F_WS;
        e->cp[n] = c;
        e->fl[n] = f;
        e->off[n] = (uint32_t)i;
        n++;
        i += (size_t)l;
    }
    e->off[n] = (uint32_t)len;
    return n;
}

static void bpe_fragment(struct enc *e, const char *text, size_t len)
{
    size_t n = decode_fragment(e, text, len);
    switch (e->t->pre) {
    case PRE_DIGITS_GPT2: split_digits_gpt2(e, 0, n); break;
    case PRE_LLAMA3: split_llama3(e, 0, n, 3); break;
    case PRE_QWEN2: split_llama3(e, 0, n, 1); break;
    default: split_gpt2(e, 0, n); break;
    }
}

/* --- SentencePiece --- */

static bool spair_less(const struct spair *a, const struct spair *b)
{
    /* "less" = comes out first: higher score, then leftmost */
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static void spm_add_pair(struct enc *e, int32_t l, int32_t r)
{
    if (l < 0 || r < 0)
        return;
    const struct ssym *a = &e->ss[l], *b = &e->ss[r];
    uint32_t size = a->n + b->n;
    int32_t id = str_find(e->t, e->buf + a->start, size);
    if (id < 0 || id >= e->t->n_vocab)
        return;
    struct spair p = {e->t->scores[id], l, r, size};
    if (!grow((void **)&e->sh, &e->sh_cap, e->sh_n + 1, sizeof *e->sh)) {
        e->err = RLAI_ERR_NOMEM;
        return;
    }
    size_t i = e->sh_n++;
    while (i > 0) {
        size_t par = (i - 1) / 2;
        if (!spair_less(&p, &e->sh[par]))
            break;
        e->sh[i] = e->sh[par];
        i = par;
    }
    e->sh[i] = p;
}

static struct spair sheap_pop(struct enc *e)
{
    struct spair top = e->sh[0];
    struct spair last = e->sh[--e->sh_n];
    size_t i = 0, n = e->sh_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && spair_less(&e->sh[c + 1], &e->sh[c]))
            c++;
        if (!spair_less(&e->sh[c], &last))
            break;
        e->sh[i] = e->sh[c];
        i = c;
    }
    if (n)
        e->sh[i] = last;
    return top;
}

static int utf8_len_first(unsigned char c)
{
    static const int lens[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lens[c >> 4];
}

static void spm_fragment(struct enc *e, const char *text, size_t len, bool prefix)
{
    const rlai_tokenizer *t = e->t;
    size_t need = len * 3 + 3;
    if (!grow((void **)&e->buf, &e->buf_cap, need, 1)) {
        e->err = RLAI_ERR_NOMEM;
        return;
    }
    size_t L = 0;
    if (prefix) {
        memcpy(e->buf, "\xe2\x96\x81", 3);
        L = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(e->buf + L, "\xe2\x96\x81", 3);
            L += 3;
        } else {
            e->buf[L++] = text[i];
        }
    }
    if (L == 0)
        return;
    if (!grow((void **)&e->ss, &e->ss_cap, L, sizeof *e->ss)) {
        e->err = RLAI_ERR_NOMEM;
        return;
    }
    struct ssym *s = e->ss;
    size_t ns = 0;
    for (size_t o = 0; o < L;) {
        size_t l = (size_t)utf8_len_first((unsigned char)e->buf[o]);
        if (l > L - o)
            l = L - o;
        s[ns].start = (uint32_t)o;
        s[ns].n = (uint32_t)l;
        s[ns].prev = (int32_t)ns - 1;
        o += l;
        s[ns].next = o == L ? -1 : (int32_t)ns + 1;
        ns++;
    }
    e->sh_n = 0;
    for (size_t i = 1; i < ns && !e->err; i++)
        spm_add_pair(e, (int32_t)i - 1, (int32_t)i);
    while (e->sh_n && !e->err) {
        struct spair q = sheap_pop(e);
        struct ssym *l = &s[q.left], *r = &s[q.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != q.size)
            continue;
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0)
            s[r->next].prev = q.left;
        spm_add_pair(e, l->prev, q.left);
        spm_add_pair(e, q.left, l->next);
    }
    for (int32_t i = 0; i != -1 && !e->err; i = s[i].next) {
        int32_t id = str_find(t, e->buf + s[i].start, s[i].n);
        if (id >= 0 && id < t->n_vocab) {
            emit(e, id);
        } else {
            for (uint32_t k = 0; k < s[i].n; k++) {
                int32_t b = t->byte_tok[(unsigned char)e->buf[s[i].start + k]];
                if (b >= 0)
                    emit(e, b);
            }
        }
    }
}

/* --- special-token partition --- */

struct frag {
    int32_t tok;           /* -1: raw text */
    size_t off, len;
};

/* Splits the text into raw fragments and special tokens. On success
 * *out and *n_out hold a malloc'd list. */
static int partition(const rlai_tokenizer *t, const char *text, size_t len, bool parse_special,
                     struct frag **out, size_t *n_out)
{
    size_t cap = 16, n = 1;
    struct frag *f = malloc(cap * sizeof *f);
    struct frag *g = NULL;
    size_t gcap = 0;
    if (!f)
        return RLAI_ERR_NOMEM;
    f[0] = (struct frag){-1, 0, len};
    for (int32_t k = 0; k < t->n_special; k++) {
        int32_t id = t->special[k];
        if (!parse_special && t->attr[id] != RLAI_TOKEN_USER_DEFINED)
            continue;
        const char *s = t->sblob + t->soff[id];
        size_t sl = t->slen[id];
        size_t gn = 0;
        bool changed = false;
        for (size_t i = 0; i < n; i++) {
            struct frag cur = f[i];
            if (cur.tok >= 0 || cur.len < sl) {
                if (!grow((void **)&g, &gcap, gn + 1, sizeof *g))
                    goto nomem;
                g[gn++] = cur;
                continue;
            }
            const char *base = text + cur.off;
            size_t p = 0;
            for (;;) {
                const char *hit = memmem(base + p, cur.len - p, s, sl);
                if (!hit)
                    break;
                size_t h = (size_t)(hit - base);
                if (!grow((void **)&g, &gcap, gn + 2, sizeof *g))
                    goto nomem;
                if (h > p)
                    g[gn++] = (struct frag){-1, cur.off + p, h - p};
                g[gn++] = (struct frag){id, 0, 0};
                p = h + sl;
                changed = true;
            }
            if (p < cur.len) {
                if (!grow((void **)&g, &gcap, gn + 1, sizeof *g))
                    goto nomem;
                g[gn++] = (struct frag){-1, cur.off + p, cur.len - p};
            }
        }
        if (changed) {
            struct frag *tmp = f;
            f = g;
            g = tmp;
            size_t tc = cap;
            cap = gcap;
            gcap = tc;
            n = gn;
        }
    }
    free(g);
    *out = f;
    *n_out = n;
    return 0;
nomem:
    free(f);
    free(g);
    return RLAI_ERR_NOMEM;
}

/* Encodes the fragments fr[0..nf) of text (fr freed here). */
static int encode_frags(const rlai_tokenizer *t, const char *text, size_t len, struct frag *fr, size_t nf,
                        bool add_special, int32_t *out, int cap)
{
    struct enc e;
    memset(&e, 0, sizeof e);
    e.t = t;
    e.out = out;
    e.cap = cap;

    if (add_special && t->add_bos)
        emit(&e, t->bos);

    if (t->kind == KIND_BPE && len > 0) {
        e.cp = malloc((len + 1) * sizeof *e.cp);
        e.fl = malloc(len + 1);
        e.off = malloc((len + 1) * sizeof *e.off);
        if (!e.cp || !e.fl || !e.off)
            e.err = RLAI_ERR_NOMEM;
    }
    bool prev_special = true;     /* SPM: space prefix at the start and after specials */
    for (size_t i = 0; i < nf && !e.err; i++) {
        if (fr[i].tok >= 0) {
            emit(&e, fr[i].tok);
            prev_special = true;
        } else if (t->kind == KIND_BPE) {
            bpe_fragment(&e, text + fr[i].off, fr[i].len);
        } else {
            spm_fragment(&e, text + fr[i].off, fr[i].len, t->add_space_prefix && prev_special);
            prev_special = false;
        }
    }
    if (add_special && t->add_eos)
        emit(&e, t->eos);

    free(fr);
    free(e.cp);
    free(e.fl);
    free(e.off);
    free(e.bs);
    free(e.bh);
    free(e.ss);
    free(e.sh);
    free(e.buf);
    if (e.err)
        return e.err;
    if (e.n_out > INT_MAX)
        return RLAI_ERR_TOO_LARGE;
    return (int)e.n_out;
}

/* Writes up to cap ids into out (caller-owned) and returns the total count
 * (which may exceed cap) or a negative error: RLAI_ERR_INVALID_ARG for bad
 * arguments, RLAI_ERR_TOO_LARGE for inputs over 512 MiB, RLAI_ERR_NOMEM. */
int rlai_tokenizer_encode(const rlai_tokenizer *t, const char *text, size_t len,
                          bool add_special, bool parse_special, int32_t *out, int cap)
{
    if (!t || (!text && len) || cap < 0 || (!out && cap > 0))
        return RLAI_ERR_INVALID_ARG;
    if (len > TOK_MAX_INPUT)
        return RLAI_ERR_TOO_LARGE;
    struct frag *fr = NULL;
    size_t nf = 0;
    if (len > 0) {
        int rc = partition(t, text, len, parse_special, &fr, &nf);
        if (rc)
            return rc;
    }
    return encode_frags(t, text, len, fr, nf, add_special, out, cap);
}

/* Spans are partitioned one by one (special-token text parsed only in
 * spans with parse_special) and the raw fragments that touch across a span
 * boundary are joined again before pre-tokenization, so text whose
 * special-token occurrences are exactly those of the parse_special spans
 * encodes exactly as rlai_tokenizer_encode(parse_special=true) would. */
int rlai_tokenizer_encode_spans(const rlai_tokenizer *t, const char *text, size_t len,
                                const rlai_tok_span *spans, int n_spans, bool add_special,
                                int32_t *out, int cap)
{
    if (!t || (!text && len) || cap < 0 || (!out && cap > 0) || n_spans < 0 || (n_spans > 0 && !spans))
        return RLAI_ERR_INVALID_ARG;
    if (len > TOK_MAX_INPUT)
        return RLAI_ERR_TOO_LARGE;
    size_t expect = 0;
    for (int i = 0; i < n_spans; i++) {
        if (spans[i].off != expect || spans[i].len > len - expect)
            return RLAI_ERR_INVALID_ARG;
        expect += spans[i].len;
    }
    if (expect != len)
        return RLAI_ERR_INVALID_ARG;
    struct frag *all = NULL;
    size_t n_all = 0, cap_all = 0;
    for (int i = 0; i < n_spans; i++) {
        if (spans[i].len == 0)
            continue;
        struct frag *fr = NULL;
        size_t nf = 0;
        int rc = partition(t, text + spans[i].off, spans[i].len, spans[i].parse_special, &fr, &nf);
        if (rc) {
            free(all);
            return rc;
        }
        if (!grow((void **)&all, &cap_all, n_all + nf, sizeof *all)) {
            free(fr);
            free(all);
            return RLAI_ERR_NOMEM;
        }
        for (size_t k = 0; k < nf; k++) {
            struct frag f = fr[k];
            if (f.tok < 0)
                f.off += spans[i].off;
            if (f.tok < 0 && n_all > 0 && all[n_all - 1].tok < 0 &&
                all[n_all - 1].off + all[n_all - 1].len == f.off)
                all[n_all - 1].len += f.len;
            else
                all[n_all++] = f;
        }
        free(fr);
    }
    return encode_frags(t, text, len, all, n_all, add_special, out, cap);
}

/* ------------------------------------------------------------------ */
/* decode                                                               */

static size_t piece_of(const rlai_tokenizer *t, int32_t id, bool render_special, const char **p)
{
    if (t->attr[id] == RLAI_TOKEN_CONTROL && !render_special)
        return 0;
    *p = t->pblob + t->poff[id];
    return t->plen[id];
}

/* buf is caller-owned (may be NULL when cap == 0); not NUL-terminated. */
int rlai_tokenizer_token_to_piece(const rlai_tokenizer *t, int32_t id, bool render_special,
                                  char *buf, size_t cap)
{
    if (!t || id < 0 || id >= t->n_vocab || (!buf && cap))
        return RLAI_ERR_INVALID_ARG;
    const char *p = NULL;
    size_t n = piece_of(t, id, render_special, &p);
    if (n && cap)
        memcpy(buf, p, n < cap ? n : cap);
    return (int)n;
}

/* ids and buf are caller-owned. With an SPM space prefix, one leading space
 * is removed from the first token that produces output. */
int rlai_tokenizer_decode(const rlai_tokenizer *t, const int32_t *ids, int n,
                          bool render_special, char *buf, size_t cap)
{
    if (!t || n < 0 || (!ids && n > 0) || (!buf && cap))
        return RLAI_ERR_INVALID_ARG;
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= t->n_vocab)
            return RLAI_ERR_INVALID_ARG;
    bool strip = t->kind == KIND_SPM && t->add_space_prefix;
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        const char *p = NULL;
        size_t l = piece_of(t, ids[i], render_special, &p);
        if (l == 0)
            continue;
        if (strip) {
            strip = false;
            if (p[0] == ' ') {
                p++;
                l--;
            }
        }
        if (total < cap && l) {
            size_t room = cap - 1 - total;
            memcpy(buf + total, p, l < room ? l : room);
        }
        total += l;
        if (total > INT_MAX)
            return RLAI_ERR_TOO_LARGE;
    }
    if (cap > 0)
        buf[total < cap ? total : cap - 1] = '\0';
    return (int)total;
}
