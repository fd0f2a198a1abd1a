/* ocr.c - Tesseract's C API behind a pool (see ocr.h). */
#include "ocr.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tesseract/capi.h>

#include <rlai/error.h>

struct rlai_screen_ocr {
    pthread_mutex_t mu;
    char *datapath, *lang;
    TessBaseAPI **idle;
    int n_idle, max_idle;
};

static char *dup_or_null(const char *s)
{
    if (!s)
        return NULL;
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p)
        memcpy(p, s, n);
    return p;
}

static TessBaseAPI *make_api(const rlai_screen_ocr *o)
{
    TessBaseAPI *api = TessBaseAPICreate();
    if (!api)
        return NULL;
    if (TessBaseAPIInit3(api, o->datapath, o->lang) != 0) {
        TessBaseAPIDelete(api);
        return NULL;
    }
    /* Screens hold scattered text (HUD numbers, labels, dialogue boxes). */
    TessBaseAPISetPageSegMode(api, PSM_SPARSE_TEXT);
    TessBaseAPISetVariable(api, "debug_file", "/dev/null");
    return api;
}

int rlai_screen_ocr_new(const char *datapath, const char *lang, int max_idle, rlai_screen_ocr **out, char *err,
                        size_t errlen)
{
    *out = NULL;
    rlai_screen_ocr *o = calloc(1, sizeof *o);
    if (!o)
        return RLAI_ERR_NOMEM;
    o->max_idle = max_idle < 1 ? 1 : max_idle;
    o->lang = dup_or_null(lang ? lang : "eng");
    o->datapath = dup_or_null(datapath);
    o->idle = calloc((size_t)o->max_idle, sizeof *o->idle);
    if (!o->lang || (datapath && !o->datapath) || !o->idle || pthread_mutex_init(&o->mu, NULL) != 0) {
        free(o->lang);
        free(o->datapath);
        free(o->idle);
        free(o);
        return RLAI_ERR_NOMEM;
    }
    TessBaseAPI *api = make_api(o);
    if (!api) {
        snprintf(err, errlen, "Tesseract has no trained data for language \"%s\"%s%s (Debian: apt-get install "
                              "tesseract-ocr-%s)",
                 o->lang, o->datapath ? " under " : "", o->datapath ? o->datapath : "", o->lang);
        rlai_screen_ocr_free(o);
        return RLAI_ERR_NOT_FOUND;
    }
    o->idle[o->n_idle++] = api;
    *out = o;
    return 0;
}

void rlai_screen_ocr_free(rlai_screen_ocr *o)
{
    if (!o)
        return;
    for (int i = 0; i < o->n_idle; i++) {
        TessBaseAPIEnd(o->idle[i]);
        TessBaseAPIDelete(o->idle[i]);
    }
    pthread_mutex_destroy(&o->mu);
    free(o->idle);
    free(o->lang);
    free(o->datapath);
    free(o);
}

static TessBaseAPI *acquire(rlai_screen_ocr *o)
{
    TessBaseAPI *api = NULL;
    pthread_mutex_lock(&o->mu);
    if (o->n_idle > 0)
        api = o->idle[--o->n_idle];
    pthread_mutex_unlock(&o->mu);
    return api ? api : make_api(o);
}

static void release(rlai_screen_ocr *o, TessBaseAPI *api)
{
    TessBaseAPIClear(api);
    pthread_mutex_lock(&o->mu);
    if (o->n_idle < o->max_idle) {
        o->idle[o->n_idle++] = api;
        api = NULL;
    }
    pthread_mutex_unlock(&o->mu);
    if (api) {
        TessBaseAPIEnd(api);
        TessBaseAPIDelete(api);
    }
}

static void line_free(rlai_screen_line *l)
{
    for (int i = 0; i < l->n_words; i++)
        free(l->words[i].text);
    free(l->words);
    free(l->text);
    memset(l, 0, sizeof *l);
}

void rlai_screen_text_free(rlai_screen_text *t)
{
    if (!t)
        return;
    for (int i = 0; i < t->n_lines; i++)
        line_free(&t->lines[i]);
    free(t->lines);
    t->lines = NULL;
    t->n_lines = 0;
}

