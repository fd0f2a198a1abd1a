/* grammar.c - JSON Schema to a byte-level context-free grammar, a
 * pushdown matcher over it and the per-step token mask (grammar.h).
 *
 * Grammar: rules with alternatives; an alternative is a sequence of
 * elements ended by GE_END. Elements are
 *   GE_CHARS  one byte from a 256-bit set
 *   GE_REP    min..max bytes from a set (whitespace, digits), skippable
 *   GE_STR    the body of a JSON string and its closing quote, min..max
 *             characters (escapes and UTF-8 sequences checked)
 *   GE_REF    a rule
 *   GE_TXT    JSON string text, any amount, then the next element (the
 *             unanchored ends of a pattern); escapes and UTF-8 checked
 *   GE_USET   the rest of an array of distinct strings after its '[':
 *             a..b items of the lengths of ulen[set], the separators and
 *             the ']' (uniqueItems over strings: set[str]); its heads
 *             carry the hashes of the items written (gframe_u)
 * Matcher state: a set of heads; a head is a frame (element, counters)
 * whose parent chain holds the return addresses (GE_REF positions). Frames
 * are immutable and shared between states (persistent stacks), so
 * stepping a byte allocates only what changes, and a plain string byte
 * inside an unbounded string gives back the very same state. A GE_REF in
 * tail position does not push a return frame, so repetition by right
 * recursion runs in constant stack.
 */
#include "grammar.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { GE_END = 0, GE_CHARS, GE_REP, GE_STR, GE_REF, GE_TXT, GE_USET };
#define G_INF 0x7fffffff
#define G_MAX_STACK 256     /* return frames: nesting limit of generated text */
#define G_MAX_HEADS 128     /* parallel heads in one state */
#define G_WS_MAX 16         /* whitespace bytes between two JSON tokens */
#define G_MAX_ELEMS (1 << 20)
#define G_MAX_SCHEMA_DEPTH 64
#define G_MAX_REPEAT 1024   /* minItems / maxItems, pattern counts */
#define G_MAX_STRLEN (1 << 24) /* minLength / maxLength */
#define G_MAX_LIT_BRANCH 1024 /* enum values: parting points along one value */
#define G_MAX_OPTIONAL_RUN 120  /* optional properties in a row (each an open alternative) */
#define G_REPSETS 32        /* byte sets of long repetitions a vocabulary keeps token lists of */
#define G_REPSET_MIN 32     /* bytes in a set for its repetition to have a token list */
#define G_REPSET_HEADS 8    /* heads of a state at most, for that list to be used */

typedef struct gelem {
    uint8_t kind;
    uint16_t set;            /* GE_CHARS / GE_REP: index into sets */
    int32_t a, b;            /* REP, STR: min, max; REF: rule */
} gelem;

typedef struct grule {
    int32_t *alt;            /* start element of each alternative */
    int n, cap;
} grule;

struct rlai_grammar {
    atomic_int refs;
    gelem *el;
    int n_el, cap_el;
    grule *rules;
    int n_rules, cap_rules;
    uint64_t (*sets)[4];
    int n_sets, cap_sets;
    struct ulen {                /* GE_USET items: characters min..max (max G_INF: any) */
        int32_t min, max;
    } *ulen;
    int n_ulen;
    int root;
};

/* ------------------------------------------------------------------ */
/* Building                                                            */

typedef struct gseq {
    gelem *e;
    int n, cap;
    bool oom;
} gseq;

static void seq_push(gseq *s, gelem e)
{
    if (s->n == s->cap) {
        int nc = s->cap ? s->cap * 2 : 16;
        gelem *ne = realloc(s->e, sizeof(gelem) * (size_t)nc);
        if (!ne) {
            s->oom = true;
            return;
        }
        s->e = ne;
        s->cap = nc;
    }
    s->e[s->n++] = e;
}

static int set_add(rlai_grammar *g, const uint64_t bits[4])
{
    for (int i = 0; i < g->n_sets; i++)
        if (!memcmp(g->sets[i], bits, sizeof(uint64_t) * 4))
            return i;
    if (g->n_sets >= 65535)
        return RLAI_ERR_TOO_LARGE;
    if (g->n_sets == g->cap_sets) {
        int nc = g->cap_sets ? g->cap_sets * 2 : 64;
        void *ns = realloc(g->sets, sizeof(g->sets[0]) * (size_t)nc);
        if (!ns)
            return RLAI_ERR_NOMEM;
        g->sets = ns;
        g->cap_sets = nc;
    }
    memcpy(g->sets[g->n_sets], bits, sizeof(uint64_t) * 4);
    return g->n_sets++;
}

static void bits_set(uint64_t b[4], int c) { b[c >> 6] |= 1ull << (c & 63); }

static int set_of(rlai_grammar *g, const char *chars)
{
    uint64_t b[4] = { 0, 0, 0, 0 };
    for (const unsigned char *p = (const unsigned char *)chars; *p; p++)
        bits_set(b, *p);
    return set_add(g, b);
}

static int set_range(rlai_grammar *g, int lo, int hi)
{
    uint64_t b[4] = { 0, 0, 0, 0 };
    for (int c = lo; c <= hi; c++)
        bits_set(b, c);
    return set_add(g, b);
}

static void seq_byte(rlai_grammar *g, gseq *s, unsigned char c)
{
    uint64_t b[4] = { 0, 0, 0, 0 };
    bits_set(b, c);
    int id = set_add(g, b);
    if (id < 0) {
        s->oom = true;
        return;
    }
    seq_push(s, (gelem){ GE_CHARS, (uint16_t)id, 0, 0 });
}

static void seq_lit(rlai_grammar *g, gseq *s, const char *text, size_t n)
{
    for (size_t i = 0; i < n; i++)
        seq_byte(g, s, (unsigned char)text[i]);
}

static void seq_set(gseq *s, int set)
{
    if (set < 0)
        s->oom = true;
    else
        seq_push(s, (gelem){ GE_CHARS, (uint16_t)set, 0, 0 });
}

static void seq_rep(gseq *s, int set, int min, int max)
{
    if (set < 0)
        s->oom = true;
    else
        seq_push(s, (gelem){ GE_REP, (uint16_t)set, min, max });
}

static void seq_ws(rlai_grammar *g, gseq *s) { seq_rep(s, set_of(g, " \n\t"), 0, G_WS_MAX); }
static void seq_ref(gseq *s, int rule)
{
    if (rule < 0)
        s->oom = true;
    else
        seq_push(s, (gelem){ GE_REF, 0, rule, 0 });
}

static int rule_new(rlai_grammar *g)
{
    if (g->n_rules == g->cap_rules) {
        int nc = g->cap_rules ? g->cap_rules * 2 : 32;
        grule *nr = realloc(g->rules, sizeof(grule) * (size_t)nc);
        if (!nr)
            return RLAI_ERR_NOMEM;
        g->rules = nr;
        g->cap_rules = nc;
    }
    memset(&g->rules[g->n_rules], 0, sizeof(grule));
    return g->n_rules++;
}

/* Appends s (then frees it) as an alternative of rule r. */
static int rule_alt(rlai_grammar *g, int r, gseq *s)
{
    int rc = 0;
    if (s->oom || r < 0)
        rc = r < 0 ? r : RLAI_ERR_NOMEM;
    else if (g->n_el + s->n + 1 > G_MAX_ELEMS)
        rc = RLAI_ERR_TOO_LARGE;
    if (rc == 0 && g->n_el + s->n + 1 > g->cap_el) {
        int nc = g->cap_el ? g->cap_el : 256;
        while (nc < g->n_el + s->n + 1)
            nc *= 2;
        gelem *ne = realloc(g->el, sizeof(gelem) * (size_t)nc);
        if (!ne)
            rc = RLAI_ERR_NOMEM;
        else {
            g->el = ne;
            g->cap_el = nc;
        }
    }
    grule *ru = rc == 0 ? &g->rules[r] : NULL;
    if (rc == 0 && ru->n == ru->cap) {
        int nc = ru->cap ? ru->cap * 2 : 2;
        int32_t *na = realloc(ru->alt, sizeof(int32_t) * (size_t)nc);
        if (!na)
            rc = RLAI_ERR_NOMEM;
        else {
            ru->alt = na;
            ru->cap = nc;
        }
    }
    if (rc == 0) {
        ru->alt[ru->n++] = g->n_el;
        if (s->n)
            memcpy(g->el + g->n_el, s->e, sizeof(gelem) * (size_t)s->n);
        g->n_el += s->n;
        g->el[g->n_el++] = (gelem){ GE_END, 0, 0, 0 };
    }
    free(s->e);
    memset(s, 0, sizeof(*s));
    return rc;
}

static rlai_grammar *grammar_new(void)
{
    rlai_grammar *g = calloc(1, sizeof(*g));
    if (g)
        atomic_init(&g->refs, 1);
    return g;
}

static void grammar_free(rlai_grammar *g)
{
    if (!g)
        return;
    for (int i = 0; i < g->n_rules; i++)
        free(g->rules[i].alt);
    free(g->rules);
    free(g->el);
    free(g->sets);
    free(g->ulen);
    free(g);
}

rlai_grammar *rlai_grammar_ref(const rlai_grammar *cg)
{
    rlai_grammar *g = (rlai_grammar *)cg;
    if (g)
        atomic_fetch_add(&g->refs, 1);
    return g;
}

void rlai_grammar_unref(rlai_grammar *g)
{
    if (g && atomic_fetch_sub(&g->refs, 1) == 1)
        grammar_free(g);
}

/* ------------------------------------------------------------------ */
/* Schema compiler                                                     */

typedef struct memo_ent {
    const cJSON *node;
    int rule;
} memo_ent;

typedef struct sc {
    rlai_grammar *g;
    const cJSON *root;
    const cJSON *scopes[G_MAX_SCHEMA_DEPTH + 2];   /* enclosing schemas holding $defs / definitions */
    int n_scopes;
    char *err;
    size_t errlen;
    memo_ent *memo;
    int n_memo, cap_memo;
    int r_value, r_string, r_number, r_integer, r_object, r_array, r_int, r_minus, r_frac, r_exp;
} sc;

static int sc_fail(sc *c, int rc, const char *fmt, ...)
{
    if (c->err && c->errlen && !c->err[0]) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->err, c->errlen, fmt, ap);
        va_end(ap);
    }
    return rc;
}

/* A rule with one alternative, built by the caller into s. */
static int rule_one(rlai_grammar *g, gseq *s)
{
    int r = rule_new(g);
    if (r < 0) {
        free(s->e);
        return r;
    }
    int rc = rule_alt(g, r, s);
    return rc < 0 ? rc : r;
}

static int lit_rule(rlai_grammar *g, const char *text)
{
    gseq s = { 0 };
    seq_lit(g, &s, text, strlen(text));
    return rule_one(g, &s);
}

/* Number building blocks (digit runs bounded so output cannot run away). */
static int number_rules(sc *c)
{
    rlai_grammar *g = c->g;
    if (c->r_int >= 0)
        return 0;
    int rc;
    gseq s = { 0 };
    if ((c->r_int = rule_new(g)) < 0)
        return c->r_int;
    seq_byte(g, &s, '0');
    if ((rc = rule_alt(g, c->r_int, &s)) < 0)
        return rc;
    seq_set(&s, set_range(g, '1', '9'));
    seq_rep(&s, set_range(g, '0', '9'), 0, 15);
    if ((rc = rule_alt(g, c->r_int, &s)) < 0)
        return rc;
    if ((c->r_minus = rule_new(g)) < 0)
        return c->r_minus;
    seq_byte(g, &s, '-');
    if ((rc = rule_alt(g, c->r_minus, &s)) < 0 || (rc = rule_alt(g, c->r_minus, &s)) < 0)
        return rc;
    if ((c->r_frac = rule_new(g)) < 0)
        return c->r_frac;
    seq_byte(g, &s, '.');
    seq_rep(&s, set_range(g, '0', '9'), 1, 15);
    if ((rc = rule_alt(g, c->r_frac, &s)) < 0 || (rc = rule_alt(g, c->r_frac, &s)) < 0)
        return rc;
    if ((c->r_exp = rule_new(g)) < 0)
        return c->r_exp;
    seq_set(&s, set_of(g, "eE"));
    seq_rep(&s, set_of(g, "+-"), 0, 1);
    seq_rep(&s, set_range(g, '0', '9'), 1, 3);
    if ((rc = rule_alt(g, c->r_exp, &s)) < 0 || (rc = rule_alt(g, c->r_exp, &s)) < 0)
        return rc;
    return 0;
}

static int integer_rule(sc *c)
{
    if (c->r_integer >= 0)
        return c->r_integer;
    int rc = number_rules(c);
    if (rc < 0)
        return rc;
    gseq s = { 0 };
    seq_ref(&s, c->r_minus);
    seq_ref(&s, c->r_int);
    return c->r_integer = rule_one(c->g, &s);
}

static int number_rule(sc *c)
{
    if (c->r_number >= 0)
        return c->r_number;
    int rc = number_rules(c);
    if (rc < 0)
        return rc;
    gseq s = { 0 };
    seq_ref(&s, c->r_minus);
    seq_ref(&s, c->r_int);
    seq_ref(&s, c->r_frac);
    seq_ref(&s, c->r_exp);
    return c->r_number = rule_one(c->g, &s);
}

/* ---- numeric bounds (minimum / maximum / exclusiveMinimum / exclusiveMaximum)
 *
 * A bounded integer or number is a regular language of decimal texts,
 * built from rules of at most three alternatives per digit, so the matcher
 * keeps few heads: integers split by digit count (the shortest count, one
 * repetition for the counts in between, the longest count), each count a
 * chain "this digit equals the bound's and the rest is bounded, or lies
 * strictly between and the rest is free". For numbers the integer part
 * decides, except at a bound's integer part, where the fraction is
 * compared with the bound's digit by digit the same way (frac_between).
 * Bounded numbers have no exponent. The texts stay within the plain
 * rules' limits: at most 16 integer digits. */

#define G_NUM_MAX 9999999999999999LL   /* the largest 16-digit integer */
#define G_NUM_NONE LLONG_MAX           /* no upper bound (nonneg ranges) */
#define G_FRAC_STATES 17          /* fraction digits of a bounded number + 2 */

static int digits_range(sc *c, const char *X, const char *Y, int n);

/* Adds to rule r the alternative "digit d, then n digits from X to Y";
 * returns r or an error. */
static int digit_then(sc *c, int r, char d, const char *X, const char *Y, int n)
{
    int sub = digits_range(c, X, Y, n);
    if (sub < 0)
        return sub;
    gseq q = { 0 };
    seq_byte(c->g, &q, (unsigned char)d);
    seq_ref(&q, sub);
    int rc = rule_alt(c->g, r, &q);
    return rc < 0 ? rc : r;
}

/* Texts of n digits from X to Y (same n, X <= Y, no sign). */
static int digits_range(sc *c, const char *X, const char *Y, int n)
{
    rlai_grammar *g = c->g;
    gseq q = { 0 };
    int rc;
    if (n == 1) {
        seq_set(&q, set_range(g, X[0], Y[0]));
        return rule_one(g, &q);
    }
    if (X[0] == Y[0]) {
        int r = rule_new(g);
        return r < 0 ? r : digit_then(c, r, X[0], X + 1, Y + 1, n - 1);
    }
    char nines[20], zeros[20];
    memset(nines, '9', (size_t)n - 1);
    memset(zeros, '0', (size_t)n - 1);
    bool xlow = !memcmp(X + 1, zeros, (size_t)n - 1), yhigh = !memcmp(Y + 1, nines, (size_t)n - 1);
    int r = rule_new(g), lo = X[0], hi = Y[0];
    if (r < 0)
        return r;
    if (!xlow) {
        if ((rc = digit_then(c, r, X[0], X + 1, nines, n - 1)) < 0)
            return rc;
        lo++;
    }
    if (!yhigh)
        hi--;
    if (lo <= hi) {
        seq_set(&q, set_range(g, lo, hi));
        seq_rep(&q, set_range(g, '0', '9'), n - 1, n - 1);
        if ((rc = rule_alt(g, r, &q)) < 0)
            return rc;
    }
    if (!yhigh && (rc = digit_then(c, r, Y[0], zeros, Y + 1, n - 1)) < 0)
        return rc;
    return r;
}

/* Unsigned integer texts (no leading zeros) of the values a..b, 0 <= a,
 * b = G_NUM_NONE for no upper bound (then up to 16 digits), a <= b. */
static int nonneg_range(sc *c, long long a, long long b)
{
    rlai_grammar *g = c->g;
    char A[24], B[24], nines[24];
    int da = snprintf(A, sizeof(A), "%lld", a);
    bool open = b == G_NUM_NONE;
    int db = snprintf(B, sizeof(B), "%lld", open ? G_NUM_MAX : b);
    memset(nines, '9', sizeof(nines));
    int r = rule_new(g), rc, sub;
    if (r < 0)
        return r;
    gseq q = { 0 };
    if (da == db) {
        if ((sub = digits_range(c, A, B, da)) < 0)
            return sub;
        seq_ref(&q, sub);
        return (rc = rule_alt(g, r, &q)) < 0 ? rc : r;
    }
    if ((sub = digits_range(c, A, nines, da)) < 0)
        return sub;
    seq_ref(&q, sub);
    if ((rc = rule_alt(g, r, &q)) < 0)
        return rc;
    /* the digit counts strictly between, and the longest one when it is
     * all nines (no bound) */
    int full_to = open ? db : db - 1;
    if (full_to > da) {
        seq_set(&q, set_range(g, '1', '9'));
        seq_rep(&q, set_range(g, '0', '9'), da, full_to - 1);
        if ((rc = rule_alt(g, r, &q)) < 0)
            return rc;
    }
    if (!open) {
        char low[24];
        low[0] = '1';
        memset(low + 1, '0', (size_t)db - 1);
        if ((sub = digits_range(c, low, B, db)) < 0)
            return sub;
        seq_ref(&q, sub);
        if ((rc = rule_alt(g, r, &q)) < 0)
            return rc;
    }
    return r;
}

typedef struct nbound {
    bool has, strict;
    double v;
} nbound;

/* Reads minimum / exclusiveMinimum (lower) or maximum / exclusiveMaximum
 * into *b, the tighter one when both are given; the boolean
 * exclusiveMinimum of JSON Schema draft 4 makes minimum strict. */
static int read_bound(sc *c, const cJSON *s, bool lower, nbound *b)
{
    const char *kin = lower ? "minimum" : "maximum", *kex = lower ? "exclusiveMinimum" : "exclusiveMaximum";
    const cJSON *in = cJSON_GetObjectItemCaseSensitive(s, kin), *ex = cJSON_GetObjectItemCaseSensitive(s, kex);
    *b = (nbound){ false, false, 0 };
    if (in && !cJSON_IsNumber(in))
        return sc_fail(c, RLAI_ERR_INVALID_ARG, "'%s' must be a number", kin);
    if (ex && !cJSON_IsNumber(ex) && !cJSON_IsBool(ex))
        return sc_fail(c, RLAI_ERR_INVALID_ARG, "'%s' must be a number", kex);
    if (in)
        *b = (nbound){ true, ex && cJSON_IsTrue(ex), in->valuedouble };
    if (ex && cJSON_IsNumber(ex)) {
        double v = ex->valuedouble;
        bool tighter = !b->has || (lower ? v >= b->v : v <= b->v);
        if (tighter)
            *b = (nbound){ true, true, v };
    }
    if (b->has && !isfinite(b->v))
        return sc_fail(c, RLAI_ERR_INVALID_ARG, "'%s' must be finite", b->strict && ex ? kex : kin);
    return 0;
}

/* A bounded integer: the integer values within the bounds. */
static int integer_range_rule(sc *c, const nbound *lo, const nbound *hi)
{
    rlai_grammar *g = c->g;
    /* as whole numbers, clamped to what 16 digits can write */
    double L = -1e300, H = 1e300;
    if (lo->has)
        L = lo->strict ? floor(lo->v) + 1 : ceil(lo->v);
    if (hi->has)
        H = hi->strict ? ceil(hi->v) - 1 : floor(hi->v);
    /* (double)G_NUM_MAX is 1e16: JSON numbers are doubles, exact only up
     * to 2^53, so a bound from there on bounds nothing 16 digits write */
    if (L > H || L >= (double)G_NUM_MAX || H <= -(double)G_NUM_MAX)
        return sc_fail(c, RLAI_ERR_INVALID_ARG, "no integer (of at most 16 digits) is within the schema's bounds");
    bool no_lo = L <= -(double)G_NUM_MAX, no_hi = H >= (double)G_NUM_MAX;
    long long l = no_lo ? 0 : (long long)L, h = no_hi ? 0 : (long long)H;
    int r = rule_new(g), rc;
    if (r < 0)
        return r;
    gseq q = { 0 };
    if (no_hi || h >= 0) {   /* 0 and up */
        int sub = nonneg_range(c, no_lo || l < 0 ? 0 : l, no_hi ? G_NUM_NONE : h);
        if (sub < 0)
            return sub;
        seq_ref(&q, sub);
        if ((rc = rule_alt(g, r, &q)) < 0)
            return rc;
    }
    if (no_lo || l < 0) {    /* "-" and the magnitude */
        long long mlo = !no_hi && h < 0 ? -h : 1;
        int sub = nonneg_range(c, mlo, no_lo ? G_NUM_NONE : -l);
        if (sub < 0)
            return sub;
        seq_byte(g, &q, '-');
        seq_ref(&q, sub);
        if ((rc = rule_alt(g, r, &q)) < 0)
            return rc;
    }
    return r;
}

/* The shortest decimal that reads back as v > 0 (finite): its digits,
 * without leading or trailing zeros, into dig (NUL-terminated; up to 17),
 * and the power of ten of its last digit: v = dig * 10^*exp10. JSON
 * numbers are doubles, but a schema writes them as decimals: 0.1 is 0.1,
 * not the binary fraction nearest it. */
static void shortest_digits(double v, char dig[24], int *exp10)
{
    char buf[48];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof(buf), "%.*e", prec - 1, v);
        if (strtod(buf, NULL) == v)
            break;
    }
    int nd = 0;
    const char *q = buf;
    for (; *q && *q != 'e'; q++)
        if (*q >= '0' && *q <= '9' && nd < 23)
            dig[nd++] = *q;
    int ex = (*q == 'e' ? atoi(q + 1) : 0) - (nd - 1);
    while (nd > 1 && dig[nd - 1] == '0') {
        nd--;
        ex++;
    }
    dig[nd] = 0;
    *exp10 = ex;
}

/* A number bound as a decimal: sign, integer part and fraction digits. */
typedef struct dbound {
    bool has, strict, neg;
    long long ip;      /* the integer part of |v| (below 1e16) */
    char f[40];        /* the fraction digits of |v|, no trailing zeros */
    int nf;
} dbound;

#define G_BOUND_FRAC 32   /* fraction digits of a number bound, at most */

static int dbound_of(sc *c, const nbound *b, const char *key, dbound *d)
{
    memset(d, 0, sizeof(*d));
    if (!b->has)
        return 0;
    d->has = true;
    d->strict = b->strict;
    d->neg = b->v < 0;
    double v = fabs(b->v);
    if (v == 0)
        return 0;
    char dig[24];
    int ex, nd;
    shortest_digits(v, dig, &ex);
    nd = (int)strlen(dig);
    if (ex >= 0) {
        d->ip = atoll(dig);
        while (ex-- > 0)
            d->ip *= 10;   /* v < 1e16: the caller checked */
        return 0;
    }
    int nf = -ex;
    if (nf > G_BOUND_FRAC)
        return sc_fail(c, RLAI_ERR_UNSUPPORTED, "'%s' %g is not supported: at most %d fraction digits in a bound are", key,
                       b->v, G_BOUND_FRAC);
    if (nd > nf) {
        for (int i = 0; i < nd - nf; i++)
            d->ip = d->ip * 10 + (dig[i] - '0');
        memcpy(d->f, dig + nd - nf, (size_t)nf);
    } else {
        memset(d->f, '0', (size_t)(nf - nd));
        memcpy(d->f + nf - nd, dig, (size_t)nd);
    }
    d->nf = nf;
    return 0;
}

/* Fractions of a number whose integer part equals a bound's: the text
 * "[.d...]" (none, or "." and 1 to maxd digits) whose value 0.d... is
 * at least lo's fraction (above, when strict) and at most hi's (below),
 * either one absent (NULL). Digit by digit, as strings compare: while the
 * digits so far equal a bound's, the next is bounded by that bound's
 * next; once they differ, the rest is free. One rule per (digits so far,
 * equal to lo, equal to hi): at most 4 (maxd + 1). */
typedef struct fracb {
    sc *c;
    const dbound *lo, *hi;
    int maxd;
    int memo[G_FRAC_STATES][2][2];
} fracb;

static char fb_digit(const dbound *b, int i) { return i < b->nf ? b->f[i] : '0'; }

static bool fb_rest_zero(const dbound *b, int i)
{
    for (; i < b->nf; i++)
        if (b->f[i] != '0')
            return false;
    return true;
}

