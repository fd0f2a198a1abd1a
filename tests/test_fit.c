/* test_fit.c - the fit plugin's computation (plugins/fit/fitcalc.c,
 * gputable.c, compiled in directly) and the host's GGUF header reader
 * (host/gguf_describe.c): figures for the default model and for a
 * Llama-3-8B-shaped GGUF header written by the test, checked against
 * values computed by hand (arithmetic in the comments); the verdict
 * boundary; GPU name matching; errors. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fitcalc.h"
#include "gputable.h"
#include "gguf_describe.h"
#include "rlai/error.h"

#define SMOL RLAI_MODELS_DIR "/SmolLM2-135M-Instruct.Q4_1.gguf"
#define GIB 1073741824ull

/* ------------------------------------------------------------------ */
/* A GGUF v3 header writer (data section left sparse with ftruncate)   */

typedef struct {
    char name[48];
    uint32_t n_dims;
    uint64_t ne[2];
    uint32_t type;
} tinfo;

static void w_u32(FILE *f, uint32_t v) { fwrite(&v, 4, 1, f); }   /* little-endian host */
static void w_u64(FILE *f, uint64_t v) { fwrite(&v, 8, 1, f); }
static void w_str(FILE *f, const char *s)
{
    w_u64(f, strlen(s));
    fwrite(s, 1, strlen(s), f);
}
static void kv_u32(FILE *f, const char *k, uint32_t v) { w_str(f, k); w_u32(f, 4); w_u32(f, v); }
static void kv_f32(FILE *f, const char *k, float v) { w_str(f, k); w_u32(f, 6); fwrite(&v, 4, 1, f); }
static void kv_str(FILE *f, const char *k, const char *v) { w_str(f, k); w_u32(f, 8); w_str(f, v); }

/* Storage size of n elements of ggml type t (the types this test uses). */
static uint64_t type_bytes(uint32_t t, uint64_t n)
{
    switch (t) {
    case 0: return n * 4;              /* f32 */
    case 2: return n / 32 * 18;        /* q4_0 */
    case 14: return n / 256 * 210;     /* q6_K */
    default: return n / 32 * 18;       /* ids the reader must refuse: any size */
    }
}

/* Writes a llama-architecture GGUF with the given hyperparameters and
 * tensors. Returns 0 or -1. */
static int write_gguf(const char *path, uint32_t n_layer, uint32_t n_embd, uint32_t n_head,
                      uint32_t n_head_kv, uint32_t n_ff, uint32_t n_vocab,
                      const tinfo *ts, size_t nt)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    fwrite("GGUF", 1, 4, f);
    w_u32(f, 3);
    w_u64(f, nt);
    w_u64(f, 10);
    kv_str(f, "general.architecture", "llama");
    kv_str(f, "general.name", "Test Llama-3-8B");
    kv_u32(f, "llama.block_count", n_layer);
    kv_u32(f, "llama.context_length", 8192);
    kv_u32(f, "llama.embedding_length", n_embd);
    kv_u32(f, "llama.feed_forward_length", n_ff);
    kv_u32(f, "llama.attention.head_count", n_head);
    kv_u32(f, "llama.attention.head_count_kv", n_head_kv);
    kv_u32(f, "llama.vocab_size", n_vocab);
    kv_f32(f, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    uint64_t off = 0;
    for (size_t i = 0; i < nt; i++) {
        w_str(f, ts[i].name);
        w_u32(f, ts[i].n_dims);
        for (uint32_t d = 0; d < ts[i].n_dims; d++)
            w_u64(f, ts[i].ne[d]);
        w_u32(f, ts[i].type);
        w_u64(f, off);
        uint64_t n = ts[i].ne[0] * (ts[i].n_dims > 1 ? ts[i].ne[1] : 1);
        off += (type_bytes(ts[i].type, n) + 31) / 32 * 32;
    }
    long hdr = ftell(f);
    uint64_t data_off = ((uint64_t)hdr + 31) / 32 * 32;
    int rc = fflush(f) == 0 && ftruncate(fileno(f), (off_t)(data_off + off)) == 0 ? 0 : -1;
    fclose(f);
    return rc;
}

static void t1(tinfo *t, const char *name, uint64_t n0, uint32_t type)
{
    snprintf(t->name, sizeof t->name, "%s", name);
    t->n_dims = 1;
    t->ne[0] = n0;
    t->ne[1] = 1;
    t->type = type;
}

static void t2(tinfo *t, const char *name, uint64_t n0, uint64_t n1, uint32_t type)
{
    t1(t, name, n0, type);
    t->n_dims = 2;
    t->ne[1] = n1;
}

static char tmpdir[64];
static char path8b[128];

/* Llama-3-8B: 32 layers, n_embd 4096, n_head 32, n_head_kv 8 (head_dim
 * 4096/32 = 128, KV width 8*128 = 1024), n_ff 14336, vocab 128256.
 * Matrices q4_0 (type 2), norms f32 (0), the LM head q6_K (14, a type this
 * engine cannot compute: the header read must still report it). */
