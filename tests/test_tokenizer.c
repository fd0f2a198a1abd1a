/* test_tokenizer.c - tokenizer tests.
 *
 * - llama.cpp's vocab test vectors (RLAI_TESTDATA/tokenizer/): every string
 *   of ggml-vocab-{starcoder,gpt-2,llama-spm}.gguf.inp must encode to the
 *   ids on the same line of the .out file (add_special and parse_special
 *   off) and decode back to the input;
 * - the real SmolLM2 model if present (RLAI_MODELS_DIR);
 * - synthetic in-memory GGUF vocabularies for the gpt-2 / default / llama3 /
 *   qwen2 pre-tokenizers, user-defined tokens and load errors;
 * - hostile input, the cap contract, invalid ids, speed.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rlai/gguf.h"
#include "rlai/vocab.h"
#include "tokenizer.h"
#include "rlai/engine.h"

#define VOCAB_DIR RLAI_TESTDATA "/tokenizer/"
#define SMOLLM_PATH RLAI_MODELS_DIR "/SmolLM2-135M-Instruct.Q4_1.gguf"

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    ck_assert_ptr_nonnull(b);
    ck_assert_int_eq(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    b[n] = '\0';
    *len = (size_t)n;
    return b;
}

static rlai_tokenizer *load_path(const char *path, double *ms)
{
    rlai_gguf *g = NULL;
    char err[256] = "";
    int rc = rlai_gguf_open_file(path, &g, err, sizeof err);
    ck_assert_msg(rc == 0, "open %s: %d %s", path, rc, err);
    rlai_tokenizer *t = NULL;
    double t0 = now_ms();
    rc = rlai_tokenizer_load(g, &t, err, sizeof err);
    if (ms)
        *ms = now_ms() - t0;
    ck_assert_msg(rc == 0, "tokenizer %s: %d %s", path, rc, err);
    rlai_gguf_close(g);    /* the tokenizer must not depend on the gguf */
    return t;
}

/* Encodes into a malloc'd array (exercising the cap contract on the way). */
static int32_t *encode(const rlai_tokenizer *t, const char *s, size_t len, bool add_special,
                       bool parse_special, int *n_out)
{
    int n = rlai_tokenizer_encode(t, s, len, add_special, parse_special, NULL, 0);
    ck_assert_msg(n >= 0, "encode failed: %d", n);
    int32_t *ids = malloc(((size_t)n + 1) * sizeof *ids);
    ck_assert_ptr_nonnull(ids);
    int n2 = rlai_tokenizer_encode(t, s, len, add_special, parse_special, ids, n + 1);
    ck_assert_int_eq(n2, n);
    *n_out = n;
    return ids;
}

static char *decode(const rlai_tokenizer *t, const int32_t *ids, int n, bool render_special, int *len)
{
    int need = rlai_tokenizer_decode(t, ids, n, render_special, NULL, 0);
    ck_assert_msg(need >= 0, "decode failed: %d", need);
    char *buf = malloc((size_t)need + 1);
    ck_assert_ptr_nonnull(buf);
    int got = rlai_tokenizer_decode(t, ids, n, render_special, buf, (size_t)need + 1);
    ck_assert_int_eq(got, need);
    ck_assert_int_eq(buf[need], '\0');
    *len = need;
    return buf;
}

/* Appends a C-escaped copy of s to out (at most cap bytes). */
static void escape(char *out, size_t cap, const char *s, size_t n)
{
    size_t o = strlen(out);
    for (size_t i = 0; i < n && o + 5 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n')
            o += (size_t)snprintf(out + o, cap - o, "\\n");
        else if (c == '\t')
            o += (size_t)snprintf(out + o, cap - o, "\\t");
        else if (c < 0x20 || c == 0x7f)
            o += (size_t)snprintf(out + o, cap - o, "\\x%02x", c);
        else
            out[o++] = (char)c, out[o] = '\0';
    }
}

static void ids_str(char *out, size_t cap, const int32_t *ids, int n)
{
    size_t o = strlen(out);
    for (int i = 0; i < n && o + 12 < cap; i++)
        o += (size_t)snprintf(out + o, cap - o, "%s%d", i ? " " : "", ids[i]);
}

/* ------------------------------------------------------------------ */
/* llama.cpp vocab vectors                                              */

static const char *const vocab_names[] = {"starcoder", "gpt-2", "llama-spm"};

struct vectors {
    char *inp, *outf;
    int n;
    const char *s[256];
    size_t len[256];
    int32_t *ids[256];
    int n_ids[256];
};

