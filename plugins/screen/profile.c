/* profile.c - screen profile loading and validation (see profile.h). */
#include "profile.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <rlai/error.h>

static bool ident_ok(const char *s, bool dash)
{
    size_t n = strlen(s);
    if (n < 1 || n > 32)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || (i > 0 && (c == '_' || (dash && c == '-')));
        if (!ok)
            return false;
    }
    return true;
}

bool rlai_screen_profile_name_ok(const char *s)
{
    return s && ident_ok(s, true);
}

static char *dup_str(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p)
        memcpy(p, s, n);
    return p;
}

static int unknown_keys(const cJSON *obj, const char *const *keys, const char *where, char *err, size_t errlen)
{
    for (const cJSON *it = obj->child; it; it = it->next) {
        bool ok = false;
        for (int i = 0; keys[i] && !ok; i++)
            ok = it->string && strcmp(it->string, keys[i]) == 0;
        if (!ok) {
            int n = snprintf(err, errlen, "%s: unknown key \"%.64s\" (expected:", where, it->string ? it->string : "");
            for (int i = 0; keys[i] && n > 0 && (size_t)n < errlen; i++)
                n += snprintf(err + n, errlen - (size_t)n, " %s", keys[i]);
            if (n > 0 && (size_t)n < errlen)
                snprintf(err + n, errlen - (size_t)n, ")");
            return RLAI_ERR_INVALID_ARG;
        }
    }
    return 0;
}

static int parse_region(const cJSON *j, int idx, rlai_screen_region *r, char *err, size_t errlen)
{
    static const char *const keys[] = { "name", "label", "rect", "kind", NULL };
    char where[64];
    snprintf(where, sizeof where, "regions[%d]", idx);
    if (!cJSON_IsObject(j)) {
        snprintf(err, errlen, "%s must be an object", where);
        return RLAI_ERR_INVALID_ARG;
    }
    int rc = unknown_keys(j, keys, where, err, errlen);
    if (rc)
        return rc;
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(j, "name");
    if (!cJSON_IsString(name) || !ident_ok(name->valuestring, false)) {
        snprintf(err, errlen, "%s.name must be 1..32 of [a-z0-9_] starting with a letter or digit", where);
        return RLAI_ERR_INVALID_ARG;
    }
    snprintf(r->name, sizeof r->name, "%s", name->valuestring);
    snprintf(where, sizeof where, "region \"%s\"", r->name);
    const cJSON *label = cJSON_GetObjectItemCaseSensitive(j, "label");
    if (label && (!cJSON_IsString(label) || strlen(label->valuestring) >= sizeof r->label)) {
        snprintf(err, errlen, "%s: \"label\" must be a string of at most %zu bytes", where, sizeof r->label - 1);
        return RLAI_ERR_INVALID_ARG;
    }
    snprintf(r->label, sizeof r->label, "%s", label ? label->valuestring : r->name);
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(j, "kind");
    if (kind && (!cJSON_IsString(kind) || (strcmp(kind->valuestring, "text") && strcmp(kind->valuestring, "numbers")))) {
        snprintf(err, errlen, "%s: \"kind\" must be \"text\" or \"numbers\"", where);
        return RLAI_ERR_INVALID_ARG;
    }
    r->numbers = kind && strcmp(kind->valuestring, "numbers") == 0;
    const cJSON *rect = cJSON_GetObjectItemCaseSensitive(j, "rect");
    double v[4];
    bool ok = cJSON_IsArray(rect) && cJSON_GetArraySize(rect) == 4;
    for (int i = 0; ok && i < 4; i++) {
        const cJSON *e = cJSON_GetArrayItem(rect, i);
        ok = cJSON_IsNumber(e) && isfinite(e->valuedouble) && e->valuedouble >= 0 && e->valuedouble <= 1;
        if (ok)
            v[i] = e->valuedouble;
    }
    if (!ok) {
        snprintf(err, errlen, "%s: \"rect\" must be [x, y, width, height], fractions of the screen in 0..1", where);
        return RLAI_ERR_INVALID_ARG;
    }
    if (v[2] <= 0 || v[3] <= 0 || v[0] + v[2] > 1 + 1e-9 || v[1] + v[3] > 1 + 1e-9) {
        snprintf(err, errlen, "%s: \"rect\" [%g, %g, %g, %g] must have a positive size and lie inside the screen "
                              "(x + width <= 1, y + height <= 1)",
                 where, v[0], v[1], v[2], v[3]);
        return RLAI_ERR_INVALID_ARG;
    }
    r->x = v[0];
    r->y = v[1];
    r->w = v[2];
    r->h = v[3];
    return 0;
}

