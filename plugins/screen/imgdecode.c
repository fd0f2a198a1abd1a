/* imgdecode.c - PNG (libpng) and JPEG (libjpeg-turbo) decoding into memory
 * with limits (see imgdecode.h). */
#include "imgdecode.h"

#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jpeglib.h>
#include <png.h>

#include <rlai/error.h>

#define MAX_JPEG_SCANS 256      /* a progressive JPEG with more is refused (decode-time bomb) */

static void limits_of(const rlai_screen_limits *lim, rlai_screen_limits *o)
{
    rlai_screen_limits d = { 0 };
    if (lim)
        d = *lim;
    o->max_bytes = d.max_bytes ? d.max_bytes : RLAI_SCREEN_MAX_BYTES;
    o->max_width = d.max_width > 0 ? d.max_width : RLAI_SCREEN_MAX_DIM;
    o->max_height = d.max_height > 0 ? d.max_height : RLAI_SCREEN_MAX_DIM;
    o->max_pixels = d.max_pixels > 0 ? d.max_pixels : RLAI_SCREEN_MAX_PIXELS;
}

static int check_dims(const rlai_screen_limits *l, unsigned long w, unsigned long h, char *err, size_t errlen)
{
    if (w == 0 || h == 0) {
        snprintf(err, errlen, "image has no pixels (%lux%lu)", w, h);
        return RLAI_ERR_FORMAT;
    }
    if (w > (unsigned long)l->max_width || h > (unsigned long)l->max_height ||
        (long long)w * (long long)h > l->max_pixels) {
        snprintf(err, errlen, "image is %lux%lu; the limit is %dx%d and %lld pixels", w, h, l->max_width,
                 l->max_height, l->max_pixels);
        return RLAI_ERR_TOO_LARGE;
    }
    return 0;
}

const char *rlai_screen_image_format(const uint8_t *buf, size_t len)
{
    static const uint8_t png_sig[8] = { 0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n' };
    if (len >= 8 && memcmp(buf, png_sig, 8) == 0)
        return "png";
    if (len >= 3 && buf[0] == 0xFF && buf[1] == 0xD8 && buf[2] == 0xFF)
        return "jpeg";
    return NULL;
}

/* ---- PNG ------------------------------------------------------------------ */

typedef struct png_src {
    const uint8_t *buf;
    size_t len, pos;
    char *err;
    size_t errlen;
    int code;
} png_src;

static void png_read_mem(png_structp png, png_bytep out, png_size_t n)
{
    png_src *s = png_get_io_ptr(png);
    if (n > s->len - s->pos) {
        snprintf(s->err, s->errlen, "PNG data is truncated (%zu bytes)", s->len);
        s->code = RLAI_ERR_FORMAT;
        png_longjmp(png, 1);
    }
    memcpy(out, s->buf + s->pos, n);
    s->pos += n;
}

static void png_on_error(png_structp png, png_const_charp msg)
{
    png_src *s = png_get_error_ptr(png);
    if (!s->code) {
        snprintf(s->err, s->errlen, "corrupt PNG: %s", msg);
        s->code = RLAI_ERR_FORMAT;
    }
    png_longjmp(png, 1);
}

static void png_on_warning(png_structp png, png_const_charp msg)
{
    (void)png;
    (void)msg;
}

/* Whether every chunk's declared length fits in the data. libpng
 * allocates a chunk's buffer from its declared length before it reads the
 * chunk (fuzz_screen_decode: an sPLT chunk declaring 1.9 GB in a 150-byte
 * file, past png_set_chunk_malloc_max), and the whole file is in memory
 * here, so a chunk longer than what is left is corrupt. A tail too short
 * for a chunk header is left to libpng, which reads past nothing. */
static bool png_chunks_fit(const uint8_t *buf, size_t len)
{
    size_t pos = 8;
    while (len - pos >= 8) {
        uint32_t n = (uint32_t)buf[pos] << 24 | (uint32_t)buf[pos + 1] << 16 | (uint32_t)buf[pos + 2] << 8 |
                     (uint32_t)buf[pos + 3];
        if (n > 0x7fffffffu || (size_t)n + 4 > len - pos - 8)   /* the data and its CRC */
            return false;
        bool iend = !memcmp(buf + pos + 4, "IEND", 4);
        pos += 12 + (size_t)n;
        if (iend)
            break;
    }
    return true;
}

static int decode_png(const uint8_t *buf, size_t len, const rlai_screen_limits *l, rlai_screen_image *out,
                      char *err, size_t errlen)
{
    if (len < 8 || !png_chunks_fit(buf, len)) {
        snprintf(err, errlen, "PNG: a chunk runs past the end of the data (truncated or corrupt)");
        return RLAI_ERR_FORMAT;
    }
    png_src src = { .buf = buf, .len = len, .err = err, .errlen = errlen };
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &src, png_on_error, png_on_warning);
    if (!png) {
        snprintf(err, errlen, "out of memory");
        return RLAI_ERR_NOMEM;
    }
    png_infop info = png_create_info_struct(png);
    png_bytep *volatile rows = NULL;
    rlai_screen_image img = { 0 };
    rlai_screen_image *volatile pimg = &img;
    if (!info) {
        png_destroy_read_struct(&png, NULL, NULL);
        snprintf(err, errlen, "out of memory");
        return RLAI_ERR_NOMEM;
    }
    if (setjmp(png_jmpbuf(png))) {
        free(rows);
        rlai_screen_image_free(pimg);
        png_destroy_read_struct(&png, &info, NULL);
        return src.code ? src.code : RLAI_ERR_FORMAT;
    }
    png_set_read_fn(png, &src, png_read_mem);
    /* Dimensions are checked below (with a clear message); libpng's own
     * limits stay for ancillary chunks and decompressed chunk size. */
    png_set_user_limits(png, 0x7fffffffu, 0x7fffffffu);
    png_set_chunk_cache_max(png, 256);
    png_set_chunk_malloc_max(png, 8u << 20);
    png_read_info(png, info);
    png_uint_32 w = png_get_image_width(png, info), h = png_get_image_height(png, info);
    int rc = check_dims(l, w, h, err, errlen);
    if (rc) {
        src.code = rc;
        png_longjmp(png, 1);
    }
    int bit_depth = png_get_bit_depth(png, info), ctype = png_get_color_type(png, info);
    if (bit_depth == 16)
        png_set_strip_16(png);
    if (ctype == PNG_COLOR_TYPE_PALETTE)
        png_set_palette_to_rgb(png);
    if (ctype == PNG_COLOR_TYPE_GRAY && bit_depth < 8)
        png_set_expand_gray_1_2_4_to_8(png);
    if (ctype == PNG_COLOR_TYPE_GRAY || ctype == PNG_COLOR_TYPE_GRAY_ALPHA)
        png_set_gray_to_rgb(png);
    png_set_strip_alpha(png);
    png_set_interlace_handling(png);
    png_read_update_info(png, info);
    if (png_get_rowbytes(png, info) != (png_size_t)w * 3) {
        snprintf(err, errlen, "unsupported PNG pixel layout");
        src.code = RLAI_ERR_FORMAT;
        png_longjmp(png, 1);
    }
    if ((rc = rlai_screen_image_alloc(&img, (int)w, (int)h)) != 0 ||
        !(rows = malloc((size_t)h * sizeof *rows))) {
        snprintf(err, errlen, "out of memory for a %ux%u image", (unsigned)w, (unsigned)h);
        src.code = RLAI_ERR_NOMEM;
        png_longjmp(png, 1);
    }
    for (png_uint_32 r = 0; r < h; r++)
        rows[r] = img.rgb + (size_t)r * (size_t)w * 3;
    png_read_image(png, rows);
    png_read_end(png, NULL);
    free(rows);
    png_destroy_read_struct(&png, &info, NULL);
    *out = img;
    return 0;
}

