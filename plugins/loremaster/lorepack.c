/* lorepack.c - lore pack parsing and system prompt building (see lorepack.h). */
#include "lorepack.h"

#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define LOREPACK_FORMAT "rlai-lore/1"

/* ---- messages ------------------------------------------------------------ */

#if defined(__GNUC__)
__attribute__((format(printf, 5, 6)))
#endif
static int fail(char *err, size_t errlen, int code, const char *source, const char *fmt, ...)
{
    if (err && errlen) {
        int n = snprintf(err, errlen, "%s: ", source ? source : "lore pack");
        if (n < 0)
            n = 0;
        if ((size_t)n < errlen) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
            va_end(ap);
        }
    }
    return code;
}

/* ---- a growing string ---------------------------------------------------- */

typedef struct sbuf {
    char *s;
    size_t len, cap;
    bool oom;
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->s, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->s = p;
        b->cap = cap;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = '\0';
}

static void sb_puts(sbuf *b, const char *s) { sb_add(b, s, strlen(s)); }

/* ---- validation helpers -------------------------------------------------- */

/* True when s is well-formed UTF-8 (no overlongs, surrogates or > U+10FFFF). */
static bool utf8_ok(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        unsigned c = *p;
        int n;
        unsigned min;
        if (c < 0x80) {
            p++;
            continue;
        } else if ((c & 0xE0) == 0xC0) {
            n = 1, min = 0x80, c &= 0x1F;
        } else if ((c & 0xF0) == 0xE0) {
            n = 2, min = 0x800, c &= 0x0F;
        } else if ((c & 0xF8) == 0xF0) {
            n = 3, min = 0x10000, c &= 0x07;
        } else {
            return false;
        }
        for (int i = 1; i <= n; i++) {
            if ((p[i] & 0xC0) != 0x80)
                return false;
            c = c << 6 | (p[i] & 0x3F);
        }
        if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF))
            return false;
        p += n + 1;
    }
    return true;
}

static bool blank(const char *s)
{
    for (; *s; s++)
        if (*s != ' ' && *s != '\t' && *s != '\n' && *s != '\r')
            return false;
    return true;
}

static bool blank_n(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\n' && s[i] != '\r')
            return false;
    return true;
}

static bool id_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > LOREPACK_MAX_ID)
        return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || *s == '_' || *s == '-'))
            return false;
    return true;
}

/* Checks that every key of obj is in `allowed` (NULL-terminated); keys
 * starting with '_' are comments and always allowed. */
static int check_keys(const cJSON *obj, const char *const *allowed, const char *source,
                      const char *where, char *err, size_t errlen)
{
    for (const cJSON *it = obj->child; it; it = it->next) {
        const char *k = it->string ? it->string : "";
        if (k[0] == '_')
            continue;
        bool ok = false;
        for (int i = 0; allowed[i] && !ok; i++)
            ok = strcmp(k, allowed[i]) == 0;
        if (!ok)
            return fail(err, errlen, RLAI_ERR_FORMAT, source, "%s: unknown key \"%.64s\"", where, k);
    }
    /* cJSON keeps duplicate keys: refuse them, they are always a mistake. */
    for (const cJSON *a = obj->child; a; a = a->next)
        for (const cJSON *b = a->next; b; b = b->next)
            if (a->string && b->string && strcmp(a->string, b->string) == 0)
                return fail(err, errlen, RLAI_ERR_FORMAT, source, "%s: key \"%.64s\" given twice",
                            where, a->string);
    return 0;
}

/* A text field: must be a non-blank string of at most LOREPACK_MAX_STR
 * bytes of UTF-8. *out is borrowed from the JSON (NULL when absent and not
 * required). */
