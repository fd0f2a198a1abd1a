/* image.c - the in-memory RGB image (see image.h). */
#include "image.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <rlai/error.h>

int rlai_screen_image_alloc(rlai_screen_image *img, int w, int h)
{
    img->width = img->height = 0;
    img->rgb = NULL;
    if (w < 1 || h < 1 || (size_t)w > SIZE_MAX / 3 / (size_t)h)
        return RLAI_ERR_INVALID_ARG;
    img->rgb = malloc((size_t)w * (size_t)h * 3);
    if (!img->rgb)
        return RLAI_ERR_NOMEM;
    img->width = w;
    img->height = h;
    return 0;
}

void rlai_screen_image_free(rlai_screen_image *img)
{
    if (!img)
        return;
    free(img->rgb);
    img->rgb = NULL;
    img->width = img->height = 0;
}

int rlai_screen_image_crop(const rlai_screen_image *src, int x, int y, int w, int h, rlai_screen_image *out)
{
    out->width = out->height = 0;
    out->rgb = NULL;
    long x0 = x < 0 ? 0 : x, y0 = y < 0 ? 0 : y;
    long x1 = (long)x + w, y1 = (long)y + h;
    if (x1 > src->width)
        x1 = src->width;
    if (y1 > src->height)
        y1 = src->height;
    if (w < 1 || h < 1 || x1 <= x0 || y1 <= y0)
        return RLAI_ERR_INVALID_ARG;
    int rc = rlai_screen_image_alloc(out, (int)(x1 - x0), (int)(y1 - y0));
    if (rc)
        return rc;
    size_t row = (size_t)out->width * 3;
    for (int r = 0; r < out->height; r++)
        memcpy(out->rgb + (size_t)r * row, src->rgb + ((size_t)(y0 + r) * (size_t)src->width + (size_t)x0) * 3, row);
    return 0;
}
