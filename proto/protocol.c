/* proto/protocol.c - RTX-LocalAI wire protocol codec (proto/PROTOCOL.md).
 *
 * Decoding is two passes:
 *  1. a bounded walker of our own checks the whole frame before msgpack-c
 *     sees it: well-formed, nothing truncated, every declared str/bin/ext
 *     length and array/map count fits in the bytes left (so msgpack-c's
 *     zone never allocates for elements that are not there), nesting
 *     bounded, no trailing bytes. It also notes where the top-level "v",
 *     "id", "type" and "data" values lie, so an error can name the request
 *     and a result keeps its data bytes exactly as received;
 *  2. msgpack_unpack_next builds the object tree, from which the fields of
 *     the message type are checked and copied.
 * Encoding goes through a msgpack_packer writing into the caller's rlai_buf,
 * fields in the order of the spec, after the same checks the decoder makes
 * (so whatever we encode, we decode).
 */
#include "rlai/protocol.h"

#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

/* Short names: hello.client, chat role, call command, done.stop, error.name. */
#define PROTO_MAX_NAME 256u

/* ------------------------------------------------------------------ names */

const char *rlai_proto_code_name(int code)
{
    return rlai_wire_code_name(code);
}

static const char *const type_names[] = {
    [RLAI_MSG_HELLO] = "hello",       [RLAI_MSG_GENERATE] = "generate",
    [RLAI_MSG_CHAT] = "chat",         [RLAI_MSG_CALL] = "call",
    [RLAI_MSG_CANCEL] = "cancel",     [RLAI_MSG_COMMANDS] = "commands",
    [RLAI_MSG_STATS] = "stats",       [RLAI_MSG_TOKENIZE] = "tokenize",
    [RLAI_MSG_TOKEN] = "token",       [RLAI_MSG_RESULT] = "result",
    [RLAI_MSG_DONE] = "done",         [RLAI_MSG_ERROR] = "error",
};
#define N_TYPES ((int)(sizeof type_names / sizeof type_names[0]))

const char *rlai_msg_type_name(rlai_msg_type t)
{
    if ((int)t <= RLAI_MSG_INVALID || (int)t >= N_TYPES) return NULL;
    return type_names[t];
}

static rlai_msg_type type_from_name(const char *s, size_t n)
{
    for (int t = 1; t < N_TYPES; t++)
        if (strlen(type_names[t]) == n && memcmp(type_names[t], s, n) == 0)
            return (rlai_msg_type)t;
    return RLAI_MSG_INVALID;
}

/* -------------------------------------------------------------- rlai_buf */

void rlai_buf_init(rlai_buf *b)
{
    if (!b) return;
    b->data = NULL;
    b->len = b->cap = 0;
}

void rlai_buf_free(rlai_buf *b)
{
    if (!b) return;
    free(b->data);
    rlai_buf_init(b);
}

void rlai_buf_reset(rlai_buf *b)
{
    if (b) b->len = 0;
}

static int buf_append(rlai_buf *b, const void *p, size_t n)
{
    if (n == 0) return 0;
    if (n > SIZE_MAX - b->len) return -1;
    size_t need = b->len + n;
    if (need > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < need) {
            if (cap > SIZE_MAX / 2) { cap = need; break; }
            cap *= 2;
        }
        unsigned char *d = realloc(b->data, cap);
        if (!d) return -1;
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
    return 0;
}

/* ------------------------------------------------------------------ UTF-8 */

/* Length of the valid UTF-8 sequence at s[i] (i < n), or 0. Strict: no
 * overlong forms, no surrogates, nothing above U+10FFFF; and no U+0000,
 * since the C API hands strings out NUL-terminated. */
static size_t utf8_seq(const unsigned char *s, size_t n, size_t i)
{
    unsigned c = s[i];
    if (c == 0) return 0;
    if (c < 0x80) return 1;
    size_t k;
    uint32_t cp, min;
    if ((c & 0xE0) == 0xC0) { k = 1; cp = c & 0x1F; min = 0x80; }
    else if ((c & 0xF0) == 0xE0) { k = 2; cp = c & 0x0F; min = 0x800; }
    else if ((c & 0xF8) == 0xF0) { k = 3; cp = c & 0x07; min = 0x10000; }
    else return 0;
    if (n - i - 1 < k) return 0;
    for (size_t j = 1; j <= k; j++) {
        unsigned cc = s[i + j];
        if ((cc & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (cc & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return k + 1;
}

static bool utf8_valid(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        size_t k = utf8_seq(s, n, i);
        if (!k) return false;
        i += k;
    }
    return true;
}

/* ----------------------------------------------------------------- errors */

typedef struct dctx {
    char *err;
    size_t errlen;
} dctx;

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static int fail(dctx *c, int code, const char *fmt, ...)
{
    if (c->err && c->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->err, c->errlen, fmt, ap);
        va_end(ap);
    }
    return -code;
}

/* ---------------------------------------------------------- frame walker */

enum mp_kind { K_NIL, K_BOOL, K_UINT, K_NINT, K_FLOAT, K_STR, K_BIN, K_EXT, K_ARRAY, K_MAP };

typedef struct mp_hdr {
    enum mp_kind kind;
    uint64_t u;       /* K_UINT value */
    uint64_t n;       /* payload bytes (str/bin/ext) or items (array: n, map: 2n) */
    size_t body;      /* payload offset (str/bin/ext) */
} mp_hdr;

typedef struct mp_rd {
    const unsigned char *p;
    size_t len, pos;
} mp_rd;

enum { MP_OK = 0, MP_TRUNC, MP_RESERVED, MP_COUNT };

static uint64_t be_read(const unsigned char *p, unsigned n)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++) v = (v << 8) | p[i];
    return v;
}

/* Reads the header at r->pos and steps over it (and over the payload of a
 * str/bin/ext; container items follow). Rejects anything that would not
 * fit in the bytes left. */
static int mp_next(mp_rd *r, mp_hdr *h)
{
    size_t rem = r->len - r->pos;
    if (rem < 1) return MP_TRUNC;
    const unsigned char *p = r->p + r->pos;
    unsigned c = p[0];
    unsigned lb = 0;      /* big-endian length/value bytes after the tag */
    size_t hl = 1;        /* header length */
    memset(h, 0, sizeof *h);

    if (c <= 0x7f) { h->kind = K_UINT; h->u = c; }
    else if (c <= 0x8f) { h->kind = K_MAP; h->n = c & 0x0f; }
    else if (c <= 0x9f) { h->kind = K_ARRAY; h->n = c & 0x0f; }
    else if (c <= 0xbf) { h->kind = K_STR; h->n = c & 0x1f; }
    else if (c >= 0xe0) { h->kind = K_NINT; }
    else {
        switch (c) {
        case 0xc0: h->kind = K_NIL; break;
        case 0xc1: return MP_RESERVED;
        case 0xc2: case 0xc3: h->kind = K_BOOL; break;
        case 0xc4: case 0xc5: case 0xc6: h->kind = K_BIN; lb = 1u << (c - 0xc4); break;
        case 0xc7: case 0xc8: case 0xc9: h->kind = K_EXT; lb = 1u << (c - 0xc7); hl = 1; break;
        case 0xca: h->kind = K_FLOAT; hl = 5; break;
        case 0xcb: h->kind = K_FLOAT; hl = 9; break;
        case 0xcc: case 0xcd: case 0xce: case 0xcf: h->kind = K_UINT; lb = 1u << (c - 0xcc); break;
        case 0xd0: case 0xd1: case 0xd2: case 0xd3: h->kind = K_NINT; lb = 1u << (c - 0xd0); break;
        case 0xd4: case 0xd5: case 0xd6: case 0xd7: case 0xd8:
            h->kind = K_EXT; h->n = 1u << (c - 0xd4); hl = 2; break;
        case 0xd9: case 0xda: case 0xdb: h->kind = K_STR; lb = 1u << (c - 0xd9); break;
        case 0xdc: case 0xdd: h->kind = K_ARRAY; lb = c == 0xdc ? 2 : 4; break;
        default: /* 0xde 0xdf */ h->kind = K_MAP; lb = c == 0xde ? 2 : 4; break;
        }
    }
    hl += lb;
    if (h->kind == K_EXT && lb) hl += 1;   /* ext8/16/32: type byte */
    if (rem < hl) return MP_TRUNC;
    if (lb) {
        uint64_t v = be_read(p + 1, lb);
        if (h->kind == K_UINT) h->u = v;
        else if (h->kind == K_NINT) {
            /* sign-extend; a non-negative signed int counts as unsigned */
            int64_t s = (int64_t)(v << (64 - 8 * lb)) >> (64 - 8 * lb);
            if (s >= 0) { h->kind = K_UINT; h->u = (uint64_t)s; }
        } else h->n = v;
    }
    r->pos += hl;
    rem -= hl;
    switch (h->kind) {
    case K_STR: case K_BIN: case K_EXT:
        if (h->n > rem) return MP_TRUNC;
        h->body = r->pos;
        r->pos += (size_t)h->n;
        break;
    case K_ARRAY:
        if (h->n > rem) return MP_COUNT;        /* every element takes >= 1 byte */
        break;
    case K_MAP:
        if (h->n > rem / 2) return MP_COUNT;    /* every pair takes >= 2 bytes */
        h->n *= 2;
        break;
    default:
        break;
    }
    return MP_OK;
}

/* Skips `items` values of any depth without a stack. */
static int skip_flat(mp_rd *r, uint64_t items)
{
    while (items) {
        items--;
        mp_hdr h;
        int e = mp_next(r, &h);
        if (e) return e;
        if (h.kind == K_ARRAY || h.kind == K_MAP) items += h.n;
    }
    return MP_OK;
}

/* Skips one value; containers may nest max_depth levels (a scalar is
 * depth 0, [] depth 1). Deeper values are stepped over and flagged. */
