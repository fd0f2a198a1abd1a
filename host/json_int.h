/* json_int.h - exact integers from JSON text. cJSON keeps every number as
 * a double, which rounds integers beyond 2^53 (a 64-bit "seed" would
 * change); these read a top-level member's integer from the text itself. */
#ifndef RLAI_HOST_JSON_INT_H
#define RLAI_HOST_JSON_INT_H

#include <stddef.h>
#include <stdint.h>

/* Finds the first member `key` of the top-level object in json[0..len)
 * (which must be valid JSON, e.g. already parsed by cJSON) and reads its
 * value as an integer in [INT64_MIN, UINT64_MAX]: *out gets the value as
 * uint64 (negative values in two's complement), *negative whether it had a
 * minus sign. Returns 1 when found and read, 0 when the key is absent or
 * null, -1 when the value is not an integer in that range (a fraction, an
 * exponent, a string, out of range). */
int rlai_json_find_int(const char *json, size_t len, const char *key, uint64_t *out, int *negative);

/* The decimal text of the same value (for passing it on exactly): writes
 * at most cap bytes with NUL into buf; returns as rlai_json_find_int. */
int rlai_json_find_int_text(const char *json, size_t len, const char *key, char *buf, size_t cap);

#endif
