/* capture.c - X11 capture with xcb + MIT-SHM (see capture.h). */
#include "capture.h"

#include <ctype.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ipc.h>
#include <sys/shm.h>

#include <xcb/shm.h>
#include <xcb/xcb.h>

#include <rlai/error.h>

#define MAX_WINDOWS 4096        /* windows looked at when searching by title */
#define MAX_DEPTH 6             /* levels of the window tree searched */
#define STRIP_BYTES (4u << 20)  /* GetImage (no SHM) in strips of about this size */

typedef struct xwin {
    xcb_window_t id;
    int x, y, w, h;
    char title[256];
} xwin;

typedef struct xctx {
    xcb_connection_t *c;
    xcb_screen_t *screen;
    const char *name;           /* display name for messages */
    xcb_atom_t net_wm_name, utf8_string;
    xwin *wins;
    int n_wins;
} xctx;

static void xctx_close(xctx *x)
{
    free(x->wins);
    if (x->c)
        xcb_disconnect(x->c);
    memset(x, 0, sizeof *x);
}

static xcb_atom_t intern(xcb_connection_t *c, const char *name)
{
    xcb_intern_atom_reply_t *r = xcb_intern_atom_reply(c, xcb_intern_atom(c, 1, (uint16_t)strlen(name), name), NULL);
    xcb_atom_t a = r ? r->atom : XCB_ATOM_NONE;
    free(r);
    return a;
}

static int xctx_open(xctx *x, const char *display, char *err, size_t errlen)
{
    memset(x, 0, sizeof *x);
    const char *env = getenv("DISPLAY");
    if ((!display || !display[0]) && (!env || !env[0])) {
        snprintf(err, errlen, "no X display: DISPLAY is not set in the engine's environment (pass \"display\", "
                              "or an image \"file\" or \"image\")");
        return RLAI_ERR_INVALID_ARG;
    }
    x->name = display && display[0] ? display : env;
    int screen_num = 0;
    x->c = xcb_connect(x->name, &screen_num);
    if (!x->c || xcb_connection_has_error(x->c)) {
        snprintf(err, errlen, "cannot connect to X display \"%.128s\" (is an X server running there?)", x->name);
        xctx_close(x);
        return RLAI_ERR_IO;
    }
    xcb_screen_iterator_t it = xcb_setup_roots_iterator(xcb_get_setup(x->c));
    for (int i = 0; it.rem && i < screen_num; i++)
        xcb_screen_next(&it);
    if (!it.rem) {
        snprintf(err, errlen, "X display \"%.128s\" has no screen %d", x->name, screen_num);
        xctx_close(x);
        return RLAI_ERR_IO;
    }
    x->screen = it.data;
    x->net_wm_name = intern(x->c, "_NET_WM_NAME");
    x->utf8_string = intern(x->c, "UTF8_STRING");
    return 0;
}

/* Replaces every byte that is not part of a well-formed UTF-8 sequence
 * with '?' (WM_NAME is Latin-1; results must be UTF-8). */
static void utf8_sanitize(char *s)
{
    unsigned char *p = (unsigned char *)s;
    while (*p) {
        int n = *p < 0x80 ? 1 : (*p & 0xE0) == 0xC0 ? 2 : (*p & 0xF0) == 0xE0 ? 3 : (*p & 0xF8) == 0xF0 ? 4 : 0;
        bool ok = n > 0 && !(n == 2 && *p < 0xC2) && !(n == 4 && *p > 0xF4);
        for (int i = 1; ok && i < n; i++)
            ok = (p[i] & 0xC0) == 0x80;
        if (ok && n == 3) {
            unsigned cp = (unsigned)(p[0] & 0x0F) << 12 | (unsigned)(p[1] & 0x3F) << 6;
            ok = cp >= 0x800 && !(cp >= 0xD800 && cp <= 0xDFFF);
        }
        if (ok && n == 4) {
            unsigned cp = (unsigned)(p[0] & 0x07) << 18 | (unsigned)(p[1] & 0x3F) << 12;
            ok = cp >= 0x10000 && cp <= 0x10FFFF;
        }
        if (!ok) {
            *p++ = '?';
            continue;
        }
        p += n;
    }
}

