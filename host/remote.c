/* remote.c - transfers to remote upstreams on one libcurl thread (see remote.h). */
#include "remote.h"

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "router.h"
#include "sse.h"
#include "rlai/error.h"
#include "rlai/deadline.h"

#define ERRBODY_MAX 1024

typedef enum rstate { RS_WAIT = 0, RS_ACTIVE = 1 } rstate;

enum { DRIVER_NONE = 0, DRIVER_THREAD, DRIVER_PUMP };

typedef struct rreq {
    struct rreq *next;
    rlai_remote *rm;
    uint64_t id;
    int up;
    char *body;
    bool chat;
    rlai_token_cb on_token;
    rlai_done_cb on_done;
    rlai_remote_error_cb on_error;
    void (*on_logprobs)(void *user, cJSON *entries);
    void (*on_tool_calls)(void *user, cJSON *deltas);
    void *user;
    rstate state;
    bool cancel;                 /* asked (under rm->mu) */
    bool cb_stop;                /* on_token asked to stop */
    uint64_t t_submit, deadline, t_attempt, t_first, t_last_byte, next_try_at;
    int attempts;
    /* the current attempt (the driver only) */
    CURL *easy;
    char curl_err[CURL_ERROR_SIZE];  /* libcurl's detail of a failed transfer */
    struct curl_slist *hdrs;
    rlai_sse *sse;
    long http;
    char errbody[ERRBODY_MAX + 1];
    size_t errlen;
    int fail_code;               /* this attempt failed already (malformed, error event), else 0 */
    char fail_msg[256];
    bool saw_done;
    rlai_stop_reason finish;
    int prompt_tokens, completion_tokens, pieces;
    int accepted_prediction, rejected_prediction;   /* the upstream's usage, -1 = not said */
} rreq;

typedef struct upstream {
    rlai_upstream_config cfg;
    char *key;
    char *url_chat, *url_completions;
    char *auth_header;
    rlai_breaker br;
    int active, queued;
    rlai_upstream_stats st;
} upstream;

struct rlai_remote {
    upstream *ups;
    int n;
    pthread_mutex_t mu;
    pthread_cond_t idle_cv;      /* signalled when a request has ended (under mu) */
    rreq *list;                  /* every running request (under mu) */
    int n_delivering;            /* ended, on_done not yet returned (under mu) */
    CURLM *multi;                /* driven by one thread at a time: r->driver */
    int driver;                  /* who drives the transfers now (under mu) */
    /* libcurl's multi-socket interface, the driver's alone: the sockets
     * libcurl asked to watch (pfd[0] is the wake pipe) and its timer */
    struct pollfd *pfd;
    int npfd, cap_pfd;
    bool timer_on;
    uint64_t timer_at_us;        /* CLOCK_MONOTONIC */
    uint64_t timer_gen;          /* on_timer calls */
    int wake[2];                 /* a byte here wakes the driver's poll */
    bool pump_in;                /* a connection thread is in rlai_remote_pump (under mu) */
    bool woken;                  /* a submit or cancel since the thread last looked (under mu) */
    pthread_cond_t drive_cv;     /* the thread let go of the transfers (under mu) */
    pthread_t thread;
    bool thread_started;
    atomic_bool stop;
};

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static uint64_t now_ms(void)
{
    return now_us() / 1000u;
}

/* Wakes the driver out of its poll (any thread). A full pipe already will. */
static void wake(rlai_remote *r)
{
    ssize_t w;
    do
        w = write(r->wake[1], "", 1);
    while (w < 0 && errno == EINTR);
}

/* libcurl's CURLMOPT_SOCKETFUNCTION: watch s for what, or stop watching
 * it. Runs inside the driver's libcurl calls. */
static int on_socket(CURL *e, curl_socket_t s, int what, void *user, void *socketp)
{
    (void)e;
    (void)socketp;
    rlai_remote *r = user;
    int i = 1;
    while (i < r->npfd && r->pfd[i].fd != s)
        i++;
    if (what == CURL_POLL_REMOVE) {
        if (i < r->npfd)
            r->pfd[i] = r->pfd[--r->npfd];
        return 0;
    }
    if (i == r->npfd) {
        if (r->npfd == r->cap_pfd) {
            int cap = r->cap_pfd * 2;
            struct pollfd *p = realloc(r->pfd, (size_t)cap * sizeof(*p));
            if (!p)
                return -1;                     /* libcurl fails the transfer */
            r->pfd = p;
            r->cap_pfd = cap;
        }
        r->npfd++;
        r->pfd[i].fd = s;
    }
    r->pfd[i].events = (short)((what & CURL_POLL_IN ? POLLIN : 0) | (what & CURL_POLL_OUT ? POLLOUT : 0));
    r->pfd[i].revents = 0;
    return 0;
}

/* libcurl's CURLMOPT_TIMERFUNCTION: call it back (CURL_SOCKET_TIMEOUT)
 * after timeout_ms; -1 deletes the timer. */
static int on_timer(CURLM *m, long timeout_ms, void *user)
{
    (void)m;
    rlai_remote *r = user;
    r->timer_gen++;
    r->timer_on = timeout_ms >= 0;
    if (r->timer_on)
        r->timer_at_us = now_us() + (uint64_t)timeout_ms * 1000u;
    return 0;
}

