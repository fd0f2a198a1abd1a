/* test_router.c - the routing decision and the remote request lifecycle
 * (host/router.c, host/remote.c) against tiny in-process upstreams (a
 * thread per upstream answering OpenAI-style SSE) and the real engine:
 * remote ids have the top bit, on_done comes exactly once (never after a
 * failed submit), cancel ends with CANCELLED, route overrides and their
 * refusals, "where" strings, spill on a too-long prompt and on a queue,
 * prefix affinity (same system prompt -> same upstream, stable), breaker. */
#include <arpa/inet.h>
#include <check.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "router.h"
#include "upstream.h"
#include "rlai/engine.h"
#include "rlai/error.h"

#define MODEL RLAI_MODELS_DIR "/SmolLM2-135M-Instruct.Q4_1.gguf"

/* ---------------------------------------------------------- a tiny upstream */

typedef struct fake {
    int fd, port;
    char name[16];
    pthread_t th;
    atomic_int hits, closed_early;
    atomic_bool stop;
} fake;

static void reply(int c, const char *s)
{
    size_t n = strlen(s);
    while (n) {
        ssize_t w = send(c, s, n, MSG_NOSIGNAL);
        if (w <= 0)
            return;
        s += w;
        n -= (size_t)w;
    }
}

static void *fake_main(void *arg)
{
    fake *f = arg;
    while (!atomic_load(&f->stop)) {
        int c = accept(f->fd, NULL, NULL);
        if (c < 0)
            continue;
        if (atomic_load(&f->stop)) {
            close(c);
            break;
        }
        char req[16384];
        size_t got = 0;
        char *body = NULL;
        long clen = -1;
        while (got < sizeof(req) - 1) {
            ssize_t r = recv(c, req + got, sizeof(req) - 1 - got, 0);
            if (r <= 0)
                break;
            got += (size_t)r;
            req[got] = 0;
            char *e = strstr(req, "\r\n\r\n");
            if (e && clen < 0) {
                char *cl = strcasestr(req, "Content-Length:");
                clen = cl ? atol(cl + 15) : 0;
                body = e + 4;
            }
            if (body && (long)(got - (size_t)(body - req)) >= clen)
                break;
        }
        atomic_fetch_add(&f->hits, 1);
        bool slow = body && strstr(body, "\"model\":\"slow\"");
        bool fail = body && strstr(body, "\"model\":\"fail\"");
        if (fail) {
            reply(c, "HTTP/1.1 500 Internal Server Error\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}");
            close(c);
            continue;
        }
        reply(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n");
        char ev[256];
        snprintf(ev, sizeof(ev), "data: {\"choices\":[{\"delta\":{\"content\":\"%s\"}}]}\n\n", f->name);
        reply(c, ev);
        if (slow) {
            for (int i = 0; i < 500; i++) {   /* 5 s of tokens unless the client goes */
                struct timespec ts = { 0, 10 * 1000 * 1000 };
                nanosleep(&ts, NULL);
                static const char dot[] = "data: {\"choices\":[{\"delta\":{\"content\":\".\"}}]}\n\n";
                if (send(c, dot, sizeof dot - 1, MSG_NOSIGNAL) < 0) {
                    atomic_fetch_add(&f->closed_early, 1);
                    break;
                }
            }
        }
        reply(c, "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"length\"}],"
                 "\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n");
        close(c);
    }
    return NULL;
}

static void fake_start(fake *f, const char *name)
{
    memset(f, 0, sizeof(*f));
    snprintf(f->name, sizeof(f->name), "%s", name);
    f->fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(f->fd, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    ck_assert_int_eq(bind(f->fd, (struct sockaddr *)&a, sizeof(a)), 0);
    socklen_t l = sizeof(a);
    getsockname(f->fd, (struct sockaddr *)&a, &l);
    f->port = ntohs(a.sin_port);
    ck_assert_int_eq(listen(f->fd, 64), 0);
    ck_assert_int_eq(pthread_create(&f->th, NULL, fake_main, f), 0);
}

static void fake_stop(fake *f)
{
    atomic_store(&f->stop, true);
    int s = socket(AF_INET, SOCK_STREAM, 0);           /* wake accept */
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)f->port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    connect(s, (struct sockaddr *)&a, sizeof(a));
    close(s);
    pthread_join(f->th, NULL);
    close(f->fd);
}

/* ---------------------------------------------------------- engine + router */

static rlai_engine *E;
static pthread_t stepper;
static atomic_bool stepping;

static void *step_main(void *arg)
{
    (void)arg;
    while (atomic_load(&stepping)) {
        if (rlai_engine_wait_work(E, 20))
            rlai_engine_step(E);
    }
    return NULL;
}

static int max_running;   /* 0 = the engine's default */

static void engine_up(void)
{
    rlai_engine_params p;
    rlai_engine_params_init(&p);
    p.max_running = max_running;
    p.n_threads = 1;
    p.n_ctx = 512;
    p.max_queue = 8;
    char err[256];
    ck_assert_msg(rlai_engine_open(MODEL, &p, &E, err, sizeof(err)) == 0, "%s", err);
    atomic_store(&stepping, true);
    pthread_create(&stepper, NULL, step_main, NULL);
}

static void engine_down(void)
{
    atomic_store(&stepping, false);
    rlai_engine_wakeup(E);
    pthread_join(stepper, NULL);
    rlai_engine_close(E);
}

static void ucfg(rlai_upstream_config *u, const char *name, int port, const char *model, const char *spill)
{
    rlai_upstream_config_init(u);
    u->name = strdup(name);
    char url[64];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/v1", port);
    u->base_url = strdup(url);
    if (model) {
        u->models = calloc(2, sizeof(*u->models));
        u->models[0].name = strdup(model);
        u->models[0].remote = strdup(model);
        u->models[1].name = strdup("slow");
        u->models[1].remote = strdup("slow");
        u->n_models = 2;
    }
    if (spill)
        u->spill_model = strdup(spill);
    u->retry_backoff_ms = 10;
    u->max_retries = 0;
    u->breaker_failures = 2;
    u->breaker_cooldown_ms = 300;
}

typedef struct res {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done, status, tokens, neg_tok;
    pthread_t pumper;             /* tokens delivered on this thread are counted */
    bool has_pumper;
    int on_pumper;
    rlai_stop_reason stop;
    char text[512];
    char err[256];
} res;

static void res_init(res *r)
{
    memset(r, 0, sizeof(*r));
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
}

static int on_tok(void *u, rlai_token t, const char *s, size_t n)
{
    res *r = u;
    pthread_mutex_lock(&r->mu);
    if (t < 0)
        r->neg_tok++;
    r->tokens++;
    if (r->has_pumper && pthread_equal(r->pumper, pthread_self()))
        r->on_pumper++;
    size_t l = strlen(r->text);
    if (l + n < sizeof(r->text)) {
        memcpy(r->text + l, s, n);
        r->text[l + n] = 0;
    }
    pthread_mutex_unlock(&r->mu);
    return 0;
}

static void on_done(void *u, uint64_t id, int status, const rlai_gen_metrics *m)
{
    (void)id;
    res *r = u;
    pthread_mutex_lock(&r->mu);
    r->done++;
    r->status = status;
    r->stop = m ? m->stop : RLAI_STOP_NONE;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

static void on_err(void *u, uint64_t id, int status, const char *msg)
{
    (void)id;
    (void)status;
    res *r = u;
    snprintf(r->err, sizeof(r->err), "%s", msg);
}

static void wait_done(res *r)
{
    pthread_mutex_lock(&r->mu);
    while (!r->done)
        pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
    struct timespec ts = { 0, 50 * 1000 * 1000 };   /* a second on_done would show by now */
    nanosleep(&ts, NULL);
    ck_assert_int_eq(r->done, 1);
}

static rlai_chat_message SYS_A[2] = { { "system", "You are Captain Hook." }, { "user", "Hi" } };

static void rq_init(rlai_route_request *rq, res *r, const char *model, const rlai_chat_message *m, int n)
{
    memset(rq, 0, sizeof(*rq));
    rq->text.messages = m;
    rq->text.n_messages = n;
    rlai_gen_params_init(&rq->text.rp.gen);
    rq->text.rp.gen.max_tokens = 2;
    rq->text.rp.on_token = on_tok;
    rq->text.rp.on_done = on_done;
    rq->text.rp.user = r;
    rq->model = model;
    rq->on_error = on_err;
}

/* Starts the engine, fakes "A" and "B" and a router over them as upstreams
 * "ua" (model, spill_a) and "ub" (model), default policy; two_down ends them. */
static rlai_router *two_up(fake *a, fake *b, rlai_upstream_config u[2], const char *model, const char *spill_a)
{
    engine_up();
    fake_start(a, "A");
    fake_start(b, "B");
    ucfg(&u[0], "ua", a->port, model, spill_a);
    ucfg(&u[1], "ub", b->port, model, NULL);
    rlai_router *rt = NULL;
    ck_assert_int_eq(rlai_router_new(E, &rt), 0);
    char err[256] = "";
    ck_assert_msg(rlai_router_set_upstreams(rt, u, 2, NULL, err, sizeof(err)) == 0, "%s", err);
    return rt;
}

/* Frees the router, the two upstream configs, the fakes and the engine. */
static void two_down(rlai_router *rt, rlai_upstream_config u[2], fake *a, fake *b)
{
    rlai_router_free(rt);
    rlai_upstream_config_clear(&u[0]);
    rlai_upstream_config_clear(&u[1]);
    fake_stop(a);
    fake_stop(b);
    engine_down();
}

START_TEST(routes_by_model_override_and_affinity)
{
    fake a, b;
    rlai_upstream_config u[2];
    rlai_router *rt = two_up(&a, &b, u, "big", "local-twin");
    char err[256] = "";
    ck_assert(rlai_router_is_remote_model(rt, "big"));
    ck_assert(rlai_router_is_remote_model(rt, "ub/anything"));
    ck_assert(!rlai_router_is_remote_model(rt, "nope/x"));
    ck_assert(!rlai_router_is_remote_model(rt, "default"));
    ck_assert_int_eq(rlai_router_n_remote_models(rt), 4);
    const char *upn = NULL;
    ck_assert_str_eq(rlai_router_remote_model(rt, 2, &upn), "big");
    ck_assert_str_eq(upn, "ub");
    ck_assert_ptr_null(rlai_router_remote_model(rt, 4, NULL));

    /* a remote model: top-bit id, text from the upstream, token id -1, once */
    res r;
    res_init(&r);
    rlai_route_request rq;
    rq_init(&rq, &r, "ub/big", SYS_A, 2);
    char where[64];
    rq.where = where;
    rq.where_len = sizeof(where);
    uint64_t id = 0;
    int np = -1;
    ck_assert_msg(rlai_router_submit(rt, &rq, &id, &np, err, sizeof(err)) == 0, "%s", err);
    ck_assert(id & RLAI_ROUTER_REMOTE_BIT);
    ck_assert_int_eq(np, 0);
    ck_assert_str_eq(where, "upstream:ub");
    wait_done(&r);
    ck_assert_int_eq(r.status, 0);
    ck_assert_int_eq(r.stop, RLAI_STOP_MAX_TOKENS);
    ck_assert_str_eq(r.text, "B");
    ck_assert_int_eq(r.neg_tok, r.tokens);

    /* affinity: the same system prompt always lands on the same upstream */
    char first[8] = "";
    for (int i = 0; i < 6; i++) {
        res_init(&r);
        rq_init(&rq, &r, "big", SYS_A, 2);
        ck_assert_int_eq(rlai_router_submit(rt, &rq, &id, NULL, err, sizeof(err)), 0);
        wait_done(&r);
        if (i == 0)
            snprintf(first, sizeof(first), "%.4s", r.text);
        ck_assert_str_eq(r.text, first);
    }
    /* different keys reach both upstreams */
    bool seen_a = false, seen_b = false;
    for (int i = 0; i < 24 && !(seen_a && seen_b); i++) {
        char key[32];
        snprintf(key, sizeof(key), "character %d", i);
        res_init(&r);
        rq_init(&rq, &r, "big", SYS_A, 2);
        rq.affinity_key = key;
        ck_assert_int_eq(rlai_router_submit(rt, &rq, &id, NULL, err, sizeof(err)), 0);
        wait_done(&r);
        seen_a |= !strcmp(r.text, "A");
        seen_b |= !strcmp(r.text, "B");
    }
    ck_assert(seen_a && seen_b);

    /* route overrides: "local" runs here; "ua" for the local model = a spill */
    res_init(&r);
    rq_init(&rq, &r, NULL, SYS_A, 2);
    rq.route = "local";
    rq.where = where;
    rq.where_len = sizeof(where);
    ck_assert_int_eq(rlai_router_submit(rt, &rq, &id, &np, err, sizeof(err)), 0);
    ck_assert(!(id & RLAI_ROUTER_REMOTE_BIT));
    ck_assert_int_gt(np, 0);
    ck_assert_str_eq(where, "local");
    wait_done(&r);
    ck_assert_int_ge(r.neg_tok, 0);
    ck_assert_int_eq(r.neg_tok, 0);
    res_init(&r);
    rq_init(&rq, &r, NULL, SYS_A, 2);
    rq.route = "remote";
    ck_assert_int_eq(rlai_router_submit(rt, &rq, &id, NULL, err, sizeof(err)), 0);
    wait_done(&r);
    ck_assert_str_eq(r.text, "A");                     /* ua is the one with a spill_model */
    /* refusals: no on_done */
    res_init(&r);
    rq_init(&rq, &r, "big", SYS_A, 2);
    rq.route = "local";
    ck_assert_int_eq(rlai_router_submit(rt, &rq, &id, NULL, err, sizeof(err)), RLAI_ERR_INVALID_ARG);
    rq.route = "nowhere";
    ck_assert_int_eq(rlai_router_submit(rt, &rq, &id, NULL, err, sizeof(err)), RLAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(err, "nowhere"));
    rq.route = "ub";
    rq.model = NULL;                                   /* ub has no spill_model */
    ck_assert_int_eq(rlai_router_submit(rt, &rq, &id, NULL, err, sizeof(err)), RLAI_ERR_DISCONNECTED);
    rq.route = NULL;
    rq.model = "big";
    rq.text.rp.gen.top_logprobs = 3;
    rq.text.rp.gen.on_logprobs = (rlai_logprobs_cb)(uintptr_t)1;
    np = 5;
    ck_assert_int_eq(rlai_router_submit(rt, &rq, &id, &np, err, sizeof(err)), RLAI_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(err, "not implemented"));
    ck_assert_int_eq(np, RLAI_ROUTER_REFUSED_REMOTE);
    rq.route = "nowhere";
    np = 5;
    ck_assert_int_eq(rlai_router_submit(rt, &rq, &id, &np, err, sizeof(err)), RLAI_ERR_INVALID_ARG);
    ck_assert_int_eq(np, RLAI_ROUTER_REFUSED_REMOTE);
    rq.route = NULL;
    ck_assert_int_eq(r.done, 0);

    char *m = rlai_router_render_metrics(rt);
    ck_assert_ptr_nonnull(strstr(m, "rlai_route_requests_total{place=\"local\"} 1\n"));
    ck_assert_ptr_nonnull(strstr(m, "rlai_route_spills_total{reason=\"asked\"} 1\n"));
    ck_assert_ptr_nonnull(strstr(m, "rlai_upstream_up{upstream=\"ua\"} 1\n"));
    free(m);
    char *js = rlai_router_upstreams_json(rt);
    ck_assert_ptr_nonnull(strstr(js, "\"ub\":{\"breaker\":\"closed\""));
    free(js);
    two_down(rt, u, &a, &b);
}
END_TEST

START_TEST(cancel_spill_and_breaker)
{
    engine_up();
    fake a;
    fake_start(&a, "A");
    rlai_upstream_config u;
    ucfg(&u, "ua", a.port, "fail", "twin");
    rlai_router *rt = NULL;
    ck_assert_int_eq(rlai_router_new(E, &rt), 0);
    char err[256] = "";
    rlai_route_policy pol;
    rlai_route_policy_init(&pol);
    ck_assert_int_eq(rlai_router_set_upstreams(rt, &u, 1, &pol, err, sizeof(err)), 0);

    /* cancel: the transfer goes, on_done CANCELLED, the upstream saw the close */
    res r;
    res_init(&r);
    rlai_route_request rq;
    rq_init(&rq, &r, "slow", SYS_A, 2);
    uint64_t id = 0;
    ck_assert_int_eq(rlai_router_submit(rt, &rq, &id, NULL, err, sizeof(err)), 0);
    for (int i = 0; i < 500; i++) {
        pthread_mutex_lock(&r.mu);
        int t = r.tokens;
        pthread_mutex_unlock(&r.mu);
        if (t >= 3)
            break;
        struct timespec ts = { 0, 10 * 1000 * 1000 };
        nanosleep(&ts, NULL);
    }
    ck_assert_int_eq(rlai_router_cancel(rt, id), 0);
    ck_assert_int_eq(rlai_router_wait_remote(rt, 5000), 0);   /* on_done returned */
    ck_assert_int_eq(r.done, 1);
    wait_done(&r);
    ck_assert_int_eq(r.status, 0);
    ck_assert_int_eq(r.stop, RLAI_STOP_CANCELLED);
    for (int i = 0; i < 200 && !atomic_load(&a.closed_early); i++) {
        struct timespec ts = { 0, 10 * 1000 * 1000 };
        nanosleep(&ts, NULL);
    }
    ck_assert_int_eq(atomic_load(&a.closed_early), 1);
    ck_assert_int_eq(rlai_router_cancel(rt, id), RLAI_ERR_NOT_FOUND);

    /* spill: a prompt over the local limit goes to the spill upstream */
    res_init(&r);
    rq_init(&rq, &r, NULL, SYS_A, 2);
    rq.text.max_prompt_tokens = 3;
    char where[64] = "";
    rq.where = where;
    rq.where_len = sizeof(where);
    ck_assert_msg(rlai_router_submit(rt, &rq, &id, NULL, err, sizeof(err)) == 0, "%s", err);
    ck_assert_str_eq(where, "upstream:ua");
    wait_done(&r);
    ck_assert_str_eq(r.text, "A");
    char *m = rlai_router_render_metrics(rt);
    ck_assert_ptr_nonnull(strstr(m, "rlai_route_spills_total{reason=\"context\"} 1\n"));
    free(m);

    /* breaker: two failures open it; a submit is then refused at once */
    for (int i = 0; i < 2; i++) {
        res_init(&r);
        rq_init(&rq, &r, "fail", SYS_A, 2);
        ck_assert_int_eq(rlai_router_submit(rt, &rq, &id, NULL, err, sizeof(err)), 0);
        wait_done(&r);
        ck_assert_int_eq(r.status, RLAI_ERR_DISCONNECTED);
        ck_assert_ptr_nonnull(strstr(r.err, "HTTP 500"));
    }
    int hits = atomic_load(&a.hits);
    res_init(&r);
    rq_init(&rq, &r, "fail", SYS_A, 2);
    ck_assert_int_eq(rlai_router_submit(rt, &rq, &id, NULL, err, sizeof(err)), RLAI_ERR_DISCONNECTED);
    ck_assert_ptr_nonnull(strstr(err, "circuit breaker open"));
    ck_assert_int_eq(atomic_load(&a.hits), hits);
    ck_assert_int_eq(r.done, 0);
    /* an open breaker leaves the local model local: a long prompt stays refused */
    rq_init(&rq, &r, NULL, SYS_A, 2);
    rq.text.max_prompt_tokens = 3;
    ck_assert_int_eq(rlai_router_submit(rt, &rq, &id, NULL, err, sizeof(err)), RLAI_ERR_TOO_LARGE);
    char *js = rlai_router_upstreams_json(rt);
    ck_assert_ptr_nonnull(strstr(js, "\"breaker\":\"open\""));
    free(js);
    struct timespec ts = { 0, 350 * 1000 * 1000 };     /* cooldown 300 ms: half-open */
    nanosleep(&ts, NULL);
    res_init(&r);
    rq_init(&rq, &r, "slow", SYS_A, 2);                /* the trial succeeds: closed */
    rq.text.rp.gen.timeout_ms = 100;                   /* and ends at its deadline */
    ck_assert_int_eq(rlai_router_submit(rt, &rq, &id, NULL, err, sizeof(err)), 0);
    wait_done(&r);
    ck_assert_int_eq(r.status, 0);
    ck_assert_int_eq(r.stop, RLAI_STOP_TIMEOUT);
    js = rlai_router_upstreams_json(rt);
    ck_assert_ptr_nonnull(strstr(js, "\"breaker\":\"closed\""));
    free(js);

    rlai_router_free(rt);
    rlai_upstream_config_clear(&u);
    fake_stop(&a);
    engine_down();
}
END_TEST

/* spill on the local queue: one sequence runs at a time, a second waits;
 * with routing.spill_queued 1 the third goes to the spill upstream */
START_TEST(spill_on_queue)
{
    max_running = 1;
    engine_up();
    max_running = 0;
    fake a;
    fake_start(&a, "A");
    rlai_upstream_config u;
    ucfg(&u, "ua", a.port, "m", "twin");
    rlai_router *rt = NULL;
    ck_assert_int_eq(rlai_router_new(E, &rt), 0);
    rlai_route_policy pol;
    rlai_route_policy_init(&pol);
    pol.spill_queued = 1;
    char err[256] = "";
    ck_assert_int_eq(rlai_router_set_upstreams(rt, &u, 1, &pol, err, sizeof(err)), 0);
    res r1, r2, r3;
    res_init(&r1);
    res_init(&r2);
    res_init(&r3);
    rlai_route_request q1, q2, q3;
    rlai_chat_message story[1] = { { "user", "Tell me a long story." } };
    rq_init(&q1, &r1, NULL, story, 1);
    q1.text.rp.gen.max_tokens = 64;
    rq_init(&q2, &r2, NULL, story, 1);
    rq_init(&q3, &r3, NULL, SYS_A, 2);
    char w1[32], w2[32], w3[32];
    q1.where = w1; q1.where_len = sizeof w1;
    q2.where = w2; q2.where_len = sizeof w2;
    q3.where = w3; q3.where_len = sizeof w3;
    uint64_t id1, id2, id3;
    ck_assert_int_eq(rlai_router_submit(rt, &q1, &id1, NULL, err, sizeof(err)), 0);
    bool admitted = false;                            /* q1 admitted and running (slow under TSan) */
    for (int i = 0; i < 12000 && !admitted; i++) {
        rlai_engine_stats es;
        rlai_engine_get_stats(E, &es);
        admitted = es.running == 1 && es.queued == 0;
        struct timespec ts = { 0, 5 * 1000 * 1000 };
        if (!admitted)
            nanosleep(&ts, NULL);
    }
    ck_assert_msg(admitted, "the first request was not admitted within 60 s");
    ck_assert_int_eq(rlai_router_submit(rt, &q2, &id2, NULL, err, sizeof(err)), 0);
    ck_assert_int_eq(rlai_router_submit(rt, &q3, &id3, NULL, err, sizeof(err)), 0);
    ck_assert_str_eq(w1, "local");
    ck_assert_str_eq(w2, "local");
    ck_assert_str_eq(w3, "upstream:ua");
    ck_assert(id3 & RLAI_ROUTER_REMOTE_BIT);
    wait_done(&r3);
    ck_assert_str_eq(r3.text, "A");
    rlai_router_cancel(rt, id1);
    wait_done(&r1);
    wait_done(&r2);
    char *m = rlai_router_render_metrics(rt);
    ck_assert_ptr_nonnull(strstr(m, "rlai_route_spills_total{reason=\"queue\"} 1\n"));
    free(m);
    rlai_router_free(rt);
    rlai_upstream_config_clear(&u);
    fake_stop(&a);
    engine_down();
}
END_TEST

/* ---------------------------------------------------------- pump (leader/follower) */

typedef struct pump_probe {
    res *r;
    int seen;                     /* tokens when the pump first asked; -1 = not yet */
    rlai_router *rt;
    uint64_t other;               /* another remote request, pumped from a helper thread */
    bool asked;
    int other_rc;
} pump_probe;

static bool never_ready(void *arg)
{
    (void)arg;
    return false;
}

static void *pump_other(void *arg)
{
    pump_probe *p = arg;
    p->other_rc = rlai_router_pump(p->rt, p->other, 50, never_ready, NULL);
    return NULL;
}

/* Ready when a token came after the pump first asked: by then the pump
 * holds the transfers, so that token was delivered on the pumping thread. */
static bool ready_more(void *arg)
{
    pump_probe *p = arg;
    if (!p->asked && p->other) {
        /* a second thread may not pump while this one does */
        p->asked = true;
        pthread_t th;
        ck_assert_int_eq(pthread_create(&th, NULL, pump_other, p), 0);
        pthread_join(th, NULL);
    }
    pthread_mutex_lock(&p->r->mu);
    int t = p->r->tokens, done = p->r->done;
    pthread_mutex_unlock(&p->r->mu);
    if (p->seen < 0) {
        p->seen = t;
        return done;
    }
    return done || t > p->seen;
}

static bool is_done(void *arg)
{
    res *r = arg;
    pthread_mutex_lock(&r->mu);
    bool d = r->done;
    pthread_mutex_unlock(&r->mu);
    return d;
}

typedef struct later_cancel {
    rlai_router *rt;
    uint64_t id;
} later_cancel;

static void *cancel_later(void *arg)
{
    later_cancel *c = arg;
    struct timespec ts = { 0, 100 * 1000 * 1000 };
    nanosleep(&ts, NULL);
    rlai_router_cancel(c->rt, c->id);
    return NULL;
}

static int tokens_of(res *r)
{
    pthread_mutex_lock(&r->mu);
    int t = r->tokens;
    pthread_mutex_unlock(&r->mu);
    return t;
}

/* Waits (up to 3 s) until r has at least want tokens. */
static void wait_tokens(res *r, int want)
{
    for (int i = 0; i < 300 && tokens_of(r) < want; i++) {
        struct timespec ts = { 0, 10 * 1000 * 1000 };
        nanosleep(&ts, NULL);
    }
    ck_assert_int_ge(tokens_of(r), want);
}

/* Two streams of dots on model "slow": ra/qa to upstream "ua", counted as
 * pumped when delivered on this thread, and rb/qb to "ub". */
static void two_slow(res *ra, rlai_route_request *qa, res *rb, rlai_route_request *qb)
{
    res_init(ra);
    res_init(rb);
    ra->pumper = pthread_self();
    ra->has_pumper = true;
    rq_init(qa, ra, "slow", SYS_A, 2);
    qa->route = "ua";
    rq_init(qb, rb, "slow", SYS_A, 2);
    qb->route = "ub";
}

/* Pumps request id n times, each until a token arrived on this thread. */
static void pump_rounds(rlai_router *rt, uint64_t id, pump_probe *p, int n)
{
    for (int round = 0; round < n; round++) {
        p->seen = -1;
        ck_assert_int_eq(rlai_router_pump(rt, id, 3000, ready_more, p), 1);
        ck_assert_int_gt(tokens_of(p->r), p->seen);
    }
}

START_TEST(pump_drives_on_the_waiting_thread)
{
    fake a, b;
    rlai_upstream_config u[2];
    rlai_router *rt = two_up(&a, &b, u, "m", NULL);
    char err[256] = "";

    /* a local id is not pumped */
    res r;
    res_init(&r);
    ck_assert_int_eq(rlai_router_pump(rt, 5, 10, is_done, &r), 0);

    /* two streams of dots, one per upstream; this thread pumps A's */
    res ra, rb;
    rlai_route_request qa, qb;
    two_slow(&ra, &qa, &rb, &qb);
    uint64_t ida = 0, idb = 0;
    ck_assert_msg(rlai_router_submit(rt, &qa, &ida, NULL, err, sizeof(err)) == 0, "%s", err);
    ck_assert_msg(rlai_router_submit(rt, &qb, &idb, NULL, err, sizeof(err)) == 0, "%s", err);
    pump_probe p = { .r = &ra, .seen = -1, .rt = rt, .other = idb, .other_rc = -1 };
    pump_rounds(rt, ida, &p, 5);
    ck_assert(p.asked);
    ck_assert_int_eq(p.other_rc, 0);                  /* one pump at a time */
    pthread_mutex_lock(&ra.mu);
    ck_assert_int_ge(ra.on_pumper, 5);                /* A's tokens came on this thread */
    pthread_mutex_unlock(&ra.mu);
    ck_assert_int_eq(ra.done, 0);
    ck_assert_int_gt(tokens_of(&rb), 0);              /* B went on meanwhile */

    /* nobody pumps now: the remote thread takes the transfers back */
    int tb = tokens_of(&rb), ta = tokens_of(&ra);
    wait_tokens(&rb, tb + 3);
    wait_tokens(&ra, ta + 3);

    /* a cancel from another thread ends a pumped request, and the pump */
    later_cancel lc = { rt, ida };
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, cancel_later, &lc), 0);
    ck_assert_int_eq(rlai_router_pump(rt, ida, 5000, is_done, &ra), 1);
    pthread_join(th, NULL);
    ck_assert_int_eq(ra.done, 1);
    ck_assert_int_eq(ra.status, 0);
    ck_assert_int_eq(ra.stop, RLAI_STOP_CANCELLED);

    ck_assert_int_eq(rlai_router_cancel(rt, idb), 0);
    wait_done(&rb);
    ck_assert_int_eq(rb.stop, RLAI_STOP_CANCELLED);
    ck_assert(rb.text[0] == 'B');
    ck_assert(ra.text[0] == 'A');
    ck_assert_int_eq(rlai_router_wait_remote(rt, 5000), 0);
    two_down(rt, u, &a, &b);
}
END_TEST

