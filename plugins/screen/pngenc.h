/* pngenc.h - an RGB image -> PNG bytes in memory (libpng), for
 * screen.capture. */
#ifndef RLAI_SCREEN_PNGENC_H
#define RLAI_SCREEN_PNGENC_H

#include <stddef.h>
#include <stdint.h>

#include "image.h"

/* Encodes img as an 8-bit RGB PNG (zlib level `level`, 0..9; -1 = libpng's
 * default) into a malloc'd buffer *out of *len bytes (the caller frees).
 * img is borrowed. Returns 0, RLAI_ERR_INVALID_ARG (empty image),
 * RLAI_ERR_NOMEM or RLAI_ERR_IO (libpng refused). */
int rlai_screen_png_encode(const rlai_screen_image *img, int level, uint8_t **out, size_t *len);

/* Writes bytes to a new file at path (refuses to replace an existing one:
 * O_EXCL, mode 0600). Returns 0, RLAI_ERR_EXISTS or RLAI_ERR_IO (message
 * in err). */
int rlai_screen_write_new_file(const char *path, const uint8_t *data, size_t len, char *err, size_t errlen);

#endif