static char *join(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    while (la && a[la - 1] == '/')
        la--;
    char *s = malloc(la + lb + 1);
    if (s) {
        memcpy(s, a, la);
        memcpy(s + la, b, lb + 1);
    }
    return s;
}

static void *thread_main(void *arg);

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;
static void curl_init_once(void)
{
    curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

int rlai_remote_new(const rlai_upstream_config *ups, int n, rlai_remote **out, char *err, size_t errlen)
{
    if (!out || n < 0 || (n > 0 && !ups))
        return RLAI_ERR_INVALID_ARG;
    *out = NULL;
    pthread_once(&curl_once, curl_init_once);
    if (curl_init_rc != CURLE_OK)
        return rlai_errf(err, errlen, RLAI_ERR_IO, "libcurl could not be initialised");
    rlai_remote *r = calloc(1, sizeof(*r));
    if (!r)
        return RLAI_ERR_NOMEM;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->idle_cv, NULL);
    pthread_cond_init(&r->drive_cv, NULL);
    r->wake[0] = r->wake[1] = -1;
    r->ups = calloc((size_t)(n > 0 ? n : 1), sizeof(*r->ups));
    int rc = r->ups ? 0 : RLAI_ERR_NOMEM;
    for (int i = 0; rc == 0 && i < n; i++) {
        upstream *u = &r->ups[i];
        if ((rc = rlai_upstream_config_check(&ups[i], err, errlen)) < 0)
            break;
        for (int k = 0; k < i; k++)
            if (!strcmp(r->ups[k].cfg.name, ups[i].name))
                rc = rlai_errf(err, errlen, RLAI_ERR_INVALID_ARG, "upstreams: the name '%s' is used twice", ups[i].name);
        if (rc < 0)
            break;
        if ((rc = rlai_upstream_config_copy(&u->cfg, &ups[i])) < 0)
            break;
        r->n = i + 1;
        if ((rc = rlai_upstream_read_key(&u->cfg, &u->key, err, errlen)) < 0)
            break;
        if (u->cfg.ca_file && access(u->cfg.ca_file, R_OK) != 0) {
            rc = rlai_errf(err, errlen, RLAI_ERR_IO, "upstreams.%s.ca_file: cannot read %s: %s", u->cfg.name,
                           u->cfg.ca_file, strerror(errno));
            break;
        }
        u->url_chat = join(u->cfg.base_url, "/chat/completions");
        u->url_completions = join(u->cfg.base_url, "/completions");
        if (u->key) {
            size_t l = strlen(u->key) + 32;
            if ((u->auth_header = malloc(l)))
                snprintf(u->auth_header, l, "Authorization: Bearer %s", u->key);
        }
        if (!u->url_chat || !u->url_completions || (u->key && !u->auth_header))
            rc = RLAI_ERR_NOMEM;
        rlai_breaker_init(&u->br, u->cfg.breaker_failures, u->cfg.breaker_cooldown_ms);
    }
    if (rc == 0 && !(r->multi = curl_multi_init()))
        rc = rlai_errf(err, errlen, RLAI_ERR_IO, "libcurl: no multi handle");
    if (rc == 0) {
        r->cap_pfd = 8;
        if (!(r->pfd = calloc((size_t)r->cap_pfd, sizeof(*r->pfd))))
            rc = RLAI_ERR_NOMEM;
    }
    if (rc == 0) {
        if (pipe(r->wake) != 0) {
            r->wake[0] = r->wake[1] = -1;
            rc = rlai_errf(err, errlen, RLAI_ERR_IO, "cannot create the remote thread's wake pipe");
        }
        for (int k = 0; rc == 0 && k < 2; k++)
            if (fcntl(r->wake[k], F_SETFL, fcntl(r->wake[k], F_GETFL) | O_NONBLOCK) != 0 ||
                fcntl(r->wake[k], F_SETFD, FD_CLOEXEC) != 0)
                rc = rlai_errf(err, errlen, RLAI_ERR_IO, "cannot set up the remote thread's wake pipe");
    }
    if (rc == 0) {
        r->pfd[0].fd = r->wake[0];
        r->pfd[0].events = POLLIN;
        r->npfd = 1;
        curl_multi_setopt(r->multi, CURLMOPT_SOCKETFUNCTION, on_socket);
        curl_multi_setopt(r->multi, CURLMOPT_SOCKETDATA, r);
        curl_multi_setopt(r->multi, CURLMOPT_TIMERFUNCTION, on_timer);
        curl_multi_setopt(r->multi, CURLMOPT_TIMERDATA, r);
    }
    if (rc == 0) {
        if (pthread_create(&r->thread, NULL, thread_main, r) != 0)
            rc = rlai_errf(err, errlen, RLAI_ERR_IO, "cannot start the remote-upstream thread");
        else
            r->thread_started = true;
    }
    if (rc < 0) {
        rlai_remote_free(r);
        return rc;
    }
    *out = r;
    return 0;
}

int rlai_remote_n_upstreams(const rlai_remote *r)
{
    return r ? r->n : 0;
}

const rlai_upstream_config *rlai_remote_upstream(const rlai_remote *r, int i)
{
    return r && i >= 0 && i < r->n ? &r->ups[i].cfg : NULL;
}

