/* fitcalc.h - "can it run?": memory and speed estimates of a model on a
 * GPU. Pure computation (no host): the fit plugin's commands and the tests
 * call it; the GGUF header reader is passed in as a function.
 *
 * The formulas (all sizes in bytes; GiB = 2^30, GB/s = 10^9 B/s):
 *   weights      = sum of the tensors' data bytes (from the GGUF header), or
 *                  params * bits_per_weight / 8 when given as counts;
 *                  effective bits per weight = bytes * 8 / params (overall
 *                  and per tensor type)
 *   KV per token = 2 (K and V) * n_layer * row(n_head_kv * head_dim), where
 *                  row(n) = n * 2 (f16), n * 4 (f32), ceil(n / 32) * 34 (q8_0:
 *                  32-value blocks of an f16 scale and 32 int8, 34/32 bytes a value)
 *   KV per 1k    = KV per token * 1024;  KV at context = KV per token * context
 *   activations  = 512 * 4 * (4 * n_embd + 2 * n_ff)      (f32 buffers of a
 *                  512-token prefill batch: residual, normed input, attention
 *                  output, Q, FFN gate and up)
 *                + 512 * 4 * n_vocab                       (f32 logits of the batch)
 *                + 256 MiB                                 (fixed CUDA workspace:
 *                  cuBLAS workspace, dequantization and attention scratch)
 *   verdict      = fits when weights + KV at context + 1 GiB <= 95% of VRAM
 *                  (integer: vram * 95 / 100); headroom = budget - need. The
 *                  1 GiB covers the CUDA context and the activations above.
 *   decode tok/s = 0.70 * bandwidth / (weights + KV at context): decode is
 *                  memory-bound, each token reads every weight once and the
 *                  whole KV cache; 70% of peak bandwidth is what well-tuned
 *                  kernels reach. Also given at an empty context (weights only).
 */
#ifndef RLAI_FIT_FITCALC_H
#define RLAI_FIT_FITCALC_H

#include <rlai/plugin.h>

#include "gputable.h"

#define RLAI_FIT_DEFAULT_CONTEXT 8192
#define RLAI_FIT_MAX_CONTEXT (1 << 24)
#define RLAI_FIT_BATCH 512
#define RLAI_FIT_WORKSPACE_BYTES (256ull << 20)
#define RLAI_FIT_OVERHEAD_BYTES (1ull << 30)
#define RLAI_FIT_VRAM_USABLE_PCT 95
#define RLAI_FIT_BW_EFFICIENCY 0.70
#define RLAI_FIT_MAX_TYPES 48

/* KV cache element type; 0 is not a valid value. */
typedef enum rlai_fit_kv {
    RLAI_FIT_KV_F16 = 1,
    RLAI_FIT_KV_Q8_0 = 2,
    RLAI_FIT_KV_F32 = 3,
} rlai_fit_kv;

/* Weights of one tensor type. */
typedef struct rlai_fit_type {
    char name[16];             /* "q4_0", "f32", "q6_K", ... */
    uint64_t count;            /* tensors */
    uint64_t params;           /* elements */
    uint64_t bytes;            /* data bytes */
} rlai_fit_type;

/* What the estimate needs to know about a model. Counts are 0 when unknown. */
typedef struct rlai_fit_model {
    char name[128];            /* "" when unknown */
    char arch[32];
    char source[8];            /* "gguf" or "params" */
    int64_t n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_ctx_train;
    uint64_t n_params;
    uint64_t weight_bytes;
    uint64_t file_bytes;
    int n_types;               /* entries of types, sorted by bytes (largest first) */
    rlai_fit_type types[RLAI_FIT_MAX_TYPES];
} rlai_fit_model;

/* The GPU (or custom memory figures) to fit on. */
typedef struct rlai_fit_target {
    char name[96];             /* table name, or "custom" */
    uint64_t vram_bytes;
    double vram_gib;
    double bandwidth_gbs;      /* GB/s */
    bool unified;
} rlai_fit_target;