static void make_8b(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/rlai-test-fit-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
    snprintf(path8b, sizeof path8b, "%s/llama3-8b.gguf", tmpdir);
    size_t nt = 32 * 9 + 3, k = 0;
    tinfo *ts = calloc(nt, sizeof *ts);
    ck_assert_ptr_nonnull(ts);
    t2(&ts[k++], "token_embd.weight", 4096, 128256, 2);
    for (int l = 0; l < 32; l++) {
        char n[48];
#define NAME(s) (snprintf(n, sizeof n, "blk.%d." s, l), n)
        t1(&ts[k++], NAME("attn_norm.weight"), 4096, 0);
        t2(&ts[k++], NAME("attn_q.weight"), 4096, 4096, 2);
        t2(&ts[k++], NAME("attn_k.weight"), 4096, 1024, 2);
        t2(&ts[k++], NAME("attn_v.weight"), 4096, 1024, 2);
        t2(&ts[k++], NAME("attn_output.weight"), 4096, 4096, 2);
        t1(&ts[k++], NAME("ffn_norm.weight"), 4096, 0);
        t2(&ts[k++], NAME("ffn_gate.weight"), 4096, 14336, 2);
        t2(&ts[k++], NAME("ffn_up.weight"), 4096, 14336, 2);
        t2(&ts[k++], NAME("ffn_down.weight"), 14336, 4096, 2);
#undef NAME
    }
    t1(&ts[k++], "output_norm.weight", 4096, 0);
    t2(&ts[k++], "output.weight", 4096, 128256, 14);
    ck_assert_uint_eq(k, nt);
    ck_assert_int_eq(write_gguf(path8b, 32, 4096, 32, 8, 14336, 128256, ts, nt), 0);
    free(ts);
}

static void drop_8b(void)
{
    unlink(path8b);
    rmdir(tmpdir);
}

/* Hand-computed facts of that file.
 * Per layer, q4_0 matrices: q 4096*4096 = 16,777,216; k, v 4096*1024 =
 *   4,194,304 each; output 16,777,216; gate, up, down 4096*14336 =
 *   58,720,256 each: sum 2*16,777,216 + 2*4,194,304 + 3*58,720,256 =
 *   218,103,808; * 32 layers = 6,979,321,856.
 * token_embd (q4_0) and output (q6_K): 4096*128256 = 525,336,576 each.
 * f32 norms: 2 per layer + output_norm = 65 tensors of 4096 = 266,240.
 * n_params = 6,979,321,856 + 2*525,336,576 + 266,240 = 8,030,261,248.
 * q4_0: 225 tensors (7*32 + 1), 6,979,321,856 + 525,336,576 =
 *   7,504,658,432 params; 18 bytes per 32 -> 7,504,658,432 / 32 * 18 =
 *   4,221,370,368 bytes (4.5 bits per weight).
 * q6_K: 210 bytes per 256 -> 525,336,576 / 256 * 210 = 430,940,160 (6.5625 bpw).
 * f32: 266,240 * 4 = 1,064,960.
 * weight bytes = 4,221,370,368 + 430,940,160 + 1,064,960 = 4,653,375,488
 *   (overall 4,653,375,488 * 8 / 8,030,261,248 = 4.63584 bits per weight). */
#define P8B 8030261248ull
#define W8B 4653375488ull

/* ------------------------------------------------------------------ */

static double num(const cJSON *o, const char *a, const char *b)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, a);
    if (b)
        x = cJSON_GetObjectItemCaseSensitive(x, b);
    ck_assert_msg(cJSON_IsNumber(x), "%s.%s is not a number", a, b ? b : "");
    return x->valuedouble;
}

static bool flag(const cJSON *o, const char *a, const char *b)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(o, a), b);
    ck_assert_msg(cJSON_IsBool(x), "%s.%s is not a bool", a, b);
    return cJSON_IsTrue(x);
}

static int check_json(const char *params, cJSON **out, char *err, size_t errlen)
{
    cJSON *p = cJSON_Parse(params);
    ck_assert_ptr_nonnull(p);
    int rc = rlai_fit_check(p, rlai_host_gguf_describe, out, err, errlen);
    cJSON_Delete(p);
    return rc;
}

START_TEST(kv_row_bytes)
{
    ck_assert_uint_eq(rlai_fit_kv_row_bytes(RLAI_FIT_KV_F16, 1024), 2048);   /* 1024 * 2 */
    ck_assert_uint_eq(rlai_fit_kv_row_bytes(RLAI_FIT_KV_F32, 1024), 4096);   /* 1024 * 4 */
    ck_assert_uint_eq(rlai_fit_kv_row_bytes(RLAI_FIT_KV_Q8_0, 1024), 1088);  /* 32 blocks * 34 */
    ck_assert_uint_eq(rlai_fit_kv_row_bytes(RLAI_FIT_KV_Q8_0, 33), 68);      /* 2 blocks (partial) */
    rlai_fit_kv kv;
    ck_assert_int_eq(rlai_fit_kv_parse("Q8_0", &kv), 0);
    ck_assert_int_eq(kv, RLAI_FIT_KV_Q8_0);
    ck_assert_int_eq(rlai_fit_kv_parse("q4_0", &kv), RLAI_ERR_INVALID_ARG);
}
END_TEST