bool rlai_remote_available(rlai_remote *r, int i)
{
    if (!r || i < 0 || i >= r->n)
        return false;
    pthread_mutex_lock(&r->mu);
    upstream *u = &r->ups[i];
    bool ok = rlai_breaker_would_allow(&u->br, now_ms()) && u->queued < u->cfg.max_queue + u->cfg.max_concurrency;
    pthread_mutex_unlock(&r->mu);
    return ok;
}

void rlai_remote_get_stats(rlai_remote *r, int i, rlai_upstream_stats *out)
{
    memset(out, 0, sizeof(*out));
    if (!r || i < 0 || i >= r->n)
        return;
    pthread_mutex_lock(&r->mu);
    upstream *u = &r->ups[i];
    /* an open breaker whose cooldown has passed shows as half_open (the next attempt is its trial) */
    *out = u->st;
    out->breaker = u->br.state == RLAI_BREAKER_OPEN && rlai_breaker_would_allow(&u->br, now_ms())
                       ? RLAI_BREAKER_HALF_OPEN : u->br.state;
    out->active = u->active;
    out->queued = u->queued - u->active;
    out->breaker_opens = u->br.opens_total;
    pthread_mutex_unlock(&r->mu);
}

int rlai_remote_submit(rlai_remote *r, int up, const char *remote_model, const rlai_route_request *rq, uint64_t id,
                       rlai_remote_error_cb on_error, char *err, size_t errlen)
{
    if (!r || !rq || up < 0 || up >= r->n || !remote_model)
        return rlai_errf(err, errlen, RLAI_ERR_INVALID_ARG, "invalid remote request");
    upstream *u = &r->ups[up];
    rreq *q = calloc(1, sizeof(*q));
    if (!q)
        return RLAI_ERR_NOMEM;
    int rc = rlai_upstream_build_body(rq, remote_model, u->cfg.sampling_extras, &q->body, &q->chat, err, errlen);
    if (rc < 0) {
        free(q);
        return rc;
    }
    q->rm = r;
    q->id = id;
    q->up = up;
    q->on_token = rq->text.rp.on_token;
    q->on_done = rq->text.rp.on_done;
    q->on_error = on_error;
    q->on_logprobs = rq->on_remote_logprobs;
    q->on_tool_calls = rq->on_remote_tool_calls;
    q->user = rq->text.rp.user;
    q->t_submit = now_ms();
    if (rq->text.rp.gen.timeout_ms)
        q->deadline = q->t_submit + rq->text.rp.gen.timeout_ms;
    q->next_try_at = q->t_submit;
    pthread_mutex_lock(&r->mu);
    uint64_t now = q->t_submit;
    if (!rlai_breaker_would_allow(&u->br, now)) {
        uint64_t left = u->br.opened_at + (uint64_t)u->br.cooldown_ms > now
                            ? u->br.opened_at + (uint64_t)u->br.cooldown_ms - now : 0;
        pthread_mutex_unlock(&r->mu);
        free(q->body);
        free(q);
        return rlai_errf(err, errlen, RLAI_ERR_DISCONNECTED,
                    "upstream '%s' is unavailable: circuit breaker open after %d failed attempts (next trial in %llu ms)",
                    u->cfg.name, u->br.fails, (unsigned long long)left);
    }
    if (u->queued >= u->cfg.max_queue + u->cfg.max_concurrency) {
        pthread_mutex_unlock(&r->mu);
        free(q->body);
        free(q);
        return rlai_errf(err, errlen, RLAI_ERR_BUSY, "upstream '%s' is busy: %d requests waiting (max_queue)", u->cfg.name,
                    u->cfg.max_queue);
    }
    u->queued++;
    u->st.requests++;
    q->next = r->list;
    r->list = q;
    r->woken = true;
    pthread_cond_broadcast(&r->drive_cv);    /* the thread, if it waits for a pump, looks again */
    pthread_mutex_unlock(&r->mu);
    wake(r);
    return 0;
}

int rlai_remote_cancel(rlai_remote *r, uint64_t id)
{
    if (!r)
        return RLAI_ERR_NOT_FOUND;
    int rc = RLAI_ERR_NOT_FOUND;
    pthread_mutex_lock(&r->mu);
    for (rreq *q = r->list; q; q = q->next)
        if (q->id == id) {
            q->cancel = true;
            rc = 0;
            r->woken = true;
            pthread_cond_broadcast(&r->drive_cv);
            break;
        }
    pthread_mutex_unlock(&r->mu);
    if (rc == 0)
        wake(r);
    return rc;
}

/* ---------------------------------------------------------- the driver (the remote thread or a pump) */