static void load_vectors(const char *name, struct vectors *v)
{
    char path[512];
    size_t inl, outl;
    memset(v, 0, sizeof *v);
    snprintf(path, sizeof path, VOCAB_DIR "ggml-vocab-%s.gguf.inp", name);
    v->inp = read_all(path, &inl);
    ck_assert_msg(v->inp != NULL, "cannot read %s", path);
    snprintf(path, sizeof path, VOCAB_DIR "ggml-vocab-%s.gguf.out", name);
    v->outf = read_all(path, &outl);
    ck_assert_msg(v->outf != NULL, "cannot read %s", path);

    /* strings are separated by "\n__ggml_vocab_test__\n"; the file ends
     * with a separator, so the piece after the last one is empty */
    static const char sep[] = "\n__ggml_vocab_test__\n";
    const size_t sl = sizeof sep - 1;
    size_t p = 0;
    while (p < inl) {
        const char *hit = memmem(v->inp + p, inl - p, sep, sl);
        size_t end = hit ? (size_t)(hit - v->inp) : inl;
        ck_assert_int_lt(v->n, 256);
        v->s[v->n] = v->inp + p;
        v->len[v->n] = end - p;
        v->n++;
        if (!hit)
            break;
        p = end + sl;
    }
    /* one line of ids per string */
    int line = 0;
    char *q = v->outf;
    while (*q) {
        char *nl = strchr(q, '\n');
        if (nl)
            *nl = '\0';
        ck_assert_int_lt(line, v->n);
        int cnt = 0;
        int32_t *ids = malloc((strlen(q) / 2 + 1) * sizeof *ids);
        char *e = q;
        for (;;) {
            char *e2;
            long x = strtol(e, &e2, 10);
            if (e2 == e)
                break;
            ids[cnt++] = (int32_t)x;
            e = e2;
        }
        v->ids[line] = ids;
        v->n_ids[line] = cnt;
        line++;
        if (!nl)
            break;
        q = nl + 1;
    }
    ck_assert_msg(line == v->n, "%s: %d strings but %d id lines", name, v->n, line);
}

static void free_vectors(struct vectors *v)
{
    for (int i = 0; i < v->n; i++)
        free(v->ids[i]);
    free(v->inp);
    free(v->outf);
}

START_TEST(test_vocab_vectors)
{
    const char *name = vocab_names[_i];
    char path[512];
    snprintf(path, sizeof path, VOCAB_DIR "ggml-vocab-%s.gguf", name);
    double ms = 0;
    rlai_tokenizer *t = load_path(path, &ms);
    struct vectors v;
    load_vectors(name, &v);
    int enc_fail = 0, dec_fail = 0;
    for (int i = 0; i < v.n; i++) {
        int n;
        int32_t *ids = encode(t, v.s[i], v.len[i], false, false, &n);
        if (n != v.n_ids[i] || memcmp(ids, v.ids[i], (size_t)n * sizeof *ids) != 0) {
            char msg[8192] = "";
            escape(msg, sizeof msg, v.s[i], v.len[i]);
            strcat(msg, "\"\n   expected: ");
            ids_str(msg, sizeof msg, v.ids[i], v.n_ids[i]);
            strcat(msg, "\n   got:      ");
            ids_str(msg, sizeof msg, ids, n);
            fprintf(stderr, "%s: string %d encodes wrongly: \"%s\n", name, i, msg);
            enc_fail++;
        }
        int dl;
        char *d = decode(t, v.ids[i], v.n_ids[i], false, &dl);
        if ((size_t)dl != v.len[i] || memcmp(d, v.s[i], v.len[i]) != 0) {
            char msg[8192] = "";
            escape(msg, sizeof msg, v.s[i], v.len[i]);
            strcat(msg, "\" decodes to \"");
            escape(msg, sizeof msg, d, (size_t)dl);
            fprintf(stderr, "%s: string %d: \"%s\"\n", name, i, msg);
            dec_fail++;
        }
        free(d);
        free(ids);
    }
    fprintf(stderr, "vocab %-10s: %d/%d vectors encode exactly, %d/%d decode back (load %.1f ms)\n",
            name, v.n - enc_fail, v.n, v.n - dec_fail, v.n, ms);
    ck_assert_int_eq(v.n, 46);
    ck_assert_msg(enc_fail == 0, "%s: %d of %d vectors encode wrongly", name, enc_fail, v.n);
    ck_assert_msg(dec_fail == 0, "%s: %d of %d vectors decode wrongly", name, dec_fail, v.n);
    free_vectors(&v);
    rlai_tokenizer_free(t);
}
END_TEST


/* The public vocabulary-only API (rlai/vocab.h) gives the vectors' ids too,
 * and refuses what it must. */
START_TEST(test_public_vocab_api)
{
    const char *name = vocab_names[_i];
    char path[512], err[256];
    snprintf(path, sizeof path, VOCAB_DIR "ggml-vocab-%s.gguf", name);
    rlai_vocab *vb = NULL;
    ck_assert_msg(rlai_vocab_open(path, &vb, err, sizeof err) == 0, "%s", err);
    ck_assert_int_gt(rlai_vocab_n_tokens(vb), 1000);
    struct vectors v;
    load_vectors(name, &v);
    for (int i = 0; i < v.n; i++) {
        int n = rlai_vocab_tokenize(vb, v.s[i], v.len[i], false, false, NULL, 0);
        ck_assert_int_eq(n, v.n_ids[i]);
        int32_t *ids = malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
        ck_assert_int_eq(rlai_vocab_tokenize(vb, v.s[i], v.len[i], false, false, ids, n), n);
        ck_assert_mem_eq(ids, v.ids[i], sizeof(int32_t) * (size_t)n);
        free(ids);
    }
    free_vectors(&v);
    ck_assert_int_eq(rlai_vocab_tokenize(vb, NULL, 3, false, false, NULL, 0), RLAI_ERR_INVALID_ARG);
    ck_assert_int_eq(rlai_vocab_tokenize(vb, "a", 1, false, false, NULL, 4), RLAI_ERR_INVALID_ARG);
    rlai_vocab_close(vb);
    vb = (rlai_vocab *)1;
    ck_assert_int_eq(rlai_vocab_open("/nonexistent/v.gguf", &vb, err, sizeof err), RLAI_ERR_IO);
    ck_assert_ptr_null(vb);
    ck_assert_str_ne(err, "");
    rlai_vocab_close(NULL);
}
END_TEST

