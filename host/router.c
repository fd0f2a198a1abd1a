/* router.c - the one generation path of the host (router.h): the local
 * engine, or a remote upstream (host/remote.c) chosen by model name,
 * per-request override, spill policy and prefix affinity (docs/REMOTE.md). */
#include "router.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "remote.h"
#include "upstream.h"
#include "rlai/error.h"
#include "rlai/strbuf.h"

enum { SPILL_QUEUE = 0, SPILL_CONTEXT = 1, SPILL_BUSY = 2, SPILL_ASKED = 3, N_SPILL = 4 };
static const char *const spill_names[N_SPILL] = { "queue", "context", "busy", "asked" };

struct rlai_router {
    rlai_engine *engine;              /* borrowed */
    rlai_remote *remote;              /* NULL = no upstreams */
    rlai_route_policy policy;
    atomic_uint_fast64_t seq;         /* remote ids */
    atomic_uint_fast64_t n_local, n_remote, n_spill[N_SPILL];
};

void rlai_route_policy_init(rlai_route_policy *p)
{
    memset(p, 0, sizeof(*p));
    p->spill_queued = 0;
    p->spill_long_prompts = true;
    p->affinity = true;
}

int rlai_router_new(rlai_engine *engine, rlai_router **out)
{
    if (!engine || !out)
        return RLAI_ERR_INVALID_ARG;
    rlai_router *r = calloc(1, sizeof(*r));
    if (!r)
        return RLAI_ERR_NOMEM;
    r->engine = engine;
    rlai_route_policy_init(&r->policy);
    *out = r;
    return 0;
}

void rlai_router_free(rlai_router *r)
{
    if (!r)
        return;
    rlai_remote_free(r->remote);
    free(r);
}

int rlai_router_set_upstreams(rlai_router *r, const rlai_upstream_config *ups, int n,
                              const rlai_route_policy *policy, char *err, size_t errlen)
{
    if (!r || r->remote || n < 0)
        return RLAI_ERR_INVALID_ARG;
    if (policy)
        r->policy = *policy;
    if (n == 0)
        return 0;
    return rlai_remote_new(ups, n, &r->remote, err, errlen);
}

int rlai_router_n_remote_models(const rlai_router *r)
{
    int n = 0;
    for (int i = 0; r && i < rlai_remote_n_upstreams(r->remote); i++)
        n += rlai_remote_upstream(r->remote, i)->n_models;
    return n;
}

const char *rlai_router_remote_model(const rlai_router *r, int i, const char **upstream)
{
    for (int u = 0; r && i >= 0 && u < rlai_remote_n_upstreams(r->remote); u++) {
        const rlai_upstream_config *c = rlai_remote_upstream(r->remote, u);
        if (i < c->n_models) {
            if (upstream)
                *upstream = c->name;
            return c->models[i].name;
        }
        i -= c->n_models;
    }
    return NULL;
}

/* "UPSTREAM/NAME": the upstream's index and NAME, else -1. */
static int prefixed(const rlai_router *r, const char *model, const char **rest)
{
    const char *slash = model ? strchr(model, '/') : NULL;
    if (!slash || !slash[1])
        return -1;
    for (int u = 0; u < rlai_remote_n_upstreams(r->remote); u++) {
        const rlai_upstream_config *c = rlai_remote_upstream(r->remote, u);
        if (strlen(c->name) == (size_t)(slash - model) && !strncmp(c->name, model, (size_t)(slash - model))) {
            *rest = slash + 1;
            return u;
        }
    }
    return -1;
}

static const char *mapped(const rlai_upstream_config *c, const char *name)
{
    for (int i = 0; i < c->n_models; i++)
        if (!strcmp(c->models[i].name, name))
            return c->models[i].remote;
    return NULL;
}