static int on_sse_event(void *user, const char *event, const char *data, size_t len)
{
    (void)event;
    rreq *q = user;
    rlai_upstream_delta d;
    int rc = rlai_upstream_parse_chunk(data, len, &d, q->fail_msg, sizeof(q->fail_msg));
    if (rc == 1) {
        q->saw_done = true;
        return 0;
    }
    if (rc < 0) {
        q->fail_code = RLAI_ERR_DISCONNECTED;
        if (rc == RLAI_ERR_FORMAT) {
            char m[sizeof(q->fail_msg)];
            snprintf(m, sizeof(m), "%s", q->fail_msg);
            snprintf(q->fail_msg, sizeof(q->fail_msg), "malformed stream: %.200s", m);
        }
        return 1;
    }
    if (d.prompt_tokens >= 0)
        q->prompt_tokens = d.prompt_tokens;
    if (d.completion_tokens >= 0)
        q->completion_tokens = d.completion_tokens;
    if (d.accepted_prediction >= 0)
        q->accepted_prediction = d.accepted_prediction;
    if (d.rejected_prediction >= 0)
        q->rejected_prediction = d.rejected_prediction;
    if (d.finish != RLAI_STOP_NONE)
        q->finish = d.finish;
    if (d.logprobs && q->on_logprobs && !q->cb_stop)
        q->on_logprobs(q->user, d.logprobs);             /* before the chunk's text; it owns them */
    else
        cJSON_Delete(d.logprobs);
    if (d.tool_calls && q->on_tool_calls && !q->cb_stop) {
        if (!q->t_first)                                 /* a reply that is only a call has a first token too */
            q->t_first = now_ms();
        q->pieces++;
        q->on_tool_calls(q->user, d.tool_calls);
    } else {
        cJSON_Delete(d.tool_calls);
    }
    int stop = 0;
    if (d.text) {
        if (!q->t_first) {
            q->t_first = now_ms();
            rlai_remote *r = q->rm;
            pthread_mutex_lock(&r->mu);
            rlai_breaker_success(&r->ups[q->up].br);
            pthread_mutex_unlock(&r->mu);
        }
        q->pieces++;
        if (q->on_token && q->on_token(q->user, RLAI_REMOTE_TOKEN, d.text, d.len) != 0) {
            q->cb_stop = true;
            stop = 1;
        }
        free(d.text);
    }
    return stop;
}

static size_t on_write(char *ptr, size_t size, size_t nmemb, void *user)
{
    rreq *q = user;
    size_t n = size * nmemb;
    q->t_last_byte = now_ms();
    if (!q->http)
        curl_easy_getinfo(q->easy, CURLINFO_RESPONSE_CODE, &q->http);
    if (q->http != 200) {
        size_t k = ERRBODY_MAX - q->errlen < n ? ERRBODY_MAX - q->errlen : n;
        memcpy(q->errbody + q->errlen, ptr, k);
        q->errlen += k;
        q->errbody[q->errlen] = 0;
        return n;
    }
    int rc = rlai_sse_feed(q->sse, ptr, n);
    if (rc < 0 && !q->fail_code) {
        q->fail_code = RLAI_ERR_DISCONNECTED;
        snprintf(q->fail_msg, sizeof(q->fail_msg), "malformed stream: %s", rlai_strerror(rc));
    }
    return rc == 0 ? n : 0;          /* 0 aborts the transfer */
}

static void attempt_clear(rlai_remote *r, rreq *q)
{
    if (q->easy) {
        curl_multi_remove_handle(r->multi, q->easy);
        curl_easy_cleanup(q->easy);
        q->easy = NULL;
    }
    curl_slist_free_all(q->hdrs);
    q->hdrs = NULL;
}

/* Starts an attempt (r->mu held). Returns 0 or an error (then the request ends). */
static int attempt_start(rlai_remote *r, rreq *q, uint64_t now)
{
    upstream *u = &r->ups[q->up];
    q->attempts++;
    q->t_attempt = now;
    q->t_last_byte = now;
    q->http = 0;
    q->errlen = 0;
    q->errbody[0] = 0;
    q->fail_code = 0;
    q->fail_msg[0] = 0;
    q->saw_done = false;
    q->finish = RLAI_STOP_NONE;
    q->prompt_tokens = q->completion_tokens = -1;
    q->accepted_prediction = q->rejected_prediction = -1;
    if (!q->sse && rlai_sse_new(0, on_sse_event, q, &q->sse) < 0)
        return RLAI_ERR_NOMEM;
    rlai_sse_reset(q->sse);
    q->easy = curl_easy_init();
    if (!q->easy)
        return RLAI_ERR_NOMEM;
    q->curl_err[0] = 0;
    q->hdrs = curl_slist_append(q->hdrs, "Content-Type: application/json");
    q->hdrs = curl_slist_append(q->hdrs, "Accept: text/event-stream");
    if (u->auth_header)
        q->hdrs = curl_slist_append(q->hdrs, u->auth_header);
    CURL *e = q->easy;
    curl_easy_setopt(e, CURLOPT_URL, q->chat ? u->url_chat : u->url_completions);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, q->hdrs);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, q->body);
    curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE, (long)strlen(q->body));
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, q);
    curl_easy_setopt(e, CURLOPT_PRIVATE, q);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, q->curl_err);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, (long)u->cfg.connect_timeout_ms);
    curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(e, CURLOPT_PROXY, u->cfg.proxy ? u->cfg.proxy : "");   /* "" = no proxy, env ignored */
    if (u->cfg.ca_file)
        curl_easy_setopt(e, CURLOPT_CAINFO, u->cfg.ca_file);
    curl_easy_setopt(e, CURLOPT_USERAGENT, "rtx-localai/" RLAI_VERSION);
    if (curl_multi_add_handle(r->multi, e) != CURLM_OK)
        return RLAI_ERR_IO;
    q->state = RS_ACTIVE;
    u->active++;
    return 0;
}