/* Adds "[.] digit set [0-9]{0,rest}" (free after the digit) to rule r. */
static int fb_free(rlai_grammar *g, int r, bool dot, int lo, int hi, int rest)
{
    gseq q = { 0 };
    if (dot)
        seq_byte(g, &q, '.');
    seq_set(&q, set_range(g, lo, hi));
    if (rest > 0)
        seq_rep(&q, set_range(g, '0', '9'), 0, rest);
    return rule_alt(g, r, &q);
}

/* The rule of the fraction from digit i on, or RLAI_ERR_NOT_FOUND when no
 * text of it meets the bounds. */
static int frac_state(fracb *fb, int i, bool tl, bool th)
{
    if (fb->memo[i][tl][th] != -2)
        return fb->memo[i][tl][th];
    rlai_grammar *g = fb->c->g;
    const dbound *lo = fb->lo, *hi = fb->hi;
    bool end = (!tl || (fb_rest_zero(lo, i) && !lo->strict)) && (!th || !fb_rest_zero(hi, i) || !hi->strict);
    char lb = tl ? fb_digit(lo, i) : '0', hb = th ? fb_digit(hi, i) : '9';
    int child_lo = RLAI_ERR_NOT_FOUND, child_hi = RLAI_ERR_NOT_FOUND;
    bool more = i < fb->maxd && lb <= hb;
    if (more && tl)
        child_lo = frac_state(fb, i + 1, true, th && lb == hb);
    if (more && th && (!tl || hb != lb))
        child_hi = frac_state(fb, i + 1, false, true);
    if ((child_lo < 0 && child_lo != RLAI_ERR_NOT_FOUND) || (child_hi < 0 && child_hi != RLAI_ERR_NOT_FOUND))
        return child_lo < 0 && child_lo != RLAI_ERR_NOT_FOUND ? child_lo : child_hi;
    char mlo = tl ? lb + 1 : lb, mhi = th ? hb - 1 : hb;   /* the digits that part from both */
    bool mid = more && mlo <= mhi;
    if (!end && !mid && child_lo < 0 && child_hi < 0)
        return fb->memo[i][tl][th] = RLAI_ERR_NOT_FOUND;
    int r = rule_new(g), rc = r;
    bool dot = i == 0;
    gseq q = { 0 };
    if (rc >= 0 && end)
        rc = rule_alt(g, r, &q);
    if (rc >= 0 && mid)
        rc = fb_free(g, r, dot, mlo, mhi, fb->maxd - i - 1);
    int kids[2] = { child_lo, child_hi };
    char kd[2] = { lb, hb };
    for (int k = 0; k < 2 && rc >= 0; k++) {
        if (kids[k] < 0)
            continue;
        if (dot)
            seq_byte(g, &q, '.');
        seq_byte(g, &q, (unsigned char)kd[k]);
        seq_ref(&q, kids[k]);
        rc = rule_alt(g, r, &q);
    }
    return fb->memo[i][tl][th] = rc < 0 ? rc : r;
}

/* The fraction rule (at most maxd digits) for integer part ip (equal to
 * lo's, hi's or both: NULL where not), or RLAI_ERR_NOT_FOUND. At a
 * bound's integer part the text keeps to 15 significant digits, so that
 * the double a validator reads is not rounded onto the bound
 * (100.000000000000001 reads as 100, which is not above 100). */
static int frac_between(sc *c, const dbound *lo, const dbound *hi, long long ip, int maxd)
{
    static const dbound none = { 0 };
    fracb fb = { c, lo ? lo : &none, hi ? hi : &none, maxd, { { { 0 } } } };
    int nd = 0;
    for (long long x = ip; x > 0; x /= 10)
        nd++;
    if ((lo || hi) && nd > 0 && 15 - nd < fb.maxd)
        fb.maxd = 15 - nd > 0 ? 15 - nd : 0;
    for (int i = 0; i < G_FRAC_STATES; i++)
        for (int a = 0; a < 2; a++)
            fb.memo[i][a][0] = fb.memo[i][a][1] = -2;
    return frac_state(&fb, 0, lo != NULL, hi != NULL);
}

/* Appends "k-range frac" to rule r: k from a to b (b may be G_NUM_NONE). */
static int num_piece(sc *c, int r, long long a, long long b, int frac)
{
    int k = nonneg_range(c, a, b);
    if (k < 0)
        return k;
    gseq q = { 0 };
    seq_ref(&q, k);
    seq_ref(&q, frac);
    return rule_alt(c->g, r, &q);
}

/* Unsigned number texts "k[.f]" whose value u is within lo and hi (a
 * negative lower bound, or 0 inclusive, bounds nothing here), f of at most
 * maxd digits. Returns the rule, or 0 pieces as RLAI_ERR_NOT_FOUND. */
static int unsigned_number_part(sc *c, dbound lo, dbound hi, int maxd)
{
    bool lz = lo.ip == 0 && lo.nf == 0, hz = hi.ip == 0 && hi.nf == 0;
    if (lo.has && (lo.neg || (lz && !lo.strict)))
        lo.has = false;                  /* every u >= 0 meets it */
    if (hi.has && ((hi.neg && !hz) || (hz && hi.strict)))
        return RLAI_ERR_NOT_FOUND;       /* no u >= 0 meets it */
    int r = rule_new(c->g), rc, n = 0;
    if (r < 0)
        return r;
    int any = maxd < 15 ? frac_between(c, NULL, NULL, 0, maxd) : c->r_frac;
    if (any < 0)
        return any;
    if (lo.has && hi.has && lo.ip == hi.ip) {
        int f = frac_between(c, &lo, &hi, lo.ip, maxd);
        if (f < 0)
            return f;   /* RLAI_ERR_NOT_FOUND: no fraction meets both */
        return (rc = num_piece(c, r, lo.ip, lo.ip, f)) < 0 ? rc : r;
    }
    if (lo.has) {   /* at the lower bound's integer part */
        int f = frac_between(c, &lo, NULL, lo.ip, maxd);
        if (f < 0 && f != RLAI_ERR_NOT_FOUND)
            return f;
        if (f >= 0 && (rc = num_piece(c, r, lo.ip, lo.ip, f)) < 0)
            return rc;
        n += f >= 0;
    }
    /* the integer parts strictly between: any fraction */
    long long a = lo.has ? lo.ip + 1 : 0, b = hi.has ? hi.ip - 1 : G_NUM_NONE;
    if (a <= G_NUM_MAX && (b == G_NUM_NONE || (b >= 0 && a <= b))) {
        if ((rc = num_piece(c, r, a, b, any)) < 0)
            return rc;
        n++;
    }
    if (hi.has) {   /* at the upper bound's integer part */
        int f = frac_between(c, NULL, &hi, hi.ip, maxd);
        if (f < 0 && f != RLAI_ERR_NOT_FOUND)
            return f;
        if (f >= 0 && (rc = num_piece(c, r, hi.ip, hi.ip, f)) < 0)
            return rc;
        n += f >= 0;
    }
    return n ? r : RLAI_ERR_NOT_FOUND;
}

/* A bounded number (no exponent), of at most maxd fraction digits (15;
 * fewer for a multipleOf of 10^-k). */
static int number_range_rule(sc *c, const nbound *lo, const nbound *hi, int maxd)
{
    rlai_grammar *g = c->g;
    int rc = number_rules(c);
    if (rc < 0)
        return rc;
    if (lo->has && hi->has && (lo->v > hi->v || (lo->v == hi->v && (lo->strict || hi->strict))))
        return sc_fail(c, RLAI_ERR_INVALID_ARG, "no number is within the schema's bounds");
    if ((lo->has && lo->v >= (double)G_NUM_MAX) || (hi->has && hi->v <= -(double)G_NUM_MAX))
        return sc_fail(c, RLAI_ERR_INVALID_ARG, "no number (of at most 16 integer digits) is within the schema's bounds");
    /* bounds from 1e16 on bound nothing the grammar can write */
    nbound l2 = *lo, h2 = *hi;
    l2.has = lo->has && lo->v > -(double)G_NUM_MAX;
    h2.has = hi->has && hi->v < (double)G_NUM_MAX;
    dbound L, H;
    if ((rc = dbound_of(c, &l2, lo->strict ? "exclusiveMinimum" : "minimum", &L)) < 0 ||
        (rc = dbound_of(c, &h2, hi->strict ? "exclusiveMaximum" : "maximum", &H)) < 0)
        return rc;
    int r = rule_new(g), n = 0;
    if (r < 0)
        return r;
    gseq q = { 0 };
    /* v = u >= 0 */
    int pos = unsigned_number_part(c, L, H, maxd);
    if (pos < 0 && pos != RLAI_ERR_NOT_FOUND)
        return pos;
    if (pos >= 0) {
        seq_ref(&q, pos);
        if ((rc = rule_alt(g, r, &q)) < 0)
            return rc;
        n++;
    }
    /* v = -u: L <= v <= H  <=>  -H <= u <= -L */
    dbound nl = H, nh = L;
    nl.neg = !H.neg && (H.ip || H.nf);
    nh.neg = !L.neg && (L.ip || L.nf);
    int neg = unsigned_number_part(c, nl, nh, maxd);
    if (neg < 0 && neg != RLAI_ERR_NOT_FOUND)
        return neg;
    if (neg >= 0) {
        seq_byte(g, &q, '-');
        seq_ref(&q, neg);
        if ((rc = rule_alt(g, r, &q)) < 0)
            return rc;
        n++;
    }
    if (!n)
        return sc_fail(c, RLAI_ERR_INVALID_ARG, "no number is within the schema's bounds");
    return r;
}

static bool has_bounds(const cJSON *s)
{
    return cJSON_GetObjectItemCaseSensitive(s, "minimum") || cJSON_GetObjectItemCaseSensitive(s, "maximum") ||
           cJSON_GetObjectItemCaseSensitive(s, "exclusiveMinimum") ||
           cJSON_GetObjectItemCaseSensitive(s, "exclusiveMaximum");
}

static int bounded_number(sc *c, const cJSON *s, bool integer)
{
    nbound lo, hi;
    int rc;
    if ((rc = read_bound(c, s, true, &lo)) < 0 || (rc = read_bound(c, s, false, &hi)) < 0)
        return rc;
    return integer ? integer_range_rule(c, &lo, &hi) : number_range_rule(c, &lo, &hi, 15);
}

/* ---- string formats (date, time, date-time, uuid, ipv4)
 *
 * Built from compact specs: literal bytes; [..] a byte set (a-z ranges);
 * {n} or {n,m} after a set: that many; @ the next rule of refs. */
static void seq_spec(rlai_grammar *g, gseq *q, const char *sp, const int *refs, int *ri)
{
    while (*sp) {
        if (*sp == '@') {
            seq_ref(q, refs[(*ri)++]);
            sp++;
            continue;
        }
        if (*sp != '[') {
            seq_byte(g, q, (unsigned char)*sp++);
            continue;
        }
        uint64_t b[4] = { 0, 0, 0, 0 };
        for (sp++; *sp && *sp != ']';) {
            int lo = (unsigned char)*sp, hi = lo;
            if (sp[1] == '-' && sp[2] && sp[2] != ']') {
                hi = (unsigned char)sp[2];
                sp += 3;
            } else {
                sp++;
            }
            for (int ch = lo; ch <= hi; ch++)
                bits_set(b, ch);
        }
        if (*sp)
            sp++;
        int set = set_add(g, b);
        if (*sp != '{') {
            seq_set(q, set);
            continue;
        }
        int n = 0, m;
        for (sp++; *sp >= '0' && *sp <= '9'; sp++)
            n = n * 10 + (*sp - '0');
        m = n;
        if (*sp == ',')
            for (m = 0, sp++; *sp >= '0' && *sp <= '9'; sp++)
                m = m * 10 + (*sp - '0');
        if (*sp == '}')
            sp++;
        seq_rep(q, set, n, m);
    }
}

/* A rule of n alternatives given as specs; the @s take refs in order. */
static int spec_rule(sc *c, int n, const char *const *alts, const int *refs)
{
    int r = rule_new(c->g), ri = 0, rc;
    if (r < 0)
        return r;
    for (int i = 0; i < n; i++) {
        gseq q = { 0 };
        seq_spec(c->g, &q, alts[i], refs, &ri);
        if ((rc = rule_alt(c->g, r, &q)) < 0)
            return rc;
    }
    return r;
}

#define SPEC(c, refs, ...) spec_rule(c, (int)(sizeof((const char *const[]){ __VA_ARGS__ }) / sizeof(const char *)), \
                                     (const char *const[]){ __VA_ARGS__ }, refs)

/* A duration as RFC 3339 (appendix A) writes it, which Pydantic's
 * timedelta writes and reads: P, then years [months [days]], months
 * [days] or days, then optionally T and hours [minutes [seconds]],
 * minutes [seconds] or seconds; or T... alone; or weeks alone. Each
 * number 1 to 6 digits, no fractions. */
static int duration_rule(sc *c)
{
    int sec = SPEC(c, NULL, "[0-9]{1,6}S", ""), day = SPEC(c, NULL, "[0-9]{1,6}D", "");
    int min = SPEC(c, &sec, "[0-9]{1,6}M@", ""), mon = SPEC(c, &day, "[0-9]{1,6}M@", "");
    if (sec < 0 || day < 0 || min < 0 || mon < 0)
        return RLAI_ERR_NOMEM;
    int tr[3] = { min, sec, -1 }, dr[3] = { mon, day, -1 };
    int time = SPEC(c, tr, "T[0-9]{1,6}H@", "T[0-9]{1,6}M@", "T[0-9]{1,6}S");
    int tm = time < 0 ? time : SPEC(c, &time, "@", "");
    int date = SPEC(c, dr, "[0-9]{1,6}Y@", "[0-9]{1,6}M@", "[0-9]{1,6}D");
    if (tm < 0 || date < 0)
        return tm < 0 ? tm : date;
    int refs[3] = { date, tm, time };
    return SPEC(c, refs, "P@@", "P@", "P[0-9]{1,6}W");
}

/* An IPv4 address: four decimal octets 0-255, no leading zeros. */
static int ipv4_rule(sc *c)
{
    int o = SPEC(c, NULL, "25[0-5]", "2[0-4][0-9]", "1[0-9][0-9]", "[1-9][0-9]", "[0-9]");
    if (o < 0)
        return o;
    int refs[4] = { o, o, o, o };
    return SPEC(c, refs, "@.@.@.@");
}

/* An IPv6 address as RFC 4291 (2.2) writes it, without an IPv4 tail:
 * eight groups of 1-4 hex digits, or at most seven with one "::" standing
 * for the zero groups left out ("::", "1::", "fe80::1:2"). b[k]: k groups
 * written, no "::" yet; upto[m]: at most m more groups after the "::";
 * more[n]: at most n more ":group"s. Each "::" and ":group" choice is
 * settled by the byte after the ':', so the matcher carries few heads. */
static int ipv6_rule(sc *c)
{
    int more[7], upto[8], b[8];
    if ((more[0] = SPEC(c, NULL, "")) < 0)
        return more[0];
    for (int n = 1; n < 7; n++)
        if ((more[n] = SPEC(c, &more[n - 1], "", ":[0-9a-fA-F]{1,4}@")) < 0)
            return more[n];
    upto[0] = more[0];
    for (int m = 1; m <= 7; m++)
        if ((upto[m] = SPEC(c, &more[m - 1], "", "[0-9a-fA-F]{1,4}@")) < 0)
            return upto[m];
    if ((b[7] = SPEC(c, NULL, "::", ":[0-9a-fA-F]{1,4}")) < 0)
        return b[7];
    for (int k = 6; k >= 1; k--) {
        int refs[2] = { upto[7 - k], b[k + 1] };
        if ((b[k] = SPEC(c, refs, "::@", ":[0-9a-fA-F]{1,4}@")) < 0)
            return b[k];
    }
    int refs[2] = { upto[7], b[1] };
    return SPEC(c, refs, "::@", "[0-9a-fA-F]{1,4}@");
}

/* IP addresses as Pydantic names them: ipv4, ipv6, ipvanyaddress (either),
 * and the interfaces ipv4interface, ipv6interface, ipvanyinterface (an
 * address, optionally "/" and a prefix length: 0-32, 0-128). Networks
 * (ipv4network...) stay annotations: Pydantic wants their host bits zero,
 * which a grammar of this kind does not count. RLAI_ERR_NOT_FOUND for any
 * other format. */
static int ip_format_rule(sc *c, const char *f)
{
    bool any = !strncmp(f, "ipvany", 6);
    bool v4 = any || !strncmp(f, "ipv4", 4), v6 = any || !strncmp(f, "ipv6", 4);
    const char *kind = f + (any ? 6 : 4);
    bool iface = !strcmp(kind, "interface");
    if ((!v4 && !v6) || (!iface && strcmp(kind, any ? "address" : "")))
        return RLAI_ERR_NOT_FOUND;
    int r4 = -1, r6 = -1;
    if (v4 && (r4 = ipv4_rule(c)) < 0)
        return r4;
    if (v6 && (r6 = ipv6_rule(c)) < 0)
        return r6;
    if (iface) {
        int l4 = SPEC(c, NULL, "", "/[0-9]", "/[12][0-9]", "/3[0-2]");
        int l6 = SPEC(c, NULL, "", "/[0-9]", "/[1-9][0-9]", "/1[01][0-9]", "/12[0-8]");
        if (l4 < 0 || l6 < 0)
            return l4 < 0 ? l4 : l6;
        int a4[2] = { r4, l4 }, a6[2] = { r6, l6 };
        if ((v4 && (r4 = SPEC(c, a4, "@@")) < 0) || (v6 && (r6 = SPEC(c, a6, "@@")) < 0))
            return v4 && r4 < 0 ? r4 : r6;
    }
    if (!v4 || !v6)
        return v4 ? r4 : r6;
    int refs[2] = { r4, r6 };
    return SPEC(c, refs, "@", "@");
}

/* The body (without quotes) of a string of a format of fixed shape (date,
 * time, date-time, uuid, the IP addresses, duration), or RLAI_ERR_NOT_FOUND for any
 * other format (format_string_rule has the rest). Dates are real
 * calendar dates of years 1000-9999 (February 29th in leap years only);
 * times and date-times are RFC 3339 with their offset (Z or +hh:mm). */
static int format_rule(sc *c, const char *f)
{
    int hh = -1, md, d[3];
    bool date = !strcmp(f, "date"), time = !strcmp(f, "time"), dt = !strcmp(f, "date-time");
    if (!strcmp(f, "uuid"))
        return SPEC(c, NULL, "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}");
    if (!strncmp(f, "ip", 2))
        return ip_format_rule(c, f);
    if (!strcmp(f, "duration"))
        return duration_rule(c);
    if (!date && !time && !dt)
        return RLAI_ERR_NOT_FOUND;
    int dr = -1, tr = -1;
    if (date || dt) {
        if ((d[0] = SPEC(c, NULL, "0[1-9]", "[12][0-9]", "3[01]")) < 0 ||
            (d[1] = SPEC(c, NULL, "0[1-9]", "[12][0-9]", "30")) < 0 ||
            (d[2] = SPEC(c, NULL, "0[1-9]", "1[0-9]", "2[0-8]")) < 0)
            return RLAI_ERR_NOMEM;
        int mrefs[5] = { d[0], d[0], d[1], d[1], d[2] };
        if ((md = SPEC(c, mrefs, "0[13578]-@", "1[02]-@", "0[469]-@", "11-@", "02-@")) < 0)
            return md;
        /* leap years of 1000-9999: a multiple of 4 whose last two digits
         * are not 00, or a multiple of 400 (its first two digits a
         * multiple of 4) */
        int leap = SPEC(c, NULL, "[1-9][0-9]0[48]", "[1-9][0-9][2468][048]", "[1-9][0-9][13579][26]",
                        "1[26]00", "[2468][048]00", "[3579][26]00");
        if (leap < 0)
            return leap;
        int yrefs[2] = { md, leap };
        if ((dr = SPEC(c, yrefs, "[1-9][0-9]{3}-@", "@-02-29")) < 0)
            return dr;
    }
    if (time || dt) {
        if ((hh = SPEC(c, NULL, "[01][0-9]", "2[0-3]")) < 0)
            return hh;
        int frac = SPEC(c, NULL, ".[0-9]{1,6}", ""), tz = SPEC(c, &hh, "Z", "[+-]@:[0-5][0-9]");
        if (frac < 0 || tz < 0)
            return frac < 0 ? frac : tz;
        int trefs[3] = { hh, frac, tz };
        if ((tr = SPEC(c, trefs, "@:[0-5][0-9]:[0-5][0-9]@@")) < 0)
            return tr;
    }
    if (!dt)
        return date ? dr : tr;
    int refs[2] = { dr, tr };
    return SPEC(c, refs, "@T@");
}

/* The length range of the text of rule r, for rules of ASCII bytes (the
 * formats: one byte is one character); hi is G_INF for text of any length
 * (GE_STR, GE_TXT, or a rule nested deeper than any format's). */
static void ascii_len_range(const rlai_grammar *g, int r, int depth, long *lo, long *hi)
{
    if (depth > G_MAX_SCHEMA_DEPTH) {
        *lo = 0;
        *hi = G_INF;
        return;
    }
    *lo = G_INF;
    *hi = 0;
    const grule *ru = &g->rules[r];
    for (int i = 0; i < ru->n; i++) {
        long a = 0, b = 0;
        for (const gelem *e = &g->el[ru->alt[i]]; e->kind != GE_END; e++) {
            long ea = 1, eb = 1;
            if (e->kind == GE_REP) {
                ea = e->a;
                eb = e->b;
            } else if (e->kind == GE_REF) {
                ascii_len_range(g, e->a, depth + 1, &ea, &eb);
            } else if (e->kind != GE_CHARS) {
                ea = 0;
                eb = G_INF;
            }
            a += ea;
            b = (b >= G_INF || eb >= G_INF) ? G_INF : b + eb;
        }
        *lo = a < *lo ? a : *lo;
        *hi = b > *hi ? b : *hi;
    }
}

/* One host label (RFC 1123): 1 to lab letters and digits, then (for lab
 * of 12 or more) up to two groups of one or two hyphens and 1 to lab/4
 * more letters and digits: at most label_max(lab) characters (60 for lab
 * 38, under RFC 1035's 63). Every part is a repetition, so the mask takes
 * the tokens of letters and digits at once (rep_cache). */
static int label_more(int lab) { return lab >= 12 ? lab / 4 : 0; }
static int label_max(int lab) { return label_more(lab) ? lab + 2 * (2 + label_more(lab)) : lab; }

static int label_rule(sc *c, int lab)
{
    int more = label_more(lab), hy = -1;
    char sp[64];
    for (int k = 0; k < 2 && more; k++) {
        snprintf(sp, sizeof sp, "[-]{1,2}[A-Za-z0-9]{1,%d}%s", more, k == 0 ? "" : "@");
        int refs[1] = { hy };
        if ((hy = SPEC(c, refs, sp, "")) < 0)
            return hy;
    }
    snprintf(sp, sizeof sp, "[A-Za-z0-9]{1,%d}%s", lab, more ? "@" : "");
    int refs[1] = { hy };
    return SPEC(c, refs, sp);
}

/* A host name: 1 to nl labels of up to lab characters, dots between. */
static int hostname_body(sc *c, int lab, int nl)
{
    int label = label_rule(c, lab), more = -1;
    for (int k = 0; k < nl - 1 && label >= 0; k++) {
        int refs[2] = { label, more };
        if ((more = SPEC(c, refs, k == 0 ? ".@" : ".@@", "")) < 0)
            return more;
    }
    int refs[2] = { label, more };
    return label < 0 ? label : more < 0 ? SPEC(c, refs, "@") : SPEC(c, refs, "@@");
}

/* An e-mail address, in a conservative form that HTML's type=email and
 * Pydantic's EmailStr both take: dot-atoms of RFC 5322 atext before the
 * '@' (the first of up to t[0] characters, up to t[2] more of up to t[1]),
 * then 1 to t[4] host labels of up to t[3] characters and a top-level
 * domain of 2 to t[5] letters. No quoted local parts, no address
 * literals. */
static int email_body(sc *c, const int *t)
{
    static const char atext[] = "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]";
    char sp[96];
    int more = -1;
    for (int k = 0; k < t[2]; k++) {
        snprintf(sp, sizeof sp, ".%s{1,%d}%s", atext, t[1], k == 0 ? "" : "@");
        int refs[1] = { more };
        if ((more = SPEC(c, refs, sp, "")) < 0)
            return more;
    }
    snprintf(sp, sizeof sp, "%s{1,%d}%s", atext, t[0], more < 0 ? "" : "@");
    int refs[1] = { more };
    int local = SPEC(c, refs, sp);
    snprintf(sp, sizeof sp, "[A-Za-z]{2,%d}", t[5]);
    int label = label_rule(c, t[3]), rest = SPEC(c, NULL, sp);
    for (int k = 0; k < t[4] - 1 && label >= 0 && rest >= 0; k++) {
        int r3[3] = { rest, label, rest };           /* tld | label . rest */
        rest = SPEC(c, r3, "@", "@.@");
    }
    if (local < 0 || label < 0 || rest < 0)
        return local < 0 ? local : label < 0 ? label : rest;
    int r4[3] = { local, label, rest };
    return SPEC(c, r4, "@[@]@.@");
}

