/* pngenc.c - PNG encoding into memory with libpng (see pngenc.h). */
#include "pngenc.h"

#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <png.h>

#include <rlai/error.h>

typedef struct png_sink {
    uint8_t *buf;
    size_t len, cap;
    int nomem;
} png_sink;

static void sink_write(png_structp png, png_bytep data, png_size_t n)
{
    png_sink *s = png_get_io_ptr(png);
    if (n > s->cap - s->len) {
        size_t cap = s->cap ? s->cap : 65536;
        while (n > cap - s->len) {
            if (cap > SIZE_MAX / 2) {
                s->nomem = 1;
                png_error(png, "output too large");
            }
            cap *= 2;
        }
        uint8_t *b = realloc(s->buf, cap);
        if (!b) {
            s->nomem = 1;
            png_error(png, "out of memory");
        }
        s->buf = b;
        s->cap = cap;
    }
    memcpy(s->buf + s->len, data, n);
    s->len += n;
}

static void sink_flush(png_structp png)
{
    (void)png;
}

static void enc_error(png_structp png, png_const_charp msg)
{
    (void)msg;
    png_longjmp(png, 1);
}

static void enc_warning(png_structp png, png_const_charp msg)
{
    (void)png;
    (void)msg;
}

int rlai_screen_png_encode(const rlai_screen_image *img, int level, uint8_t **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    if (!img || !img->rgb || img->width < 1 || img->height < 1)
        return RLAI_ERR_INVALID_ARG;
    png_sink sink = { 0 };
    png_sink *volatile ps = &sink;
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, enc_error, enc_warning);
    if (!png)
        return RLAI_ERR_NOMEM;
    png_infop info = png_create_info_struct(png);
    if (!info) {
        png_destroy_write_struct(&png, NULL);
        return RLAI_ERR_NOMEM;
    }
    if (setjmp(png_jmpbuf(png))) {
        int rc = ps->nomem ? RLAI_ERR_NOMEM : RLAI_ERR_IO;
        free(ps->buf);
        png_destroy_write_struct(&png, &info);
        return rc;
    }
    png_set_write_fn(png, &sink, sink_write, sink_flush);
    png_set_IHDR(png, info, (png_uint_32)img->width, (png_uint_32)img->height, 8, PNG_COLOR_TYPE_RGB,
                 PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    if (level >= 0 && level <= 9)
        png_set_compression_level(png, level);
    png_write_info(png, info);
    size_t stride = (size_t)img->width * 3;
    for (int r = 0; r < img->height; r++)
        png_write_row(png, img->rgb + (size_t)r * stride);
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    *out = sink.buf;
    *len = sink.len;
    return 0;
}

int rlai_screen_write_new_file(const char *path, const uint8_t *data, size_t len, char *err, size_t errlen)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        int e = errno;
        snprintf(err, errlen, "cannot create \"%.512s\": %s", path, strerror(e));
        return e == EEXIST ? RLAI_ERR_EXISTS : RLAI_ERR_IO;
    }
    size_t off = 0;
    while (off < len) {
        ssize_t w = write(fd, data + off, len - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            int e = errno;
            close(fd);
            unlink(path);
            snprintf(err, errlen, "cannot write \"%.512s\": %s", path, strerror(e));
            return RLAI_ERR_IO;
        }
        off += (size_t)w;
    }
    if (close(fd) != 0) {
        int e = errno;
        unlink(path);
        snprintf(err, errlen, "cannot write \"%.512s\": %s", path, strerror(e));
        return RLAI_ERR_IO;
    }
    return 0;
}