static int get_text(const cJSON *obj, const char *key, bool required, const char *source,
                    const char *where, const char **out, char *err, size_t errlen)
{
    *out = NULL;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v) {
        if (!required)
            return 0;
        return fail(err, errlen, RLAI_ERR_FORMAT, source, "%s: missing \"%s\" (a string)", where, key);
    }
    if (!cJSON_IsString(v) || !v->valuestring)
        return fail(err, errlen, RLAI_ERR_FORMAT, source, "%s: \"%s\" must be a string", where, key);
    if (blank(v->valuestring))
        return fail(err, errlen, RLAI_ERR_FORMAT, source, "%s: \"%s\" is empty", where, key);
    if (strlen(v->valuestring) > LOREPACK_MAX_STR)
        return fail(err, errlen, RLAI_ERR_FORMAT, source, "%s: \"%s\" is longer than %d bytes", where,
                    key, LOREPACK_MAX_STR);
    if (!utf8_ok(v->valuestring))
        return fail(err, errlen, RLAI_ERR_FORMAT, source, "%s: \"%s\" is not valid UTF-8", where, key);
    *out = v->valuestring;
    return 0;
}

/* A list field: a string (one item) or an array of strings, each checked as
 * by get_text. *out is the JSON value (NULL when absent). */
static int get_list(const cJSON *obj, const char *key, const char *source, const char *where,
                    const cJSON **out, char *err, size_t errlen)
{
    *out = NULL;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v)
        return 0;
    if (cJSON_IsString(v)) {
        const char *s;
        int rc = get_text(obj, key, true, source, where, &s, err, errlen);
        if (rc == 0)
            *out = v;
        return rc;
    }
    if (!cJSON_IsArray(v))
        return fail(err, errlen, RLAI_ERR_FORMAT, source, "%s: \"%s\" must be a string or an array of strings",
                    where, key);
    int n = cJSON_GetArraySize(v);
    if (n > LOREPACK_MAX_LIST)
        return fail(err, errlen, RLAI_ERR_FORMAT, source, "%s: \"%s\" has %d items (at most %d)", where, key,
                    n, LOREPACK_MAX_LIST);
    int i = 0;
    for (const cJSON *it = v->child; it; it = it->next, i++) {
        if (!cJSON_IsString(it) || !it->valuestring)
            return fail(err, errlen, RLAI_ERR_FORMAT, source, "%s: \"%s\"[%d] must be a string", where, key, i);
        if (blank(it->valuestring))
            return fail(err, errlen, RLAI_ERR_FORMAT, source, "%s: \"%s\"[%d] is empty", where, key, i);
        if (strlen(it->valuestring) > LOREPACK_MAX_STR)
            return fail(err, errlen, RLAI_ERR_FORMAT, source, "%s: \"%s\"[%d] is longer than %d bytes", where,
                        key, i, LOREPACK_MAX_STR);
        if (!utf8_ok(it->valuestring))
            return fail(err, errlen, RLAI_ERR_FORMAT, source, "%s: \"%s\"[%d] is not valid UTF-8", where, key, i);
    }
    *out = v;
    return 0;
}

/* A list of {name, description} objects (factions, places). */
static int get_entries(const cJSON *obj, const char *key, const char *source, const cJSON **out,
                       char *err, size_t errlen)
{
    static const char *const keys[] = { "name", "description", NULL };
    *out = NULL;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v)
        return 0;
    if (!cJSON_IsArray(v))
        return fail(err, errlen, RLAI_ERR_FORMAT, source,
                    "world: \"%s\" must be an array of {\"name\", \"description\"} objects", key);
    int n = cJSON_GetArraySize(v);
    if (n > LOREPACK_MAX_LIST)
        return fail(err, errlen, RLAI_ERR_FORMAT, source, "world: \"%s\" has %d items (at most %d)", key, n,
                    LOREPACK_MAX_LIST);
    int i = 0;
    for (const cJSON *it = v->child; it; it = it->next, i++) {
        char where[64];
        snprintf(where, sizeof where, "world.%s[%d]", key, i);
        if (!cJSON_IsObject(it))
            return fail(err, errlen, RLAI_ERR_FORMAT, source,
                        "%s must be an object with \"name\" and \"description\"", where);
        const char *s;
        int rc = check_keys(it, keys, source, where, err, errlen);
        if (rc == 0)
            rc = get_text(it, "name", true, source, where, &s, err, errlen);
        if (rc == 0)
            rc = get_text(it, "description", true, source, where, &s, err, errlen);
        if (rc)
            return rc;
    }
    *out = v;
    return 0;
}