/* The title of w into buf ("" when none): _NET_WM_NAME, else WM_NAME.
 * Control characters become spaces. */
static void window_title(xctx *x, xcb_window_t w, char *buf, size_t len)
{
    buf[0] = '\0';
    for (int pass = 0; pass < 2 && !buf[0]; pass++) {
        xcb_atom_t prop = pass == 0 ? x->net_wm_name : XCB_ATOM_WM_NAME;
        xcb_atom_t type = pass == 0 ? x->utf8_string : XCB_ATOM_ANY;
        if (prop == XCB_ATOM_NONE || (pass == 0 && type == XCB_ATOM_NONE))
            continue;
        xcb_get_property_reply_t *r =
            xcb_get_property_reply(x->c, xcb_get_property(x->c, 0, w, prop, type, 0, (uint32_t)(len / 4)), NULL);
        if (r && r->format == 8) {
            int n = xcb_get_property_value_length(r);
            if (n > (int)len - 1)
                n = (int)len - 1;
            memcpy(buf, xcb_get_property_value(r), (size_t)(n > 0 ? n : 0));
            buf[n > 0 ? n : 0] = '\0';
            for (char *p = buf; *p; p++)
                if ((unsigned char)*p < 0x20)
                    *p = ' ';
            utf8_sanitize(buf);
        }
        free(r);
    }
}

/* Collects viewable windows with a title below `parent`, depth first. */
static void collect(xctx *x, xcb_window_t parent, int depth)
{
    if (depth > MAX_DEPTH || x->n_wins >= MAX_WINDOWS)
        return;
    xcb_query_tree_reply_t *t = xcb_query_tree_reply(x->c, xcb_query_tree(x->c, parent), NULL);
    if (!t)
        return;
    xcb_window_t *kids = xcb_query_tree_children(t);
    int n = xcb_query_tree_children_length(t);
    for (int i = 0; i < n && x->n_wins < MAX_WINDOWS; i++) {
        xcb_get_window_attributes_reply_t *a =
            xcb_get_window_attributes_reply(x->c, xcb_get_window_attributes(x->c, kids[i]), NULL);
        bool viewable = a && a->map_state == XCB_MAP_STATE_VIEWABLE && a->_class == XCB_WINDOW_CLASS_INPUT_OUTPUT;
        free(a);
        if (!viewable)
            continue;
        xwin w = { .id = kids[i] };
        window_title(x, kids[i], w.title, sizeof w.title);
        if (w.title[0]) {
            xcb_get_geometry_reply_t *g = xcb_get_geometry_reply(x->c, xcb_get_geometry(x->c, kids[i]), NULL);
            xcb_translate_coordinates_reply_t *tr = xcb_translate_coordinates_reply(
                x->c, xcb_translate_coordinates(x->c, kids[i], x->screen->root, 0, 0), NULL);
            if (g && tr) {
                w.x = tr->dst_x;
                w.y = tr->dst_y;
                w.w = g->width;
                w.h = g->height;
                xwin *nw = realloc(x->wins, (size_t)(x->n_wins + 1) * sizeof *nw);
                if (nw) {
                    x->wins = nw;
                    x->wins[x->n_wins++] = w;
                }
            }
            free(g);
            free(tr);
        }
        collect(x, kids[i], depth + 1);
    }
    free(t);
}

static bool contains_ci(const char *hay, const char *needle)
{
    size_t n = strlen(needle);
    for (; *hay; hay++) {
        size_t i = 0;
        while (i < n && hay[i] && tolower((unsigned char)hay[i]) == tolower((unsigned char)needle[i]))
            i++;
        if (i == n)
            return true;
    }
    return n == 0;
}

