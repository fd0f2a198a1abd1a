/* layout.c - the screen description for the model (see layout.h). */
#include "layout.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <rlai/error.h>

#define MAX_NUMBERS 32

int rlai_screen_numbers(const char *s, double *out, int cap)
{
    int n = 0;
    for (const char *p = s; *p;) {
        bool digit = *p >= '0' && *p <= '9';
        bool neg = *p == '-' && p[1] >= '0' && p[1] <= '9' &&
                   (p == s || !((p[-1] >= '0' && p[-1] <= '9') || (p[-1] >= 'a' && p[-1] <= 'z') ||
                                (p[-1] >= 'A' && p[-1] <= 'Z')));
        if (!digit && !neg) {
            p++;
            continue;
        }
        const char *q = p + (neg ? 1 : 0);
        double v = 0;
        while (*q >= '0' && *q <= '9')
            v = v * 10 + (*q++ - '0');
        if (*q == '.' && q[1] >= '0' && q[1] <= '9') {
            double f = 0.1;
            for (q++; *q >= '0' && *q <= '9'; q++, f /= 10)
                v += (*q - '0') * f;
        }
        if (n < cap)
            out[n] = neg ? -v : v;
        n++;
        p = q;
    }
    return n;
}

const char *rlai_screen_where(rlai_screen_box b, int w, int h)
{
    static const char *const names[3][3] = {
        { "top-left", "top-center", "top-right" },
        { "middle-left", "center", "middle-right" },
        { "bottom-left", "bottom-center", "bottom-right" },
    };
    long cx = (long)b.x + b.w / 2, cy = (long)b.y + b.h / 2;
    int col = w > 0 ? (int)(cx * 3 / w) : 1, row = h > 0 ? (int)(cy * 3 / h) : 1;
    col = col < 0 ? 0 : col > 2 ? 2 : col;
    row = row < 0 ? 0 : row > 2 ? 2 : row;
    return names[row][col];
}

/* A growing string. */
typedef struct sbuf {
    char *s;
    size_t len, cap;
    bool nomem;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...)
{
    if (b->nomem)
        return;
    va_list ap;
    va_start(ap, fmt);
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
        va_end(ap2);
        b->nomem = true;
        return;
    }
    if (b->len + (size_t)n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (b->len + (size_t)n + 1 > cap)
            cap *= 2;
        char *s = realloc(b->s, cap);
        if (!s) {
            va_end(ap2);
            b->nomem = true;
            return;
        }
        b->s = s;
        b->cap = cap;
    }
    vsnprintf(b->s + b->len, (size_t)n + 1, fmt, ap2);
    va_end(ap2);
    b->len += (size_t)n;
}

/* Text of the lines joined with " / ", for one region. */
static void join_lines(sbuf *b, const rlai_screen_text *t)
{
    for (int i = 0; t && i < t->n_lines; i++)
        sb_printf(b, "%s%s", i ? " / " : "", t->lines[i].text);
}

static bool inside(rlai_screen_box outer, rlai_screen_box b)
{
    long cx = (long)b.x + b.w / 2, cy = (long)b.y + b.h / 2;
    return cx >= outer.x && cx < (long)outer.x + outer.w && cy >= outer.y && cy < (long)outer.y + outer.h;
}