/* Invalid UTF-8, NUL, a 1 MB string and the empty string on each vocab. */
START_TEST(test_hostile_inputs)
{
    const char *name = vocab_names[_i];
    char path[512];
    snprintf(path, sizeof path, VOCAB_DIR "ggml-vocab-%s.gguf", name);
    rlai_tokenizer *t = load_path(path, NULL);
    /* only the gpt-2 vocab has all 256 byte symbols (starcoder lacks the
     * bytes that never occur in UTF-8, SPM text is UTF-8 by design) */
    bool all_bytes = strcmp(name, "gpt-2") == 0;

    /* empty */
    ck_assert_int_eq(rlai_tokenizer_encode(t, "", 0, false, false, NULL, 0), 0);
    ck_assert_int_eq(rlai_tokenizer_encode(t, NULL, 0, false, true, NULL, 0), 0);

    static const char *const bad[] = {
        "\xff\xfe\x80 abc \xc3", "\xc0\x80\xed\xa0\x80 overlong and surrogate",
        "trunc \xe4\xb8", "\x80\x80\x80\x80", "a\xf4\x90\x80\x80z 12\xf0\x9f\x98",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int n;
        int32_t *ids = encode(t, bad[i], strlen(bad[i]), false, false, &n);
        ck_assert_int_gt(n, 0);
        int dl;
        char *d = decode(t, ids, n, false, &dl);
        if (all_bytes) /* byte-level BPE keeps every byte */
            ck_assert_msg((size_t)dl == strlen(bad[i]) && memcmp(d, bad[i], (size_t)dl) == 0,
                          "%s: invalid UTF-8 case %zu does not round-trip", name, i);
        free(d);
        free(ids);
    }

    /* embedded NUL */
    static const char nul[] = "a\0b \0\0 c";
    int n;
    int32_t *ids = encode(t, nul, sizeof nul - 1, false, false, &n);
    ck_assert_int_gt(n, 0);
    int dl;
    char *d = decode(t, ids, n, false, &dl);
    ck_assert_int_eq(dl, (int)sizeof nul - 1);
    ck_assert(memcmp(d, nul, sizeof nul - 1) == 0);
    free(d);
    free(ids);

    /* 1 MB of mixed text, plus 1 MB of one letter (one huge pre-token) */
    size_t big = 1 << 20;
    char *s = malloc(big);
    static const char frag[] = "Hello wörld 12345 \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80!! \n\t'll ";
    for (size_t i = 0; i < big; i++)
        s[i] = frag[i % (sizeof frag - 1)];
    double t0 = now_ms();
    ids = encode(t, s, big, false, false, &n);
    double t1 = now_ms();
    ck_assert_int_gt(n, 1000);
    d = decode(t, ids, n, false, &dl);
    ck_assert(dl == (int)big && memcmp(d, s, big) == 0);
    free(d);
    free(ids);
    memset(s, 'a', big);
    double t2 = now_ms();
    ids = encode(t, s, big, false, false, &n);
    double t3 = now_ms();
    ck_assert_int_gt(n, 0);
    d = decode(t, ids, n, false, &dl);
    ck_assert(dl == (int)big && memcmp(d, s, big) == 0);
    fprintf(stderr, "vocab %-10s: 1 MB mixed text %.0f ms, 1 MB 'a' %.0f ms\n", name, t1 - t0, t3 - t2);
    free(d);
    free(ids);
    free(s);
    rlai_tokenizer_free(t);
}
END_TEST

