/* image.h - an 8-bit RGB image held in memory (the screen plugin's one
 * pixel format: captures, decoded files and crops all end up as this).
 *
 * Pixels are row-major, 3 bytes per pixel (R, G, B), rows packed
 * (stride = 3 * width). Nothing here touches the disk. */
#ifndef RLAI_SCREEN_IMAGE_H
#define RLAI_SCREEN_IMAGE_H

#include <stddef.h>
#include <stdint.h>

typedef struct rlai_screen_image {
    int width, height;
    uint8_t *rgb;               /* 3 * width * height bytes, owned (malloc) */
} rlai_screen_image;

/* Allocates an uninitialised w x h image into *img (w, h >= 1, w * h * 3
 * must fit in size_t). Returns 0, RLAI_ERR_INVALID_ARG or RLAI_ERR_NOMEM.
 * The caller frees with rlai_screen_image_free. */
int rlai_screen_image_alloc(rlai_screen_image *img, int w, int h);

/* Frees the pixels and zeroes *img; NULL or an empty image is fine. */
void rlai_screen_image_free(rlai_screen_image *img);

/* Copies the rectangle (x, y, w, h) of src into a new image *out (the
 * caller frees it). The rectangle is clipped to src; an empty intersection
 * is RLAI_ERR_INVALID_ARG. Returns 0 or a negative rlai_error. */
int rlai_screen_image_crop(const rlai_screen_image *src, int x, int y, int w, int h, rlai_screen_image *out);

#endif
