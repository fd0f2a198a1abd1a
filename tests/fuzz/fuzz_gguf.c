/* fuzz_gguf.c - libFuzzer target for the GGUF reader.
 *
 * Opens the input with rlai_gguf_open_memory; on success walks every key
 * with every typed getter and every tensor, touching the first and last
 * byte of each tensor's data so ASan checks the validated ranges. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rlai/gguf.h"
#include "rlai/engine.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint8_t sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* Exact-size copy: reads past the end are caught by ASan. */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    if (size) memcpy(buf, data, size);
    char err[256];
    rlai_gguf *g = NULL;
    int rc = rlai_gguf_open_memory(buf, size, &g, err, sizeof err);
    if (rc != 0) {
        if (g != NULL || err[0] == '\0' || rc >= 0) abort();
        free(buf);
        return 0;
    }
    (void)rlai_gguf_version(g);
    (void)rlai_gguf_alignment(g);
    (void)rlai_gguf_file_size(g);
    for (uint64_t i = 0; i < rlai_gguf_n_kv(g); i++) {
        rlai_gguf_str k = rlai_gguf_key_at(g, i);
        char *name = malloc(k.len + 1);
        if (!name) break;
        memcpy(name, k.ptr, k.len);
        name[k.len] = '\0';
        (void)rlai_gguf_vtype_at(g, i);
        int64_t idx = rlai_gguf_find_key(g, name);
        /* keys with embedded NULs are not findable by C string */
        if (strlen(name) == k.len && idx != (int64_t)i) abort();
        uint32_t u32; int32_t i32; uint64_t u64; float f; bool b; rlai_gguf_str s;
        (void)rlai_gguf_get_u32(g, name, &u32);
        (void)rlai_gguf_get_i32(g, name, &i32);
        (void)rlai_gguf_get_u64(g, name, &u64);
        (void)rlai_gguf_get_f32(g, name, &f);
        (void)rlai_gguf_get_bool(g, name, &b);
        if (rlai_gguf_get_str(g, name, &s) == 0 && s.len) sink ^= (uint8_t)s.ptr[s.len - 1];
        uint32_t et; uint64_t n; const void *d;
        if (rlai_gguf_get_array(g, name, &et, &n, &d) == 0 && n > 0) sink ^= *(const uint8_t *)d;
        rlai_gguf_str *arr = NULL;
        if (rlai_gguf_get_str_array(g, name, &arr, &n) == 0) {
            for (uint64_t j = 0; j < n; j++)
                if (arr[j].len) sink ^= (uint8_t)arr[j].ptr[arr[j].len - 1];
            free(arr);
        }
        free(name);
    }
    for (uint64_t i = 0; i < rlai_gguf_n_tensors(g); i++) {
        const rlai_gguf_tensor *t = rlai_gguf_tensor_at(g, i);
        const uint8_t *p = t->data;
        sink ^= p[0];
        sink ^= p[t->nbytes - 1];
        char name[80];
        if (t->name.len >= sizeof name) abort();
        memcpy(name, t->name.ptr, t->name.len);
        name[t->name.len] = '\0';
        const rlai_gguf_tensor *f = rlai_gguf_find_tensor(g, name);
        if (strlen(name) == t->name.len && f != t) abort();
    }
    (void)rlai_gguf_tensor_at(g, rlai_gguf_n_tensors(g));
    rlai_gguf_close(g);
    free(buf);
    return 0;
}