int rlai_screen_profile_parse(const cJSON *j, rlai_screen_profile *out, char *err, size_t errlen)
{
    static const char *const keys[] = { "name", "game", "system_prompt", "regions", "min_confidence", "other_text",
                                        NULL };
    memset(out, 0, sizeof *out);
    if (!cJSON_IsObject(j)) {
        snprintf(err, errlen, "profile must be a JSON object");
        return RLAI_ERR_INVALID_ARG;
    }
    int rc = unknown_keys(j, keys, "profile", err, errlen);
    if (rc)
        return rc;
    rlai_screen_profile p = { .min_confidence = 50, .other_text = true };
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(j, "name");
    if (!cJSON_IsString(name) || !rlai_screen_profile_name_ok(name->valuestring)) {
        snprintf(err, errlen, "profile \"name\" is required: 1..32 of [a-z0-9_-]");
        return RLAI_ERR_INVALID_ARG;
    }
    snprintf(p.name, sizeof p.name, "%s", name->valuestring);
    const cJSON *game = cJSON_GetObjectItemCaseSensitive(j, "game");
    const cJSON *sys = cJSON_GetObjectItemCaseSensitive(j, "system_prompt");
    const cJSON *regions = cJSON_GetObjectItemCaseSensitive(j, "regions");
    const cJSON *minc = cJSON_GetObjectItemCaseSensitive(j, "min_confidence");
    const cJSON *other = cJSON_GetObjectItemCaseSensitive(j, "other_text");
    if (game && (!cJSON_IsString(game) || strlen(game->valuestring) > 128)) {
        snprintf(err, errlen, "profile \"%s\": \"game\" must be a string of at most 128 bytes", p.name);
        return RLAI_ERR_INVALID_ARG;
    }
    if (sys && (!cJSON_IsString(sys) || strlen(sys->valuestring) > RLAI_SCREEN_MAX_PROMPT)) {
        snprintf(err, errlen, "profile \"%s\": \"system_prompt\" must be a string of at most %d bytes", p.name,
                 RLAI_SCREEN_MAX_PROMPT);
        return RLAI_ERR_INVALID_ARG;
    }
    if (minc) {
        if (!cJSON_IsNumber(minc) || !(minc->valuedouble >= 0 && minc->valuedouble <= 100)) {
            snprintf(err, errlen, "profile \"%s\": \"min_confidence\" must be a number in 0..100", p.name);
            return RLAI_ERR_INVALID_ARG;
        }
        p.min_confidence = (float)minc->valuedouble;
    }
    if (other) {
        if (!cJSON_IsBool(other)) {
            snprintf(err, errlen, "profile \"%s\": \"other_text\" must be true or false", p.name);
            return RLAI_ERR_INVALID_ARG;
        }
        p.other_text = cJSON_IsTrue(other);
    }
    int n = 0;
    if (regions) {
        if (!cJSON_IsArray(regions) || (n = cJSON_GetArraySize(regions)) > RLAI_SCREEN_MAX_REGIONS) {
            snprintf(err, errlen, "profile \"%s\": \"regions\" must be an array of at most %d regions", p.name,
                     RLAI_SCREEN_MAX_REGIONS);
            return RLAI_ERR_INVALID_ARG;
        }
    }
    p.game = dup_str(game ? game->valuestring : "");
    p.system_prompt = dup_str(sys ? sys->valuestring : "");
    p.regions = calloc((size_t)(n ? n : 1), sizeof *p.regions);
    if (!p.game || !p.system_prompt || !p.regions) {
        rlai_screen_profile_free(&p);
        snprintf(err, errlen, "out of memory");
        return RLAI_ERR_NOMEM;
    }
    char why[512];
    for (int i = 0; i < n; i++) {
        if ((rc = parse_region(cJSON_GetArrayItem(regions, i), i, &p.regions[i], why, sizeof why)) != 0) {
            snprintf(err, errlen, "profile \"%s\": %s", p.name, why);
            rlai_screen_profile_free(&p);
            return rc;
        }
        for (int k = 0; k < i; k++)
            if (strcmp(p.regions[k].name, p.regions[i].name) == 0) {
                snprintf(err, errlen, "profile \"%s\": two regions are named \"%s\"", p.name, p.regions[i].name);
                rlai_screen_profile_free(&p);
                return RLAI_ERR_INVALID_ARG;
            }
        p.n_regions = i + 1;
    }
    *out = p;
    return 0;
}

