/* params_schema.c - checks a command's parameter schema at registration and
 * validates call parameters against it (see params_schema.h). */
#include "params_schema.h"

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rlai/error.h"

static int fail(char *err, size_t len, const char *fmt, ...)
{
    if (err && len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, len, fmt, ap);
        va_end(ap);
    }
    return RLAI_ERR_INVALID_ARG;
}

/* ------------------------------------------------------------ helpers */

static const char *const TYPE_NAMES[] = { "object", "array", "string", "number", "integer", "boolean", "null" };

static bool known_type(const char *s)
{
    for (size_t i = 0; i < sizeof(TYPE_NAMES) / sizeof(TYPE_NAMES[0]); i++)
        if (strcmp(s, TYPE_NAMES[i]) == 0)
            return true;
    return false;
}

static bool is_int_value(const cJSON *v)
{
    return cJSON_IsNumber(v) && isfinite(v->valuedouble) && floor(v->valuedouble) == v->valuedouble;
}

static bool has_type(const cJSON *v, const char *t)
{
    if (!strcmp(t, "object"))
        return cJSON_IsObject(v);
    if (!strcmp(t, "array"))
        return cJSON_IsArray(v);
    if (!strcmp(t, "string"))
        return cJSON_IsString(v);
    if (!strcmp(t, "number"))
        return cJSON_IsNumber(v);
    if (!strcmp(t, "integer"))
        return is_int_value(v);
    if (!strcmp(t, "boolean"))
        return cJSON_IsBool(v);
    if (!strcmp(t, "null"))
        return cJSON_IsNull(v);
    return false;
}

/* Shortest %g form that reads back as the same double. */
static void fmt_num(double d, char *out, size_t len)
{
    snprintf(out, len, "%.15g", d);
    if (strtod(out, NULL) != d)
        snprintf(out, len, "%.17g", d);
}

/* Code points of a UTF-8 string (bytes that do not start a sequence are
 * not counted). */
static size_t utf8_len(const char *s)
{
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        n += (*p & 0xC0) != 0x80;
    return n;
}

/* Appends a parameter name to a path for messages: printable ASCII kept,
 * other bytes shown as '?', at most 64 of them. */
static void path_push_key(char *path, size_t cap, const char *key)
{
    size_t n = strlen(path);
    if (n && n + 1 < cap)
        path[n++] = '.';
    size_t k = 0;
    for (const unsigned char *p = (const unsigned char *)key; *p && k < 64 && n + 1 < cap; p++, k++)
        path[n++] = (*p >= 0x20 && *p < 0x7f && *p != '\'') ? (char)*p : '?';
    if (n < cap)
        path[n] = 0;
}

static void path_push_index(char *path, size_t cap, int i)
{
    size_t n = strlen(path);
    if (n < cap)
        snprintf(path + n, cap - n, "[%d]", i);
}

/* ------------------------------------------------------------- schema check */

static const char *const ANNOTATIONS[] = { "description", "title", "default", "examples", "format", "$comment",
                                           "$schema", "$id", "deprecated", "readOnly", "writeOnly",
                                           "contentEncoding", "contentMediaType" };

static const char *const KEYWORDS[] = { "type", "properties", "required", "additionalProperties", "minimum",
                                        "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength",
                                        "maxLength", "enum", "const", "items", "minItems", "maxItems", "oneOf",
                                        "anyOf", "allOf" };

static bool in_list(const char *s, const char *const *list, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(s, list[i]) == 0)
            return true;
    return false;
}

static int check_node(const cJSON *s, int depth, char *where, size_t wcap, char *err, size_t errlen);

/* "where" for messages: "" means the top level. */
static const char *at(const char *where)
{
    return *where ? where : "(top level)";
}

static int check_count(const cJSON *s, const char *key, const char *where, char *err, size_t errlen, double *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, key);
    *out = -1;
    if (!v)
        return 0;
    if (!is_int_value(v) || v->valuedouble < 0)
        return fail(err, errlen, "%s: \"%s\" must be a non-negative integer", at(where), key);
    *out = v->valuedouble;
    return 0;
}