/* Joins the words into text, the box and the mean confidence. */
static int finish_line(rlai_screen_line *l)
{
    size_t n = 1;
    float conf = 0;
    int x0 = 0, y0 = 0, x1 = 0, y1 = 0;
    for (int i = 0; i < l->n_words; i++) {
        const rlai_screen_word *w = &l->words[i];
        n += strlen(w->text) + 1;
        conf += w->conf;
        if (i == 0 || w->box.x < x0)
            x0 = w->box.x;
        if (i == 0 || w->box.y < y0)
            y0 = w->box.y;
        if (i == 0 || w->box.x + w->box.w > x1)
            x1 = w->box.x + w->box.w;
        if (i == 0 || w->box.y + w->box.h > y1)
            y1 = w->box.y + w->box.h;
    }
    l->text = malloc(n);
    if (!l->text)
        return RLAI_ERR_NOMEM;
    size_t o = 0;
    for (int i = 0; i < l->n_words; i++) {
        size_t k = strlen(l->words[i].text);
        if (i)
            l->text[o++] = ' ';
        memcpy(l->text + o, l->words[i].text, k);
        o += k;
    }
    l->text[o] = '\0';
    l->box = (rlai_screen_box){ x0, y0, x1 - x0, y1 - y0 };
    l->conf = conf / (float)l->n_words;
    return 0;
}

/* Moves a finished line (with words) into t. */
static int push_line(rlai_screen_text *t, rlai_screen_line *l)
{
    if (l->n_words == 0)
        return 0;
    int rc = finish_line(l);
    rlai_screen_line *nl = rc ? NULL : realloc(t->lines, (size_t)(t->n_lines + 1) * sizeof *nl);
    if (!nl) {
        line_free(l);
        return RLAI_ERR_NOMEM;
    }
    t->lines = nl;
    t->lines[t->n_lines++] = *l;
    memset(l, 0, sizeof *l);
    return 1;
}

static bool blank(const char *s)
{
    for (; *s; s++)
        if (*s != ' ' && *s != '\n' && *s != '\t' && *s != '\r')
            return false;
    return true;
}

int rlai_screen_ocr_run(rlai_screen_ocr *o, const rlai_screen_image *img, int off_x, int off_y, float min_conf,
                        rlai_screen_text *text, char *err, size_t errlen)
{
    if (!img || !img->rgb || img->width < 1 || img->height < 1) {
        snprintf(err, errlen, "empty image");
        return RLAI_ERR_INVALID_ARG;
    }
    TessBaseAPI *api = acquire(o);
    if (!api) {
        snprintf(err, errlen, "Tesseract could not be initialised");
        return RLAI_ERR_IO;
    }
    TessBaseAPISetImage(api, img->rgb, img->width, img->height, 3, img->width * 3);
    TessBaseAPISetSourceResolution(api, 96);
    if (TessBaseAPIRecognize(api, NULL) != 0) {
        release(o, api);
        snprintf(err, errlen, "Tesseract failed to recognise the image");
        return RLAI_ERR_IO;
    }
    int added = 0, rc = 0;
    rlai_screen_line cur;
    memset(&cur, 0, sizeof cur);
    TessResultIterator *ri = TessBaseAPIGetIterator(api);
    if (ri) {
        TessPageIterator *pi = TessResultIteratorGetPageIterator(ri);
        do {
            if (TessPageIteratorIsAtBeginningOf(pi, RIL_TEXTLINE) && cur.n_words) {
                if ((rc = push_line(text, &cur)) < 0)
                    break;
                added += rc;
            }
            char *w = TessResultIteratorGetUTF8Text(ri, RIL_WORD);
            float conf = TessResultIteratorConfidence(ri, RIL_WORD);
            int l, t, r, b;
            if (w && !blank(w) && conf >= min_conf && TessPageIteratorBoundingBox(pi, RIL_WORD, &l, &t, &r, &b)) {
                rlai_screen_word *nw = realloc(cur.words, (size_t)(cur.n_words + 1) * sizeof *nw);
                char *copy = dup_or_null(w);
                if (!nw || !copy) {
                    free(copy);
                    if (nw)
                        cur.words = nw;
                    TessDeleteText(w);
                    rc = RLAI_ERR_NOMEM;
                    break;
                }
                cur.words = nw;
                cur.words[cur.n_words++] = (rlai_screen_word){ copy, { l + off_x, t + off_y, r - l, b - t }, conf };
            }
            if (w)
                TessDeleteText(w);
        } while (TessResultIteratorNext(ri, RIL_WORD));
        TessResultIteratorDelete(ri);
    }
    if (rc >= 0 && cur.n_words) {
        rc = push_line(text, &cur);
        if (rc > 0)
            added += rc;
    }
    line_free(&cur);
    release(o, api);
    if (rc < 0) {
        snprintf(err, errlen, "out of memory");
        return rc;
    }
    return added;
}
