/* capture.h - live capture of an X11 screen or window into memory, with
 * xcb and the MIT-SHM extension (plain GetImage when SHM is missing, e.g.
 * over a remote display). Windows (DXGI desktop duplication) is not
 * implemented yet.
 *
 * A window is found by its title (_NET_WM_NAME, else WM_NAME): an exact
 * match first, else the one window whose title contains the text
 * (case-insensitive). What is captured is the window's rectangle of the
 * screen as the player sees it (overlapping windows included), clipped to
 * the screen. Captures stay in memory. */
#ifndef RLAI_SCREEN_CAPTURE_H
#define RLAI_SCREEN_CAPTURE_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "image.h"

typedef struct rlai_screen_capture_info {
    unsigned window_id;         /* 0 for the root window */
    int x, y;                   /* position of the capture on the screen */
    char title[256];            /* the window's title ("" for the root) */
    int used_shm;               /* 1 when MIT-SHM carried the pixels */
} rlai_screen_capture_info;

typedef struct rlai_screen_capture_opts {
    const char *display;        /* NULL = $DISPLAY */
    const char *title;          /* NULL = the root window (the whole screen) */
    long long max_pixels;       /* a larger capture is refused; 0 = no limit */
    int no_shm;                 /* 1: plain GetImage even where MIT-SHM works */
} rlai_screen_capture_opts;

/* Captures the root window of opts->display, or with opts->title the
 * window with that title, into *out (the caller frees). info may be NULL.
 * Returns 0, or a negative error with a message in err:
 * RLAI_ERR_INVALID_ARG (no display named and $DISPLAY unset),
 * RLAI_ERR_IO (cannot connect; the X server failed a request),
 * RLAI_ERR_NOT_FOUND (no window with that title; the message lists some
 * titles), RLAI_ERR_EXISTS (several windows contain the text: the message
 * names them), RLAI_ERR_UNSUPPORTED (a pixel format other than 24/32-bit
 * TrueColor), RLAI_ERR_TOO_LARGE, RLAI_ERR_NOMEM. */
int rlai_screen_capture(const rlai_screen_capture_opts *opts, rlai_screen_image *out, rlai_screen_capture_info *info,
                        char *err, size_t errlen);

/* Describes what can be captured on `display`: {"display", "screen":
 * {"width","height","depth"}, "shm": bool, "windows": [{"id","title","x",
 * "y","width","height"}]} (viewable windows with a title). *out owned by
 * the caller (cJSON_Delete). Errors as rlai_screen_capture. */
int rlai_screen_sources(const char *display, cJSON **out, char *err, size_t errlen);

#endif