static int check_sub(const cJSON *sub, int depth, char *where, size_t wcap, const char *suffix, char *err,
                     size_t errlen)
{
    size_t n = strlen(where);
    snprintf(where + n, wcap - n, "%s%s", n ? "." : "", suffix);
    int rc = check_node(sub, depth + 1, where, wcap, err, errlen);
    where[n] = 0;
    return rc;
}

static int check_node(const cJSON *s, int depth, char *where, size_t wcap, char *err, size_t errlen)
{
    if (cJSON_IsBool(s))
        return 0;
    if (!cJSON_IsObject(s))
        return fail(err, errlen, "%s: a schema must be an object or a boolean", at(where));
    if (depth > RLAI_PARAMS_SCHEMA_MAX_DEPTH)
        return fail(err, errlen, "%s: schemas nested deeper than %d", at(where), RLAI_PARAMS_SCHEMA_MAX_DEPTH);
    const cJSON *k;
    cJSON_ArrayForEach(k, s) {
        if (in_list(k->string, ANNOTATIONS, sizeof(ANNOTATIONS) / sizeof(ANNOTATIONS[0])))
            continue;
        if (!in_list(k->string, KEYWORDS, sizeof(KEYWORDS) / sizeof(KEYWORDS[0])))
            return fail(err, errlen,
                        "%s: keyword \"%.64s\" is not supported by the plugin host (supported: type, properties, "
                        "required, additionalProperties, minimum, maximum, exclusiveMinimum, exclusiveMaximum, "
                        "minLength, maxLength, enum, const, items, minItems, maxItems, oneOf, anyOf, allOf)",
                        at(where), k->string);
    }
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(s, "type");
    if (t) {
        if (cJSON_IsString(t)) {
            if (!known_type(t->valuestring))
                return fail(err, errlen, "%s: unknown type \"%.64s\"", at(where), t->valuestring);
        } else if (cJSON_IsArray(t) && cJSON_GetArraySize(t) > 0) {
            const cJSON *e;
            cJSON_ArrayForEach(e, t) {
                if (!cJSON_IsString(e) || !known_type(e->valuestring))
                    return fail(err, errlen, "%s: \"type\" must list type names", at(where));
            }
        } else {
            return fail(err, errlen, "%s: \"type\" must be a type name or a non-empty array of them", at(where));
        }
    }
    static const char *const nums[] = { "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum" };
    for (size_t i = 0; i < 4; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, nums[i]);
        if (v && !cJSON_IsNumber(v))
            return fail(err, errlen, "%s: \"%s\" must be a number", at(where), nums[i]);
    }
    const cJSON *mn = cJSON_GetObjectItemCaseSensitive(s, "minimum");
    const cJSON *mx = cJSON_GetObjectItemCaseSensitive(s, "maximum");
    if (mn && mx && mn->valuedouble > mx->valuedouble)
        return fail(err, errlen, "%s: \"minimum\" is greater than \"maximum\"", at(where));
    double lo, hi;
    if (check_count(s, "minLength", where, err, errlen, &lo) || check_count(s, "maxLength", where, err, errlen, &hi))
        return RLAI_ERR_INVALID_ARG;
    if (lo >= 0 && hi >= 0 && lo > hi)
        return fail(err, errlen, "%s: \"minLength\" is greater than \"maxLength\"", at(where));
    if (check_count(s, "minItems", where, err, errlen, &lo) || check_count(s, "maxItems", where, err, errlen, &hi))
        return RLAI_ERR_INVALID_ARG;
    if (lo >= 0 && hi >= 0 && lo > hi)
        return fail(err, errlen, "%s: \"minItems\" is greater than \"maxItems\"", at(where));
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
    if (en && (!cJSON_IsArray(en) || cJSON_GetArraySize(en) == 0))
        return fail(err, errlen, "%s: \"enum\" must be a non-empty array", at(where));
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    if (props) {
        if (!cJSON_IsObject(props))
            return fail(err, errlen, "%s: \"properties\" must be an object", at(where));
        const cJSON *p;
        cJSON_ArrayForEach(p, props) {
            char name[80] = "";
            path_push_key(name, sizeof(name), p->string);
            if (check_sub(p, depth, where, wcap, name, err, errlen))
                return RLAI_ERR_INVALID_ARG;
        }
    }
    const cJSON *ap = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    if (ap && !cJSON_IsBool(ap) && check_sub(ap, depth, where, wcap, "additionalProperties", err, errlen))
        return RLAI_ERR_INVALID_ARG;
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    if (req) {
        if (!cJSON_IsArray(req))
            return fail(err, errlen, "%s: \"required\" must be an array of names", at(where));
        const cJSON *r;
        cJSON_ArrayForEach(r, req) {
            if (!cJSON_IsString(r))
                return fail(err, errlen, "%s: \"required\" must be an array of names", at(where));
            if (cJSON_IsFalse(ap) && !cJSON_GetObjectItemCaseSensitive(props, r->valuestring))
                return fail(err, errlen,
                            "%s: \"%.64s\" is required but not in \"properties\", and additionalProperties is "
                            "false: no value could pass",
                            at(where), r->valuestring);
        }
    }
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
    if (items) {
        if (cJSON_IsArray(items))
            return fail(err, errlen, "%s: \"items\" as an array (tuple form) is not supported: give one schema",
                        at(where));
        if (check_sub(items, depth, where, wcap, "items", err, errlen))
            return RLAI_ERR_INVALID_ARG;
    }
    static const char *const combos[] = { "oneOf", "anyOf", "allOf" };
    for (size_t i = 0; i < 3; i++) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(s, combos[i]);
        if (!c)
            continue;
        if (!cJSON_IsArray(c) || cJSON_GetArraySize(c) == 0)
            return fail(err, errlen, "%s: \"%s\" must be a non-empty array of schemas", at(where), combos[i]);
        int j = 0;
        const cJSON *sub;
        cJSON_ArrayForEach(sub, c) {
            char name[32];
            snprintf(name, sizeof(name), "%s[%d]", combos[i], j++);
            if (check_sub(sub, depth, where, wcap, name, err, errlen))
                return RLAI_ERR_INVALID_ARG;
        }
    }
    return 0;
}