/* A finished request waiting for its on_done (outside the lock). */
typedef struct ending {
    rreq *q;
    int status;
    rlai_stop_reason stop;
    char msg[320];
} ending;

/* Unlinks q (r->mu held), updates the counters and fills *e. */
static void finish(rlai_remote *r, rreq *q, int status, rlai_stop_reason stop, const char *msg, ending *e)
{
    upstream *u = &r->ups[q->up];
    if (q->state == RS_ACTIVE)
        u->active--;
    u->queued--;
    attempt_clear(r, q);
    for (rreq **pp = &r->list; *pp; pp = &(*pp)->next)
        if (*pp == q) {
            *pp = q->next;
            break;
        }
    if (status < 0)
        u->st.failed++;
    else if (stop == RLAI_STOP_CANCELLED)
        u->st.cancelled++;
    else if (stop == RLAI_STOP_TIMEOUT)
        u->st.timeouts++;
    else
        u->st.ok++;
    u->st.gen_pieces += (uint64_t)q->pieces;
    r->n_delivering++;
    e->q = q;
    e->status = status;
    e->stop = stop;
    snprintf(e->msg, sizeof(e->msg), "%s", msg ? msg : "");
}

static void deliver(ending *e)
{
    rreq *q = e->q;
    rlai_remote *rm = q->rm;
    if (e->status < 0) {
        fprintf(stderr, "rlai: remote request %llx failed: %s\n", (unsigned long long)q->id, e->msg);
        if (q->on_error)
            q->on_error(q->user, q->id, e->status, e->msg);
    }
    if (q->on_done) {
        rlai_gen_metrics m;
        memset(&m, 0, sizeof(m));
        double t_end = (double)now_ms();
        m.prompt_tokens = q->prompt_tokens > 0 ? q->prompt_tokens : 0;
        m.gen_tokens = q->completion_tokens >= 0 ? q->completion_tokens : q->pieces;
        m.queue_ms = q->t_attempt ? (double)(q->t_attempt - q->t_submit) : 0;
        /* the upstream's predicted-output counts (OpenAI's), as draft counts */
        m.accepted_tokens = q->accepted_prediction > 0 ? q->accepted_prediction : 0;
        m.drafted_tokens = m.accepted_tokens + (q->rejected_prediction > 0 ? q->rejected_prediction : 0);
        if (q->t_first) {
            m.ttft_ms = (double)(q->t_first - q->t_submit);
            m.decode_ms = t_end - (double)q->t_first;
            if (m.gen_tokens > 1 && m.decode_ms > 0)
                m.decode_tps = (m.gen_tokens - 1) / (m.decode_ms / 1e3);
        }
        m.stop = e->stop;
        q->on_done(q->user, q->id, e->status, &m);
    }
    rlai_sse_free(q->sse);
    free(q->body);
    free(q);
    pthread_mutex_lock(&rm->mu);
    rm->n_delivering--;
    pthread_cond_broadcast(&rm->idle_cv);
    pthread_mutex_unlock(&rm->mu);
}

int rlai_remote_wait_idle(rlai_remote *r, int timeout_ms)
{
    if (!r)
        return 0;
    struct timespec until;
    rlai_deadline_in(&until, CLOCK_REALTIME, timeout_ms);
    pthread_mutex_lock(&r->mu);
    int rc = 0;
    while ((r->list || r->n_delivering) && rc == 0)
        rc = pthread_cond_timedwait(&r->idle_cv, &r->mu, &until);
    int left = 0;
    for (rreq *q = r->list; q; q = q->next)
        left++;
    left += r->n_delivering;
    pthread_mutex_unlock(&r->mu);
    return left;
}

/* Error of a failed attempt from its HTTP status. Retryable: 429, 5xx. */
static int http_error(long st, bool *retry)
{
    *retry = st == 429 || st >= 500;
    if (st == 429)
        return RLAI_ERR_BUSY;
    if (st == 400 || st == 422)
        return RLAI_ERR_INVALID_ARG;
    if (st == 404)
        return RLAI_ERR_NOT_FOUND;
    if (st == 413)
        return RLAI_ERR_TOO_LARGE;
    return RLAI_ERR_DISCONNECTED;
}

/* Short text of an upstream's error body: its error.message when JSON. */
static void error_text(const rreq *q, char *out, size_t cap)
{
    out[0] = 0;
    if (!q->errlen)
        return;
    cJSON *j = cJSON_ParseWithLength(q->errbody, q->errlen);
    const cJSON *e = cJSON_IsObject(j) ? cJSON_GetObjectItemCaseSensitive(j, "error") : NULL;
    const cJSON *m = cJSON_IsObject(e) ? cJSON_GetObjectItemCaseSensitive(e, "message") : e;
    if (cJSON_IsString(m)) {
        snprintf(out, cap, "%.200s", m->valuestring);
        cJSON_Delete(j);
        return;
    }
    cJSON_Delete(j);
    size_t n = 0;
    for (size_t i = 0; i < q->errlen && n + 1 < cap && n < 200; i++) {
        char c = q->errbody[i];
        out[n++] = (c == '\n' || c == '\r' || (unsigned char)c < 0x20) ? ' ' : c;
    }
    out[n] = 0;
}