static int get_number(const cJSON *obj, const char *key, double lo, double hi, bool lo_open,
                      bool integer, const char *source, const char *where, double *out, bool *have,
                      char *err, size_t errlen)
{
    *have = false;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v)
        return 0;
    if (!cJSON_IsNumber(v))
        return fail(err, errlen, RLAI_ERR_FORMAT, source, "%s: \"%s\" must be a number", where, key);
    double d = v->valuedouble;
    if (integer && d != (double)(long long)d)
        return fail(err, errlen, RLAI_ERR_FORMAT, source, "%s: \"%s\" must be an integer", where, key);
    if (!(lo_open ? d > lo : d >= lo) || !(d <= hi))
        return fail(err, errlen, RLAI_ERR_FORMAT, source, "%s: \"%s\" = %g is outside %c%g, %g]", where, key,
                    d, lo_open ? '(' : '[', lo, hi);
    *out = d;
    *have = true;
    return 0;
}

/* Parses an optional "sampling" object over `base`. */
static int get_sampling(const cJSON *obj, const char *source, const char *where, lore_sampling *io,
                        char *err, size_t errlen)
{
    static const char *const keys[] = { "temperature", "top_p", "repeat_penalty", "max_tokens", NULL };
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, "sampling");
    if (!v)
        return 0;
    char w[96];
    snprintf(w, sizeof w, "%s%ssampling", where, where[0] ? "." : "");
    if (!cJSON_IsObject(v))
        return fail(err, errlen, RLAI_ERR_FORMAT, source, "%s must be an object", w);
    int rc = check_keys(v, keys, source, w, err, errlen);
    double d;
    bool have;
    if (rc == 0 && (rc = get_number(v, "temperature", 0, 2, false, false, source, w, &d, &have, err, errlen)) == 0
        && have)
        io->temperature = (float)d;
    if (rc == 0 && (rc = get_number(v, "top_p", 0, 1, true, false, source, w, &d, &have, err, errlen)) == 0
        && have)
        io->top_p = (float)d;
    if (rc == 0 && (rc = get_number(v, "repeat_penalty", 0.5, 2, false, false, source, w, &d, &have, err,
                                    errlen)) == 0 && have)
        io->repeat_penalty = (float)d;
    if (rc == 0 && (rc = get_number(v, "max_tokens", 1, 4096, false, true, source, w, &d, &have, err,
                                    errlen)) == 0 && have)
        io->max_tokens = (int)d;
    return rc;
}

/* ---- the system prompt --------------------------------------------------- */

static void add_items(sbuf *b, const cJSON *list)
{
    if (cJSON_IsString(list)) {
        sb_puts(b, "- ");
        sb_puts(b, list->valuestring);
        sb_puts(b, "\n");
        return;
    }
    for (const cJSON *it = list->child; it; it = it->next) {
        sb_puts(b, "- ");
        sb_puts(b, it->valuestring);
        sb_puts(b, "\n");
    }
}

static void add_entries(sbuf *b, const char *heading, const cJSON *list)
{
    if (!list || !list->child)
        return;
    sb_puts(b, "\n");
    sb_puts(b, heading);
    sb_puts(b, "\n");
    for (const cJSON *it = list->child; it; it = it->next) {
        sb_puts(b, "- ");
        sb_puts(b, cJSON_GetObjectItemCaseSensitive(it, "name")->valuestring);
        sb_puts(b, ": ");
        sb_puts(b, cJSON_GetObjectItemCaseSensitive(it, "description")->valuestring);
        sb_puts(b, "\n");
    }
}

/* World lore comes first and is the same text for every character of a
 * pack, so the prefix cache shares its KV blocks between them. */
typedef struct pack_world {
    const char *name, *setting;
    const cJSON *factions, *places, *rules;
} pack_world;