/* A URI (RFC 3986) of a well-known scheme: http, https, ws, wss, ftp,
 * ftps, sftp, ssh or git, then '://' host [':' port] [path]; or mailto,
 * tel, urn or data, then ':' and a path (no '/' first); then [? query]
 * [# fragment]. Hosts as hostname_body (IPv4 addresses are such names
 * too), ports 1-59999, characters unreserved, sub-delims, ':' and '@' (no
 * percent escapes). A subset of what RFC 3986 allows, chosen for
 * generation: any scheme would let a model write "moulin.com.:x" for a
 * website (a valid URI that no browser or Pydantic's HttpUrl takes). Caps:
 * host labels lab (nl of them), path p, query q, fragment f characters. */
static int uri_body(sc *c, int lab, int nl, int p, int q, int f)
{
#define PCH "A-Za-z0-9._~!$&'()*+,;=:@"   /* and '-', last in each set */
    char sp[5][96];
    snprintf(sp[0], sizeof sp[0], "/[" PCH "/-]{0,%d}", p - 1);
    snprintf(sp[1], sizeof sp[1], "/[" PCH "/-]{0,%d}", p - p / 2 - 2 > 0 ? p - p / 2 - 2 : 0);
    snprintf(sp[2], sizeof sp[2], "[" PCH "-]{1,%d}@", p / 2 > 1 ? p / 2 : 1);   /* no '/' first */
    snprintf(sp[3], sizeof sp[3], "?[" PCH "/?-]{0,%d}", q - 1);
    snprintf(sp[4], sizeof sp[4], "#[" PCH "/?-]{0,%d}", f - 1);
#undef PCH
    int rest = SPEC(c, NULL, sp[1], "");
    int r[8] = { SPEC(c, NULL, "http", "https", "ws", "wss", "ftp", "ftps", "sftp", "ssh", "git"),
                 hostname_body(c, lab, nl), SPEC(c, NULL, ":[1-9][0-9]{0,3}", ":[1-5][0-9]{4}", ""),
                 SPEC(c, NULL, sp[0], ""), SPEC(c, NULL, "mailto", "tel", "urn", "data"),
                 rest < 0 ? rest : SPEC(c, &rest, sp[2]),
                 SPEC(c, NULL, sp[3], ""), SPEC(c, NULL, sp[4], "") };
    for (int i = 0; i < 8; i++)
        if (r[i] < 0)
            return r[i];
    /* web scheme :// host port path, or opaque scheme : path */
    int hier = SPEC(c, r, "@://@@@", "@:@");
    int ur[3] = { hier, r[6], r[7] };          /* then the query and the fragment */
    return hier < 0 ? hier : SPEC(c, ur, "@@@");
}

/* Caps of the formats with parts of open length, largest first: under a
 * maxLength the first whose longest text fits is taken. */
static const int email_tiers[][6] = {   /* first atom, atom, more atoms, label, labels, tld */
    { 30, 10, 3, 24, 4, 24 }, { 24, 10, 2, 16, 3, 12 }, { 16, 8, 1, 12, 2, 10 }, { 12, 8, 1, 10, 1, 8 },
    { 10, 5, 1, 8, 1, 4 }, { 6, 4, 1, 5, 1, 3 }, { 4, 2, 0, 3, 1, 2 },
};
static const int host_tiers[][2] = { { 30, 5 }, { 20, 4 }, { 12, 3 }, { 8, 2 }, { 5, 2 }, { 3, 1 } };
/* URIs: label, labels; what the scheme and host leave goes to the path (a
 * half, up to 1024), the query (3/8, up to 1024) and the fragment (the
 * rest, up to 256); a tier is taken when it leaves a fifth of the
 * maxLength or more. */
static const int uri_tiers[][2] = { { 30, 5 }, { 20, 4 }, { 12, 3 }, { 10, 3 }, { 10, 2 }, { 8, 2 }, { 5, 2 } };

/* The URI of tier i under maxLength max (G_INF: none), or
 * RLAI_ERR_NOT_FOUND when that tier leaves too little room and is not the
 * last. */
static int uri_tier(sc *c, int i, int max)
{
    const int *t = uri_tiers[i];
    long fixed = 6 + 3 + (label_max(t[0]) * t[1] + t[1] - 1) + 6;   /* scheme :// host :port */
    long room = (long)max - fixed;
    if ((room < 3 || room * 5 < max) && i < (int)(sizeof uri_tiers / sizeof *uri_tiers) - 1)
        return RLAI_ERR_NOT_FOUND;
    long p = room / 2 > 1024 ? 1024 : room / 2, q = room * 3 / 8 > 1024 ? 1024 : room * 3 / 8;
    long f = room - p - q > 256 ? 256 : room - p - q;
    return uri_body(c, t[0], t[1], p < 2 ? 2 : (int)p, q < 1 ? 1 : (int)q, f < 1 ? 1 : (int)f);
}

/* The string rule of an enforced format, its text within min..max
 * characters, or RLAI_ERR_NOT_FOUND for a format that stays an
 * annotation. Under a maxLength, addresses, URIs and host names take the
 * largest caps whose text fits (the tiers above). A format whose text can
 * be shorter than minLength, or cannot be kept within maxLength, is
 * refused. */
static int format_string_rule(sc *c, const char *f, int min, int max)
{
    bool email = !strcmp(f, "email"), host = !strcmp(f, "hostname"), uri = !strcmp(f, "uri");
    int n = email ? (int)(sizeof email_tiers / sizeof *email_tiers)
            : host ? (int)(sizeof host_tiers / sizeof *host_tiers)
            : uri ? (int)(sizeof uri_tiers / sizeof *uri_tiers) : 1;
    long lo = 0, hi = 0;
    int body = RLAI_ERR_NOT_FOUND;
    for (int i = 0; i < n; i++) {
        if (email)
            body = email_body(c, email_tiers[i]);
        else if (host)
            body = hostname_body(c, host_tiers[i][0], host_tiers[i][1]);
        else if (uri)
            body = uri_tier(c, i, max);
        else
            body = format_rule(c, f);
        if (uri && body == RLAI_ERR_NOT_FOUND)
            continue;
        if (body < 0)
            return body;
        ascii_len_range(c->g, body, 0, &lo, &hi);
        if (hi <= max)
            break;
    }
    if (lo < min || hi > max)
        return sc_fail(c, RLAI_ERR_UNSUPPORTED,
                       "'format' '%s' with minLength or maxLength is not supported here (its text has %ld to %ld characters)",
                       f, lo, hi);
    gseq q = { 0 };
    seq_byte(c->g, &q, '"');
    seq_ref(&q, body);
    seq_byte(c->g, &q, '"');
    return rule_one(c->g, &q);
}

/* ---- pattern (a regular expression over the string's characters)
 *
 * A subset of ECMA-262: literal characters (UTF-8 too), escapes of
 * punctuation, \d \w \s and their negations, '.', classes [a-z_] and
 * [^...] of ASCII characters, groups ( ) and (?: ), '|', the quantifiers
 * ? * + {n} {n,} {n,m} (lazy ones as greedy: the language is the same),
 * '^' at the start and '$' at the end. Without '^' any text may come
 * first, without '$' any text after (JSON Schema patterns are not
 * anchored). Each character is written as JSON writes it in a string:
 * '"', '\' and control characters escaped; '.' and negated classes never
 * write a control character. Anything else (backreferences, lookaround,
 * \b, Unicode classes, non-ASCII ranges) is refused. */

typedef struct rx {
    sc *c;
    const char *p, *end, *pat;
    int depth, any;              /* any: the "any character" rule, or -1 */
    long long len_lo, len_hi;    /* characters the last atom, sequence or
                                    alternation matches (hi G_INF: unbounded) */
    long long len_fix;           /* len_hi with every unbounded repetition at
                                    its least */
    int n_unbounded;             /* unbounded repetitions seen */
    long long slack;             /* under a maxLength, the characters each
                                    unbounded repetition may add past its
                                    least (G_INF: no maxLength) */
} rx;

/* a + b and a * b of character counts, G_INF staying G_INF */
static long long rx_len_add(long long a, long long b)
{
    return a >= G_INF || b >= G_INF || a + b >= G_INF ? G_INF : a + b;
}

static long long rx_len_mul(long long a, long long b)
{
    if (a == 0 || b == 0)
        return 0;
    return a >= G_INF || b >= G_INF || a > G_INF / b ? G_INF : a * b;
}

static int rx_fail(rx *x, const char *what)
{
    return sc_fail(x->c, RLAI_ERR_UNSUPPORTED, "'pattern' %.60s: %s (at offset %d) is not supported", x->pat, what,
                   (int)(x->p - x->pat));
}

/* One character c (< 0x80) as JSON string text. */
static void rx_char_json(rlai_grammar *g, gseq *q, int ch)
{
    static const char hex[] = "0123456789abcdef";
    if (ch == '"' || ch == '\\') {
        seq_byte(g, q, '\\');
        seq_byte(g, q, (unsigned char)ch);
    } else if (ch < 0x20 || ch == 0x7f) {
        const char *named = ch == '\n' ? "\\n" : ch == '\t' ? "\\t" : ch == '\r' ? "\\r" : ch == '\f' ? "\\f" : NULL;
        if (named) {
            seq_lit(g, q, named, 2);
        } else {
            char u[7] = { '\\', 'u', '0', '0', hex[ch >> 4], hex[ch & 15], 0 };
            seq_lit(g, q, u, 6);
        }
    } else {
        seq_byte(g, q, (unsigned char)ch);
    }
}

/* A rule for one character of the ASCII set cls (128 flags), written as
 * JSON, plus (nonascii) any UTF-8 character from U+0080 on (not as a \u
 * escape). */
static int rx_class_rule(rx *x, const bool *cls, bool nonascii)
{
    rlai_grammar *g = x->c->g;
    int r = rule_new(g), rc;
    if (r < 0)
        return r;
    uint64_t b[4] = { 0, 0, 0, 0 };
    bool plain = false;
    gseq q = { 0 };
    for (int ch = 0; ch < 128; ch++) {
        if (!cls[ch])
            continue;
        if (ch >= 0x20 && ch != '"' && ch != '\\' && ch != 0x7f) {
            bits_set(b, ch);
            plain = true;
        } else {
            rx_char_json(g, &q, ch);
            if ((rc = rule_alt(g, r, &q)) < 0)
                return rc;
        }
    }
    if (plain) {
        seq_set(&q, set_add(g, b));
        if ((rc = rule_alt(g, r, &q)) < 0)
            return rc;
    }
    if (nonascii) {
        /* well-formed UTF-8 only (str_step's ranges) */
        static const char *const u8[] = {
            "[\xc2-\xdf][\x80-\xbf]", "\xe0[\xa0-\xbf][\x80-\xbf]", "[\xe1-\xec\xee\xef][\x80-\xbf]{2}",
            "\xed[\x80-\x9f][\x80-\xbf]", "\xf0[\x90-\xbf][\x80-\xbf]{2}", "[\xf1-\xf3][\x80-\xbf]{3}",
            "\xf4[\x80-\x8f][\x80-\xbf]{2}"
        };
        for (int i = 0; i < 7; i++) {
            int ri = 0;
            seq_spec(g, &q, u8[i], NULL, &ri);
            if ((rc = rule_alt(g, r, &q)) < 0)
                return rc;
        }
    }
    return r;
}

/* Adds the members of \d \w \s (lower case) to cls; upper case: sets neg. */
static bool rx_shorthand(int e, bool *cls, bool *neg)
{
    int l = e | 0x20;
    if (l != 'd' && l != 'w' && l != 's')
        return false;
    bool in[128] = { false };
    for (int ch = 0; ch < 128; ch++)
        in[ch] = l == 'd' ? (ch >= '0' && ch <= '9')
                 : l == 'w' ? ((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_')
                            : (ch == ' ' || (ch >= '\t' && ch <= '\r'));
    for (int ch = 0; ch < 128; ch++)
        if (e != l ? (!in[ch] && ch >= 0x20 && ch != 0x7f) : in[ch])
            cls[ch] = true;
    if (e != l && neg)
        *neg = true;     /* \D \W \S: non-ASCII characters too */
    return true;
}

/* The character an escape stands for (\n \t \r \f \v \0 and punctuation),
 * or -1. */
static int rx_escape_char(int e)
{
    switch (e) {
    case 'n': return '\n';
    case 't': return '\t';
    case 'r': return '\r';
    case 'f': return '\f';
    case 'v': return '\v';
    case '0': return 0;
    default: return e < 0x80 && strchr("\\^$.|?*+()[]{}/-\"'#&,:;<=>@_`~!%", e) ? e : -1;
    }
}

/* \xHH or \uHHHH at p (after the backslash): the characters it takes
 * (3 or 5) with its code point in *cp, or 0 when p holds neither. */
static int rx_hex_escape(const char *p, const char *end, int *cp)
{
    int n = *p == 'x' ? 2 : *p == 'u' ? 4 : 0, v = 0;
    if (!n || end - p < n + 1)
        return 0;
    for (int i = 1; i <= n; i++) {
        int ch = (unsigned char)p[i];
        int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
                : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
        if (d < 0)
            return 0;
        v = v * 16 + d;
    }
    *cp = v;
    return n + 1;
}

static int rx_alt(rx *x);

/* [...] after the '['. */
static int rx_class(rx *x)
{
    bool cls[128] = { false }, neg = false, non_ascii = false;
    if (x->p < x->end && *x->p == '^') {
        neg = true;
        x->p++;
    }
    bool any = false;
    while (x->p < x->end && *x->p != ']') {
        any = true;
        int lo;
        unsigned char ch = (unsigned char)*x->p;
        if (ch >= 0x80)
            return rx_fail(x, "a non-ASCII character in a class");
        if (ch == '\\') {
            if (x->p + 1 >= x->end)
                return rx_fail(x, "a '\\' at the end");
            int e = (unsigned char)x->p[1], hn = rx_hex_escape(x->p + 1, x->end, &lo);
            x->p += 2;
            bool sneg = false;
            if (hn) {
                x->p += hn - 1;
                if (lo >= 0x80)
                    return rx_fail(x, "a non-ASCII character in a class");
            } else if (rx_shorthand(e, cls, &sneg)) {
                non_ascii |= sneg;
                continue;
            } else if ((lo = rx_escape_char(e)) < 0) {
                return rx_fail(x, "this escape in a class");
            }
        } else {
            lo = ch;
            x->p++;
        }
        int hi = lo;
        if (x->p + 1 < x->end && *x->p == '-' && x->p[1] != ']') {
            unsigned char h = (unsigned char)x->p[1];
            int hn = h == '\\' && x->p + 2 < x->end ? rx_hex_escape(x->p + 2, x->end, &hi) : 0;
            if (hn) {
                x->p += 2 + hn;   /* a range ending in \xHH or \uHHHH */
                if (hi >= 0x80)
                    return rx_fail(x, "a non-ASCII character in a class");
            } else if (h >= 0x80 || h == '\\') {
                return rx_fail(x, "a range ending in an escape or a non-ASCII character");
            } else {
                hi = h;
                x->p += 2;
            }
            if (hi < lo)
                return rx_fail(x, "a range out of order");
        }
        for (int k = lo; k <= hi; k++)
            cls[k] = true;
    }
    if (x->p >= x->end)
        return rx_fail(x, "a class without its ']'");
    if (!any)
        return rx_fail(x, "an empty class");
    x->p++;
    if (neg) {
        for (int k = 0; k < 128; k++)
            cls[k] = !cls[k] && k >= 0x20 && k != 0x7f;   /* never a control character */
        return rx_class_rule(x, cls, !non_ascii);
    }
    return rx_class_rule(x, cls, non_ascii);
}

/* One atom (a character, class, group), as a rule. */
static int rx_atom(rx *x)
{
    rlai_grammar *g = x->c->g;
    unsigned char ch = (unsigned char)*x->p;
    gseq q = { 0 };
    if (ch == '(') {
        x->p++;
        if (x->p < x->end && *x->p == '?') {
            /* (?:X) and the named groups (?<name>X), (?P<name>X): a group */
            const char *n = x->p + 1 < x->end && x->p[1] == 'P' ? x->p + 2 : x->p + 1;
            if (x->p + 1 < x->end && x->p[1] == ':') {
                x->p += 2;
            } else if (n < x->end && *n == '<' && n + 1 < x->end && n[1] != '=' && n[1] != '!') {
                const char *e = n + 1;
                while (e < x->end && ((*e >= 'a' && *e <= 'z') || (*e >= 'A' && *e <= 'Z') ||
                                      (*e >= '0' && *e <= '9') || *e == '_'))
                    e++;
                if (e == n + 1 || e >= x->end || *e != '>')
                    return rx_fail(x, "a group name that is not letters, digits and '_'");
                x->p = e + 1;
            } else {
                return rx_fail(x, "a lookaround or an inline flag");
            }
        }
        if (++x->depth > G_MAX_SCHEMA_DEPTH)
            return rx_fail(x, "nesting this deep");
        int r = rx_alt(x);   /* sets len_lo, len_hi */
        x->depth--;
        if (r < 0)
            return r;
        if (x->p >= x->end || *x->p != ')')
            return rx_fail(x, "a group without its ')'");
        x->p++;
        return r;
    }
    x->len_lo = x->len_hi = x->len_fix = 1;   /* anything else is one character */
    if (ch == '[') {
        x->p++;
        return rx_class(x);
    }
    if (ch == '.') {
        x->p++;
        if (x->any < 0) {
            bool cls[128];
            for (int k = 0; k < 128; k++)
                cls[k] = k >= 0x20 && k != 0x7f;
            x->any = rx_class_rule(x, cls, true);
        }
        return x->any;
    }
    if (ch == '\\') {
        if (x->p + 1 >= x->end)
            return rx_fail(x, "a '\\' at the end");
        int e = (unsigned char)x->p[1];
        bool cls[128] = { false }, neg = false;
        if (rx_shorthand(e, cls, &neg)) {
            x->p += 2;
            return rx_class_rule(x, cls, neg);
        }
        int lit, hn = rx_hex_escape(x->p + 1, x->end, &lit);
        if (hn && lit >= 0xD800 && lit <= 0xDFFF)
            return rx_fail(x, "a surrogate escape");
        if (!hn && (lit = rx_escape_char(e)) < 0)
            return rx_fail(x, "this escape");
        x->p += hn ? 1 + hn : 2;
        if (lit < 0x80) {
            rx_char_json(g, &q, lit);
        } else {   /* the character's UTF-8 bytes, as a literal one's */
            char u[3];
            int n = lit < 0x800 ? 2 : 3;
            if (n == 2) {
                u[0] = (char)(0xC0 | (lit >> 6));
                u[1] = (char)(0x80 | (lit & 0x3F));
            } else {
                u[0] = (char)(0xE0 | (lit >> 12));
                u[1] = (char)(0x80 | ((lit >> 6) & 0x3F));
                u[2] = (char)(0x80 | (lit & 0x3F));
            }
            seq_lit(g, &q, u, (size_t)n);
        }
        return rule_one(g, &q);
    }
    if (strchr("*+?{})|]", ch) && ch)
        return rx_fail(x, "a quantifier or bracket here");
    if (ch == '^' || ch == '$')
        return rx_fail(x, "an anchor inside the pattern");
    /* a literal character, with all its UTF-8 bytes */
    int n = ch < 0x80 ? 1 : ch >= 0xF0 ? 4 : ch >= 0xE0 ? 3 : 2;
    if (x->p + n > x->end)
        n = (int)(x->end - x->p);
    if (ch < 0x80)
        rx_char_json(g, &q, ch);
    else
        seq_lit(g, &q, x->p, (size_t)n);
    x->p += n;
    return rule_one(g, &q);
}

static bool rx_count(rx *x, int *v)
{
    if (x->p >= x->end || *x->p < '0' || *x->p > '9')
        return false;
    long n = 0;
    while (x->p < x->end && *x->p >= '0' && *x->p <= '9' && n <= G_MAX_REPEAT)
        n = n * 10 + (*x->p++ - '0');
    *v = (int)(n > G_MAX_REPEAT ? G_MAX_REPEAT + 1 : n);
    return true;
}

/* Whether rule r can match the empty text (pattern rules: acyclic but for
 * the loops of repeat_rule, which have an empty alternative, tried first). */
static bool rx_nullable(const rlai_grammar *g, int r, int depth)
{
    const grule *ru = &g->rules[r];
    for (int i = 0; i < ru->n; i++)
        if (g->el[ru->alt[i]].kind == GE_END)
            return true;
    if (depth > G_MAX_SCHEMA_DEPTH)
        return true;             /* (not reached by what rx builds) */
    for (int i = 0; i < ru->n; i++) {
        const gelem *e = &g->el[ru->alt[i]];
        for (;; e++) {
            if (e->kind == GE_END)
                return true;
            bool null = (e->kind == GE_REP && e->a == 0) || e->kind == GE_TXT ||
                        (e->kind == GE_REF && rx_nullable(g, e->a, depth + 1));
            if (!null)
                break;
        }
    }
    return false;
}

/* Rule atom, lo to hi times (hi may be G_INF), as a rule: the lo
 * required ones written out, then an optional chain (or a loop when
 * unbounded). Pattern quantifiers and array tails. */
static int repeat_rule(rlai_grammar *g, int atom, int lo, int hi)
{
    gseq q = { 0 };
    int rc, opt = -1;
    if (hi == G_INF) {
        if ((opt = rule_new(g)) < 0)
            return opt;
        seq_ref(&q, atom);
        seq_ref(&q, opt);
        if ((rc = rule_alt(g, opt, &q)) < 0 || (rc = rule_alt(g, opt, &q)) < 0)
            return rc;
    } else {
        for (int k = 0; k < hi - lo; k++) {
            int o = rule_new(g);
            if (o < 0)
                return o;
            seq_ref(&q, atom);
            if (opt >= 0)
                seq_ref(&q, opt);
            if ((rc = rule_alt(g, o, &q)) < 0 || (rc = rule_alt(g, o, &q)) < 0)
                return rc;
            opt = o;
        }
    }
    for (int k = 0; k < lo; k++)
        seq_ref(&q, atom);
    if (opt >= 0)
        seq_ref(&q, opt);
    return rule_one(g, &q);
}

/* A sequence of quantified atoms, up to '|', ')' or the end. */
static int rx_seq(rx *x)
{
    rlai_grammar *g = x->c->g;
    gseq q = { 0 };
    long long slo = 0, shi = 0, sfix = 0;
    while (x->p < x->end && *x->p != '|' && *x->p != ')') {
        if (*x->p == '$' && x->p + 1 == x->end && x->depth == 0)
            break;               /* the end anchor: rx_compile handles it */
        int a = rx_atom(x);
        if (a < 0) {
            free(q.e);
            return a;
        }
        long long alo = x->len_lo, ahi = x->len_hi, afix = x->len_fix;
        int lo = 1, hi = 1;
        if (x->p < x->end) {
            char k = *x->p;
            if (k == '?' || k == '*' || k == '+') {
                lo = k == '+';
                hi = k == '?' ? 1 : G_INF;
                x->p++;
            } else if (k == '{') {
                const char *save = x->p++;
                if (!rx_count(x, &lo)) {
                    x->p = save;
                    free(q.e);
                    return rx_fail(x, "a '{' that is not a count");
                }
                hi = lo;
                if (x->p < x->end && *x->p == ',') {
                    x->p++;
                    if (!rx_count(x, &hi))
                        hi = G_INF;
                }
                if (x->p >= x->end || *x->p != '}') {
                    free(q.e);
                    return rx_fail(x, "a count without its '}'");
                }
                x->p++;
                if (lo > G_MAX_REPEAT || (hi != G_INF && hi > G_MAX_REPEAT) || hi < lo) {
                    free(q.e);
                    return sc_fail(x->c, RLAI_ERR_TOO_LARGE, "'pattern': a count above %d or out of order",
                                   G_MAX_REPEAT);
                }
            }
            if ((lo != 1 || hi != 1) && x->p < x->end && *x->p == '?')
                x->p++;          /* lazy: the same language */
            if ((lo != 1 || hi != 1) && x->p < x->end && (*x->p == '+' || *x->p == '*' || *x->p == '{')) {
                free(q.e);
                return rx_fail(x, "a quantifier after a quantifier");
            }
        }
        if (hi == G_INF && rx_nullable(g, a, 0)) {
            free(q.e);
            return rx_fail(x, "an unbounded repetition of what can match nothing (as in (a*)*)");
        }
        bool unbounded = hi == G_INF;
        x->n_unbounded += unbounded;
        if (unbounded && x->slack < G_INF) {
            /* under a maxLength: its share of the slack, at least one
             * (a repetition that cannot fit once makes the sum too long
             * and the pattern is refused rather than silently dropped) */
            long long more = x->slack / (ahi > 0 ? ahi : 1), h = lo + more;
            h = h > G_MAX_REPEAT ? G_MAX_REPEAT : h;
            hi = (int)(h > 1 ? h : 1);
        }
        if (lo != 1 || hi != 1)
            a = repeat_rule(g, a, lo, hi);
        if (a < 0) {
            free(q.e);
            return a;
        }
        seq_ref(&q, a);
        slo = rx_len_add(slo, rx_len_mul(alo, lo));
        shi = rx_len_add(shi, rx_len_mul(ahi, hi));
        sfix = rx_len_add(sfix, rx_len_mul(afix, unbounded ? lo : hi));
    }
    x->len_lo = slo;
    x->len_hi = shi;
    x->len_fix = sfix;
    return rule_one(g, &q);
}

static int rx_alt(rx *x)
{
    rlai_grammar *g = x->c->g;
    int r = rule_new(g), rc;
    long long lo = G_INF, hi = 0, fix = 0;
    if (r < 0)
        return r;
    for (;;) {
        int s = rx_seq(x);
        if (s < 0)
            return s;
        lo = x->len_lo < lo ? x->len_lo : lo;
        hi = x->len_hi > hi ? x->len_hi : hi;
        fix = x->len_fix > fix ? x->len_fix : fix;
        gseq q = { 0 };
        seq_ref(&q, s);
        if ((rc = rule_alt(g, r, &q)) < 0)
            return rc;
        if (x->p < x->end && *x->p == '|') {
            x->p++;
            continue;
        }
        x->len_lo = lo;
        x->len_hi = hi;
        x->len_fix = fix;
        return r;
    }
}

/* The string rule of a pattern: '"' [any*] pattern [any*] '"'. With a
 * minLength or maxLength (min 0, max G_INF: none) the pattern's own
 * length must keep within them: the grammar does not count characters
 * across a pattern. Under a maxLength, when the pattern could be longer,
 * it is read again with each unbounded repetition cut to an even share of
 * the room its fixed parts leave (^[a-z_]+$ with maxLength 32:
 * [a-z_]{1,32}); the result must fit. */
static int pattern_rule(sc *c, const char *pat, int min, int max)
{
    rx x;
    int body = -1;
    bool head = false, tail = false;
    long long slack = G_INF;
    for (int pass = 0; pass < 2; pass++) {
        x = (rx){ c, pat, pat + strlen(pat), pat, 0, -1, 0, 0, 0, 0, slack };
        head = x.p < x.end && *x.p == '^';
        if (head)
            x.p++;
        body = rx_alt(&x);
        if (body < 0)
            return body;
        tail = x.p < x.end && *x.p == '$';
        if (tail)
            x.p++;
        if (x.p != x.end)
            return rx_fail(&x, *x.p == ')' ? "a ')' without its '('" : "this");
        if ((head || tail) && c->g->rules[body].n > 1)   /* ^a|b$ anchors a on the left and b on the right only */
            return sc_fail(c, RLAI_ERR_UNSUPPORTED,
                           "'pattern' %.60s: '^' or '$' beside a '|' outside a group is not supported (write ^(a|b)$)",
                           pat);
        /* too long for a maxLength with unbounded repetitions: once more,
         * each taking an even share of what is left */
        if (pass || max >= G_INF || !head || !tail || x.len_hi <= max || !x.n_unbounded || x.len_fix >= max)
            break;
        slack = (max - x.len_fix) / x.n_unbounded;
    }
    long long plo = x.len_lo, phi = head && tail ? x.len_hi : G_INF;
    if (plo < min || phi > max) {
        char hs[24] = "any number of";
        if (phi < G_INF)
            snprintf(hs, sizeof(hs), "%lld", phi);
        return sc_fail(c, RLAI_ERR_UNSUPPORTED,
                       "'pattern' %.60s with minLength or maxLength is supported when the pattern's own length keeps "
                       "within them (it matches %lld to %s characters%s)",
                       pat, plo, hs, slack < G_INF ? ", each unbounded repetition given its share of maxLength" : "");
    }
    /* unanchored ends: any string text (GE_TXT: the mask takes its plain
     * tokens at once, as inside a string) */
    gseq q = { 0 };
    seq_byte(c->g, &q, '"');
    if (!head)
        seq_push(&q, (gelem){ GE_TXT, 0, 0, 0 });
    seq_ref(&q, body);
    if (!tail)
        seq_push(&q, (gelem){ GE_TXT, 0, 0, 0 });
    seq_byte(c->g, &q, '"');
    return rule_one(c->g, &q);
}

static int string_rule(sc *c, int min, int max)
{
    if (min == 0 && max == G_INF && c->r_string >= 0)
        return c->r_string;
    gseq s = { 0 };
    seq_byte(c->g, &s, '"');
    seq_push(&s, (gelem){ GE_STR, 0, min, max });
    int r = rule_one(c->g, &s);
    if (min == 0 && max == G_INF)
        c->r_string = r;
    return r;
}

/* The generic JSON value and object rules (json_object, {} schemas). */
static int value_rules(sc *c)
{
    if (c->r_value >= 0)
        return 0;
    rlai_grammar *g = c->g;
    int rc;
    gseq s = { 0 };
    int str = string_rule(c, 0, G_INF), num = number_rule(c);
    if (str < 0 || num < 0)
        return str < 0 ? str : num;
    if ((c->r_value = rule_new(g)) < 0 || (c->r_object = rule_new(g)) < 0 || (c->r_array = rule_new(g)) < 0)
        return RLAI_ERR_NOMEM;
    int member = rule_new(g), mtail = rule_new(g), atail = rule_new(g);
    if (member < 0 || mtail < 0 || atail < 0)
        return RLAI_ERR_NOMEM;
    const int alts[] = { c->r_object, c->r_array, str, num };
    for (int i = 0; i < 4; i++) {
        seq_ref(&s, alts[i]);
        if ((rc = rule_alt(g, c->r_value, &s)) < 0)
            return rc;
    }
    const char *lits[] = { "true", "false", "null" };
    for (int i = 0; i < 3; i++) {
        seq_lit(g, &s, lits[i], strlen(lits[i]));
        if ((rc = rule_alt(g, c->r_value, &s)) < 0)
            return rc;
    }
    /* member ::= string ws ':' ws value */
    seq_ref(&s, str);
    seq_ws(g, &s);
    seq_byte(g, &s, ':');
    seq_ws(g, &s);
    seq_ref(&s, c->r_value);
    if ((rc = rule_alt(g, member, &s)) < 0)
        return rc;
    /* mtail ::= ws ',' ws member mtail | () */
    seq_ws(g, &s);
    seq_byte(g, &s, ',');
    seq_ws(g, &s);
    seq_ref(&s, member);
    seq_ref(&s, mtail);
    if ((rc = rule_alt(g, mtail, &s)) < 0 || (rc = rule_alt(g, mtail, &s)) < 0)
        return rc;
    /* object ::= '{' ws '}' | '{' ws member mtail ws '}' */
    seq_byte(g, &s, '{');
    seq_ws(g, &s);
    seq_byte(g, &s, '}');
    if ((rc = rule_alt(g, c->r_object, &s)) < 0)
        return rc;
    seq_byte(g, &s, '{');
    seq_ws(g, &s);
    seq_ref(&s, member);
    seq_ref(&s, mtail);
    seq_ws(g, &s);
    seq_byte(g, &s, '}');
    if ((rc = rule_alt(g, c->r_object, &s)) < 0)
        return rc;
    /* atail ::= ws ',' ws value atail | () ; array like object */
    seq_ws(g, &s);
    seq_byte(g, &s, ',');
    seq_ws(g, &s);
    seq_ref(&s, c->r_value);
    seq_ref(&s, atail);
    if ((rc = rule_alt(g, atail, &s)) < 0 || (rc = rule_alt(g, atail, &s)) < 0)
        return rc;
    seq_byte(g, &s, '[');
    seq_ws(g, &s);
    seq_byte(g, &s, ']');
    if ((rc = rule_alt(g, c->r_array, &s)) < 0)
        return rc;
    seq_byte(g, &s, '[');
    seq_ws(g, &s);
    seq_ref(&s, c->r_value);
    seq_ref(&s, atail);
    seq_ws(g, &s);
    seq_byte(g, &s, ']');
    return rule_alt(g, c->r_array, &s);
}

static bool kw_in(const char *k, const char *const *list)
{
    for (; *list; list++)
        if (!strcmp(k, *list))
            return true;
    return false;
}

static const char *const kw_supported[] = {
    "type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems",
    "enum", "const", "anyOf", "oneOf", "$ref", "$defs", "definitions", "minLength", "maxLength",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "prefixItems", "additionalItems",
    "allOf", "pattern", "uniqueItems", "multipleOf", "minProperties", "maxProperties", NULL
};
/* Annotations: no effect on what is valid ("format" is an annotation by
 * default in JSON Schema 2020-12; on a string, date, time, date-time,
 * uuid, the IP addresses (ipv4, ipv6, ipvanyaddress, the interfaces),
 * duration, email, uri and hostname are enforced all the same:
 * format_string_rule). */
static const char *const kw_annotation[] = {
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "format",
    "deprecated", "readOnly", "writeOnly", "nullable",
    /* OpenAPI's hint beside a oneOf (Pydantic's discriminated unions):
     * which property tells the alternatives apart. Each alternative holds
     * that property's const already, so the oneOf alone decides. */
    "discriminator", NULL
};

static int compile(sc *c, const cJSON *s, int depth);

static int get_count(sc *c, const cJSON *s, const char *key, int dflt, int limit, int *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, key);
    *out = dflt;
    if (!v)
        return 0;
    /* the bound before the integer test: casting 4e63 to an integer is
     * undefined (fuzz_grammar found it) */
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) || v->valuedouble != floor(v->valuedouble))
        return sc_fail(c, RLAI_ERR_INVALID_ARG, "'%s' must be a non-negative integer", key);
    if (v->valuedouble > limit)
        return sc_fail(c, RLAI_ERR_TOO_LARGE, "'%s' above %d is not supported", key, limit);
    *out = (int)v->valuedouble;
    return 0;
}