/* An attempt failed (r->mu held): retry before the first token when the
 * error allows it, else end. Returns true when q ended (e filled). */
static bool attempt_failed(rlai_remote *r, rreq *q, int code, bool retryable, bool counts, const char *msg,
                           uint64_t now, ending *e)
{
    upstream *u = &r->ups[q->up];
    if (counts) {
        u->st.attempts_failed++;
        rlai_breaker_failure(&u->br, now);
    } else if (u->br.state == RLAI_BREAKER_HALF_OPEN) {
        u->br.trial_out = false;               /* a client error says nothing about health */
    }
    if (q->state == RS_ACTIVE) {
        u->active--;
        q->state = RS_WAIT;
    }
    attempt_clear(r, q);
    char m[320];
    snprintf(m, sizeof(m), "upstream '%s'%s: %s", u->cfg.name,
             q->t_first ? " failed mid-stream" : "", msg);
    if (retryable && !q->t_first && q->attempts <= u->cfg.max_retries) {
        uint64_t backoff = (uint64_t)u->cfg.retry_backoff_ms << (q->attempts - 1);
        q->next_try_at = now + backoff;
        if (!q->deadline || q->next_try_at < q->deadline) {
            u->st.retries++;
            return false;
        }
    }
    if (q->attempts > 1 && !q->t_first) {
        size_t l = strlen(m);
        snprintf(m + l, sizeof(m) - l, " (after %d attempts)", q->attempts);
    }
    finish(r, q, code, RLAI_STOP_NONE, m, e);
    return true;
}

/* Looks at one finished transfer (r->mu held). */
static bool transfer_done(rlai_remote *r, rreq *q, CURLcode res, uint64_t now, ending *e)
{
    char m[300];
    if (q->cancel || q->cb_stop) {
        finish(r, q, 0, RLAI_STOP_CANCELLED, NULL, e);
        return true;
    }
    if (q->fail_code)                          /* malformed stream or an error event */
        return attempt_failed(r, q, q->fail_code, true, true, q->fail_msg, now, e);
    if (res != CURLE_OK) {
        /* libcurl's detail (e.g. "SSL certificate problem: self-signed
         * certificate") when it gave one, else the code's text */
        snprintf(m, sizeof(m), "%s", q->curl_err[0] ? q->curl_err : curl_easy_strerror(res));
        /* a certificate the CA file does not vouch for will not change on a retry */
        bool cert = res == CURLE_PEER_FAILED_VERIFICATION || res == CURLE_SSL_CACERT_BADFILE ||
                    res == CURLE_SSL_CERTPROBLEM;
        return attempt_failed(r, q, RLAI_ERR_DISCONNECTED, !cert, true, m, now, e);
    }
    if (q->http != 200) {
        bool retry;
        int code = http_error(q->http, &retry);
        char body[256];
        error_text(q, body, sizeof(body));
        snprintf(m, sizeof(m), "answered HTTP %ld%s%s", q->http, body[0] ? ": " : "", body);
        return attempt_failed(r, q, code, retry, retry, m, now, e);
    }
    if (!q->saw_done && q->finish == RLAI_STOP_NONE)
        return attempt_failed(r, q, RLAI_ERR_DISCONNECTED, true, true,
                              "the stream ended before [DONE] or a finish_reason", now, e);
    rlai_breaker_success(&r->ups[q->up].br);
    finish(r, q, 0, q->finish != RLAI_STOP_NONE ? q->finish : RLAI_STOP_EOG, NULL, e);
    return true;
}

#define MAX_ENDINGS 64
#define PUMP_ENDINGS 8
/* How often the remote thread looks whether a pumping connection thread
 * has let go of the transfers (it lets go without waking anyone, so that a
 * stream's next pump, microseconds later, finds them free). While only one
 * request runs and its own thread pumps, nobody else needs the transfers
 * driven: the period doubles up to HANDBACK_MAX_MS (so the thread does
 * not wake for every token); a new request or a cancel wakes it and the
 * period starts again at HANDBACK_MS. */
#define HANDBACK_MS 2
#define HANDBACK_MAX_MS 32

/* Runs libcurl's timer when it is due (the driver). */
static void run_timer(rlai_remote *r)
{
    if (!r->timer_on || now_us() < r->timer_at_us)
        return;
    uint64_t gen = r->timer_gen;
    int running = 0;
    curl_multi_socket_action(r->multi, CURL_SOCKET_TIMEOUT, 0, &running);
    /* libcurl reports its timer only when it changes: an unchanged one was
     * not due by libcurl's clock yet (it rounds to ms), so look again in 1 ms */
    if (r->timer_gen == gen && r->timer_on)
        r->timer_at_us = now_us() + 1000u;
}

/* Ends the finished transfers (the driver): each is delivered at once, so
 * one ending slot is enough. */
static void reap(rlai_remote *r, ending *e)
{
    CURLMsg *msg;
    int left;
    while ((msg = curl_multi_info_read(r->multi, &left))) {
        if (msg->msg != CURLMSG_DONE)
            continue;
        rreq *q = NULL;
        curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&q);
        CURLcode res = msg->data.result;
        if (!q)
            continue;
        if (!q->http)
            curl_easy_getinfo(q->easy, CURLINFO_RESPONSE_CODE, &q->http);
        pthread_mutex_lock(&r->mu);
        bool ended = transfer_done(r, q, res, now_ms(), e);
        pthread_mutex_unlock(&r->mu);
        if (ended)
            deliver(e);
    }
}