int rlai_params_schema_check(const cJSON *schema, char *err, size_t errlen)
{
    if (!cJSON_IsObject(schema))
        return fail(err, errlen, "params_schema must be a JSON object");
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(schema, "type");
    if (t && !(cJSON_IsString(t) && strcmp(t->valuestring, "object") == 0))
        return fail(err, errlen, "params_schema: \"type\" must be \"object\" (params are always an object)");
    char where[512] = "";
    int rc = check_node(schema, 0, where, sizeof(where), err, errlen);
    if (rc < 0 && err && errlen) {
        char tmp[768];
        snprintf(tmp, sizeof(tmp), "params_schema: %s", err);
        snprintf(err, errlen, "%s", tmp);
    }
    return rc;
}

/* ------------------------------------------------------------- validation */

/* "'name'" or "params" (top level) for messages. */
static const char *who(const char *path, char *buf, size_t cap)
{
    if (!*path)
        return "params";
    snprintf(buf, cap, "'%s'", path);
    return buf;
}

static void type_list(const cJSON *t, char *out, size_t cap)
{
    size_t n = 0;
    out[0] = 0;
    if (cJSON_IsString(t)) {
        snprintf(out, cap, "%s", t->valuestring);
        return;
    }
    int i = 0, total = cJSON_GetArraySize(t);
    const cJSON *e;
    cJSON_ArrayForEach(e, t) {
        const char *sep = i == 0 ? "" : i == total - 1 ? " or " : ", ";
        if (n < cap)
            n += (size_t)snprintf(out + n, cap - n, "%s%s", sep, e->valuestring);
        i++;
    }
}

static const char *article(const char *type)
{
    return (type[0] == 'a' || type[0] == 'i' || type[0] == 'o') ? "an" : "a";
}

static int validate(const cJSON *s, const cJSON *v, char *path, size_t pcap, char *err, size_t errlen);

static bool type_ok(const cJSON *t, const cJSON *v)
{
    if (!t)
        return true;
    if (cJSON_IsString(t))
        return has_type(v, t->valuestring);
    const cJSON *e;
    cJSON_ArrayForEach(e, t) {
        if (has_type(v, e->valuestring))
            return true;
    }
    return false;
}

