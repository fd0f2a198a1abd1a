/* chat.c - chat prompt formatting (see chat.h).
 *
 * Formats produced (content of Llama-3 and Gemma turns is trimmed of ASCII
 * whitespace at both ends, as their templates' `| trim` does; ChatML content
 * is verbatim):
 *
 *   ChatML:  "<|im_start|>{role}\n{content}<|im_end|>\n" per message,
 *            generation prompt "<|im_start|>assistant\n".
 *   Llama-3: "<|begin_of_text|>" once, then per message
 *            "<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>",
 *            generation prompt "<|start_header_id|>assistant<|end_header_id|>\n\n".
 *            The text therefore already starts with BOS: the engine must
 *            not add another BOS when tokenizing it.
 *   Gemma:   "<start_of_turn>{user|model}\n{content}<end_of_turn>\n", generation
 *            prompt "<start_of_turn>model\n". No "<bos>" is emitted (the
 *            tokenizer's add_bos adds it). Gemma has no system role: system
 *            text is prepended, followed by "\n\n", to the next turn; if no
 *            turn follows, it becomes a user turn of its own.
 *
 * default_system (any style) is used as a leading system message when the
 * conversation is non-empty and its first message is not a system message.
 * A NULL content is treated as "". */
#include "chat.h"

#include <stdlib.h>
#include <string.h>

#include "rlai/strbuf.h"

/* ---- small helpers ------------------------------------------------------- */

static const char *find_bytes(const char *h, size_t hlen, const char *n, size_t nlen)
{
    if (nlen == 0)
        return h;
    if (!h || hlen < nlen)
        return NULL;
    for (size_t i = 0; i + nlen <= hlen; i++)
        if (h[i] == n[0] && memcmp(h + i, n, nlen) == 0)
            return h + i;
    return NULL;
}

static bool contains(const char *h, size_t hlen, const char *n)
{
    return find_bytes(h, hlen, n, strlen(n)) != NULL;
}

typedef struct sbuf {
    rlai_strbuf t;         /* the text */
    /* Optional segment list (rlai_chat_render): each appended span is
     * recorded as template text or message content; adjacent spans of the
     * same kind are merged. */
    bool track;
    bool content_mode;     /* kind of what sb_add appends now */
    rlai_chat_seg *segs;
    int n_segs, cap_segs;
} sbuf;

static void sb_note(sbuf *b, size_t off, size_t n)
{
    if (!b->track || n == 0 || b->t.oom)
        return;
    if (b->n_segs > 0) {
        rlai_chat_seg *l = &b->segs[b->n_segs - 1];
        if (l->content == b->content_mode && l->off + l->len == off) {
            l->len += n;
            return;
        }
    }
    if (b->n_segs == b->cap_segs) {
        int cap = b->cap_segs ? b->cap_segs * 2 : 16;
        rlai_chat_seg *s = realloc(b->segs, sizeof(*s) * (size_t)cap);
        if (!s) {
            b->t.oom = true;
            return;
        }
        b->segs = s;
        b->cap_segs = cap;
    }
    b->segs[b->n_segs++] = (rlai_chat_seg){ off, n, b->content_mode };
}

static void sb_add(sbuf *b, const char *s, size_t n)
{
    size_t off = b->t.len;
    if (rlai_strbuf_add(&b->t, s, n) == 0)
        sb_note(b, off, n);
}

static void sb_str(sbuf *b, const char *s)
{
    sb_add(b, s, strlen(s));
}

/* Appends message content (never parsed for special tokens). */
static void sb_content(sbuf *b, const char *s, size_t n)
{
    bool was = b->content_mode;
    b->content_mode = true;
    sb_add(b, s, n);
    b->content_mode = was;
}

static bool is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* Appends s trimmed of ASCII whitespace at both ends. */
static void sb_trimmed(sbuf *b, const char *s)
{
    size_t n = strlen(s);
    size_t a = 0;
    while (a < n && is_ws(s[a]))
        a++;
    while (n > a && is_ws(s[n - 1]))
        n--;
    sb_content(b, s + a, n - a);
}

/* ---- detection ----------------------------------------------------------- */

/* Reads tmpl[0..len) (caller-owned, need not be NUL-terminated). Llama-3 is
 * checked first, then Gemma; anything else is ChatML. */
rlai_chat_style rlai_chat_detect(const char *tmpl, size_t len)
{
    if (!tmpl || len == 0)
        return RLAI_CHAT_CHATML;
    if (contains(tmpl, len, "<|start_header_id|>"))
        return RLAI_CHAT_LLAMA3;
    if (contains(tmpl, len, "<start_of_turn>"))
        return RLAI_CHAT_GEMMA;
    return RLAI_CHAT_CHATML; /* "<|im_start|>" or unknown */
}