bool rlai_router_is_remote_model(const rlai_router *r, const char *model)
{
    if (!r || !r->remote || !model || !*model)
        return false;
    const char *rest;
    if (prefixed(r, model, &rest) >= 0)
        return true;
    for (int u = 0; u < rlai_remote_n_upstreams(r->remote); u++)
        if (mapped(rlai_remote_upstream(r->remote, u), model))
            return true;
    return false;
}

/* ---------------------------------------------------------- choosing an upstream */

/* The affinity rule (docs/REMOTE.md): key = affinity_key, else the first
 * message's content when it is a system message; FNV-1a 64 of the key,
 * of each candidate's name, mixed by splitmix64; the highest score among
 * the available candidates wins (rendezvous hashing: adding or losing an
 * upstream moves only the keys that went to it). */
static uint64_t fnv1a(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 0x100000001b3ull;
    }
    return h;
}

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static const char *affinity_key(const rlai_route_request *rq)
{
    if (rq->affinity_key && *rq->affinity_key)
        return rq->affinity_key;
    const rlai_text_request *t = &rq->text;
    if (t->messages && t->n_messages > 0 && t->messages[0].role && !strcmp(t->messages[0].role, "system") &&
        t->messages[0].content && *t->messages[0].content)
        return t->messages[0].content;
    return NULL;
}

/* Picks among the upstreams for which want(u) gives a remote name. */
typedef const char *(*want_fn)(const rlai_upstream_config *c, const char *model);

static const char *want_mapped(const rlai_upstream_config *c, const char *model)
{
    return mapped(c, model);
}

static const char *want_spill(const rlai_upstream_config *c, const char *model)
{
    (void)model;
    return c->spill_model;
}

static int choose(rlai_router *r, const rlai_route_request *rq, want_fn want, const char *model, int only,
                  const char **remote_name, int *n_candidates)
{
    const char *key = r->policy.affinity ? affinity_key(rq) : NULL;
    uint64_t hk = key ? fnv1a(key) : 0;
    int best = -1, best_load = 0;
    uint64_t best_score = 0;
    *n_candidates = 0;
    for (int u = 0; u < rlai_remote_n_upstreams(r->remote); u++) {
        if (only >= 0 && u != only)
            continue;
        const rlai_upstream_config *c = rlai_remote_upstream(r->remote, u);
        const char *name = want(c, model);
        if (!name)
            continue;
        (*n_candidates)++;
        if (!rlai_remote_available(r->remote, u))
            continue;
        rlai_upstream_stats st;
        rlai_remote_get_stats(r->remote, u, &st);
        int load = st.active + st.queued;
        uint64_t score = mix(hk ^ fnv1a(c->name));
        bool better = best < 0 || (key ? score > best_score : load < best_load);
        if (better) {
            best = u;
            best_score = score;
            best_load = load;
            *remote_name = name;
        }
    }
    return best;
}

static void say(char *buf, size_t len, const char *fmt, const char *a)
{
    if (buf && len)
        snprintf(buf, len, fmt, a);
}

static int submit_remote(rlai_router *r, const rlai_route_request *rq, int up, const char *remote_name,
                         uint64_t *id, int *n_prompt, char *err, size_t errlen)
{
    if (rq->text.image_rgb) {   /* an upstream takes an image as a URL (rq->image_url) */
        *n_prompt = RLAI_ROUTER_REFUSED_REMOTE;
        return rlai_errf(err, errlen, RLAI_ERR_NOT_IMPLEMENTED,
                    "raw images (image_rgb) are not implemented for remote models: give image_url");
    }
    uint64_t rid = RLAI_ROUTER_REMOTE_BIT | (atomic_fetch_add(&r->seq, 1) + 1);
    int rc = rlai_remote_submit(r->remote, up, remote_name, rq, rid, rq->on_error, err, errlen);
    if (rc < 0) {
        *n_prompt = RLAI_ROUTER_REFUSED_REMOTE;
        return rc;
    }
    atomic_fetch_add(&r->n_remote, 1);
    if (id)
        *id = rid;
    *n_prompt = 0;
    if (rq->where && rq->where_len) {
        char w[96];
        snprintf(w, sizeof(w), "upstream:%s", rlai_remote_upstream(r->remote, up)->name);
        say(rq->where, rq->where_len, "%s", w);
    }
    return 0;
}