static char *build_prompt(const pack_world *w, const cJSON *c)
{
    sbuf b = {0};
    const cJSON *v;
    sb_puts(&b, "This is the world of ");
    sb_puts(&b, w->name);
    sb_puts(&b, ".\n\n");
    sb_puts(&b, w->setting);
    sb_puts(&b, "\n");
    add_entries(&b, "Factions:", w->factions);
    add_entries(&b, "Places:", w->places);

    sb_puts(&b, "\nYou are ");
    sb_puts(&b, cJSON_GetObjectItemCaseSensitive(c, "name")->valuestring);
    if ((v = cJSON_GetObjectItemCaseSensitive(c, "title"))) {
        sb_puts(&b, ", ");
        sb_puts(&b, v->valuestring);
    }
    sb_puts(&b, ".\n");
    sb_puts(&b, cJSON_GetObjectItemCaseSensitive(c, "persona")->valuestring);
    sb_puts(&b, "\n");
    if ((v = cJSON_GetObjectItemCaseSensitive(c, "speaking_style"))) {
        sb_puts(&b, "\nHow you speak: ");
        sb_puts(&b, v->valuestring);
        sb_puts(&b, "\n");
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(c, "knows"))) {
        sb_puts(&b, "\nYou know about:\n");
        add_items(&b, v);
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(c, "knowledge_limits"))) {
        sb_puts(&b, "\nYou know nothing about:\n");
        add_items(&b, v);
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(c, "example_lines"))) {
        sb_puts(&b, "\nThings you might say:\n");
        add_items(&b, v);
    }
    const cJSON *own = cJSON_GetObjectItemCaseSensitive(c, "rules");
    if (w->rules || own) {
        sb_puts(&b, "\nRules:\n");
        if (w->rules)
            add_items(&b, w->rules);
        if (own)
            add_items(&b, own);
    }
    if (b.oom) {
        free(b.s);
        return NULL;
    }
    /* No trailing newline: the chat template adds its own separator. */
    while (b.len && b.s[b.len - 1] == '\n')
        b.s[--b.len] = '\0';
    return b.s;
}

/* ---- the set ------------------------------------------------------------- */

static void char_free(lore_character *c)
{
    free(c->id);
    free(c->name);
    free(c->title);
    free(c->world);
    free(c->source);
    free(c->system_prompt);
    memset(c, 0, sizeof *c);
}

void lorepack_set_init(lorepack_set *s)
{
    if (s)
        memset(s, 0, sizeof *s);
}

void lorepack_set_free(lorepack_set *s)
{
    if (!s)
        return;
    for (int i = 0; i < s->n; i++)
        char_free(&s->chars[i]);
    free(s->chars);
    memset(s, 0, sizeof *s);
}

const lore_character *lorepack_find(const lorepack_set *s, const char *id)
{
    if (!s || !id)
        return NULL;
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->chars[i].id, id) == 0)
            return &s->chars[i];
    return NULL;
}

void lorepack_ids(const lorepack_set *s, char *buf, size_t cap)
{
    if (!buf || cap == 0)
        return;
    buf[0] = '\0';
    size_t len = 0;
    for (int i = 0; s && i < s->n; i++) {
        int n = snprintf(buf + len, cap - len, "%s%s", i ? ", " : "", s->chars[i].id);
        if (n < 0 || (size_t)n >= cap - len) {
            buf[cap - 1] = '\0';
            return;
        }
        len += (size_t)n;
    }
}

/* Truncates the set back to n characters (undo of a failed add). */
static void set_truncate(lorepack_set *s, int n)
{
    while (s->n > n)
        char_free(&s->chars[--s->n]);
}

static int set_reserve(lorepack_set *s, int more)
{
    if (s->n + more <= s->cap)
        return 0;
    int cap = s->cap ? s->cap : 8;
    while (cap < s->n + more)
        cap *= 2;
    lore_character *p = realloc(s->chars, (size_t)cap * sizeof *p);
    if (!p)
        return RLAI_ERR_NOMEM;
    s->chars = p;
    s->cap = cap;
    return 0;
}

static char *dup_or_empty(const char *s)
{
    return strdup(s ? s : "");
}