START_TEST(describe_default_model)
{
    cJSON *d = NULL;
    char err[512];
    ck_assert_int_eq(rlai_host_gguf_describe(SMOL, &d, err, sizeof err), 0);
    ck_assert_str_eq(cJSON_GetObjectItem(d, "arch")->valuestring, "llama");
    ck_assert_uint_eq(num(d, "n_layer", NULL), 30);
    ck_assert_uint_eq(num(d, "n_embd", NULL), 576);
    ck_assert_uint_eq(num(d, "n_head", NULL), 9);
    ck_assert_uint_eq(num(d, "n_head_kv", NULL), 3);
    ck_assert_uint_eq(num(d, "head_dim", NULL), 64);              /* 576 / 9 */
    ck_assert_uint_eq(num(d, "n_ff", NULL), 1536);
    ck_assert_uint_eq(num(d, "n_vocab", NULL), 49152);            /* tokenizer token count */
    ck_assert_uint_eq(num(d, "n_ctx_train", NULL), 8192);
    /* Per layer (q4_1): q, o 576*576 = 331,776; k, v 576*192 = 110,592;
     * gate, up, down 576*1536 = 884,736: 3,538,944; * 30 = 106,168,320
     * params in 210 tensors; 20 bytes per 32 -> 66,355,200 bytes.
     * token_embd (q8_0, tied LM head): 576*49152 = 28,311,552 params,
     * 34 bytes per 32 -> 30,081,024 bytes. f32 norms: 61 * 576 = 35,136
     * params, 140,544 bytes. Total 134,515,008 params (the figure
     * `rlai info` prints), 96,576,768 bytes. */
    ck_assert_uint_eq(num(d, "n_params", NULL), 134515008);
    ck_assert_uint_eq(num(d, "weight_bytes", NULL), 96576768);
    ck_assert_uint_eq(num(d, "file_bytes", NULL), 98362432);
    const cJSON *tt = cJSON_GetObjectItem(d, "tensor_types");
    ck_assert_int_eq(cJSON_GetArraySize(tt), 3);
    ck_assert_uint_eq(num(tt, "q4_1", "count"), 210);
    ck_assert_uint_eq(num(tt, "q4_1", "params"), 106168320);
    ck_assert_uint_eq(num(tt, "q4_1", "bytes"), 66355200);
    ck_assert_uint_eq(num(tt, "q8_0", "count"), 1);
    ck_assert_uint_eq(num(tt, "q8_0", "bytes"), 30081024);
    ck_assert_uint_eq(num(tt, "f32", "count"), 61);
    ck_assert_uint_eq(num(tt, "f32", "params"), 35136);
    ck_assert_uint_eq(num(tt, "f32", "bytes"), 140544);
    cJSON_Delete(d);
}
END_TEST

START_TEST(fit_default_model_rtx4060)
{
    cJSON *r = NULL;
    char err[512];
    ck_assert_int_eq(check_json("{\"model\":\"" SMOL "\",\"gpu\":\"RTX 4060\"}", &r, err, sizeof err), 0);
    ck_assert_uint_eq(num(r, "weights", "bytes"), 96576768);
    /* 96,576,768 * 8 / 134,515,008 */
    ck_assert_double_eq_tol(num(r, "weights", "bits_per_weight"), 5.743702, 1e-6);
    const cJSON *bt = cJSON_GetObjectItem(cJSON_GetObjectItem(r, "weights"), "by_type");
    ck_assert_int_eq(cJSON_GetArraySize(bt), 3);
    const cJSON *first = cJSON_GetArrayItem(bt, 0);                 /* largest first */
    ck_assert_str_eq(cJSON_GetObjectItem(first, "type")->valuestring, "q4_1");
    ck_assert_double_eq_tol(num(first, "bits_per_weight", NULL), 5.0, 1e-12); /* 20*8/32 */
    ck_assert_double_eq_tol(num(cJSON_GetArrayItem(bt, 1), "bits_per_weight", NULL), 8.5, 1e-12); /* 34*8/32 */
    /* KV per token: 2 * 30 layers * (3 * 64) * 2 bytes = 23,040; per 1k
     * tokens 23,592,960; at 8192 tokens 188,743,680. */
    ck_assert_uint_eq(num(r, "kv", "bytes_per_token"), 23040);
    ck_assert_uint_eq(num(r, "kv", "bytes_per_1k_tokens"), 23592960);
    ck_assert_uint_eq(num(r, "kv", "context"), 8192);
    ck_assert_uint_eq(num(r, "kv", "bytes_at_context"), 188743680);
    /* Activations: 512*4*(4*576 + 2*1536) = 11,010,048; logits
     * 512*4*49152 = 100,663,296; + 268,435,456 = 380,108,800. */
    ck_assert_uint_eq(num(r, "activations", "hidden_bytes"), 11010048);
    ck_assert_uint_eq(num(r, "activations", "logits_bytes"), 100663296);
    ck_assert_uint_eq(num(r, "activations", "bytes"), 380108800);
    /* RTX 4060: 8 GiB = 8,589,934,592; budget 95% = 8,160,437,862 (floor);
     * need 96,576,768 + 188,743,680 + 1,073,741,824 = 1,359,062,272;
     * headroom 6,801,375,590. */
    ck_assert(flag(r, "verdict", "fits"));
    ck_assert_uint_eq(num(r, "gpu", "vram_bytes"), 8589934592ull);
    ck_assert_uint_eq(num(r, "verdict", "budget_bytes"), 8160437862ull);
    ck_assert_uint_eq(num(r, "verdict", "need_bytes"), 1359062272ull);
    ck_assert_uint_eq(num(r, "verdict", "headroom_bytes"), 6801375590ull);
    /* Decode: 0.7 * 272e9 / (96,576,768 + 188,743,680) = 190.4e9 /
     * 285,320,448 = 667.32 tok/s; empty context 190.4e9 / 96,576,768 = 1971.5. */
    ck_assert_uint_eq(num(r, "decode", "bytes_per_token"), 285320448);
    ck_assert_double_eq_tol(num(r, "decode", "tok_s"), 667.3199, 1e-3);
    ck_assert_double_eq_tol(num(r, "decode", "tok_s_empty_context"), 190.4e9 / 96576768.0, 1e-6);
    cJSON_Delete(r);
}
END_TEST