typedef struct rlai_fit_result {
    int64_t context;
    rlai_fit_kv kv_type;
    double bits_per_weight;    /* overall; 0 when n_params is 0 */
    uint64_t kv_bytes_per_token, kv_bytes_per_1k, kv_bytes_ctx;
    uint64_t act_hidden_bytes, act_logits_bytes, act_workspace_bytes, act_bytes;
    bool act_complete;         /* false: n_embd, n_ff or n_vocab unknown (term left out) */
    uint64_t overhead_bytes;   /* RLAI_FIT_OVERHEAD_BYTES */
    uint64_t need_bytes;       /* weights + KV at context + overhead */
    uint64_t budget_bytes;     /* vram * 95 / 100 */
    int64_t headroom_bytes;    /* budget - need (negative: does not fit) */
    bool fits;
    uint64_t bytes_per_token;  /* weights + KV at context */
    double decode_tps;         /* at the full context */
    double decode_tps_empty;   /* at an empty context */
} rlai_fit_result;

/* The GGUF header reader (host->gguf_describe's signature). */
typedef int (*rlai_fit_describe_fn)(const char *path, cJSON **out, char *err, size_t errlen);

/* "f16" / "q8_0" / "f32" (case-insensitive) to *out; RLAI_ERR_INVALID_ARG
 * otherwise. */
int rlai_fit_kv_parse(const char *s, rlai_fit_kv *out);
/* "f16", "q8_0", "f32"; "?" for an invalid value. Static. */
const char *rlai_fit_kv_name(rlai_fit_kv kv);
/* Bytes of one row of n values of type kv (see the formula above); 0 for
 * an invalid kv. */
uint64_t rlai_fit_kv_row_bytes(rlai_fit_kv kv, uint64_t n);

/* Fills *m from a gguf_describe object (borrowed). Returns 0, or
 * RLAI_ERR_UNSUPPORTED with a message when the file lacks what the KV
 * estimate needs (n_layer, n_head_kv, head_dim: a vocabulary-only or
 * unknown-architecture file) or has no tensors; RLAI_ERR_FORMAT for
 * malformed values. */
int rlai_fit_model_from_describe(const cJSON *d, rlai_fit_model *m, char *err, size_t errlen);

/* Fills *m from parameter counts (borrowed object): required "params_b"
 * (billions, > 0), "n_layer", "n_head_kv", "head_dim" (positive integers),
 * "bits_per_weight" (0 < x <= 32); optional "n_embd", "n_ff", "n_vocab",
 * "n_head", "n_ctx_train" (positive integers) and "name" (string).
 * n_params = round(params_b * 1e9); weight bytes = round(n_params * bpw / 8).
 * Returns 0 or RLAI_ERR_INVALID_ARG with a message naming the field. */
int rlai_fit_model_from_params(const cJSON *p, rlai_fit_model *m, char *err, size_t errlen);

/* Fills *t from request params (borrowed): "gpu" (a table name, see
 * rlai_fit_gpu_find) and/or "vram_gb" (GiB, > 0) and "bandwidth_gbs" (> 0);
 * explicit figures override the table's (the name then says "(custom ...)").
 * Returns 0; RLAI_ERR_NOT_FOUND for an unknown GPU (message lists the known
 * names); RLAI_ERR_INVALID_ARG for bad or missing figures. */
int rlai_fit_target_from_params(const cJSON *p, rlai_fit_target *t, char *err, size_t errlen);

/* Computes the estimate. context in 1..RLAI_FIT_MAX_CONTEXT. Returns 0, or
 * RLAI_ERR_INVALID_ARG (bad context, kv type, empty target or a model
 * without n_layer / n_head_kv / head_dim). */
int rlai_fit_compute(const rlai_fit_model *m, const rlai_fit_target *t, int64_t context,
                     rlai_fit_kv kv, rlai_fit_result *r, char *err, size_t errlen);

/* The estimate as the JSON object fit.check answers (see README.md).
 * path may be NULL. Caller owns the result; NULL when out of memory. */
cJSON *rlai_fit_result_json(const rlai_fit_model *m, const rlai_fit_target *t,
                            const rlai_fit_result *r, const char *path);

/* The whole fit.check: params (borrowed) hold "model" (a GGUF path, read
 * with describe, or an object of parameter counts; the counts may also be
 * given at the top level), the target (see rlai_fit_target_from_params),
 * optional "context" (integer, default 8192) and "kv_type" (default
 * "f16"). On success *out is owned by the caller. Returns 0 or a negative
 * error with a message in err (describe's own errors are passed on). */
int rlai_fit_check(const cJSON *params, rlai_fit_describe_fn describe, cJSON **out,
                   char *err, size_t errlen);

#endif
