/* plugin_json.h - small readers for a plugin's JSON params and config.
 *
 * Header-only (static inline): a plugin that includes it links nothing new
 * and the plugin ABI does not change. Every reader leaves *out alone when
 * the key is absent, so callers set their defaults first. Errors are
 * RLAI_ERR_INVALID_ARG with a message naming the key written to err
 * (truncated to errlen, always NUL-terminated when errlen > 0).
 *
 * Ownership: nothing is allocated; returned strings point into the cJSON
 * object the caller owns and live as long as it does. */
#ifndef RLAI_PLUGIN_JSON_H
#define RLAI_PLUGIN_JSON_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "error.h"

/* Fails on the first key of OBJ that is not in ALLOWED (a NULL-terminated
 * list), listing the allowed keys in the message. */
static inline int rlai_json_check_keys(const cJSON *obj, const char *const *allowed, char *err, size_t errlen)
{
    for (const cJSON *it = obj ? obj->child : NULL; it; it = it->next) {
        bool ok = false;
        for (int i = 0; allowed[i] && !ok; i++)
            ok = it->string && strcmp(it->string, allowed[i]) == 0;
        if (!ok) {
            int n = snprintf(err, errlen, "unknown parameter \"%.64s\" (expected:", it->string ? it->string : "");
            for (int i = 0; allowed[i] && n > 0 && (size_t)n < errlen; i++)
                n += snprintf(err + n, errlen - (size_t)n, " %s", allowed[i]);
            if (n > 0 && (size_t)n < errlen)
                snprintf(err + n, errlen - (size_t)n, ")");
            return RLAI_ERR_INVALID_ARG;
        }
    }
    return 0;
}

/* An optional integer in [lo, hi]: a JSON number without a fraction. */
static inline int rlai_json_opt_int(const cJSON *obj, const char *key, int lo, int hi, int *out, char *err,
                                    size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v)
        return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble != (double)(long long)v->valuedouble || v->valuedouble < lo ||
        v->valuedouble > hi) {
        snprintf(err, errlen, "\"%s\" must be an integer in %d..%d", key, lo, hi);
        return RLAI_ERR_INVALID_ARG;
    }
    *out = (int)v->valuedouble;
    return 0;
}

/* An optional number in [lo, hi] (NaN is refused). */
static inline int rlai_json_opt_float(const cJSON *obj, const char *key, double lo, double hi, float *out, char *err,
                                      size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v)
        return 0;
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo && v->valuedouble <= hi)) {
        snprintf(err, errlen, "\"%s\" must be a number in %g..%g", key, lo, hi);
        return RLAI_ERR_INVALID_ARG;
    }
    *out = (float)v->valuedouble;
    return 0;
}

/* An optional string: NULL when absent or null; sets *bad (and returns
 * NULL) when the value is there but not a string. */
static inline const char *rlai_json_opt_str(const cJSON *obj, const char *key, bool *bad)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v))
        return NULL;
    if (!cJSON_IsString(v)) {
        *bad = true;
        return NULL;
    }
    return v->valuestring;
}

#endif
