/* hash.h - the engine's one byte-string hash (FNV-1a, 64 bit), for the
 * open-addressing tables of the GGUF reader and the tokenizer. Not for
 * anything an attacker must not collide: the prefix cache's block keys
 * are verified against the stored tokens (kv_cache.c). Private to engine/. */
#ifndef RLAI_ENGINE_HASH_H
#define RLAI_ENGINE_HASH_H

#include <stddef.h>
#include <stdint.h>

static inline uint64_t rlai_hash_bytes(const void *data, size_t n)
{
    const unsigned char *p = data;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

#endif