static void line_col(const char *text, size_t off, int *line, int *col)
{
    *line = 1;
    *col = 1;
    for (size_t i = 0; i < off; i++) {
        if (text[i] == '\n') {
            (*line)++;
            *col = 1;
        } else {
            (*col)++;
        }
    }
}

static int parse_character(lorepack_set *s, const cJSON *c, int idx, int first_of_pack, const pack_world *w,
                           const lore_sampling *pack_sampling, const char *source, char *err, size_t errlen)
{
    static const char *const keys[] = { "id", "name", "title", "persona", "speaking_style", "knows",
                                        "knowledge_limits", "example_lines", "rules", "sampling", NULL };
    char where[96];
    snprintf(where, sizeof where, "characters[%d]", idx);
    if (!cJSON_IsObject(c))
        return fail(err, errlen, RLAI_ERR_FORMAT, source, "%s must be an object", where);
    const char *id, *name, *title, *persona, *style;
    const cJSON *list;
    int rc = get_text(c, "id", true, source, where, &id, err, errlen);
    if (rc)
        return rc;
    if (!id_ok(id))
        return fail(err, errlen, RLAI_ERR_FORMAT, source,
                    "%s: id \"%.64s\" must be 1..%d characters of a-z, 0-9, '_' or '-'", where, id,
                    LOREPACK_MAX_ID);
    snprintf(where, sizeof where, "characters[%d] (\"%s\")", idx, id);
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->chars[i].id, id) == 0) {
            if (i >= first_of_pack)
                return fail(err, errlen, RLAI_ERR_FORMAT, source, "%s: duplicate character id \"%s\"", where, id);
            return fail(err, errlen, RLAI_ERR_FORMAT, source,
                        "%s: duplicate character id \"%s\" (already defined in %s)", where, id, s->chars[i].source);
        }
    if ((rc = check_keys(c, keys, source, where, err, errlen)) ||
        (rc = get_text(c, "name", true, source, where, &name, err, errlen)) ||
        (rc = get_text(c, "title", false, source, where, &title, err, errlen)) ||
        (rc = get_text(c, "persona", true, source, where, &persona, err, errlen)) ||
        (rc = get_text(c, "speaking_style", false, source, where, &style, err, errlen)) ||
        (rc = get_list(c, "knows", source, where, &list, err, errlen)) ||
        (rc = get_list(c, "knowledge_limits", source, where, &list, err, errlen)) ||
        (rc = get_list(c, "example_lines", source, where, &list, err, errlen)) ||
        (rc = get_list(c, "rules", source, where, &list, err, errlen)))
        return rc;
    lore_sampling smp = *pack_sampling;
    if ((rc = get_sampling(c, source, where, &smp, err, errlen)))
        return rc;

    char *prompt = build_prompt(w, c);
    if (!prompt)
        return fail(err, errlen, RLAI_ERR_NOMEM, source, "out of memory");
    if (strlen(prompt) > LOREPACK_MAX_PROMPT) {
        size_t n = strlen(prompt);
        free(prompt);
        return fail(err, errlen, RLAI_ERR_FORMAT, source, "%s: the system prompt is %zu bytes (at most %u)",
                    where, n, LOREPACK_MAX_PROMPT);
    }
    if ((rc = set_reserve(s, 1))) {
        free(prompt);
        return fail(err, errlen, rc, source, "out of memory");
    }
    lore_character *ch = &s->chars[s->n];
    memset(ch, 0, sizeof *ch);
    ch->id = strdup(id);
    ch->name = strdup(name);
    ch->title = dup_or_empty(title);
    ch->world = strdup(w->name);
    ch->source = strdup(source);
    ch->system_prompt = prompt;
    ch->sampling = smp;
    s->n++;
    if (!ch->id || !ch->name || !ch->title || !ch->world || !ch->source)
        return fail(err, errlen, RLAI_ERR_NOMEM, source, "out of memory");
    return 0;
}