/* Static string; "unknown" for values outside the enum. */
const char *rlai_chat_style_name(rlai_chat_style s)
{
    switch (s) {
    case RLAI_CHAT_CHATML: return "chatml";
    case RLAI_CHAT_LLAMA3: return "llama3";
    case RLAI_CHAT_GEMMA: return "gemma";
    }
    return "unknown";
}

/* ---- default system prompt ----------------------------------------------- */

/* Tries to parse a quoted literal starting right after `q` (the opening
 * quote character) at text[pos..] that reads "<|im_start|>system" NEWLINE
 * {content} "<|im_end|>" with no closing quote before <|im_end|>. NEWLINE is
 * a real newline or a backslash-n escape. Returns the unescaped content or
 * NULL. */
static char *parse_system_literal(const char *t, size_t len, size_t pos, char q)
{
    static const char head[] = "<|im_start|>system";
    static const char end[] = "<|im_end|>";
    const size_t hl = sizeof(head) - 1, el = sizeof(end) - 1;
    if (len - pos < hl || memcmp(t + pos, head, hl) != 0)
        return NULL;
    pos += hl;
    if (pos < len && t[pos] == '\n')
        pos += 1;
    else if (pos + 1 < len && t[pos] == '\\' && t[pos + 1] == 'n')
        pos += 2;
    else
        return NULL;

    sbuf b = {0};
    sb_add(&b, "", 0);
    while (pos < len) {
        if (len - pos >= el && memcmp(t + pos, end, el) == 0) {
            if (b.t.oom) {
                free(b.t.p);
                return NULL;
            }
            return b.t.p;
        }
        char c = t[pos];
        if (c == q)
            break; /* literal closes before <|im_end|>: not this shape */
        if (c == '\\') {
            if (pos + 1 >= len)
                break;
            char e = t[pos + 1];
            char o;
            switch (e) {
            case 'n': o = '\n'; break;
            case 't': o = '\t'; break;
            case 'r': o = '\r'; break;
            default: o = e; break; /* \\ \' \" and anything else */
            }
            sb_add(&b, &o, 1);
            pos += 2;
            continue;
        }
        sb_add(&b, &c, 1);
        pos++;
    }
    free(b.t.p);
    return NULL;
}

/* Reads tmpl[0..len) (caller-owned). Finds the first quoted literal
 * '<|im_start|>system\n{text}<|im_end|>' (either quote; \n as an escape or a
 * real newline; \n \t \r \\ \' \" escapes in {text} are decoded) and
 * returns {text} malloc'd (caller frees), or NULL if there is none or memory
 * runs out. */
char *rlai_chat_default_system(const char *tmpl, size_t len)
{
    if (!tmpl || len == 0)
        return NULL;
    for (size_t i = 0; i + 1 < len; i++) {
        if (tmpl[i] != '\'' && tmpl[i] != '"')
            continue;
        if (tmpl[i + 1] != '<')
            continue;
        char *r = parse_system_literal(tmpl, len, i + 1, tmpl[i]);
        if (r)
            return r;
    }
    return NULL;
}

/* ---- formatting ---------------------------------------------------------- */

static bool role_ok(rlai_chat_style style, const char *role)
{
    if (!role)
        return false;
    if (!strcmp(role, "system") || !strcmp(role, "user") || !strcmp(role, "assistant"))
        return true;
    return style == RLAI_CHAT_CHATML && !strcmp(role, "tool");
}

static const char *content_of(const rlai_chat_message *m)
{
    return m->content ? m->content : "";
}

static void fmt_chatml(sbuf *b, const char *def_sys, const rlai_chat_message *m, int n,
                       bool gen)
{
    if (def_sys) {
        sb_str(b, "<|im_start|>system\n");
        sb_content(b, def_sys, strlen(def_sys));
        sb_str(b, "<|im_end|>\n");
    }
    for (int i = 0; i < n; i++) {
        sb_str(b, "<|im_start|>");
        sb_str(b, m[i].role);
        sb_str(b, "\n");
        sb_content(b, content_of(&m[i]), strlen(content_of(&m[i])));
        sb_str(b, "<|im_end|>\n");
    }
    if (gen)
        sb_str(b, "<|im_start|>assistant\n");
}

static void llama3_turn(sbuf *b, const char *role, const char *content)
{
    sb_str(b, "<|start_header_id|>");
    sb_str(b, role);
    sb_str(b, "<|end_header_id|>\n\n");
    sb_trimmed(b, content);
    sb_str(b, "<|eot_id|>");
}