START_TEST(describe_8b_header)
{
    make_8b();
    cJSON *d = NULL;
    char err[512];
    ck_assert_int_eq(rlai_host_gguf_describe(path8b, &d, err, sizeof err), 0);
    ck_assert_str_eq(cJSON_GetObjectItem(d, "name")->valuestring, "Test Llama-3-8B");
    ck_assert_uint_eq(num(d, "n_layer", NULL), 32);
    ck_assert_uint_eq(num(d, "n_head_kv", NULL), 8);
    ck_assert_uint_eq(num(d, "head_dim", NULL), 128);             /* no key_length: 4096 / 32 */
    ck_assert_uint_eq(num(d, "n_vocab", NULL), 128256);
    ck_assert_uint_eq(num(d, "n_params", NULL), P8B);
    ck_assert_uint_eq(num(d, "weight_bytes", NULL), W8B);
    const cJSON *tt = cJSON_GetObjectItem(d, "tensor_types");
    ck_assert_uint_eq(num(tt, "q4_0", "count"), 225);
    ck_assert_uint_eq(num(tt, "q4_0", "params"), 7504658432ull);
    ck_assert_uint_eq(num(tt, "q4_0", "bytes"), 4221370368ull);
    ck_assert_uint_eq(num(tt, "q6_K", "count"), 1);
    ck_assert_uint_eq(num(tt, "q6_K", "bytes"), 430940160ull);
    ck_assert_uint_eq(num(tt, "f32", "count"), 65);
    ck_assert_uint_eq(num(tt, "f32", "bytes"), 1064960);
    cJSON_Delete(d);
    drop_8b();
}
END_TEST