/* cap smaller than needed returns the needed count; bad arguments. */
START_TEST(test_cap_and_args)
{
    rlai_tokenizer *t = load_path(VOCAB_DIR "ggml-vocab-gpt-2.gguf", NULL);
    const char *s = "Hello world, this is a test of the cap contract.";
    int n;
    int32_t *full = encode(t, s, strlen(s), false, false, &n);
    ck_assert_int_gt(n, 4);
    int32_t small[3] = {-7, -7, -7};
    ck_assert_int_eq(rlai_tokenizer_encode(t, s, strlen(s), false, false, small, 2), n);
    ck_assert_int_eq(small[0], full[0]);
    ck_assert_int_eq(small[1], full[1]);
    ck_assert_int_eq(small[2], -7);              /* nothing written past cap */
    ck_assert_int_eq(rlai_tokenizer_encode(t, s, strlen(s), false, false, NULL, 0), n);

    /* gpt-2 sample from the reference facts */
    int32_t hw[4];
    ck_assert_int_eq(rlai_tokenizer_encode(t, "Hello world", 11, false, false, hw, 4), 2);
    ck_assert_int_eq(hw[0], 15496);
    ck_assert_int_eq(hw[1], 995);
    ck_assert_int_eq(rlai_tokenizer_encode(t, "\n", 1, false, false, hw, 4), 1);
    ck_assert_int_eq(hw[0], 198);

    /* bad arguments */
    ck_assert_int_eq(rlai_tokenizer_encode(NULL, s, 1, false, false, NULL, 0), RLAI_ERR_INVALID_ARG);
    ck_assert_int_eq(rlai_tokenizer_encode(t, NULL, 3, false, false, NULL, 0), RLAI_ERR_INVALID_ARG);
    ck_assert_int_eq(rlai_tokenizer_encode(t, s, 3, false, false, NULL, 5), RLAI_ERR_INVALID_ARG);
    ck_assert_int_eq(rlai_tokenizer_encode(t, s, 3, false, false, small, -1), RLAI_ERR_INVALID_ARG);

    /* decode: truncation keeps the NUL and returns the full length */
    char buf[6];
    int need = rlai_tokenizer_decode(t, full, n, false, buf, sizeof buf);
    ck_assert_int_eq(need, (int)strlen(s));
    ck_assert_str_eq(buf, "Hello");
    ck_assert_int_eq(rlai_tokenizer_decode(t, full, n, false, NULL, 0), (int)strlen(s));
    ck_assert_int_eq(rlai_tokenizer_decode(t, full, 0, false, buf, sizeof buf), 0);
    ck_assert_str_eq(buf, "");

    /* invalid ids */
    int32_t badids[2] = {full[0], 50257};
    ck_assert_int_eq(rlai_tokenizer_decode(t, badids, 2, false, buf, sizeof buf), RLAI_ERR_INVALID_ARG);
    badids[1] = -1;
    ck_assert_int_eq(rlai_tokenizer_decode(t, badids, 2, false, buf, sizeof buf), RLAI_ERR_INVALID_ARG);
    ck_assert_int_eq(rlai_tokenizer_decode(t, badids, -1, false, buf, sizeof buf), RLAI_ERR_INVALID_ARG);
    ck_assert_int_eq(rlai_tokenizer_token_to_piece(t, -1, false, buf, sizeof buf), RLAI_ERR_INVALID_ARG);
    ck_assert_int_eq(rlai_tokenizer_token_to_piece(t, 50257, true, buf, sizeof buf), RLAI_ERR_INVALID_ARG);
    ck_assert_int_eq(rlai_tokenizer_attr(t, 50257), RLAI_ERR_INVALID_ARG);
    ck_assert(!rlai_tokenizer_is_eog(t, -1));
    ck_assert(!rlai_tokenizer_is_eog(t, 50257));

    /* token_to_piece: byte map inverted, cap contract */
    ck_assert_int_eq(rlai_tokenizer_token_to_piece(t, 995, false, buf, sizeof buf), 6);
    ck_assert(memcmp(buf, " world", 5) == 0);
    ck_assert_int_eq(rlai_tokenizer_token_to_piece(t, 995, false, buf, 2), 6);
    ck_assert(memcmp(buf, " w", 2) == 0);
    ck_assert_int_eq(rlai_tokenizer_token_to_piece(t, 995, false, NULL, 0), 6);

    /* <|endoftext|> is control: rendered only on request; it is EOS/EOG */
    ck_assert_int_eq(rlai_tokenizer_n_vocab(t), 50257);
    ck_assert_int_eq(rlai_tokenizer_eos(t), 50256);
    ck_assert(rlai_tokenizer_is_eog(t, 50256));
    ck_assert(!rlai_tokenizer_is_eog(t, 995));
    ck_assert(!rlai_tokenizer_add_bos(t));
    ck_assert_int_eq(rlai_tokenizer_attr(t, 50256), RLAI_TOKEN_CONTROL);
    ck_assert_int_eq(rlai_tokenizer_token_to_piece(t, 50256, false, buf, sizeof buf), 0);
    char big[32];
    ck_assert_int_eq(rlai_tokenizer_token_to_piece(t, 50256, true, big, sizeof big), 13);
    ck_assert(memcmp(big, "<|endoftext|>", 13) == 0);
    ck_assert_int_eq(rlai_tokenizer_find(t, "<|endoftext|>", 13), 50256);
    ck_assert_int_eq(rlai_tokenizer_find(t, "\xc4\xa0world", 7), 995);
    ck_assert_int_eq(rlai_tokenizer_find(t, "no such token here", 18), -1);

    /* special parsing: only with parse_special */
    const char *sp = "a<|endoftext|>b";
    int32_t out[16];
    int k = rlai_tokenizer_encode(t, sp, strlen(sp), false, true, out, 16);
    ck_assert_int_eq(k, 3);
    ck_assert_int_eq(out[1], 50256);
    k = rlai_tokenizer_encode(t, sp, strlen(sp), false, false, out, 16);
    ck_assert_int_gt(k, 3);
    for (int i = 0; i < k; i++)
        ck_assert_int_ne(out[i], 50256);
    free(full);
    rlai_tokenizer_free(t);
}
END_TEST

/* SentencePiece specifics: BOS, space prefix after specials, byte tokens. */
START_TEST(test_spm_specifics)
{
    rlai_tokenizer *t = load_path(VOCAB_DIR "ggml-vocab-llama-spm.gguf", NULL);
    ck_assert_int_eq(rlai_tokenizer_bos(t), 1);
    ck_assert_int_eq(rlai_tokenizer_eos(t), 2);
    ck_assert(rlai_tokenizer_add_bos(t));
    ck_assert(!rlai_tokenizer_add_eos(t));
    ck_assert(rlai_tokenizer_is_eog(t, 2));

    int n, n2;
    int32_t *a = encode(t, "Hello", 5, true, false, &n);
    int32_t *b = encode(t, "Hello", 5, false, false, &n2);
    ck_assert_int_eq(n, n2 + 1);
    ck_assert_int_eq(a[0], 1);
    ck_assert(memcmp(a + 1, b, (size_t)n2 * sizeof *b) == 0);
    int dl;
    char *d = decode(t, a, n, false, &dl);   /* BOS not rendered: leading space still removed */
    ck_assert_str_eq(d, "Hello");
    free(d);
    d = decode(t, a, n, true, &dl);
    ck_assert_str_eq(d, "<s> Hello");
    free(d);

    /* "<s>Hello" with parse_special: the fragment after a special token
     * gets the space prefix again */
    int32_t *c = encode(t, "<s>Hello", 8, false, true, &n);
    ck_assert_int_eq(n, n2 + 1);
    ck_assert_int_eq(c[0], 1);
    ck_assert(memcmp(c + 1, b, (size_t)n2 * sizeof *b) == 0);
    free(c);
    free(a);
    free(b);

    /* byte fallback: a control character becomes <0x01> */
    int32_t ids[8];
    int k = rlai_tokenizer_encode(t, "\x01", 1, false, false, ids, 8);
    ck_assert_int_eq(k, 2);                 /* "▁" then <0x01> */
    ck_assert_int_eq(rlai_tokenizer_attr(t, ids[1]), RLAI_TOKEN_BYTE);
    char piece[8];
    ck_assert_int_eq(rlai_tokenizer_token_to_piece(t, ids[1], false, piece, sizeof piece), 1);
    ck_assert_int_eq(piece[0], 1);
    rlai_tokenizer_free(t);
}
END_TEST