static cJSON *box_json(rlai_screen_box b)
{
    cJSON *o = cJSON_CreateObject();
    if (o && (!cJSON_AddNumberToObject(o, "x", b.x) || !cJSON_AddNumberToObject(o, "y", b.y) ||
              !cJSON_AddNumberToObject(o, "width", b.w) || !cJSON_AddNumberToObject(o, "height", b.h))) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

int rlai_screen_layout_describe(int w, int h, const rlai_screen_profile *profile, const rlai_screen_text *region_text,
                                const rlai_screen_text *full, size_t max_chars, char **text, cJSON **json)
{
    *text = NULL;
    if (json)
        *json = NULL;
    sbuf b = { 0 };
    cJSON *root = json ? cJSON_CreateObject() : NULL;
    cJSON *jreg = root ? cJSON_AddObjectToObject(root, "regions") : NULL;
    cJSON *jlines = root ? cJSON_AddArrayToObject(root, "lines") : NULL;
    bool ok = !json || (jreg && jlines);
    bool truncated = false;
    int n_regions = profile ? profile->n_regions : 0;
    sb_printf(&b, "Screen %dx%d.\n", w, h);
    for (int i = 0; ok && i < n_regions; i++) {
        const rlai_screen_region *r = &profile->regions[i];
        const rlai_screen_text *t = region_text ? &region_text[i] : NULL;
        sbuf joined = { 0 };
        join_lines(&joined, t);
        const char *jt = joined.s ? joined.s : "";
        double nums[MAX_NUMBERS];
        int nn = rlai_screen_numbers(jt, nums, MAX_NUMBERS);
        if (nn > MAX_NUMBERS)
            nn = MAX_NUMBERS;
        size_t before = b.len;
        sb_printf(&b, "%s (%s): ", r->label, r->name);
        if (jt[0])
            sb_printf(&b, "\"%s\"", jt);
        else
            sb_printf(&b, "no text read");
        if (nn) {
            sb_printf(&b, "; numbers:");
            for (int k = 0; k < nn; k++)
                sb_printf(&b, "%s %g", k ? "," : "", nums[k]);
        }
        sb_printf(&b, "\n");
        if (max_chars && b.len > max_chars) {
            b.len = before;
            truncated = true;
        }
        if (json) {
            cJSON *o = cJSON_CreateObject();
            cJSON *bx = box_json(rlai_screen_region_box(r, w, h));
            cJSON *arr = NULL;
            if (!o || !bx || !cJSON_AddItemToObject(o, "box", bx)) {
                cJSON_Delete(o);
                cJSON_Delete(bx);
                ok = false;
            } else if (!cJSON_AddItemToObject(jreg, r->name, o)) {
                cJSON_Delete(o);
                ok = false;
            } else {
                ok = (arr = cJSON_AddArrayToObject(o, "numbers")) != NULL;
            }
            ok = ok && cJSON_AddStringToObject(o, "label", r->label) && cJSON_AddStringToObject(o, "text", jt) &&
                 cJSON_AddStringToObject(o, "kind", r->numbers ? "numbers" : "text");
            for (int k = 0; ok && k < nn; k++) {
                cJSON *num = cJSON_CreateNumber(nums[k]);
                ok = num && cJSON_AddItemToArray(arr, num);
                if (!ok)
                    cJSON_Delete(num);
            }
        }
        free(joined.s);
        ok = ok && !joined.nomem;
    }
    bool other = !profile || profile->other_text;
    if (ok && other && full) {
        bool header = false;
        for (int i = 0; ok && i < full->n_lines; i++) {
            const rlai_screen_line *l = &full->lines[i];
            bool in_region = false;
            for (int k = 0; k < n_regions && !in_region; k++)
                in_region = inside(rlai_screen_region_box(&profile->regions[k], w, h), l->box);
            if (in_region)
                continue;
            const char *where = rlai_screen_where(l->box, w, h);
            if (!truncated) {
                size_t before = b.len;
                if (!header)
                    sb_printf(&b, "%s text on the screen, top to bottom:\n", n_regions ? "Other" : "The");
                sb_printf(&b, "- %s: \"%s\"\n", where, l->text);
                if (max_chars && b.len > max_chars) {
                    b.len = before;
                    truncated = true;
                } else {
                    header = true;
                }
            }
            if (json) {
                cJSON *o = cJSON_CreateObject();
                ok = o && cJSON_AddItemToArray(jlines, o);
                if (!ok) {
                    cJSON_Delete(o);
                    break;
                }
                ok = cJSON_AddStringToObject(o, "text", l->text) && cJSON_AddStringToObject(o, "where", where) &&
                     cJSON_AddNumberToObject(o, "x", l->box.x) && cJSON_AddNumberToObject(o, "y", l->box.y) &&
                     cJSON_AddNumberToObject(o, "width", l->box.w) && cJSON_AddNumberToObject(o, "height", l->box.h) &&
                     cJSON_AddNumberToObject(o, "confidence", (int)(l->conf + 0.5f));
            }
        }
        if (ok && !header && !truncated)
            sb_printf(&b, "%s text was read on the screen.\n", n_regions ? "No other" : "No");
    }
    if (truncated)
        sb_printf(&b, "(more text on the screen was left out)\n");
    if (b.len > 0 && b.s && b.s[b.len - 1] == '\n')
        b.s[--b.len] = '\0';
    if (json && ok)
        ok = cJSON_AddBoolToObject(root, "truncated", truncated) != NULL;
    if (!ok || b.nomem || !b.s) {
        free(b.s);
        cJSON_Delete(root);
        return RLAI_ERR_NOMEM;
    }
    *text = b.s;
    if (json)
        *json = root;
    return 0;
}
