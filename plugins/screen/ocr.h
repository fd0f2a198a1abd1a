/* ocr.h - text on an image, with positions, through Tesseract's C API.
 *
 * An rlai_screen_ocr is a small pool of initialised Tesseract instances
 * (one is not thread-safe; initialising one costs tens of milliseconds):
 * each run takes an idle instance or makes one, and gives it back after.
 * OpenMP threads inside Tesseract are limited by the caller setting
 * OMP_THREAD_LIMIT (the plugin sets it to 1 at load, before the first
 * instance exists): the engine's threads already use the cores. */
#ifndef RLAI_SCREEN_OCR_H
#define RLAI_SCREEN_OCR_H

#include <stddef.h>

#include "image.h"

typedef struct rlai_screen_box {
    int x, y, w, h;             /* pixels, in the coordinates of the full frame */
} rlai_screen_box;

typedef struct rlai_screen_word {
    char *text;                 /* UTF-8, owned */
    rlai_screen_box box;
    float conf;                 /* 0..100 */
} rlai_screen_word;

typedef struct rlai_screen_line {
    char *text;                 /* the line's kept words joined by spaces, owned */
    rlai_screen_box box;        /* union of the kept words' boxes */
    float conf;                 /* mean confidence of the kept words */
    rlai_screen_word *words;    /* owned */
    int n_words;
} rlai_screen_line;

typedef struct rlai_screen_text {
    rlai_screen_line *lines;    /* top to bottom as Tesseract reads them; owned */
    int n_lines;
} rlai_screen_text;

typedef struct rlai_screen_ocr rlai_screen_ocr;

/* Makes a pool for language `lang` ("eng"; NULL = "eng") with trained data
 * under datapath (NULL = Tesseract's default, $TESSDATA_PREFIX or the
 * Debian path), keeping at most max_idle instances. One instance is
 * initialised now, so a missing language fails here: returns 0,
 * RLAI_ERR_NOT_FOUND (no trained data; message in err) or RLAI_ERR_NOMEM.
 * *out freed with rlai_screen_ocr_free. */
int rlai_screen_ocr_new(const char *datapath, const char *lang, int max_idle, rlai_screen_ocr **out, char *err,
                        size_t errlen);
void rlai_screen_ocr_free(rlai_screen_ocr *ocr);

/* Reads the text of img (borrowed). Boxes are shifted by (off_x, off_y),
 * so a crop reports frame coordinates. Words with a confidence below
 * min_conf (0..100) are dropped, and lines left without words. Appends to
 * *text (zero-initialise it first; free with rlai_screen_text_free).
 * Returns the number of lines added or a negative error (RLAI_ERR_IO
 * when Tesseract fails, RLAI_ERR_NOMEM). Thread-safe. */
int rlai_screen_ocr_run(rlai_screen_ocr *ocr, const rlai_screen_image *img, int off_x, int off_y, float min_conf,
                        rlai_screen_text *text, char *err, size_t errlen);

void rlai_screen_text_free(rlai_screen_text *text);

#endif