/* Starcoder vocab (the smollm path): control tokens, speed. */
START_TEST(test_starcoder_special_and_speed)
{
    double load_ms;
    rlai_tokenizer *t = load_path(VOCAB_DIR "ggml-vocab-starcoder.gguf", &load_ms);
    int32_t eot = rlai_tokenizer_find(t, "<|endoftext|>", 13);
    int32_t fim = rlai_tokenizer_find(t, "<fim_prefix>", 12);
    ck_assert_int_ge(eot, 0);
    ck_assert_int_ge(fim, 0);
    ck_assert(rlai_tokenizer_is_eog(t, eot));
    const char *s = "<fim_prefix>def f():<|endoftext|>";
    int n;
    int32_t *ids = encode(t, s, strlen(s), false, true, &n);
    ck_assert_int_eq(ids[0], fim);
    ck_assert_int_eq(ids[n - 1], eot);
    int dl;
    char *d = decode(t, ids, n, true, &dl);
    ck_assert_str_eq(d, s);
    free(d);
    d = decode(t, ids, n, false, &dl);
    ck_assert_str_eq(d, "def f():");
    free(d);
    free(ids);

    /* speed: a prompt of >= 512 tokens */
    static const char para[] =
        "The quick brown fox jumps over the lazy dog. In 2024, 3.14159 apples cost $12.50!\n"
        "def tokenize(text):\n    return [ord(c) for c in text if c != ' ']  # comment\n"
        "Ünïcödé façade, naïve café — \xe4\xb8\xad\xe6\x96\x87\xe6\xb5\x8b\xe8\xaf\x95 \xf0\x9f\x9a\x80 ok?\n";
    char text[8192] = "";
    int ntok = 0;
    while (ntok < 512) {
        strcat(text, para);
        ntok = rlai_tokenizer_encode(t, text, strlen(text), false, false, NULL, 0);
    }
    int32_t *buf = malloc((size_t)ntok * sizeof *buf);
    int iters = 200;
    double t0 = now_ms();
    for (int i = 0; i < iters; i++)
        ck_assert_int_eq(rlai_tokenizer_encode(t, text, strlen(text), false, false, buf, ntok), ntok);
    double per = (now_ms() - t0) / iters;
    fprintf(stderr, "starcoder vocab: load %.1f ms; encode %d tokens (%zu bytes) %.3f ms\n",
            load_ms, ntok, strlen(text), per);
    ck_assert_msg(per < 5.0, "encoding %d tokens took %.3f ms", ntok, per);
    free(buf);
    rlai_tokenizer_free(t);
}
END_TEST

START_TEST(test_smollm2_model)
{
    if (access(SMOLLM_PATH, R_OK) != 0) {
        fprintf(stderr, "note: %s not present, SmolLM2 checks skipped\n", SMOLLM_PATH);
        return;
    }
    double ms;
    rlai_tokenizer *t = load_path(SMOLLM_PATH, &ms);
    fprintf(stderr, "SmolLM2 tokenizer load: %.1f ms\n", ms);
    ck_assert_int_eq(rlai_tokenizer_n_vocab(t), 49152);
    ck_assert_int_eq(rlai_tokenizer_bos(t), 1);
    ck_assert_int_eq(rlai_tokenizer_eos(t), 2);
    ck_assert(!rlai_tokenizer_add_bos(t));
    ck_assert(rlai_tokenizer_is_eog(t, 2));
    ck_assert(rlai_tokenizer_is_eog(t, 0));
    ck_assert(!rlai_tokenizer_is_eog(t, 1));

    int n, dl;
    int32_t *ids = encode(t, "Hello world", 11, true, true, &n);
    ck_assert_int_eq(n, 2);
    char *d = decode(t, ids, n, false, &dl);
    ck_assert_str_eq(d, "Hello world");
    free(d);
    free(ids);

    const char *chat = "<|im_start|>user\nHi<|im_end|>\n";
    ids = encode(t, chat, strlen(chat), true, true, &n);
    ck_assert_int_ge(n, 5);
    ck_assert_int_eq(ids[0], 1);
    bool has2 = false;
    for (int i = 0; i < n; i++)
        has2 |= ids[i] == 2;
    ck_assert(has2);
    d = decode(t, ids, n, true, &dl);
    ck_assert_str_eq(d, chat);
    free(d);
    d = decode(t, ids, n, false, &dl);
    ck_assert_str_eq(d, "user\nHi\n");
    free(d);
    free(ids);
    /* without parse_special the markers are plain text */
    ids = encode(t, chat, strlen(chat), false, false, &n);
    for (int i = 0; i < n; i++)
        ck_assert(ids[i] != 1 && ids[i] != 2);
    d = decode(t, ids, n, false, &dl);
    ck_assert_str_eq(d, chat);
    free(d);
    free(ids);
    rlai_tokenizer_free(t);
}
END_TEST