static void list_titles(const xctx *x, char *buf, size_t len)
{
    size_t o = 0;
    buf[0] = '\0';
    for (int i = 0; i < x->n_wins && o + 4 < len; i++) {
        int k = snprintf(buf + o, len - o, "%s\"%.60s\"", i ? ", " : "", x->wins[i].title);
        if (k < 0 || (size_t)k >= len - o)
            break;
        o += (size_t)k;
    }
    if (!x->n_wins)
        snprintf(buf, len, "(none)");
}

static int find_window(xctx *x, const char *title, const xwin **found, char *err, size_t errlen)
{
    collect(x, x->screen->root, 0);
    const xwin *hit = NULL;
    for (int i = 0; i < x->n_wins && !hit; i++)
        if (strcmp(x->wins[i].title, title) == 0)
            hit = &x->wins[i];
    int n_sub = 0;
    if (!hit)
        for (int i = 0; i < x->n_wins; i++)
            if (contains_ci(x->wins[i].title, title)) {
                if (!hit)
                    hit = &x->wins[i];
                n_sub++;
            }
    char names[768];
    if (!hit) {
        list_titles(x, names, sizeof names);
        snprintf(err, errlen, "no window titled \"%.128s\" on display \"%.64s\"; windows: %s", title, x->name, names);
        return RLAI_ERR_NOT_FOUND;
    }
    if (n_sub > 1) {
        list_titles(x, names, sizeof names);
        snprintf(err, errlen, "%d windows have \"%.128s\" in their title; give the exact title: %s", n_sub, title,
                 names);
        return RLAI_ERR_EXISTS;
    }
    *found = hit;
    return 0;
}

/* Pixel layout of the root visual: 32 bits per pixel, TrueColor masks. */
typedef struct pixfmt {
    int bpp;
    int msb_first;
    uint32_t rmask, gmask, bmask;
    int rshift, gshift, bshift;
} pixfmt;

static int mask_shift(uint32_t m)
{
    int s = 0;
    while (m && !(m & 1)) {
        m >>= 1;
        s++;
    }
    return s;
}

static int pixel_format(xctx *x, pixfmt *pf, char *err, size_t errlen)
{
    const xcb_setup_t *setup = xcb_get_setup(x->c);
    pf->bpp = 0;
    for (xcb_format_iterator_t f = xcb_setup_pixmap_formats_iterator(setup); f.rem; xcb_format_next(&f))
        if (f.data->depth == x->screen->root_depth)
            pf->bpp = f.data->bits_per_pixel;
    xcb_visualtype_t *vis = NULL;
    for (xcb_depth_iterator_t d = xcb_screen_allowed_depths_iterator(x->screen); d.rem && !vis; xcb_depth_next(&d))
        for (xcb_visualtype_iterator_t v = xcb_depth_visuals_iterator(d.data); v.rem; xcb_visualtype_next(&v))
            if (v.data->visual_id == x->screen->root_visual) {
                vis = v.data;
                break;
            }
    if (pf->bpp != 32 || !vis || vis->_class != XCB_VISUAL_CLASS_TRUE_COLOR || x->screen->root_depth < 24) {
        snprintf(err, errlen, "X display \"%.64s\": unsupported pixel format (depth %d, %d bits per pixel); "
                              "24/32-bit TrueColor is supported",
                 x->name, x->screen->root_depth, pf->bpp);
        return RLAI_ERR_UNSUPPORTED;
    }
    pf->msb_first = setup->image_byte_order == XCB_IMAGE_ORDER_MSB_FIRST;
    pf->rmask = vis->red_mask;
    pf->gmask = vis->green_mask;
    pf->bmask = vis->blue_mask;
    pf->rshift = mask_shift(pf->rmask);
    pf->gshift = mask_shift(pf->gmask);
    pf->bshift = mask_shift(pf->bmask);
    return 0;
}