/* ---- JPEG ----------------------------------------------------------------- */

typedef struct jpeg_err {
    struct jpeg_error_mgr mgr;
    jmp_buf jmp;
    char *err;
    size_t errlen;
    int code;
} jpeg_err;

static void jpeg_on_error(j_common_ptr cinfo)
{
    jpeg_err *e = (jpeg_err *)cinfo->err;
    if (!e->code) {
        char msg[JMSG_LENGTH_MAX];
        e->mgr.format_message(cinfo, msg);
        snprintf(e->err, e->errlen, "corrupt JPEG: %s", msg);
        e->code = RLAI_ERR_FORMAT;
    }
    longjmp(e->jmp, 1);
}

/* Warnings (level -1) are corrupt or truncated data that libjpeg would
 * paper over: refuse them. Trace messages (level >= 0) are ignored. */
static void jpeg_on_message(j_common_ptr cinfo, int level)
{
    if (level < 0)
        jpeg_on_error(cinfo);
}

static void jpeg_on_progress(j_common_ptr cinfo)
{
    j_decompress_ptr d = (j_decompress_ptr)cinfo;
    if (d->input_scan_number > MAX_JPEG_SCANS) {
        jpeg_err *e = (jpeg_err *)cinfo->err;
        snprintf(e->err, e->errlen, "JPEG has more than %d scans", MAX_JPEG_SCANS);
        e->code = RLAI_ERR_TOO_LARGE;
        longjmp(e->jmp, 1);
    }
}

