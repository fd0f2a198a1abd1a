/* rlai/gguf.h - validating, memory-mapped reader for GGUF v2/v3 files (public:
 * the host, tools and embedders read GGUF headers with it, as ggml exposes
 * its gguf.h).
 *
 * rlai_gguf_open_* parses the whole header up front and validates every
 * count, string length, key type, array size, alignment, tensor shape, type
 * and data range against the file size before returning. After a successful
 * open every accessor is bounds-safe. All pointers returned point into the
 * mapping (or the caller's buffer) and stay valid until rlai_gguf_close().
 * Strings from the file are NOT NUL-terminated: use the returned length.
 */
#ifndef RLAI_GGUF_H
#define RLAI_GGUF_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

enum rlai_gguf_vtype {
    RLAI_GGUF_U8 = 0, RLAI_GGUF_I8 = 1, RLAI_GGUF_U16 = 2, RLAI_GGUF_I16 = 3,
    RLAI_GGUF_U32 = 4, RLAI_GGUF_I32 = 5, RLAI_GGUF_F32 = 6, RLAI_GGUF_BOOL = 7,
    RLAI_GGUF_STRING = 8, RLAI_GGUF_ARRAY = 9, RLAI_GGUF_U64 = 10, RLAI_GGUF_I64 = 11,
    RLAI_GGUF_F64 = 12,
};

#define RLAI_GGUF_MAX_DIMS 4

typedef struct rlai_gguf rlai_gguf;

typedef struct rlai_gguf_str {
    const char *ptr;   /* not NUL-terminated */
    size_t len;
} rlai_gguf_str;

typedef struct rlai_gguf_tensor {
    rlai_gguf_str name;
    uint32_t n_dims;
    uint64_t ne[RLAI_GGUF_MAX_DIMS]; /* unused dims are 1; ne[0] is contiguous */
    uint32_t type;                   /* ggml type id (see dtype.h) */
    uint64_t offset;                 /* relative to the data blob */
    uint64_t nbytes;                 /* validated size of the data */
    const void *data;                /* pointer into the mapping */
} rlai_gguf_tensor;

/* Maps and validates `path`. On success *out is owned by the caller (free
 * with rlai_gguf_close). On error returns RLAI_ERR_IO / RLAI_ERR_FORMAT /
 * RLAI_ERR_UNSUPPORTED / RLAI_ERR_NOMEM and writes a message naming the
 * problem (e.g. "tensor 'blk.3.attn_q.weight': data [..] beyond end of file
 * (size N)") into err (if errlen > 0). A tensor type whose size is not
 * known is rejected (its data range could not be checked); known types the
 * engine cannot compute (K-quants, IQ*) are accepted here and refused by
 * the model loader with the tensor's name. */
int rlai_gguf_open_file(const char *path, rlai_gguf **out, char *err, size_t errlen);

/* Same over a caller-owned buffer, which must outlive the returned object
 * (it is not copied). Used by the fuzzer and tests. */
int rlai_gguf_open_memory(const void *buf, size_t len, rlai_gguf **out, char *err, size_t errlen);

/* Unmaps and frees. Accepts NULL. */
void rlai_gguf_close(rlai_gguf *g);

/* True when g maps a file (rlai_gguf_open_file), false for a caller's
 * buffer (rlai_gguf_open_memory) or NULL. A mapped file's pages can be
 * dropped from the process (madvise MADV_DONTNEED) and are read from the
 * file again on the next access. */
bool rlai_gguf_is_mapped(const rlai_gguf *g);

uint32_t rlai_gguf_version(const rlai_gguf *g);
uint32_t rlai_gguf_alignment(const rlai_gguf *g);
uint64_t rlai_gguf_n_kv(const rlai_gguf *g);

/* Index of the metadata key, or -1. */
int64_t rlai_gguf_find_key(const rlai_gguf *g, const char *key);
rlai_gguf_str rlai_gguf_key_at(const rlai_gguf *g, uint64_t i);
uint32_t rlai_gguf_vtype_at(const rlai_gguf *g, uint64_t i);

/* Typed getters. Return 0, RLAI_ERR_NOT_FOUND if the key is absent, or
 * RLAI_ERR_FORMAT if it has an incompatible type or an out-of-range value.
 * Integer getters accept any integer type whose value fits (files often use
 * u32 where the spec says u64). get_f32 accepts f32 and f64. */
int rlai_gguf_get_u32(const rlai_gguf *g, const char *key, uint32_t *out);
int rlai_gguf_get_i32(const rlai_gguf *g, const char *key, int32_t *out);
int rlai_gguf_get_u64(const rlai_gguf *g, const char *key, uint64_t *out);
int rlai_gguf_get_f32(const rlai_gguf *g, const char *key, float *out);
int rlai_gguf_get_bool(const rlai_gguf *g, const char *key, bool *out);
int rlai_gguf_get_str(const rlai_gguf *g, const char *key, rlai_gguf_str *out);

/* Array access: element type and count. For numeric arrays *data points at
 * the packed little-endian elements (possibly unaligned: read with memcpy). */
int rlai_gguf_get_array(const rlai_gguf *g, const char *key,
                        uint32_t *elem_type, uint64_t *n, const void **data);

/* String array: on success *out is a malloc'd array of *n entries pointing
 * into the mapping; the caller frees the array with free(). RLAI_ERR_FORMAT
 * if the key is not an array of strings. */
int rlai_gguf_get_str_array(const rlai_gguf *g, const char *key,
                            rlai_gguf_str **out, uint64_t *n);

uint64_t rlai_gguf_n_tensors(const rlai_gguf *g);
const rlai_gguf_tensor *rlai_gguf_tensor_at(const rlai_gguf *g, uint64_t i);
/* Tensor by exact name, or NULL. */
const rlai_gguf_tensor *rlai_gguf_find_tensor(const rlai_gguf *g, const char *name);

/* Size in bytes of the mapped file / buffer. */
size_t rlai_gguf_file_size(const rlai_gguf *g);

/* The ggml name of tensor type id t ("f32", "q4_0", "q6_K", "iq4_xs",
 * "bf16", ...); NULL for an id without a name. Static string. */
const char *rlai_gguf_type_name(unsigned t);

#endif