/* One pass of the driver (the thread holding the transfers, r->driver):
 * starts, times out and ends requests, runs libcurl's due timer and ends
 * finished transfers. ends holds max_ends. Returns false when stopping and
 * nothing is left; *any says whether requests are running (then the
 * driver polls briefly, for their timers). */
static bool drive_once(rlai_remote *r, ending *ends, int max_ends, bool *any_out)
{
    bool stopping = atomic_load(&r->stop);
    int n_end = 0;
    bool any = false;
    pthread_mutex_lock(&r->mu);
    uint64_t now = now_ms();
    for (rreq *q = r->list, *nx; q && n_end < max_ends; q = nx) {
        nx = q->next;
        upstream *u = &r->ups[q->up];
        any = true;
        if (q->cancel || stopping) {
            finish(r, q, 0, RLAI_STOP_CANCELLED, NULL, &ends[n_end++]);
            continue;
        }
        if (q->deadline && now >= q->deadline) {
            finish(r, q, 0, RLAI_STOP_TIMEOUT, NULL, &ends[n_end++]);
            continue;
        }
        if (q->state == RS_ACTIVE) {
            if (!q->t_first && now - q->t_attempt >= (uint64_t)u->cfg.first_token_timeout_ms) {
                char m[96];
                snprintf(m, sizeof(m), "no first token within %d ms (first_token_timeout_ms)",
                         u->cfg.first_token_timeout_ms);
                if (attempt_failed(r, q, RLAI_ERR_TIMEOUT, true, true, m, now, &ends[n_end]))
                    n_end++;
            } else if (q->t_first && now - q->t_last_byte >= (uint64_t)u->cfg.stall_timeout_ms) {
                char m[96];
                snprintf(m, sizeof(m), "no data for %d ms (stall_timeout_ms)", u->cfg.stall_timeout_ms);
                if (attempt_failed(r, q, RLAI_ERR_TIMEOUT, false, true, m, now, &ends[n_end]))
                    n_end++;
            }
            continue;
        }
        /* waiting: for its backoff, a stream slot or the breaker */
        if (now < q->next_try_at || u->active >= u->cfg.max_concurrency)
            continue;
        if (!rlai_breaker_allow(&u->br, now)) {
            if (u->br.state == RLAI_BREAKER_OPEN) {
                char m[200];
                snprintf(m, sizeof(m), "upstream '%s' is unavailable: circuit breaker open", u->cfg.name);
                finish(r, q, RLAI_ERR_DISCONNECTED, RLAI_STOP_NONE, m, &ends[n_end++]);
            }
            continue;
        }
        int rc = attempt_start(r, q, now);
        if (rc < 0) {
            if (u->br.state == RLAI_BREAKER_HALF_OPEN)
                u->br.trial_out = false;
            finish(r, q, rc, RLAI_STOP_NONE, "could not start the transfer", &ends[n_end++]);
        }
    }
    pthread_mutex_unlock(&r->mu);
    for (int i = 0; i < n_end; i++)
        deliver(&ends[i]);
    *any_out = any;
    if (stopping && !any)
        return false;
    run_timer(r);
    reap(r, ends);
    return true;
}

/* Waits up to wait_ms (less when libcurl's timer is due sooner) for the
 * sockets libcurl watches or the wake pipe, then lets libcurl act on the
 * ready sockets (callbacks run here: libcurl is told which sockets are
 * ready, so it reads without polling them first) and ends finished
 * transfers (the driver). */
static void drive_wait(rlai_remote *r, int wait_ms, ending *ends)
{
    if (r->timer_on) {
        uint64_t now = now_us();
        uint64_t rem = r->timer_at_us > now ? (r->timer_at_us - now + 999u) / 1000u : 0;
        if (rem < (uint64_t)wait_ms)
            wait_ms = (int)rem;
    }
    int n = poll(r->pfd, (nfds_t)r->npfd, wait_ms);
    if (n > 0 && r->pfd[0].revents) {
        char buf[64];
        while (read(r->wake[0], buf, sizeof(buf)) > 0) {
        }
    }
    /* what is ready first: libcurl's socket callback edits pfd meanwhile */
    enum { READY_MAX = 64 };
    curl_socket_t fd[READY_MAX];
    int ev[READY_MAX], k = 0;
    for (int i = 1; n > 0 && i < r->npfd && k < READY_MAX; i++) {
        short re = r->pfd[i].revents;
        if (re & POLLNVAL) {                   /* closed without CURL_POLL_REMOVE: stop watching */
            r->pfd[i--] = r->pfd[--r->npfd];
            continue;
        }
        if (!re)
            continue;
        fd[k] = r->pfd[i].fd;
        ev[k++] = (re & (POLLIN | POLLHUP | POLLERR) ? CURL_CSELECT_IN : 0) | (re & POLLOUT ? CURL_CSELECT_OUT : 0) |
                  (re & POLLERR ? CURL_CSELECT_ERR : 0);
    }
    int running = 0;
    for (int i = 0; i < k; i++)
        curl_multi_socket_action(r->multi, fd[i], ev[i], &running);
    run_timer(r);
    reap(r, ends);
}

