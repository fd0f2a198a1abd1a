/* screen_show.c - test tool: shows a PNG/JPEG in an X11 window with a given
 * title, pixel for pixel, until killed (tests/integration/test_screen.py,
 * bench/bench_screen.py).
 *
 *   screen-show IMAGE TITLE [X Y]
 *
 * The image is put into a pixmap that becomes the window's background, so
 * the X server repaints it by itself (no window manager under Xvfb). The
 * window is override-redirect at (X, Y) (default 0, 0). Prints "ready" on
 * stdout once the window is mapped and painted. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xcb/xcb.h>

#include "imgdecode.h"

int main(int argc, char **argv)
{
    if (argc != 3 && argc != 5) {
        fprintf(stderr, "usage: screen-show IMAGE TITLE [X Y]\n");
        return 2;
    }
    char err[512];
    uint8_t *bytes = NULL;
    size_t len = 0;
    rlai_screen_image img;
    if (rlai_screen_read_file(argv[1], NULL, &bytes, &len, err, sizeof err) ||
        rlai_screen_decode(bytes, len, NULL, &img, err, sizeof err)) {
        fprintf(stderr, "screen-show: %s\n", err);
        return 1;
    }
    free(bytes);
    int px = argc == 5 ? atoi(argv[3]) : 0, py = argc == 5 ? atoi(argv[4]) : 0;
    xcb_connection_t *c = xcb_connect(NULL, NULL);
    if (xcb_connection_has_error(c)) {
        fprintf(stderr, "screen-show: cannot connect to $DISPLAY\n");
        return 1;
    }
    xcb_screen_t *s = xcb_setup_roots_iterator(xcb_get_setup(c)).data;
    if (s->root_depth != 24 && s->root_depth != 32) {
        fprintf(stderr, "screen-show: depth %d unsupported\n", s->root_depth);
        return 1;
    }
    xcb_pixmap_t pm = xcb_generate_id(c);
    xcb_create_pixmap(c, s->root_depth, pm, s->root, (uint16_t)img.width, (uint16_t)img.height);
    xcb_gcontext_t gc = xcb_generate_id(c);
    xcb_create_gc(c, gc, pm, 0, NULL);
    /* 32-bit little-endian BGRX rows, in strips under the request limit */
    uint32_t maxreq = xcb_get_maximum_request_length(c) * 4;
    int strip = (int)((maxreq - 64) / ((uint32_t)img.width * 4));
    if (strip < 1)
        strip = 1;
    if (strip > img.height)
        strip = img.height;
    uint8_t *buf = malloc((size_t)img.width * (size_t)strip * 4);
    if (!buf)
        return 1;
    for (int y = 0; y < img.height; y += strip) {
        int rows = img.height - y < strip ? img.height - y : strip;
        for (int r = 0; r < rows; r++)
            for (int x = 0; x < img.width; x++) {
                const uint8_t *p = img.rgb + ((size_t)(y + r) * (size_t)img.width + (size_t)x) * 3;
                uint8_t *q = buf + ((size_t)r * (size_t)img.width + (size_t)x) * 4;
                q[0] = p[2];
                q[1] = p[1];
                q[2] = p[0];
                q[3] = 0xFF;
            }
        xcb_put_image(c, XCB_IMAGE_FORMAT_Z_PIXMAP, pm, gc, (uint16_t)img.width, (uint16_t)rows, 0, (int16_t)y, 0,
                      s->root_depth, (uint32_t)((size_t)img.width * (size_t)rows * 4), buf);
    }
    free(buf);
    xcb_window_t w = xcb_generate_id(c);
    uint32_t vals[] = { pm, 1, XCB_EVENT_MASK_EXPOSURE };
    xcb_create_window(c, XCB_COPY_FROM_PARENT, w, s->root, (int16_t)px, (int16_t)py, (uint16_t)img.width,
                      (uint16_t)img.height, 0, XCB_WINDOW_CLASS_INPUT_OUTPUT, s->root_visual,
                      XCB_CW_BACK_PIXMAP | XCB_CW_OVERRIDE_REDIRECT | XCB_CW_EVENT_MASK, vals);
    const char *title = argv[2];
    xcb_change_property(c, XCB_PROP_MODE_REPLACE, w, XCB_ATOM_WM_NAME, XCB_ATOM_STRING, 8, (uint32_t)strlen(title),
                        title);
    xcb_intern_atom_reply_t *a1 = xcb_intern_atom_reply(c, xcb_intern_atom(c, 0, 12, "_NET_WM_NAME"), NULL);
    xcb_intern_atom_reply_t *a2 = xcb_intern_atom_reply(c, xcb_intern_atom(c, 0, 11, "UTF8_STRING"), NULL);
    if (a1 && a2)
        xcb_change_property(c, XCB_PROP_MODE_REPLACE, w, a1->atom, a2->atom, 8, (uint32_t)strlen(title), title);
    free(a1);
    free(a2);
    xcb_map_window(c, w);
    xcb_clear_area(c, 0, w, 0, 0, 0, 0);
    /* a round trip, so the server has drawn everything before "ready" */
    free(xcb_get_input_focus_reply(c, xcb_get_input_focus(c), NULL));
    printf("ready\n");
    fflush(stdout);
    xcb_generic_event_t *ev;
    while ((ev = xcb_wait_for_event(c)) != NULL)
        free(ev);
    rlai_screen_image_free(&img);
    xcb_disconnect(c);
    return 0;
}