START_TEST(fit_8b_rtx4060)
{
    make_8b();
    char params[400], err[512];
    cJSON *r = NULL;
    snprintf(params, sizeof params, "{\"model\":\"%s\",\"gpu\":\"nvidia geforce rtx 4060\"}", path8b);
    ck_assert_int_eq(check_json(params, &r, err, sizeof err), 0);
    ck_assert_str_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(r, "gpu"), "name")->valuestring, "RTX 4060");
    ck_assert_uint_eq(num(r, "weights", "bytes"), W8B);
    ck_assert_double_eq_tol(num(r, "weights", "bits_per_weight"), 4.635840, 1e-6);
    const cJSON *bt = cJSON_GetObjectItem(cJSON_GetObjectItem(r, "weights"), "by_type");
    ck_assert_str_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(bt, 0), "type")->valuestring, "q4_0");
    ck_assert_double_eq_tol(num(cJSON_GetArrayItem(bt, 0), "bits_per_weight", NULL), 4.5, 1e-12);
    ck_assert_str_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(bt, 1), "type")->valuestring, "q6_K");
    ck_assert_double_eq_tol(num(cJSON_GetArrayItem(bt, 1), "bits_per_weight", NULL), 6.5625, 1e-12);
    /* KV per 1k tokens, f16: 2 * 32 * 8 * 128 * 2 * 1024 = 134,217,728;
     * at 8192 tokens: 131,072 * 8192 = 1,073,741,824 (1 GiB). */
    ck_assert_uint_eq(num(r, "kv", "bytes_per_token"), 131072);
    ck_assert_uint_eq(num(r, "kv", "bytes_per_1k_tokens"), 134217728);
    ck_assert_uint_eq(num(r, "kv", "bytes_at_context"), 1073741824);
    /* Activations: 512*4*(4*4096 + 2*14336) = 92,274,688; logits
     * 512*4*128256 = 262,668,288; + 268,435,456 = 623,378,432. */
    ck_assert_uint_eq(num(r, "activations", "bytes"), 623378432);
    /* need 4,653,375,488 + 1,073,741,824 + 1,073,741,824 = 6,800,859,136
     * <= budget 8,160,437,862: fits, headroom 1,359,578,726. */
    ck_assert(flag(r, "verdict", "fits"));
    ck_assert_uint_eq(num(r, "verdict", "need_bytes"), 6800859136ull);
    ck_assert_uint_eq(num(r, "verdict", "headroom_bytes"), 1359578726ull);
    /* 0.7 * 272e9 / (4,653,375,488 + 1,073,741,824) = 190.4e9 /
     * 5,727,117,312 = 33.245 tok/s; empty context 190.4e9 / 4,653,375,488
     * = 40.917. */
    ck_assert_double_eq_tol(num(r, "decode", "tok_s"), 33.2453, 1e-3);
    ck_assert_double_eq_tol(num(r, "decode", "tok_s_empty_context"), 40.9165, 1e-3);
    cJSON_Delete(r);

    /* q8_0 KV: rows of 1024 values = 32 blocks * 34 = 1088 bytes; per token
     * 2 * 32 * 1088 = 69,632; per 1k 71,303,168. f32: 2*32*1024*4*1024 =
     * 268,435,456 per 1k. */
    snprintf(params, sizeof params, "{\"model\":\"%s\",\"gpu\":\"RTX 4060\",\"kv_type\":\"q8_0\"}", path8b);
    ck_assert_int_eq(check_json(params, &r, err, sizeof err), 0);
    ck_assert_uint_eq(num(r, "kv", "bytes_per_1k_tokens"), 71303168);
    ck_assert_double_eq_tol(num(r, "kv", "bytes_per_element"), 1.0625, 1e-12);
    cJSON_Delete(r);
    snprintf(params, sizeof params, "{\"model\":\"%s\",\"gpu\":\"RTX 4060\",\"kv_type\":\"f32\"}", path8b);
    ck_assert_int_eq(check_json(params, &r, err, sizeof err), 0);
    ck_assert_uint_eq(num(r, "kv", "bytes_per_1k_tokens"), 268435456);
    cJSON_Delete(r);

    /* 32k context: KV 131,072 * 32768 = 4,294,967,296; need 4,653,375,488 +
     * 4,294,967,296 + 1,073,741,824 = 10,022,084,608 > 8,160,437,862:
     * does not fit by 1,861,646,746. */
    snprintf(params, sizeof params, "{\"model\":\"%s\",\"gpu\":\"RTX 4060\",\"context\":32768}", path8b);
    ck_assert_int_eq(check_json(params, &r, err, sizeof err), 0);
    ck_assert(!flag(r, "verdict", "fits"));
    ck_assert_double_eq(num(r, "verdict", "headroom_bytes"), -1861646746.0);
    ck_assert_int_ge(cJSON_GetArraySize(cJSON_GetObjectItem(r, "notes")), 2); /* short; > n_ctx_train */
    cJSON_Delete(r);
    drop_8b();
}
END_TEST

START_TEST(verdict_boundary)
{
    make_8b();
    char params[400], err[512];
    cJSON *r = NULL;
    /* need = 6,800,859,136 (above). The smallest VRAM V with
     * floor(V * 95 / 100) >= need is ceil(need * 100 / 95) = 7,158,799,091:
     * 7,158,799,091 * 95 / 100 = 6,800,859,136.45 -> fits, headroom 0;
     * 7,158,799,090 * 95 / 100 = 6,800,859,135.5 -> 1 byte short. vram_gb
     * is GiB: V / 2^30 is exact in a double. */
    snprintf(params, sizeof params, "{\"model\":\"%s\",\"vram_gb\":%.17g,\"bandwidth_gbs\":272}", path8b,
             7158799091.0 / (double)GIB);
    ck_assert_int_eq(check_json(params, &r, err, sizeof err), 0);
    ck_assert_uint_eq(num(r, "gpu", "vram_bytes"), 7158799091ull);
    ck_assert(flag(r, "verdict", "fits"));
    ck_assert_double_eq(num(r, "verdict", "headroom_bytes"), 0.0);
    ck_assert_str_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(r, "gpu"), "name")->valuestring, "custom");
    cJSON_Delete(r);
    snprintf(params, sizeof params, "{\"model\":\"%s\",\"vram_gb\":%.17g,\"bandwidth_gbs\":272}", path8b,
             7158799090.0 / (double)GIB);
    ck_assert_int_eq(check_json(params, &r, err, sizeof err), 0);
    ck_assert(!flag(r, "verdict", "fits"));
    ck_assert_double_eq(num(r, "verdict", "headroom_bytes"), -1.0);
    cJSON_Delete(r);
    drop_8b();
}
END_TEST