static int skip_value(mp_rd *r, int max_depth, bool *too_deep)
{
    uint64_t stack[RLAI_PROTO_MAX_DEPTH + 1];
    int d = 0;
    stack[0] = 1;
    for (;;) {
        while (d >= 0 && stack[d] == 0) d--;
        if (d < 0) return MP_OK;
        stack[d]--;
        mp_hdr h;
        int e = mp_next(r, &h);
        if (e) return e;
        if (h.kind != K_ARRAY && h.kind != K_MAP) continue;
        if (d + 1 > max_depth) {
            *too_deep = true;
            e = skip_flat(r, h.n);
            if (e) return e;
        } else if (h.n) {
            stack[++d] = h.n;
        }
    }
}

typedef struct span {
    size_t off, len;
    bool set;
} span;

typedef struct frame_spans {
    span v, id, type, data;
} frame_spans;

static bool key_is(const unsigned char *p, size_t len, size_t off, const char *name)
{
    mp_rd kr = {p, len, off};
    mp_hdr kh;
    if (mp_next(&kr, &kh) != MP_OK || kh.kind != K_STR) return false;
    size_t n = strlen(name);
    return kh.n == n && memcmp(p + kh.body, name, n) == 0;
}

static int walk_fail(dctx *c, int e, size_t at)
{
    switch (e) {
    case MP_RESERVED:
        return fail(c, RLAI_PE_BAD_FRAME, "invalid msgpack: reserved byte 0xc1 at offset %zu", at);
    case MP_COUNT:
        return fail(c, RLAI_PE_BAD_FRAME,
                    "invalid msgpack: array/map at offset %zu declares more elements than the frame holds", at);
    default:
        return fail(c, RLAI_PE_BAD_FRAME, "truncated msgpack: value at offset %zu runs past the end", at);
    }
}

static int scan_frame(const unsigned char *p, size_t len, frame_spans *sp, dctx *c)
{
    mp_rd r = {p, len, 0};
    mp_hdr h;
    int e = mp_next(&r, &h);
    if (e) return walk_fail(c, e, 0);
    if (h.kind != K_MAP) return fail(c, RLAI_PE_BAD_FRAME, "a message must be a msgpack map");
    bool too_deep = false;
    for (uint64_t i = 0; i < h.n / 2; i++) {
        size_t ks = r.pos;
        e = skip_value(&r, RLAI_PROTO_MAX_DEPTH, &too_deep);
        if (e) return walk_fail(c, e, r.pos);
        size_t vs = r.pos;
        e = skip_value(&r, RLAI_PROTO_MAX_DEPTH, &too_deep);
        if (e) return walk_fail(c, e, r.pos);
        span s = {vs, r.pos - vs, true};
        if (!sp->v.set && key_is(p, len, ks, "v")) sp->v = s;
        else if (!sp->id.set && key_is(p, len, ks, "id")) sp->id = s;
        else if (!sp->type.set && key_is(p, len, ks, "type")) sp->type = s;
        else if (!sp->data.set && key_is(p, len, ks, "data")) sp->data = s;
    }
    if (r.pos != len)
        return fail(c, RLAI_PE_BAD_FRAME, "%zu trailing bytes after the message", len - r.pos);
    if (too_deep)
        return fail(c, RLAI_PE_TOO_LARGE, "a field nests arrays/maps deeper than %d levels",
                    RLAI_PROTO_MAX_DEPTH);
    return 0;
}

/* A top-level value read straight from the frame (for v/id/type, which must
 * be available even when the rest of the frame is rejected). */
static bool raw_uint(const unsigned char *p, size_t len, span s, uint64_t *out)
{
    if (!s.set) return false;
    mp_rd r = {p, len, s.off};
    mp_hdr h;
    if (mp_next(&r, &h) != MP_OK || h.kind != K_UINT) return false;
    *out = h.u;
    return true;
}

static bool raw_str(const unsigned char *p, size_t len, span s, const char **str, size_t *n)
{
    if (!s.set) return false;
    mp_rd r = {p, len, s.off};
    mp_hdr h;
    if (mp_next(&r, &h) != MP_OK || h.kind != K_STR) return false;
    *str = (const char *)p + h.body;
    *n = (size_t)h.n;
    return true;
}

/* ------------------------------------------------------- field decoding */

enum fid {
    F_V, F_ID, F_TYPE,
    F_CLIENT, F_PROMPT, F_MESSAGES, F_COMMAND, F_PARAMS, F_TARGET,
    F_TEXT, F_ADD_SPECIAL, F_PARSE_SPECIAL, F_TOKENS, F_DATA, F_STOP, F_METRICS,
    F_CODE, F_NAME, F_MSG,
    F_MAX_TOKENS, F_TEMPERATURE, F_TOP_K, F_TOP_P, F_MIN_P, F_REPEAT_PENALTY,
    F_PRESENCE_PENALTY, F_FREQUENCY_PENALTY, F_SEED, F_IGNORE_EOS, F_TIMEOUT_MS,
    F_SPEC, F_SPEC_MAX_DRAFT, F_TOP_LOGPROBS, F_RESPONSE_FORMAT, F_MODEL, F_ROUTE, F_PROMPT_LOGPROBS,
    F_LOGIT_BIAS, F_PREDICTION, F_COUNT
};

static const char *const field_names[F_COUNT] = {
    "v", "id", "type",
    "client", "prompt", "messages", "command", "params", "target",
    "text", "add_special", "parse_special", "tokens", "data", "stop", "metrics",
    "code", "name", "msg",
    "max_tokens", "temperature", "top_k", "top_p", "min_p", "repeat_penalty",
    "presence_penalty", "frequency_penalty", "seed", "ignore_eos", "timeout_ms",
    "spec", "spec_max_draft", "top_logprobs", "response_format", "model", "route", "prompt_logprobs",
    "logit_bias", "prediction",
};

#define FB(f) (UINT64_C(1) << (f))
#define GEN_FIELDS (FB(F_MAX_TOKENS) | FB(F_TEMPERATURE) | FB(F_TOP_K) | FB(F_TOP_P) | \
                    FB(F_MIN_P) | FB(F_REPEAT_PENALTY) | FB(F_PRESENCE_PENALTY) |     \
                    FB(F_FREQUENCY_PENALTY) | FB(F_SEED) | FB(F_IGNORE_EOS) | FB(F_TIMEOUT_MS) | \
                    FB(F_SPEC) | FB(F_SPEC_MAX_DRAFT) | FB(F_TOP_LOGPROBS) | FB(F_STOP) | \
                    FB(F_RESPONSE_FORMAT) | FB(F_MODEL) | FB(F_ROUTE) | FB(F_PROMPT_LOGPROBS) | \
                    FB(F_LOGIT_BIAS) | FB(F_PREDICTION))

static uint64_t type_fields(rlai_msg_type t)
{
    uint64_t f = FB(F_V) | FB(F_ID) | FB(F_TYPE);
    switch (t) {
    case RLAI_MSG_HELLO: return f | FB(F_CLIENT);
    case RLAI_MSG_GENERATE: return f | FB(F_PROMPT) | GEN_FIELDS;
    case RLAI_MSG_CHAT: return f | FB(F_MESSAGES) | GEN_FIELDS;
    case RLAI_MSG_CALL: return f | FB(F_COMMAND) | FB(F_PARAMS) | FB(F_TIMEOUT_MS);
    case RLAI_MSG_CANCEL: return f | FB(F_TARGET);
    case RLAI_MSG_TOKENIZE: return f | FB(F_TEXT) | FB(F_ADD_SPECIAL) | FB(F_PARSE_SPECIAL);
    case RLAI_MSG_TOKEN: return f | FB(F_TEXT) | FB(F_TOKENS);
    case RLAI_MSG_RESULT: return f | FB(F_DATA);
    case RLAI_MSG_DONE: return f | FB(F_STOP) | FB(F_METRICS);
    case RLAI_MSG_ERROR: return f | FB(F_CODE) | FB(F_NAME) | FB(F_MSG);
    default: return f;
    }
}

static bool obj_key_is(const msgpack_object *k, const char *name)
{
    size_t n = strlen(name);
    return k->type == MSGPACK_OBJECT_STR && k->via.str.size == n &&
           memcmp(k->via.str.ptr, name, n) == 0;
}

/* An optional field: absent or nil means unset. */
static const msgpack_object *opt(const msgpack_object *o)
{
    return (o && o->type != MSGPACK_OBJECT_NIL) ? o : NULL;
}

static const char *obj_type_name(const msgpack_object *o)
{
    switch (o->type) {
    case MSGPACK_OBJECT_NIL: return "nil";
    case MSGPACK_OBJECT_BOOLEAN: return "bool";
    case MSGPACK_OBJECT_POSITIVE_INTEGER: case MSGPACK_OBJECT_NEGATIVE_INTEGER: return "int";
    case MSGPACK_OBJECT_FLOAT32: case MSGPACK_OBJECT_FLOAT64: return "float";
    case MSGPACK_OBJECT_STR: return "str";
    case MSGPACK_OBJECT_ARRAY: return "array";
    case MSGPACK_OBJECT_MAP: return "map";
    case MSGPACK_OBJECT_BIN: return "bin";
    case MSGPACK_OBJECT_EXT: return "ext";
    default: return "?";
    }
}

/* A str field: max bytes, optionally non-empty, valid UTF-8; copied with a
 * terminating NUL. o == NULL means a missing required field. */