static void value_text(const cJSON *v, char *out, size_t cap)
{
    char *p = cJSON_PrintUnformatted(v);
    if (!p) {
        snprintf(out, cap, "?");
        return;
    }
    if (strlen(p) > 40)
        snprintf(out, cap, "%.37s...", p);
    else
        snprintf(out, cap, "%s", p);
    for (char *q = out; *q; q++)
        if ((unsigned char)*q < 0x20 || (unsigned char)*q >= 0x7f)
            *q = '?';
    free(p);
}

static int validate_combo(const cJSON *s, const char *kw, const cJSON *v, char *path, size_t pcap, char *err,
                          size_t errlen)
{
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(s, kw);
    if (!c)
        return 0;
    char nb[96];
    const char *name = who(path, nb, sizeof(nb));
    bool all = !strcmp(kw, "allOf"), one = !strcmp(kw, "oneOf");
    int matched = 0, n = 0;
    const cJSON *sub;
    char first_err[512] = "", typed_err[512] = "";
    int typed = 0;
    cJSON_ArrayForEach(sub, c) {
        char e[512] = "";
        n++;
        if (validate(sub, v, path, pcap, e, sizeof(e)) == 0) {
            matched++;
            continue;
        }
        if (all)
            return fail(err, errlen, "%s", e);
        if (!first_err[0])
            snprintf(first_err, sizeof(first_err), "%s", e);
        /* the alternative whose type fits gives the most useful message */
        if (cJSON_IsObject(sub) && type_ok(cJSON_GetObjectItemCaseSensitive(sub, "type"), v) &&
            cJSON_GetObjectItemCaseSensitive(sub, "type")) {
            typed++;
            snprintf(typed_err, sizeof(typed_err), "%s", e);
        }
    }
    if (all)
        return 0;
    if (one && matched > 1)
        return fail(err, errlen, "%s matches %d of its %d oneOf forms; it must match exactly one", name, matched, n);
    if (matched >= 1)
        return 0;
    if (typed == 1)
        return fail(err, errlen, "%s", typed_err);
    return fail(err, errlen, "%s matches none of its %d %s forms (first: %s)", name, n, kw, first_err);
}