START_TEST(fit_from_parameter_counts)
{
    cJSON *r = NULL;
    char err[512];
    /* 8.03e9 params * 4.5 / 8 = 4,516,875,000 bytes; KV as for the 8B file
     * (1,073,741,824 at 8192). RTX 4090: 24 GiB = 25,769,803,776, budget
     * 24,481,313,587; need 4,516,875,000 + 2 * 1,073,741,824 =
     * 6,664,358,648; headroom 17,816,954,939. Decode 0.7 * 1008e9 /
     * 5,590,616,824 = 126.211 tok/s. */
    ck_assert_int_eq(check_json("{\"model\":{\"params_b\":8.03,\"n_layer\":32,\"n_head_kv\":8,"
                                "\"head_dim\":128,\"bits_per_weight\":4.5},\"gpu\":\"RTX 4090\"}",
                                &r, err, sizeof err), 0);
    ck_assert_str_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(r, "model"), "source")->valuestring, "params");
    ck_assert_uint_eq(num(r, "weights", "params"), 8030000000ull);
    ck_assert_uint_eq(num(r, "weights", "bytes"), 4516875000ull);
    ck_assert_double_eq_tol(num(r, "weights", "bits_per_weight"), 4.5, 1e-9);
    ck_assert_uint_eq(num(r, "kv", "bytes_per_1k_tokens"), 134217728);
    ck_assert_uint_eq(num(r, "verdict", "headroom_bytes"), 17816954939ull);
    ck_assert_double_eq_tol(num(r, "decode", "tok_s"), 126.2115, 1e-3);
    ck_assert(!flag(r, "activations", "complete"));               /* n_embd etc. not given */
    cJSON_Delete(r);
    /* The same counts at the top level of params. */
    ck_assert_int_eq(check_json("{\"params_b\":8.03,\"n_layer\":32,\"n_head_kv\":8,\"head_dim\":128,"
                                "\"bits_per_weight\":4.5,\"gpu\":\"RTX 4090\"}", &r, err, sizeof err), 0);
    ck_assert_uint_eq(num(r, "verdict", "headroom_bytes"), 17816954939ull);
    cJSON_Delete(r);
    /* A missing field is named. */
    ck_assert_int_eq(check_json("{\"model\":{\"params_b\":8,\"n_layer\":32,\"head_dim\":128,"
                                "\"bits_per_weight\":4.5},\"gpu\":\"RTX 4090\"}", &r, err, sizeof err),
                     RLAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(err, "n_head_kv"));
    ck_assert_ptr_null(r);
}
END_TEST

START_TEST(gpu_name_matching)
{
    const rlai_fit_gpu *g;
    char err[2048];
    ck_assert_int_eq(rlai_fit_gpu_find("NVIDIA GeForce RTX 4060", &g, err, sizeof err), 0);
    ck_assert_str_eq(g->name, "RTX 4060");
    ck_assert_double_eq(g->bandwidth_gbs, 272);
    ck_assert_int_eq(rlai_fit_gpu_find("rtx4090", &g, err, sizeof err), 0);
    ck_assert_str_eq(g->name, "RTX 4090");
    ck_assert_int_eq(rlai_fit_gpu_find("geforce rtx 4060 ti 16 gb", &g, err, sizeof err), 0);
    ck_assert_str_eq(g->name, "RTX 4060 Ti 16GB");
    ck_assert_double_eq(g->vram_gib, 16);
    ck_assert_int_eq(rlai_fit_gpu_find("RTX 4070 ti super", &g, err, sizeof err), 0);
    ck_assert_str_eq(g->name, "RTX 4070 Ti Super");
    ck_assert_int_eq(rlai_fit_gpu_find("NVIDIA H100 80GB HBM3", &g, err, sizeof err), 0); /* nvidia-smi */
    ck_assert_str_eq(g->name, "H100 SXM");
    ck_assert_int_eq(rlai_fit_gpu_find("NVIDIA H200", &g, err, sizeof err), 0);
    ck_assert_double_eq(g->bandwidth_gbs, 4800);
    ck_assert_int_eq(rlai_fit_gpu_find("nvidia gb10", &g, err, sizeof err), 0);
    ck_assert_str_eq(g->name, "DGX Spark");
    ck_assert(g->unified);
    /* A prefix of several: ambiguous, the candidates named. */
    ck_assert_int_eq(rlai_fit_gpu_find("RTX 4060 Ti", &g, err, sizeof err), RLAI_ERR_NOT_FOUND);
    ck_assert_ptr_null(g);
    ck_assert_ptr_nonnull(strstr(err, "ambiguous"));
    ck_assert_ptr_nonnull(strstr(err, "RTX 4060 Ti 8GB"));
    ck_assert_ptr_nonnull(strstr(err, "RTX 4060 Ti 16GB"));
    ck_assert_ptr_null(strstr(err, "RTX 4090"));
    /* "RTX 4070" is a prefix of others but matches exactly. */
    ck_assert_int_eq(rlai_fit_gpu_find("RTX 4070", &g, err, sizeof err), 0);
    ck_assert_str_eq(g->name, "RTX 4070");
    ck_assert_int_eq(rlai_fit_gpu_find("", &g, err, sizeof err), RLAI_ERR_INVALID_ARG);
}
END_TEST

