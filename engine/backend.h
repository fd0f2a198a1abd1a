/* backend.h - the compute backend interface of the engine (private).
 *
 * model.c walks the layers of the transformer and calls a backend for every
 * operation; the backend owns where tensors live (host memory for the CPU
 * backend, device memory for a GPU backend) and how each op is computed.
 * The idea is ggml's ggml_backend_i: one table of function pointers with a
 * version, device buffers, and the ops the forward needs.
 *
 * Memory rules
 *   - "Tensor" arguments (float * activations, weights, KV pages) are
 *     backend memory: obtained from buffer_alloc / weight_upload of the same
 *     backend. The CPU backend's backend memory is ordinary host memory.
 *   - "Metadata" arguments (token ids, positions, block tables, sequence
 *     indices, flags) are always host memory, read during the call only; a
 *     GPU backend stages them into its own fixed device buffers (which is
 *     what lets a decode step be captured once and replayed).
 *   - Ops are issued in order on one stream; results are visible to the
 *     host only after download() (which synchronises).
 *
 * Versioning: `version` is RLAI_BACKEND_IFACE_VERSION of the code that
 * built the table and `struct_size` its sizeof; members are only appended.
 * Entries marked OPTIONAL may be NULL; the caller then uses the fallback
 * named there. A backend module loaded at run time (the CUDA backend) is
 * refused when its version differs from the engine's.
 *
 * Threading: a backend instance is used by one thread at a time (the
 * engine's scheduler thread); it may use worker threads internally.
 */
#ifndef RLAI_BACKEND_H
#define RLAI_BACKEND_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include "kernels.h"

#define RLAI_BACKEND_IFACE_VERSION 1

typedef struct rlai_backend rlai_backend;   /* struct tag shared with kv_cache.h */

typedef enum rlai_rope_mode { RLAI_ROPE_NORM = 0, RLAI_ROPE_NEOX = 2 } rlai_rope_mode;

/* The paged KV cache of one layer as an op sees it: the K and V page arrays
 * (backend memory; block b, slot s is the row at byte (b*16 + s)*row_bytes)
 * and their element type (RLAI_DT_F16, RLAI_DT_F32 or RLAI_DT_Q8_0). */
typedef struct rlai_kv_layer_view {
    void *k, *v;
    size_t row_bytes;
    uint32_t dtype;
    int kv_dim;              /* values per row: n_head_kv * head_dim */
} rlai_kv_layer_view;

/* Where each token of a batch sits: token i is at position pos[i] of the
 * sequence whose block table is tables[i] (n_blocks >= pos[i]/16 + 1).
 * Host memory. */
typedef struct rlai_paged_rows {
    int n;
    const int32_t *pos;
    const int32_t *const *tables;
} rlai_paged_rows;