/* ------------------------------------------------------------------ */
/* synthetic GGUF vocabularies                                          */

struct gb {
    unsigned char *p;
    size_t n, cap;
    uint64_t nkv;
};

static void gb_put(struct gb *b, const void *d, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 256;
        b->p = realloc(b->p, b->cap);
        ck_assert_ptr_nonnull(b->p);
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}
static void gb_u32(struct gb *b, uint32_t v) { gb_put(b, &v, 4); }
static void gb_u64(struct gb *b, uint64_t v) { gb_put(b, &v, 8); }
static void gb_str(struct gb *b, const char *s, size_t n)
{
    gb_u64(b, n);
    gb_put(b, s, n);
}
static void gb_begin(struct gb *b)
{
    memset(b, 0, sizeof *b);
    gb_put(b, "GGUF", 4);
    gb_u32(b, 3);
    gb_u64(b, 0);          /* tensors */
    gb_u64(b, 0);          /* kv count, patched */
}
static void gb_key(struct gb *b, const char *k, uint32_t type)
{
    gb_str(b, k, strlen(k));
    gb_u32(b, type);
    b->nkv++;
    memcpy(b->p + 16, &b->nkv, 8);
}
static void kv_str(struct gb *b, const char *k, const char *v)
{
    gb_key(b, k, RLAI_GGUF_STRING);
    gb_str(b, v, strlen(v));
}
static void kv_u32(struct gb *b, const char *k, uint32_t v)
{
    gb_key(b, k, RLAI_GGUF_U32);
    gb_u32(b, v);
}
static void kv_strs(struct gb *b, const char *k, char **v, size_t n)
{
    gb_key(b, k, RLAI_GGUF_ARRAY);
    gb_u32(b, RLAI_GGUF_STRING);
    gb_u64(b, n);
    for (size_t i = 0; i < n; i++)
        gb_str(b, v[i], strlen(v[i]));
}
static void kv_i32s(struct gb *b, const char *k, const int32_t *v, size_t n)
{
    gb_key(b, k, RLAI_GGUF_ARRAY);
    gb_u32(b, RLAI_GGUF_I32);
    gb_u64(b, n);
    gb_put(b, v, n * 4);
}

/* GPT-2 byte map, written independently of the tokenizer. */
static void byte_encode(const char *s, char *out)
{
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        int b = *p, cp;
        bool direct = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        if (direct) {
            cp = b;
        } else {
            int k = 0;
            for (int x = 0; x < b; x++)
                if (!((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE)))
                    k++;
            cp = 256 + k;
        }
        if (cp < 0x80) {
            out[o++] = (char)cp;
        } else {
            out[o++] = (char)(0xC0 | (cp >> 6));
            out[o++] = (char)(0x80 | (cp & 0x3F));
        }
    }
    out[o] = '\0';
}

/* Vocabulary: the 256 byte symbols, then every prefix of each word (in
 * byte-encoded form) with the chain of merges that builds it, then
 * "<user>" (user-defined), "<ctl>" (control). Piece boundaries become
 * visible because merges never cross them. */
struct synth {
    char *tok[4096];
    int32_t type[4096];
    int n_tok;
    char *mg[4096];
    int n_mg;
};

static int synth_find(struct synth *s, const char *x)
{
    for (int i = 0; i < s->n_tok; i++)
        if (strcmp(s->tok[i], x) == 0)
            return i;
    return -1;
}

static void synth_build(struct synth *s, const char *const *words, size_t n_words)
{
    memset(s, 0, sizeof *s);
    for (int b = 1; b < 256; b++) {
        char raw[2] = {(char)b, 0}, enc[4];
        byte_encode(raw, enc);
        s->tok[s->n_tok] = strdup(enc);
        s->type[s->n_tok++] = RLAI_TOKEN_NORMAL;
    }
    /* byte 0 separately (strings are NUL-terminated here) */
    s->tok[s->n_tok] = strdup("\xc4\x80");
    s->type[s->n_tok++] = RLAI_TOKEN_NORMAL;
    for (size_t w = 0; w < n_words; w++) {
        char enc[256];
        byte_encode(words[w], enc);
        /* split into code points */
        size_t L = strlen(enc), cut[128], nc = 0;
        for (size_t i = 0; i < L;) {
            size_t l = ((unsigned char)enc[i] >= 0xC0) ? 2 : 1;
            i += l;
            cut[nc++] = i;
        }
        for (size_t k = 1; k < nc; k++) {
            char pre[256], mg[512];
            memcpy(pre, enc, cut[k]);
            pre[cut[k]] = '\0';
            if (synth_find(s, pre) >= 0)
                continue;
            s->tok[s->n_tok] = strdup(pre);
            s->type[s->n_tok++] = RLAI_TOKEN_NORMAL;
            snprintf(mg, sizeof mg, "%.*s %.*s", (int)cut[k - 1], enc, (int)(cut[k] - cut[k - 1]),
                     enc + cut[k - 1]);
            s->mg[s->n_mg++] = strdup(mg);
        }
    }
    s->tok[s->n_tok] = strdup("<user>");
    s->type[s->n_tok++] = RLAI_TOKEN_USER_DEFINED;
    s->tok[s->n_tok] = strdup("<ctl>");
    s->type[s->n_tok++] = RLAI_TOKEN_CONTROL;
}