static int submit_local(rlai_router *r, const rlai_route_request *rq, uint64_t *id, int *n_prompt, char *err,
                        size_t errlen)
{
    *n_prompt = -1;
    if (rq->image_url)
        return rlai_errf(err, errlen, RLAI_ERR_NOT_IMPLEMENTED,
                    "an image URL is for remote models; the local model takes image_rgb");
    int rc = rlai_engine_submit_text(r->engine, &rq->text, id, n_prompt, err, errlen);
    if (rc == 0) {
        atomic_fetch_add(&r->n_local, 1);
        say(rq->where, rq->where_len, "%s", "local");
    }
    return rc;
}

/* Spills rq to a spill upstream (only >= 0: that one). Returns 1 when no
 * upstream could take it (nothing said), else submit's result. */
static int spill(rlai_router *r, const rlai_route_request *rq, int only, int reason, uint64_t *id, int *n_prompt,
                 char *err, size_t errlen)
{
    const char *name = NULL;
    int nc = 0;
    int up = choose(r, rq, want_spill, NULL, only, &name, &nc);
    if (up < 0)
        return 1;
    int rc = submit_remote(r, rq, up, name, id, n_prompt, err, errlen);
    if (rc == 0)
        atomic_fetch_add(&r->n_spill[reason], 1);
    return rc;
}

static int decide(rlai_router *r, const rlai_route_request *rq, uint64_t *id, int *n_prompt, char *err,
                  size_t errlen);

int rlai_router_submit(rlai_router *r, const rlai_route_request *rq, uint64_t *id, int *n_prompt,
                       char *err, size_t errlen)
{
    int np = INT_MIN;                              /* set by the local engine when it ran */
    int rc = decide(r, rq, id, &np, err, errlen);
    if (np == INT_MIN)
        np = rc < 0 ? RLAI_ROUTER_REFUSED_REMOTE : 0;
    if (n_prompt)
        *n_prompt = np;
    return rc;
}