static int get_str(dctx *c, const msgpack_object *o, const char *name, size_t max,
                   bool nonempty, char **out)
{
    if (!o) return fail(c, RLAI_PE_BAD_REQUEST, "missing field '%s' (str)", name);
    if (o->type != MSGPACK_OBJECT_STR)
        return fail(c, RLAI_PE_BAD_REQUEST, "field '%s' must be a str, not %s", name, obj_type_name(o));
    size_t n = o->via.str.size;
    if (n > max)
        return fail(c, RLAI_PE_TOO_LARGE, "field '%s' is %zu bytes, over the limit of %zu", name, n, max);
    if (nonempty && n == 0) return fail(c, RLAI_PE_BAD_REQUEST, "field '%s' must not be empty", name);
    if (!utf8_valid((const unsigned char *)o->via.str.ptr, n))
        return fail(c, RLAI_PE_BAD_REQUEST, "field '%s' is not valid UTF-8 (or contains NUL)", name);
    char *s = malloc(n + 1);
    if (!s) return fail(c, RLAI_PE_INTERNAL, "out of memory");
    if (n) memcpy(s, o->via.str.ptr, n);
    s[n] = '\0';
    *out = s;
    return 0;
}

static int get_u64(dctx *c, const msgpack_object *o, const char *name, uint64_t max, uint64_t *out)
{
    if (!o) return fail(c, RLAI_PE_BAD_REQUEST, "missing field '%s' (uint)", name);
    if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
        return fail(c, RLAI_PE_BAD_REQUEST, "field '%s' must be a non-negative int, not %s%s", name,
                    o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER ? "negative " : "", obj_type_name(o));
    if (o->via.u64 > max)
        return fail(c, RLAI_PE_BAD_REQUEST, "field '%s' is out of range (max %llu)", name,
                    (unsigned long long)max);
    *out = o->via.u64;
    return 0;
}

static int get_i32(dctx *c, const msgpack_object *o, const char *name, int32_t min, int32_t max,
                   int32_t *out)
{
    if (!o) return fail(c, RLAI_PE_BAD_REQUEST, "missing field '%s' (int)", name);
    int64_t v = 0;
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        if (o->via.u64 > (uint64_t)INT64_MAX) goto range;
        v = (int64_t)o->via.u64;
    } else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        v = o->via.i64;
    } else {
        return fail(c, RLAI_PE_BAD_REQUEST, "field '%s' must be an int, not %s", name, obj_type_name(o));
    }
    if (v < min || v > max) goto range;
    *out = (int32_t)v;
    return 0;
range:
    return fail(c, RLAI_PE_BAD_REQUEST, "field '%s' is out of range [%ld, %ld]", name, (long)min,
                (long)max);
}

static int get_num(dctx *c, const msgpack_object *o, const char *name, double *out)
{
    switch (o->type) {
    case MSGPACK_OBJECT_FLOAT32: case MSGPACK_OBJECT_FLOAT64: *out = o->via.f64; return 0;
    case MSGPACK_OBJECT_POSITIVE_INTEGER: *out = (double)o->via.u64; return 0;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: *out = (double)o->via.i64; return 0;
    default:
        return fail(c, RLAI_PE_BAD_REQUEST, "field '%s' must be a float, not %s", name, obj_type_name(o));
    }
}

/* Sampling values: finite and within [lo, hi] (both within float range). */
static bool samp_ok(double v, double lo, double hi)
{
    return isfinite(v) && v >= lo && v <= hi;
}

static int get_samp(dctx *c, const msgpack_object *o, const char *name, double lo, double hi,
                    float *out, bool *has)
{
    double v = 0;
    int rc = get_num(c, o, name, &v);
    if (rc) return rc;
    if (!samp_ok(v, lo, hi)) {
        if (!isfinite(v)) return fail(c, RLAI_PE_BAD_REQUEST, "field '%s' must be finite", name);
        return fail(c, RLAI_PE_BAD_REQUEST, "field '%s' is out of range [%g, %g]", name, lo, hi);
    }
    *out = (float)v;
    *has = true;
    return 0;
}

static int get_bool(dctx *c, const msgpack_object *o, const char *name, bool *out)
{
    if (o->type != MSGPACK_OBJECT_BOOLEAN)
        return fail(c, RLAI_PE_BAD_REQUEST, "field '%s' must be a bool, not %s", name, obj_type_name(o));
    *out = o->via.boolean;
    return 0;
}

/* Sampling ranges shared by decoder and encoder checks. */
#define R_TEMPERATURE 0.0, (double)FLT_MAX
#define R_PROB 0.0, 1.0
#define R_REPEAT 0.0, (double)FLT_MAX
#define R_SIGNED (double)-FLT_MAX, (double)FLT_MAX

/* "logit_bias": a map of token id (uint, or a str of decimal digits as in
 * OpenAI's JSON) to bias (a number in -100..100). */