static void synth_free(struct synth *s)
{
    for (int i = 0; i < s->n_tok; i++)
        free(s->tok[i]);
    for (int i = 0; i < s->n_mg; i++)
        free(s->mg[i]);
}

/* Builds a GGUF in memory. pre may be NULL (key absent). */
static void synth_gguf(struct gb *b, struct synth *s, const char *model, const char *pre, bool merges)
{
    gb_begin(b);
    kv_str(b, "general.architecture", "llama");
    kv_str(b, "tokenizer.ggml.model", model);
    if (pre)
        kv_str(b, "tokenizer.ggml.pre", pre);
    kv_strs(b, "tokenizer.ggml.tokens", s->tok, (size_t)s->n_tok);
    kv_i32s(b, "tokenizer.ggml.token_type", s->type, (size_t)s->n_tok);
    if (merges)
        kv_strs(b, "tokenizer.ggml.merges", s->mg, (size_t)s->n_mg);
    kv_u32(b, "tokenizer.ggml.bos_token_id", (uint32_t)(s->n_tok - 1));
}

static int synth_load(struct gb *b, rlai_tokenizer **t, char *err, size_t errlen)
{
    rlai_gguf *g = NULL;
    int rc = rlai_gguf_open_memory(b->p, b->n, &g, err, errlen);
    ck_assert_msg(rc == 0, "synthetic gguf: %s", err);
    rc = rlai_tokenizer_load(g, t, err, errlen);
    rlai_gguf_close(g);
    return rc;
}

/* Encodes text and checks that the pieces are exactly `pieces`. */
static void check_pieces(struct synth *s, rlai_tokenizer *t, const char *pre, const char *text,
                         const char *const *pieces, int n_pieces)
{
    int n;
    int32_t *ids = encode(t, text, strlen(text), false, false, &n);
    char got[2048] = "", want[2048] = "";
    for (int i = 0; i < n; i++) {
        char dec[64];
        int l = rlai_tokenizer_token_to_piece(t, ids[i], true, dec, sizeof dec);
        strcat(got, "[");
        escape(got, sizeof got, dec, (size_t)l);
        strcat(got, "]");
    }
    for (int i = 0; i < n_pieces; i++) {
        strcat(want, "[");
        escape(want, sizeof want, pieces[i], strlen(pieces[i]));
        strcat(want, "]");
        char enc[256];
        byte_encode(pieces[i], enc);
        ck_assert_msg(synth_find(s, enc) >= 0 || strcmp(pieces[i], "<user>") == 0,
                      "test bug: piece '%s' not in the vocab", pieces[i]);
    }
    ck_assert_msg(strcmp(got, want) == 0, "pre %s, text \"%s\":\n got  %s\n want %s", pre, text, got, want);
    free(ids);
}