START_TEST(unknown_gpu_lists_known_names)
{
    const rlai_fit_gpu *g;
    char err[2048];
    ck_assert_int_eq(rlai_fit_gpu_find("Radeon RX 7900", &g, err, sizeof err), RLAI_ERR_NOT_FOUND);
    ck_assert_ptr_nonnull(strstr(err, "unknown GPU 'Radeon RX 7900'"));
    for (int i = 0; i < rlai_fit_gpu_count(); i++)
        ck_assert_msg(strstr(err, rlai_fit_gpu_at(i)->name), "'%s' not listed in: %s",
                      rlai_fit_gpu_at(i)->name, err);
    /* Through fit.check the same error comes back. */
    cJSON *r = NULL;
    ck_assert_int_eq(check_json("{\"model\":\"" SMOL "\",\"gpu\":\"RTX 9999\"}", &r, err, sizeof err),
                     RLAI_ERR_NOT_FOUND);
    ck_assert_ptr_nonnull(strstr(err, "H200"));
    ck_assert_ptr_null(r);
}
END_TEST

START_TEST(gpu_table_figures)
{
    /* The table against the figures of the issue (GiB, GB/s). */
    static const struct { const char *n; double gb, bw; } want[] = {
        { "RTX 4060", 8, 272 }, { "RTX 4060 Ti 8GB", 8, 288 }, { "RTX 4060 Ti 16GB", 16, 288 },
        { "RTX 4070", 12, 504 }, { "RTX 4070 Super", 12, 504 }, { "RTX 4070 Ti", 12, 504 },
        { "RTX 4070 Ti Super", 16, 672 }, { "RTX 4080", 16, 717 }, { "RTX 4080 Super", 16, 736 },
        { "RTX 4090", 24, 1008 }, { "RTX 5060", 8, 448 }, { "RTX 5060 Ti 8GB", 8, 448 },
        { "RTX 5060 Ti 16GB", 16, 448 }, { "RTX 5070", 12, 672 }, { "RTX 5070 Ti", 16, 896 },
        { "RTX 5080", 16, 960 }, { "RTX 5090", 32, 1792 }, { "RTX PRO 6000 Blackwell", 96, 1792 },
        { "DGX Spark", 128, 273 }, { "H100 SXM", 80, 3350 }, { "H100 PCIe", 80, 2000 },
        { "H200", 141, 4800 },
    };
    int n = (int)(sizeof want / sizeof want[0]);
    ck_assert_int_eq(rlai_fit_gpu_count(), n);
    cJSON *t = rlai_fit_gpu_table_json();
    ck_assert_int_eq(cJSON_GetArraySize(t), n);
    for (int i = 0; i < n; i++) {
        const rlai_fit_gpu *g;
        char err[2048];
        ck_assert_msg(rlai_fit_gpu_find(want[i].n, &g, err, sizeof err) == 0, "%s", err);
        ck_assert_double_eq(g->vram_gib, want[i].gb);
        ck_assert_double_eq(g->bandwidth_gbs, want[i].bw);
        ck_assert_str_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(t, i), "name")->valuestring, want[i].n);
    }
    cJSON_Delete(t);
    ck_assert_ptr_null(rlai_fit_gpu_at(n));
}
END_TEST

