/* imgdecode.h - PNG and JPEG bytes in memory -> an RGB image in memory,
 * with libpng and libjpeg(-turbo); the screen plugin's only decoder entry
 * (also the fuzz target's, tests/fuzz/fuzz_screen_decode.c).
 *
 * Limits are checked from the header, before any pixel memory is taken:
 * input bytes, width, height and width * height. Truncated or corrupt data
 * is refused (libjpeg's recoverable warnings, e.g. "premature end of data",
 * count as errors: a half-grey screenshot would only mislead the OCR). */
#ifndef RLAI_SCREEN_IMGDECODE_H
#define RLAI_SCREEN_IMGDECODE_H

#include <stddef.h>
#include <stdint.h>

#include "image.h"

typedef struct rlai_screen_limits {
    size_t max_bytes;           /* encoded input; 0 = RLAI_SCREEN_MAX_BYTES */
    int max_width, max_height;  /* 0 = RLAI_SCREEN_MAX_DIM */
    long long max_pixels;       /* 0 = RLAI_SCREEN_MAX_PIXELS */
} rlai_screen_limits;

#define RLAI_SCREEN_MAX_BYTES ((size_t)64 << 20)
#define RLAI_SCREEN_MAX_DIM 8192
#define RLAI_SCREEN_MAX_PIXELS (8192LL * 8192LL)

/* "png", "jpeg" or NULL from the first bytes. */
const char *rlai_screen_image_format(const uint8_t *buf, size_t len);

/* Decodes a PNG or JPEG (told apart by its signature) from buf[0..len)
 * into *out (RGB; alpha is dropped, grey and palette are expanded). buf is
 * borrowed; *out is the caller's (rlai_screen_image_free). lim may be NULL
 * (defaults). Returns 0, or a negative error with a message in err:
 * RLAI_ERR_FORMAT (not PNG/JPEG, corrupt, truncated, unsupported colour
 * space), RLAI_ERR_TOO_LARGE (over a limit), RLAI_ERR_NOMEM. */
int rlai_screen_decode(const uint8_t *buf, size_t len, const rlai_screen_limits *lim, rlai_screen_image *out,
                       char *err, size_t errlen);

/* Reads a whole file (at most lim->max_bytes) into a malloc'd buffer *buf
 * (the caller frees) and its size *len. Returns 0, RLAI_ERR_NOT_FOUND (no
 * such file), RLAI_ERR_IO (unreadable, not a regular file),
 * RLAI_ERR_TOO_LARGE, RLAI_ERR_NOMEM; message in err. */
int rlai_screen_read_file(const char *path, const rlai_screen_limits *lim, uint8_t **buf, size_t *len, char *err,
                          size_t errlen);

#endif