START_TEST(test_pretokenizers)
{
    static const char *const words[] = {
        "Hello", " world", "'s", "'S", " 12345", "12345", "123", "45", "1", "2", "3", "4", "5",
        "\n\n", "\n\n ", " x", "x", "  ", " !?", " !?\n", " 2", "don", "'t", "'T", "S",
        "'", "\xc2\xa0", "\xc2\xa0x", " \xc2\xa0", "\t\t", "\t", "\xe4\xb8\xad\xe6\x96\x87",
        " \xe4\xb8\xad\xe6\x96\x87", "?", "?\r\n", "  \n",
    };
    struct synth s;
    synth_build(&s, words, sizeof words / sizeof words[0]);
    struct gb b;
    char err[256];
    rlai_tokenizer *t;

    /* gpt-2 */
    synth_gguf(&b, &s, "gpt2", "gpt-2", true);
    ck_assert_int_eq(synth_load(&b, &t, err, sizeof err), 0);
    ck_assert(!rlai_tokenizer_add_bos(t));
    {
        static const char *const p1[] = {"Hello", " world", "'s", " 12345", "\n\n ", " x"};
        check_pieces(&s, t, "gpt-2", "Hello world's 12345\n\n  x", p1, 6);
        static const char *const p2[] = {"don", "'t", "'", "S", " !?", "\n"};
        check_pieces(&s, t, "gpt-2", "don't'S !?\n", p2, 6);
        /* NBSP is white space (never joined to a letter, although the
         * vocab has "\xa0x"); a white-space run before a word leaves its
         * last char to the word; a trailing run is one piece ("\t\t  ",
         * not a token, so BPE gives "\t\t" + "  ") */
        static const char *const p3[] = {" ", "\xc2\xa0", "x", "\t\t", "  "};
        check_pieces(&s, t, "gpt-2", " \xc2\xa0x\t\t  ", p3, 5);
        /* user-defined tokens are matched even without parse_special,
         * control tokens are not */
        static const char *const p4[] = {"Hello", "<user>", "x"};
        check_pieces(&s, t, "gpt-2", "Hello<user>x", p4, 3);
    }
    int32_t ids[32];
    int k = rlai_tokenizer_encode(t, "<ctl>", 5, false, false, ids, 32);
    ck_assert_int_gt(k, 1);
    k = rlai_tokenizer_encode(t, "<ctl>", 5, false, true, ids, 32);
    ck_assert_int_eq(k, 1);
    ck_assert_int_eq(ids[0], s.n_tok - 1);
    rlai_tokenizer_free(t);
    free(b.p);

    /* missing pre: default (gpt-2 regex) with a warning */
    synth_gguf(&b, &s, "gpt2", NULL, true);
    ck_assert_int_eq(synth_load(&b, &t, err, sizeof err), 0);
    {
        static const char *const p1[] = {"Hello", " world", "'s", " 12345", "\n\n ", " x"};
        check_pieces(&s, t, "default", "Hello world's 12345\n\n  x", p1, 6);
    }
    rlai_tokenizer_free(t);
    free(b.p);

    /* llama3: ignore_merges, add_bos, \p{N}{1,3}, case-insensitive contractions */
    synth_gguf(&b, &s, "gpt2", "llama-bpe", true);
    ck_assert_int_eq(synth_load(&b, &t, err, sizeof err), 0);
    ck_assert(rlai_tokenizer_add_bos(t));
    {
        static const char *const p1[] = {"Hello", " world", "'s", " ", "123", "45", "\n\n", " ", " x"};
        check_pieces(&s, t, "llama3", "Hello world's 12345\n\n  x", p1, 9);
        static const char *const p2[] = {"don", "'T", "'S", " !?\n"};
        check_pieces(&s, t, "llama3", "don'T'S !?\n", p2, 4);
        static const char *const p3[] = {"?\r\n", "  \n", "x"};
        check_pieces(&s, t, "llama3", "?\r\n  \nx", p3, 3);
        static const char *const p4[] = {"\xe4\xb8\xad\xe6\x96\x87", " \xe4\xb8\xad\xe6\x96\x87", "\xc2\xa0x"};
        check_pieces(&s, t, "llama3", "\xe4\xb8\xad\xe6\x96\x87 \xe4\xb8\xad\xe6\x96\x87\xc2\xa0x", p4, 3);
    }
    k = rlai_tokenizer_encode(t, "x", 1, true, false, ids, 32);
    ck_assert_int_eq(k, 2);
    ck_assert_int_eq(ids[0], s.n_tok - 1);
    rlai_tokenizer_free(t);
    free(b.p);

    /* qwen2: single digits */
    synth_gguf(&b, &s, "gpt2", "qwen2", true);
    ck_assert_int_eq(synth_load(&b, &t, err, sizeof err), 0);
    ck_assert(!rlai_tokenizer_add_bos(t));
    {
        static const char *const p1[] = {"Hello", " world", "'s", " ", "1", "2", "3", "4", "5", "\n\n", " ", " x"};
        check_pieces(&s, t, "qwen2", "Hello world's 12345\n\n  x", p1, 12);
    }
    rlai_tokenizer_free(t);
    free(b.p);

    /* smollm: digits isolated first, then gpt-2 */
    synth_gguf(&b, &s, "gpt2", "smollm", true);
    ck_assert_int_eq(synth_load(&b, &t, err, sizeof err), 0);
    {
        static const char *const p1[] = {"Hello", " world", "'s", " ", "1", "2", "3", "4", "5", "\n\n ", " x"};
        check_pieces(&s, t, "smollm", "Hello world's 12345\n\n  x", p1, 11);
    }
    rlai_tokenizer_free(t);
    free(b.p);

    /* errors */
    synth_gguf(&b, &s, "gpt2", "no-such-pre", true);
    ck_assert_int_eq(synth_load(&b, &t, err, sizeof err), RLAI_ERR_UNSUPPORTED);
    ck_assert_ptr_null(t);
    ck_assert_msg(strstr(err, "no-such-pre") != NULL, "message: %s", err);
    free(b.p);
    synth_gguf(&b, &s, "bert", "gpt-2", true);
    ck_assert_int_eq(synth_load(&b, &t, err, sizeof err), RLAI_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(err, "bert") != NULL, "message: %s", err);
    free(b.p);
    synth_gguf(&b, &s, "gpt2", "gpt-2", false);
    ck_assert_int_eq(synth_load(&b, &t, err, sizeof err), RLAI_ERR_FORMAT);
    free(b.p);
    /* token_type with the wrong length */
    gb_begin(&b);
    kv_str(&b, "tokenizer.ggml.model", "llama");
    kv_strs(&b, "tokenizer.ggml.tokens", s.tok, 10);
    kv_i32s(&b, "tokenizer.ggml.token_type", s.type, 9);
    ck_assert_int_eq(synth_load(&b, &t, err, sizeof err), RLAI_ERR_FORMAT);
    free(b.p);
    /* no tokenizer at all */
    gb_begin(&b);
    kv_str(&b, "general.architecture", "llama");
    ck_assert_int_eq(synth_load(&b, &t, err, sizeof err), RLAI_ERR_FORMAT);
    free(b.p);
    ck_assert_int_eq(rlai_tokenizer_load(NULL, &t, err, sizeof err), RLAI_ERR_INVALID_ARG);
    rlai_tokenizer_free(NULL);
    synth_free(&s);
}
END_TEST

static Suite *tokenizer_suite(void)
{
    Suite *s = suite_create("tokenizer");
    TCase *tc = tcase_create("vectors");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, test_vocab_vectors, 0, 3);
    tcase_add_loop_test(tc, test_public_vocab_api, 0, 3);
    tcase_add_loop_test(tc, test_hostile_inputs, 0, 3);
    tcase_add_test(tc, test_cap_and_args);
    tcase_add_test(tc, test_spm_specifics);
    tcase_add_test(tc, test_starcoder_special_and_speed);
    tcase_add_test(tc, test_smollm2_model);
    tcase_add_test(tc, test_pretokenizers);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(tokenizer_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