static int decide(rlai_router *r, const rlai_route_request *rq, uint64_t *id, int *n_prompt, char *err,
                  size_t errlen)
{
    if (!r || !rq)
        return rlai_engine_submit_text(NULL, NULL, id, n_prompt, err, errlen);
    if (rq->where && rq->where_len)
        rq->where[0] = 0;
    const char *route = rq->route && *rq->route && strcmp(rq->route, "auto") ? rq->route : NULL;
    if (!r->remote) {
        if (route && strcmp(route, "local")) {
            if (err && errlen)
                snprintf(err, errlen, "route '%.64s': no remote upstreams are configured", route);
            return RLAI_ERR_NOT_FOUND;
        }
        return submit_local(r, rq, id, n_prompt, err, errlen);
    }
    int only = -1;                                 /* route names one upstream */
    if (route && strcmp(route, "local") && strcmp(route, "remote")) {
        for (int u = 0; u < rlai_remote_n_upstreams(r->remote); u++)
            if (!strcmp(rlai_remote_upstream(r->remote, u)->name, route))
                only = u;
        if (only < 0) {
            if (err && errlen)
                snprintf(err, errlen, "route '%.64s' is none of auto, local, remote or an upstream's name", route);
            return RLAI_ERR_INVALID_ARG;
        }
    }
    const char *model = rq->model;
    /* a remote model: "UPSTREAM/NAME" or a "models" key */
    const char *rest = NULL;
    int pu = prefixed(r, model, &rest);
    if (pu >= 0 || rlai_router_is_remote_model(r, model)) {
        if (route && !strcmp(route, "local")) {
            if (err && errlen)
                snprintf(err, errlen, "model '%.100s' is remote but route is 'local'", model);
            return RLAI_ERR_INVALID_ARG;
        }
        if (pu >= 0) {
            if (only >= 0 && only != pu) {
                if (err && errlen)
                    snprintf(err, errlen, "model '%.100s' names another upstream than route '%.64s'", model, route);
                return RLAI_ERR_INVALID_ARG;
            }
            const char *m = mapped(rlai_remote_upstream(r->remote, pu), rest);
            return submit_remote(r, rq, pu, m ? m : rest, id, n_prompt, err, errlen);
        }
        const char *name = NULL;
        int nc = 0;
        int up = choose(r, rq, want_mapped, model, only, &name, &nc);
        if (up < 0) {
            if (nc == 0) {
                if (err && errlen)
                    snprintf(err, errlen, "upstream '%.64s' does not serve model '%.100s'", route, model);
                return RLAI_ERR_NOT_FOUND;
            }
            /* every candidate is down: submit to the first to get its reason */
            for (int u = 0; u < rlai_remote_n_upstreams(r->remote); u++)
                if ((only < 0 || u == only) && (name = mapped(rlai_remote_upstream(r->remote, u), model)))
                    return submit_remote(r, rq, u, name, id, n_prompt, err, errlen);
        }
        return submit_remote(r, rq, up, name, id, n_prompt, err, errlen);
    }
    /* the local model */
    if (route && strcmp(route, "local")) {         /* "remote" or an upstream: spill now */
        int rc = spill(r, rq, only, SPILL_ASKED, id, n_prompt, err, errlen);
        if (rc == 1) {
            if (err && errlen)
                snprintf(err, errlen, "no upstream%s%.64s can take the local model now (spill_model unset, "
                         "breaker open or queue full)", only >= 0 ? " " : "", only >= 0 ? route : "");
            return RLAI_ERR_DISCONNECTED;
        }
        return rc;
    }
    bool may_spill = !route;
    if (may_spill && r->policy.spill_queued > 0) {
        rlai_engine_stats es;
        rlai_engine_get_stats(r->engine, &es);
        if (es.queued >= r->policy.spill_queued) {
            /* a spill the upstream refuses (e.g. logprobs) queues locally instead */
            char e2[256];
            int np2 = 0;
            if (spill(r, rq, -1, SPILL_QUEUE, id, &np2, e2, sizeof(e2)) == 0) {
                *n_prompt = np2;
                return 0;
            }
        }
    }
    int rc = submit_local(r, rq, id, n_prompt, err, errlen);
    if (rc < 0 && may_spill) {
        int reason = -1;
        if (r->policy.spill_long_prompts && (rc == RLAI_ERR_TOO_LARGE || rc == RLAI_ERR_CONTEXT_FULL ||
                                             rc == RLAI_ERR_KV_FULL))
            reason = SPILL_CONTEXT;
        else if (rc == RLAI_ERR_BUSY && r->policy.spill_queued > 0)
            reason = SPILL_BUSY;
        if (reason >= 0) {
            char e2[256];
            int np2 = 0;
            if (spill(r, rq, -1, reason, id, &np2, e2, sizeof(e2)) == 0) {
                *n_prompt = np2;
                return 0;                          /* the local error is not reported */
            }
        }
    }
    return rc;
}

int rlai_router_wait_remote(rlai_router *r, int timeout_ms)
{
    return r ? rlai_remote_wait_idle(r->remote, timeout_ms) : 0;
}

int rlai_router_cancel(rlai_router *r, uint64_t id)
{
    if (!r)
        return RLAI_ERR_NOT_FOUND;
    if (id & RLAI_ROUTER_REMOTE_BIT)
        return rlai_remote_cancel(r->remote, id);
    return rlai_engine_cancel(r->engine, id);
}