/* One stream alone, pumped by its own thread for a while (the remote
 * thread then looks for a hand-back less and less often), then left: the
 * remote thread still takes it over, and a request submitted meanwhile
 * starts and streams too. */
START_TEST(lone_stream_pumped_then_handed_back)
{
    fake a, b;
    rlai_upstream_config u[2];
    rlai_router *rt = two_up(&a, &b, u, "m", NULL);
    char err[256] = "";
    res ra, rb;
    rlai_route_request qa, qb;
    two_slow(&ra, &qa, &rb, &qb);
    uint64_t ida = 0, idb = 0;
    ck_assert_msg(rlai_router_submit(rt, &qa, &ida, NULL, err, sizeof(err)) == 0, "%s", err);
    pump_probe p = { .r = &ra, .seen = -1, .rt = rt };
    pump_rounds(rt, ida, &p, 30);                   /* about 300 ms of tokens, 10 ms apart */
    pthread_mutex_lock(&ra.mu);
    ck_assert_int_ge(ra.on_pumper, 30);
    pthread_mutex_unlock(&ra.mu);

    /* nobody pumps now */
    wait_tokens(&ra, tokens_of(&ra) + 5);

    /* pumped alone again; a second request comes; then nobody pumps */
    pump_rounds(rt, ida, &p, 10);
    ck_assert_msg(rlai_router_submit(rt, &qb, &idb, NULL, err, sizeof(err)) == 0, "%s", err);
    wait_tokens(&rb, 3);
    wait_tokens(&ra, tokens_of(&ra) + 3);

    ck_assert_int_eq(rlai_router_cancel(rt, ida), 0);
    ck_assert_int_eq(rlai_router_cancel(rt, idb), 0);
    wait_done(&ra);
    wait_done(&rb);
    ck_assert_int_eq(ra.stop, RLAI_STOP_CANCELLED);
    ck_assert_int_eq(rb.stop, RLAI_STOP_CANCELLED);
    ck_assert(ra.text[0] == 'A');
    ck_assert(rb.text[0] == 'B');
    ck_assert_int_eq(rlai_router_wait_remote(rt, 5000), 0);
    two_down(rt, u, &a, &b);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("router");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, routes_by_model_override_and_affinity);
    tcase_add_test(tc, cancel_spill_and_breaker);
    tcase_add_test(tc, spill_on_queue);
    tcase_add_test(tc, pump_drives_on_the_waiting_thread);
    tcase_add_test(tc, lone_stream_pumped_then_handed_back);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