/* Literal values (enum / const), each printed compactly, compiled as a
 * prefix tree: one rule per point where the values part, so the matcher
 * follows one path through them instead of keeping a head per value (the
 * heads of a state are capped at G_MAX_HEADS: an enum of 300 strings used
 * to lose all but its first 128 values without a word). */
typedef struct lit {
    char *s;
    size_t n;
} lit;

typedef struct lits {
    lit *v;
    int n, cap;
} lits;

/* Appends text (malloc'd; L owns it, also on failure). */
static int lits_push(lits *L, char *text)
{
    if (!text)
        return RLAI_ERR_NOMEM;
    if (L->n == L->cap) {
        int nc = L->cap ? L->cap * 2 : 16;
        lit *nv = realloc(L->v, sizeof(lit) * (size_t)nc);
        if (!nv) {
            free(text);
            return RLAI_ERR_NOMEM;
        }
        L->v = nv;
        L->cap = nc;
    }
    L->v[L->n++] = (lit){ text, strlen(text) };
    return 0;
}

static int lits_add(lits *L, const cJSON *v) { return lits_push(L, cJSON_PrintUnformatted(v)); }

static void lits_free(lits *L)
{
    for (int i = 0; i < L->n; i++)
        free(L->v[i].s);
    free(L->v);
}

static int lit_cmp(const void *a, const void *b)
{
    const lit *x = a, *y = b;
    int c = memcmp(x->s, y->s, x->n < y->n ? x->n : y->n);
    return c ? c : (x->n > y->n) - (x->n < y->n);
}

/* The rule matching the rest, from byte pos, of the sorted values
 * L[lo..hi), which share their first pos bytes. */
static int lit_trie(sc *c, const lit *L, int lo, int hi, size_t pos, int depth)
{
    rlai_grammar *g = c->g;
    if (depth > G_MAX_LIT_BRANCH)
        return sc_fail(c, RLAI_ERR_TOO_LARGE, "'enum' values that part at more than %d points along one value",
                       G_MAX_LIT_BRANCH);
    int r = rule_new(g), rc;
    if (r < 0)
        return r;
    int i = lo;
    if (L[i].n == pos) {               /* a value ends here (sorted first) */
        gseq q = { 0 };
        if ((rc = rule_alt(g, r, &q)) < 0)
            return rc;
        while (i < hi && L[i].n == pos)
            i++;                       /* and its duplicates */
    }
    while (i < hi) {
        unsigned char b = (unsigned char)L[i].s[pos];
        int j = i + 1;
        while (j < hi && (unsigned char)L[j].s[pos] == b)
            j++;
        /* the group's common prefix: that of its first and last value */
        const lit *f = &L[i], *l = &L[j - 1];
        size_t end = pos + 1, lim = f->n < l->n ? f->n : l->n;
        while (end < lim && f->s[end] == l->s[end])
            end++;
        gseq q = { 0 };
        seq_lit(g, &q, f->s + pos, end - pos);
        if (l->n > end) {              /* else all of them end at end */
            int child = lit_trie(c, L, i, j, end, depth + 1);
            if (child < 0) {
                free(q.e);
                return child;
            }
            seq_ref(&q, child);
        }
        if ((rc = rule_alt(g, r, &q)) < 0)
            return rc;
        i = j;
    }
    return r;
}

static int lits_rule(sc *c, lits *L)
{
    qsort(L->v, (size_t)L->n, sizeof(lit), lit_cmp);
    return lit_trie(c, L->v, 0, L->n, 0, 0);
}

/* ---- multipleOf
 *
 * A step m is taken as the decimal it was written as, p / 10^k (the
 * shortest decimal that reads back as the same double: 0.01 is 1 / 10^2,
 * not the binary fraction nearest it), so the values are the texts of
 * N / 10^k for the integers N that p divides. Without bounds, or with one
 * bound at or next to 0, a grammar follows the remainder of N mod p digit
 * by digit (multiple_positive: 15 rules per remainder of the integer part,
 * k per remainder of the fraction, at most G_MULT_STATES); with both
 * bounds the values between are listed (at most G_MULT_VALUES, as a
 * prefix tree), written without trailing zeros; a step of 10^-k over
 * larger bounds is a bounded number with at most k fraction digits.
 * Integer and fraction digits are capped at 15 each, as plain numbers'
 * are at 16. */
#define G_MULT_STATES 2048    /* remainder rules of a multipleOf grammar */
#define G_MULT_VALUES 20000   /* multiples listed between two bounds */
#define G_MULT_DIGITS 15      /* integer digits written; k <= 15 fraction digits */

typedef struct gmult {
    long long p;   /* 0: no multipleOf */
    int k;
} gmult;

static long long gcd_ll(long long a, long long b)
{
    while (b) {
        long long t = a % b;
        a = b;
        b = t;
    }
    return a;
}

static long long pow10_ll(int k)
{
    long long x = 1;
    while (k-- > 0)
        x *= 10;
    return x;
}

/* Reads multipleOf into *m (m->p = 0 when there is none). For an integer
 * the step becomes the least whole multiple of it: 0.5 gives 1, 2.5 gives
 * 5. */
static int read_multiple(sc *c, const cJSON *s, bool integer, gmult *m)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(s, "multipleOf");
    *m = (gmult){ 0, 0 };
    if (!it)
        return 0;
    if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble) || it->valuedouble <= 0)
        return sc_fail(c, RLAI_ERR_INVALID_ARG, "'multipleOf' must be a number above 0");
    double v = it->valuedouble;
    char dig[24];
    int ex;
    shortest_digits(v, dig, &ex);
    long long p = atoll(dig);
    for (; ex > 0; ex--) {
        if (p > G_NUM_MAX / 10)
            return sc_fail(c, RLAI_ERR_UNSUPPORTED, "'multipleOf' %g is not supported: no multiple but 0 has at most 16 digits", v);
        p *= 10;
    }
    int k = -ex;
    if (k > G_MULT_DIGITS)
        return sc_fail(c, RLAI_ERR_UNSUPPORTED, "'multipleOf' %g is not supported: at most %d fraction digits are", v,
                       G_MULT_DIGITS);
    if (integer) {
        p /= gcd_ll(p, pow10_ll(k));
        k = 0;
    }
    *m = (gmult){ p, k };
    return 0;
}

/* Adds the text of N / 10^k to L (no trailing fraction zeros). */
static int lits_add_scaled(lits *L, long long N, int k)
{
    long long s = pow10_ll(k), a = N < 0 ? -N : N, f = a % s;
    char buf[48];
    int w = snprintf(buf, sizeof(buf), "%s%lld", N < 0 ? "-" : "", a / s);
    if (f) {
        w += snprintf(buf + w, sizeof(buf) - (size_t)w, ".%0*lld", k, f);
        while (buf[w - 1] == '0')
            buf[--w] = 0;
    }
    return lits_push(L, strdup(buf));
}

/* The listed values p*i / 10^k for i in [a, b] (b - a < G_MULT_VALUES). */
static int multiple_list(sc *c, long long p, int k, long long a, long long b)
{
    lits L = { NULL, 0, 0 };
    int rc = 0;
    for (long long i = a; i <= b && rc == 0; i++)
        rc = lits_add_scaled(&L, i * p, k);
    if (rc == 0)
        rc = lits_rule(c, &L);
    lits_free(&L);
    return rc;
}

/* Adds to rule r, for each remainder t with T[t] >= 0, the alternative
 * "prefix, a digit d of lo..9 with (base + d * mul) mod q = t, then T[t]"
 * (the digits of one t as one byte set). */
static int digit_alts(rlai_grammar *g, int r, const char *prefix, long long base, long long mul, long long q,
                      int lo, const int *T)
{
    int ts[10], n = 0, rc = 0;
    uint64_t b[10][4];
    memset(b, 0, sizeof(b));
    for (int d = lo; d <= 9; d++) {
        int t = (int)((base + d * mul) % q), i = 0;
        if (T[t] < 0)
            continue;
        while (i < n && ts[i] != t)
            i++;
        if (i == n)
            ts[n++] = t;
        bits_set(b[i], '0' + d);
    }
    for (int i = 0; i < n && rc >= 0; i++) {
        gseq s = { 0 };
        if (prefix)
            seq_lit(g, &s, prefix, strlen(prefix));
        seq_set(&s, set_add(g, b[i]));
        seq_ref(&s, T[ts[i]]);
        rc = rule_alt(g, r, &s);
    }
    return rc;
}

/* Rules of a multipleOf grammar for p / 10^k (multiple_positive): q, the
 * modulus of the integer part (p over its common factor with 10^k: the
 * integer part V counts only through V * 10^k mod p), and the rule count. */
static long long multiple_states(long long p, int k, long long *q)
{
    *q = p / gcd_ll(p, pow10_ll(k));
    return G_MULT_DIGITS * *q + k * p;
}

/* The texts of the multiples above 0: an integer part of 1 to 15 digits
 * without a leading zero, or "0", then optionally "." and 1 to k digits;
 * the value times 10^k, N, a multiple of p. I[(n - 1) * q + v]: n integer
 * digits read, their value mod q is v; F[(j - 1) * p + a]: j fraction
 * digits read, N so far (the digits to come as zeros) mod p is a; Z[j]:
 * "0." and j zeros. A state from which no multiple can end has no rule
 * (-1) and is never entered: the matcher must not reach a dead end. */
static int multiple_positive(sc *c, long long p, int k)
{
    rlai_grammar *g = c->g;
    long long q;
    multiple_states(p, k, &q);
    int np = (int)p, nq = (int)q, nI = G_MULT_DIGITS * nq, nF = k * np, rc = 0;
    int *I = malloc(sizeof(int) * (size_t)(nI + nF + k + 1));
    if (!I)
        return RLAI_ERR_NOMEM;
    int *F = I + nI, *Z = F + nF;
    long long w[G_MULT_DIGITS + 1];   /* w[i] = 10^i mod p */
    w[0] = 1 % p;
    for (int i = 1; i <= G_MULT_DIGITS; i++)
        w[i] = w[i - 1] * 10 % p;
    /* liveness, backwards (1 = can still end a multiple; then the rule) */
    for (int j = k; j >= 1; j--)
        for (int a = 0; a < np; a++) {
            bool ok = a == 0;
            for (int d = 0; d <= 9 && !ok && j < k; d++)
                ok = F[j * np + (int)((a + d * w[k - j - 1]) % p)] >= 0;
            F[(j - 1) * np + a] = ok ? 1 : -1;
        }
    for (int n = G_MULT_DIGITS; n >= 1; n--)
        for (int v = 0; v < nq; v++) {
            bool ok = v == 0;
            for (int d = 0; d <= 9 && !ok; d++)
                ok = (n < G_MULT_DIGITS && I[n * nq + (int)((v * 10 + d) % q)] >= 0) ||
                     (k > 0 && F[(int)((v * w[k] + d * w[k - 1]) % p)] >= 0);
            I[(n - 1) * nq + v] = ok ? 1 : -1;
        }
    for (int j = k - 1; j >= 0; j--) {
        bool ok = j + 1 < k && Z[j + 1] >= 0;
        for (int d = 1; d <= 9 && !ok; d++)
            ok = F[j * np + (int)(d * w[k - j - 1] % p)] >= 0;
        Z[j] = ok ? 1 : -1;
    }
    for (int i = 0; i < nI + nF + k && rc >= 0; i++)
        if (I[i] >= 0)
            I[i] = rc = rule_new(g);
    gseq e = { 0 };
    for (int n = 1; n <= G_MULT_DIGITS && rc >= 0; n++)
        for (int v = 0; v < nq && rc >= 0; v++) {
            int r = I[(n - 1) * nq + v];
            if (r < 0)
                continue;
            if (v == 0)
                rc = rule_alt(g, r, &e);
            if (rc >= 0 && n < G_MULT_DIGITS)
                rc = digit_alts(g, r, NULL, v * 10, 1, q, 0, I + n * nq);
            if (rc >= 0 && k > 0)
                rc = digit_alts(g, r, ".", v * w[k], w[k - 1], p, 0, F);
        }
    for (int j = 1; j <= k && rc >= 0; j++)
        for (int a = 0; a < np && rc >= 0; a++) {
            int r = F[(j - 1) * np + a];
            if (r < 0)
                continue;
            if (a == 0)
                rc = rule_alt(g, r, &e);
            if (rc >= 0 && j < k)
                rc = digit_alts(g, r, NULL, a, w[k - j - 1], p, 0, F + j * np);
        }
    for (int j = 0; j < k && rc >= 0; j++) {
        if (Z[j] < 0)
            continue;
        if (j + 1 < k && Z[j + 1] >= 0) {
            gseq s = { 0 };
            seq_byte(g, &s, '0');
            seq_ref(&s, Z[j + 1]);
            rc = rule_alt(g, Z[j], &s);
        }
        if (rc >= 0)
            rc = digit_alts(g, Z[j], NULL, 0, w[k - j - 1], p, 1, F + j * np);
    }
    int top = rc < 0 ? rc : rule_new(g);
    rc = top;
    if (rc >= 0)   /* the first integer digit */
        rc = digit_alts(g, top, NULL, 0, 1, q, 1, I);
    if (rc >= 0 && k > 0 && Z[0] >= 0) {
        gseq s = { 0 };
        seq_lit(g, &s, "0.", 2);
        seq_ref(&s, Z[0]);
        rc = rule_alt(g, top, &s);
    }
    free(I);
    return rc < 0 ? rc : top;
}

/* The value of multiple i (i * p / 10^k) as the double a validator
 * compares: exact integers over a power of ten, one rounding. */
static double multiple_value(long long i, long long p, int k)
{
    return (double)(i * p) / (double)pow10_ll(k);
}

/* The least (lower) or greatest i whose multiple is within bound b. */
static long long multiple_index(const nbound *b, bool lower, long long p, int k)
{
    double x = b->v * (double)pow10_ll(k) / (double)p;
    long long i = (long long)(lower ? ceil(x) : floor(x));
    if (lower) {
        while (multiple_value(i - 1, p, k) > b->v || (!b->strict && multiple_value(i - 1, p, k) == b->v))
            i--;
        while (multiple_value(i, p, k) < b->v || (b->strict && multiple_value(i, p, k) == b->v))
            i++;
    } else {
        while (multiple_value(i + 1, p, k) < b->v || (!b->strict && multiple_value(i + 1, p, k) == b->v))
            i++;
        while (multiple_value(i, p, k) > b->v || (b->strict && multiple_value(i, p, k) == b->v))
            i--;
    }
    return i;
}