int rlai_router_pump(rlai_router *r, uint64_t id, int timeout_ms, bool (*ready)(void *arg), void *arg)
{
    if (!r || !r->remote || !(id & RLAI_ROUTER_REMOTE_BIT))
        return 0;
    return rlai_remote_pump(r->remote, timeout_ms, ready, arg);
}

rlai_engine *rlai_router_engine(const rlai_router *r)
{
    return r ? r->engine : NULL;
}

/* ---------------------------------------------------------- metrics and stats */



char *rlai_router_render_metrics(rlai_router *r)
{
    rlai_strbuf b = { 0 };
    rlai_strbuf_printf(&b, "%s", "");
    if (r && r->remote) {
        rlai_strbuf_printf(&b, "# HELP rlai_route_requests_total Generations routed, by where they ran.\n"
                      "# TYPE rlai_route_requests_total counter\n"
                      "rlai_route_requests_total{place=\"local\"} %llu\n",
                  (unsigned long long)atomic_load(&r->n_local));
        int n = rlai_remote_n_upstreams(r->remote);
        rlai_upstream_stats *st = calloc((size_t)n, sizeof(*st));
        if (!st) {
            rlai_strbuf_free(&b);
            return NULL;
        }
        for (int u = 0; u < n; u++) {
            rlai_remote_get_stats(r->remote, u, &st[u]);
            rlai_strbuf_printf(&b, "rlai_route_requests_total{place=\"upstream:%s\"} %llu\n",
                      rlai_remote_upstream(r->remote, u)->name, (unsigned long long)st[u].requests);
        }
        rlai_strbuf_printf(&b, "# HELP rlai_route_spills_total Local-model generations sent to an upstream, by reason.\n"
                      "# TYPE rlai_route_spills_total counter\n");
        for (int i = 0; i < N_SPILL; i++)
            rlai_strbuf_printf(&b, "rlai_route_spills_total{reason=\"%s\"} %llu\n", spill_names[i],
                      (unsigned long long)atomic_load(&r->n_spill[i]));
        rlai_strbuf_printf(&b, "# HELP rlai_upstream_up 1 when the upstream's circuit breaker is closed.\n"
                      "# TYPE rlai_upstream_up gauge\n");
        for (int u = 0; u < n; u++)
            rlai_strbuf_printf(&b, "rlai_upstream_up{upstream=\"%s\"} %d\n", rlai_remote_upstream(r->remote, u)->name,
                      st[u].breaker == RLAI_BREAKER_CLOSED);
        rlai_strbuf_printf(&b, "# HELP rlai_upstream_breaker_state Circuit breaker state (1 for the current one).\n"
                      "# TYPE rlai_upstream_breaker_state gauge\n");
        for (int u = 0; u < n; u++)
            for (int s = 0; s < 3; s++)
                rlai_strbuf_printf(&b, "rlai_upstream_breaker_state{upstream=\"%s\",state=\"%s\"} %d\n",
                          rlai_remote_upstream(r->remote, u)->name, rlai_breaker_state_name((rlai_breaker_state)s),
                          (int)st[u].breaker == s);
        rlai_strbuf_printf(&b, "# HELP rlai_upstream_streams Remote requests by state now.\n"
                      "# TYPE rlai_upstream_streams gauge\n");
        for (int u = 0; u < n; u++) {
            const char *nm = rlai_remote_upstream(r->remote, u)->name;
            rlai_strbuf_printf(&b, "rlai_upstream_streams{upstream=\"%s\",state=\"active\"} %d\n", nm, st[u].active);
            rlai_strbuf_printf(&b, "rlai_upstream_streams{upstream=\"%s\",state=\"waiting\"} %d\n", nm, st[u].queued);
        }
        rlai_strbuf_printf(&b, "# HELP rlai_upstream_requests_total Remote requests by how they ended.\n"
                      "# TYPE rlai_upstream_requests_total counter\n");
        for (int u = 0; u < n; u++) {
            const char *nm = rlai_remote_upstream(r->remote, u)->name;
            rlai_strbuf_printf(&b, "rlai_upstream_requests_total{upstream=\"%s\",result=\"ok\"} %llu\n", nm,
                      (unsigned long long)st[u].ok);
            rlai_strbuf_printf(&b, "rlai_upstream_requests_total{upstream=\"%s\",result=\"error\"} %llu\n", nm,
                      (unsigned long long)st[u].failed);
            rlai_strbuf_printf(&b, "rlai_upstream_requests_total{upstream=\"%s\",result=\"cancelled\"} %llu\n", nm,
                      (unsigned long long)st[u].cancelled);
            rlai_strbuf_printf(&b, "rlai_upstream_requests_total{upstream=\"%s\",result=\"timeout\"} %llu\n", nm,
                      (unsigned long long)st[u].timeouts);
        }
        rlai_strbuf_printf(&b, "# HELP rlai_upstream_attempts_failed_total Failed attempts (connect, 5xx, 429, malformed, "
                      "slow).\n# TYPE rlai_upstream_attempts_failed_total counter\n");
        for (int u = 0; u < n; u++)
            rlai_strbuf_printf(&b, "rlai_upstream_attempts_failed_total{upstream=\"%s\"} %llu\n",
                      rlai_remote_upstream(r->remote, u)->name, (unsigned long long)st[u].attempts_failed);
        rlai_strbuf_printf(&b, "# HELP rlai_upstream_retries_total Attempts retried before the first token.\n"
                      "# TYPE rlai_upstream_retries_total counter\n");
        for (int u = 0; u < n; u++)
            rlai_strbuf_printf(&b, "rlai_upstream_retries_total{upstream=\"%s\"} %llu\n",
                      rlai_remote_upstream(r->remote, u)->name, (unsigned long long)st[u].retries);
        rlai_strbuf_printf(&b, "# HELP rlai_upstream_breaker_opens_total Times the circuit breaker opened.\n"
                      "# TYPE rlai_upstream_breaker_opens_total counter\n");
        for (int u = 0; u < n; u++)
            rlai_strbuf_printf(&b, "rlai_upstream_breaker_opens_total{upstream=\"%s\"} %llu\n",
                      rlai_remote_upstream(r->remote, u)->name, (unsigned long long)st[u].breaker_opens);
        free(st);
    }
    return rlai_strbuf_take(&b);              /* NULL when out of memory */
}