static void *thread_main(void *arg)
{
    rlai_remote *r = arg;
    ending *ends = calloc(MAX_ENDINGS, sizeof(*ends));
    if (!ends)
        return NULL;                           /* requests then end at free */
    for (;;) {
        pthread_mutex_lock(&r->mu);
        /* A connection thread pumping (rlai_remote_pump) holds the
         * transfers; when it lets go it wakes nobody, so look again
         * (HANDBACK_MS above). When stopping, only wait for the holder to
         * let go. */
        int period = HANDBACK_MS;
        while (r->driver == DRIVER_PUMP || (r->pump_in && !atomic_load(&r->stop))) {
            struct timespec until;
            rlai_deadline_in(&until, CLOCK_REALTIME, period);
            pthread_cond_timedwait(&r->drive_cv, &r->mu, &until);
            bool alone = r->list && !r->list->next && !r->woken;
            period = alone ? (period * 2 < HANDBACK_MAX_MS ? period * 2 : HANDBACK_MAX_MS) : HANDBACK_MS;
            r->woken = false;
        }
        r->driver = DRIVER_THREAD;
        pthread_mutex_unlock(&r->mu);
        bool any = false;
        bool go = drive_once(r, ends, MAX_ENDINGS, &any);
        /* n_end of the pass is 0 here: everything ended was delivered */
        if (go && !atomic_load(&r->stop))
            drive_wait(r, any ? 10 : 1000, ends);
        pthread_mutex_lock(&r->mu);
        r->driver = DRIVER_NONE;
        if (r->pump_in)
            pthread_cond_broadcast(&r->drive_cv);
        pthread_mutex_unlock(&r->mu);
        if (!go)
            break;
    }
    free(ends);
    return NULL;
}

int rlai_remote_pump(rlai_remote *r, int timeout_ms, bool (*ready)(void *arg), void *arg)
{
    if (!r || !ready)
        return 0;
    uint64_t end = now_ms() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0);
    pthread_mutex_lock(&r->mu);
    if (atomic_load(&r->stop) || r->pump_in || !r->thread_started) {
        pthread_mutex_unlock(&r->mu);
        return 0;
    }
    r->pump_in = true;
    if (r->driver == DRIVER_THREAD) {
        /* the thread may sit in its poll: wake it; it lets go after its
         * pass and broadcasts since pump_in is set */
        wake(r);
        while (r->driver == DRIVER_THREAD)
            pthread_cond_wait(&r->drive_cv, &r->mu);
    }
    r->driver = DRIVER_PUMP;
    pthread_mutex_unlock(&r->mu);

    ending ends[PUMP_ENDINGS];
    for (;;) {
        bool any = false;
        if (!drive_once(r, ends, PUMP_ENDINGS, &any) || ready(arg) || atomic_load(&r->stop))
            break;
        uint64_t now = now_ms();
        if (now >= end)
            break;
        uint64_t wait = end - now;
        if (wait > (uint64_t)(any ? 10 : 1000))
            wait = any ? 10 : 1000;
        drive_wait(r, (int)wait, ends);
    }

    pthread_mutex_lock(&r->mu);
    r->driver = DRIVER_NONE;
    r->pump_in = false;
    if (atomic_load(&r->stop))
        pthread_cond_broadcast(&r->drive_cv);   /* rlai_remote_free waits for pumps */
    pthread_mutex_unlock(&r->mu);
    return 1;
}

void rlai_remote_free(rlai_remote *r)
{
    if (!r)
        return;
    if (r->thread_started) {
        atomic_store(&r->stop, true);
        wake(r);
        pthread_join(r->thread, NULL);
        /* a pump still inside (a front not stopped first) leaves at once */
        pthread_mutex_lock(&r->mu);
        while (r->pump_in)
            pthread_cond_wait(&r->drive_cv, &r->mu);
        pthread_mutex_unlock(&r->mu);
    }
    /* only when the thread could not run: end what is left */
    while (r->list) {
        ending e;
        pthread_mutex_lock(&r->mu);
        finish(r, r->list, 0, RLAI_STOP_CANCELLED, NULL, &e);
        pthread_mutex_unlock(&r->mu);
        deliver(&e);
    }
    if (r->multi)
        curl_multi_cleanup(r->multi);
    free(r->pfd);
    for (int k = 0; k < 2; k++)
        if (r->wake[k] >= 0)
            close(r->wake[k]);
    for (int i = 0; i < r->n; i++) {
        upstream *u = &r->ups[i];
        rlai_upstream_config_clear(&u->cfg);
        if (u->key) {
            memset(u->key, 0, strlen(u->key));
            free(u->key);
        }
        if (u->auth_header) {
            memset(u->auth_header, 0, strlen(u->auth_header));
            free(u->auth_header);
        }
        free(u->url_chat);
        free(u->url_completions);
    }
    free(r->ups);
    pthread_cond_destroy(&r->idle_cv);
    pthread_cond_destroy(&r->drive_cv);
    pthread_mutex_destroy(&r->mu);
    free(r);
}