START_TEST(vocab_only_and_bad_files)
{
    char err[512];
    cJSON *d = NULL, *r = NULL;
    /* A vocabulary-only file: the header is described (no tensors)... */
    const char *vocab = RLAI_TESTDATA "/tokenizer/ggml-vocab-gpt-2.gguf";
    ck_assert_int_eq(rlai_host_gguf_describe(vocab, &d, err, sizeof err), 0);
    ck_assert_str_eq(cJSON_GetObjectItem(d, "arch")->valuestring, "gpt2");
    ck_assert_uint_eq(num(d, "n_params", NULL), 0);
    ck_assert_uint_eq(num(d, "n_vocab", NULL), 50257);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(d, "tensor_types")), 0);
    cJSON_Delete(d);
    /* ...and fit.check says there is nothing to fit. */
    char params[300];
    snprintf(params, sizeof params, "{\"model\":\"%s\",\"gpu\":\"RTX 4060\"}", vocab);
    ck_assert_int_eq(check_json(params, &r, err, sizeof err), RLAI_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(err, "no tensors"));

    /* A header without hyperparameters (unknown architecture): fields absent. */
    snprintf(tmpdir, sizeof tmpdir, "/tmp/rlai-test-fit-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
    char p[128];
    snprintf(p, sizeof p, "%s/x.gguf", tmpdir);
    FILE *f = fopen(p, "wb");
    ck_assert_ptr_nonnull(f);
    fwrite("GGUF", 1, 4, f);
    w_u32(f, 3);
    w_u64(f, 1);
    w_u64(f, 1);
    kv_str(f, "general.architecture", "mystery");
    w_str(f, "w");
    w_u32(f, 1);
    w_u64(f, 64);
    w_u32(f, 12);                                               /* q4_K: 256-element blocks */
    w_u64(f, 0);
    fclose(f);
    /* ne[0] = 64 is not a multiple of q4_K's 256: the reader refuses it. */
    ck_assert_int_eq(rlai_host_gguf_describe(p, &d, err, sizeof err), RLAI_ERR_FORMAT);
    ck_assert_ptr_null(d);

    /* An unknown tensor type id (31, removed from ggml) is a clear error. */
    f = fopen(p, "wb");
    fwrite("GGUF", 1, 4, f);
    w_u32(f, 3);
    w_u64(f, 1);
    w_u64(f, 1);
    kv_str(f, "general.architecture", "mystery");
    w_str(f, "w");
    w_u32(f, 1);
    w_u64(f, 64);
    w_u32(f, 31);
    w_u64(f, 0);
    fclose(f);
    ck_assert_int_eq(truncate(p, 4096), 0);
    ck_assert_int_eq(rlai_host_gguf_describe(p, &d, err, sizeof err), RLAI_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(err, "type 31 unknown"));

    /* An unknown architecture with a known tensor type: described, no
     * hyperparameters; fit.check explains what is missing. */
    f = fopen(p, "wb");
    fwrite("GGUF", 1, 4, f);
    w_u32(f, 3);
    w_u64(f, 1);
    w_u64(f, 1);
    kv_str(f, "general.architecture", "mystery");
    w_str(f, "w");
    w_u32(f, 1);
    w_u64(f, 256);
    w_u32(f, 12);
    w_u64(f, 0);
    fclose(f);
    ck_assert_int_eq(truncate(p, 4096), 0);
    ck_assert_int_eq(rlai_host_gguf_describe(p, &d, err, sizeof err), 0);
    ck_assert_ptr_null(cJSON_GetObjectItem(d, "n_layer"));
    ck_assert_uint_eq(num(cJSON_GetObjectItem(d, "tensor_types"), "q4_K", "bytes"), 144);
    cJSON_Delete(d);
    snprintf(params, sizeof params, "{\"model\":\"%s\",\"gpu\":\"RTX 4060\"}", p);
    ck_assert_int_eq(check_json(params, &r, err, sizeof err), RLAI_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(err, "no n_layer"));
    ck_assert_ptr_nonnull(strstr(err, "mystery"));
    unlink(p);
    rmdir(tmpdir);

    /* Missing file. */
    ck_assert_int_eq(rlai_host_gguf_describe("/nonexistent/m.gguf", &d, err, sizeof err), RLAI_ERR_IO);
    ck_assert_ptr_nonnull(strstr(err, "/nonexistent/m.gguf"));
}
END_TEST

START_TEST(bad_params)
{
    cJSON *r = NULL;
    char err[512];
    ck_assert_int_eq(check_json("{\"gpu\":\"RTX 4060\"}", &r, err, sizeof err), RLAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(err, "model"));
    ck_assert_int_eq(check_json("{\"model\":\"" SMOL "\"}", &r, err, sizeof err), RLAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(err, "vram_gb"));
    ck_assert_int_eq(check_json("{\"model\":\"" SMOL "\",\"gpu\":\"RTX 4060\",\"context\":0}", &r, err,
                                sizeof err), RLAI_ERR_INVALID_ARG);
    ck_assert_int_eq(check_json("{\"model\":\"" SMOL "\",\"gpu\":\"RTX 4060\",\"context\":1.5}", &r, err,
                                sizeof err), RLAI_ERR_INVALID_ARG);
    ck_assert_int_eq(check_json("{\"model\":\"" SMOL "\",\"gpu\":\"RTX 4060\",\"kv_type\":\"q4\"}", &r,
                                err, sizeof err), RLAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(err, "kv_type"));
    ck_assert_int_eq(check_json("{\"model\":\"" SMOL "\",\"vram_gb\":-1,\"bandwidth_gbs\":100}", &r, err,
                                sizeof err), RLAI_ERR_INVALID_ARG);
    ck_assert_int_eq(check_json("{\"model\":42,\"gpu\":\"RTX 4060\"}", &r, err, sizeof err),
                     RLAI_ERR_INVALID_ARG);
    /* A GPU with one overridden figure keeps the other from the table. */
    ck_assert_int_eq(check_json("{\"model\":\"" SMOL "\",\"gpu\":\"RTX 4060\",\"vram_gb\":16}", &r, err,
                                sizeof err), 0);
    ck_assert_uint_eq(num(r, "gpu", "vram_bytes"), 16 * GIB);
    ck_assert_double_eq(num(r, "gpu", "bandwidth_gbs"), 272);
    cJSON_Delete(r);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("fit");
    TCase *tc = tcase_create("fit");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, kv_row_bytes);
    tcase_add_test(tc, describe_default_model);
    tcase_add_test(tc, fit_default_model_rtx4060);
    tcase_add_test(tc, describe_8b_header);
    tcase_add_test(tc, fit_8b_rtx4060);
    tcase_add_test(tc, verdict_boundary);
    tcase_add_test(tc, fit_from_parameter_counts);
    tcase_add_test(tc, gpu_name_matching);
    tcase_add_test(tc, unknown_gpu_lists_known_names);
    tcase_add_test(tc, gpu_table_figures);
    tcase_add_test(tc, vocab_only_and_bad_files);
    tcase_add_test(tc, bad_params);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