/* A number or integer with multipleOf m (see above) within bounds lo, hi. */
static int multiple_rule(sc *c, const gmult *m, const nbound *lo, const nbound *hi, double step)
{
    rlai_grammar *g = c->g;
    long long p = m->p;
    int k = m->k;
    /* multiples of at most 15 integer digits: |i| <= imax */
    double lim = 1e15 * (double)pow10_ll(k);
    if (lim > 9e15)
        lim = 9e15;   /* i * p exact in a double and a long long */
    long long imax = (long long)(lim / (double)p);
    bool ha = lo->has && lo->v > -imax * (double)p / (double)pow10_ll(k);
    bool hb = hi->has && hi->v < imax * (double)p / (double)pow10_ll(k);
    long long ia = ha ? multiple_index(lo, true, p, k) : -imax, ib = hb ? multiple_index(hi, false, p, k) : imax;
    if ((lo->has && !ha && lo->v > 0) || (hi->has && !hb && hi->v < 0) || ia > ib)
        return sc_fail(c, RLAI_ERR_INVALID_ARG, "no multiple of %g (of at most %d integer digits) is within the schema's bounds",
                       step, G_MULT_DIGITS);
    if (p == 1 && (ha || hb) && !(ha && hb && ib - ia < G_MULT_VALUES)) {
        /* steps of 10^-k: the bounded numbers with at most k fraction digits */
        return number_range_rule(c, lo, hi, k);
    }
    if (ha && hb) {
        if (ib - ia >= G_MULT_VALUES)
            return sc_fail(c, RLAI_ERR_UNSUPPORTED,
                           "'multipleOf' %g with minimum and maximum is supported for at most %d multiples between them, not %lld",
                           step, G_MULT_VALUES, ib - ia + 1);
        return multiple_list(c, p, k, ia, ib);
    }
    /* one bound or none: the side away from the bound is a grammar of
     * remainders; between the bound and 0 the multiples are listed */
    long long iq;
    if (multiple_states(p, k, &iq) > G_MULT_STATES)
        return sc_fail(c, RLAI_ERR_UNSUPPORTED,
                       "'multipleOf' %g is not supported here without a minimum and a maximum (its grammar would "
                       "have more than %d rules)", step, G_MULT_STATES);
    if ((ha && ia > 1) || (hb && ib < -1))
        return sc_fail(c, RLAI_ERR_UNSUPPORTED,
                       "'multipleOf' %g with only a %s is supported when that bound is within one step of 0",
                       step, ha ? "minimum" : "maximum");
    if ((ha && -ia >= G_MULT_VALUES) || (hb && ib >= G_MULT_VALUES))
        return sc_fail(c, RLAI_ERR_UNSUPPORTED,
                       "'multipleOf' %g with only a %s is supported for at most %d multiples between it and 0",
                       step, ha ? "minimum" : "maximum", G_MULT_VALUES);
    int pos = multiple_positive(c, p, k), r = pos < 0 ? pos : rule_new(g), rc = r;
    if (r < 0)
        return r;
    gseq q = { 0 };
    if (!hb) {   /* above 0 */
        seq_ref(&q, pos);
        rc = rule_alt(g, r, &q);
    }
    if (rc >= 0 && !ha) {   /* below 0 */
        seq_byte(g, &q, '-');
        seq_ref(&q, pos);
        rc = rule_alt(g, r, &q);
    }
    if (rc >= 0 && ia <= 0 && ib >= 0) {
        seq_byte(g, &q, '0');
        rc = rule_alt(g, r, &q);
    }
    if (rc >= 0 && ((ha && ia < 0) || (hb && ib > 0))) {
        int sub = ha ? multiple_list(c, p, k, ia, -1) : multiple_list(c, p, k, 1, ib);
        if (sub < 0) {
            free(q.e);
            return sub;
        }
        seq_ref(&q, sub);
        rc = rule_alt(g, r, &q);
    }
    return rc < 0 ? rc : r;
}

/* A number or integer schema: bounds, multipleOf, both or neither. */
static int number_schema(sc *c, const cJSON *s, bool integer)
{
    gmult m;
    int rc = read_multiple(c, s, integer, &m);
    if (rc < 0)
        return rc;
    if (m.p == 0)
        return has_bounds(s) ? bounded_number(c, s, integer) : integer ? integer_rule(c) : number_rule(c);
    if (m.p == 1 && m.k == 0)   /* every integer */
        return has_bounds(s) ? bounded_number(c, s, true) : integer_rule(c);
    nbound lo, hi;
    if ((rc = read_bound(c, s, true, &lo)) < 0 || (rc = read_bound(c, s, false, &hi)) < 0)
        return rc;
    return multiple_rule(c, &m, &lo, &hi, cJSON_GetObjectItemCaseSensitive(s, "multipleOf")->valuedouble);
}

/* Adds the values of schema s to L when s is only an enum or a const
 * (annotations aside). Returns 1 (added), 0 (s is something else) or an
 * error. */
static int lits_of(const cJSON *s, lits *L)
{
    if (!cJSON_IsObject(s))
        return 0;
    const cJSON *en = NULL, *cn = NULL;
    for (const cJSON *k = s->child; k; k = k->next) {
        if (!strcmp(k->string, "enum"))
            en = k;
        else if (!strcmp(k->string, "const"))
            cn = k;
        else if (!kw_in(k->string, kw_annotation))
            return 0;
    }
    if ((en && cn) || (!en && !cn) || (en && (!cJSON_IsArray(en) || !en->child)))
        return 0;
    int rc;
    if (cn)
        return (rc = lits_add(L, cn)) < 0 ? rc : 1;
    for (const cJSON *v = en->child; v; v = v->next)
        if ((rc = lits_add(L, v)) < 0)
            return rc;
    return 1;
}

/* (ws ',' ws item){lo, hi} as a rule (hi may be G_INF). */
static int items_tail(sc *c, int item, int lo, int hi)
{
    rlai_grammar *g = c->g;
    gseq q = { 0 };
    seq_ws(g, &q);
    seq_byte(g, &q, ',');
    seq_ws(g, &q);
    seq_ref(&q, item);
    int sep = rule_one(g, &q);
    return sep < 0 ? sep : repeat_rule(g, sep, lo, hi);
}

/* '[' ws ']' when min is 0, and '[' ws first [tail] ws ']' when max > 0
 * (tail -1: none). */
static int array_brackets(rlai_grammar *g, int min, int max, int first, int tail)
{
    int r = rule_new(g), rc;
    if (r < 0)
        return r;
    gseq q = { 0 };
    if (min == 0) {
        seq_byte(g, &q, '[');
        seq_ws(g, &q);
        seq_byte(g, &q, ']');
        if ((rc = rule_alt(g, r, &q)) < 0)
            return rc;
    }
    if (max == 0)
        return r;
    seq_byte(g, &q, '[');
    seq_ws(g, &q);
    seq_ref(&q, first);
    if (tail >= 0)
        seq_ref(&q, tail);
    seq_ws(g, &q);
    seq_byte(g, &q, ']');
    return (rc = rule_alt(g, r, &q)) < 0 ? rc : r;
}

/* Tuples: prefixItems (2020-12; later items follow `items`, false = none)
 * or an `items` array (drafts 4-2019; later items follow
 * `additionalItems`). Item i (from 0) is written with prefix[i]; items
 * from k = the prefix's length on with rest (-1: none may follow). */
static int compile_tuple(sc *c, const cJSON *prefix, const cJSON *rest_s, int min, int max, int depth)
{
    rlai_grammar *g = c->g;
    int k = cJSON_GetArraySize(prefix), rc;
    if (k > G_MAX_REPEAT)
        return sc_fail(c, RLAI_ERR_TOO_LARGE, "a tuple of more than %d items is not supported", G_MAX_REPEAT);
    int rest = -1;
    if (!rest_s || cJSON_IsTrue(rest_s)) {
        if ((rc = value_rules(c)) < 0)
            return rc;
        rest = c->r_value;
    } else if (!cJSON_IsFalse(rest_s) && (rest = compile(c, rest_s, depth + 1)) < 0) {
        return rest;
    }
    if (rest < 0 && max > k)
        max = k;
    if (min > max)
        return sc_fail(c, RLAI_ERR_INVALID_ARG, "minItems is greater than the items the tuple allows");
    int *pi = malloc(sizeof(int) * (size_t)(k ? k : 1));
    if (!pi)
        return RLAI_ERR_NOMEM;
    int i = 0;
    for (const cJSON *it = prefix->child; it; it = it->next, i++)
        if ((pi[i] = compile(c, it, depth + 1)) < 0) {
            rc = pi[i];
            free(pi);
            return rc;
        }
    /* t = what may follow item i-1, built from the last position back:
     * after the prefix, the rest's items; before, item i (required while
     * i < min) and what follows it */
    int t = -1;
    if (rest >= 0 && max > k) {
        int lo = min > k ? min - k : 0;
        if ((t = items_tail(c, rest, lo, max == G_INF ? G_INF : max - k)) < 0) {
            free(pi);
            return t;
        }
    }
    gseq q = { 0 };
    for (i = (k < max ? k : max) - 1; i >= 1; i--) {
        int r = rule_new(g);
        if (r < 0) {
            free(pi);
            return r;
        }
        seq_ws(g, &q);
        seq_byte(g, &q, ',');
        seq_ws(g, &q);
        seq_ref(&q, pi[i]);
        if (t >= 0)
            seq_ref(&q, t);
        if ((rc = rule_alt(g, r, &q)) < 0 || (i >= min && (rc = rule_alt(g, r, &q)) < 0)) {
            free(pi);
            return rc;
        }
        t = r;
    }
    int first = pi[0];
    free(pi);
    return array_brackets(g, min, max, first, t);
}

static const cJSON *resolve_ref(sc *c, const char *ref);

#define G_UNIQUE_VALUES 12   /* values of a uniqueItems array's items: 2^12 rules at most */

/* The rest of a uniqueItems array after the values in `used` (n of them):
 * the end (once n >= min) or (ws ',' ws) a value not used yet and the
 * rest after it (while n < max). One rule per reachable set, in memo. */
static int unique_rest(sc *c, int *memo, const int *val, int k, unsigned used, int n, int min, int max)
{
    if (memo[used] >= 0)
        return memo[used];
    rlai_grammar *g = c->g;
    int r = rule_new(g), rc;
    if ((memo[used] = r) < 0)
        return r;
    gseq q = { 0 };
    if (n >= min && (rc = rule_alt(g, r, &q)) < 0)
        return rc;
    for (int j = 0; j < k && n < max; j++) {
        if (used & (1u << j))
            continue;
        int next = unique_rest(c, memo, val, k, used | (1u << j), n + 1, min, max);
        if (next < 0)
            return next;
        seq_ws(g, &q);
        seq_byte(g, &q, ',');
        seq_ws(g, &q);
        seq_ref(&q, val[j]);
        seq_ref(&q, next);
        if ((rc = rule_alt(g, r, &q)) < 0)
            return rc;
    }
    return r;
}

/* Whether items (through $refs) is a plain string schema: type "string",
 * perhaps minLength / maxLength (in *minlen, *maxlen: G_INF when absent)
 * and annotations; no pattern, format, enum or const. 1 yes, 0 no, or a
 * negative error. */
static int plain_string_items(sc *c, const cJSON *items, int *minlen, int *maxlen)
{
    const cJSON *it = items;
    for (int hop = 0; hop < G_MAX_SCHEMA_DEPTH && cJSON_IsObject(it); hop++) {
        const cJSON *ref = cJSON_GetObjectItemCaseSensitive(it, "$ref");
        if (!cJSON_IsString(ref) || cJSON_GetArraySize(it) != 1)   /* a $ref alone */
            break;
        if (!(it = resolve_ref(c, ref->valuestring)))
            return 0;
    }
    if (!cJSON_IsObject(it))
        return 0;
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(it, "type");
    if (cJSON_IsArray(ty) && cJSON_GetArraySize(ty) == 1)
        ty = ty->child;
    if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "string"))
        return 0;
    for (const cJSON *k = it->child; k; k = k->next)
        if (strcmp(k->string, "type") && strcmp(k->string, "minLength") && strcmp(k->string, "maxLength") &&
            (!kw_in(k->string, kw_annotation) || !strcmp(k->string, "format") || !strcmp(k->string, "nullable") ||
             !strcmp(k->string, "discriminator")))
            return 0;
    int rc;
    if ((rc = get_count(c, it, "minLength", 0, G_MAX_STRLEN, minlen)) < 0 ||
        (rc = get_count(c, it, "maxLength", G_INF, G_MAX_STRLEN, maxlen)) < 0)
        return rc;
    if (*minlen > *maxlen)
        return sc_fail(c, RLAI_ERR_INVALID_ARG, "minLength is greater than maxLength");
    return 1;
}

/* An array of distinct strings (set[str], frozenset[str]): '[' then one
 * GE_USET element, which writes the items and separators itself and
 * refuses an item's closing quote when the item's value (its UTF-16 code
 * units, escapes decoded) hashes like an earlier item's. Equal values
 * always hash alike, so a duplicate is never written; a hash collision
 * (2^-64 a pair) could only refuse a quote, and the item then goes on.
 * Under a maxLength an item must not reach its last character as an
 * earlier item's value (it could then neither end nor grow): that
 * character is refused, and another one takes its place (a dead end would
 * need every one of them written before; with maxLength 0, only "" exists,
 * so at most one item). */
static int unique_strings(sc *c, int min, int max, int minlen, int maxlen)
{
    if (maxlen == 0) {
        if (min > 1)
            return sc_fail(c, RLAI_ERR_INVALID_ARG, "minItems is greater than the 1 distinct string of maxLength 0");
        max = max > 1 ? 1 : max;
    }
    rlai_grammar *g = c->g;
    if (g->n_ulen >= 65535)
        return sc_fail(c, RLAI_ERR_TOO_LARGE, "more than 65535 arrays of distinct strings");
    struct ulen *nu = realloc(g->ulen, sizeof(*nu) * (size_t)(g->n_ulen + 1));
    if (!nu)
        return RLAI_ERR_NOMEM;
    g->ulen = nu;
    g->ulen[g->n_ulen] = (struct ulen){ minlen, maxlen };
    gseq q = { 0 };
    seq_byte(g, &q, '[');
    seq_push(&q, (gelem){ GE_USET, (uint16_t)g->n_ulen++, min, max });
    return rule_one(g, &q);
}

/* An array with uniqueItems whose items are an enum or a const (through
 * $refs: Pydantic's set[Literal[...]] and set[SomeEnum]) of at most
 * G_UNIQUE_VALUES distinct values: every value at most once, in any order
 * (a rule per set of values used so far). Plain strings go to
 * unique_strings; other items are refused (numbers and objects have many
 * texts per value, and patterns or formats may run out of new values). */
static int unique_array(sc *c, const cJSON *items, int min, int max)
{
    const cJSON *it = items;
    for (int hop = 0; hop < G_MAX_SCHEMA_DEPTH && cJSON_IsObject(it); hop++) {
        const cJSON *ref = cJSON_GetObjectItemCaseSensitive(it, "$ref");
        if (!cJSON_IsString(ref))
            break;
        it = resolve_ref(c, ref->valuestring);
    }
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(it, "enum"), *cn = cJSON_GetObjectItemCaseSensitive(it, "const");
    if (cJSON_IsObject(it) && en && !cn && (!cJSON_IsArray(en) || !en->child))
        return sc_fail(c, RLAI_ERR_INVALID_ARG, "'enum' must be a non-empty array");
    if (!cJSON_IsObject(it) || (!en && !cn) || (en && cn))
        return sc_fail(c, RLAI_ERR_UNSUPPORTED,
                       "'uniqueItems' is supported for strings without a pattern or format (set[str]), for "
                       "items that are an enum or a const (set[Literal[...]], set[SomeEnum]) or with maxItems 1; "
                       "not for other items (use a list)");
    lits L = { 0 };
    int rc = 0;
    if (cn)
        rc = lits_add(&L, cn);
    for (const cJSON *v = en ? en->child : NULL; v && rc >= 0; v = v->next)
        rc = lits_add(&L, v);
    if (rc >= 0)
        qsort(L.v, (size_t)L.n, sizeof(lit), lit_cmp);
    int k = 0;                                  /* distinct values, in place */
    for (int i = 0; rc >= 0 && i < L.n; i++) {
        if (k && L.v[k - 1].n == L.v[i].n && !memcmp(L.v[k - 1].s, L.v[i].s, L.v[i].n)) {
            free(L.v[i].s);
            continue;
        }
        L.v[k++] = L.v[i];
    }
    L.n = rc >= 0 ? k : L.n;
    if (rc >= 0 && k > G_UNIQUE_VALUES)
        rc = sc_fail(c, RLAI_ERR_UNSUPPORTED, "'uniqueItems' over items of more than %d values is not supported",
                     G_UNIQUE_VALUES);
    else if (rc >= 0 && min > k)
        rc = sc_fail(c, RLAI_ERR_INVALID_ARG, "minItems is greater than the %d distinct values of the items", k);
    int val[G_UNIQUE_VALUES], *memo = NULL, first = -1;
    for (int j = 0; rc >= 0 && j < k; j++) {
        gseq q = { 0 };
        seq_lit(c->g, &q, L.v[j].s, L.v[j].n);
        rc = val[j] = rule_one(c->g, &q);
    }
    if (rc >= 0 && !(memo = malloc(sizeof(int) * ((size_t)1 << k))))
        rc = RLAI_ERR_NOMEM;
    for (size_t i = 0; memo && i < (size_t)1 << k; i++)
        memo[i] = -1;
    if (rc >= 0 && (first = rc = rule_new(c->g)) >= 0) {
        for (int j = 0; j < k && rc >= 0; j++) {   /* the first value, then the rest */
            int rest = unique_rest(c, memo, val, k, 1u << j, 1, min, max);
            gseq q = { 0 };
            seq_ref(&q, val[j]);
            seq_ref(&q, rest);
            rc = rest < 0 ? rest : rule_alt(c->g, first, &q);
        }
    }
    free(memo);
    lits_free(&L);
    return rc < 0 ? rc : array_brackets(c->g, min, max, first, -1);
}

static int compile_array(sc *c, const cJSON *s, int depth)
{
    rlai_grammar *g = c->g;
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
    const cJSON *prefix = cJSON_GetObjectItemCaseSensitive(s, "prefixItems");
    int min, max, rc;
    if ((rc = get_count(c, s, "minItems", 0, G_MAX_REPEAT, &min)) < 0 ||
        (rc = get_count(c, s, "maxItems", G_INF, G_MAX_REPEAT, &max)) < 0)
        return rc;
    if (min > max)
        return sc_fail(c, RLAI_ERR_INVALID_ARG, "minItems is greater than maxItems");
    const cJSON *uniq = cJSON_GetObjectItemCaseSensitive(s, "uniqueItems");
    if (uniq && !cJSON_IsBool(uniq))
        return sc_fail(c, RLAI_ERR_INVALID_ARG, "'uniqueItems' must be a boolean");
    if (cJSON_IsTrue(uniq) && max > 1) {   /* (up to one item is unique anyway) */
        if (prefix || cJSON_IsArray(items))
            return sc_fail(c, RLAI_ERR_UNSUPPORTED, "'uniqueItems' with a tuple is not supported");
        int minlen = 0, maxlen = G_INF, ps = plain_string_items(c, items, &minlen, &maxlen);
        if (ps < 0)
            return ps;
        if (ps)
            return unique_strings(c, min, max, minlen, maxlen);
        return unique_array(c, items, min, max);
    }
    if (prefix && !cJSON_IsArray(prefix))
        return sc_fail(c, RLAI_ERR_INVALID_ARG, "'prefixItems' must be an array of schemas");
    if (prefix && prefix->child)
        return compile_tuple(c, prefix, items, min, max, depth);
    if (cJSON_IsArray(items)) {
        if (items->child)
            return compile_tuple(c, items, cJSON_GetObjectItemCaseSensitive(s, "additionalItems"), min, max, depth);
        items = cJSON_GetObjectItemCaseSensitive(s, "additionalItems");
    }
    int item;
    if (cJSON_IsFalse(items)) {
        max = 0;   /* no items: [] */
        if (min > 0)
            return sc_fail(c, RLAI_ERR_INVALID_ARG, "minItems is greater than the items the array allows");
        item = -1;
    } else if (items && !cJSON_IsTrue(items)) {
        item = compile(c, items, depth + 1);
    } else {
        if ((rc = value_rules(c)) < 0)
            return rc;
        item = c->r_value;
    }
    if (item < 0 && max > 0)
        return item;
    /* the first item, then (ws ',' ws item){min-1 .. max-1} */
    int tail = max == 0 ? -1 : items_tail(c, item, min > 1 ? min - 1 : 0, max == G_INF ? G_INF : max - 1);
    if (max > 0 && tail < 0)
        return tail;
    return array_brackets(g, min, max, item, tail);
}

static int compile_object(sc *c, const cJSON *s, int depth)
{
    rlai_grammar *g = c->g;
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *ap = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    int rc;
    if (props && !cJSON_IsObject(props))
        return sc_fail(c, RLAI_ERR_INVALID_ARG, "'properties' must be an object");
    if (req && !cJSON_IsArray(req))
        return sc_fail(c, RLAI_ERR_INVALID_ARG, "'required' must be an array of property names");
    if (ap && !cJSON_IsBool(ap) && !cJSON_IsObject(ap))
        return sc_fail(c, RLAI_ERR_INVALID_ARG, "'additionalProperties' must be a boolean or a schema");
    int n = props ? cJSON_GetArraySize(props) : 0;
    for (const cJSON *q = req ? req->child : NULL; q; q = q->next) {
        if (!cJSON_IsString(q))
            return sc_fail(c, RLAI_ERR_INVALID_ARG, "'required' must be an array of property names");
        if (!props || !cJSON_GetObjectItemCaseSensitive(props, q->valuestring))
            return sc_fail(c, RLAI_ERR_UNSUPPORTED,
                           "required property '%s' is not in 'properties' (not supported)", q->valuestring);
    }
    /* minProperties / maxProperties: Pydantic writes them for a dict with
     * min_length / max_length. A map's keys are not kept apart (a
     * set[str]'s items are, by GE_USET, but a map's values are whole
     * grammars between its keys): {"a": 1, "a": 2} is one property, so a
     * minimum above 1 cannot be kept; a maximum can. */
    int minp, maxp;
    if ((rc = get_count(c, s, "minProperties", 0, G_MAX_REPEAT, &minp)) < 0 ||
        (rc = get_count(c, s, "maxProperties", G_INF, G_MAX_REPEAT, &maxp)) < 0)
        return rc;
    if (minp > maxp)
        return sc_fail(c, RLAI_ERR_INVALID_ARG, "minProperties is greater than maxProperties");
    if (n > 0) {
        int nreq = 0;
        for (const cJSON *q = req ? req->child : NULL; q; q = q->next)
            nreq++;
        if (minp > nreq || maxp < n)
            return sc_fail(c, RLAI_ERR_UNSUPPORTED,
                           "'minProperties' above the required properties' count, or 'maxProperties' below the "
                           "properties' count, is not supported beside 'properties'");
    } else if (minp > 1) {
        return sc_fail(c, RLAI_ERR_UNSUPPORTED,
                       "'minProperties' above 1 on a map is not supported: its keys are not kept apart "
                       "({\"a\": 1, \"a\": 2} is one property)");
    } else if (minp > 0 && ap && cJSON_IsFalse(ap)) {
        return sc_fail(c, RLAI_ERR_INVALID_ARG, "'minProperties' %d with 'additionalProperties' false: no object", minp);
    }
    bool counted = n == 0 && (minp > 0 || maxp != G_INF);
    if (n == 0) {
        if ((ap && cJSON_IsObject(ap) && ap->child) || (counted && !(ap && cJSON_IsFalse(ap)))) {
            /* a map: any keys, values of one schema (any value when it is
             * counted and has none); minp..maxp members */
            int val;
            if (ap && cJSON_IsObject(ap) && ap->child) {
                val = compile(c, ap, depth + 1);
            } else {
                val = value_rules(c);
                val = val < 0 ? val : c->r_value;
            }
            int str = string_rule(c, 0, G_INF);
            if (val < 0 || str < 0)
                return val < 0 ? val : str;
            int r = rule_new(g), member = rule_new(g), tail = counted ? 0 : rule_new(g);
            if (r < 0 || member < 0 || tail < 0)
                return RLAI_ERR_NOMEM;
            gseq q = { 0 };
            seq_ref(&q, str);
            seq_ws(g, &q);
            seq_byte(g, &q, ':');
            seq_ws(g, &q);
            seq_ref(&q, val);
            if ((rc = rule_alt(g, member, &q)) < 0)
                return rc;
            if (counted) {   /* tail: up to maxp - 1 more ", member" */
                int more = rule_new(g);
                if (more < 0)
                    return more;
                seq_ws(g, &q);
                seq_byte(g, &q, ',');
                seq_ws(g, &q);
                seq_ref(&q, member);
                if ((rc = rule_alt(g, more, &q)) < 0)
                    return rc;
                if ((tail = repeat_rule(g, more, 0, maxp == G_INF ? G_INF : maxp - 1)) < 0)
                    return tail;
            } else {
                seq_ws(g, &q);
                seq_byte(g, &q, ',');
                seq_ws(g, &q);
                seq_ref(&q, member);
                seq_ref(&q, tail);
                if ((rc = rule_alt(g, tail, &q)) < 0 || (rc = rule_alt(g, tail, &q)) < 0)
                    return rc;
            }
            if (maxp == 0 || minp == 0) {
                seq_byte(g, &q, '{');
                seq_ws(g, &q);
                seq_byte(g, &q, '}');
                if ((rc = rule_alt(g, r, &q)) < 0)
                    return rc;
            }
            if (maxp == 0)
                return r;
            seq_byte(g, &q, '{');
            seq_ws(g, &q);
            seq_ref(&q, member);
            seq_ref(&q, tail);
            seq_ws(g, &q);
            seq_byte(g, &q, '}');
            return (rc = rule_alt(g, r, &q)) < 0 ? rc : r;
        }
        if (ap && cJSON_IsFalse(ap))
            return lit_rule(g, "{}");
        if ((rc = value_rules(c)) < 0)
            return rc;
        return c->r_object;
    }
    if (ap && cJSON_IsObject(ap) && ap->child)
        return sc_fail(c, RLAI_ERR_UNSUPPORTED,
                       "JSON Schema 'additionalProperties' as a schema together with 'properties' is not supported");
    /* Each optional property that may be left out is one more alternative
     * open at that point (its key, or what follows it): a run of them is
     * bounded by the heads a matcher state holds. */
    int run = 0;
    for (const cJSON *p = props->child; p; p = p->next) {
        bool required = false;
        for (const cJSON *x = req ? req->child : NULL; x; x = x->next)
            if (!strcmp(x->valuestring, p->string))
                required = true;
        run = required ? 0 : run + 1;
        if (run > G_MAX_OPTIONAL_RUN)
            return sc_fail(c, RLAI_ERR_TOO_LARGE,
                           "more than %d optional properties in a row (the next one: '%s') are not supported: "
                           "make some of them required",
                           G_MAX_OPTIONAL_RUN, p->string);
    }
    /* Properties in schema order; optional ones may be left out.
     * L[k][f]: properties k.. where f = nothing written yet. */
    int *L = malloc(sizeof(int) * 2 * (size_t)(n + 1));
    if (!L)
        return RLAI_ERR_NOMEM;
    rc = 0;
    for (int k = 0; k <= n && rc == 0; k++)
        for (int f = 0; f < 2 && rc == 0; f++)
            if ((L[2 * k + f] = rule_new(g)) < 0)
                rc = L[2 * k + f];
    gseq q = { 0 };
    for (int f = 0; f < 2 && rc == 0; f++) {
        seq_ws(g, &q);
        seq_byte(g, &q, '}');
        rc = rule_alt(g, L[2 * n + f], &q);
    }
    const cJSON *p = props ? props->child : NULL;
    for (int k = 0; k < n && rc == 0; k++, p = p->next) {
        int val = compile(c, p, depth + 1);
        if (val < 0) {
            rc = val;
            break;
        }
        bool required = false;
        for (const cJSON *x = req ? req->child : NULL; x; x = x->next)
            if (!strcmp(x->valuestring, p->string))
                required = true;
        cJSON *key = cJSON_CreateString(p->string);
        char *kt = key ? cJSON_PrintUnformatted(key) : NULL;
        cJSON_Delete(key);
        if (!kt) {
            rc = RLAI_ERR_NOMEM;
            break;
        }
        for (int f = 0; f < 2 && rc == 0; f++) {
            if (!f) {
                seq_ws(g, &q);
                seq_byte(g, &q, ',');
                seq_ws(g, &q);
            }
            seq_lit(g, &q, kt, strlen(kt));
            seq_ws(g, &q);
            seq_byte(g, &q, ':');
            seq_ws(g, &q);
            seq_ref(&q, val);
            seq_ref(&q, L[2 * (k + 1)]);
            rc = rule_alt(g, L[2 * k + f], &q);
            if (rc == 0 && !required) {
                seq_ref(&q, L[2 * (k + 1) + f]);
                rc = rule_alt(g, L[2 * k + f], &q);
            }
        }
        free(kt);
    }
    int r = rc;
    if (rc == 0) {
        seq_byte(g, &q, '{');
        seq_ws(g, &q);
        seq_ref(&q, L[1]);
        r = rule_one(g, &q);
    }
    free(L);
    return r;
}