static int parse_pack(lorepack_set *s, const cJSON *root, const char *source, char *err, size_t errlen)
{
    static const char *const keys[] = { "format", "world", "rules", "sampling", "characters", NULL };
    static const char *const wkeys[] = { "name", "setting", "factions", "places", NULL };
    if (!cJSON_IsObject(root))
        return fail(err, errlen, RLAI_ERR_FORMAT, source, "a lore pack must be a JSON object");
    int rc = check_keys(root, keys, source, "pack", err, errlen);
    if (rc)
        return rc;
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    if (fmt && (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, LOREPACK_FORMAT) != 0))
        return fail(err, errlen, RLAI_ERR_FORMAT, source, "\"format\" must be \"%s\"", LOREPACK_FORMAT);

    const cJSON *world = cJSON_GetObjectItemCaseSensitive(root, "world");
    if (!world)
        return fail(err, errlen, RLAI_ERR_FORMAT, source, "missing \"world\" (an object)");
    if (!cJSON_IsObject(world))
        return fail(err, errlen, RLAI_ERR_FORMAT, source, "\"world\" must be an object");
    pack_world w = {0};
    if ((rc = check_keys(world, wkeys, source, "world", err, errlen)) ||
        (rc = get_text(world, "name", true, source, "world", &w.name, err, errlen)) ||
        (rc = get_text(world, "setting", true, source, "world", &w.setting, err, errlen)) ||
        (rc = get_entries(world, "factions", source, &w.factions, err, errlen)) ||
        (rc = get_entries(world, "places", source, &w.places, err, errlen)) ||
        (rc = get_list(root, "rules", source, "pack", &w.rules, err, errlen)))
        return rc;
    lore_sampling smp = { -1, -1, -1, -1 };
    if ((rc = get_sampling(root, source, "", &smp, err, errlen)))
        return rc;

    const cJSON *chars = cJSON_GetObjectItemCaseSensitive(root, "characters");
    if (!chars)
        return fail(err, errlen, RLAI_ERR_FORMAT, source, "missing \"characters\" (an array of objects)");
    if (!cJSON_IsArray(chars))
        return fail(err, errlen, RLAI_ERR_FORMAT, source, "\"characters\" must be an array of objects");
    int n = cJSON_GetArraySize(chars);
    if (n == 0)
        return fail(err, errlen, RLAI_ERR_FORMAT, source, "\"characters\" is empty");
    if (s->n + n > LOREPACK_MAX_CHARS)
        return fail(err, errlen, RLAI_ERR_FORMAT, source, "too many characters (at most %d in all)",
                    LOREPACK_MAX_CHARS);
    int first = s->n, i = 0;
    for (const cJSON *c = chars->child; c; c = c->next, i++)
        if ((rc = parse_character(s, c, i, first, &w, &smp, source, err, errlen)))
            return rc;
    return n;
}

int lorepack_add_json(lorepack_set *s, const char *text, size_t len, const char *source, char *err,
                      size_t errlen)
{
    if (!s || (!text && len))
        return fail(err, errlen, RLAI_ERR_INVALID_ARG, source, "invalid argument");
    if (!source)
        source = "lore pack";
    if (len > LOREPACK_MAX_FILE_BYTES)
        return fail(err, errlen, RLAI_ERR_TOO_LARGE, source, "%zu bytes (a pack may have at most %u)", len,
                    LOREPACK_MAX_FILE_BYTES);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text ? text : "", len, &end, false);
    if (!root) {
        size_t off = end && end >= text && end <= text + len ? (size_t)(end - text) : 0;
        int line, col;
        line_col(text ? text : "", off, &line, &col);
        if (len == 0 || blank_n(text, len))
            return fail(err, errlen, RLAI_ERR_FORMAT, source, "empty file (expected a JSON object)");
        return fail(err, errlen, RLAI_ERR_FORMAT, source, "malformed JSON at line %d, column %d", line, col);
    }
    /* Only whitespace may follow the value. */
    for (const char *p = end; p && p < text + len; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            int line, col;
            line_col(text, (size_t)(p - text), &line, &col);
            cJSON_Delete(root);
            return fail(err, errlen, RLAI_ERR_FORMAT, source,
                        "malformed JSON at line %d, column %d (text after the pack)", line, col);
        }
    int before = s->n;
    int rc = parse_pack(s, root, source, err, errlen);
    cJSON_Delete(root);
    if (rc < 0)
        set_truncate(s, before);
    return rc;
}