static void fmt_llama3(sbuf *b, const char *def_sys, const rlai_chat_message *m, int n,
                       bool gen)
{
    sb_str(b, "<|begin_of_text|>");
    if (def_sys)
        llama3_turn(b, "system", def_sys);
    for (int i = 0; i < n; i++)
        llama3_turn(b, m[i].role, content_of(&m[i]));
    if (gen)
        sb_str(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

static void fmt_gemma(sbuf *b, const char *def_sys, const rlai_chat_message *m, int n,
                      bool gen)
{
    sbuf pending = {0}; /* system text waiting for the next turn */
    bool have_pending = false;
    if (def_sys) {
        sb_str(&pending, def_sys);
        have_pending = true;
    }
    for (int i = 0; i < n; i++) {
        const char *c = content_of(&m[i]);
        if (!strcmp(m[i].role, "system")) {
            if (have_pending)
                sb_str(&pending, "\n\n");
            sb_str(&pending, c);
            have_pending = true;
            continue;
        }
        sb_str(b, "<start_of_turn>");
        sb_str(b, !strcmp(m[i].role, "assistant") ? "model" : "user");
        sb_str(b, "\n");
        if (have_pending) {
            sb_content(b, pending.t.p ? pending.t.p : "", pending.t.len);
            sb_content(b, "\n\n", 2);
            pending.t.len = 0;
            have_pending = false;
        }
        sb_trimmed(b, c);
        sb_str(b, "<end_of_turn>\n");
    }
    if (have_pending) {
        sb_str(b, "<start_of_turn>user\n");
        sb_content(b, pending.t.p ? pending.t.p : "", pending.t.len);
        sb_str(b, "<end_of_turn>\n");
    }
    if (pending.t.oom)
        b->t.oom = true;
    free(pending.t.p);
    if (gen)
        sb_str(b, "<start_of_turn>model\n");
}

static int render(rlai_chat_style style, const char *default_system, const rlai_chat_message *msgs, int n,
                  bool add_generation_prompt, bool track, char **out, rlai_chat_seg **segs, int *n_segs)
{
    if (!out)
        return RLAI_ERR_INVALID_ARG;
    *out = NULL;
    if (track) {
        if (!segs || !n_segs)
            return RLAI_ERR_INVALID_ARG;
        *segs = NULL;
        *n_segs = 0;
    }
    if (n < 0 || (n > 0 && !msgs))
        return RLAI_ERR_INVALID_ARG;
    if (style != RLAI_CHAT_CHATML && style != RLAI_CHAT_LLAMA3 && style != RLAI_CHAT_GEMMA)
        return RLAI_ERR_INVALID_ARG;
    for (int i = 0; i < n; i++)
        if (!role_ok(style, msgs[i].role))
            return RLAI_ERR_INVALID_ARG;

    const char *def_sys = NULL;
    if (default_system && n > 0 && strcmp(msgs[0].role, "system") != 0)
        def_sys = default_system;

    sbuf b = {0};
    b.track = track;
    sb_add(&b, "", 0);
    switch (style) {
    case RLAI_CHAT_CHATML: fmt_chatml(&b, def_sys, msgs, n, add_generation_prompt); break;
    case RLAI_CHAT_LLAMA3: fmt_llama3(&b, def_sys, msgs, n, add_generation_prompt); break;
    case RLAI_CHAT_GEMMA: fmt_gemma(&b, def_sys, msgs, n, add_generation_prompt); break;
    }
    if (b.t.oom) {
        free(b.t.p);
        free(b.segs);
        return RLAI_ERR_NOMEM;
    }
    *out = b.t.p;
    if (track) {
        *segs = b.segs;
        *n_segs = b.n_segs;
    }
    return RLAI_OK;
}

/* On success *out is a malloc'd string the caller frees; on failure *out is
 * NULL (if out is non-NULL) and a negative code is returned. */
int rlai_chat_format(rlai_chat_style style, const char *default_system,
                     const rlai_chat_message *msgs, int n, bool add_generation_prompt,
                     char **out)
{
    return render(style, default_system, msgs, n, add_generation_prompt, false, out, NULL, NULL);
}

/* As rlai_chat_format; *segs (malloc'd, caller frees) additionally covers
 * the text with spans of template text and message content. */
int rlai_chat_render(rlai_chat_style style, const char *default_system,
                     const rlai_chat_message *msgs, int n, bool add_generation_prompt,
                     char **out, rlai_chat_seg **segs, int *n_segs)
{
    return render(style, default_system, msgs, n, add_generation_prompt, true, out, segs, n_segs);
}
