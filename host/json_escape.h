/* json_escape.h - the body of a JSON string from raw bytes, escaped the way
 * cJSON prints strings, so text spliced into a pre-rendered JSON template
 * (the HTTP front's per-token stream chunks) reads exactly as if cJSON had
 * printed the whole object. */
#ifndef RLAI_HOST_JSON_ESCAPE_H
#define RLAI_HOST_JSON_ESCAPE_H

#include <stddef.h>

/* The most bytes rlai_json_escape writes for n input bytes. */
#define RLAI_JSON_ESCAPE_MAX(n) (6 * (n))

/* Writes s[0..n) as the inside of a JSON string (no quotes) to out, which
 * the caller provides with room for RLAI_JSON_ESCAPE_MAX(n) bytes (no NUL
 * is added); returns the number of bytes written. '"' and '\\' and the
 * control bytes \b \f \n \r \t get their two-byte escapes, every other
 * byte below 0x20 (NUL included) \u00xx with lower-case hex, all other
 * bytes (UTF-8 included) are copied: cJSON's print_string rules. Bytes are
 * not checked for UTF-8 (the fronts pass on what the engine or an upstream
 * produced, as cJSON would). */
size_t rlai_json_escape(const char *s, size_t n, char *out);

#endif