static int validate(const cJSON *s, const cJSON *v, char *path, size_t pcap, char *err, size_t errlen)
{
    char nb[96];
    if (cJSON_IsTrue(s))
        return 0;
    if (cJSON_IsFalse(s))
        return fail(err, errlen, "%s is not accepted", who(path, nb, sizeof(nb)));
    const char *name = who(path, nb, sizeof(nb));
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(s, "type");
    if (!type_ok(t, v)) {
        char tl[96];
        type_list(t, tl, sizeof(tl));
        return fail(err, errlen, "%s must be %s %s", name, article(tl), tl);
    }
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
    if (en) {
        bool ok = false;
        const cJSON *e;
        cJSON_ArrayForEach(e, en) {
            if (cJSON_Compare(e, v, true)) {
                ok = true;
                break;
            }
        }
        if (!ok) {
            char list[400] = "";
            size_t n = 0;
            cJSON_ArrayForEach(e, en) {
                char one[48];
                value_text(e, one, sizeof(one));
                if (n < sizeof(list))
                    n += (size_t)snprintf(list + n, sizeof(list) - n, "%s%s", n ? ", " : "", one);
            }
            return fail(err, errlen, "%s must be one of %s", name, list);
        }
    }
    const cJSON *cst = cJSON_GetObjectItemCaseSensitive(s, "const");
    if (cst && !cJSON_Compare(cst, v, true)) {
        char one[48];
        value_text(cst, one, sizeof(one));
        return fail(err, errlen, "%s must be %s", name, one);
    }
    if (cJSON_IsNumber(v)) {
        static const char *const kws[] = { "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum" };
        static const char *const ops[] = { ">=", "<=", ">", "<" };
        for (int i = 0; i < 4; i++) {
            const cJSON *b = cJSON_GetObjectItemCaseSensitive(s, kws[i]);
            if (!b)
                continue;
            double x = v->valuedouble, y = b->valuedouble;
            bool ok = i == 0 ? x >= y : i == 1 ? x <= y : i == 2 ? x > y : x < y;
            if (!ok) {
                char num[40];
                fmt_num(y, num, sizeof(num));
                return fail(err, errlen, "%s must be %s %s", name, ops[i], num);
            }
        }
    }
    if (cJSON_IsString(v)) {
        size_t len = utf8_len(v->valuestring);
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(s, "minLength");
        if (b && (double)len < b->valuedouble)
            return fail(err, errlen, "%s must be at least %.0f character%s long", name, b->valuedouble,
                        b->valuedouble == 1 ? "" : "s");
        b = cJSON_GetObjectItemCaseSensitive(s, "maxLength");
        if (b && (double)len > b->valuedouble)
            return fail(err, errlen, "%s must be at most %.0f character%s long (it has %zu)", name, b->valuedouble,
                        b->valuedouble == 1 ? "" : "s", len);
    }
    if (cJSON_IsArray(v)) {
        int n = cJSON_GetArraySize(v);
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(s, "minItems");
        if (b && (double)n < b->valuedouble)
            return fail(err, errlen, "%s must have at least %.0f item%s", name, b->valuedouble,
                        b->valuedouble == 1 ? "" : "s");
        b = cJSON_GetObjectItemCaseSensitive(s, "maxItems");
        if (b && (double)n > b->valuedouble)
            return fail(err, errlen, "%s must have at most %.0f item%s (it has %d)", name, b->valuedouble,
                        b->valuedouble == 1 ? "" : "s", n);
        const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
        if (items) {
            size_t plen = strlen(path);
            int i = 0;
            const cJSON *e;
            cJSON_ArrayForEach(e, v) {
                path_push_index(path, pcap, i++);
                int rc = validate(items, e, path, pcap, err, errlen);
                path[plen] = 0;
                if (rc)
                    return rc;
            }
        }
    }
    if (cJSON_IsObject(v)) {
        const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
        const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
        const cJSON *ap = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
        size_t plen = strlen(path);
        const cJSON *r;
        cJSON_ArrayForEach(r, req) {
            if (!cJSON_GetObjectItemCaseSensitive(v, r->valuestring)) {
                path_push_key(path, pcap, r->valuestring);
                fail(err, errlen, "'%s' is required", path);
                path[plen] = 0;
                return RLAI_ERR_INVALID_ARG;
            }
        }
        const cJSON *m;
        cJSON_ArrayForEach(m, v) {
            const cJSON *ps = props ? cJSON_GetObjectItemCaseSensitive(props, m->string) : NULL;
            if (!ps && cJSON_IsFalse(ap)) {
                char known[300] = "";
                size_t n = 0;
                const cJSON *p;
                cJSON_ArrayForEach(p, props) {
                    if (n < sizeof(known))
                        n += (size_t)snprintf(known + n, sizeof(known) - n, "%s%.64s", n ? ", " : "", p->string);
                }
                path_push_key(path, pcap, m->string);
                fail(err, errlen, "'%s' is not accepted (additionalProperties is false; parameters: %s)", path,
                     known[0] ? known : "none");
                path[plen] = 0;
                return RLAI_ERR_INVALID_ARG;
            }
            if (!ps && ap && !cJSON_IsBool(ap))
                ps = ap;
            if (!ps)
                continue;
            path_push_key(path, pcap, m->string);
            int rc = validate(ps, m, path, pcap, err, errlen);
            path[plen] = 0;
            if (rc)
                return rc;
        }
    }
    static const char *const combos[] = { "allOf", "anyOf", "oneOf" };
    for (int i = 0; i < 3; i++)
        if (validate_combo(s, combos[i], v, path, pcap, err, errlen))
            return RLAI_ERR_INVALID_ARG;
    return 0;
}

int rlai_params_schema_validate(const cJSON *schema, const cJSON *params, char *err, size_t errlen)
{
    if (!schema)
        return 0;
    if (!cJSON_IsObject(params))
        return fail(err, errlen, "params must be a JSON object");
    char path[512] = "";
    return validate(schema, params, path, sizeof(path), err, errlen);
}