char *rlai_router_upstreams_json(rlai_router *r)
{
    cJSON *a = cJSON_CreateObject();
    if (!a)
        return NULL;
    for (int u = 0; r && u < rlai_remote_n_upstreams(r->remote); u++) {
        rlai_upstream_stats st;
        rlai_remote_get_stats(r->remote, u, &st);
        cJSON *o = cJSON_AddObjectToObject(a, rlai_remote_upstream(r->remote, u)->name);
        if (!o)
            break;
        cJSON_AddStringToObject(o, "breaker", rlai_breaker_state_name(st.breaker));
        cJSON_AddNumberToObject(o, "active", st.active);
        cJSON_AddNumberToObject(o, "waiting", st.queued);
        cJSON_AddNumberToObject(o, "requests", (double)st.requests);
        cJSON_AddNumberToObject(o, "ok", (double)st.ok);
        cJSON_AddNumberToObject(o, "failed", (double)st.failed);
        cJSON_AddNumberToObject(o, "cancelled", (double)st.cancelled);
        cJSON_AddNumberToObject(o, "timeouts", (double)st.timeouts);
        cJSON_AddNumberToObject(o, "retries", (double)st.retries);
        cJSON_AddNumberToObject(o, "attempts_failed", (double)st.attempts_failed);
        cJSON_AddNumberToObject(o, "breaker_opens", (double)st.breaker_opens);
    }
    char *s = cJSON_PrintUnformatted(a);
    cJSON_Delete(a);
    return s;
}