int lorepack_add_file(lorepack_set *s, const char *path, char *err, size_t errlen)
{
    if (!s || !path)
        return fail(err, errlen, RLAI_ERR_INVALID_ARG, path, "invalid argument");
    FILE *f = fopen(path, "rb");
    if (!f)
        return fail(err, errlen, errno == ENOENT ? RLAI_ERR_NOT_FOUND : RLAI_ERR_IO, path, "cannot open: %s",
                    strerror(errno));
    char *buf = malloc(LOREPACK_MAX_FILE_BYTES + 1);
    if (!buf) {
        fclose(f);
        return fail(err, errlen, RLAI_ERR_NOMEM, path, "out of memory");
    }
    size_t n = fread(buf, 1, LOREPACK_MAX_FILE_BYTES + 1, f);
    bool bad = ferror(f) != 0;
    int e = errno;
    fclose(f);
    int rc;
    if (bad)
        rc = fail(err, errlen, RLAI_ERR_IO, path, "read error: %s", strerror(e));
    else if (n > LOREPACK_MAX_FILE_BYTES)
        rc = fail(err, errlen, RLAI_ERR_TOO_LARGE, path, "larger than %u bytes", LOREPACK_MAX_FILE_BYTES);
    else
        rc = lorepack_add_json(s, buf, n, path, err, errlen);
    free(buf);
    return rc;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static bool ends_with_json(const char *name)
{
    size_t n = strlen(name);
    return n > 5 && name[0] != '.' && strcmp(name + n - 5, ".json") == 0;
}

int lorepack_add_path(lorepack_set *s, const char *path, char *err, size_t errlen)
{
    if (!s || !path || !*path)
        return fail(err, errlen, RLAI_ERR_INVALID_ARG, path, "invalid argument");
    struct stat st;
    if (stat(path, &st) != 0)
        return fail(err, errlen, errno == ENOENT ? RLAI_ERR_NOT_FOUND : RLAI_ERR_IO, path, "%s",
                    strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return lorepack_add_file(s, path, err, errlen);

    DIR *d = opendir(path);
    if (!d)
        return fail(err, errlen, RLAI_ERR_IO, path, "cannot open the folder: %s", strerror(errno));
    char **names = NULL;
    int n = 0, cap = 0, rc = 0;
    struct dirent *de;
    while (rc == 0 && (de = readdir(d)) != NULL) {
        if (!ends_with_json(de->d_name))
            continue;
        if (n == cap) {
            int nc = cap ? cap * 2 : 8;
            char **p = realloc(names, (size_t)nc * sizeof *p);
            if (!p) {
                rc = RLAI_ERR_NOMEM;
                break;
            }
            names = p;
            cap = nc;
        }
        if (!(names[n] = strdup(de->d_name)))
            rc = RLAI_ERR_NOMEM;
        else
            n++;
    }
    closedir(d);
    if (rc == 0 && n == 0)
        rc = fail(err, errlen, RLAI_ERR_NOT_FOUND, path, "no *.json lore packs in this folder");
    else if (rc)
        fail(err, errlen, rc, path, "out of memory");
    if (n > 1)
        qsort(names, (size_t)n, sizeof *names, cmp_str);
    int before = s->n, added = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        size_t len = strlen(path) + strlen(names[i]) + 2;
        char *full = malloc(len);
        if (!full) {
            rc = fail(err, errlen, RLAI_ERR_NOMEM, path, "out of memory");
            break;
        }
        snprintf(full, len, "%s%s%s", path, path[strlen(path) - 1] == '/' ? "" : "/", names[i]);
        st.st_mode = 0;
        if (stat(full, &st) == 0 && S_ISREG(st.st_mode)) {
            int r = lorepack_add_file(s, full, err, errlen);
            if (r < 0)
                rc = r;
            else
                added += r;
        }
        free(full);
    }
    for (int i = 0; i < n; i++)
        free(names[i]);
    free(names);
    if (rc < 0) {
        set_truncate(s, before);
        return rc;
    }
    return added;
}