static int compile_type(sc *c, const cJSON *s, const char *type, int depth)
{
    if (!strcmp(type, "object"))
        return compile_object(c, s, depth);
    if (!strcmp(type, "array"))
        return compile_array(c, s, depth);
    if (!strcmp(type, "string")) {
        int min, max, rc;
        if ((rc = get_count(c, s, "minLength", 0, G_MAX_STRLEN, &min)) < 0 ||
            (rc = get_count(c, s, "maxLength", G_INF, G_MAX_STRLEN, &max)) < 0)
            return rc;
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(s, "pattern");
        if (pat) {
            if (!cJSON_IsString(pat))
                return sc_fail(c, RLAI_ERR_INVALID_ARG, "'pattern' must be a string");
            if (cJSON_GetObjectItemCaseSensitive(s, "format"))
                return sc_fail(c, RLAI_ERR_UNSUPPORTED, "'pattern' with format is not supported");
            if (min > max)
                return sc_fail(c, RLAI_ERR_INVALID_ARG, "minLength is greater than maxLength");
            return pattern_rule(c, pat->valuestring, min, max);
        }
        const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(s, "format");
        int r = cJSON_IsString(fmt) ? format_string_rule(c, fmt->valuestring, min, max) : RLAI_ERR_NOT_FOUND;
        if (r != RLAI_ERR_NOT_FOUND)
            return r;
        if (min > max)
            return sc_fail(c, RLAI_ERR_INVALID_ARG, "minLength is greater than maxLength");
        return string_rule(c, min, max);
    }
    if (!strcmp(type, "number"))
        return number_schema(c, s, false);
    if (!strcmp(type, "integer"))
        return number_schema(c, s, true);
    if (!strcmp(type, "boolean")) {
        int r = rule_new(c->g), rc;
        gseq q = { 0 };
        seq_lit(c->g, &q, "true", 4);
        if (r < 0 || (rc = rule_alt(c->g, r, &q)) < 0)
            return r < 0 ? r : rc;
        seq_lit(c->g, &q, "false", 5);
        return (rc = rule_alt(c->g, r, &q)) < 0 ? rc : r;
    }
    if (!strcmp(type, "null"))
        return lit_rule(c->g, "null");
    return sc_fail(c, RLAI_ERR_INVALID_ARG, "unknown JSON Schema type '%s'", type);
}

/* "#/$defs/NAME" is looked up in the innermost enclosing schema that has
 * the name in its $defs (so a schema embedded in another one, as tool
 * parameters are in the tool-call grammar, keeps its own $defs), then in
 * the document root. */
static const cJSON *resolve_ref(sc *c, const char *ref)
{
    const char *pre[] = { "#/$defs/", "#/definitions/" };
    for (int i = 0; i < 2; i++) {
        size_t n = strlen(pre[i]);
        if (!strncmp(ref, pre[i], n) && ref[n] && !strchr(ref + n, '/')) {
            for (int k = c->n_scopes - 1; k >= -1; k--) {
                const cJSON *sch = k >= 0 ? c->scopes[k] : c->root;
                const cJSON *defs = cJSON_GetObjectItemCaseSensitive(sch, i ? "definitions" : "$defs");
                const cJSON *t = defs ? cJSON_GetObjectItemCaseSensitive(defs, ref + n) : NULL;
                if (t)
                    return t;
            }
            return NULL;
        }
    }
    if (!strcmp(ref, "#"))
        return c->root;
    return NULL;
}

static int memo_find(sc *c, const cJSON *n)
{
    for (int i = 0; i < c->n_memo; i++)
        if (c->memo[i].node == n)
            return c->memo[i].rule;
    return -1;
}

static int memo_add(sc *c, const cJSON *n, int rule)
{
    if (c->n_memo == c->cap_memo) {
        int nc = c->cap_memo ? c->cap_memo * 2 : 8;
        memo_ent *nm = realloc(c->memo, sizeof(memo_ent) * (size_t)nc);
        if (!nm)
            return RLAI_ERR_NOMEM;
        c->memo = nm;
        c->cap_memo = nc;
    }
    c->memo[c->n_memo++] = (memo_ent){ n, rule };
    return 0;
}

static int compile_node(sc *c, const cJSON *s, int depth);

static int compile(sc *c, const cJSON *s, int depth)
{
    if (depth > G_MAX_SCHEMA_DEPTH)
        return sc_fail(c, RLAI_ERR_TOO_LARGE, "schema nested deeper than %d levels", G_MAX_SCHEMA_DEPTH);
    bool scope = cJSON_IsObject(s) && (cJSON_GetObjectItemCaseSensitive(s, "$defs") ||
                                       cJSON_GetObjectItemCaseSensitive(s, "definitions"));
    if (scope)
        c->scopes[c->n_scopes++] = s;
    int r = compile_node(c, s, depth);
    if (scope)
        c->n_scopes--;
    return r;
}

static int compile_node(sc *c, const cJSON *s, int depth)
{
    rlai_grammar *g = c->g;
    int rc;
    if (cJSON_IsTrue(s) || (cJSON_IsObject(s) && !s->child)) {
        if ((rc = value_rules(c)) < 0)
            return rc;
        return c->r_value;
    }
    if (cJSON_IsFalse(s))
        return sc_fail(c, RLAI_ERR_UNSUPPORTED, "the schema 'false' (no valid value) is not supported");
    if (!cJSON_IsObject(s))
        return sc_fail(c, RLAI_ERR_INVALID_ARG, "a schema must be a JSON object or a boolean");
    for (const cJSON *k = s->child; k; k = k->next)
        if (!kw_in(k->string, kw_supported) && !kw_in(k->string, kw_annotation))
            return sc_fail(c, RLAI_ERR_UNSUPPORTED, "JSON Schema keyword '%s' is not supported", k->string);
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref");
    if (ref) {
        if (!cJSON_IsString(ref))
            return sc_fail(c, RLAI_ERR_INVALID_ARG, "'$ref' must be a string");
        for (const cJSON *k = s->child; k; k = k->next)
            if (strcmp(k->string, "$ref") && strcmp(k->string, "$defs") && strcmp(k->string, "definitions") &&
                !kw_in(k->string, kw_annotation))
                return sc_fail(c, RLAI_ERR_UNSUPPORTED, "'$ref' with the sibling keyword '%s' is not supported",
                               k->string);
        const cJSON *t = resolve_ref(c, ref->valuestring);
        if (!t)
            return sc_fail(c, RLAI_ERR_INVALID_ARG,
                           "'$ref' '%s' not found (only '#', '#/$defs/NAME' and '#/definitions/NAME' are supported)",
                           ref->valuestring);
        int r = memo_find(c, t);
        if (r >= 0)
            return r;
        if ((r = rule_new(g)) < 0 || (rc = memo_add(c, t, r)) < 0)
            return r < 0 ? r : rc;
        int inner = compile(c, t, depth + 1);
        if (inner < 0)
            return inner;
        gseq q = { 0 };
        seq_ref(&q, inner);
        return (rc = rule_alt(g, r, &q)) < 0 ? rc : r;
    }
    /* allOf of one constraining schema (the others annotations only): what
     * Pydantic writes for a $ref with a description, {"allOf": [{"$ref":
     * ...}], "description": ...}. Intersections of more are refused. */
    const cJSON *all = cJSON_GetObjectItemCaseSensitive(s, "allOf");
    if (all) {
        if (!cJSON_IsArray(all) || !all->child)
            return sc_fail(c, RLAI_ERR_INVALID_ARG, "'allOf' must be a non-empty array of schemas");
        for (const cJSON *k = s->child; k; k = k->next)
            if (strcmp(k->string, "allOf") && strcmp(k->string, "$defs") && strcmp(k->string, "definitions") &&
                !kw_in(k->string, kw_annotation))
                return sc_fail(c, RLAI_ERR_UNSUPPORTED, "'allOf' with the sibling keyword '%s' is not supported",
                               k->string);
        const cJSON *one = NULL;
        for (const cJSON *v = all->child; v; v = v->next) {
            bool note = cJSON_IsTrue(v);
            if (cJSON_IsObject(v)) {
                note = true;
                for (const cJSON *k = v->child; k && note; k = k->next)
                    note = kw_in(k->string, kw_annotation);
            }
            if (note)
                continue;
            if (one)
                return sc_fail(c, RLAI_ERR_UNSUPPORTED,
                               "'allOf' of more than one constraining schema is not supported");
            one = v;
        }
        if (!one) {
            if ((rc = value_rules(c)) < 0)
                return rc;
            return c->r_value;
        }
        return compile(c, one, depth + 1);
    }
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
    const cJSON *cn = cJSON_GetObjectItemCaseSensitive(s, "const");
    if (en || cn) {
        if (en && (!cJSON_IsArray(en) || !en->child))
            return sc_fail(c, RLAI_ERR_INVALID_ARG, "'enum' must be a non-empty array");
        lits L = { 0 };
        rc = 0;
        if (cn)
            rc = lits_add(&L, cn);
        else
            for (const cJSON *v = en->child; v && (rc = lits_add(&L, v)) >= 0; v = v->next)
                ;
        int r = rc < 0 ? rc : lits_rule(c, &L);
        lits_free(&L);
        return r;
    }
    const cJSON *any = cJSON_GetObjectItemCaseSensitive(s, "anyOf");
    if (!any)
        any = cJSON_GetObjectItemCaseSensitive(s, "oneOf");
    if (any) {
        if (!cJSON_IsArray(any) || !any->child)
            return sc_fail(c, RLAI_ERR_INVALID_ARG, "'%s' must be a non-empty array of schemas", any->string);
        /* alternatives that are all enums or consts (a documented list of
         * values): one prefix tree of their values */
        lits L = { 0 };
        rc = 1;
        for (const cJSON *v = any->child; v && rc == 1; v = v->next)
            rc = lits_of(v, &L);
        if (rc != 0) {
            int r = rc < 0 ? rc : lits_rule(c, &L);
            lits_free(&L);
            return r;
        }
        lits_free(&L);
        int n_alt = cJSON_GetArraySize(any);
        if (n_alt > G_MAX_HEADS)
            return sc_fail(c, RLAI_ERR_TOO_LARGE,
                           "'%s' with more than %d alternatives is not supported (only enums and consts may be more)",
                           any->string, G_MAX_HEADS);
        int r = rule_new(g);
        if (r < 0)
            return r;
        for (const cJSON *v = any->child; v; v = v->next) {
            int sub = compile(c, v, depth + 1);
            if (sub < 0)
                return sub;
            gseq q = { 0 };
            seq_ref(&q, sub);
            if ((rc = rule_alt(g, r, &q)) < 0)
                return rc;
        }
        return r;
    }
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(s, "type");
    if (cJSON_IsString(type))
        return compile_type(c, s, type->valuestring, depth);
    if (cJSON_IsArray(type)) {
        int r = rule_new(g);
        if (r < 0)
            return r;
        if (!type->child)
            return sc_fail(c, RLAI_ERR_INVALID_ARG, "'type' must not be an empty array");
        for (const cJSON *t = type->child; t; t = t->next) {
            if (!cJSON_IsString(t))
                return sc_fail(c, RLAI_ERR_INVALID_ARG, "'type' must be a string or an array of strings");
            int sub = compile_type(c, s, t->valuestring, depth);
            if (sub < 0)
                return sub;
            gseq q = { 0 };
            seq_ref(&q, sub);
            if ((rc = rule_alt(g, r, &q)) < 0)
                return rc;
        }
        return r;
    }
    if (type)
        return sc_fail(c, RLAI_ERR_INVALID_ARG, "'type' must be a string or an array of strings");
    if (cJSON_GetObjectItemCaseSensitive(s, "properties") || cJSON_GetObjectItemCaseSensitive(s, "required") ||
        cJSON_GetObjectItemCaseSensitive(s, "additionalProperties") ||
        cJSON_GetObjectItemCaseSensitive(s, "minProperties") || cJSON_GetObjectItemCaseSensitive(s, "maxProperties"))
        return compile_object(c, s, depth);
    if (cJSON_GetObjectItemCaseSensitive(s, "items") || cJSON_GetObjectItemCaseSensitive(s, "minItems") ||
        cJSON_GetObjectItemCaseSensitive(s, "maxItems") || cJSON_GetObjectItemCaseSensitive(s, "prefixItems") ||
        cJSON_GetObjectItemCaseSensitive(s, "uniqueItems"))
        return compile_array(c, s, depth);
    if (cJSON_GetObjectItemCaseSensitive(s, "minLength") || cJSON_GetObjectItemCaseSensitive(s, "maxLength") ||
        cJSON_GetObjectItemCaseSensitive(s, "pattern"))
        return compile_type(c, s, "string", depth);
    if (has_bounds(s) || cJSON_GetObjectItemCaseSensitive(s, "multipleOf"))   /* without a type: a number */
        return compile_type(c, s, "number", depth);
    if ((rc = value_rules(c)) < 0)
        return rc;
    return c->r_value;
}

/* root' ::= ws{0..4} root | [^{ \t\n\r] any* | () */
static int or_text(rlai_grammar *g, int root)
{
    int r = rule_new(g), rc;
    if (r < 0)
        return r;
    gseq q = { 0 };
    seq_rep(&q, set_of(g, " \n\t"), 0, 4);
    seq_ref(&q, root);
    if ((rc = rule_alt(g, r, &q)) < 0)
        return rc;
    uint64_t first[4] = { ~0ull, ~0ull, ~0ull, ~0ull };
    first['{' >> 6] &= ~(1ull << ('{' & 63));
    first[0] &= ~((1ull << ' ') | (1ull << '\n') | (1ull << '\t') | (1ull << '\r'));
    uint64_t all[4] = { ~0ull, ~0ull, ~0ull, ~0ull };
    seq_set(&q, set_add(g, first));
    seq_rep(&q, set_add(g, all), 0, G_INF);
    if ((rc = rule_alt(g, r, &q)) < 0 || (rc = rule_alt(g, r, &q)) < 0)
        return rc;
    return r;
}

int rlai_grammar_from_json_schema(const char *schema, size_t len, rlai_grammar **out, char *err, size_t errlen)
{
    return rlai_grammar_from_json_schema_flags(schema, len, 0, out, err, errlen);
}

/* A rule that can reach itself without a byte in between (a '$ref' that
 * leads back to itself through anyOf / $ref alone, e.g. {"anyOf":
 * [{"$ref": "#"}, ...]}) would make the matcher expand it for ever: such a
 * grammar is refused. Rules that can match nothing are found first (a
 * fixpoint); then an edge r -> s for each reference to s that only
 * nullable elements precede in an alternative of r, and a depth-first
 * search (with its own stack: a grammar may have many rules) for a cycle. */
static bool elem_nullable(const gelem *e, const bool *nullable)
{
    return (e->kind == GE_REP && e->a == 0) || e->kind == GE_TXT || (e->kind == GE_REF && nullable[e->a]);
}

static int check_left_cycles(sc *c)
{
    rlai_grammar *g = c->g;
    int n = g->n_rules, rc = 0;
    bool *nullable = calloc((size_t)n + 1, sizeof(bool));
    int *start = calloc((size_t)n + 1, sizeof(int));
    int *edges = NULL, n_edges = 0, cap_edges = 0;
    unsigned char *color = calloc((size_t)n + 1, 1);
    int *stk = malloc(sizeof(int) * 2 * ((size_t)n + 1));
    if (!nullable || !start || !color || !stk) {
        rc = RLAI_ERR_NOMEM;
        goto out;
    }
    for (bool changed = true; changed;) {
        changed = false;
        for (int r = 0; r < n; r++) {
            for (int a = 0; a < g->rules[r].n && !nullable[r]; a++) {
                const gelem *e = &g->el[g->rules[r].alt[a]];
                while (e->kind != GE_END && elem_nullable(e, nullable))
                    e++;
                if (e->kind == GE_END)
                    nullable[r] = changed = true;
            }
        }
    }
    for (int r = 0; r < n; r++) {
        start[r] = n_edges;
        for (int a = 0; a < g->rules[r].n; a++) {
            for (const gelem *e = &g->el[g->rules[r].alt[a]]; e->kind != GE_END; e++) {
                if (e->kind == GE_REF) {
                    if (n_edges == cap_edges) {
                        int nc = cap_edges ? cap_edges * 2 : 256;
                        int *ne = realloc(edges, sizeof(int) * (size_t)nc);
                        if (!ne) {
                            rc = RLAI_ERR_NOMEM;
                            goto out;
                        }
                        edges = ne;
                        cap_edges = nc;
                    }
                    edges[n_edges++] = e->a;
                }
                if (!elem_nullable(e, nullable))
                    break;
            }
        }
    }
    start[n] = n_edges;
    /* colour 0: not seen, 1: on the search path, 2: done */
    for (int r0 = 0; r0 < n && rc == 0; r0++) {
        if (color[r0])
            continue;
        int sp = 0;
        stk[sp++] = r0;
        stk[sp++] = start[r0];
        color[r0] = 1;
        while (sp > 0) {
            int r = stk[sp - 2], i = stk[sp - 1];
            if (i == start[r + 1]) {
                color[r] = 2;
                sp -= 2;
                continue;
            }
            stk[sp - 1] = i + 1;
            int t = edges[i];
            if (color[t] == 1) {
                rc = sc_fail(c, RLAI_ERR_UNSUPPORTED,
                             "the schema refers back to itself before any text ('$ref' / 'anyOf' recursion that "
                             "writes nothing first), which is not supported");
                break;
            }
            if (color[t] == 0) {
                color[t] = 1;
                stk[sp++] = t;
                stk[sp++] = start[t];
            }
        }
    }
out:
    free(nullable);
    free(start);
    free(edges);
    free(color);
    free(stk);
    return rc;
}

int rlai_grammar_from_json_schema_flags(const char *schema, size_t len, unsigned flags, rlai_grammar **out,
                                        char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = 0;
    if (!out)
        return RLAI_ERR_INVALID_ARG;
    *out = NULL;
    if (!schema)
        return RLAI_ERR_INVALID_ARG;
    cJSON *root = cJSON_ParseWithLength(schema, len);
    sc c;
    memset(&c, 0, sizeof(c));
    c.err = err;
    c.errlen = errlen;
    if (!root)
        return sc_fail(&c, RLAI_ERR_INVALID_ARG, "the schema is not valid JSON");
    c.root = root;
    c.g = grammar_new();
    c.r_value = c.r_string = c.r_number = c.r_integer = c.r_object = c.r_array = c.r_int = -1;
    int rc = c.g ? compile(&c, root, 0) : RLAI_ERR_NOMEM;
    if (rc >= 0 && (flags & RLAI_GRAMMAR_OR_TEXT))
        rc = or_text(c.g, rc);
    if (rc >= 0) {
        int crc = check_left_cycles(&c);
        if (crc < 0)
            rc = crc;
    }
    if (rc < 0 && c.err && c.errlen && !c.err[0])
        sc_fail(&c, rc, "%s", rlai_strerror(rc));
    if (rc >= 0)
        c.g->root = rc;
    cJSON_Delete(root);
    free(c.memo);
    if (rc < 0) {
        grammar_free(c.g);
        return rc;
    }
    *out = c.g;
    return 0;
}

int rlai_grammar_json_object(rlai_grammar **out)
{
    if (!out)
        return RLAI_ERR_INVALID_ARG;
    *out = NULL;
    sc c;
    memset(&c, 0, sizeof(c));
    c.g = grammar_new();
    c.r_value = c.r_string = c.r_number = c.r_integer = c.r_object = c.r_array = c.r_int = -1;
    int rc = c.g ? value_rules(&c) : RLAI_ERR_NOMEM;
    if (rc < 0) {
        grammar_free(c.g);
        return rc;
    }
    c.g->root = c.r_object;
    *out = c.g;
    return 0;
}

/* ------------------------------------------------------------------ */
/* Matcher                                                             */

typedef struct gframe {
    int32_t ei;                  /* element (a head) or GE_REF position (a return frame) */
    int32_t aux;                 /* GE_STR / GE_TXT: where in a character (S_TEXT ...) */
    int32_t cnt;                 /* GE_REP bytes / GE_STR characters so far */
    int32_t depth;               /* return frames below */
    const struct gframe *parent; /* return address */
} gframe;

/* A GE_USET head: a frame and what an array of distinct strings keeps.
 * Between items f.aux is U_OPEN (after '['), U_SEP (after ',') or U_NEXT
 * (after an item), and f.cnt counts whitespace; inside an item f.aux and
 * f.cnt are GE_STR's. */
typedef struct gseen {
    uint64_t h;
    const struct gseen *next;
} gseen;

typedef struct gframe_u {
    gframe f;
    int32_t items;               /* items closed */
    int32_t cp;                  /* code point being read: UTF-8 bits or \u digits */
    uint64_t hash;               /* of the item's UTF-16 code units so far */
    const gseen *seen;           /* hashes of the items closed, latest first */
} gframe_u;

enum { U_OPEN = 40, U_SEP, U_NEXT };
#define U_HASH0 0xcbf29ce484222325ull

typedef struct gstate {
    int n;
    bool acc;                    /* the text so far is complete */
    const gframe *h[];
} gstate;

typedef struct ablk {
    struct ablk *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
} ablk;

typedef struct arena {
    ablk *head, *cur;
} arena;

static void *aalloc(arena *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    while (a->cur && a->cur->used + n > a->cur->cap)
        a->cur = a->cur->next;
    if (!a->cur) {
        size_t cap = n > (256u << 10) ? n : (256u << 10);
        ablk *b = malloc(sizeof(ablk) + cap);
        if (!b)
            return NULL;
        b->used = 0;
        b->cap = cap;
        b->next = NULL;
        ablk **pp = &a->head;
        while (*pp)
            pp = &(*pp)->next;
        *pp = b;
        a->cur = b;
    }
    void *p = a->cur->data + a->cur->used;
    a->cur->used += n;
    return p;
}

static void areset(arena *a)
{
    for (ablk *b = a->head; b; b = b->next)
        b->used = 0;
    a->cur = a->head;
}