static int decode_jpeg(const uint8_t *buf, size_t len, const rlai_screen_limits *l, rlai_screen_image *out,
                       char *err, size_t errlen)
{
    struct jpeg_decompress_struct cinfo;
    struct jpeg_progress_mgr prog = { .progress_monitor = jpeg_on_progress };
    jpeg_err je;
    memset(&je, 0, sizeof je);
    je.err = err;
    je.errlen = errlen;
    rlai_screen_image img = { 0 };
    rlai_screen_image *volatile pimg = &img;
    cinfo.err = jpeg_std_error(&je.mgr);
    je.mgr.error_exit = jpeg_on_error;
    je.mgr.emit_message = jpeg_on_message;
    if (setjmp(je.jmp)) {
        rlai_screen_image_free(pimg);
        jpeg_destroy_decompress(&cinfo);
        return je.code ? je.code : RLAI_ERR_FORMAT;
    }
    jpeg_create_decompress(&cinfo);
    cinfo.progress = &prog;
    cinfo.mem->max_memory_to_use = 512L << 20;
    jpeg_mem_src(&cinfo, buf, (unsigned long)len);
    jpeg_read_header(&cinfo, TRUE);
    int rc = check_dims(l, cinfo.image_width, cinfo.image_height, err, errlen);
    if (rc) {
        je.code = rc;
        longjmp(je.jmp, 1);
    }
    if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
        snprintf(err, errlen, "CMYK JPEGs are not supported (screenshots are RGB)");
        je.code = RLAI_ERR_FORMAT;
        longjmp(je.jmp, 1);
    }
    cinfo.out_color_space = JCS_RGB;
    jpeg_start_decompress(&cinfo);
    if (cinfo.output_components != 3 || (rc = rlai_screen_image_alloc(&img, (int)cinfo.output_width,
                                                                       (int)cinfo.output_height)) != 0) {
        snprintf(err, errlen, cinfo.output_components != 3 ? "unsupported JPEG colour layout" : "out of memory");
        je.code = cinfo.output_components != 3 ? RLAI_ERR_FORMAT : RLAI_ERR_NOMEM;
        longjmp(je.jmp, 1);
    }
    while (cinfo.output_scanline < cinfo.output_height) {
        JSAMPROW row = img.rgb + (size_t)cinfo.output_scanline * (size_t)img.width * 3;
        jpeg_read_scanlines(&cinfo, &row, 1);
    }
    jpeg_finish_decompress(&cinfo);
    jpeg_destroy_decompress(&cinfo);
    *out = img;
    return 0;
}

int rlai_screen_decode(const uint8_t *buf, size_t len, const rlai_screen_limits *lim, rlai_screen_image *out,
                       char *err, size_t errlen)
{
    rlai_screen_limits l;
    limits_of(lim, &l);
    out->width = out->height = 0;
    out->rgb = NULL;
    if (!buf || len == 0) {
        snprintf(err, errlen, "image is empty (0 bytes)");
        return RLAI_ERR_FORMAT;
    }
    if (len > l.max_bytes) {
        snprintf(err, errlen, "image is %zu bytes; the limit is %zu", len, l.max_bytes);
        return RLAI_ERR_TOO_LARGE;
    }
    const char *fmt = rlai_screen_image_format(buf, len);
    if (!fmt) {
        snprintf(err, errlen, "not a PNG or JPEG image (unknown signature)");
        return RLAI_ERR_FORMAT;
    }
    return fmt[0] == 'p' ? decode_png(buf, len, &l, out, err, errlen) : decode_jpeg(buf, len, &l, out, err, errlen);
}

int rlai_screen_read_file(const char *path, const rlai_screen_limits *lim, uint8_t **buf, size_t *len, char *err,
                          size_t errlen)
{
    rlai_screen_limits l;
    limits_of(lim, &l);
    *buf = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        int e = errno;
        snprintf(err, errlen, "cannot open image file \"%.512s\": %s", path, strerror(e));
        return e == ENOENT || e == ENOTDIR ? RLAI_ERR_NOT_FOUND : RLAI_ERR_IO;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        snprintf(err, errlen, "image file \"%.512s\" is not a regular file", path);
        return RLAI_ERR_IO;
    }
    if ((unsigned long long)st.st_size > l.max_bytes) {
        close(fd);
        snprintf(err, errlen, "image file \"%.512s\" is %lld bytes; the limit is %zu", path, (long long)st.st_size,
                 l.max_bytes);
        return RLAI_ERR_TOO_LARGE;
    }
    size_t cap = (size_t)st.st_size + 1, n = 0;
    uint8_t *b = malloc(cap);
    if (!b) {
        close(fd);
        snprintf(err, errlen, "out of memory");
        return RLAI_ERR_NOMEM;
    }
    for (;;) {
        ssize_t r = read(fd, b + n, cap - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            int e = errno;
            free(b);
            close(fd);
            snprintf(err, errlen, "cannot read image file \"%.512s\": %s", path, strerror(e));
            return RLAI_ERR_IO;
        }
        if (r == 0)
            break;
        n += (size_t)r;
        if (n == cap) {     /* grew since fstat */
            free(b);
            close(fd);
            snprintf(err, errlen, "image file \"%.512s\" changed while being read", path);
            return RLAI_ERR_IO;
        }
    }
    close(fd);
    *buf = b;
    *len = n;
    return 0;
}