int rlai_screen_profile_load(const char *path, rlai_screen_profile *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "rb");
    if (!f) {
        int e = errno;
        snprintf(err, errlen, "profile %.512s: %s", path, strerror(e));
        return e == ENOENT ? RLAI_ERR_NOT_FOUND : RLAI_ERR_IO;
    }
    char *buf = malloc(RLAI_SCREEN_PROFILE_MAX_BYTES + 1);
    if (!buf) {
        fclose(f);
        return RLAI_ERR_NOMEM;
    }
    size_t n = fread(buf, 1, RLAI_SCREEN_PROFILE_MAX_BYTES + 1, f);
    bool bad = ferror(f) != 0;
    fclose(f);
    if (bad || n > RLAI_SCREEN_PROFILE_MAX_BYTES) {
        free(buf);
        snprintf(err, errlen, "profile %.512s: %s", path,
                 bad ? "read error" : "larger than 256 KiB");
        return bad ? RLAI_ERR_IO : RLAI_ERR_TOO_LARGE;
    }
    buf[n] = '\0';
    const char *end = NULL;
    cJSON *j = strlen(buf) == n ? cJSON_ParseWithOpts(buf, &end, 1) : NULL;
    free(buf);
    if (!j) {
        snprintf(err, errlen, "profile %.512s: not valid JSON", path);
        return RLAI_ERR_FORMAT;
    }
    char why[768];
    int rc = rlai_screen_profile_parse(j, out, why, sizeof why);
    cJSON_Delete(j);
    if (rc)
        snprintf(err, errlen, "profile %.256s: %s", path, why);
    return rc;
}

void rlai_screen_profile_free(rlai_screen_profile *p)
{
    if (!p)
        return;
    free(p->game);
    free(p->system_prompt);
    free(p->regions);
    memset(p, 0, sizeof *p);
}

rlai_screen_box rlai_screen_region_box(const rlai_screen_region *r, int w, int h)
{
    int x0 = (int)floor(r->x * w), y0 = (int)floor(r->y * h);
    int x1 = (int)ceil((r->x + r->w) * w), y1 = (int)ceil((r->y + r->h) * h);
    if (x0 > w - 1)
        x0 = w - 1;
    if (y0 > h - 1)
        y0 = h - 1;
    if (x1 > w)
        x1 = w;
    if (y1 > h)
        y1 = h;
    if (x1 <= x0)
        x1 = x0 + 1;
    if (y1 <= y0)
        y1 = y0 + 1;
    return (rlai_screen_box){ x0, y0, x1 - x0, y1 - y0 };
}
