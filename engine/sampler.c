/* sampler.c - token sampling (see sampler.h).
 *
 * Order (like llama.cpp's common sampler chain):
 *   1. penalties over the recent history (repeat, presence, frequency);
 *   2. NaN counts as -inf, +inf as FLT_MAX (so several +inf share the mass);
 *   3. temperature <= 0: greedy argmax (ties -> lowest id), done;
 *   4. top-k, top-p, min-p (probabilities at temperature 1), temperature
 *      scaling, softmax, one draw from a seeded xoshiro256** generator.
 *
 * If every logit is -inf (or NaN), token 0 is returned.
 *
 * History: a ring buffer of the last repeat_last_n accepted tokens (none
 * when repeat_last_n == 0, which means the whole history), a per-token count
 * array and a list of the distinct tokens currently counted, so applying the
 * penalties costs O(distinct tokens in the window), not O(n_vocab).
 *
 * Candidate selection never sorts the whole vocabulary: top_k uses a bounded
 * min-heap of k entries (O(n log k)); top-p alone buckets the candidates by
 * logit and sorts only the bucket where the cumulative mass crosses p
 * (O(n)). sample() does not allocate. */
#include "sampler.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TOP_P_BUCKETS 4096
#define TOP_P_RANGE 40.0

typedef struct cand {
    float logit;
    int32_t id;
} cand;

struct rlai_sampler {
    rlai_sampler_params p;
    int n_vocab;
    uint64_t rng[4];

    /* history */
    int32_t *ring;      /* repeat_last_n entries, NULL when window = all */
    int ring_len;       /* entries in use */
    int ring_head;      /* index of the oldest entry */
    uint32_t *count;    /* per token occurrences in the window */
    int32_t *seen;      /* distinct tokens with count > 0 */
    int32_t *seen_pos;  /* index into seen, or -1 */
    int n_seen;

    cand *cands;        /* n_vocab work entries */
    cand *cands2;       /* n_vocab work entries (top-p) */
    uint16_t *bucket_of;/* n_vocab bucket indices (top-p) */
    double bucket_mass[TOP_P_BUCKETS]; /* top-p work space */
};

