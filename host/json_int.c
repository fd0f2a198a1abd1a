/* json_int.c - exact integers from JSON text (see json_int.h). */
#include "json_int.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t skip_ws(const char *p, size_t n, size_t i)
{
    while (i < n && (p[i] == ' ' || p[i] == '\t' || p[i] == '\r' || p[i] == '\n'))
        i++;
    return i;
}

/* Index just past the string starting at p[i] == '"'. */
static size_t skip_string(const char *p, size_t n, size_t i)
{
    for (i++; i < n; i++) {
        if (p[i] == '\\')
            i++;
        else if (p[i] == '"')
            return i + 1;
    }
    return n;
}

/* Index just past the value starting at p[i]. */
static size_t skip_value(const char *p, size_t n, size_t i)
{
    if (i >= n)
        return n;
    if (p[i] == '"')
        return skip_string(p, n, i);
    if (p[i] == '{' || p[i] == '[') {
        int depth = 0;
        while (i < n) {
            char c = p[i];
            if (c == '"') {
                i = skip_string(p, n, i);
                continue;
            }
            if (c == '{' || c == '[')
                depth++;
            else if (c == '}' || c == ']') {
                if (--depth == 0)
                    return i + 1;
            }
            i++;
        }
        return n;
    }
    while (i < n && !strchr(",}] \t\r\n", p[i]))
        i++;
    return i;
}

/* Does the JSON string at p[i..end) (quotes included) equal key? Keys with
 * escapes are compared after the simple escapes only (\" \\ \/). */
static bool key_is(const char *p, size_t i, size_t end, const char *key)
{
    size_t k = 0, kl = strlen(key);
    for (size_t j = i + 1; j + 1 < end; j++) {
        char c = p[j];
        if (c == '\\') {
            j++;
            c = p[j];
            if (c != '"' && c != '\\' && c != '/')
                return false;
        }
        if (k >= kl || key[k] != c)
            return false;
        k++;
    }
    return k == kl;
}

/* The value span of top-level member key: 1 found, 0 absent. */
static int find_span(const char *p, size_t n, const char *key, size_t *vs, size_t *ve)
{
    size_t i = skip_ws(p, n, 0);
    if (i >= n || p[i] != '{')
        return 0;
    i++;
    for (;;) {
        i = skip_ws(p, n, i);
        if (i >= n || p[i] != '"')
            return 0;
        size_t ks = i;
        i = skip_string(p, n, i);
        size_t ke = i;
        i = skip_ws(p, n, i);
        if (i >= n || p[i] != ':')
            return 0;
        i = skip_ws(p, n, i + 1);
        size_t s = i;
        i = skip_value(p, n, i);
        if (key_is(p, ks, ke, key)) {
            *vs = s;
            *ve = i;
            return 1;
        }
        i = skip_ws(p, n, i);
        if (i >= n || p[i] != ',')
            return 0;
        i++;
    }
}

int rlai_json_find_int_text(const char *json, size_t len, const char *key, char *buf, size_t cap)
{
    size_t s, e;
    if (!json || !key || !find_span(json, len, key, &s, &e))
        return 0;
    if (e - s == 4 && !memcmp(json + s, "null", 4))
        return 0;
    size_t i = s + (json[s] == '-');
    if (i >= e || e - s > 20)
        return -1;
    for (size_t j = i; j < e; j++)
        if (json[j] < '0' || json[j] > '9')
            return -1;
    char tmp[24];
    memcpy(tmp, json + s, e - s);
    tmp[e - s] = 0;
    errno = 0;
    if (json[s] == '-')
        (void)strtoll(tmp, NULL, 10);      /* range check only */
    else
        (void)strtoull(tmp, NULL, 10);
    if (errno == ERANGE)
        return -1;
    if (buf && cap)
        snprintf(buf, cap, "%s", tmp);
    return 1;
}

int rlai_json_find_int(const char *json, size_t len, const char *key, uint64_t *out, int *negative)
{
    char t[24];
    int rc = rlai_json_find_int_text(json, len, key, t, sizeof(t));
    if (rc != 1)
        return rc;
    if (t[0] == '-') {
        *out = (uint64_t)strtoll(t, NULL, 10);
        if (negative)
            *negative = 1;
    } else {
        *out = strtoull(t, NULL, 10);
        if (negative)
            *negative = 0;
    }
    return 1;
}