static void afree(arena *a)
{
    for (ablk *b = a->head, *n; b; b = n) {
        n = b->next;
        free(b);
    }
    a->head = a->cur = NULL;
}

struct rlai_grammar_matcher {
    rlai_grammar *g;
    const gstate *st;            /* committed state (in keep[ki]) */
    arena keep[2];
    int ki;
    arena scratch;               /* states of a feed or a mask walk */
    bool oom;
    bool over;                   /* a state needed more than G_MAX_HEADS heads */
    const gstate **walk;         /* per-depth states of the trie walk */
    bool *walk_in;               /* per depth: the walk's bytes are in its repset's set */
    int walk_cap;
    /* Expansion memo of one operation (a byte over a state, the start
     * state, an end check; generation xgen): the (rule, return frame, byte)
     * triples already expanded, and the return frames made, so that equal
     * frames are one pointer. Alternatives that lead to the same rule
     * (anyOf branches referring to one definition) are then expanded once,
     * not once per path: 30 levels of two such branches were 2^30
     * expansions. Full tables only forgo the saving. */
    struct xmemo {
        uint32_t gen;
        int32_t rule, b;
        const gframe *ret;
    } *xm;
    struct xframe {
        uint32_t gen;
        int32_t ei;
        const gframe *parent, *f;
    } *xf;
    uint32_t xgen;
};

#define G_XMEMO 4096                /* entries of each memo table (a power of 2) */
#define G_EXPAND_DEPTH 2048         /* rules followed without a byte (> G_MAX_PROPS) */

static uint32_t xhash(uint32_t a, uint32_t b, const void *p)
{
    uint64_t h = (uint64_t)(uintptr_t)p * 0x9E3779B97F4A7C15ull ^ (uint64_t)a * 0xC2B2AE3D27D4EB4Full ^
                 (uint64_t)b * 0x165667B19E3779F9ull;
    return (uint32_t)(h >> 40);
}

/* Whether (rule, ret, b) was expanded already in this operation; records it
 * when not. */
static bool xm_seen(rlai_grammar_matcher *m, int rule, const gframe *ret, int b)
{
    if (!m->xm)
        return false;
    uint32_t h = xhash((uint32_t)rule, (uint32_t)b, ret);
    for (int k = 0; k < 16; k++) {
        struct xmemo *x = &m->xm[(h + (uint32_t)k) & (G_XMEMO - 1)];
        if (x->gen != m->xgen) {
            *x = (struct xmemo){ m->xgen, rule, b, ret };
            return false;
        }
        if (x->rule == rule && x->b == b && x->ret == ret)
            return true;
    }
    return false;
}

static void xm_next(rlai_grammar_matcher *m)
{
    if (++m->xgen == 0) {            /* wrapped: clear the stamps */
        if (m->xm)
            memset(m->xm, 0, sizeof(struct xmemo) * G_XMEMO);
        if (m->xf)
            memset(m->xf, 0, sizeof(struct xframe) * G_XMEMO);
        m->xgen = 1;
    }
}

typedef struct hbuf {
    int n;
    bool acc;
    const gframe *h[G_MAX_HEADS];
} hbuf;

static const gframe *frame_new(rlai_grammar_matcher *m, arena *a, int ei, int aux, int cnt, const gframe *parent)
{
    gframe *f = aalloc(a, sizeof(gframe));
    if (!f) {
        m->oom = true;
        return NULL;
    }
    f->ei = ei;
    f->aux = aux;
    f->cnt = cnt;
    f->parent = parent;
    f->depth = parent ? parent->depth + 1 : 0;
    return f;
}

/* FNV-1a over 16-bit code units: a JSON string's value is the same
 * units whether a character is written as UTF-8, a short escape or \u
 * escapes (a surrogate pair for one past U+FFFF). */
static uint64_t u_unit(uint64_t h, uint32_t u) { return (h ^ u) * 0x100000001b3ull; }

static uint64_t u_point(uint64_t h, uint32_t cp)
{
    if (cp < 0x10000)
        return u_unit(h, cp);
    cp -= 0x10000;
    return u_unit(u_unit(h, 0xD800 + (cp >> 10)), 0xDC00 + (cp & 0x3FF));
}

static const gseen *seen_push(rlai_grammar_matcher *m, arena *a, const gseen *next, uint64_t h)
{
    gseen *s = aalloc(a, sizeof(*s));
    if (!s) {
        m->oom = true;
        return NULL;
    }
    s->h = h;
    s->next = next;
    return s;
}

static bool seen_has(const gseen *s, uint64_t h)
{
    for (; s; s = s->next)
        if (s->h == h)
            return true;
    return false;
}

static bool seen_same(const gseen *x, const gseen *y)
{
    for (; x && y; x = x->next, y = y->next)
        if (x != y && x->h != y->h)
            return false;
    return !x && !y;
}

/* The GE_USET head v (its depth set here) in arena a. */
static const gframe *uframe_put(rlai_grammar_matcher *m, arena *a, gframe_u v)
{
    gframe_u *f = aalloc(a, sizeof(*f));
    if (!f) {
        m->oom = true;
        return NULL;
    }
    *f = v;
    f->f.depth = v.f.parent ? v.f.parent->depth + 1 : 0;
    return &f->f;
}

/* A new head at element ei: GE_USET heads start after the '['. */
static const gframe *head_new(rlai_grammar_matcher *m, arena *a, int ei, const gframe *parent)
{
    if (m->g->el[ei].kind == GE_USET)
        return uframe_put(m, a, (gframe_u){ .f = { .ei = ei, .aux = U_OPEN, .parent = parent } });
    return frame_new(m, a, ei, 0, 0, parent);
}

/* Adds head f to o unless o holds it already. A state with more heads than
 * G_MAX_HEADS is not cut short (that would drop valid continuations without
 * a word): m->over is set, and the feed or mask fails with
 * RLAI_ERR_TOO_LARGE. */
/* A return frame (ei, parent) of this operation: the one made already, or
 * a new one. */
static const gframe *ret_frame(rlai_grammar_matcher *m, arena *a, int ei, const gframe *parent)
{
    if (!m->xf)
        return frame_new(m, a, ei, 0, 0, parent);
    uint32_t h = xhash((uint32_t)ei, 0x5eed, parent);
    struct xframe *slot = NULL;
    for (int k = 0; k < 16; k++) {
        struct xframe *x = &m->xf[(h + (uint32_t)k) & (G_XMEMO - 1)];
        if (x->gen != m->xgen) {
            slot = x;
            break;
        }
        if (x->ei == ei && x->parent == parent)
            return x->f;
    }
    const gframe *f = frame_new(m, a, ei, 0, 0, parent);
    if (f && slot)
        *slot = (struct xframe){ m->xgen, ei, parent, f };
    return f;
}

static bool u_same(const gframe_u *x, const gframe_u *y)
{
    return x->items == y->items && x->cp == y->cp && x->hash == y->hash && seen_same(x->seen, y->seen);
}

static void push_head(rlai_grammar_matcher *m, hbuf *o, const gframe *f)
{
    if (!f)
        return;
    for (int i = 0; i < o->n; i++) {
        const gframe *x = o->h[i];
        if (x == f || (x->ei == f->ei && x->aux == f->aux && x->cnt == f->cnt && x->parent == f->parent &&
                       (m->g->el[f->ei].kind != GE_USET || u_same((const gframe_u *)x, (const gframe_u *)f))))
            return;
    }
    if (o->n < G_MAX_HEADS)
        o->h[o->n++] = f;
    else
        m->over = true;
}

static void step_head(rlai_grammar_matcher *m, arena *a, const gframe *h, unsigned char b, hbuf *o, int guard);

/* Adds the heads reachable from position ei (with return frame parent) to
 * o; or, when b >= 0, what each of them becomes after byte b (sguard: the
 * caller's step depth). Stepping them as they are found needs no buffer of
 * the heads in between, so only a state's own heads count against
 * G_MAX_HEADS (a byte that ends an array of many alternatives never holds
 * them all). */
static void expand_b(rlai_grammar_matcher *m, arena *a, int ei, const gframe *parent, hbuf *o, int guard, int b,
                     int sguard)
{
    const rlai_grammar *g = m->g;
    if (guard > G_EXPAND_DEPTH) {
        m->over = true;          /* not cut short without a word */
        return;
    }
    const gelem *e = &g->el[ei];
    switch (e->kind) {
    case GE_END:
        if (!parent) {
            if (b < 0)
                o->acc = true;   /* (no byte can follow the end) */
        } else {
            expand_b(m, a, parent->ei + 1, parent->parent, o, guard + 1, b, sguard);
        }
        return;
    case GE_REF: {
        const gframe *ret = parent;
        if (g->el[ei + 1].kind != GE_END) {
            if (parent && parent->depth >= G_MAX_STACK)
                return;
            if (!(ret = ret_frame(m, a, ei, parent)))
                return;
        }
        if (xm_seen(m, e->a, ret, b))
            return;              /* the same heads again */
        const grule *ru = &g->rules[e->a];
        for (int i = 0; i < ru->n; i++)
            expand_b(m, a, ru->alt[i], ret, o, guard + 1, b, sguard);
        return;
    }
    default: {
        const gframe *f = head_new(m, a, ei, parent);
        if (b < 0)
            push_head(m, o, f);
        else if (f)
            step_head(m, a, f, (unsigned char)b, o, sguard + 1);
        return;
    }
    }
}

static void expand(rlai_grammar_matcher *m, arena *a, int ei, const gframe *parent, hbuf *o, int guard)
{
    expand_b(m, a, ei, parent, o, guard, -1, 0);
}

/* Whether the text can end at position ei (with return frame parent)
 * without another byte. */
static bool can_end_from(rlai_grammar_matcher *m, arena *a, int ei, const gframe *parent, int guard)
{
    const rlai_grammar *g = m->g;
    if (guard > G_EXPAND_DEPTH)
        return false;
    const gelem *e = &g->el[ei];
    switch (e->kind) {
    case GE_END:
        return !parent || can_end_from(m, a, parent->ei + 1, parent->parent, guard + 1);
    case GE_REF: {
        const gframe *ret = parent;
        if (g->el[ei + 1].kind != GE_END) {
            if (parent && parent->depth >= G_MAX_STACK)
                return false;
            if (!(ret = ret_frame(m, a, ei, parent)))
                return false;
        }
        if (xm_seen(m, e->a, ret, 256))
            return false;        /* searched already, without an end */
        const grule *ru = &g->rules[e->a];
        for (int i = 0; i < ru->n; i++)
            if (can_end_from(m, a, ru->alt[i], ret, guard + 1))
                return true;
        return false;
    }
    case GE_REP:
        return e->a == 0 && can_end_from(m, a, ei + 1, parent, guard + 1);
    case GE_TXT:
        return can_end_from(m, a, ei + 1, parent, guard + 1);
    default:
        return false;
    }
}

static bool bits_has(const uint64_t *b, unsigned char c) { return (b[c >> 6] >> (c & 63)) & 1; }
static bool in_set(const rlai_grammar *g, int set, unsigned char b) { return bits_has(g->sets[set], b); }

static void step_exit(rlai_grammar_matcher *m, arena *a, const gframe *h, unsigned char b, hbuf *o, int guard)
{
    expand_b(m, a, h->ei + 1, h->parent, o, 0, b, guard);
}

/* Where JSON string text is within a character (gframe.aux of GE_STR,
 * GE_TXT and a GE_USET item). 1..3: UTF-8 continuation bytes due; 4..7:
 * the second byte of E0, ED, F0, F4 sequences, whose ranges are narrower
 * (no overlong forms, no surrogates, nothing past U+10FFFF). \u escapes
 * go through S_U1..S_U4; one that starts "\uD8".."\uDB" is a high
 * surrogate (S_H3, S_H4), after which S_HTEXT is text where a low
 * surrogate escape (S_L1..S_L4) completes the pair: JSON Schema counts the
 * pair as one character, as a 4-byte UTF-8 one is. */
enum {
    S_TEXT = 0, S_E0 = 4, S_ED, S_F0, S_F4,
    S_ESC = 10, S_U1, S_U2, S_U3, S_U4, S_UD2, S_H3 = 17, S_H4, S_HTEXT, S_HESC, S_L1, S_L2, S_L3, S_L4
};

static bool str_text(int aux) { return aux == S_TEXT || aux == S_HTEXT; }

/* The string state after byte b (not the closing quote of a text state)
 * from aux, when the text has room for another character; -1 if b is
 * refused. *add: 1 when b starts (UTF-8) or completes (an escape) a
 * character, else 0. *cp carries the value being read from byte to byte
 * (UTF-8 bits, \u digits; 0 in text); *done is the code point or UTF-16
 * unit b completes, or -1. */
static int str_step(int aux, bool room, unsigned char b, int *add, int32_t *cp, int32_t *done)
{
    static const char esc[] = "\"\\/bfnrt";
    static const uint8_t unit[] = { '"', '\\', '/', '\b', '\f', '\n', '\r', '\t' };
    int hv = b >= '0' && b <= '9' ? b - '0' : (b | 0x20) >= 'a' && (b | 0x20) <= 'f' ? (b | 0x20) - 'a' + 10 : -1;
    int na = -1;
    *add = 0;
    *done = -1;
    switch (aux) {
    case S_TEXT:
    case S_HTEXT:
        if (b == '\\')         /* after a high surrogate: room only if no low one follows */
            return aux == S_HTEXT ? S_HESC : room ? S_ESC : -1;
        if (b < 0x20 || b == '"' || !room)
            return -1;
        *add = 1;
        if (b < 0x80) {
            *done = b;
            return S_TEXT;
        }
        *cp = b & (b < 0xE0 ? 0x1F : b < 0xF0 ? 0x0F : 0x07);
        if (b >= 0xC2 && b <= 0xDF)
            return 1;
        if (b == 0xE0 || b == 0xED)
            return b == 0xE0 ? S_E0 : S_ED;
        if (b >= 0xE1 && b <= 0xEF)
            return 2;
        if (b == 0xF0 || b == 0xF4)
            return b == 0xF0 ? S_F0 : S_F4;
        if (b >= 0xF1 && b <= 0xF3)
            return 3;
        *add = 0;
        return -1;
    case 1:
    case 2:
    case 3:
        na = b >= 0x80 && b <= 0xBF ? aux - 1 : -1;
        break;
    case S_E0:
        na = b >= 0xA0 && b <= 0xBF ? 1 : -1;
        break;
    case S_ED:
        na = b >= 0x80 && b <= 0x9F ? 1 : -1;
        break;
    case S_F0:
        na = b >= 0x90 && b <= 0xBF ? 2 : -1;
        break;
    case S_F4:
        na = b >= 0x80 && b <= 0x8F ? 2 : -1;
        break;
    case S_ESC:
    case S_HESC: {
        *cp = 0;
        if (b == 'u')
            return aux == S_HESC ? S_L1 : S_U1;
        const char *e = b ? strchr(esc, b) : NULL;
        if (!e || !room)
            return -1;
        *add = 1;
        *done = unit[e - esc];
        return S_TEXT;
    }
    case S_U1:
        na = hv < 0 ? -1 : hv == 0xD ? S_UD2 : S_U2;
        break;
    case S_U2:
    case S_U3:
        na = hv < 0 ? -1 : aux + 1;
        break;
    case S_UD2:
        na = hv < 0 ? -1 : hv >= 8 && hv <= 0xB ? S_H3 : S_U3;
        break;
    case S_H3:
        na = hv < 0 ? -1 : S_H4;
        break;
    case S_U4:
    case S_H4:
        if (hv >= 0)
            *add = 1;
        na = hv < 0 ? -1 : aux == S_H4 ? S_HTEXT : S_TEXT;
        break;
    case S_L1:
        na = hv < 0 ? -1 : hv == 0xD ? S_L2 : room ? S_U2 : -1;
        break;
    case S_L2:
        /* C..F: the pair's low half, no new character */
        na = hv < 0 ? -1 : hv >= 0xC ? S_L3 : !room ? -1 : hv >= 8 ? S_H3 : S_U3;
        break;
    case S_L3:
        na = hv < 0 ? -1 : S_L4;
        break;
    case S_L4:
        na = hv < 0 ? -1 : S_TEXT;
        break;
    default:
        return -1;
    }
    if (na < 0)
        return -1;
    *cp = aux <= S_F4 ? (*cp << 6) | (b & 0x3F) : *cp * 16 + hv;   /* UTF-8 bits or a \u digit */
    if (str_text(na)) {
        *done = *cp;
        *cp = 0;
    }
    return na;
}

/* Byte b over a GE_USET head (an array of distinct strings, see
 * unique_strings): between items whitespace, '"', ',' and ']' as the
 * counts allow; inside an item what GE_STR takes within its lengths,
 * decoding the value's code units into the hash, the closing quote only
 * for an item whose hash no earlier item has, and, at maxLength, no last
 * character that makes the item an earlier one. */
static void step_uset(rlai_grammar_matcher *m, arena *a, const gframe *h, unsigned char b, hbuf *o)
{
    const gelem *e = &m->g->el[h->ei];
    const struct ulen *len = &m->g->ulen[e->set];
    const gframe_u *u = (const gframe_u *)h;
    gframe_u n = *u;             /* the head after b, edited below */
    int aux = h->aux;
    if (aux >= U_OPEN) {
        if (b == ' ' || b == '\n' || b == '\t') {
            if (h->cnt >= G_WS_MAX)
                return;
            n.f.cnt++;
        } else if (b == '"' && aux != U_NEXT && u->items < e->b) {
            n.f.aux = n.f.cnt = 0;
            n.hash = U_HASH0;
        } else if (b == ',' && aux == U_NEXT && u->items < e->b) {
            n.f.aux = U_SEP;
            n.f.cnt = 0;
        } else {
            if (b == ']' && aux != U_SEP && u->items >= e->a)
                expand(m, a, h->ei + 1, h->parent, o, 0);
            return;
        }
    } else if (str_text(aux) && b == '"') {
        if (h->cnt < len->min || seen_has(u->seen, u->hash) || !(n.seen = seen_push(m, a, u->seen, u->hash)))
            return;
        n.f.aux = U_NEXT;
        n.f.cnt = 0;
        n.items++;
        n.hash = 0;
    } else {
        int32_t cp = u->cp, done;
        int add, na = str_step(aux, h->cnt < len->max, b, &add, &cp, &done);
        if (na < 0)
            return;
        n.f.aux = na;
        n.f.cnt += add;
        n.cp = cp;
        if (done >= 0)
            n.hash = u_point(u->hash, (uint32_t)done);
        /* full, and an earlier item's value (after a high surrogate a low
         * one may still follow, without a new character) */
        if (na == S_TEXT && n.f.cnt >= len->max && seen_has(u->seen, n.hash))
            return;
    }
    push_head(m, o, uframe_put(m, a, n));
}

static void step_head(rlai_grammar_matcher *m, arena *a, const gframe *h, unsigned char b, hbuf *o, int guard)
{
    const rlai_grammar *g = m->g;
    const gelem *e = &g->el[h->ei];
    if (guard > 32) {
        m->over = true;          /* not cut short without a word */
        return;
    }
    switch (e->kind) {
    case GE_CHARS:
        if (in_set(g, e->set, b))
            expand(m, a, h->ei + 1, h->parent, o, 0);
        return;
    case GE_REP:
        if (h->cnt < e->b && in_set(g, e->set, b)) {
            if (e->b == G_INF && h->cnt >= e->a)
                push_head(m, o, h);
            else
                push_head(m, o, frame_new(m, a, h->ei, 0, h->cnt + 1, h->parent));
        }
        if (h->cnt >= e->a)
            step_exit(m, a, h, b, o, guard);
        return;
    case GE_TXT:
    case GE_STR: {
        bool txt = e->kind == GE_TXT;   /* text without the closing quote: may end before any byte */
        int aux = h->aux, cnt = h->cnt, min = txt ? 0 : e->a, max = txt ? G_INF : e->b;
        if (str_text(aux)) {
            if (txt)
                step_exit(m, a, h, b, o, guard);
            if (b == '"') {
                if (!txt && cnt >= min)
                    expand(m, a, h->ei + 1, h->parent, o, 0);
                return;
            }
        }
        int32_t cp = 0, done;   /* (values are a set item's concern: step_uset) */
        int add, na = str_step(aux, cnt < max, b, &add, &cp, &done);
        if (na < 0)
            return;
        /* past minLength an unbounded string stops counting, so plain text
         * gives back the very same head */
        int nc = max == G_INF && cnt >= min ? cnt : cnt + add;
        if (na == aux && nc == cnt)
            push_head(m, o, h);
        else
            push_head(m, o, frame_new(m, a, h->ei, na, nc, h->parent));
        return;
    }
    case GE_USET:
        step_uset(m, a, h, b, o);
        return;
    default:
        return;
    }
}

static bool head_can_end(rlai_grammar_matcher *m, arena *a, const gframe *h)
{
    const gelem *e = &m->g->el[h->ei];
    return ((e->kind == GE_REP && h->cnt >= e->a) || (e->kind == GE_TXT && str_text(h->aux))) &&
           can_end_from(m, a, h->ei + 1, h->parent, 0);
}

static bool state_can_end(rlai_grammar_matcher *m, const gstate *s)
{
    if (s->acc)
        return true;
    xm_next(m);
    for (int i = 0; i < s->n; i++)
        if (head_can_end(m, &m->scratch, s->h[i]))
            return true;
    return false;
}

/* The state after byte b, or NULL when b is rejected. The result is s
 * itself when nothing changed. */
static const gstate *step(rlai_grammar_matcher *m, arena *a, const gstate *s, unsigned char b)
{
    hbuf o;
    o.n = 0;
    o.acc = false;
    xm_next(m);
    for (int i = 0; i < s->n; i++)
        step_head(m, a, s->h[i], b, &o, 0);
    if (o.n == 0 && !o.acc)
        return NULL;
    if (o.n == s->n && o.acc == s->acc && !memcmp(o.h, s->h, sizeof(o.h[0]) * (size_t)o.n))
        return s;
    gstate *ns = aalloc(a, sizeof(gstate) + sizeof(o.h[0]) * (size_t)o.n);
    if (!ns) {
        m->oom = true;
        return NULL;
    }
    ns->n = o.n;
    ns->acc = o.acc;
    memcpy(ns->h, o.h, sizeof(o.h[0]) * (size_t)o.n);
    return ns;
}

/* Deep copy of a state into arena a (frames shared within the copy). */
typedef struct fmap {
    const gframe *from;
    const gframe *to;
} fmap;

static const gframe *copy_frame(rlai_grammar_matcher *m, arena *a, const gframe *f, fmap *map, int *n_map, int cap)
{
    if (!f)
        return NULL;
    for (int i = 0; i < *n_map; i++)
        if (map[i].from == f)
            return map[i].to;
    const gframe *p = copy_frame(m, a, f->parent, map, n_map, cap);
    if (f->parent && !p)
        return NULL;
    const gframe *nf;
    if (m->g->el[f->ei].kind == GE_USET) {
        gframe_u v = *(const gframe_u *)f;
        v.f.parent = p;
        const gseen **tail = &v.seen;   /* the hashes, in their order */
        for (const gseen *x = *tail; x; x = x->next) {
            gseen *y = aalloc(a, sizeof(*y));
            if (!y) {
                m->oom = true;
                return NULL;
            }
            y->h = x->h;
            y->next = NULL;
            *tail = y;
            tail = (const gseen **)&y->next;
        }
        nf = uframe_put(m, a, v);
    } else {
        nf = frame_new(m, a, f->ei, f->aux, f->cnt, p);
    }
    if (nf && *n_map < cap)
        map[(*n_map)++] = (fmap){ f, nf };
    return nf;
}

static const gstate *copy_state(rlai_grammar_matcher *m, arena *a, const gstate *s)
{
    gstate *ns = aalloc(a, sizeof(gstate) + sizeof(s->h[0]) * (size_t)s->n);
    if (!ns) {
        m->oom = true;
        return NULL;
    }
    ns->n = s->n;
    ns->acc = s->acc;
    fmap map[512];
    int n_map = 0;
    for (int i = 0; i < s->n; i++)
        if (!(ns->h[i] = copy_frame(m, a, s->h[i], map, &n_map, 512)))
            return NULL;
    return ns;
}

int rlai_grammar_matcher_new(const rlai_grammar *g, rlai_grammar_matcher **out)
{
    if (!out)
        return RLAI_ERR_INVALID_ARG;
    *out = NULL;
    if (!g)
        return RLAI_ERR_INVALID_ARG;
    rlai_grammar_matcher *m = calloc(1, sizeof(*m));
    if (!m)
        return RLAI_ERR_NOMEM;
    m->g = rlai_grammar_ref(g);
    m->xm = calloc(G_XMEMO, sizeof(struct xmemo));
    m->xf = calloc(G_XMEMO, sizeof(struct xframe));
    if (!m->xm || !m->xf) {
        rlai_grammar_matcher_free(m);
        return RLAI_ERR_NOMEM;
    }
    xm_next(m);
    hbuf o;
    o.n = 0;
    o.acc = false;
    const grule *ru = &g->rules[g->root];
    for (int i = 0; i < ru->n; i++)
        expand(m, &m->keep[0], ru->alt[i], NULL, &o, 0);
    if (m->over) {
        rlai_grammar_matcher_free(m);
        return RLAI_ERR_TOO_LARGE;
    }
    gstate *s = aalloc(&m->keep[0], sizeof(gstate) + sizeof(o.h[0]) * (size_t)o.n);
    if (!s || m->oom) {
        rlai_grammar_matcher_free(m);
        return RLAI_ERR_NOMEM;
    }
    s->n = o.n;
    s->acc = o.acc;
    memcpy(s->h, o.h, sizeof(o.h[0]) * (size_t)o.n);
    m->st = s;
    *out = m;
    return 0;
}