typedef struct rlai_backend_i {
    uint32_t version;        /* RLAI_BACKEND_IFACE_VERSION */
    uint32_t struct_size;    /* sizeof(rlai_backend_i) of the builder */
    const char *name;        /* "cpu", "cuda" */
    bool host_memory;        /* backend memory is host memory (the CPU backend):
                                callers may pass host arrays as tensors */

    /* Frees the instance (not the buffers it handed out: free those first). */
    void (*free)(rlai_backend *be);
    /* Human-readable device description, e.g. "cpu avx512, 2 threads". */
    const char *(*describe)(rlai_backend *be);

    /* ---- buffers */
    /* Allocates `size` zeroed bytes of backend memory; *out NULL on error.
     * Returns 0 or RLAI_ERR_NOMEM. */
    int (*buffer_alloc)(rlai_backend *be, size_t size, void **out);
    void (*buffer_free)(rlai_backend *be, void *buf);        /* accepts NULL */
    /* Host -> backend and backend -> host copies of n bytes at byte offset
     * off of buf. download synchronises with every op issued before it. */
    int (*upload)(rlai_backend *be, void *buf, size_t off, const void *src, size_t n);
    int (*download)(rlai_backend *be, const void *buf, size_t off, void *dst, size_t n);
    /* Backend -> backend copy of n bytes (KV copy-on-write). OPTIONAL when
     * host_memory (the caller then uses memcpy), required otherwise. */
    int (*copy)(rlai_backend *be, void *dst, size_t dst_off, const void *src, size_t src_off, size_t n);

    /* ---- weights
     * OPTIONAL. Copies a GGUF weight (host memory, in its GGUF type) into
     * backend memory once, in the same type; *dev then describes it
     * (dev->data is backend memory, freed with weight_free). NULL: the
     * backend computes on the host mapping directly. (A host-memory backend
     * may keep dev->data = host->data and add a derived copy such as the
     * CPU kernels' packed layout, dev->packed, which weight_free frees.) */
    int (*weight_upload)(rlai_backend *be, const rlai_weight *host, rlai_weight *dev);
    void (*weight_free)(rlai_backend *be, rlai_weight *dev);

    /* ---- ops (tensors in backend memory, metadata on the host) */
    /* dst[i] = row ids[i] of w, dequantized to f32 (n rows of w->cols). */
    void (*get_rows)(rlai_backend *be, const rlai_weight *w, const int32_t *ids, int n, float *dst);
    /* Each of n rows of width d: dst = x / rms(x) * w (accumulated in double
     * on the CPU reference). dst may equal x. */
    void (*rmsnorm)(rlai_backend *be, float *dst, const float *x, const float *w, int n, int d, float eps);
    /* y[t*ldy + r] = sum_c W[r][c] * x[t*ldx + c] for t < T: the quantized
     * matrix product (matrix-vector at T = 1, matrix-matrix for prefill).
     * Batch-invariant: token t's outputs must have the same bits whatever T
     * and the other tokens are (speculative decoding's exactness and a
     * sequence's independence from its batch rest on it; checked by
     * tests/test_backend_ops.c), and so must attention's per row. */
    void (*matmul)(rlai_backend *be, const rlai_weight *w, const float *x, int64_t ldx, int T,
                   float *y, int64_t ldy);
    /* x[i*d + j] += b[j] for n rows (bias). */
    void (*add_row)(rlai_backend *be, float *x, const float *b, int n, int d);
    /* x[j] += y[j] for j < n (residual). */
    void (*add)(rlai_backend *be, float *x, const float *y, size_t n);
    /* gate[j] = silu(gate[j]) * up[j] for j < n. */
    void (*swiglu)(rlai_backend *be, float *gate, const float *up, size_t n);
    /* Rotary embedding of n rows of n_heads heads of head_dim values
     * (row stride n_heads*head_dim), row i at position pos[i]; the first
     * n_rot values of each head rotate; NORM pairs (2i, 2i+1), NEOX pairs
     * (i, i + n_rot/2). inv_freq: n_rot/2 floats, host memory. */
    void (*rope)(rlai_backend *be, float *x, int n, int n_heads, int head_dim, int n_rot,
                 rlai_rope_mode mode, const float *inv_freq, const int32_t *pos);
    /* Stores the K and V rows of the batch (n rows of kv->kv_dim f32) into
     * their pages, converting to the cache type. */
    void (*kv_store)(rlai_backend *be, const rlai_kv_layer_view *kv, const rlai_paged_rows *rows,
                     const float *k, const float *v);
    /* Causal attention over the paged cache: for row i and head h, out =
     * softmax(q . K[0..pos[i]] / sqrt(head_dim)) V over the positions of its
     * sequence (grouped-query: head h reads KV head h / (n_head/n_head_kv)).
     * q and out: n rows of n_head*head_dim. */
    void (*attention)(rlai_backend *be, const rlai_kv_layer_view *kv, const rlai_paged_rows *rows,
                      int n_head, int n_head_kv, int head_dim, const float *q, float *out);

    /* OPTIONAL. Greedy sampling head: out[i] = argmax of row i of n rows of
     * n_vocab logits (lowest index on ties), so only ids cross to the host.
     * NULL: the engine downloads the logits and samples on the host. */
    int (*argmax)(rlai_backend *be, const float *logits, int n, int n_vocab, int32_t *out);

    /* OPTIONAL. matmul of n (<= RLAI_MATMUL_N_MAX) weights on the same
     * input: y[i] = w[i] x, each as matmul computes it (a layer's Q/K/V
     * and gate/up: the CPU backend quantizes x once and runs the products
     * in one pass of its pool). NULL: the caller calls matmul n times.
     * w, y, ldy: n entries, host arrays. */
    void (*matmul_n)(rlai_backend *be, const rlai_weight *const *w, int n, const float *x, int64_t ldx, int T,
                     float *const *y, const int64_t *ldy);
} rlai_backend_i;

/* True when backend table `i` has member `m` (tables only grow by
 * appending; a table built against an older header is shorter). */
#define RLAI_BACKEND_HAS(i, m) \
    ((i)->struct_size >= offsetof(rlai_backend_i, m) + sizeof((i)->m) && (i)->m != NULL)

/* Every backend instance starts with its table. */
struct rlai_backend {
    const rlai_backend_i *iface;
};

/* The devices a user can ask for: "auto" (or NULL/""), "cpu", "cuda",
 * "cuda:N". Parses `spec` into kind and index; returns 0 or
 * RLAI_ERR_INVALID_ARG with a message in err. */
typedef enum rlai_device_kind { RLAI_DEVICE_AUTO = 0, RLAI_DEVICE_CPU = 1, RLAI_DEVICE_CUDA = 2 } rlai_device_kind;
int rlai_device_parse(const char *spec, rlai_device_kind *kind, int *index, char *err, size_t errlen);

/* Options for opening a backend. The CPU kernels and pool are used, not
 * owned, and must outlive the backend. */
typedef struct rlai_backend_options {
    const char *device;      /* see rlai_device_parse */
    rlai_kernels *kernels;   /* CPU backend */
    rlai_threadpool *pool;   /* CPU backend */
    int max_ctx;             /* longest sequence an attention op sees */
} rlai_backend_options;

/* Opens the backend for opt->device. "cpu" always works. "cuda[:N]" loads
 * the CUDA backend module (rlai-backend-cuda.so, looked up in
 * $RLAI_BACKEND_DIR, then the executable's ../lib/rlai, then its
 * ../engine/backend-cuda (the build tree), then the install libdir) and fails with RLAI_ERR_UNSUPPORTED naming the reason
 * when it cannot (module not built or not found, no driver, no device).
 * "auto" tries CUDA when an NVIDIA device node exists and falls back to the
 * CPU, writing one line saying why into note (if notelen > 0; "" when it
 * did not try). *out owned by the caller, freed with rlai_backend_free. */
int rlai_backend_open(const rlai_backend_options *opt, rlai_backend **out,
                      char *err, size_t errlen, char *note, size_t notelen);
/* Frees a backend from rlai_backend_open (accepts NULL). */
void rlai_backend_free(rlai_backend *be);

/* The CPU backend, directly (tests compare backends op by op). */
int rlai_backend_cpu_new(rlai_kernels *k, rlai_threadpool *tp, int max_ctx, rlai_backend **out);

/* Entry point a backend module exports (dlsym name "rlai_backend_module_open"). */
typedef int (*rlai_backend_module_open_fn)(uint32_t iface_version, int device_index, int max_ctx,
                                           rlai_backend **out, char *err, size_t errlen);

#endif