/* Converts rows of 32-bit ZPixmap pixels to RGB (masks of 8 bits). */
static void convert_rows(const pixfmt *pf, const uint8_t *src, int w, int rows, uint8_t *dst)
{
    size_t n = (size_t)w * (size_t)rows;
    for (size_t i = 0; i < n; i++, src += 4, dst += 3) {
        uint32_t p = pf->msb_first ? (uint32_t)src[0] << 24 | (uint32_t)src[1] << 16 | (uint32_t)src[2] << 8 | src[3]
                                   : (uint32_t)src[3] << 24 | (uint32_t)src[2] << 16 | (uint32_t)src[1] << 8 | src[0];
        dst[0] = (uint8_t)((p & pf->rmask) >> pf->rshift);
        dst[1] = (uint8_t)((p & pf->gmask) >> pf->gshift);
        dst[2] = (uint8_t)((p & pf->bmask) >> pf->bshift);
    }
}

static bool shm_available(xctx *x)
{
    xcb_shm_query_version_reply_t *r = xcb_shm_query_version_reply(x->c, xcb_shm_query_version(x->c), NULL);
    bool ok = r != NULL;
    free(r);
    return ok;
}

/* SHM path: one request for the whole rectangle. 1 on success, 0 to fall
 * back to GetImage (SHM refused, e.g. a remote server). */
static int grab_shm(xctx *x, const pixfmt *pf, int gx, int gy, int w, int h, uint8_t *dst)
{
    size_t bytes = (size_t)w * (size_t)h * 4;
    int id = shmget(IPC_PRIVATE, bytes, IPC_CREAT | 0600);
    if (id < 0)
        return 0;
    void *mem = shmat(id, NULL, SHM_RDONLY);
    if (mem == (void *)-1) {
        shmctl(id, IPC_RMID, NULL);
        return 0;
    }
    xcb_shm_seg_t seg = xcb_generate_id(x->c);
    xcb_generic_error_t *e = xcb_request_check(x->c, xcb_shm_attach_checked(x->c, seg, (uint32_t)id, 0));
    int ok = 0;
    if (!e) {
        xcb_shm_get_image_reply_t *r = xcb_shm_get_image_reply(
            x->c,
            xcb_shm_get_image(x->c, x->screen->root, (int16_t)gx, (int16_t)gy, (uint16_t)w, (uint16_t)h, ~0u,
                              XCB_IMAGE_FORMAT_Z_PIXMAP, seg, 0),
            &e);
        if (r && !e && r->size >= bytes) {
            convert_rows(pf, mem, w, h, dst);
            ok = 1;
        }
        free(r);
        xcb_shm_detach(x->c, seg);
    }
    free(e);
    shmdt(mem);
    shmctl(id, IPC_RMID, NULL);
    return ok;
}

static int grab_plain(xctx *x, const pixfmt *pf, int gx, int gy, int w, int h, uint8_t *dst, char *err,
                      size_t errlen)
{
    int strip = (int)(STRIP_BYTES / ((size_t)w * 4));
    if (strip < 1)
        strip = 1;
    for (int y = 0; y < h; y += strip) {
        int rows = h - y < strip ? h - y : strip;
        xcb_generic_error_t *e = NULL;
        xcb_get_image_reply_t *r = xcb_get_image_reply(
            x->c,
            xcb_get_image(x->c, XCB_IMAGE_FORMAT_Z_PIXMAP, x->screen->root, (int16_t)gx, (int16_t)(gy + y),
                          (uint16_t)w, (uint16_t)rows, ~0u),
            &e);
        if (!r || e || (size_t)xcb_get_image_data_length(r) < (size_t)w * (size_t)rows * 4) {
            snprintf(err, errlen, "X display \"%.64s\": GetImage failed (error %d)", x->name, e ? e->error_code : 0);
            free(r);
            free(e);
            return RLAI_ERR_IO;
        }
        convert_rows(pf, xcb_get_image_data(r), w, rows, dst + (size_t)y * (size_t)w * 3);
        free(r);
    }
    return 0;
}