void rlai_grammar_matcher_free(rlai_grammar_matcher *m)
{
    if (!m)
        return;
    afree(&m->keep[0]);
    afree(&m->keep[1]);
    afree(&m->scratch);
    free(m->walk);
    free(m->walk_in);
    free(m->xm);
    free(m->xf);
    rlai_grammar_unref(m->g);
    free(m);
}

int rlai_grammar_matcher_feed(rlai_grammar_matcher *m, const char *bytes, size_t n)
{
    if (!m || (!bytes && n))
        return RLAI_ERR_INVALID_ARG;
    if (n == 0)
        return 0;
    areset(&m->scratch);
    m->oom = false;
    m->over = false;
    const gstate *s = m->st;
    for (size_t i = 0; i < n && s; i++)
        s = step(m, &m->scratch, s, (unsigned char)bytes[i]);
    if (m->oom)
        return RLAI_ERR_NOMEM;
    if (m->over)
        return RLAI_ERR_TOO_LARGE;
    if (!s)
        return RLAI_ERR_INVALID_ARG;
    int ki = 1 - m->ki;
    areset(&m->keep[ki]);
    const gstate *ns = copy_state(m, &m->keep[ki], s);
    if (!ns)
        return RLAI_ERR_NOMEM;
    m->st = ns;
    m->ki = ki;
    return 0;
}

bool rlai_grammar_matcher_can_end(const rlai_grammar_matcher *cm)
{
    rlai_grammar_matcher *m = (rlai_grammar_matcher *)cm;
    if (!m)
        return false;
    areset(&m->scratch);
    return state_can_end(m, m->st);
}

int rlai_grammar_matcher_forced(rlai_grammar_matcher *m, char *buf, int cap)
{
    if (!m || cap < 0 || (!buf && cap > 0))
        return RLAI_ERR_INVALID_ARG;
    areset(&m->scratch);
    m->oom = false;
    m->over = false;
    const gstate *s = m->st;
    int n = 0;
    while (n < cap && !state_can_end(m, s)) {
        const gstate *only = NULL;
        int b1 = -1;
        for (int b = 0; b < 256; b++) {
            m->over = false;
            const gstate *ns = step(m, &m->scratch, s, (unsigned char)b);
            if (m->oom)
                return RLAI_ERR_NOMEM;
            if (m->over)         /* not representable: not offered by the mask either */
                continue;
            if (!ns)
                continue;
            if (b1 >= 0) {   /* a second byte: the continuation branches here */
                b1 = -2;
                break;
            }
            b1 = b;
            only = ns;
        }
        if (b1 < 0)
            break;
        buf[n++] = (char)b1;
        s = only;
    }
    return n;
}

bool rlai_grammar_matcher_done(const rlai_grammar_matcher *m)
{
    return m && m->st->acc && m->st->n == 0;
}

bool rlai_grammar_accepts(const rlai_grammar *g, const char *text, size_t len)
{
    rlai_grammar_matcher *m = NULL;
    if (rlai_grammar_matcher_new(g, &m) < 0)
        return false;
    bool ok = rlai_grammar_matcher_feed(m, text, len) == 0 && rlai_grammar_matcher_can_end(m);
    rlai_grammar_matcher_free(m);
    return ok;
}

/* ------------------------------------------------------------------ */
/* Vocabulary index and token masks                                    */

typedef struct tnode {
    int32_t tok;                 /* first token ending here, or -1 */
    int32_t end;                 /* index after this node's subtree */
    uint16_t depth;              /* 1 = first byte */
    uint8_t byte;
} tnode;

typedef struct trie {
    tnode *n;
    int count;
} trie;

struct rlai_gvocab {
    int n_vocab, words, max_len;
    uint32_t *off;
    uint16_t *len;
    unsigned char *blob;
    int32_t *dup;                /* next token with the same bytes, or -1 */
    uint32_t *eog;               /* bitset */
    uint32_t *plain;             /* bitset: every byte printable ASCII, not '"' or '\' */
    uint32_t *any;               /* bitset: every token with bytes (not EOG) */
    int32_t *plain_ids;          /* the plain tokens, shortest first */
    int n_plain;
    trie all, nonplain;
    /* Per byte set of a long repetition (GE_REP: the parts of an address
     * or a URI), made when a mask first needs it and then kept (rep_cache):
     * the tokens of the set's bytes only, shortest first, and per node of
     * the trie `all` whether its byte and every byte below it are in the
     * set and its longest token. Entries never change once published. */
    pthread_mutex_t rs_lock;
    struct repset {
        uint64_t bits[4];
        int32_t *ids;
        int n_ids;
        uint8_t *inside;
        uint16_t *deepest;
    } *rs[G_REPSETS];
    int n_rs;
};

static const rlai_gvocab *sort_v;
static int tok_cmp(const void *pa, const void *pb)
{
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    const rlai_gvocab *v = sort_v;
    size_t la = v->len[a], lb = v->len[b];
    int c = memcmp(v->blob + v->off[a], v->blob + v->off[b], la < lb ? la : lb);
    if (c)
        return c;
    if (la != lb)
        return la < lb ? -1 : 1;
    return a < b ? -1 : a > b;
}

static bool tok_plain(const rlai_gvocab *v, int t)
{
    for (int i = 0; i < v->len[t]; i++) {
        unsigned char c = v->blob[v->off[t] + i];
        if (c < 0x20 || c >= 0x80 || c == '"' || c == '\\')
            return false;
    }
    return true;
}

/* Builds a pre-order trie of the tokens in ids (sorted by bytes). */
static int trie_build(rlai_gvocab *v, const int32_t *ids, int n, trie *t)
{
    size_t total = 0;
    for (int i = 0; i < n; i++)
        total += v->len[ids[i]];
    t->n = malloc(sizeof(tnode) * (total + 1));
    int *path = malloc(sizeof(int) * ((size_t)v->max_len + 2));
    if (!t->n || !path) {
        free(path);
        return RLAI_ERR_NOMEM;
    }
    int cnt = 0, plen = 0, prev = -1;
    for (int i = 0; i < n; i++) {
        int id = ids[i], l = v->len[id];
        const unsigned char *b = v->blob + v->off[id];
        int lcp = 0;
        if (prev >= 0) {
            const unsigned char *pb = v->blob + v->off[prev];
            int pl = v->len[prev];
            while (lcp < l && lcp < pl && b[lcp] == pb[lcp])
                lcp++;
            if (lcp == l && l == pl) {
                /* same bytes: chain as a duplicate of the node's token */
                int32_t first = t->n[path[l - 1]].tok;
                while (v->dup[first] >= 0)
                    first = v->dup[first];
                v->dup[first] = id;
                continue;
            }
        }
        for (int d = plen - 1; d >= lcp; d--)
            t->n[path[d]].end = cnt;
        for (int d = lcp; d < l; d++) {
            t->n[cnt] = (tnode){ d + 1 == l ? id : -1, 0, (uint16_t)(d + 1), b[d] };
            path[d] = cnt++;
        }
        plen = l;
        prev = id;
    }
    for (int d = plen - 1; d >= 0; d--)
        t->n[path[d]].end = cnt;
    t->count = cnt;
    free(path);
    return 0;
}

int rlai_gvocab_new(const rlai_tokenizer *tk, rlai_gvocab **out)
{
    if (!tk || !out)
        return RLAI_ERR_INVALID_ARG;
    *out = NULL;
    int n = rlai_tokenizer_n_vocab(tk);
    rlai_gvocab *v = calloc(1, sizeof(*v));
    if (!v)
        return RLAI_ERR_NOMEM;
    pthread_mutex_init(&v->rs_lock, NULL);
    v->n_vocab = n;
    v->words = (n + 31) / 32;
    v->off = calloc((size_t)n, sizeof(uint32_t));
    v->len = calloc((size_t)n, sizeof(uint16_t));
    v->dup = malloc(sizeof(int32_t) * (size_t)n);
    v->eog = calloc((size_t)v->words, sizeof(uint32_t));
    v->plain = calloc((size_t)v->words, sizeof(uint32_t));
    v->any = calloc((size_t)v->words, sizeof(uint32_t));
    size_t cap = (size_t)n * 8 + 64, used = 0;
    v->blob = malloc(cap);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n);
    int32_t *np = malloc(sizeof(int32_t) * (size_t)n);
    int rc = v->off && v->len && v->dup && v->eog && v->plain && v->any && v->blob && ids && np ? 0 : RLAI_ERR_NOMEM;
    int n_ids = 0, n_np = 0;
    for (int t = 0; rc == 0 && t < n; t++) {
        v->dup[t] = -1;
        if (rlai_tokenizer_is_eog(tk, t)) {
            v->eog[t >> 5] |= 1u << (t & 31);
            continue;   /* allowed only as the end, never as text */
        }
        int attr = rlai_tokenizer_attr(tk, t);
        if (attr == RLAI_TOKEN_CONTROL || attr == RLAI_TOKEN_UNUSED || attr == RLAI_TOKEN_UNKNOWN)
            continue;
        char tmp[512];
        int l = rlai_tokenizer_token_to_piece(tk, t, false, tmp, sizeof(tmp));
        if (l <= 0 || l > (int)sizeof(tmp))
            continue;   /* no bytes (or absurdly long): never allowed */
        if (used + (size_t)l > cap) {
            cap = (cap + (size_t)l) * 2;
            unsigned char *nb = realloc(v->blob, cap);
            if (!nb) {
                rc = RLAI_ERR_NOMEM;
                break;
            }
            v->blob = nb;
        }
        memcpy(v->blob + used, tmp, (size_t)l);
        v->off[t] = (uint32_t)used;
        v->len[t] = (uint16_t)l;
        used += (size_t)l;
        if (l > v->max_len)
            v->max_len = l;
        ids[n_ids++] = t;
    }
    if (rc == 0) {
        sort_v = v;   /* qsort has no context argument; creation is rare */
        qsort(ids, (size_t)n_ids, sizeof(int32_t), tok_cmp);
        sort_v = NULL;
        for (int i = 0; i < n_ids; i++) {
            v->any[ids[i] >> 5] |= 1u << (ids[i] & 31);
            if (tok_plain(v, ids[i]))
                v->plain[ids[i] >> 5] |= 1u << (ids[i] & 31);
            else
                np[n_np++] = ids[i];
        }
        rc = trie_build(v, ids, n_ids, &v->all);
    }
    if (rc == 0) {
        /* the plain tokens by length (a counting sort), for bounded strings */
        int *first = calloc((size_t)v->max_len + 2, sizeof(int));
        v->plain_ids = malloc(sizeof(int32_t) * (size_t)(n_ids ? n_ids : 1));
        if (!first || !v->plain_ids) {
            rc = RLAI_ERR_NOMEM;
        } else {
            for (int i = 0; i < n_ids; i++)
                if ((v->plain[ids[i] >> 5] >> (ids[i] & 31)) & 1)
                    first[v->len[ids[i]] + 1]++;
            for (int l = 1; l <= v->max_len + 1; l++)
                first[l] += first[l - 1];
            for (int i = 0; i < n_ids; i++)
                if ((v->plain[ids[i] >> 5] >> (ids[i] & 31)) & 1)
                    v->plain_ids[first[v->len[ids[i]]]++] = ids[i];
            v->n_plain = first[v->max_len];
        }
        free(first);
    }
    if (rc == 0) {
        /* duplicates were chained by the first build; the second must not chain again */
        int32_t *save = malloc(sizeof(int32_t) * (size_t)n);
        if (!save)
            rc = RLAI_ERR_NOMEM;
        else {
            memcpy(save, v->dup, sizeof(int32_t) * (size_t)n);
            for (int t = 0; t < n; t++)
                v->dup[t] = -1;
            rc = trie_build(v, np, n_np, &v->nonplain);
            memcpy(v->dup, save, sizeof(int32_t) * (size_t)n);
            free(save);
        }
    }
    free(ids);
    free(np);
    if (rc < 0) {
        rlai_gvocab_free(v);
        return rc;
    }
    *out = v;
    return 0;
}

void rlai_gvocab_free(rlai_gvocab *v)
{
    if (!v)
        return;
    free(v->off);
    free(v->len);
    free(v->blob);
    free(v->dup);
    free(v->eog);
    free(v->plain);
    free(v->any);
    free(v->plain_ids);
    free(v->all.n);
    free(v->nonplain.n);
    for (int i = 0; i < v->n_rs; i++) {
        free(v->rs[i]->ids);
        free(v->rs[i]->inside);
        free(v->rs[i]->deepest);
        free(v->rs[i]);
    }
    pthread_mutex_destroy(&v->rs_lock);
    free(v);
}

int rlai_gvocab_n_vocab(const rlai_gvocab *v) { return v ? v->n_vocab : 0; }
int rlai_gvocab_mask_words(const rlai_gvocab *v) { return v ? v->words : 0; }

static void mark(const rlai_gvocab *v, uint32_t *mask, int32_t t)
{
    for (; t >= 0; t = v->dup[t])
        mask[t >> 5] |= 1u << (t & 31);
}

static struct repset *repset_build(const rlai_gvocab *v, const uint64_t *bits)
{
    const trie *t = &v->all;
    struct repset *r = calloc(1, sizeof(*r));
    int *first = calloc((size_t)v->max_len + 2, sizeof(int));
    uint8_t *bad = calloc((size_t)v->max_len + 2, 1);      /* per depth: a child outside the set */
    uint16_t *deep = calloc((size_t)v->max_len + 2, sizeof(uint16_t));
    int32_t *tmp = malloc(sizeof(int32_t) * (size_t)(v->n_vocab ? v->n_vocab : 1));
    if (r) {
        r->ids = malloc(sizeof(int32_t) * (size_t)(v->n_vocab ? v->n_vocab : 1));
        r->inside = malloc((size_t)(t->count ? t->count : 1));
        r->deepest = malloc(sizeof(uint16_t) * (size_t)(t->count ? t->count : 1));
    }
    if (!r || !r->ids || !r->inside || !r->deepest || !first || !bad || !deep || !tmp) {
        if (r) {
            free(r->ids);
            free(r->inside);
            free(r->deepest);
            free(r);
        }
        r = NULL;
    } else {
        memcpy(r->bits, bits, sizeof(r->bits));
        int n = 0;
        for (int32_t k = 0; k < v->n_vocab; k++) {
            int l = v->len[k];
            bool in = l > 0 && !((v->eog[k >> 5] >> (k & 31)) & 1);
            for (int j = 0; j < l && in; j++)
                in = bits_has(bits, v->blob[v->off[k] + j]);
            if (in) {
                tmp[n++] = k;
                first[l + 1]++;
            }
        }
        for (int l = 1; l <= v->max_len + 1; l++)
            first[l] += first[l - 1];
        for (int k = 0; k < n; k++)
            r->ids[first[v->len[tmp[k]]]++] = tmp[k];
        r->n_ids = n;
        /* bottom-up in reverse preorder: a node's children are the nodes
         * one deeper seen since the last node at its depth or above */
        for (int i = t->count - 1; i >= 0; i--) {
            const tnode *nd = &t->n[i];
            int d = nd->depth;
            bool out = !bits_has(bits, nd->byte) || bad[d + 1];
            uint16_t own = (uint16_t)(nd->tok >= 0 ? d : 0), dp = deep[d + 1] > own ? deep[d + 1] : own;
            r->inside[i] = !out;
            r->deepest[i] = dp;
            bad[d + 1] = 0;
            deep[d + 1] = 0;
            bad[d] |= out;
            deep[d] = deep[d] > dp ? deep[d] : dp;
        }
    }
    free(first);
    free(bad);
    free(deep);
    free(tmp);
    return r;
}

/* The token list and trie flags of byte set bits (struct repset), made
 * the first time a mask needs them and kept by the vocabulary; NULL when
 * out of memory or when G_REPSETS other sets fill the table (then the mask
 * walks as it would without). Masks of several requests run at once: the
 * table is read and grown under rs_lock; an entry is built under it too
 * (about a millisecond, once per set and engine). */
static const struct repset *rep_cache(const rlai_gvocab *cv, const uint64_t *bits)
{
    rlai_gvocab *v = (rlai_gvocab *)cv;   /* the cache is the only mutable part */
    struct repset *r = NULL;
    pthread_mutex_lock(&v->rs_lock);
    for (int i = 0; i < v->n_rs && !r; i++)
        if (!memcmp(v->rs[i]->bits, bits, sizeof(v->rs[i]->bits)))
            r = v->rs[i];
    if (!r && v->n_rs < G_REPSETS && (r = repset_build(v, bits)) != NULL)
        v->rs[v->n_rs++] = r;
    pthread_mutex_unlock(&v->rs_lock);
    return r;
}

/* Marks the tokens the state allows among those of trie t. With rs, the
 * tokens of rs's set of up to `room` bytes were marked already (a head
 * repeats that set with room to spare): subtrees of only such tokens,
 * reached by bytes of the set, are skipped. */
static int walk(rlai_grammar_matcher *m, const rlai_gvocab *v, const trie *t, uint32_t *mask,
                const struct repset *rs, long room)
{
    if (m->walk_cap < v->max_len + 1) {
        const gstate **nw = realloc(m->walk, sizeof(*nw) * (size_t)(v->max_len + 1));
        bool *ni = nw ? realloc(m->walk_in, sizeof(bool) * (size_t)(v->max_len + 1)) : NULL;
        if (nw)
            m->walk = nw;
        if (!ni)
            return RLAI_ERR_NOMEM;
        m->walk_in = ni;
        m->walk_cap = v->max_len + 1;
    }
    const gstate **st = m->walk;
    bool *in = m->walk_in;       /* per depth: the bytes so far are all in rs's set */
    st[0] = m->st;
    in[0] = rs != NULL;
    const tnode *nd = t->n;
    for (int i = 0; i < t->count;) {
        int d = nd[i].depth;
        if (in[d - 1] && rs->inside[i] && rs->deepest[i] <= room) {
            i = nd[i].end;
            continue;
        }
        const gstate *s = step(m, &m->scratch, st[d - 1], nd[i].byte);
        if (m->oom)
            return RLAI_ERR_NOMEM;
        if (!s || m->over) {     /* refused, or past G_MAX_HEADS: not offered */
            m->over = false;
            i = nd[i].end;
            continue;
        }
        if (nd[i].tok >= 0)
            mark(v, mask, nd[i].tok);
        if (s->n == 0) {
            i = nd[i].end;
            continue;
        }
        st[d] = s;
        in[d] = in[d - 1] && bits_has(rs->bits, nd[i].byte);
        i++;
    }
    return 0;
}

static int finish_mask(rlai_grammar_matcher *m, const rlai_gvocab *v, uint32_t *mask)
{
    if (state_can_end(m, m->st))
        for (int w = 0; w < v->words; w++)
            mask[w] |= v->eog[w];
    int count = 0;
    for (int w = 0; w < v->words; w++)
        count += __builtin_popcount(mask[w]);
    return count;
}

int rlai_grammar_matcher_mask(rlai_grammar_matcher *m, const rlai_gvocab *v, uint32_t *mask)
{
    if (!m || !v || !mask)
        return RLAI_ERR_INVALID_ARG;
    areset(&m->scratch);
    m->oom = false;
    m->over = false;
    memset(mask, 0, sizeof(uint32_t) * (size_t)v->words);
    /* Inside an unbounded string every plain token is text: take them all
     * at once and walk only the tokens holding a quote, backslash, control
     * or non-ASCII byte. When every head is inside a string, bounded or
     * not, a plain token of L bytes is text for a head with room for L
     * more characters and refused by the others: take the plain tokens up
     * to the largest room at once (an anyOf of 128 strings of different
     * maxLength walked the whole vocabulary with 128 heads, 0.3 s a mask). */
    bool in_str = false, any = false, all_str = m->st->n > 0;
    long room = 0;
    for (int i = 0; i < m->st->n && !any; i++) {
        const gframe *h = m->st->h[i];
        const gelem *e = &m->g->el[h->ei];
        in_str |= str_text(h->aux) && ((e->kind == GE_STR && e->b == G_INF) || e->kind == GE_TXT ||
                                       (e->kind == GE_USET && (long)m->g->ulen[e->set].max - h->cnt > v->max_len));
        if (e->kind == GE_STR && str_text(h->aux)) {
            long r = e->b == G_INF ? LONG_MAX : (long)e->b - h->cnt;
            room = r > room ? r : room;
        } else {
            all_str = false;
        }
        /* free text (RLAI_GRAMMAR_OR_TEXT): every byte, without end */
        any = e->kind == GE_REP && e->b == G_INF && h->cnt >= e->a && m->g->sets[e->set][0] == ~0ull &&
              m->g->sets[e->set][1] == ~0ull && m->g->sets[e->set][2] == ~0ull && m->g->sets[e->set][3] == ~0ull;
    }
    int rc;
    if (any) {
        memcpy(mask, v->any, sizeof(uint32_t) * (size_t)v->words);
        rc = 0;
    } else if (in_str) {
        memcpy(mask, v->plain, sizeof(uint32_t) * (size_t)v->words);
        rc = walk(m, v, &v->nonplain, mask, NULL, 0);
    } else if (all_str) {
        for (int i = 0; i < v->n_plain && v->len[v->plain_ids[i]] <= room; i++)
            mark(v, mask, v->plain_ids[i]);
        rc = walk(m, v, &v->nonplain, mask, NULL, 0);
    } else {
        /* A head repeating a large byte set (a URI's path, an address's
         * parts) takes every token of that set's bytes that fits its room:
         * mark them at once and skip them in the walk. Such a token is not
         * stepped, so it is not checked against G_MAX_HEADS as the walk
         * checks tokens: only states of up to G_REPSET_HEADS heads use
         * this. Only the formats' parts repeat sets of 32 bytes or more
         * (besides free text, taken whole above),
         * and what follows them opens a few alternatives (a dot, '@', ':',
         * '/', the closing quote), so their tokens stay far below it;
         * tests/test_grammar.c compares these masks with brute force. */
        const struct repset *rs = NULL;
        room = 0;
        for (int i = 0; i < m->st->n && m->st->n <= G_REPSET_HEADS; i++) {
            const gframe *h = m->st->h[i];
            const gelem *e = &m->g->el[h->ei];
            if (e->kind != GE_REP)
                continue;
            long r = e->b == G_INF ? LONG_MAX : (long)e->b - h->cnt;
            const uint64_t *b = m->g->sets[e->set];
            if (r > room && __builtin_popcountll(b[0]) + __builtin_popcountll(b[1]) + __builtin_popcountll(b[2]) +
                                    __builtin_popcountll(b[3]) >= G_REPSET_MIN) {
                const struct repset *c = rep_cache(v, b);
                if (c) {
                    rs = c;
                    room = r;
                }
            }
        }
        for (int i = 0; rs && i < rs->n_ids && v->len[rs->ids[i]] <= room; i++)
            mark(v, mask, rs->ids[i]);
        rc = walk(m, v, &v->all, mask, rs, room);
    }
    if (rc < 0)
        return rc;
    return finish_mask(m, v, mask);
}

int rlai_grammar_matcher_mask_slow(rlai_grammar_matcher *m, const rlai_gvocab *v, uint32_t *mask)
{
    if (!m || !v || !mask)
        return RLAI_ERR_INVALID_ARG;
    memset(mask, 0, sizeof(uint32_t) * (size_t)v->words);
    for (int t = 0; t < v->n_vocab; t++) {
        if (!v->len[t])
            continue;
        areset(&m->scratch);
        m->oom = false;
        m->over = false;
        const gstate *s = m->st;
        for (int i = 0; i < v->len[t] && s && !m->over; i++)
            s = step(m, &m->scratch, s, v->blob[v->off[t] + i]);
        if (m->oom)
            return RLAI_ERR_NOMEM;
        if (s && !m->over)   /* a token past G_MAX_HEADS is not offered */
            mask[t >> 5] |= 1u << (t & 31);
    }
    areset(&m->scratch);
    return finish_mask(m, v, mask);
}

int rlai_grammar_matcher_accept_token(rlai_grammar_matcher *m, const rlai_gvocab *v, int32_t tok)
{
    if (!m || !v || tok < 0 || tok >= v->n_vocab)
        return RLAI_ERR_INVALID_ARG;
    if ((v->eog[tok >> 5] >> (tok & 31)) & 1) {
        areset(&m->scratch);
        return state_can_end(m, m->st) ? 0 : RLAI_ERR_INVALID_ARG;
    }
    if (!v->len[tok])
        return RLAI_ERR_INVALID_ARG;
    return rlai_grammar_matcher_feed(m, (const char *)v->blob + v->off[tok], v->len[tok]);
}