/* ---- RNG: splitmix64 seeding, xoshiro256** generation ------------------ */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static uint64_t rotl64(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static uint64_t xoshiro_next(uint64_t s[4])
{
    uint64_t result = rotl64(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl64(s[3], 45);
    return result;
}

/* Uniform double in [0, 1) with 53 random bits. */
static double rng_uniform(uint64_t s[4])
{
    return (double)(xoshiro_next(s) >> 11) * (1.0 / 9007199254740992.0);
}

static void rng_seed(uint64_t s[4], uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++)
        s[i] = splitmix64(&x);
}

/* ---- lifecycle ----------------------------------------------------------- */

/* params is copied (the caller keeps ownership). On success *out owns a new
 * sampler freed with rlai_sampler_free(); on failure *out = NULL (when out is
 * non-NULL) and RLAI_ERR_INVALID_ARG (NULL pointers, n_vocab <= 0, NaN
 * parameters, repeat_penalty <= 0 or non-finite, repeat_last_n < 0) or
 * RLAI_ERR_NOMEM is returned. Memory: about 30 bytes per vocabulary entry. */
int rlai_sampler_new(const rlai_sampler_params *params, int n_vocab, rlai_sampler **out)
{
    if (!out)
        return RLAI_ERR_INVALID_ARG;
    *out = NULL;
    if (!params || n_vocab <= 0)
        return RLAI_ERR_INVALID_ARG;
    if (isnan(params->temperature) || isnan(params->top_p) || isnan(params->min_p) ||
        isnan(params->presence_penalty) || isnan(params->frequency_penalty) ||
        !isfinite(params->repeat_penalty) || params->repeat_penalty <= 0.0f ||
        params->repeat_last_n < 0)
        return RLAI_ERR_INVALID_ARG;

    rlai_sampler *s = calloc(1, sizeof(*s));
    if (!s)
        return RLAI_ERR_NOMEM;
    s->p = *params;
    s->n_vocab = n_vocab;
    s->count = calloc((size_t)n_vocab, sizeof(*s->count));
    s->seen = malloc((size_t)n_vocab * sizeof(*s->seen));
    s->seen_pos = malloc((size_t)n_vocab * sizeof(*s->seen_pos));
    s->cands = malloc((size_t)n_vocab * sizeof(*s->cands));
    s->cands2 = malloc((size_t)n_vocab * sizeof(*s->cands2));
    s->bucket_of = malloc((size_t)n_vocab * sizeof(*s->bucket_of));
    if (params->repeat_last_n > 0)
        s->ring = malloc((size_t)params->repeat_last_n * sizeof(*s->ring));
    if (!s->count || !s->seen || !s->seen_pos || !s->cands || !s->cands2 || !s->bucket_of ||
        (params->repeat_last_n > 0 && !s->ring)) {
        rlai_sampler_free(s);
        return RLAI_ERR_NOMEM;
    }
    for (int i = 0; i < n_vocab; i++)
        s->seen_pos[i] = -1;
    rng_seed(s->rng, params->seed);
    *out = s;
    return RLAI_OK;
}

/* Frees s and everything it owns. Accepts NULL. */
void rlai_sampler_free(rlai_sampler *s)
{
    if (!s)
        return;
    free(s->ring);
    free(s->count);
    free(s->seen);
    free(s->seen_pos);
    free(s->cands);
    free(s->cands2);
    free(s->bucket_of);
    free(s);
}

/* Clears the history and re-seeds the RNG with params.seed. Accepts NULL. */
void rlai_sampler_reset(rlai_sampler *s)
{
    if (!s)
        return;
    for (int i = 0; i < s->n_seen; i++) {
        s->count[s->seen[i]] = 0;
        s->seen_pos[s->seen[i]] = -1;
    }
    s->n_seen = 0;
    s->ring_len = 0;
    s->ring_head = 0;
    rng_seed(s->rng, s->p.seed);
}

/* ---- history ------------------------------------------------------------- */

static void count_inc(rlai_sampler *s, int32_t tok)
{
    if (s->count[tok]++ == 0) {
        s->seen_pos[tok] = s->n_seen;
        s->seen[s->n_seen++] = tok;
    }
}

static void count_dec(rlai_sampler *s, int32_t tok)
{
    if (--s->count[tok] == 0) {
        int32_t pos = s->seen_pos[tok];
        int32_t last = s->seen[--s->n_seen];
        s->seen[pos] = last;
        s->seen_pos[last] = pos;
        s->seen_pos[tok] = -1;
    }
}

/* Adds tok to the penalty history (evicting the oldest entry when the
 * repeat_last_n window is full). Tokens outside [0, n_vocab) are ignored. */
void rlai_sampler_accept(rlai_sampler *s, int32_t tok)
{
    if (!s || tok < 0 || tok >= s->n_vocab)
        return;
    if (s->ring) {
        int cap = s->p.repeat_last_n;
        if (s->ring_len == cap) {
            count_dec(s, s->ring[s->ring_head]);
            s->ring[s->ring_head] = tok;
            s->ring_head = (s->ring_head + 1) % cap;
        } else {
            s->ring[(s->ring_head + s->ring_len) % cap] = tok;
            s->ring_len++;
        }
    } else if (s->count[tok] == UINT32_MAX) {
        return; /* saturate (whole-history mode only) */
    }
    count_inc(s, tok);
}

static void apply_penalties(const rlai_sampler *s, float *logits)
{
    const float rp = s->p.repeat_penalty;
    const float pres = s->p.presence_penalty;
    const float freq = s->p.frequency_penalty;
    if (rp == 1.0f && pres == 0.0f && freq == 0.0f)
        return;
    for (int i = 0; i < s->n_seen; i++) {
        int32_t t = s->seen[i];
        float l = logits[t];
        if (rp != 1.0f)
            l = l > 0.0f ? l / rp : l * rp;
        l -= (float)s->count[t] * freq + pres;
        logits[t] = l;
    }
}

/* ---- candidate selection ------------------------------------------------- */

/* Total order: higher logit first, then lower id. */
static int cand_better(const cand *a, const cand *b)
{
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

static int cand_cmp_desc(const void *pa, const void *pb)
{
    const cand *a = pa, *b = pb;
    if (cand_better(a, b))
        return -1;
    if (cand_better(b, a))
        return 1;
    return 0;
}

/* Min-heap on the "better" order: the root is the worst kept entry. */
static void heap_sift_down(cand *h, int n, int i)
{
    for (;;) {
        int l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && cand_better(&h[w], &h[l]))
            w = l;
        if (r < n && cand_better(&h[w], &h[r]))
            w = r;
        if (w == i)
            return;
        cand t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

/* Permutes c[0..n) so that c[0..m) holds the best m entries in descending
 * order (the others end up in c[m..n), unordered). O(n log m). */
static void select_top(cand *c, int n, int m)
{
    if (m >= n) {
        qsort(c, (size_t)n, sizeof(*c), cand_cmp_desc);
        return;
    }
    for (int i = m / 2 - 1; i >= 0; i--)
        heap_sift_down(c, m, i);
    for (int i = m; i < n; i++) {
        if (cand_better(&c[i], &c[0])) {
            cand t = c[0];
            c[0] = c[i];
            c[i] = t;
            heap_sift_down(c, m, 0);
        }
    }
    /* heap sort of a min-heap leaves the prefix in descending order */
    for (int end = m - 1; end > 0; end--) {
        cand t = c[0];
        c[0] = c[end];
        c[end] = t;
        heap_sift_down(c, end, 0);
    }
}

static float max_logit(const cand *c, int n)
{
    float m = c[0].logit;
    for (int i = 1; i < n; i++)
        if (c[i].logit > m)
            m = c[i].logit;
    return m;
}

static int bucket_of(float l, float mx, float scale)
{
    float b = (mx - l) * scale;
    return b < (float)(TOP_P_BUCKETS - 1) ? (int)b : TOP_P_BUCKETS - 1; /* NaN/inf too */
}

/* Keeps the smallest set of highest-logit entries whose softmax mass at
 * temperature 1 reaches p; at least one entry. Returns the new count.
 *
 * If c is sorted (after top-k) this is a prefix scan. Otherwise the
 * candidates are bucketed by logit (monotone buckets over [mx - range, mx])
 * and only the bucket in which the cumulative mass crosses p is sorted, so
 * the cost is O(n) plus a sort of one bucket. The kept entries end up at
 * c[0..k), not necessarily in order. */
static int apply_top_p(rlai_sampler *s, cand *c, int n, float p, int sorted)
{
    if (n <= 1)
        return n;
    if (sorted) {
        const float mx = c[0].logit;
        double z = 0.0;
        for (int i = 0; i < n; i++)
            z += (double)expf(c[i].logit - mx);
        const double target = (double)p * z;
        double cum = 0.0;
        for (int i = 0; i < n; i++) {
            cum += (double)expf(c[i].logit - mx);
            if (cum >= target)
                return i + 1;
        }
        return n;
    }

    float mx = c[0].logit, mn = c[0].logit;
    for (int i = 1; i < n; i++) {
        mx = c[i].logit > mx ? c[i].logit : mx;
        mn = c[i].logit < mn ? c[i].logit : mn;
    }
    /* beyond exp(-TOP_P_RANGE) the weights no longer matter much; those
     * entries share the last bucket (still handled exactly if reached) */
    double range = (double)mx - (double)mn;
    if (range > TOP_P_RANGE)
        range = TOP_P_RANGE;
    const float scale = range > 0.0 ? (float)((TOP_P_BUCKETS - 1) / range) : 0.0f;
    double *mass = s->bucket_mass;
    uint16_t *bk = s->bucket_of;
    memset(mass, 0, TOP_P_BUCKETS * sizeof(*mass));
    double z = 0.0;
    for (int i = 0; i < n; i++) {
        double w = (double)expf(c[i].logit - mx);
        int b = bucket_of(c[i].logit, mx, scale);
        bk[i] = (uint16_t)b;
        mass[b] += w;
        z += w;
    }
    const double target = (double)p * z;
    double cum = 0.0;
    int cut = -1;
    for (int b = 0; b < TOP_P_BUCKETS; b++) {
        if (cum + mass[b] >= target) {
            cut = b;
            break;
        }
        cum += mass[b];
    }
    if (cut < 0)
        return n; /* rounding: p ~ 1 */

    /* entries above the cut bucket are compacted to the front, those of
     * the cut bucket gathered, sorted and appended until p is reached */
    cand *tmp = s->cands2;
    int k = 0, m = 0;
    for (int i = 0; i < n; i++) {
        if (bk[i] < cut)
            c[k++] = c[i];
        else if (bk[i] == cut)
            tmp[m++] = c[i];
    }
    qsort(tmp, (size_t)m, sizeof(*tmp), cand_cmp_desc);
    for (int i = 0; i < m; i++) {
        c[k++] = tmp[i];
        cum += (double)expf(tmp[i].logit - mx);
        if (cum >= target)
            break;
    }
    return k;
}

/* Keeps entries with prob >= min_p * p_max (at temperature 1). */
static int apply_min_p(cand *c, int n, float min_p)
{
    if (n <= 1)
        return n;
    float mx = max_logit(c, n);
    double thresh = (double)mx + log((double)min_p);
    int k = 0;
    for (int i = 0; i < n; i++)
        if ((double)c[i].logit >= thresh || c[i].logit == mx)
            c[k++] = c[i];
    return k;
}

/* ---- sampling ------------------------------------------------------------ */

/* Candidate distribution of the non-greedy path: NaN and -inf dropped,
 * +inf clamped, top-k, top-p, min-p, then temperature and softmax weights
 * (unnormalised, stored in cands[i].logit). Penalties must already be
 * applied. Returns the candidate count (0 = nothing finite). */
static int build_dist(rlai_sampler *s, const float *logits)
{
    const int nv = s->n_vocab;
    cand *c = s->cands;
    int n = 0;
    for (int i = 0; i < nv; i++) {
        float l = logits[i];
        if (l > -INFINITY) { /* false for NaN */
            c[n].logit = l < INFINITY ? l : FLT_MAX;
            c[n].id = i;
            n++;
        }
    }
    if (n == 0)
        return 0;
    int sorted = 0;
    if (s->p.top_k > 0 && s->p.top_k < n) {
        select_top(c, n, s->p.top_k);
        n = s->p.top_k;
        sorted = 1;
    }
    if (s->p.top_p < 1.0f)
        n = apply_top_p(s, c, n, s->p.top_p, sorted);
    if (s->p.min_p > 0.0f)
        n = apply_min_p(c, n, s->p.min_p);
    if (n == 1) {
        c[0].logit = 1.0f;
        return 1;
    }
    const double inv_t = 1.0 / (double)s->p.temperature;
    const double mx = (double)max_logit(c, n);
    for (int i = 0; i < n; i++)
        c[i].logit = expf((float)(((double)c[i].logit - mx) * inv_t)); /* reuse the slot for the weight */
    return n;
}

/* One draw from the weights c[0..n): exactly one uniform from the RNG. */
static int32_t draw(rlai_sampler *s, const cand *c, int n)
{
    double z = 0.0;
    for (int i = 0; i < n; i++)
        z += (double)c[i].logit;
    double r = rng_uniform(s->rng) * z;
    double cum = 0.0;
    int last_pos = -1;
    for (int i = 0; i < n; i++) {
        if (c[i].logit <= 0.0f)
            continue;
        last_pos = i;
        cum += (double)c[i].logit;
        if (r < cum)
            return c[i].id;
    }
    return last_pos >= 0 ? c[last_pos].id : c[0].id; /* rounding: r landed at the very end */
}


/* logits (caller-owned, n_vocab floats) is modified in place: penalties are
 * applied to it. Does not record the result: call rlai_sampler_accept() for
 * it. Returns 0 for NULL arguments or when no logit is finite or +inf. */
int32_t rlai_sampler_sample(rlai_sampler *s, float *logits)
{
    if (!s || !logits)
        return 0;
    const int nv = s->n_vocab;
    apply_penalties(s, logits);

    if (!(s->p.temperature > 0.0f)) {
        /* NaN compares false, so it never wins; +inf wins; ties -> lowest */
        int32_t best = 0;
        float bv = isnan(logits[0]) ? -INFINITY : logits[0];
        for (int i = 1; i < nv; i++) {
            if (logits[i] > bv) {
                bv = logits[i];
                best = i;
            }
        }
        return best;
    }

    int n = build_dist(s, logits);
    if (n == 0)
        return 0;
    const cand *c = s->cands;
    if (n == 1)
        return c[0].id;
    return draw(s, c, n);
}

/* ---- log-probabilities ------------------------------------------------- */

/* One pass for the maximum, one for the sum of exponentials (in double),
 * while keeping the n_top best ids in a small array sorted by logit
 * (descending, lower id first on ties): an insertion costs O(n_top) and
 * happens only for a logit better than the current n_top-th. */
void rlai_logprobs_compute(const float *raw, int n_vocab, int32_t tok, int n_top, rlai_token_logprobs *out)
{
    memset(out, 0, sizeof(*out));
    out->token = tok;
    if (n_top < 0)
        n_top = 0;
    if (n_top > RLAI_MAX_TOP_LOGPROBS)
        n_top = RLAI_MAX_TOP_LOGPROBS;
    if (n_top > n_vocab)
        n_top = n_vocab;
    float mx = -INFINITY;
    for (int i = 0; i < n_vocab; i++)
        if (raw[i] > mx)           /* NaN compares false */
            mx = raw[i];
    float tl[RLAI_MAX_TOP_LOGPROBS];
    int32_t ti[RLAI_MAX_TOP_LOGPROBS];
    int nt = 0;
    double sum = 0.0;
    for (int i = 0; i < n_vocab; i++) {
        float l = raw[i];
        if (isnan(l))
            l = -INFINITY;
        if (isfinite(mx))
            sum += exp((double)l - (double)mx);
        if (n_top == 0 || (nt == n_top && !(l > tl[nt - 1])))
            continue;
        int j = nt < n_top ? nt++ : n_top - 1;
        while (j > 0 && l > tl[j - 1]) {
            tl[j] = tl[j - 1];
            ti[j] = ti[j - 1];
            j--;
        }
        tl[j] = l;
        ti[j] = i;
    }
    /* all -inf (or +inf present): no finite normaliser */
    double lse = isfinite(mx) && sum > 0 ? (double)mx + log(sum) : INFINITY;
    float t = tok >= 0 && tok < n_vocab && !isnan(raw[tok]) ? raw[tok] : -INFINITY;
    out->logprob = isfinite(lse) ? (float)((double)t - lse) : -INFINITY;
    out->n_top = nt;
    for (int k = 0; k < nt; k++) {
        out->top_ids[k] = ti[k];
        out->top_logprobs[k] = isfinite(lse) ? (float)((double)tl[k] - lse) : -INFINITY;
    }
}