static int decode_logit_bias(dctx *c, const msgpack_object *o, rlai_msg_gen *g)
{
    if (o->type != MSGPACK_OBJECT_MAP)
        return fail(c, RLAI_PE_BAD_REQUEST, "field 'logit_bias' must be a map of token id to bias, not %s",
                    obj_type_name(o));
    uint32_t n = o->via.map.size;
    if (n > RLAI_PROTO_MAX_LOGIT_BIAS)
        return fail(c, RLAI_PE_TOO_LARGE, "%u logit_bias entries, over the limit of %d", (unsigned)n,
                    RLAI_PROTO_MAX_LOGIT_BIAS);
    if (!n)
        return 0;
    if (!(g->logit_bias = calloc(n, sizeof *g->logit_bias)))
        return fail(c, RLAI_PE_INTERNAL, "out of memory");
    g->n_logit_bias = n;
    for (uint32_t i = 0; i < n; i++) {
        const msgpack_object *k = &o->via.map.ptr[i].key, *v = &o->via.map.ptr[i].val;
        uint64_t id = 0;
        bool ok = false;
        if (k->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
            id = k->via.u64;
            ok = true;
        } else if (k->type == MSGPACK_OBJECT_STR && k->via.str.size > 0 && k->via.str.size <= 10) {
            ok = true;
            for (uint32_t j = 0; ok && j < k->via.str.size; j++) {
                char ch = k->via.str.ptr[j];
                ok = ch >= '0' && ch <= '9';
                id = id * 10 + (uint64_t)(ch - '0');
            }
        }
        if (!ok || id > INT32_MAX)
            return fail(c, RLAI_PE_BAD_REQUEST, "'logit_bias' keys must be token ids (uint, or a str of digits)");
        double b;
        if (v->type == MSGPACK_OBJECT_FLOAT32 || v->type == MSGPACK_OBJECT_FLOAT64)
            b = v->via.f64;
        else if (v->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
            b = v->via.u64 > 1000 ? 1000 : (double)v->via.u64;
        else if (v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
            b = v->via.i64 < -1000 ? -1000 : (double)v->via.i64;
        else
            return fail(c, RLAI_PE_BAD_REQUEST, "'logit_bias' of token %u must be a number, not %s", (unsigned)id,
                        obj_type_name(v));
        if (!(b >= -100.0 && b <= 100.0))
            return fail(c, RLAI_PE_BAD_REQUEST, "'logit_bias' of token %u must be in -100..100", (unsigned)id);
        g->logit_bias[i] = (rlai_msg_logit_bias){ (int32_t)id, (float)b };
    }
    return 0;
}

static int decode_gen(dctx *c, const msgpack_object *const *f, rlai_msg_gen *g)
{
    const msgpack_object *o;
    int rc = 0;
    if ((o = opt(f[F_MAX_TOKENS]))) {
        if ((rc = get_i32(c, o, "max_tokens", 0, INT32_MAX, &g->max_tokens))) return rc;
        g->has_max_tokens = true;
    }
    if ((o = opt(f[F_TEMPERATURE])) &&
        (rc = get_samp(c, o, "temperature", R_TEMPERATURE, &g->temperature, &g->has_temperature)))
        return rc;
    if ((o = opt(f[F_TOP_K]))) {
        if ((rc = get_i32(c, o, "top_k", 0, INT32_MAX, &g->top_k))) return rc;
        g->has_top_k = true;
    }
    if ((o = opt(f[F_TOP_P])) && (rc = get_samp(c, o, "top_p", R_PROB, &g->top_p, &g->has_top_p)))
        return rc;
    if ((o = opt(f[F_MIN_P])) && (rc = get_samp(c, o, "min_p", R_PROB, &g->min_p, &g->has_min_p)))
        return rc;
    if ((o = opt(f[F_REPEAT_PENALTY])) &&
        (rc = get_samp(c, o, "repeat_penalty", R_REPEAT, &g->repeat_penalty, &g->has_repeat_penalty)))
        return rc;
    if ((o = opt(f[F_PRESENCE_PENALTY])) &&
        (rc = get_samp(c, o, "presence_penalty", R_SIGNED, &g->presence_penalty,
                       &g->has_presence_penalty)))
        return rc;
    if ((o = opt(f[F_FREQUENCY_PENALTY])) &&
        (rc = get_samp(c, o, "frequency_penalty", R_SIGNED, &g->frequency_penalty,
                       &g->has_frequency_penalty)))
        return rc;
    if ((o = opt(f[F_SEED]))) {
        if ((rc = get_u64(c, o, "seed", UINT64_MAX, &g->seed))) return rc;
        g->has_seed = true;
    }
    if ((o = opt(f[F_IGNORE_EOS])) && (rc = get_bool(c, o, "ignore_eos", &g->ignore_eos))) return rc;
    if ((o = opt(f[F_TIMEOUT_MS]))) {
        uint64_t v = 0;
        if ((rc = get_u64(c, o, "timeout_ms", UINT32_MAX, &v))) return rc;
        g->timeout_ms = (uint32_t)v;
        g->has_timeout_ms = true;
    }
    if ((o = opt(f[F_SPEC]))) {
        if (o->type != MSGPACK_OBJECT_STR)
            return fail(c, RLAI_PE_BAD_REQUEST, "field 'spec' must be a str (off|ngram|draft|auto), not %s",
                        obj_type_name(o));
        if (obj_key_is(o, "auto"))
            g->spec = RLAI_MSG_SPEC_AUTO;
        else if (obj_key_is(o, "off"))
            g->spec = RLAI_MSG_SPEC_OFF;
        else if (obj_key_is(o, "ngram"))
            g->spec = RLAI_MSG_SPEC_NGRAM;
        else if (obj_key_is(o, "draft"))
            g->spec = RLAI_MSG_SPEC_DRAFT;
        else if (obj_key_is(o, "self"))
            return fail(c, RLAI_PE_BAD_REQUEST,
                        "field 'spec': self-speculative drafting is not implemented "
                        "(use off, ngram, draft or auto)");
        else
            return fail(c, RLAI_PE_BAD_REQUEST, "field 'spec' must be one of off, ngram, draft, auto");
        g->has_spec = true;
    }
    if ((o = opt(f[F_SPEC_MAX_DRAFT]))) {
        uint64_t v = 0;
        if ((rc = get_u64(c, o, "spec_max_draft", RLAI_PROTO_MAX_DRAFT, &v))) return rc;
        if (v == 0) return fail(c, RLAI_PE_BAD_REQUEST, "field 'spec_max_draft' must be at least 1");
        g->spec_max_draft = (uint32_t)v;
        g->has_spec_max_draft = true;
    }
    if ((o = opt(f[F_TOP_LOGPROBS]))) {
        uint64_t v = 0;
        if ((rc = get_u64(c, o, "top_logprobs", RLAI_PROTO_MAX_TOP_LOGPROBS, &v))) return rc;
        g->top_logprobs = (uint32_t)v;
        g->has_top_logprobs = true;
    }
    if ((o = opt(f[F_RESPONSE_FORMAT])) &&
        (rc = get_str(c, o, "response_format", RLAI_PROTO_MAX_STR, false, &g->response_format)))
        return rc;
    if ((o = opt(f[F_MODEL])) && (rc = get_str(c, o, "model", RLAI_PROTO_MAX_MODEL_NAME, false, &g->model)))
        return rc;
    if ((o = opt(f[F_ROUTE])) && (rc = get_str(c, o, "route", RLAI_PROTO_MAX_MODEL_NAME, false, &g->route)))
        return rc;
    if ((o = opt(f[F_PROMPT_LOGPROBS]))) {
        if ((rc = get_bool(c, o, "prompt_logprobs", &g->prompt_logprobs))) return rc;
        if (g->prompt_logprobs && !g->has_top_logprobs)
            return fail(c, RLAI_PE_BAD_REQUEST, "field 'prompt_logprobs' needs 'top_logprobs' (0..%d)",
                        RLAI_PROTO_MAX_TOP_LOGPROBS);
    }
    if ((o = opt(f[F_LOGIT_BIAS])) && (rc = decode_logit_bias(c, o, g)))
        return rc;
    if ((o = opt(f[F_PREDICTION])) &&
        (rc = get_str(c, o, "prediction", RLAI_PROTO_MAX_STR, false, &g->prediction)))
        return rc;
    if ((o = opt(f[F_STOP]))) {
        if (o->type != MSGPACK_OBJECT_ARRAY)
            return fail(c, RLAI_PE_BAD_REQUEST, "field 'stop' must be an array of str, not %s",
                        obj_type_name(o));
        uint32_t n = o->via.array.size;
        if (n > RLAI_PROTO_MAX_STOPS)
            return fail(c, RLAI_PE_TOO_LARGE, "%u stop strings, over the limit of %d", (unsigned)n,
                        RLAI_PROTO_MAX_STOPS);
        if (n) {
            g->stop = calloc(n, sizeof *g->stop);
            if (!g->stop) return fail(c, RLAI_PE_INTERNAL, "out of memory");
            g->n_stop = n;
            for (uint32_t i = 0; i < n; i++)
                if ((rc = get_str(c, &o->via.array.ptr[i], "stop[]", RLAI_PROTO_MAX_STOP_LEN, true,
                                  &g->stop[i])))
                    return rc;
        }
    }
    return 0;
}

static int decode_messages(dctx *c, const msgpack_object *o, rlai_msg *m)
{
    if (!o) return fail(c, RLAI_PE_BAD_REQUEST, "missing field 'messages' (array)");
    if (o->type != MSGPACK_OBJECT_ARRAY)
        return fail(c, RLAI_PE_BAD_REQUEST, "field 'messages' must be an array, not %s", obj_type_name(o));
    uint32_t n = o->via.array.size;
    if (n == 0) return fail(c, RLAI_PE_BAD_REQUEST, "field 'messages' must not be empty");
    if (n > RLAI_PROTO_MAX_MESSAGES)
        return fail(c, RLAI_PE_TOO_LARGE, "%u chat messages, over the limit of %d", (unsigned)n,
                    RLAI_PROTO_MAX_MESSAGES);
    m->u.chat.messages = calloc(n, sizeof *m->u.chat.messages);
    if (!m->u.chat.messages) return fail(c, RLAI_PE_INTERNAL, "out of memory");
    m->u.chat.n_messages = n;
    for (uint32_t i = 0; i < n; i++) {
        const msgpack_object *e = &o->via.array.ptr[i];
        if (e->type != MSGPACK_OBJECT_MAP)
            return fail(c, RLAI_PE_BAD_REQUEST, "messages[%u] must be a map, not %s", (unsigned)i,
                        obj_type_name(e));
        const msgpack_object *role = NULL, *content = NULL;
        for (uint32_t k = 0; k < e->via.map.size; k++) {
            const msgpack_object_kv *kv = &e->via.map.ptr[k];
            const msgpack_object **slot = obj_key_is(&kv->key, "role")      ? &role
                                          : obj_key_is(&kv->key, "content") ? &content
                                                                            : NULL;
            if (!slot) continue;
            if (*slot)
                return fail(c, RLAI_PE_BAD_REQUEST, "messages[%u] repeats a field", (unsigned)i);
            *slot = &kv->val;
        }
        int rc;
        if ((rc = get_str(c, role, "messages[].role", PROTO_MAX_NAME, true, &m->u.chat.messages[i].role)))
            return rc;
        if ((rc = get_str(c, content, "messages[].content", RLAI_PROTO_MAX_STR, false,
                          &m->u.chat.messages[i].content)))
            return rc;
    }
    return 0;
}

static int decode_metrics(dctx *c, const msgpack_object *o, rlai_msg_metrics *mt)
{
    if (o->type != MSGPACK_OBJECT_MAP)
        return fail(c, RLAI_PE_BAD_REQUEST, "field 'metrics' must be a map, not %s", obj_type_name(o));
    enum { N_METRICS = 9 };
    static const char *const names[N_METRICS] = {"queue_ms", "ttft_ms", "prefill_tps", "decode_tps",
                                                 "prompt_tokens", "gen_tokens", "reused_tokens",
                                                 "drafted_tokens", "accepted_tokens"};
    double *dv[4] = {&mt->queue_ms, &mt->ttft_ms, &mt->prefill_tps, &mt->decode_tps};
    uint32_t *uv[N_METRICS - 4] = {&mt->prompt_tokens, &mt->gen_tokens, &mt->reused_tokens,
                                   &mt->drafted_tokens, &mt->accepted_tokens};
    unsigned seen = 0;
    for (uint32_t k = 0; k < o->via.map.size; k++) {
        const msgpack_object_kv *kv = &o->via.map.ptr[k];
        if (obj_key_is(&kv->key, "where")) {          /* where it ran (docs/REMOTE.md) */
            if (seen & (1u << N_METRICS))
                return fail(c, RLAI_PE_BAD_REQUEST, "metrics repeats field 'where'");
            seen |= 1u << N_METRICS;
            char *w = NULL;
            int rc = get_str(c, &kv->val, "where", RLAI_PROTO_MAX_WHERE, false, &w);
            if (rc) return rc;
            snprintf(mt->where, sizeof mt->where, "%s", w);
            free(w);
            continue;
        }
        for (int j = 0; j < N_METRICS; j++) {
            if (!obj_key_is(&kv->key, names[j])) continue;
            if (seen & (1u << j))
                return fail(c, RLAI_PE_BAD_REQUEST, "metrics repeats field '%s'", names[j]);
            seen |= 1u << j;
            int rc;
            if (j < 4) {
                rc = get_num(c, &kv->val, names[j], dv[j]);
            } else {
                uint64_t v = 0;
                rc = get_u64(c, &kv->val, names[j], UINT32_MAX, &v);
                *uv[j - 4] = (uint32_t)v;
            }
            if (rc) return rc;
            break;
        }
    }
    return 0;
}

static int decode_fields(dctx *c, const unsigned char *buf, const frame_spans *sp,
                         const msgpack_object *map, rlai_msg *m)
{
    const msgpack_object *f[F_COUNT] = {0};
    uint64_t allowed = type_fields(m->type);
    for (uint32_t i = 0; i < map->via.map.size; i++) {
        const msgpack_object_kv *kv = &map->via.map.ptr[i];
        if (kv->key.type != MSGPACK_OBJECT_STR) continue;
        for (int j = 0; j < F_COUNT; j++) {
            if (!(allowed & FB(j)) || !obj_key_is(&kv->key, field_names[j])) continue;
            if (f[j]) return fail(c, RLAI_PE_BAD_REQUEST, "field '%s' appears twice", field_names[j]);
            f[j] = &kv->val;
            break;
        }
    }

    const msgpack_object *o;
    int rc = 0;
    switch (m->type) {
    case RLAI_MSG_HELLO:
        if ((o = opt(f[F_CLIENT]))) rc = get_str(c, o, "client", PROTO_MAX_NAME, false, &m->u.hello.client);
        return rc;
    case RLAI_MSG_GENERATE:
        if ((rc = get_str(c, f[F_PROMPT], "prompt", RLAI_PROTO_MAX_STR, false, &m->u.generate.prompt)))
            return rc;
        return decode_gen(c, f, &m->u.generate.gen);
    case RLAI_MSG_CHAT:
        if ((rc = decode_messages(c, f[F_MESSAGES], m))) return rc;
        return decode_gen(c, f, &m->u.chat.gen);
    case RLAI_MSG_CALL:
        if ((rc = get_str(c, f[F_COMMAND], "command", PROTO_MAX_NAME, true, &m->u.call.command)))
            return rc;
        if ((o = opt(f[F_PARAMS])))
            rc = get_str(c, o, "params", RLAI_PROTO_MAX_STR, false, &m->u.call.params_json);
        if (!rc && (o = opt(f[F_TIMEOUT_MS]))) {
            uint64_t t = 0;
            rc = get_u64(c, o, "timeout_ms", RLAI_PROTO_MAX_CALL_TIMEOUT_MS, &t);
            m->u.call.timeout_ms = (uint32_t)t;
        }
        return rc;
    case RLAI_MSG_CANCEL:
        return get_u64(c, f[F_TARGET], "target", UINT64_MAX, &m->u.cancel.target);
    case RLAI_MSG_COMMANDS:
    case RLAI_MSG_STATS:
        return 0;
    case RLAI_MSG_TOKENIZE:
        m->u.tokenize.add_special = true;
        m->u.tokenize.parse_special = false;
        if ((rc = get_str(c, f[F_TEXT], "text", RLAI_PROTO_MAX_STR, false, &m->u.tokenize.text)))
            return rc;
        if ((o = opt(f[F_ADD_SPECIAL])) && (rc = get_bool(c, o, "add_special", &m->u.tokenize.add_special)))
            return rc;
        if ((o = opt(f[F_PARSE_SPECIAL])) &&
            (rc = get_bool(c, o, "parse_special", &m->u.tokenize.parse_special)))
            return rc;
        return 0;
    case RLAI_MSG_TOKEN: {
        if ((rc = get_str(c, f[F_TEXT], "text", RLAI_PROTO_MAX_STR, false, &m->u.token.text))) return rc;
        o = f[F_TOKENS];
        if (!o) return fail(c, RLAI_PE_BAD_REQUEST, "missing field 'tokens' (array of int)");
        if (o->type != MSGPACK_OBJECT_ARRAY)
            return fail(c, RLAI_PE_BAD_REQUEST, "field 'tokens' must be an array, not %s", obj_type_name(o));
        uint32_t n = o->via.array.size;
        if (n > RLAI_PROTO_MAX_TOKENS_ARRAY)
            return fail(c, RLAI_PE_TOO_LARGE, "%u token ids, over the limit of %d", (unsigned)n,
                        RLAI_PROTO_MAX_TOKENS_ARRAY);
        if (n) {
            m->u.token.tokens = malloc(n * sizeof *m->u.token.tokens);
            if (!m->u.token.tokens) return fail(c, RLAI_PE_INTERNAL, "out of memory");
            m->u.token.n_tokens = n;
            for (uint32_t i = 0; i < n; i++)
                if ((rc = get_i32(c, &o->via.array.ptr[i], "tokens[]", INT32_MIN, INT32_MAX,
                                  &m->u.token.tokens[i])))
                    return rc;
        }
        return 0;
    }
    case RLAI_MSG_RESULT: {
        if (!f[F_DATA] || !sp->data.set) return fail(c, RLAI_PE_BAD_REQUEST, "missing field 'data'");
        size_t n = sp->data.len;
        m->u.result.data = malloc(n);
        if (!m->u.result.data) return fail(c, RLAI_PE_INTERNAL, "out of memory");
        memcpy(m->u.result.data, buf + sp->data.off, n);
        m->u.result.len = n;
        return 0;
    }
    case RLAI_MSG_DONE:
        if ((rc = get_str(c, f[F_STOP], "stop", PROTO_MAX_NAME, false, &m->u.done.stop))) return rc;
        if ((o = opt(f[F_METRICS]))) {
            if ((rc = decode_metrics(c, o, &m->u.done.metrics))) return rc;
            m->u.done.has_metrics = true;
        }
        return 0;
    case RLAI_MSG_ERROR:
        if ((rc = get_i32(c, f[F_CODE], "code", 1, INT32_MAX, &m->u.error.code))) return rc;
        if ((rc = get_str(c, f[F_NAME], "name", PROTO_MAX_NAME, false, &m->u.error.name))) return rc;
        return get_str(c, f[F_MSG], "msg", RLAI_PROTO_MAX_STR, false, &m->u.error.msg);
    default:
        return fail(c, RLAI_PE_INTERNAL, "unhandled type");
    }
}

/* Printable prefix of an unknown type name for error messages. */
static void printable(char *dst, size_t cap, const char *s, size_t n)
{
    size_t j = 0;
    for (size_t i = 0; i < n && j + 1 < cap; i++)
        dst[j++] = (s[i] >= 0x20 && s[i] < 0x7f) ? s[i] : '?';
    if (j + 1 < cap && n > j) {
        /* truncated: mark it */
        if (j >= 3) dst[j - 1] = dst[j - 2] = dst[j - 3] = '.';
    }
    dst[j] = '\0';
}

static int decode(const unsigned char *p, size_t len, rlai_msg *out, dctx *c)
{
    if (!p || len == 0) return fail(c, RLAI_PE_BAD_FRAME, "empty frame");
    if (len > RLAI_PROTO_MAX_FRAME)
        return fail(c, RLAI_PE_TOO_LARGE, "frame of %zu bytes, over the limit of %u", len,
                    (unsigned)RLAI_PROTO_MAX_FRAME);

    frame_spans sp;
    memset(&sp, 0, sizeof sp);
    int rc = scan_frame(p, len, &sp, c);

    /* id, type and version, as far as they can be read, even on failure. */
    uint64_t v = 0, id = 0;
    const char *ts = NULL;
    size_t tn = 0;
    bool have_v = raw_uint(p, len, sp.v, &v);
    bool have_id = raw_uint(p, len, sp.id, &id);
    bool have_t = raw_str(p, len, sp.type, &ts, &tn);
    if (have_id) out->id = id;
    if (have_t) out->type = type_from_name(ts, tn);
    if (have_v && v <= UINT32_MAX) out->version = (uint32_t)v;
    if (rc) return rc;

    if (!sp.v.set) return fail(c, RLAI_PE_BAD_VERSION, "missing field 'v' (protocol version)");
    if (!have_v || v != RLAI_PROTO_VERSION)
        return fail(c, RLAI_PE_BAD_VERSION, "unsupported protocol version (this side speaks v=%d)",
                    RLAI_PROTO_VERSION);
    if (!sp.id.set) return fail(c, RLAI_PE_BAD_REQUEST, "missing field 'id' (uint64)");
    if (!have_id) return fail(c, RLAI_PE_BAD_REQUEST, "field 'id' must be a uint64");
    if (!sp.type.set) return fail(c, RLAI_PE_BAD_REQUEST, "missing field 'type' (str)");
    if (!have_t) return fail(c, RLAI_PE_BAD_REQUEST, "field 'type' must be a str");
    if (out->type == RLAI_MSG_INVALID) {
        char name[40];
        printable(name, sizeof name, ts, tn);
        return fail(c, RLAI_PE_BAD_REQUEST, "unknown message type '%s'", name);
    }

    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    msgpack_unpack_return ur = msgpack_unpack_next(&up, (const char *)p, len, &off);
    if (ur == MSGPACK_UNPACK_NOMEM_ERROR) {
        rc = fail(c, RLAI_PE_INTERNAL, "out of memory decoding msgpack");
    } else if ((ur != MSGPACK_UNPACK_SUCCESS && ur != MSGPACK_UNPACK_EXTRA_BYTES) || off != len ||
               up.data.type != MSGPACK_OBJECT_MAP) {
        rc = fail(c, RLAI_PE_BAD_FRAME, "msgpack-c rejected the frame");
    } else {
        rc = decode_fields(c, p, &sp, &up.data, out);
    }
    msgpack_unpacked_destroy(&up);
    return rc;
}

int rlai_proto_decode(const void *buf, size_t len, rlai_msg *out, char *err, size_t errlen)
{
    dctx c = {err, errlen};
    if (err && errlen) err[0] = '\0';
    if (!out) return fail(&c, RLAI_PE_INTERNAL, "no output message");
    memset(out, 0, sizeof *out);
    int rc = decode(buf, len, out, &c);
    if (rc) {
        rlai_msg_type t = out->type;
        uint64_t id = out->id;
        uint32_t v = out->version;
        rlai_msg_free(out);
        memset(out, 0, sizeof *out);
        out->type = t;
        out->id = id;
        out->version = v;
        if (err && errlen && !err[0]) snprintf(err, errlen, "%s", rlai_proto_code_name(-rc));
    }
    return rc;
}

/* ------------------------------------------------------------------ free */

static void gen_free(rlai_msg_gen *g)
{
    if (g->stop)
        for (uint32_t i = 0; i < g->n_stop; i++) free(g->stop[i]);
    free(g->stop);
    free(g->response_format);
    free(g->model);
    free(g->route);
    free(g->logit_bias);
    free(g->prediction);
}

void rlai_msg_free(rlai_msg *m)
{
    if (!m) return;
    switch (m->type) {
    case RLAI_MSG_HELLO: free(m->u.hello.client); break;
    case RLAI_MSG_GENERATE:
        free(m->u.generate.prompt);
        gen_free(&m->u.generate.gen);
        break;
    case RLAI_MSG_CHAT:
        if (m->u.chat.messages)
            for (uint32_t i = 0; i < m->u.chat.n_messages; i++) {
                free(m->u.chat.messages[i].role);
                free(m->u.chat.messages[i].content);
            }
        free(m->u.chat.messages);
        gen_free(&m->u.chat.gen);
        break;
    case RLAI_MSG_CALL:
        free(m->u.call.command);
        free(m->u.call.params_json);
        break;
    case RLAI_MSG_TOKENIZE: free(m->u.tokenize.text); break;
    case RLAI_MSG_TOKEN:
        free(m->u.token.text);
        free(m->u.token.tokens);
        break;
    case RLAI_MSG_RESULT: free(m->u.result.data); break;
    case RLAI_MSG_DONE: free(m->u.done.stop); break;
    case RLAI_MSG_ERROR:
        free(m->u.error.name);
        free(m->u.error.msg);
        break;
    default: break;
    }
    memset(&m->u, 0, sizeof m->u);
}

/* --------------------------------------------------------------- encoding */

static int check_str(const char *s, size_t n, size_t max, bool nonempty)
{
    if (!s) return -RLAI_PE_BAD_REQUEST;
    if (n > max) return -RLAI_PE_TOO_LARGE;
    if (nonempty && n == 0) return -RLAI_PE_BAD_REQUEST;
    if (!utf8_valid((const unsigned char *)s, n)) return -RLAI_PE_BAD_REQUEST;
    return 0;
}

static int check_cstr(const char *s, size_t max, bool nonempty)
{
    return s ? check_str(s, strlen(s), max, nonempty) : -RLAI_PE_BAD_REQUEST;
}

/* A single well-formed msgpack value with bounded nesting. */
static int check_value(const void *data, size_t len)
{
    if (!data || len == 0) return -RLAI_PE_BAD_REQUEST;
    if (len > RLAI_PROTO_MAX_FRAME) return -RLAI_PE_TOO_LARGE;
    mp_rd r = {data, len, 0};
    bool too_deep = false;
    if (skip_value(&r, RLAI_PROTO_MAX_DEPTH, &too_deep) != MP_OK || r.pos != len)
        return -RLAI_PE_BAD_REQUEST;
    return too_deep ? -RLAI_PE_TOO_LARGE : 0;
}

static int check_gen(const rlai_msg_gen *g)
{
    if ((g->has_max_tokens && g->max_tokens < 0) || (g->has_top_k && g->top_k < 0))
        return -RLAI_PE_BAD_REQUEST;
    if ((g->has_temperature && !samp_ok(g->temperature, R_TEMPERATURE)) ||
        (g->has_top_p && !samp_ok(g->top_p, R_PROB)) || (g->has_min_p && !samp_ok(g->min_p, R_PROB)) ||
        (g->has_repeat_penalty && !samp_ok(g->repeat_penalty, R_REPEAT)) ||
        (g->has_presence_penalty && !samp_ok(g->presence_penalty, R_SIGNED)) ||
        (g->has_frequency_penalty && !samp_ok(g->frequency_penalty, R_SIGNED)))
        return -RLAI_PE_BAD_REQUEST;
    if (g->n_stop > RLAI_PROTO_MAX_STOPS) return -RLAI_PE_TOO_LARGE;
    if (g->n_stop && !g->stop) return -RLAI_PE_BAD_REQUEST;
    if (g->response_format) {
        int rc = check_cstr(g->response_format, RLAI_PROTO_MAX_STR, false);
        if (rc) return rc;
    }
    if (g->model) {
        int rc = check_cstr(g->model, RLAI_PROTO_MAX_MODEL_NAME, false);
        if (rc) return rc;
    }
    if (g->route) {
        int rc = check_cstr(g->route, RLAI_PROTO_MAX_MODEL_NAME, false);
        if (rc) return rc;
    }
    if (g->prediction) {
        int rc = check_cstr(g->prediction, RLAI_PROTO_MAX_STR, false);
        if (rc) return rc;
    }
    for (uint32_t i = 0; i < g->n_stop; i++) {
        int rc = check_cstr(g->stop[i], RLAI_PROTO_MAX_STOP_LEN, true);
        if (rc) return rc;
    }
    if (g->n_logit_bias > RLAI_PROTO_MAX_LOGIT_BIAS) return -RLAI_PE_TOO_LARGE;
    if (g->n_logit_bias && !g->logit_bias) return -RLAI_PE_BAD_REQUEST;
    for (uint32_t i = 0; i < g->n_logit_bias; i++)
        if (g->logit_bias[i].token < 0 || !(g->logit_bias[i].bias >= -100.0f && g->logit_bias[i].bias <= 100.0f))
            return -RLAI_PE_BAD_REQUEST;
    return 0;
}

static int check_msg(const rlai_msg *m)
{
    int rc = 0;
    switch (m->type) {
    case RLAI_MSG_HELLO:
        return m->u.hello.client ? check_cstr(m->u.hello.client, PROTO_MAX_NAME, false) : 0;
    case RLAI_MSG_GENERATE:
        if ((rc = check_cstr(m->u.generate.prompt, RLAI_PROTO_MAX_STR, false))) return rc;
        return check_gen(&m->u.generate.gen);
    case RLAI_MSG_CHAT:
        if (m->u.chat.n_messages == 0 || !m->u.chat.messages) return -RLAI_PE_BAD_REQUEST;
        if (m->u.chat.n_messages > RLAI_PROTO_MAX_MESSAGES) return -RLAI_PE_TOO_LARGE;
        for (uint32_t i = 0; i < m->u.chat.n_messages; i++) {
            if ((rc = check_cstr(m->u.chat.messages[i].role, PROTO_MAX_NAME, true))) return rc;
            if ((rc = check_cstr(m->u.chat.messages[i].content, RLAI_PROTO_MAX_STR, false))) return rc;
        }
        return check_gen(&m->u.chat.gen);
    case RLAI_MSG_CALL:
        if ((rc = check_cstr(m->u.call.command, PROTO_MAX_NAME, true))) return rc;
        return m->u.call.params_json ? check_cstr(m->u.call.params_json, RLAI_PROTO_MAX_STR, false) : 0;
    case RLAI_MSG_CANCEL: case RLAI_MSG_COMMANDS: case RLAI_MSG_STATS:
        return 0;
    case RLAI_MSG_TOKENIZE:
        return check_cstr(m->u.tokenize.text, RLAI_PROTO_MAX_STR, false);
    case RLAI_MSG_TOKEN:
        if (m->u.token.n_tokens > RLAI_PROTO_MAX_TOKENS_ARRAY) return -RLAI_PE_TOO_LARGE;
        if (m->u.token.n_tokens && !m->u.token.tokens) return -RLAI_PE_BAD_REQUEST;
        return m->u.token.text ? check_cstr(m->u.token.text, RLAI_PROTO_MAX_STR, false) : 0;
    case RLAI_MSG_RESULT:
        return check_value(m->u.result.data, m->u.result.len);
    case RLAI_MSG_DONE:
        return m->u.done.stop ? check_cstr(m->u.done.stop, PROTO_MAX_NAME, false) : 0;
    case RLAI_MSG_ERROR:
        if (m->u.error.code < 1) return -RLAI_PE_BAD_REQUEST;
        if (m->u.error.name && (rc = check_cstr(m->u.error.name, PROTO_MAX_NAME, false))) return rc;
        return m->u.error.msg ? check_cstr(m->u.error.msg, RLAI_PROTO_MAX_STR, false) : 0;
    default:
        return -RLAI_PE_BAD_REQUEST;
    }
}

typedef struct wctx {
    rlai_buf *b;
    bool failed;
} wctx;

static int wr_cb(void *data, const char *buf, size_t len)
{
    wctx *w = data;
    if (w->failed || buf_append(w->b, buf, len)) {
        w->failed = true;
        return -1;
    }
    return 0;
}

typedef struct enc {
    msgpack_packer pk;
    wctx w;
    size_t start;
} enc;

static void enc_begin(enc *e, rlai_buf *out)
{
    e->w.b = out;
    e->w.failed = false;
    e->start = out->len;
    msgpack_packer_init(&e->pk, &e->w, wr_cb);
}

/* Finishes: on failure or an oversized frame, out is left as it was. */
static int enc_end(enc *e)
{
    int rc = 0;
    if (e->w.failed) rc = -RLAI_PE_INTERNAL;
    else if (e->w.b->len - e->start > RLAI_PROTO_MAX_FRAME) rc = -RLAI_PE_TOO_LARGE;
    if (rc) e->w.b->len = e->start;
    return rc;
}

static void p_str(enc *e, const char *s, size_t n)
{
    msgpack_pack_str(&e->pk, n);
    msgpack_pack_str_body(&e->pk, s, n);
}

static void p_key(enc *e, const char *k)
{
    p_str(e, k, strlen(k));
}

static void p_head(enc *e, size_t n_fields, uint32_t version, uint64_t id, rlai_msg_type t)
{
    msgpack_pack_map(&e->pk, 3 + n_fields);
    p_key(e, "v");
    msgpack_pack_uint32(&e->pk, version ? version : RLAI_PROTO_VERSION);
    p_key(e, "id");
    msgpack_pack_uint64(&e->pk, id);
    p_key(e, "type");
    p_key(e, type_names[t]);
}

static size_t gen_count(const rlai_msg_gen *g)
{
    return (size_t)g->has_max_tokens + g->has_temperature + g->has_top_k + g->has_top_p + g->has_min_p +
           g->has_repeat_penalty + g->has_presence_penalty + g->has_frequency_penalty + g->has_seed +
           g->ignore_eos + g->has_timeout_ms + g->has_spec + g->has_spec_max_draft + g->has_top_logprobs +
           (g->n_stop > 0) + (g->response_format != NULL) + (g->model != NULL) + (g->route != NULL) +
           g->prompt_logprobs + (g->n_logit_bias > 0) + (g->prediction != NULL);
}

static void p_float(enc *e, const char *k, bool has, float v)
{
    if (!has) return;
    p_key(e, k);
    msgpack_pack_double(&e->pk, (double)v);
}

static void p_gen(enc *e, const rlai_msg_gen *g)
{
    if (g->has_max_tokens) { p_key(e, "max_tokens"); msgpack_pack_int32(&e->pk, g->max_tokens); }
    p_float(e, "temperature", g->has_temperature, g->temperature);
    if (g->has_top_k) { p_key(e, "top_k"); msgpack_pack_int32(&e->pk, g->top_k); }
    p_float(e, "top_p", g->has_top_p, g->top_p);
    p_float(e, "min_p", g->has_min_p, g->min_p);
    p_float(e, "repeat_penalty", g->has_repeat_penalty, g->repeat_penalty);
    p_float(e, "presence_penalty", g->has_presence_penalty, g->presence_penalty);
    p_float(e, "frequency_penalty", g->has_frequency_penalty, g->frequency_penalty);
    if (g->has_seed) { p_key(e, "seed"); msgpack_pack_uint64(&e->pk, g->seed); }
    if (g->ignore_eos) { p_key(e, "ignore_eos"); msgpack_pack_true(&e->pk); }
    if (g->has_timeout_ms) { p_key(e, "timeout_ms"); msgpack_pack_uint32(&e->pk, g->timeout_ms); }
    if (g->has_spec) {
        p_key(e, "spec");
        p_key(e, g->spec == RLAI_MSG_SPEC_OFF     ? "off"
                 : g->spec == RLAI_MSG_SPEC_NGRAM ? "ngram"
                 : g->spec == RLAI_MSG_SPEC_DRAFT ? "draft"
                                                  : "auto");
    }
    if (g->has_spec_max_draft) {
        p_key(e, "spec_max_draft");
        msgpack_pack_uint32(&e->pk, g->spec_max_draft);
    }
    if (g->has_top_logprobs) {
        p_key(e, "top_logprobs");
        msgpack_pack_uint32(&e->pk, g->top_logprobs);
    }
    if (g->response_format) { p_key(e, "response_format"); p_key(e, g->response_format); }
    if (g->n_stop) {
        p_key(e, "stop");
        msgpack_pack_array(&e->pk, g->n_stop);
        for (uint32_t i = 0; i < g->n_stop; i++) p_key(e, g->stop[i]);
    }
    if (g->model) { p_key(e, "model"); p_key(e, g->model); }
    if (g->route) { p_key(e, "route"); p_key(e, g->route); }
    if (g->prompt_logprobs) { p_key(e, "prompt_logprobs"); msgpack_pack_true(&e->pk); }
    if (g->n_logit_bias) {
        p_key(e, "logit_bias");
        msgpack_pack_map(&e->pk, g->n_logit_bias);
        for (uint32_t i = 0; i < g->n_logit_bias; i++) {
            msgpack_pack_uint32(&e->pk, (uint32_t)g->logit_bias[i].token);
            msgpack_pack_double(&e->pk, (double)g->logit_bias[i].bias);
        }
    }
    if (g->prediction) { p_key(e, "prediction"); p_key(e, g->prediction); }
}

static double finite_or_zero(double v)
{
    return isfinite(v) ? v : 0.0;
}

/* A log-probability as sent: -inf (and NaN) as -9999. */
static double lp_or_floor(double v)
{
    return isfinite(v) ? v : -9999.0;
}

/* One logprobs entry {token, logprob, top: [[id, logprob], ...]}; a NaN
 * logprob (no distribution: a prompt's first token) is nil with no top. */
static void p_lp_entry(enc *e, const rlai_msg_logprob *lp)
{
    bool none = isnan(lp->logprob);
    msgpack_pack_map(&e->pk, 3);
    p_key(e, "token");
    msgpack_pack_int32(&e->pk, lp->token);
    p_key(e, "logprob");
    if (none)
        msgpack_pack_nil(&e->pk);
    else
        msgpack_pack_double(&e->pk, lp_or_floor(lp->logprob));
    p_key(e, "top");
    uint32_t nt = none ? 0 : lp->n_top < RLAI_PROTO_MAX_TOP_LOGPROBS ? lp->n_top : RLAI_PROTO_MAX_TOP_LOGPROBS;
    msgpack_pack_array(&e->pk, nt);
    for (uint32_t k = 0; k < nt; k++) {
        msgpack_pack_array(&e->pk, 2);
        msgpack_pack_int32(&e->pk, lp->top_ids[k]);
        msgpack_pack_double(&e->pk, lp_or_floor(lp->top_logprobs[k]));
    }
}

static void p_token(enc *e, uint32_t version, uint64_t id, const char *text, size_t len,
                    const int32_t *tokens, uint32_t n, const rlai_msg_logprob *lp, uint32_t n_lp)
{
    p_head(e, n_lp ? 3 : 2, version, id, RLAI_MSG_TOKEN);
    p_key(e, "text");
    p_str(e, text, len);
    p_key(e, "tokens");
    msgpack_pack_array(&e->pk, n);
    for (uint32_t i = 0; i < n; i++) msgpack_pack_int32(&e->pk, tokens[i]);
    if (!n_lp) return;
    /* logprobs: one map per token, {token, logprob, top: [[id, logprob], ...]} */
    p_key(e, "logprobs");
    msgpack_pack_array(&e->pk, n_lp);
    for (uint32_t i = 0; i < n_lp; i++)
        p_lp_entry(e, &lp[i]);
}

/* A str with each byte that does not start a valid UTF-8 sequence (or is
 * NUL) written as U+FFFD. */
static void p_str_lossy(enc *e, const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t out = 0;
    for (size_t i = 0; i < n;) {
        size_t k = utf8_seq(u, n, i);
        out += k ? k : 3;
        i += k ? k : 1;
    }
    msgpack_pack_str(&e->pk, out);
    if (out == n) {
        msgpack_pack_str_body(&e->pk, s, n);
        return;
    }
    for (size_t i = 0; i < n;) {
        size_t k = utf8_seq(u, n, i);
        if (k) {
            msgpack_pack_str_body(&e->pk, s + i, k);
            i += k;
        } else {
            msgpack_pack_str_body(&e->pk, "\xEF\xBF\xBD", 3);
            i++;
        }
    }
}

/* A remote model's token frame (PROTOCOL.md 6.1): no ids, text logprobs. */
static void p_token_text_lp(enc *e, uint64_t id, const char *text, size_t len, const rlai_msg_text_logprob *lp,
                            uint32_t n_lp)
{
    p_head(e, 3, RLAI_PROTO_VERSION, id, RLAI_MSG_TOKEN);
    p_key(e, "text");
    p_str(e, text, len);
    p_key(e, "tokens");
    msgpack_pack_array(&e->pk, 0);
    p_key(e, "logprobs");
    msgpack_pack_array(&e->pk, n_lp);
    for (uint32_t i = 0; i < n_lp; i++) {
        const rlai_msg_text_logprob *t = &lp[i];
        bool bytes = t->bytes != NULL;
        msgpack_pack_map(&e->pk, bytes ? 4 : 3);
        p_key(e, "text");
        p_str_lossy(e, t->text ? t->text : "", t->text ? t->text_len : 0);
        p_key(e, "logprob");
        msgpack_pack_double(&e->pk, lp_or_floor(t->logprob));
        p_key(e, "top");
        uint32_t nt = t->n_top < RLAI_PROTO_MAX_TOP_LOGPROBS ? t->n_top : RLAI_PROTO_MAX_TOP_LOGPROBS;
        msgpack_pack_array(&e->pk, nt);
        for (uint32_t k = 0; k < nt; k++) {
            msgpack_pack_array(&e->pk, 2);
            p_str_lossy(e, t->top_text[k] ? t->top_text[k] : "", t->top_text[k] ? t->top_len[k] : 0);
            msgpack_pack_double(&e->pk, lp_or_floor(t->top_logprobs[k]));
        }
        if (bytes) {
            p_key(e, "bytes");
            msgpack_pack_bin(&e->pk, t->n_bytes);
            msgpack_pack_bin_body(&e->pk, t->bytes, t->n_bytes);
        }
    }
}

static void p_done(enc *e, uint32_t version, uint64_t id, const char *stop, const rlai_msg_metrics *mt)
{
    p_head(e, mt ? 2 : 1, version, id, RLAI_MSG_DONE);
    p_key(e, "stop");
    p_key(e, stop ? stop : "");
    if (!mt) return;
    p_key(e, "metrics");
    bool spec = mt->drafted_tokens || mt->accepted_tokens;   /* sent only when speculation ran */
    size_t wl = strnlen(mt->where, sizeof mt->where);
    msgpack_pack_map(&e->pk, (spec ? 9 : 7) + (wl > 0));
    p_key(e, "queue_ms");
    msgpack_pack_double(&e->pk, finite_or_zero(mt->queue_ms));
    p_key(e, "ttft_ms");
    msgpack_pack_double(&e->pk, finite_or_zero(mt->ttft_ms));
    p_key(e, "prefill_tps");
    msgpack_pack_double(&e->pk, finite_or_zero(mt->prefill_tps));
    p_key(e, "decode_tps");
    msgpack_pack_double(&e->pk, finite_or_zero(mt->decode_tps));
    p_key(e, "prompt_tokens");
    msgpack_pack_uint32(&e->pk, mt->prompt_tokens);
    p_key(e, "gen_tokens");
    msgpack_pack_uint32(&e->pk, mt->gen_tokens);
    p_key(e, "reused_tokens");
    msgpack_pack_uint32(&e->pk, mt->reused_tokens);
    if (wl) {
        p_key(e, "where");
        msgpack_pack_str(&e->pk, wl);
        msgpack_pack_str_body(&e->pk, mt->where, wl);
    }
    if (!spec) return;
    p_key(e, "drafted_tokens");
    msgpack_pack_uint32(&e->pk, mt->drafted_tokens);
    p_key(e, "accepted_tokens");
    msgpack_pack_uint32(&e->pk, mt->accepted_tokens);
}

static void p_error(enc *e, uint32_t version, uint64_t id, int code, const char *name, const char *msg)
{
    p_head(e, 3, version, id, RLAI_MSG_ERROR);
    p_key(e, "code");
    msgpack_pack_int32(&e->pk, code);
    p_key(e, "name");
    p_key(e, name ? name : rlai_proto_code_name(code));
    p_key(e, "msg");
    p_key(e, msg ? msg : "");
}

static void p_result(enc *e, uint32_t version, uint64_t id, const void *data, size_t len)
{
    p_head(e, 1, version, id, RLAI_MSG_RESULT);
    p_key(e, "data");
    if (!e->w.failed && buf_append(e->w.b, data, len)) e->w.failed = true;
}

int rlai_proto_encode(const rlai_msg *m, rlai_buf *out)
{
    if (!m || !out) return -RLAI_PE_BAD_REQUEST;
    int rc = check_msg(m);
    if (rc) return rc;
    enc e;
    enc_begin(&e, out);
    uint32_t v = m->version;
    switch (m->type) {
    case RLAI_MSG_HELLO:
        p_head(&e, m->u.hello.client != NULL, v, m->id, m->type);
        if (m->u.hello.client) { p_key(&e, "client"); p_key(&e, m->u.hello.client); }
        break;
    case RLAI_MSG_GENERATE:
        p_head(&e, 1 + gen_count(&m->u.generate.gen), v, m->id, m->type);
        p_key(&e, "prompt");
        p_key(&e, m->u.generate.prompt);
        p_gen(&e, &m->u.generate.gen);
        break;
    case RLAI_MSG_CHAT:
        p_head(&e, 1 + gen_count(&m->u.chat.gen), v, m->id, m->type);
        p_key(&e, "messages");
        msgpack_pack_array(&e.pk, m->u.chat.n_messages);
        for (uint32_t i = 0; i < m->u.chat.n_messages; i++) {
            msgpack_pack_map(&e.pk, 2);
            p_key(&e, "role");
            p_key(&e, m->u.chat.messages[i].role);
            p_key(&e, "content");
            p_key(&e, m->u.chat.messages[i].content);
        }
        p_gen(&e, &m->u.chat.gen);
        break;
    case RLAI_MSG_CALL:
        p_head(&e, 1 + (m->u.call.params_json != NULL) + (m->u.call.timeout_ms != 0), v, m->id, m->type);
        p_key(&e, "command");
        p_key(&e, m->u.call.command);
        if (m->u.call.params_json) { p_key(&e, "params"); p_key(&e, m->u.call.params_json); }
        if (m->u.call.timeout_ms) { p_key(&e, "timeout_ms"); msgpack_pack_uint32(&e.pk, m->u.call.timeout_ms); }
        break;
    case RLAI_MSG_CANCEL:
        p_head(&e, 1, v, m->id, m->type);
        p_key(&e, "target");
        msgpack_pack_uint64(&e.pk, m->u.cancel.target);
        break;
    case RLAI_MSG_COMMANDS:
    case RLAI_MSG_STATS:
        p_head(&e, 0, v, m->id, m->type);
        break;
    case RLAI_MSG_TOKENIZE:
        p_head(&e, 1 + !m->u.tokenize.add_special + m->u.tokenize.parse_special, v, m->id, m->type);
        p_key(&e, "text");
        p_key(&e, m->u.tokenize.text);
        if (!m->u.tokenize.add_special) { p_key(&e, "add_special"); msgpack_pack_false(&e.pk); }
        if (m->u.tokenize.parse_special) { p_key(&e, "parse_special"); msgpack_pack_true(&e.pk); }
        break;
    case RLAI_MSG_TOKEN: {
        const char *t = m->u.token.text ? m->u.token.text : "";
        p_token(&e, v, m->id, t, strlen(t), m->u.token.tokens, m->u.token.n_tokens, NULL, 0);
        break;
    }
    case RLAI_MSG_RESULT:
        p_result(&e, v, m->id, m->u.result.data, m->u.result.len);
        break;
    case RLAI_MSG_DONE:
        p_done(&e, v, m->id, m->u.done.stop, m->u.done.has_metrics ? &m->u.done.metrics : NULL);
        break;
    case RLAI_MSG_ERROR:
        p_error(&e, v, m->id, m->u.error.code, m->u.error.name, m->u.error.msg);
        break;
    default:
        return -RLAI_PE_BAD_REQUEST;
    }
    return enc_end(&e);
}

/* The arguments every token encoder shares: a buffer and text[0..len) of
 * valid UTF-8 (NULL only when len is 0). */
static int check_token_text(const rlai_buf *out, const char *text, size_t len)
{
    if (!out) return -RLAI_PE_BAD_REQUEST;
    if (!text && len) return -RLAI_PE_BAD_REQUEST;
    return check_str(text ? text : "", len, RLAI_PROTO_MAX_STR, false);
}

int rlai_proto_encode_token(rlai_buf *out, uint64_t id, const char *text, size_t len,
                            const int32_t *tokens, uint32_t n_tokens)
{
    return rlai_proto_encode_token_lp(out, id, text, len, tokens, n_tokens, NULL, 0);
}

int rlai_proto_encode_token_lp(rlai_buf *out, uint64_t id, const char *text, size_t len, const int32_t *tokens,
                               uint32_t n_tokens, const rlai_msg_logprob *lp, uint32_t n_lp)
{
    int rc = check_token_text(out, text, len);
    if (rc) return rc;
    if (n_tokens > RLAI_PROTO_MAX_TOKENS_ARRAY || n_lp > RLAI_PROTO_MAX_TOKENS_ARRAY) return -RLAI_PE_TOO_LARGE;
    if ((n_tokens && !tokens) || (n_lp && !lp)) return -RLAI_PE_BAD_REQUEST;
    enc e;
    enc_begin(&e, out);
    p_token(&e, RLAI_PROTO_VERSION, id, text ? text : "", len, tokens, n_tokens, lp, n_lp);
    return enc_end(&e);
}

int rlai_proto_encode_prompt_logprobs(rlai_buf *out, uint64_t id, const rlai_msg_logprob *lp, uint32_t n_lp)
{
    if (!out || n_lp == 0 || !lp) return -RLAI_PE_BAD_REQUEST;
    if (n_lp > RLAI_PROTO_MAX_TOKENS_ARRAY) return -RLAI_PE_TOO_LARGE;
    enc e;
    enc_begin(&e, out);
    p_head(&e, 3, RLAI_PROTO_VERSION, id, RLAI_MSG_TOKEN);
    p_key(&e, "text");
    p_str(&e, "", 0);
    p_key(&e, "tokens");
    msgpack_pack_array(&e.pk, 0);
    p_key(&e, "prompt_logprobs");
    msgpack_pack_array(&e.pk, n_lp);
    for (uint32_t i = 0; i < n_lp; i++)
        p_lp_entry(&e, &lp[i]);
    return enc_end(&e);
}

int rlai_proto_encode_token_text_lp(rlai_buf *out, uint64_t id, const char *text, size_t len,
                                    const rlai_msg_text_logprob *lp, uint32_t n_lp)
{
    int rc = check_token_text(out, text, len);
    if (rc) return rc;
    if (n_lp > RLAI_PROTO_MAX_TOKENS_ARRAY) return -RLAI_PE_TOO_LARGE;
    if (n_lp && !lp) return -RLAI_PE_BAD_REQUEST;
    for (uint32_t i = 0; i < n_lp; i++) {
        if (lp[i].text_len > RLAI_PROTO_MAX_STR || lp[i].n_bytes > RLAI_PROTO_MAX_STR) return -RLAI_PE_TOO_LARGE;
        for (uint32_t k = 0; k < lp[i].n_top && k < RLAI_PROTO_MAX_TOP_LOGPROBS; k++)
            if (lp[i].top_len[k] > RLAI_PROTO_MAX_STR) return -RLAI_PE_TOO_LARGE;
    }
    enc e;
    enc_begin(&e, out);
    p_token_text_lp(&e, id, text ? text : "", len, lp, n_lp);
    return enc_end(&e);
}

int rlai_proto_encode_done(rlai_buf *out, uint64_t id, const char *stop, const rlai_msg_metrics *m)
{
    if (!out) return -RLAI_PE_BAD_REQUEST;
    int rc = stop ? check_cstr(stop, PROTO_MAX_NAME, false) : 0;
    if (rc) return rc;
    enc e;
    enc_begin(&e, out);
    p_done(&e, RLAI_PROTO_VERSION, id, stop, m);
    return enc_end(&e);
}

int rlai_proto_encode_error(rlai_buf *out, uint64_t id, int code, const char *msg)
{
    if (!out || code < 1) return -RLAI_PE_BAD_REQUEST;
    /* Error texts often quote input or file names; rather than fail to
     * report an error, cut the text to the limit and replace bytes that are
     * not valid UTF-8 with '?'. */
    char *fixed = NULL;
    if (msg && check_cstr(msg, RLAI_PROTO_MAX_STR, false) != 0) {
        size_t n = strlen(msg);
        if (n > RLAI_PROTO_MAX_STR) n = RLAI_PROTO_MAX_STR;
        fixed = malloc(n + 1);
        if (!fixed) return -RLAI_PE_INTERNAL;
        memcpy(fixed, msg, n);
        fixed[n] = '\0';
        for (size_t i = 0; i < n;) {
            size_t k = utf8_seq((const unsigned char *)fixed, n, i);
            if (k) {
                i += k;
            } else {
                fixed[i++] = '?';
            }
        }
        msg = fixed;
    }
    enc e;
    enc_begin(&e, out);
    p_error(&e, RLAI_PROTO_VERSION, id, code, NULL, msg);
    free(fixed);
    return enc_end(&e);
}

int rlai_proto_encode_result(rlai_buf *out, uint64_t id, const void *data, size_t len)
{
    if (!out) return -RLAI_PE_BAD_REQUEST;
    int rc = check_value(data, len);
    if (rc) return rc;
    enc e;
    enc_begin(&e, out);
    p_result(&e, RLAI_PROTO_VERSION, id, data, len);
    return enc_end(&e);
}
