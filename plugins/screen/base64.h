/* base64.h - RFC 4648 base64 (standard alphabet, '=' padding), used to
 * carry image bytes in JSON params and results (the plugin ABI passes
 * params and results as JSON, so binary travels as base64 text on every
 * front: wire, HTTP and G-Assist). */
#ifndef RLAI_SCREEN_BASE64_H
#define RLAI_SCREEN_BASE64_H

#include <stddef.h>
#include <stdint.h>

/* Encodes len bytes into a malloc'd NUL-terminated string *out (the caller
 * frees). Returns 0 or RLAI_ERR_NOMEM / RLAI_ERR_TOO_LARGE. */
int rlai_screen_b64_encode(const uint8_t *data, size_t len, char **out);

/* Decodes text (ASCII whitespace is skipped; a "data:...;base64," prefix is
 * accepted) into a malloc'd buffer *out of *len bytes (the caller frees).
 * At most max_out bytes are produced (0 = no limit). Returns 0,
 * RLAI_ERR_FORMAT (a character outside the alphabet, bad padding or
 * length), RLAI_ERR_TOO_LARGE, RLAI_ERR_NOMEM. */
int rlai_screen_b64_decode(const char *text, size_t text_len, size_t max_out, uint8_t **out, size_t *len);

#endif