int rlai_screen_capture(const rlai_screen_capture_opts *opts, rlai_screen_image *out, rlai_screen_capture_info *info,
                        char *err, size_t errlen)
{
    out->width = out->height = 0;
    out->rgb = NULL;
    xctx x;
    int rc = xctx_open(&x, opts->display, err, errlen);
    if (rc)
        return rc;
    pixfmt pf;
    if ((rc = pixel_format(&x, &pf, err, errlen)) != 0) {
        xctx_close(&x);
        return rc;
    }
    int gx = 0, gy = 0, w = x.screen->width_in_pixels, h = x.screen->height_in_pixels;
    rlai_screen_capture_info inf = { 0 };
    if (opts->title) {
        const xwin *win = NULL;
        if ((rc = find_window(&x, opts->title, &win, err, errlen)) != 0) {
            xctx_close(&x);
            return rc;
        }
        inf.window_id = win->id;
        snprintf(inf.title, sizeof inf.title, "%s", win->title);
        /* the window's rectangle clipped to the screen */
        int x0 = win->x < 0 ? 0 : win->x, y0 = win->y < 0 ? 0 : win->y;
        int x1 = win->x + win->w > w ? w : win->x + win->w, y1 = win->y + win->h > h ? h : win->y + win->h;
        if (x1 <= x0 || y1 <= y0) {
            snprintf(err, errlen, "window \"%.128s\" is off the screen", win->title);
            xctx_close(&x);
            return RLAI_ERR_INVALID_ARG;
        }
        gx = x0;
        gy = y0;
        w = x1 - x0;
        h = y1 - y0;
    }
    inf.x = gx;
    inf.y = gy;
    if (opts->max_pixels > 0 && (long long)w * h > opts->max_pixels) {
        snprintf(err, errlen, "capture is %dx%d; the limit is %lld pixels", w, h, opts->max_pixels);
        xctx_close(&x);
        return RLAI_ERR_TOO_LARGE;
    }
    if ((rc = rlai_screen_image_alloc(out, w, h)) != 0) {
        snprintf(err, errlen, "out of memory for a %dx%d capture", w, h);
        xctx_close(&x);
        return rc;
    }
    if (!opts->no_shm && shm_available(&x))
        inf.used_shm = grab_shm(&x, &pf, gx, gy, w, h, out->rgb);
    if (!inf.used_shm && (rc = grab_plain(&x, &pf, gx, gy, w, h, out->rgb, err, errlen)) != 0) {
        rlai_screen_image_free(out);
        xctx_close(&x);
        return rc;
    }
    xctx_close(&x);
    if (info)
        *info = inf;
    return 0;
}

int rlai_screen_sources(const char *display, cJSON **out, char *err, size_t errlen)
{
    *out = NULL;
    xctx x;
    int rc = xctx_open(&x, display, err, errlen);
    if (rc)
        return rc;
    collect(&x, x.screen->root, 0);
    cJSON *r = cJSON_CreateObject();
    cJSON *scr = r ? cJSON_AddObjectToObject(r, "screen") : NULL;
    cJSON *wins = r ? cJSON_AddArrayToObject(r, "windows") : NULL;
    bool ok = scr && wins && cJSON_AddStringToObject(r, "display", x.name) &&
              cJSON_AddNumberToObject(scr, "width", x.screen->width_in_pixels) &&
              cJSON_AddNumberToObject(scr, "height", x.screen->height_in_pixels) &&
              cJSON_AddNumberToObject(scr, "depth", x.screen->root_depth) &&
              cJSON_AddBoolToObject(r, "shm", shm_available(&x));
    for (int i = 0; ok && i < x.n_wins; i++) {
        cJSON *o = cJSON_CreateObject();
        ok = o && cJSON_AddItemToArray(wins, o);
        if (!ok) {
            cJSON_Delete(o);
            break;
        }
        const xwin *w = &x.wins[i];
        ok = cJSON_AddNumberToObject(o, "id", w->id) && cJSON_AddStringToObject(o, "title", w->title) &&
             cJSON_AddNumberToObject(o, "x", w->x) && cJSON_AddNumberToObject(o, "y", w->y) &&
             cJSON_AddNumberToObject(o, "width", w->w) && cJSON_AddNumberToObject(o, "height", w->h);
    }
    xctx_close(&x);
    if (!ok) {
        cJSON_Delete(r);
        snprintf(err, errlen, "out of memory");
        return RLAI_ERR_NOMEM;
    }
    *out = r;
    return 0;
}
