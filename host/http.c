/* http.c - OpenAI-compatible HTTP front (see http.h). */
#include "http.h"
#include "rlai/clock.h"
#include "rlai/deadline.h"
#include "sampling_limits.h"
#include "config.h"
#include "api_key.h"
#include "conn_guard.h"
#include "embeddings.h"
#include "json_escape.h"
#include "json_int.h"
#include "logprobs.h"
#include "tools.h"
#include "rlai/error.h"
#include "rlai/protocol.h"
#include "rlai/strbuf.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define WAIT_SLICE_MS 50          /* condition-variable wait between hang-up checks */
#define STOP_WAIT_MS 10000        /* rlai_http_stop: longest wait for engine callbacks */
#define MAX_STOPS 16
#define MAX_STOP_LEN 256

/* ---------------------------------------------------------- small helpers */

static void deadline_in(struct timespec *ts, int ms)
{
    rlai_deadline_in(ts, CLOCK_MONOTONIC, ms);   /* the condition variables use the monotonic clock */
}

static void cond_init_monotonic(pthread_cond_t *cv)
{
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &ca);
    pthread_condattr_destroy(&ca);
}

/* Length of the well-formed UTF-8 sequence at s (n bytes available), or
 * 0: no overlong forms, no surrogates, nothing above U+10FFFF (the rules
 * the wire protocol applies). */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    if (c < 0x80)
        return 1;
    size_t len;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0)
            lo = 0xA0;                 /* overlong */
        else if (c == 0xED)
            hi = 0x9F;                 /* surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F;                 /* above U+10FFFF */
    } else {
        return 0;
    }
    if (n < len || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < len; i++)
        if (s[i] < 0x80 || s[i] > 0xBF)
            return 0;
    return len;
}

/* Offset of the first byte that is not valid UTF-8, or n. */
static size_t utf8_bad_at(const char *p, size_t n)
{
    const unsigned char *s = (const unsigned char *)p;
    size_t i = 0;
    while (i < n) {
        size_t k = utf8_seq(s + i, n - i);
        if (!k)
            return i;
        i += k;
    }
    return n;
}

/* A copy of s (malloc'd) with every byte that is not part of valid UTF-8
 * replaced by '?': error messages quote request data (names, routes) and
 * must never carry raw invalid bytes back. */
static char *utf8_clean(const char *s)
{
    size_t n = strlen(s);
    char *o = malloc(n + 1);
    if (!o)
        return NULL;
    size_t i = 0;
    while (i < n) {
        size_t k = utf8_seq((const unsigned char *)s + i, n - i);
        if (!k) {
            o[i++] = '?';
            continue;
        }
        memcpy(o + i, s + i, k);
        i += k;
    }
    o[n] = 0;
    return o;
}

/* Appends "data: <json>\n\n" (or "event: NAME\ndata: ...") and frees j. */
static void sse_event(rlai_strbuf *b, const char *event, cJSON *j)
{
    char *s = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    if (event) {
        rlai_strbuf_str(b, "event: ");
        rlai_strbuf_str(b, event);
        rlai_strbuf_str(b, "\n");
    }
    rlai_strbuf_str(b, "data: ");
    rlai_strbuf_str(b, s ? s : "{}");
    rlai_strbuf_str(b, "\n\n");
    free(s);
}

/* ---------------------------------------------------------- objects */

typedef enum req_kind {
    K_NONE = 0,
    K_CHAT,         /* chat.completion via the engine */
    K_COMPLETION,   /* text_completion via the engine */
    K_PLUGIN_CHAT,  /* chat.completion answered by a plugin's chat model (register_chat_model) */
    K_PLUGIN,       /* POST /v1/plugins/{command} */
} req_kind;

typedef enum end_why { END_NONE = 0, END_GONE, END_SHUTDOWN } end_why;

typedef struct hreq hreq;

struct rlai_http {
    struct MHD_Daemon *mhd;
    rlai_router *router;          /* borrowed (rlai_http_params) */
    rlai_conn_guard *guard;       /* slow-client guard (conn_guard.h) */
    int listen_fd;
    int port;
    rlai_engine *engine;
    rlai_plugin_host *plugins;
    rlai_metrics *metrics;
    size_t max_body;
    int max_prompt_tokens;
    int request_timeout_s;        /* limits.request_timeout_s; 0 = none */
    int max_inflight;
    int stop_wait_ms;
    bool allow_remote;
    bool bound_loopback;         /* the listening address is loopback: check Host */
    bool quiet;
    char *api_key;               /* NULL = no authentication */
    char **cors;                 /* allowed browser origins (exact, no trailing '/') */
    int n_cors;
    char *model_id;
    double t_start;
    long long created;           /* wall clock at start, for "created" fields */
    int n_ctx;

    pthread_mutex_t mu;
    pthread_cond_t cv;           /* signalled when n_live drops */
    hreq *live;                  /* requests with an engine job or plugin call in flight */
    int n_live;
    int n_streams;               /* SSE responses not yet finished */
    bool stopping;
    atomic_ullong seq;           /* ids and default seeds */
};

struct hreq {
    rlai_http *h;
    struct MHD_Connection *conn;
    int fd;
    int refs;                    /* under mu: MHD request, response, engine job / plugin call */

    /* request body */
    rlai_strbuf body;
    bool too_large;
    bool answered;
    bool auth_failed;            /* answered 401 for the API key */
    const char *allow;           /* Allow header of a 405 */
    const char *cors_origin;     /* the request's Origin when allowed (points into h->cors) */

    /* what it is */
    req_kind kind;
    bool stream, include_usage;
    char id[48];
    char *model;                 /* echoed "model" value */
    char *route;                 /* "route" (docs/REMOTE.md), or NULL */
    char *rf_json;               /* response_format as JSON text when it made a grammar (for upstreams) */
    char *prediction;            /* "prediction" content joined from its text parts (owned) */
    char *command;               /* K_PLUGIN */

    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* filled by the engine thread / plugin worker (under mu) */
    rlai_strbuf pending;         /* text not yet turned into output */
    rlai_strbuf sse;             /* K_PLUGIN streaming: ready events */
    cJSON *results;              /* K_PLUGIN non-streaming: result values */
    bool done;                   /* terminal callback seen */
    int status;                  /* 0 or a negative rlai_error */
    char errmsg[300];
    rlai_gen_metrics gm;
    bool have_gm;
    char stop[32];               /* plugin calls: the stop string of done */
    char *chat_reply;            /* K_PLUGIN_CHAT: "text" or "reply" of the command's result */
    bool streamed;               /* some text went out as chunks */
    bool probed;                 /* the client half-closed and was probed once */
    bool probe;                  /* a probe write is due (connection thread) */
    bool http11;                 /* the request is HTTP/1.1 (1xx allowed) */
    end_why why;                 /* set by the connection thread / stop */
    uint64_t engine_id, call_id;
    bool live;                   /* in h->live */
    hreq *next_live;
    rlai_tools tools;            /* K_CHAT with tools (host/tools.h) */
    rlai_strbuf held;            /* streamed tool mode: text kept back until done */
    bool tool_decided;           /* tool_choice auto: the reply's first byte was seen */
    bool tool_called;            /* the reply was a call: finish_reason "tool_calls" */

    /* logprobs (lp_mode 1 = chat, 2 = completions; lps appended under mu
     * by the engine thread, lp_sent and lp_off on the connection thread) */
    int lp_mode;
    rlai_token_logprobs *lps;
    int n_lps, cap_lps, lp_sent;
    cJSON *rlps;                 /* a remote model's entries not yet sent (under mu; host/upstream.h) */
    /* a remote model's tool calls (tools forwarded; under mu): fragments not
     * yet streamed, and all of them merged (rlai_tool_calls_merge) */
    cJSON *rtc, *rtc_all;
    bool image_parts;            /* the messages have image parts (a remote model's request) */
    size_t lp_off;
    bool echo_sent;              /* streamed completions: the echo chunk went out */
    bool score_only;             /* completions echo with max_tokens 0: the prompt only (the
                                    engine samples one token, which is dropped here) */
    char *echo_text;             /* completions "echo": the prompt text */
    long long created;           /* request time (wall clock, seconds) */
    hreq **kids;                 /* several choices ("n", a list prompt): one per choice */
    int n_kids;
    int kids_per;                /* choices per prompt (kids k*per..k*per+per-1 share prompt k) */
    /* request log line (connection thread) */
    double t_begin;              /* monotonic seconds at the first callback */
    int http_status;             /* status of the answer queued, 0 = none */
    char method[8];
    char path[96];

    /* connection thread only */
    rlai_strbuf tpl;             /* text chunk template: tpl.p[0..tpl_head) text tpl.p[tpl_head..) */
    size_t tpl_head;
    rlai_strbuf out;
    size_t opos;
    int phase;                   /* 0 = first chunk not sent, 1 = streaming, 2 = ended */
    bool counted_stream;
};

static void hreq_unref(hreq *r)
{
    pthread_mutex_lock(&r->mu);
    int left = --r->refs;
    pthread_mutex_unlock(&r->mu);
    if (left > 0)
        return;
    rlai_strbuf_free(&r->body);
    rlai_strbuf_free(&r->pending);
    rlai_strbuf_free(&r->sse);
    rlai_strbuf_free(&r->out);
    rlai_strbuf_free(&r->tpl);
    cJSON_Delete(r->results);
    free(r->model);
    free(r->route);
    free(r->rf_json);
    free(r->prediction);
    free(r->command);
    free(r->chat_reply);
    free(r->lps);
    cJSON_Delete(r->rlps);
    cJSON_Delete(r->rtc);
    cJSON_Delete(r->rtc_all);
    free(r->echo_text);
    for (int i = 0; i < r->n_kids; i++)
        hreq_unref(r->kids[i]);
    free(r->kids);
    rlai_tools_free(&r->tools);
    rlai_strbuf_free(&r->held);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

static void hreq_ref(hreq *r)
{
    pthread_mutex_lock(&r->mu);
    r->refs++;
    pthread_mutex_unlock(&r->mu);
}

/* Registers r as having work in flight. Returns 0, RLAI_ERR_CANCELLED
 * (stopping) or RLAI_ERR_BUSY (max_inflight reached). */
static int track(rlai_http *h, hreq *r)
{
    int rc = 0;
    pthread_mutex_lock(&h->mu);
    if (h->stopping) {
        rc = RLAI_ERR_CANCELLED;
    } else if (h->n_live >= h->max_inflight) {
        rc = RLAI_ERR_BUSY;
    } else {
        r->live = true;
        r->next_live = h->live;
        h->live = r;
        h->n_live++;
    }
    pthread_mutex_unlock(&h->mu);
    return rc;
}

static void untrack(rlai_http *h, hreq *r)
{
    pthread_mutex_lock(&h->mu);
    if (r->live) {
        for (hreq **pp = &h->live; *pp; pp = &(*pp)->next_live) {
            if (*pp == r) {
                *pp = r->next_live;
                break;
            }
        }
        r->live = false;
        h->n_live--;
        pthread_cond_broadcast(&h->cv);
    }
    pthread_mutex_unlock(&h->mu);
}

/* Marks the request ended by the client (or the server) and cancels its
 * engine job / plugin call. Safe to call more than once. */
static void end_request(hreq *r, end_why why)
{
    pthread_mutex_lock(&r->mu);
    if (r->why == END_NONE)
        r->why = why;
    bool running = !r->done;
    uint64_t eid = r->engine_id, cid = r->call_id;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    for (int i = 0; i < r->n_kids; i++)
        end_request(r->kids[i], why);
    if (!running)
        return;
    if (eid)
        rlai_router_cancel(r->h->router, eid);
    if (cid && r->h->plugins)
        rlai_plugin_host_cancel(r->h->plugins, cid);
}

/* What poll says about the client's socket. A peer that only shut down
 * its sending side (shutdown(SHUT_WR) after the request, as some clients
 * and proxies do) looks exactly like one that closed the socket: both send
 * a FIN (POLLRDHUP). Only a write tells them apart: a closed socket answers
 * it with a reset (then POLLERR / POLLHUP). So a FIN alone is PEER_HALF and
 * the caller probes once; PEER_GONE means really gone. */
typedef enum peer_state { PEER_OK = 0, PEER_HALF, PEER_GONE } peer_state;

static peer_state peer_check(int fd)
{
    if (fd < 0)
        return PEER_OK;
    struct pollfd p = { .fd = fd, .events = POLLRDHUP };
    if (poll(&p, 1, 0) <= 0)
        return PEER_OK;
    if (p.revents & (POLLHUP | POLLERR | POLLNVAL))
        return PEER_GONE;
    return (p.revents & POLLRDHUP) ? PEER_HALF : PEER_OK;
}

/* Something for the stream to send (r->mu held). */
static bool has_progress(const hreq *r)
{
    return r->pending.len || r->sse.len || r->rtc || r->done || r->why != END_NONE;
}

/* rlai_router_pump's test (takes r->mu itself: the pump holds no lock). */
static bool pump_ready(void *arg)
{
    hreq *r = arg;
    pthread_mutex_lock(&r->mu);
    bool ready = has_progress(r);
    pthread_mutex_unlock(&r->mu);
    return ready;
}

/* Waits (r->mu held) until there is output, the request is done or the
 * server is stopping. Returns false when the client went away. Sets
 * r->probe when the client half-closed and a probe write is due (the
 * caller sends an SSE comment; a closed peer answers it with a reset). */
static bool wait_progress(hreq *r)
{
    while (!has_progress(r)) {
        /* A remote stream: read the upstream on this thread, which writes
         * to the client next (one wake-up per token, docs/REMOTE.md). */
        uint64_t eid = r->engine_id;
        bool pumped = false;
        if (eid & RLAI_ROUTER_REMOTE_BIT) {
            pthread_mutex_unlock(&r->mu);
            pumped = rlai_router_pump(r->h->router, eid, WAIT_SLICE_MS, pump_ready, r) == 1;
            pthread_mutex_lock(&r->mu);
        }
        if (!pumped) {
            struct timespec ts;
            deadline_in(&ts, WAIT_SLICE_MS);
            pthread_cond_timedwait(&r->cv, &r->mu, &ts);
        }
        /* Output to send: a client that left shows in its write (MHD ends
         * the request), so the hang-up check is for idle waits only. */
        if (has_progress(r))
            break;
        peer_state ps = peer_check(r->fd);
        if (ps == PEER_GONE)
            return false;
        if (ps == PEER_HALF && !r->probed) {
            r->probed = true;
            r->probe = true;
            return true;
        }
    }
    return r->why != END_GONE;
}

/* ---------------------------------------------------------- responses */

static const char *error_type(int status)
{
    switch (status) {
    case 400: case 401: case 404: case 405: case 413: case 415: case 421: return "invalid_request_error";
    case 403: return "permission_error";
    case 429: return "rate_limit_error";
    case 501: return "not_implemented_error";
    default: return "server_error";
    }
}

static cJSON *error_json(int status, const char *code, const char *param, const char *msg)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *e = cJSON_AddObjectToObject(root, "error");
    char *clean = utf8_clean(msg);
    cJSON_AddStringToObject(e, "message", clean ? clean : "(error message unavailable: out of memory)");
    free(clean);
    cJSON_AddStringToObject(e, "type", error_type(status));
    if (param)
        cJSON_AddStringToObject(e, "param", param);
    else
        cJSON_AddNullToObject(e, "param");
    if (code)
        cJSON_AddStringToObject(e, "code", code);
    else
        cJSON_AddNullToObject(e, "code");
    return root;
}

/* CORS on every answer: the exact allowed origin (never "*", and no
 * credentials), and Vary: Origin whenever the answer depends on it. */
static void add_cors(hreq *r, struct MHD_Response *resp)
{
    if (r->h->n_cors)
        MHD_add_response_header(resp, "Vary", "Origin");
    if (r->cors_origin)
        MHD_add_response_header(resp, "Access-Control-Allow-Origin", r->cors_origin);
}

static enum MHD_Result send_json(hreq *r, int status, cJSON *j)
{
    char *s = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    if (!s)
        s = strdup("{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,\"code\":null}}");
    size_t n = s ? strlen(s) : 0;
    struct MHD_Response *resp = MHD_create_response_from_buffer(n, s, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(s);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", "application/json");
    if (status == 405 && r->allow)
        MHD_add_response_header(resp, "Allow", r->allow);
    if (status == 401 && r->auth_failed)
        MHD_add_response_header(resp, "WWW-Authenticate", "Bearer realm=\"rlai\"");
    add_cors(r, resp);
    enum MHD_Result rc = MHD_queue_response(r->conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    rlai_metrics_count_http_status(r->h->metrics, status);
    r->answered = true;
    r->http_status = status;
    return rc;
}

static enum MHD_Result send_error(hreq *r, int status, const char *code, const char *param, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return send_json(r, status, error_json(status, code, param, msg));
}

static enum MHD_Result send_text(hreq *r, int status, const char *ctype, char *text)
{
    size_t n = text ? strlen(text) : 0;
    struct MHD_Response *resp = MHD_create_response_from_buffer(n, text ? text : (char *)"",
                                                                text ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (!resp) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", ctype);
    add_cors(r, resp);
    enum MHD_Result rc = MHD_queue_response(r->conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    rlai_metrics_count_http_status(r->h->metrics, status);
    r->answered = true;
    r->http_status = status;
    return rc;
}

/* HTTP status and OpenAI error code for an engine / plugin error: the one
 * table in rlai/error.h. */
static int status_of(int rc, const char **code)
{
    return rlai_err_http_status(rc, code);
}

/* ---------------------------------------------------------- OpenAI objects */

static const char *finish_reason(const hreq *r)
{
    if (r->kind == K_PLUGIN_CHAT) {
        if (!strcmp(r->stop, "max_tokens") || !strcmp(r->stop, "context") || !strcmp(r->stop, "length"))
            return "length";
        if (!strcmp(r->stop, "timeout"))
            return "timeout";
        return "stop";
    }
    if (r->tool_called)
        return "tool_calls";
    switch (r->gm.stop) {
    case RLAI_STOP_MAX_TOKENS: case RLAI_STOP_CONTEXT: return "length";
    case RLAI_STOP_TIMEOUT: return "timeout";   /* extension value (docs/SERVE.md) */
    default: return "stop";
    }
}

static cJSON *usage_json(const hreq *r)
{
    cJSON *u = cJSON_CreateObject();
    int pt = r->have_gm ? r->gm.prompt_tokens : 0, ct = r->have_gm ? r->gm.gen_tokens : 0;
    cJSON_AddNumberToObject(u, "prompt_tokens", pt);
    cJSON_AddNumberToObject(u, "completion_tokens", ct);
    cJSON_AddNumberToObject(u, "total_tokens", pt + ct);
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", r->have_gm ? r->gm.reused_tokens : 0);
    /* OpenAI's names for predicted-output tokens; here the speculative
     * draft tokens (docs/SPECULATIVE.md). */
    int dr = r->have_gm ? r->gm.drafted_tokens : 0, ac = r->have_gm ? r->gm.accepted_tokens : 0;
    cJSON *cd = cJSON_AddObjectToObject(u, "completion_tokens_details");
    cJSON_AddNumberToObject(cd, "accepted_prediction_tokens", ac);
    cJSON_AddNumberToObject(cd, "rejected_prediction_tokens", dr - ac);
    return u;
}

static cJSON *timings_json(const hreq *r)
{
    if (!r->have_gm)
        return cJSON_CreateNull();
    cJSON *t = cJSON_CreateObject();
    cJSON_AddNumberToObject(t, "queue_ms", r->gm.queue_ms);
    cJSON_AddNumberToObject(t, "ttft_ms", r->gm.ttft_ms);
    cJSON_AddNumberToObject(t, "prefill_tokens_per_second", r->gm.prefill_tps);
    cJSON_AddNumberToObject(t, "decode_tokens_per_second", r->gm.decode_tps);
    return t;
}

static bool is_chat(const hreq *r)
{
    return r->kind == K_CHAT || r->kind == K_PLUGIN_CHAT;
}

/* The envelope shared by every chunk / body. */
static cJSON *envelope(const hreq *r, bool chunk)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", r->id);
    cJSON_AddStringToObject(j, "object", is_chat(r) ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                                    : "text_completion");
    cJSON_AddNumberToObject(j, "created", (double)r->created);
    cJSON_AddStringToObject(j, "model", r->model);
    cJSON_AddStringToObject(j, "system_fingerprint", "rtx-localai-" RLAI_VERSION);
    return j;
}

/* The last chunk of a stream with stream_options.include_usage: no
 * choices, the request's usage. */
static void usage_event(hreq *r)
{
    cJSON *u = envelope(r, true);
    cJSON_AddArrayToObject(u, "choices");
    cJSON_AddItemToObject(u, "usage", usage_json(r));
    sse_event(&r->out, NULL, u);
}

/* One streaming chunk: text (may be NULL) and finish (NULL while running). */
static cJSON *chunk_json(const hreq *r, const char *text, size_t len, bool role, const char *finish)
{
    cJSON *j = envelope(r, true);
    cJSON *choices = cJSON_AddArrayToObject(j, "choices");
    cJSON *c = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, c);
    cJSON_AddNumberToObject(c, "index", 0);
    char *t = NULL;
    if (text) {
        t = malloc(len + 1);
        if (t) {
            memcpy(t, text, len);
            t[len] = 0;
        }
    }
    if (is_chat(r)) {
        cJSON *d = cJSON_AddObjectToObject(c, "delta");
        if (role)
            cJSON_AddStringToObject(d, "role", "assistant");
        if (text || role)
            cJSON_AddStringToObject(d, "content", t ? t : "");
    } else {
        cJSON_AddStringToObject(c, "text", t ? t : "");
    }
    cJSON_AddNullToObject(c, "logprobs");
    if (finish)
        cJSON_AddStringToObject(c, "finish_reason", finish);
    else
        cJSON_AddNullToObject(c, "finish_reason");
    free(t);
    return j;
}

/* Appends the SSE event of a running text chunk to r->out, the bytes
 * sse_event(chunk_json(r, text, len, false, NULL)) gives, without a cJSON
 * tree per token: cJSON prints that chunk once per request with a marker
 * as its text (the last occurrence: only constants follow the text), and
 * each token's text is escaped as cJSON escapes (host/json_escape.h). */
#define TPL_MARK "\x01rlai-text\x01"
#define TPL_MARK_PRINTED "\\u0001rlai-text\\u0001"
static int text_chunk(hreq *r, const char *text, size_t len)
{
    if (!r->tpl.len) {
        cJSON *j = chunk_json(r, TPL_MARK, strlen(TPL_MARK), false, NULL);
        char *s = j ? cJSON_PrintUnformatted(j) : NULL;
        cJSON_Delete(j);
        if (!s)
            return RLAI_ERR_NOMEM;
        char *m = NULL;
        for (char *p = strstr(s, TPL_MARK_PRINTED); p; p = strstr(p + 1, TPL_MARK_PRINTED))
            m = p;
        int rc = m ? 0 : RLAI_ERR_FORMAT;     /* cannot happen: then the cJSON path */
        if (rc == 0) {
            r->tpl_head = 6 + (size_t)(m - s);
            if (rlai_strbuf_str(&r->tpl, "data: ") < 0 || rlai_strbuf_add(&r->tpl, s, (size_t)(m - s)) < 0 ||
                rlai_strbuf_str(&r->tpl, m + strlen(TPL_MARK_PRINTED)) < 0 || rlai_strbuf_str(&r->tpl, "\n\n") < 0)
                rc = RLAI_ERR_NOMEM;
        }
        free(s);
        if (rc < 0) {
            rlai_strbuf_free(&r->tpl);
            return rc;
        }
    }
    size_t tail = r->tpl.len - r->tpl_head;
    if (rlai_strbuf_grow(&r->out, r->tpl.len + RLAI_JSON_ESCAPE_MAX(len)) < 0)
        return RLAI_ERR_NOMEM;
    char *o = r->out.p + r->out.len;
    memcpy(o, r->tpl.p, r->tpl_head);
    o += r->tpl_head;
    o += rlai_json_escape(text, len, o);
    memcpy(o, r->tpl.p + r->tpl_head, tail);
    o += tail;
    r->out.len = (size_t)(o - r->out.p);
    r->out.p[r->out.len] = 0;
    return 0;
}

static cJSON *final_body(const hreq *r, const char *text)
{
    cJSON *j = envelope(r, false);
    cJSON *choices = cJSON_AddArrayToObject(j, "choices");
    cJSON *c = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, c);
    cJSON_AddNumberToObject(c, "index", 0);
    if (is_chat(r)) {
        cJSON *m = cJSON_AddObjectToObject(c, "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        cJSON *calls = cJSON_GetArraySize(r->rtc_all) > 0 ? rlai_tool_calls_message(r->rtc_all)
                                                          : rlai_tools_extract(&r->tools, text,
                                                                               (uint64_t)(uintptr_t)r ^ r->engine_id);
        if (calls && r->rtc_all) {         /* a remote model's calls, with whatever text it wrote */
            ((hreq *)r)->tool_called = true;
            if (text && *text)
                cJSON_AddStringToObject(m, "content", text);
            else
                cJSON_AddNullToObject(m, "content");
            cJSON_AddItemToObject(m, "tool_calls", calls);
        } else if (calls) {
            ((hreq *)r)->tool_called = true;
            cJSON_AddNullToObject(m, "content");
            cJSON_AddItemToObject(m, "tool_calls", calls);
        } else {
            cJSON_AddStringToObject(m, "content", text ? text : "");
        }
    } else {
        cJSON_AddStringToObject(c, "text", text ? text : "");
    }
    cJSON_AddNullToObject(c, "logprobs");
    cJSON_AddStringToObject(c, "finish_reason", finish_reason(r));
    cJSON_AddItemToObject(j, "usage", usage_json(r));
    cJSON_AddItemToObject(j, "timings", timings_json(r));
    return j;
}

/* Error object for a request that failed after it started. */
static cJSON *late_error(const hreq *r)
{
    if (r->why == END_SHUTDOWN || r->status == 0)
        return error_json(503, "shutdown", NULL, "server shutting down: request ended");
    const char *code;
    int st = status_of(r->status, &code);
    if (r->status == RLAI_ERR_NOT_FOUND)   /* a running handler's NOT_FOUND: its command exists */
        code = r->kind == K_PLUGIN_CHAT ? "model_not_found" : r->kind == K_PLUGIN ? "not_found" : "command_not_found";
    return error_json(st, code, NULL, r->errmsg[0] ? r->errmsg : rlai_strerror(r->status));
}

static bool ended_badly(const hreq *r)
{
    if (r->status < 0 || r->why == END_SHUTDOWN)
        return true;
    /* An engine request cancelled by someone other than its client. */
    return r->kind != K_PLUGIN && r->kind != K_PLUGIN_CHAT && r->have_gm && r->gm.stop == RLAI_STOP_CANCELLED;
}

/* Replaces choice's "logprobs" with the object for n tokens (chat:
 * {"content": [...]}, completions: the legacy arrays). */
static void put_logprobs(hreq *r, cJSON *choice, const rlai_token_logprobs *lp, int n)
{
    if (!r->lp_mode || !choice)
        return;
    cJSON *o = NULL;
    if (r->lp_mode == 1) {
        o = cJSON_CreateObject();
        cJSON *content = cJSON_AddArrayToObject(o, "content");
        if (!content || rlai_logprobs_chat_append(r->h->engine, lp, n, content) < 0) {
            cJSON_Delete(o);
            o = NULL;
        }
        if (o)
            cJSON_AddNullToObject(o, "refusal");
    } else {
        o = rlai_logprobs_completion_json(r->h->engine, lp, n, &r->lp_off);
    }
    if (o)
        cJSON_ReplaceItemInObjectCaseSensitive(choice, "logprobs", o);
}

/* The first choice of a chunk / body. */
static cJSON *first_choice(cJSON *j)
{
    return cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "choices"), 0);
}

/* Takes the logprobs not yet sent (connection thread), or only the prompt
 * tokens' among them (PROMPT_ONLY): a malloc'd copy in *out (NULL when
 * none), the count returned. */
static int take_logprobs(hreq *r, rlai_token_logprobs **out, bool prompt_only)
{
    *out = NULL;
    pthread_mutex_lock(&r->mu);
    int n = r->n_lps - r->lp_sent;
    if (prompt_only) {
        int np = 0;
        while (np < n && r->lps[r->lp_sent + np].prompt)
            np++;
        n = np;
    }
    if (n > 0 && (*out = malloc(sizeof(**out) * (size_t)n)) != NULL) {
        memcpy(*out, r->lps + r->lp_sent, sizeof(**out) * (size_t)n);
        r->lp_sent += n;
    } else {
        n = 0;
    }
    pthread_mutex_unlock(&r->mu);
    return n;
}

/* Replaces choice's "logprobs" with a remote model's entries (taken). */
static void put_remote_logprobs(hreq *r, cJSON *choice, cJSON *entries)
{
    cJSON *o = NULL;
    if (r->lp_mode == 1) {
        if ((o = cJSON_CreateObject()) && cJSON_AddItemToObject(o, "content", entries)) {
            entries = NULL;
            cJSON_AddNullToObject(o, "refusal");
        }
    } else {
        o = rlai_logprobs_completion_from_entries(entries, &r->lp_off);
    }
    cJSON_Delete(entries);
    if (o && !(choice && cJSON_ReplaceItemInObjectCaseSensitive(choice, "logprobs", o)))
        cJSON_Delete(o);
}

/* Adds the logprobs not yet sent to CHOICE when the request asked for
 * them: a streamed chunk only when there are some (ALWAYS false), a final
 * body also when none are left (ALWAYS true). A remote model's come as
 * entries (gen_on_remote_logprobs), a local one's as token ids. */
static void attach_logprobs(hreq *r, cJSON *choice, bool always)
{
    if (!r->lp_mode)
        return;
    pthread_mutex_lock(&r->mu);
    cJSON *remote = r->rlps;
    r->rlps = NULL;
    pthread_mutex_unlock(&r->mu);
    if (remote) {
        put_remote_logprobs(r, choice, remote);
        return;
    }
    rlai_token_logprobs *lp;
    int nl = take_logprobs(r, &lp, false);
    if (nl || always)
        put_logprobs(r, choice, lp, nl);
    free(lp);
}

/* A streamed echo's chunk: the prompt text, with the prompt tokens'
 * log-probabilities when asked. The engine reports those all before the
 * first generated token and before the end, so the chunk is built when the
 * request's first text (or its end) is seen (ECHO with LOGPROBS), or at
 * once otherwise. INDEX is the choice's. */
static cJSON *echo_chunk(hreq *r, int index)
{
    cJSON *ch = chunk_json(r, r->echo_text, strlen(r->echo_text), false, NULL);
    if (index)
        cJSON_ReplaceItemInObjectCaseSensitive(first_choice(ch), "index", cJSON_CreateNumber(index));
    if (r->lp_mode) {
        rlai_token_logprobs *lp;
        int n = take_logprobs(r, &lp, true);
        put_logprobs(r, first_choice(ch), lp, n);
        free(lp);
    }
    r->echo_sent = true;
    return ch;
}

/* True when a streamed echo is due now: before ECHO's first text or end. */
static bool echo_due(const hreq *r, bool text_or_end)
{
    return r->echo_text && !r->echo_sent && (!r->lp_mode || text_or_end);
}

/* ---------------------------------------------------------- tool calls in streams */

/* Streamed chat with tools: a reply that is (or, for tool_choice auto,
 * starts like) a call is kept back in r->held and sent as tool_calls
 * deltas when it is complete. Returns true when text was taken. */
static bool tool_hold(hreq *r, rlai_strbuf *text)
{
    if (r->tools.mode == RLAI_TOOLS_OFF || (r->tool_decided && !r->held.len))
        return false;
    if (rlai_strbuf_add(&r->held, text->p, text->len) < 0)
        return false;
    rlai_strbuf_free(text);
    if (r->tool_decided || r->tools.mode != RLAI_TOOLS_AUTO)
        return true;
    size_t i = 0;
    while (i < r->held.len && strchr(" \n\t\r", r->held.p[i]))
        i++;
    if (i == r->held.len)
        return true;            /* only whitespace yet */
    r->tool_decided = true;
    if (r->held.p[i] == '{')
        return true;
    *text = r->held;            /* text: send what was kept, stream from now on */
    memset(&r->held, 0, sizeof(r->held));
    return false;
}

/* The chunk's choice gets index i ("n" choices). */
static cJSON *at_index(cJSON *chunk, int i)
{
    if (i)
        cJSON_ReplaceItemInObjectCaseSensitive(first_choice(chunk), "index", cJSON_CreateNumber(i));
    return chunk;
}

/* At the end of a stream: the kept text as tool_calls deltas (OpenAI's
 * shape: id, type and name with empty arguments, then the arguments), or
 * as content when it is not a call; into out, as choice `index`. */
static void tool_flush_to(hreq *r, rlai_strbuf *out, int index)
{
    cJSON *calls = rlai_tools_extract(&r->tools, r->held.p, (uint64_t)(uintptr_t)r ^ r->engine_id);
    if (!calls) {
        sse_event(out, NULL, at_index(chunk_json(r, r->held.p, r->held.len, false, NULL), index));
    } else {
        r->tool_called = true;
        const cJSON *c0 = calls->child;
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(c0, "function");
        cJSON *a = chunk_json(r, NULL, 0, false, NULL);
        cJSON *d = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(a, "choices"), 0),
                                                    "delta");
        cJSON *tc = cJSON_CreateObject();
        cJSON_AddNumberToObject(tc, "index", 0);
        cJSON_AddStringToObject(tc, "id", cJSON_GetObjectItemCaseSensitive(c0, "id")->valuestring);
        cJSON_AddStringToObject(tc, "type", "function");
        cJSON *tf = cJSON_AddObjectToObject(tc, "function");
        cJSON_AddStringToObject(tf, "name", cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring);
        cJSON_AddStringToObject(tf, "arguments", "");
        cJSON_AddItemToArray(cJSON_AddArrayToObject(d, "tool_calls"), tc);
        sse_event(out, NULL, at_index(a, index));
        cJSON *b = chunk_json(r, NULL, 0, false, NULL);
        d = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(b, "choices"), 0),
                                             "delta");
        tc = cJSON_CreateObject();
        cJSON_AddNumberToObject(tc, "index", 0);
        tf = cJSON_AddObjectToObject(tc, "function");
        cJSON_AddStringToObject(tf, "arguments", cJSON_GetObjectItemCaseSensitive(fn, "arguments")->valuestring);
        cJSON_AddItemToArray(cJSON_AddArrayToObject(d, "tool_calls"), tc);
        sse_event(out, NULL, at_index(b, index));
        cJSON_Delete(calls);
    }
    rlai_strbuf_free(&r->held);
}

static void tool_flush(hreq *r)
{
    tool_flush_to(r, &r->out, 0);
}

/* ---------------------------------------------------------- engine callbacks (engine thread) */

static void gen_on_logprobs(void *user, const rlai_token_logprobs *lp)
{
    hreq *r = user;
    if (r->score_only && !lp->prompt)
        return;   /* the dropped token's */
    pthread_mutex_lock(&r->mu);
    if (r->n_lps == r->cap_lps) {
        int cap = r->cap_lps ? r->cap_lps * 2 : 64;
        rlai_token_logprobs *n = realloc(r->lps, sizeof(*n) * (size_t)cap);
        if (n) {
            r->lps = n;
            r->cap_lps = cap;
        }
    }
    if (r->n_lps < r->cap_lps)
        r->lps[r->n_lps++] = *lp;
    pthread_mutex_unlock(&r->mu);
}

/* Appends the items of array src (taken) to *dst (an array, or NULL: then
 * src becomes it). */
static void append_items(cJSON **dst, cJSON *src)
{
    if (!*dst) {
        *dst = src;
        return;
    }
    cJSON *e;
    while ((e = cJSON_DetachItemViaPointer(src, src->child)) != NULL)
        cJSON_AddItemToArray(*dst, e);
    cJSON_Delete(src);
}

/* A remote model's tool-call fragments (the driving thread; router.h):
 * merged for the final message and kept for the next streamed chunk. */
static void gen_on_remote_tool_calls(void *user, cJSON *deltas)
{
    hreq *r = user;
    pthread_mutex_lock(&r->mu);
    r->tool_called = true;
    if (!r->rtc_all)
        r->rtc_all = cJSON_CreateArray();
    if (r->rtc_all && rlai_tool_calls_merge(r->rtc_all, deltas) < 0)
        fprintf(stderr, "rlai: http: out of memory merging a remote tool call\n");
    append_items(&r->rtc, deltas);
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

/* A remote model's log-probabilities (the driving thread; router.h):
 * kept until the chunk that carries their text. */
static void gen_on_remote_logprobs(void *user, cJSON *entries)
{
    hreq *r = user;
    pthread_mutex_lock(&r->mu);
    append_items(&r->rlps, entries);
    pthread_mutex_unlock(&r->mu);
}

static int gen_on_token(void *user, rlai_token tok, const char *text, size_t len)
{
    (void)tok;
    hreq *r = user;
    pthread_mutex_lock(&r->mu);
    int stop = r->why != END_NONE;
    if (!stop && len && !r->score_only) {
        if (rlai_strbuf_add(&r->pending, text, len) < 0)
            stop = 1;
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
    return stop;
}

/* A remote request failed: keep the router's reason for the error frame. */
static void gen_on_error(void *user, uint64_t id, int status, const char *msg)
{
    (void)id;
    (void)status;
    hreq *r = user;
    pthread_mutex_lock(&r->mu);
    snprintf(r->errmsg, sizeof(r->errmsg), "%s", msg);
    pthread_mutex_unlock(&r->mu);
}

static void gen_on_done(void *user, uint64_t id, int status, const rlai_gen_metrics *m)
{
    (void)id;
    hreq *r = user;
    rlai_http *h = r->h;
    rlai_metrics_observe_generation(h->metrics, "http", status, m);
    pthread_mutex_lock(&r->mu);
    r->done = true;
    r->status = status;
    if (status == 0 && m) {
        r->gm = *m;
        r->have_gm = true;
        if (r->score_only) {   /* the sampled token is not part of the answer */
            r->gm.gen_tokens = 0;
            r->gm.stop = RLAI_STOP_MAX_TOKENS;
        }
    } else if (status < 0 && !r->errmsg[0]) {
        snprintf(r->errmsg, sizeof(r->errmsg), "generation failed: %s", rlai_strerror(status));
    }
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    untrack(h, r);
    hreq_unref(r);
}

/* ---------------------------------------------------------- plugin sink (worker thread) */

static int sink_token(void *user, const char *text, size_t len)
{
    hreq *r = user;
    pthread_mutex_lock(&r->mu);
    int stop = r->why != END_NONE;
    if (!stop && len) {
        if (r->kind == K_PLUGIN && r->stream) {
            cJSON *j = cJSON_CreateObject();
            char *t = malloc(len + 1);
            if (t) {
                memcpy(t, text, len);
                t[len] = 0;
                cJSON_AddStringToObject(j, "text", t);
                free(t);
            }
            sse_event(&r->sse, "token", j);
        } else if (rlai_strbuf_add(&r->pending, text, len) < 0) {
            stop = 1;
        }
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
    return stop;
}

static int sink_result(void *user, const cJSON *value)
{
    hreq *r = user;
    if (r->kind != K_PLUGIN) {
        /* Character chats carry the text; keep the reply in case the
         * command did not stream it. */
        const cJSON *rep = cJSON_GetObjectItemCaseSensitive(value, "text");
        if (!cJSON_IsString(rep))
            rep = cJSON_GetObjectItemCaseSensitive(value, "reply");
        if (cJSON_IsString(rep)) {
            pthread_mutex_lock(&r->mu);
            free(r->chat_reply);
            r->chat_reply = strdup(rep->valuestring);
            pthread_mutex_unlock(&r->mu);
        }
        return 0;
    }
    pthread_mutex_lock(&r->mu);
    int stop = r->why != END_NONE;
    if (!stop) {
        cJSON *copy = cJSON_Duplicate(value, true);
        if (r->stream) {
            sse_event(&r->sse, "result", copy);
        } else {
            if (!r->results)
                r->results = cJSON_CreateArray();
            cJSON_AddItemToArray(r->results, copy);
        }
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
    return stop;
}

static void sink_end(hreq *r, int status, const char *stop, const rlai_call_metrics *m, const char *msg)
{
    rlai_http *h = r->h;
    if (m && m->valid) {
        rlai_gen_metrics gm = { .prompt_tokens = m->prompt_tokens, .reused_tokens = m->reused_tokens,
                                .gen_tokens = m->gen_tokens, .queue_ms = m->queue_ms, .ttft_ms = m->ttft_ms,
                                .prefill_tps = m->prefill_tps, .decode_tps = m->decode_tps,
                                .drafted_tokens = m->drafted_tokens, .accepted_tokens = m->accepted_tokens };
        rlai_metrics_observe_generation(h->metrics, "http", 0, &gm);
    }
    pthread_mutex_lock(&r->mu);
    r->done = true;
    r->status = status;
    snprintf(r->stop, sizeof(r->stop), "%s", stop ? stop : "");
    if (msg)
        snprintf(r->errmsg, sizeof(r->errmsg), "%s", msg);
    if (m && m->valid) {
        r->have_gm = true;
        r->gm.prompt_tokens = m->prompt_tokens;
        r->gm.reused_tokens = m->reused_tokens;
        r->gm.gen_tokens = m->gen_tokens;
        r->gm.queue_ms = m->queue_ms;
        r->gm.ttft_ms = m->ttft_ms;
        r->gm.prefill_tps = m->prefill_tps;
        r->gm.decode_tps = m->decode_tps;
        r->gm.drafted_tokens = m->drafted_tokens;
        r->gm.accepted_tokens = m->accepted_tokens;
    }
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    untrack(h, r);
    hreq_unref(r);
}

static void sink_done(void *user, const char *stop, const rlai_call_metrics *m)
{
    sink_end(user, 0, stop, m, NULL);
}

static void sink_error(void *user, int code, const char *msg)
{
    sink_end(user, code < 0 ? code : RLAI_ERR_INVALID_ARG, "", NULL, msg ? msg : rlai_strerror(code));
}

/* ---------------------------------------------------------- streaming reader (connection thread) */

/* Builds the next output into r->out. Returns false when the stream is
 * over (nothing more to send). */
static bool produce(hreq *r)
{
    r->out.len = 0;
    r->opos = 0;
    if (r->phase == 2)
        return false;
    if (r->phase == 0 && is_chat(r)) {
        sse_event(&r->out, NULL, chunk_json(r, NULL, 0, true, NULL));
        r->phase = 1;
        return true;
    }
    if (r->phase == 0 && echo_due(r, false)) {
        sse_event(&r->out, NULL, echo_chunk(r, 0));
        r->phase = 1;
        return true;
    }
    r->phase = 1;
    pthread_mutex_lock(&r->mu);
    bool alive = wait_progress(r);
    bool probe = r->probe;
    r->probe = false;
    rlai_strbuf text = r->pending, events = r->sse;
    memset(&r->pending, 0, sizeof(r->pending));
    memset(&r->sse, 0, sizeof(r->sse));
    cJSON *calls = r->rtc;
    r->rtc = NULL;
    bool done = r->done || r->why == END_SHUTDOWN;
    pthread_mutex_unlock(&r->mu);
    if (!alive) {
        rlai_strbuf_free(&text);
        rlai_strbuf_free(&events);
        cJSON_Delete(calls);
        end_request(r, END_GONE);
        return false;
    }
    if (probe)
        rlai_strbuf_str(&r->out, ": ping\n\n");     /* SSE comment: clients ignore it */
    if (echo_due(r, text.len > 0 || done))
        sse_event(&r->out, NULL, echo_chunk(r, 0));
    if (r->kind == K_PLUGIN) {
        if (events.len)
            rlai_strbuf_add(&r->out, events.p, events.len);
    } else if (text.len && !tool_hold(r, &text)) {
        if (r->lp_mode || text_chunk(r, text.p, text.len) < 0) {
            cJSON *ch = chunk_json(r, text.p, text.len, false, NULL);
            attach_logprobs(r, first_choice(ch), false);
            sse_event(&r->out, NULL, ch);
        }
        r->streamed = true;
    }
    if (calls) {                       /* a remote model's call fragments, as it sent them */
        cJSON *ch = chunk_json(r, NULL, 0, false, NULL);
        cJSON_AddItemToObject(cJSON_GetObjectItemCaseSensitive(first_choice(ch), "delta"), "tool_calls", calls);
        sse_event(&r->out, NULL, ch);
        r->streamed = true;
    }
    rlai_strbuf_free(&text);
    rlai_strbuf_free(&events);
    if (done) {
        pthread_mutex_lock(&r->mu);
        bool finished = r->done;
        pthread_mutex_unlock(&r->mu);
        if (!finished) {
            /* Server stopping: the cancel is on its way; report it now. */
            sse_event(&r->out, NULL, error_json(503, "shutdown", NULL, "server shutting down: request ended"));
        } else if (r->kind == K_PLUGIN) {
            if (r->status < 0 || r->why == END_SHUTDOWN) {
                sse_event(&r->out, "error", late_error(r));
            } else {
                cJSON *d = cJSON_CreateObject();
                cJSON_AddStringToObject(d, "stop", r->stop);
                cJSON_AddItemToObject(d, "usage", r->have_gm ? usage_json(r) : cJSON_CreateNull());
                sse_event(&r->out, "done", d);
            }
        } else if (ended_badly(r)) {
            sse_event(&r->out, NULL, late_error(r));
        } else {
            if (!r->streamed && r->chat_reply && r->chat_reply[0])
                sse_event(&r->out, NULL, chunk_json(r, r->chat_reply, strlen(r->chat_reply), false, NULL));
            if (r->held.len)
                tool_flush(r);
            cJSON *fin = chunk_json(r, NULL, 0, false, finish_reason(r));
            attach_logprobs(r, first_choice(fin), false);
            cJSON_AddItemToObject(fin, "timings", timings_json(r));
            sse_event(&r->out, NULL, fin);
            if (r->include_usage)
                usage_event(r);
        }
        rlai_strbuf_str(&r->out, "data: [DONE]\n\n");
        r->phase = 2;
    }
    return true;
}

static bool produce_multi(hreq *r);

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    hreq *r = cls;
    while (r->opos >= r->out.len) {
        if (!(r->n_kids ? produce_multi(r) : produce(r)))
            /* Also when the client is gone: nobody reads the rest, and an
             * error return would only add a log line per disconnect. */
            return MHD_CONTENT_READER_END_OF_STREAM;
    }
    size_t n = r->out.len - r->opos;
    if (n > max)
        n = max;
    memcpy(buf, r->out.p + r->opos, n);
    r->opos += n;
    return (ssize_t)n;
}

static void stream_free(void *cls)
{
    hreq *r = cls;
    rlai_http *h = r->h;
    pthread_mutex_lock(&h->mu);
    h->n_streams--;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    hreq_unref(r);
}

static enum MHD_Result start_stream(hreq *r)
{
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_reader, r,
                                                                  stream_free);
    if (!resp) {
        end_request(r, END_GONE);
        return MHD_NO;
    }
    hreq_ref(r);
    pthread_mutex_lock(&r->h->mu);
    r->h->n_streams++;
    pthread_mutex_unlock(&r->h->mu);
    MHD_add_response_header(resp, "Content-Type", "text/event-stream");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    add_cors(r, resp);
    enum MHD_Result rc = MHD_queue_response(r->conn, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    rlai_metrics_count_http_status(r->h->metrics, 200);
    r->answered = true;
    r->http_status = 200;
    return rc;
}

/* Non-streaming: blocks until the request is done (or the client left),
 * then answers with one JSON body. */
static enum MHD_Result finish_blocking(hreq *r)
{
    pthread_mutex_lock(&r->mu);
    bool alive = true;
    /* Text accumulates in r->pending until done. */
    while (!r->done && r->why == END_NONE) {
        struct timespec ts;
        deadline_in(&ts, WAIT_SLICE_MS);
        pthread_cond_timedwait(&r->cv, &r->mu, &ts);
        if (r->done || r->why != END_NONE)
            break;
        peer_state ps = peer_check(r->fd);
        if (ps == PEER_HALF && !r->probed) {
            /* A FIN: half-close or real close. HTTP/1.1 lets a server send
             * a 100 (Continue) before its final answer and obliges clients
             * to skip it; a closed socket answers it with a reset, seen on
             * a later check. HTTP/1.0 forbids 1xx: a FIN ends the request. */
            r->probed = true;
            const char *ver = r->http11 ? "HTTP/1.1 100 Continue\r\n\r\n" : NULL;
            if (!ver || send(r->fd, ver, strlen(ver), MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)strlen(ver))
                ps = PEER_GONE;
        }
        if (ps == PEER_GONE) {
            alive = false;
            break;
        }
    }
    alive = alive && r->why != END_GONE;
    pthread_mutex_unlock(&r->mu);
    if (!alive) {
        end_request(r, END_GONE);
        return MHD_NO;
    }
    if (!r->done || ended_badly(r)) {
        cJSON *e = late_error(r);
        const char *code;
        int st = r->done && r->status < 0 ? status_of(r->status, &code) : 503;
        return send_json(r, st, e);
    }
    if (r->kind == K_PLUGIN) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "command", r->command);
        cJSON_AddItemToObject(j, "results", r->results ? r->results : cJSON_CreateArray());
        r->results = NULL;
        cJSON_AddStringToObject(j, "text", r->pending.p ? r->pending.p : "");
        cJSON_AddStringToObject(j, "stop", r->stop);
        cJSON_AddItemToObject(j, "usage", r->have_gm ? usage_json(r) : cJSON_CreateNull());
        return send_json(r, 200, j);
    }
    const char *text = r->pending.len ? r->pending.p : r->chat_reply;
    if (r->echo_text) {
        /* completions "echo": the prompt, then the completion */
        size_t el = strlen(r->echo_text);
        char *both = malloc(el + r->pending.len + 1);
        if (!both)
            return send_error(r, 500, NULL, NULL, "out of memory");
        memcpy(both, r->echo_text, el);
        memcpy(both + el, r->pending.p ? r->pending.p : "", r->pending.len);
        both[el + r->pending.len] = 0;
        cJSON *j = final_body(r, both);
        free(both);
        attach_logprobs(r, first_choice(j), true);   /* the prompt's tokens, then the completion's */
        return send_json(r, 200, j);
    }
    cJSON *body = final_body(r, text);
    attach_logprobs(r, first_choice(body), true);
    return send_json(r, 200, body);
}

/* ---------------------------------------------------------- request parsing */

#define MAX_CHOICES 16          /* "n" */
#define MAX_CHOICES_TOTAL 64    /* prompts x n of one completions request */

typedef struct gen_request {
    rlai_gen_params gp;
    rlai_grammar *grammar;      /* response_format's (owned), or NULL */
    const char *stops[MAX_STOPS + 1];
    rlai_logit_bias lb[RLAI_MAX_LOGIT_BIAS];   /* gp.logit_bias points here */
    bool echo;                     /* completions: answer starts with the prompt */
    int n;                         /* "n": choices per prompt (0 = 1) */
} gen_request;

static bool json_is_int(const cJSON *v)
{
    return cJSON_IsNumber(v) && v->valuedouble == (double)(long long)v->valuedouble;
}

/* Reads one optional number field in [lo, hi]; returns false (and answers
 * 400) when it is present but wrong. */
static bool opt_number(hreq *r, const cJSON *body, const char *key, double lo, double hi, double *out, bool *present)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(body, key);
    *present = false;
    if (!v || cJSON_IsNull(v))
        return true;
    if (!cJSON_IsNumber(v) || v->valuedouble < lo || v->valuedouble > hi) {
        send_error(r, 400, "invalid_value", key, "'%s' must be a number in [%g, %g]", key, lo, hi);
        return false;
    }
    *out = v->valuedouble;
    *present = true;
    return true;
}

/* "logprobs" / "top_logprobs" (chat: a boolean and 0..20; completions:
 * logprobs = 0..20 alternatives) and completions' "echo". Sets
 * g->gp.top_logprobs and r->lp_mode / r->echo_text's wish (r->lp_off is
 * set when the prompt text is known). Returns false after answering 400. */
static bool parse_logprobs_echo(hreq *r, const cJSON *body, gen_request *g)
{
    const cJSON *lp = cJSON_GetObjectItemCaseSensitive(body, "logprobs");
    const cJSON *top = cJSON_GetObjectItemCaseSensitive(body, "top_logprobs");
    const cJSON *echo = cJSON_GetObjectItemCaseSensitive(body, "echo");
    g->gp.top_logprobs = -1;
    g->echo = false;
    if (r->kind == K_CHAT) {
        if (lp && !cJSON_IsNull(lp) && !cJSON_IsBool(lp))
            return send_error(r, 400, "invalid_type", "logprobs", "'logprobs' must be a boolean"), false;
        bool on = cJSON_IsTrue(lp);
        if (top && !cJSON_IsNull(top)) {
            if (!json_is_int(top) || top->valuedouble < 0 || top->valuedouble > RLAI_MAX_TOP_LOGPROBS)
                return send_error(r, 400, "invalid_value", "top_logprobs",
                                  "'top_logprobs' must be an integer in [0, %d]", RLAI_MAX_TOP_LOGPROBS), false;
            if (!on)
                return send_error(r, 400, "invalid_value", "top_logprobs",
                                  "'top_logprobs' needs 'logprobs': true"), false;
        }
        if (on) {
            r->lp_mode = 1;
            g->gp.top_logprobs = top && !cJSON_IsNull(top) ? (int)top->valuedouble : 0;
        }
        if (echo && !cJSON_IsNull(echo) && !cJSON_IsFalse(echo))
            return send_error(r, 400, "unsupported_value", "echo", "'echo' is a completions field"), false;
        return true;
    }
    if (lp && !cJSON_IsNull(lp)) {
        if (!json_is_int(lp) || lp->valuedouble < 0 || lp->valuedouble > RLAI_MAX_TOP_LOGPROBS)
            return send_error(r, 400, "invalid_value", "logprobs",
                              "'logprobs' must be an integer in [0, %d] (alternatives per token)",
                              RLAI_MAX_TOP_LOGPROBS), false;
        r->lp_mode = 2;
        g->gp.top_logprobs = (int)lp->valuedouble;
    }
    if (echo && !cJSON_IsNull(echo) && !cJSON_IsBool(echo))
        return send_error(r, 400, "invalid_type", "echo", "'echo' must be a boolean"), false;
    g->echo = cJSON_IsTrue(echo);
    /* echo with logprobs: the prompt tokens' log-probabilities come first
     * (the first token's are null), as OpenAI's legacy completions and the
     * loglikelihood scoring of evaluation harnesses use them */
    g->gp.prompt_logprobs = g->echo && r->lp_mode;
    return true;
}

static bool bound_remote(const hreq *r);

/* OpenAI's logit_bias: {"token id": bias, ...}, each bias in [-100, 100]
 * (-100 bans the token). Ids are checked against the local model's
 * vocabulary unless the request is bound to an upstream, whose vocabulary
 * they are then. Returns false after answering 400. */
static bool parse_logit_bias(hreq *r, const cJSON *body, gen_request *g)
{
    const cJSON *lb = cJSON_GetObjectItemCaseSensitive(body, "logit_bias");
    if (!lb || cJSON_IsNull(lb))
        return true;
    if (!cJSON_IsObject(lb))
        return send_error(r, 400, "invalid_type", "logit_bias",
                          "'logit_bias' must be an object mapping token ids to biases"), false;
    int n_vocab = -1;
    if (!bound_remote(r)) {
        rlai_model_info info;
        rlai_engine_info(r->h->engine, &info);
        n_vocab = info.n_vocab;
    }
    int n = 0;
    const cJSON *b;
    cJSON_ArrayForEach(b, lb) {
        if (n == RLAI_MAX_LOGIT_BIAS)
            return send_error(r, 400, "invalid_value", "logit_bias", "'logit_bias' may have at most %d entries",
                              RLAI_MAX_LOGIT_BIAS), false;
        const char *k = b->string;
        long long id = 0;
        size_t kl = strlen(k);
        bool digits = kl > 0 && kl <= 10;
        for (size_t i = 0; digits && i < kl; i++) {
            digits = k[i] >= '0' && k[i] <= '9';
            id = id * 10 + (k[i] - '0');
        }
        if (!digits || id > INT32_MAX || (n_vocab >= 0 && id >= n_vocab)) {
            if (n_vocab >= 0)
                return send_error(r, 400, "invalid_value", "logit_bias",
                                  "'logit_bias' key '%.32s' is not a token id in [0, %d)", k, n_vocab), false;
            return send_error(r, 400, "invalid_value", "logit_bias", "'logit_bias' key '%.32s' is not a token id",
                              k), false;
        }
        if (!cJSON_IsNumber(b) || !(b->valuedouble >= -RLAI_LOGIT_BIAS_MAX) ||
            !(b->valuedouble <= RLAI_LOGIT_BIAS_MAX))
            return send_error(r, 400, "invalid_value", "logit_bias",
                              "'logit_bias' of token %lld must be a number in [-100, 100]", id), false;
        g->lb[n++] = (rlai_logit_bias){ (rlai_token)id, (float)b->valuedouble };
    }
    g->gp.logit_bias = n ? g->lb : NULL;
    g->gp.n_logit_bias = n;
    return true;
}

/* OpenAI's predicted outputs: "prediction": {"type": "content", "content":
 * a string or an array of {"type": "text", "text": string} parts}. The
 * engine drafts from it (docs/SPECULATIVE.md); the output is unchanged. A
 * string content is used in place (it lives in body); parts are joined
 * into r->prediction. */
static bool parse_prediction(hreq *r, const cJSON *body, gen_request *g)
{
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(body, "prediction");
    if (!p || cJSON_IsNull(p))
        return true;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(p, "type");
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(p, "content");
    if (!cJSON_IsObject(p) || !cJSON_IsString(type) || strcmp(type->valuestring, "content") ||
        !(cJSON_IsString(c) || cJSON_IsArray(c)))
        return send_error(r, 400, "invalid_value", "prediction",
                          "'prediction' must be {\"type\": \"content\", \"content\": a string or text parts}"),
               false;
    size_t total = 0;
    if (cJSON_IsString(c)) {
        total = strlen(c->valuestring);
    } else {
        const cJSON *part;
        cJSON_ArrayForEach(part, c) {
            const cJSON *pt = cJSON_GetObjectItemCaseSensitive(part, "type");
            const cJSON *tx = cJSON_GetObjectItemCaseSensitive(part, "text");
            if (!cJSON_IsString(pt) || strcmp(pt->valuestring, "text") || !cJSON_IsString(tx))
                return send_error(r, 400, "invalid_value", "prediction",
                                  "'prediction' content parts must be {\"type\": \"text\", \"text\": string}"),
                       false;
            total += strlen(tx->valuestring);
            if (total > RLAI_MAX_PREDICTION_BYTES)
                break;
        }
    }
    if (total > RLAI_MAX_PREDICTION_BYTES)
        return send_error(r, 413, "invalid_value", "prediction", "'prediction' has more than %u bytes",
                          (unsigned)RLAI_MAX_PREDICTION_BYTES), false;
    if (cJSON_IsString(c)) {
        g->gp.prediction = c->valuestring[0] ? c->valuestring : NULL;
        return true;
    }
    free(r->prediction);
    if (!(r->prediction = malloc(total + 1)))
        return send_error(r, 500, NULL, NULL, "out of memory"), false;
    size_t at = 0;
    const cJSON *part;
    cJSON_ArrayForEach(part, c) {
        const char *t = cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring;
        size_t l = strlen(t);
        memcpy(r->prediction + at, t, l);
        at += l;
    }
    r->prediction[at] = 0;
    g->gp.prediction = at ? r->prediction : NULL;
    return true;
}

/* Maps the OpenAI sampling fields onto gen params. Returns false after
 * answering 400. Strings in g->stops point into body. */
static bool parse_sampling(hreq *r, const cJSON *body, gen_request *g)
{
    rlai_gen_params_init(&g->gp);
    rlai_sampler_params *s = &g->gp.sampling;
    /* The product defaults (engine.h, docs/DEFAULTS.md) and a fresh seed. */
    rlai_sampler_params_product(s, rlai_fresh_seed());
    g->gp.max_tokens = RLAI_DEFAULT_MAX_TOKENS;
    double v;
    bool has;
    if (!opt_number(r, body, "temperature", RLAI_LIM_TEMPERATURE_MIN, RLAI_LIM_TEMPERATURE_MAX, &v, &has))
        return false;
    if (has)
        s->temperature = (float)v;
    if (!opt_number(r, body, "top_p", RLAI_LIM_TOP_P_MIN, RLAI_LIM_TOP_P_MAX, &v, &has))
        return false;
    if (has)
        s->top_p = v > 0 ? (float)v : 1e-6f;
    if (!opt_number(r, body, "presence_penalty", RLAI_LIM_PENALTY_MIN, RLAI_LIM_PENALTY_MAX, &v, &has))
        return false;
    if (has)
        s->presence_penalty = (float)v;
    if (!opt_number(r, body, "frequency_penalty", RLAI_LIM_PENALTY_MIN, RLAI_LIM_PENALTY_MAX, &v, &has))
        return false;
    if (has)
        s->frequency_penalty = (float)v;
    /* Extensions (llama.cpp-style). */
    if (!opt_number(r, body, "min_p", RLAI_LIM_MIN_P_MIN, RLAI_LIM_MIN_P_MAX, &v, &has))
        return false;
    if (has)
        s->min_p = (float)v;
    if (!opt_number(r, body, "repeat_penalty", RLAI_LIM_REPEAT_PENALTY_MIN, RLAI_LIM_REPEAT_PENALTY_MAX, &v, &has))
        return false;
    if (has)
        s->repeat_penalty = (float)v;
    const cJSON *it;
    if ((it = cJSON_GetObjectItemCaseSensitive(body, "top_k")) && !cJSON_IsNull(it)) {
        if (!json_is_int(it) || it->valuedouble < RLAI_LIM_TOP_K_MIN || it->valuedouble > RLAI_LIM_TOP_K_MAX)
            return send_error(r, 400, "invalid_value", "top_k", "'top_k' must be a non-negative integer"), false;
        s->top_k = (int)it->valuedouble;
    }
    if ((it = cJSON_GetObjectItemCaseSensitive(body, "seed")) && !cJSON_IsNull(it)) {
        /* From the body text: a double would round 64-bit seeds. */
        uint64_t seed = 0;
        if (!cJSON_IsNumber(it) || rlai_json_find_int(r->body.p, r->body.len, "seed", &seed, NULL) != 1)
            return send_error(r, 400, "invalid_value", "seed",
                              "'seed' must be an integer in [-9223372036854775808, 18446744073709551615]"), false;
        s->seed = seed;
    }
    if (!parse_logit_bias(r, body, g))
        return false;
    /* Extension: wall-clock limit (finish_reason "timeout" when it ends one). */
    if ((it = cJSON_GetObjectItemCaseSensitive(body, "timeout_ms")) && !cJSON_IsNull(it)) {
        if (!json_is_int(it) || it->valuedouble < 0 || it->valuedouble > 4294967295.0)
            return send_error(r, 400, "invalid_value", "timeout_ms",
                              "'timeout_ms' must be an integer in [0, 4294967295] (0 = none)"), false;
        g->gp.timeout_ms = (uint64_t)it->valuedouble;
    }
    g->gp.timeout_ms = rlai_config_timeout_ms(g->gp.timeout_ms, r->h->request_timeout_s);
    /* Extension: speculative decoding per request (docs/SPECULATIVE.md). */
    if ((it = cJSON_GetObjectItemCaseSensitive(body, "spec")) && !cJSON_IsNull(it)) {
        int mode = cJSON_IsString(it) ? rlai_spec_mode_parse(it->valuestring) : RLAI_ERR_INVALID_ARG;
        if (mode < 0)
            return send_error(r, 400, "invalid_value", "spec", "'spec' %s", rlai_spec_mode_error(mode)), false;
        g->gp.spec = (rlai_spec_mode)mode;
    }
    if ((it = cJSON_GetObjectItemCaseSensitive(body, "spec_max_draft")) && !cJSON_IsNull(it)) {
        if (!json_is_int(it) || it->valuedouble < RLAI_LIM_SPEC_MAX_DRAFT_MIN || it->valuedouble > RLAI_LIM_SPEC_MAX_DRAFT_MAX)
            return send_error(r, 400, "invalid_value", "spec_max_draft",
                              "'spec_max_draft' must be an integer in [1, 16]"), false;
        g->gp.spec_max_draft = (int)it->valuedouble;
    }
    const char *mt_key = "max_completion_tokens";
    it = cJSON_GetObjectItemCaseSensitive(body, mt_key);
    if (!it || cJSON_IsNull(it)) {
        mt_key = "max_tokens";
        it = cJSON_GetObjectItemCaseSensitive(body, mt_key);
    }
    if (it && !cJSON_IsNull(it)) {
        /* completions "echo" with max_tokens 0: the prompt alone (scoring
         * a text with logprobs); the engine samples one token, dropped */
        bool zero_ok = r->kind == K_COMPLETION && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(body, "echo"));
        if (!json_is_int(it) || it->valuedouble < (zero_ok ? 0 : 1) || it->valuedouble > r->h->n_ctx)
            return send_error(r, 400, "invalid_value", mt_key, "'%s' must be an integer in [%d, %d]%s", mt_key,
                              zero_ok ? 0 : 1, r->h->n_ctx, zero_ok ? "" : " (0 only with completions' echo)"),
                   false;
        r->score_only = it->valuedouble == 0;
        g->gp.max_tokens = r->score_only ? 1 : (int)it->valuedouble;
    }
    int n_stop = 0;
    it = cJSON_GetObjectItemCaseSensitive(body, "stop");
    if (it && !cJSON_IsNull(it)) {
        if (cJSON_IsString(it)) {
            if (it->valuestring[0])
                g->stops[n_stop++] = it->valuestring;
        } else if (cJSON_IsArray(it)) {
            const cJSON *e;
            cJSON_ArrayForEach(e, it) {
                if (!cJSON_IsString(e) || !e->valuestring[0] || strlen(e->valuestring) > MAX_STOP_LEN)
                    return send_error(r, 400, "invalid_value", "stop",
                                      "'stop' entries must be non-empty strings of at most %d bytes",
                                      MAX_STOP_LEN), false;
                if (n_stop == MAX_STOPS)
                    return send_error(r, 400, "invalid_value", "stop", "at most %d stop strings", MAX_STOPS), false;
                g->stops[n_stop++] = e->valuestring;
            }
        } else {
            return send_error(r, 400, "invalid_type", "stop", "'stop' must be a string or an array of strings"),
                   false;
        }
        if (cJSON_IsString(it) && strlen(it->valuestring) > MAX_STOP_LEN)
            return send_error(r, 400, "invalid_value", "stop", "a stop string may have at most %d bytes",
                              MAX_STOP_LEN), false;
    }
    g->stops[n_stop] = NULL;
    g->gp.stop = n_stop ? g->stops : NULL;
    if ((it = cJSON_GetObjectItemCaseSensitive(body, "n")) && !cJSON_IsNull(it)) {
        if (!json_is_int(it) || it->valuedouble < 1 || it->valuedouble > MAX_CHOICES)
            return send_error(r, 400, "invalid_value", "n", "'n' must be an integer in [1, %d]", MAX_CHOICES), false;
        g->n = (int)it->valuedouble;
    }
    if ((it = cJSON_GetObjectItemCaseSensitive(body, "best_of")) && !cJSON_IsNull(it) &&
        !(json_is_int(it) && it->valuedouble == 1))
        return send_error(r, 400, "unsupported_value", "best_of", "only best_of = 1 is supported"), false;
    if (!parse_logprobs_echo(r, body, g) || !parse_prediction(r, body, g))
        return false;
    const char *no_tools[] = { "tools", "functions" };
    for (size_t i = 0; i < 2 && r->kind != K_CHAT; i++) {
        it = cJSON_GetObjectItemCaseSensitive(body, no_tools[i]);
        if (it && cJSON_IsArray(it) && cJSON_GetArraySize(it) > 0)
            return send_error(r, 400, "unsupported_value", no_tools[i],
                              "'%s' (function calling) is supported on /v1/chat/completions only", no_tools[i]), false;
    }
    /* Structured output (host/tools.c, docs/STRUCTURED.md). */
    char ferr[300] = "";
    if (rlai_response_format_grammar(cJSON_GetObjectItemCaseSensitive(body, "response_format"), &g->grammar, ferr,
                                     sizeof(ferr)) < 0)
        return send_error(r, 400, "invalid_value", "response_format", "%s", ferr), false;
    g->gp.grammar = g->grammar;
    if (g->grammar) {                     /* an upstream is given the text, not the mask */
        free(r->rf_json);
        r->rf_json = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(body, "response_format"));
    }
    it = cJSON_GetObjectItemCaseSensitive(body, "ignore_eos");   /* extension */
    if (it && !cJSON_IsNull(it) && !cJSON_IsBool(it))
        return send_error(r, 400, "invalid_type", "ignore_eos", "'ignore_eos' must be a boolean"), false;
    g->gp.ignore_eos = cJSON_IsTrue(it);
    it = cJSON_GetObjectItemCaseSensitive(body, "stream");
    if (it && !cJSON_IsNull(it) && !cJSON_IsBool(it))
        return send_error(r, 400, "invalid_type", "stream", "'stream' must be a boolean"), false;
    r->stream = cJSON_IsTrue(it);
    it = cJSON_GetObjectItemCaseSensitive(body, "stream_options");
    if (it && cJSON_IsObject(it))
        r->include_usage = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(it, "include_usage"));
    return true;
}

/* Checks "model": the local model (its id or "default") or, when
 * allow_chat_models, a chat model a plugin offers (*chat_model set to the
 * name). Returns false after answering 404/400. */
static bool check_model(hreq *r, const cJSON *body, bool allow_chat_models, const char **chat_model)
{
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(body, "model");
    *chat_model = NULL;
    /* Extension: where it runs (docs/REMOTE.md) */
    const cJSON *rt = cJSON_GetObjectItemCaseSensitive(body, "route");
    if (rt && !cJSON_IsNull(rt)) {
        if (!cJSON_IsString(rt) || strlen(rt->valuestring) > 256)
            return send_error(r, 400, "invalid_type", "route",
                              "'route' must be \"auto\", \"local\", \"remote\" or an upstream's name"), false;
        free(r->route);
        r->route = strdup(rt->valuestring);
    }
    if (!m || cJSON_IsNull(m)) {
        r->model = strdup(r->h->model_id);
        return true;
    }
    if (!cJSON_IsString(m))
        return send_error(r, 400, "invalid_type", "model", "'model' must be a string"), false;
    const char *v = m->valuestring;
    if (allow_chat_models && strchr(v, '/') && strcmp(v, r->h->model_id) != 0 &&
        !rlai_router_is_remote_model(r->h->router, v))
        *chat_model = v;   /* looked up by plugin_chat */
    else if (strcmp(v, r->h->model_id) != 0 && strcmp(v, "default") != 0 &&
             !rlai_router_is_remote_model(r->h->router, v))
        return send_error(r, 404, "model_not_found", "model",
                          "The model '%.200s' does not exist: this server serves '%s' (also reachable as 'default')%s",
                          v, r->h->model_id,
                          rlai_router_n_remote_models(r->h->router) ? " and the remote models of /v1/models" : ""),
               false;
    r->model = strdup(v);
    return true;
}

/* The request will run on an upstream for sure: a remote model, or the
 * local one with "route" naming an upstream or "remote" (a spill by
 * policy is decided later, by the router). */
static bool bound_remote(const hreq *r)
{
    if (r->route && !strcmp(r->route, "local"))
        return false;
    return (r->route && strcmp(r->route, "auto")) || rlai_router_is_remote_model(r->h->router, r->model);
}

/* Text of one message's content: a string or an array of text parts
 * ({"type": "text", "text": "..."}). Content is required, except on an
 * assistant turn that made tool calls (may_omit). *out malloc'd. Returns
 * false after answering 400 (param "messages[i].content"). */
static bool content_text(hreq *r, const cJSON *content, int idx, bool may_omit, char **out)
{
    rlai_strbuf b = { 0 };
    char param[48];
    snprintf(param, sizeof(param), "messages[%d].content", idx);
    if (!content || cJSON_IsNull(content)) {
        if (may_omit) {
            *out = strdup("");
            return true;
        }
        send_error(r, 400, "invalid_value", param, "messages[%d] has no 'content' (a string or an array of text parts)",
                   idx);
        return false;
    }
    if (cJSON_IsString(content)) {
        *out = strdup(content->valuestring);
        return true;
    }
    if (cJSON_IsArray(content)) {
        const cJSON *part;
        cJSON_ArrayForEach(part, content) {
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(part, "type");
            const cJSON *tx = cJSON_GetObjectItemCaseSensitive(part, "text");
            if (cJSON_IsObject(part) && cJSON_IsString(t) && !strcmp(t->valuestring, "image_url") && bound_remote(r)) {
                /* the upstream gets the messages as they are (docs/REMOTE.md "Images") */
                const cJSON *iu = cJSON_GetObjectItemCaseSensitive(part, "image_url");
                const cJSON *url = cJSON_IsObject(iu) ? cJSON_GetObjectItemCaseSensitive(iu, "url") : NULL;
                if (!cJSON_IsString(url) || !url->valuestring[0]) {
                    rlai_strbuf_free(&b);
                    send_error(r, 400, "invalid_value", param, "messages[%d]: an image_url part needs 'image_url.url'",
                               idx);
                    return false;
                }
                r->image_parts = true;
                continue;
            }
            if (!cJSON_IsObject(part) || !cJSON_IsString(t) || strcmp(t->valuestring, "text") != 0) {
                rlai_strbuf_free(&b);
                send_error(r, 400, "unsupported_value", param,
                           "messages[%d]: only text content parts are supported (image_url parts go to remote "
                           "models only, docs/REMOTE.md)", idx);
                return false;
            }
            if (!cJSON_IsString(tx)) {
                rlai_strbuf_free(&b);
                send_error(r, 400, "invalid_value", param, "messages[%d]: a text part needs a string 'text'", idx);
                return false;
            }
            if (rlai_strbuf_str(&b, tx->valuestring) < 0) {
                rlai_strbuf_free(&b);
                send_error(r, 500, NULL, NULL, "out of memory");
                return false;
            }
        }
        *out = b.p ? b.p : strdup("");
        return true;
    }
    send_error(r, 400, "invalid_type", param, "messages[%d].content must be a string or an array of text parts", idx);
    return false;
}

typedef struct chat_msgs {
    rlai_chat_message *m;
    char **texts;
    int n;
} chat_msgs;

static void chat_msgs_free(chat_msgs *c)
{
    for (int i = 0; i < c->n; i++)
        free(c->texts[i]);
    free(c->texts);
    free(c->m);
    memset(c, 0, sizeof(*c));
}

static bool parse_messages(hreq *r, const cJSON *body, chat_msgs *out)
{
    memset(out, 0, sizeof(*out));
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(body, "messages");
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0)
        return send_error(r, 400, "invalid_value", "messages", "'messages' must be a non-empty array"), false;
    int n = cJSON_GetArraySize(msgs);
    out->m = calloc((size_t)n, sizeof(*out->m));
    out->texts = calloc((size_t)n, sizeof(char *));
    if (!out->m || !out->texts) {
        chat_msgs_free(out);
        return send_error(r, 500, NULL, NULL, "out of memory"), false;
    }
    const cJSON *e;
    cJSON_ArrayForEach(e, msgs) {
        int i = out->n;
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(e, "role");
        if (!cJSON_IsObject(e) || !cJSON_IsString(role)) {
            chat_msgs_free(out);
            char param[48];
            snprintf(param, sizeof(param), "messages[%d].role", i);
            return send_error(r, 400, "invalid_value", param, "messages[%d] needs a string 'role'", i), false;
        }
        const char *rl = role->valuestring;
        if (!strcmp(rl, "developer"))
            rl = "system";
        if (strcmp(rl, "system") && strcmp(rl, "user") && strcmp(rl, "assistant") && strcmp(rl, "tool")) {
            chat_msgs_free(out);
            return send_error(r, 400, "unsupported_value", "messages",
                              "messages[%d]: role '%.40s' is not supported (system, developer, user, assistant, tool)",
                              i, role->valuestring), false;
        }
        const cJSON *calls = cJSON_GetObjectItemCaseSensitive(e, "tool_calls");
        bool may_omit = !strcmp(rl, "assistant") && cJSON_IsArray(calls) && cJSON_GetArraySize(calls) > 0;
        if (!content_text(r, cJSON_GetObjectItemCaseSensitive(e, "content"), i, may_omit, &out->texts[i])) {
            chat_msgs_free(out);
            return false;
        }
        if (out->texts[i] && (!strcmp(rl, "tool") || may_omit)) {
            /* tool results and earlier calls as text (host/tools.c) */
            char *t = rlai_tools_message_text(msgs, e, rl, out->texts[i], &rl);
            free(out->texts[i]);
            out->texts[i] = t;
        }
        if (!out->texts[i]) {
            chat_msgs_free(out);
            return send_error(r, 500, NULL, NULL, "out of memory"), false;
        }
        out->m[i].role = rl;
        out->m[i].content = out->texts[i];
        out->n++;
    }
    return true;
}

static void make_id(hreq *r, const char *prefix)
{
    uint64_t seq = atomic_fetch_add(&r->h->seq, 1);
    uint64_t x = seq * 0x9E3779B97F4A7C15ull ^ (uint64_t)time(NULL) * 0xD6E8FEB86659FD93ull;
    snprintf(r->id, sizeof(r->id), "%s%016llx%04llx", prefix, (unsigned long long)x,
             (unsigned long long)(seq & 0xffff));
}

/* The HTTP answer to a refused submit (rlai_router_submit). what names the
 * prompt (its JSON field); n_prompt is what the router counted (-1: the
 * prompt could not be built). */
static enum MHD_Result send_submit_error(hreq *r, int rc, int n_prompt, const char *err, const char *what,
                                         const char *sub)
{
    rlai_http *h = r->h;
    const char *code;
    int st = status_of(rc, &code);
    if (n_prompt == RLAI_ROUTER_REFUSED_REMOTE)      /* the routing decision or an upstream said why */
        return send_error(r, st, code, rc == RLAI_ERR_INVALID_ARG ? "route" : NULL, "%s%s", sub, err);
    if (rc == RLAI_ERR_TOO_LARGE && !strncmp(err, "prediction ", 11))   /* rlai_engine_submit_text's */
        return send_error(r, 413, "invalid_value", "prediction", "%s%s", sub, err);
    if (rc == RLAI_ERR_TOO_LARGE && n_prompt > 0)
        return send_error(r, 400, "context_length_exceeded", what,
                          "%sThis model's maximum prompt length is %d tokens; the prompt has %d tokens", sub,
                          h->max_prompt_tokens, n_prompt);
    if (rc == RLAI_ERR_INVALID_ARG && n_prompt == 0)
        return send_error(r, 400, "invalid_value", what, "%sthe prompt is empty", sub);
    if (rc == RLAI_ERR_INVALID_ARG && n_prompt < 0 && r->kind == K_CHAT)
        return send_error(r, 400, "invalid_value", what, "the chat template refused these messages: %s", err);
    if (n_prompt < 0)
        return send_error(r, st, code, what, "%scannot tokenize the %s: %s", sub, what, err);
    if (rc == RLAI_ERR_BUSY)
        return send_error(r, 429, "rate_limit_exceeded", NULL, "%sthe engine's queue is full; retry later", sub);
    if (rc == RLAI_ERR_KV_FULL)
        return send_error(r, 400, "context_length_exceeded", NULL,
                          "%sthe prompt plus max_tokens can never fit the KV cache: %s", sub, rlai_strerror(rc));
    return send_error(r, st, code, NULL, "%sengine refused the request: %s", sub, err);
}

/* Submits a generation through the router (the one request path of the
 * host: template, tokenize, prompt limit) and answers (stream or
 * blocking). rq holds the prompt (messages, text or token ids). */
static enum MHD_Result run_generation(hreq *r, rlai_route_request *rq, gen_request *g)
{
    rlai_http *h = r->h;
    int rc = track(h, r);
    if (rc == RLAI_ERR_BUSY)
        return send_error(r, 429, "rate_limit_exceeded", NULL, "too many requests in flight (limit %d); retry later",
                          h->max_inflight);
    if (rc < 0)
        return send_error(r, 503, "shutdown", NULL, "server shutting down");
    rlai_request_params *rp = &rq->text.rp;
    rq->text.max_prompt_tokens = h->max_prompt_tokens;
    rq->model = r->model;
    rq->route = r->route;
    if (!rq->response_format)
        rq->response_format = r->rf_json;
    rq->on_error = gen_on_error;
    rp->gen = g->gp;
    if (r->lp_mode) {
        rp->gen.on_logprobs = gen_on_logprobs;
        rp->gen.logprobs_user = r;
        rq->on_remote_logprobs = gen_on_remote_logprobs;
    }
    rp->on_token = gen_on_token;
    rp->on_done = gen_on_done;
    rp->user = r;
    hreq_ref(r);                       /* the engine's reference, dropped in gen_on_done */
    uint64_t eid = 0;
    int n_prompt = -1;
    char err[256];
    rc = rlai_router_submit(h->router, rq, &eid, &n_prompt, err, sizeof(err));
    if (rc < 0) {
        untrack(h, r);
        hreq_unref(r);
        return send_submit_error(r, rc, n_prompt, err, r->kind == K_CHAT ? "messages" : "prompt", "");
    }
    pthread_mutex_lock(&r->mu);
    r->engine_id = eid;
    bool cancel = r->why != END_NONE && !r->done;
    pthread_mutex_unlock(&r->mu);
    if (cancel)
        rlai_router_cancel(h->router, eid);
    return r->stream ? start_stream(r) : finish_blocking(r);
}

/* Starts a plugin call with r's sink and answers (stream or blocking). */
static enum MHD_Result run_call(hreq *r, const char *command, const char *params_json, int timeout_ms)
{
    rlai_http *h = r->h;
    int rc = track(h, r);
    if (rc == RLAI_ERR_BUSY)
        return send_error(r, 429, "rate_limit_exceeded", NULL, "too many requests in flight (limit %d); retry later",
                          h->max_inflight);
    if (rc < 0)
        return send_error(r, 503, "shutdown", NULL, "server shutting down");
    rlai_call_sink sink = { sink_token, sink_result, sink_done, sink_error, r };
    char err[300] = "";
    uint64_t cid = 0;
    hreq_ref(r);                       /* the call's reference, dropped in sink_end */
    rc = rlai_plugin_host_call_timed(h->plugins, command, params_json, timeout_ms, &sink, &cid, err, sizeof(err));
    if (rc < 0) {
        untrack(h, r);
        hreq_unref(r);
        const char *code;
        int st = status_of(rc, &code);
        if (rc == RLAI_ERR_NOT_FOUND)
            code = r->kind == K_PLUGIN_CHAT ? "model_not_found" : "command_not_found";
        return send_error(r, st, code, NULL, "%s", err[0] ? err : rlai_strerror(rc));
    }
    pthread_mutex_lock(&r->mu);
    r->call_id = cid;
    bool cancel = r->why != END_NONE && !r->done;
    pthread_mutex_unlock(&r->mu);
    if (cancel)
        rlai_plugin_host_cancel(h->plugins, cid);
    return r->stream ? start_stream(r) : finish_blocking(r);
}

/* ---------------------------------------------------------- endpoints */

/* Scans the strings of a JSON text (already known to be UTF-8) for what
 * cJSON would accept but the wire protocol refuses: a \u0000 escape (cJSON
 * ends the string there, silently dropping the rest) and raw control
 * characters. Returns 0, 1 (\u0000 at *at) or 2 (control byte at *at). */
static int scan_strings(const char *p, size_t n, size_t *at)
{
    bool in = false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (!in) {
            if (c == '"')
                in = true;
            continue;
        }
        if (c == '"') {
            in = false;
        } else if (c < 0x20) {
            *at = i;
            return 2;
        } else if (c == '\\' && i + 1 < n) {
            if (p[i + 1] == 'u' && i + 5 < n && !memcmp(p + i + 2, "0000", 4)) {
                *at = i;
                return 1;
            }
            i++;                       /* the escaped character */
        }
    }
    return 0;
}

/* Parses the request body as strictly as the wire protocol decodes frames:
 * valid UTF-8, no NUL in strings, exactly one JSON object and nothing but
 * whitespace after it. Answers 400 and returns NULL otherwise. */
static cJSON *parse_body(hreq *r)
{
    if (!r->body.len) {
        send_error(r, 400, "invalid_json", NULL, "the request body is empty (expected a JSON object)");
        return NULL;
    }
    size_t bad = utf8_bad_at(r->body.p, r->body.len);
    if (bad < r->body.len) {
        send_error(r, 400, "invalid_encoding", NULL, "the request body is not valid UTF-8 (byte %zu)", bad);
        return NULL;
    }
    size_t at = 0;
    int sc = scan_strings(r->body.p, r->body.len, &at);
    if (sc == 1) {
        send_error(r, 400, "invalid_value", NULL,
                   "a string in the request body contains \\u0000 (NUL) at byte %zu; NUL is not allowed", at);
        return NULL;
    }
    if (sc == 2) {
        send_error(r, 400, "invalid_json", NULL,
                   "the request body is not valid JSON (control character inside a string at byte %zu)", at);
        return NULL;
    }
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(r->body.p, r->body.len, &end, false);
    if (!j) {
        size_t pos = end && end >= r->body.p ? (size_t)(end - r->body.p) : 0;
        send_error(r, 400, "invalid_json", NULL, "the request body is not valid JSON (error near byte %zu)", pos);
        return NULL;
    }
    size_t pos = end && end >= r->body.p ? (size_t)(end - r->body.p) : r->body.len;
    while (pos < r->body.len && strchr(" \t\r\n", r->body.p[pos]) && r->body.p[pos])
        pos++;
    if (pos < r->body.len) {
        cJSON_Delete(j);
        send_error(r, 400, "invalid_json", NULL,
                   "the request body is not valid JSON (unexpected data after the JSON value at byte %zu)", pos);
        return NULL;
    }
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        send_error(r, 400, "invalid_json", NULL, "the request body must be a JSON object");
        return NULL;
    }
    return j;
}

/* Chat with a plugin's chat model (register_chat_model, ABI 1.2): its
 * command is called with the model's fixed params plus the last user
 * message, a session (from "session" or "user") and the sampling fields
 * of the contract. by_id: `model` is an id alone (the "character" field). */
static enum MHD_Result plugin_chat(hreq *r, const cJSON *body, const char *model, bool by_id, const chat_msgs *cm)
{
    if (!r->h->plugins)
        return send_error(r, 404, "model_not_found", "model",
                          "The model '%.200s' does not exist: no plugins are loaded", model);
    char *full = NULL, *command = NULL;
    cJSON *p = NULL;
    int lrc = rlai_plugin_host_chat_model(r->h->plugins, model, by_id, &full, &command, &p);
    if (lrc == RLAI_ERR_NOT_FOUND)
        return send_error(r, 404, "model_not_found", by_id ? "character" : "model",
                          "The model '%.200s' does not exist (GET /v1/models lists the chat models)", model);
    if (lrc < 0)
        return send_error(r, 500, NULL, NULL, "out of memory");
    free(r->model);
    r->model = full;
    const char *last = NULL;
    for (int i = cm->n - 1; i >= 0 && !last; i--)
        if (!strcmp(cm->m[i].role, "user"))
            last = cm->m[i].content;
    if (!last) {
        free(command);
        cJSON_Delete(p);
        return send_error(r, 400, "invalid_value", "messages", "a chat with '%s' needs a user message", r->model);
    }
    cJSON_DeleteItemFromObjectCaseSensitive(p, "message");
    cJSON_AddStringToObject(p, "message", last);
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(body, "session");
    if (!cJSON_IsString(s))
        s = cJSON_GetObjectItemCaseSensitive(body, "user");
    if (cJSON_IsString(s) && s->valuestring[0]) {
        cJSON_DeleteItemFromObjectCaseSensitive(p, "session");
        cJSON_AddStringToObject(p, "session", s->valuestring);
    }
    const char *pass[] = { "max_tokens", "temperature" };
    for (size_t i = 0; i < sizeof(pass) / sizeof(pass[0]); i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(body, pass[i]);
        if (cJSON_IsNumber(v)) {
            cJSON_DeleteItemFromObjectCaseSensitive(p, pass[i]);
            cJSON_AddNumberToObject(p, pass[i], v->valuedouble);
        }
    }
    char seed_text[24];   /* the seed's exact text (a double would round it) */
    if (cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(body, "seed")) &&
        rlai_json_find_int_text(r->body.p, r->body.len, "seed", seed_text, sizeof(seed_text)) == 1) {
        cJSON_DeleteItemFromObjectCaseSensitive(p, "seed");
        cJSON_AddRawToObject(p, "seed", seed_text);
    }
    const cJSON *mct = cJSON_GetObjectItemCaseSensitive(body, "max_completion_tokens");
    if (cJSON_IsNumber(mct)) {
        cJSON_DeleteItemFromObjectCaseSensitive(p, "max_tokens");
        cJSON_AddNumberToObject(p, "max_tokens", mct->valuedouble);
    }
    char *pj = cJSON_PrintUnformatted(p);
    cJSON_Delete(p);
    if (!pj) {
        free(command);
        return send_error(r, 500, NULL, NULL, "out of memory");
    }
    r->kind = K_PLUGIN_CHAT;
    enum MHD_Result rc = run_call(r, command, pj, 0);
    free(pj);
    free(command);
    return rc;
}

/* tools / tool_choice: the tools' description joins the system turn and
 * the call grammar constrains the reply. Returns false after a 400. */
static bool chat_tools(hreq *r, const cJSON *body, gen_request *g, chat_msgs *cm)
{
    char err[300] = "";
    const char *param = "tools";
    if (rlai_tools_parse(body, &r->tools, err, sizeof(err), &param) < 0)
        return send_error(r, 400, "invalid_value", param, "%s", err), false;
    if (r->tools.mode == RLAI_TOOLS_OFF)
        return true;
    if (g->grammar)
        return send_error(r, 400, "unsupported_value", "response_format",
                          "response_format json_object / json_schema together with tools is not supported"), false;
    g->gp.grammar = r->tools.grammar;
    bool has_sys = cm->n > 0 && !strcmp(cm->m[0].role, "system");
    size_t need = strlen(r->tools.system) + (has_sys ? strlen(cm->texts[0]) + 2 : 0) + 1;
    char *sys = malloc(need);
    rlai_chat_message *nm = has_sys ? cm->m : realloc(cm->m, sizeof(*nm) * (size_t)(cm->n + 1));
    char **nt = has_sys ? cm->texts : realloc(cm->texts, sizeof(char *) * (size_t)(cm->n + 1));
    if (nm)
        cm->m = nm;
    if (nt)
        cm->texts = nt;
    if (!sys || !nm || !nt) {
        free(sys);
        return send_error(r, 500, NULL, NULL, "out of memory"), false;
    }
    if (has_sys) {
        snprintf(sys, need, "%s\n\n%s", cm->texts[0], r->tools.system);
        free(cm->texts[0]);
    } else {
        memmove(cm->m + 1, cm->m, sizeof(*nm) * (size_t)cm->n);
        memmove(cm->texts + 1, cm->texts, sizeof(char *) * (size_t)cm->n);
        cm->n++;
        snprintf(sys, need, "%s", r->tools.system);
    }
    cm->texts[0] = sys;
    cm->m[0].role = "system";
    cm->m[0].content = sys;
    return true;
}

/* tools for a remote model (docs/REMOTE.md): "tools", "tool_choice" and
 * "parallel_tool_calls" and the messages go to the upstream as they are,
 * and its streamed call fragments come back (gen_on_remote_tool_calls);
 * the local tool prompt and grammar are not used. Sets *fwd and *msgs
 * (malloc'd JSON text, NULL when this is not such a request). Returns
 * false after a 400 / 500. */
static bool remote_tools(hreq *r, const cJSON *body, rlai_route_request *rq, char **fwd, char **msgs)
{
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(body, "tools");
    bool with_tools = tools && !cJSON_IsNull(tools);
    if (r->image_parts && !with_tools) {     /* images alone: the messages as they are */
        if (!(*msgs = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(body, "messages"))))
            return send_error(r, 500, NULL, NULL, "out of memory"), false;
        rq->messages_json = *msgs;
        return true;
    }
    if (!with_tools || !bound_remote(r))   /* a spill by policy keeps the local tools */
        return true;
    if (!cJSON_IsArray(tools))
        return send_error(r, 400, "invalid_type", "tools", "'tools' must be an array"), false;
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(body, "functions");
    if (fn && !cJSON_IsNull(fn))
        return send_error(r, 400, "unsupported_value", "functions",
                          "'functions' is not forwarded to remote models; use 'tools'"), false;
    cJSON *o = cJSON_CreateObject();
    const char *keys[] = { "tools", "tool_choice", "parallel_tool_calls" };
    for (int i = 0; o && i < 3; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(body, keys[i]);
        if (v && !cJSON_IsNull(v))
            cJSON_AddItemToObject(o, keys[i], cJSON_Duplicate(v, 1));
    }
    *fwd = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    *msgs = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(body, "messages"));
    if (!*fwd || !*msgs)
        return send_error(r, 500, NULL, NULL, "out of memory"), false;
    rq->forward_json = *fwd;
    rq->messages_json = *msgs;
    rq->on_remote_tool_calls = gen_on_remote_tool_calls;
    return true;
}

static enum MHD_Result chat_multi(hreq *r, const chat_msgs *cm, gen_request *g);

static enum MHD_Result chat_completions(hreq *r)
{
    r->kind = K_CHAT;
    cJSON *body = parse_body(r);
    if (!body)
        return MHD_YES;
    gen_request g;
    memset(&g, 0, sizeof(g));
    const char *chat_model = NULL;
    chat_msgs cm = { 0 };
    char *fwd = NULL, *raw_msgs = NULL;
    enum MHD_Result ret = MHD_YES;
    if (!check_model(r, body, true, &chat_model) || !parse_sampling(r, body, &g) || !parse_messages(r, body, &cm))
        goto out;
    make_id(r, "chatcmpl-");
    /* "character": a chat model named by its id alone (extension). */
    const cJSON *ch = cJSON_GetObjectItemCaseSensitive(body, "character");
    if (g.n > 1 && ((ch && !cJSON_IsNull(ch)) || chat_model || r->image_parts)) {
        send_error(r, 400, "unsupported_value", "n", "n > 1 is not supported with %s",
                   r->image_parts ? "image content" : "plugin chat models");
        goto out;
    }
    if (ch && !cJSON_IsNull(ch)) {
        if (!cJSON_IsString(ch) || !ch->valuestring[0]) {
            send_error(r, 400, "invalid_type", "character", "'character' must be a non-empty string");
            goto out;
        }
        ret = plugin_chat(r, body, ch->valuestring, true, &cm);
        goto out;
    }
    if (chat_model) {
        ret = plugin_chat(r, body, chat_model, false, &cm);
        goto out;
    }
    /* Message content is never parsed for special tokens (role injection). */
    rlai_route_request rq;
    memset(&rq, 0, sizeof(rq));
    if (!remote_tools(r, body, &rq, &fwd, &raw_msgs) || (!fwd && !chat_tools(r, body, &g, &cm)))
        goto out;
    if (g.n > 1) {
        if (fwd)        /* a remote model's tools: its calls stream back per request (one choice) */
            send_error(r, 400, "unsupported_value", "n", "n > 1 is not supported with tools on a remote model");
        else
            ret = chat_multi(r, &cm, &g);
        goto out;
    }
    rq.text.messages = cm.m;
    rq.text.n_messages = cm.n;
    ret = run_generation(r, &rq, &g);
out:
    free(fwd);
    free(raw_msgs);
    chat_msgs_free(&cm);
    rlai_grammar_unref(g.grammar);
    cJSON_Delete(body);
    return ret;
}

static enum MHD_Result completions_multi(hreq *r, const cJSON *p, gen_request *g);

static enum MHD_Result completions(hreq *r)
{
    r->kind = K_COMPLETION;
    cJSON *body = parse_body(r);
    if (!body)
        return MHD_YES;
    gen_request g;
    memset(&g, 0, sizeof(g));
    const char *character;
    enum MHD_Result ret = MHD_YES;
    rlai_token *toks = NULL;
    int n = 0;
    if (!check_model(r, body, false, &character) || !parse_sampling(r, body, &g))
        goto out;
    make_id(r, "cmpl-");
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(body, "prompt");
    /* One prompt: a string, [string], [token ids] or [[token ids]]. */
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 &&
        (cJSON_IsString(p->child) || cJSON_IsArray(p->child)))
        p = p->child;
    if (cJSON_IsString(p)) {
        /* tokenized by the router */
    } else if (cJSON_IsArray(p) && cJSON_GetArraySize(p) > 0 && cJSON_IsNumber(p->child)) {
        int cap = cJSON_GetArraySize(p);
        rlai_model_info info;
        rlai_engine_info(r->h->engine, &info);
        toks = malloc(sizeof(rlai_token) * (size_t)cap);
        if (!toks) {
            send_error(r, 500, NULL, NULL, "out of memory");
            goto out;
        }
        const cJSON *t;
        cJSON_ArrayForEach(t, p) {
            if (!json_is_int(t) || t->valuedouble < 0 || t->valuedouble >= info.n_vocab) {
                send_error(r, 400, "invalid_value", "prompt", "prompt token ids must be integers in [0, %d)",
                           info.n_vocab);
                goto out;
            }
            toks[n++] = (rlai_token)t->valuedouble;
        }
    } else if (cJSON_IsArray(p) && cJSON_GetArraySize(p) > 1) {
        ret = completions_multi(r, p, &g);
        goto out;
    } else {
        send_error(r, 400, "invalid_value", "prompt", "'prompt' must be a string or an array of token ids");
        goto out;
    }
    if (g.n > 1) {                       /* n choices of one prompt: a list of one */
        cJSON *one = cJSON_CreateArray();
        cJSON *dup = cJSON_Duplicate(p, 1);
        if (!one || !dup || !cJSON_AddItemToArray(one, dup)) {
            cJSON_Delete(one);
            cJSON_Delete(dup);
            send_error(r, 500, NULL, NULL, "out of memory");
            goto out;
        }
        ret = completions_multi(r, one, &g);
        cJSON_Delete(one);
        goto out;
    }
    if (g.echo && (n > 0 || (cJSON_IsString(p) && p->valuestring[0]))) {
        /* The prompt as text: the string given, or the ids' text. */
        if (cJSON_IsString(p)) {
            r->echo_text = strdup(p->valuestring);
        } else {
            int len = rlai_engine_detokenize(r->h->engine, toks, n, true, NULL, 0);
            r->echo_text = len >= 0 ? malloc((size_t)len + 1) : NULL;
            if (r->echo_text)
                rlai_engine_detokenize(r->h->engine, toks, n, true, r->echo_text, (size_t)len + 1);
        }
        if (!r->echo_text) {
            send_error(r, 500, NULL, NULL, "out of memory");
            goto out;
        }
    }
    rlai_route_request rq;
    memset(&rq, 0, sizeof(rq));
    if (cJSON_IsString(p)) {
        rq.text.prompt = p->valuestring;
    } else {
        rq.text.rp.prompt = toks;
        rq.text.rp.n_prompt = n;
    }
    ret = run_generation(r, &rq, &g);
out:
    free(toks);
    rlai_grammar_unref(g.grammar);
    cJSON_Delete(body);
    return ret;
}


/* ---------------------------------------------------------- completions with a list prompt */

#define MAX_PROMPTS 16

/* A child request for one prompt of a list: collects that choice's text,
 * logprobs and metrics through the usual engine callbacks. */
static hreq *kid_new(hreq *r)
{
    hreq *k = calloc(1, sizeof(*k));
    if (!k)
        return NULL;
    k->h = r->h;
    k->fd = -1;
    k->refs = 1;                       /* the parent's */
    pthread_mutex_init(&k->mu, NULL);
    cond_init_monotonic(&k->cv);
    k->kind = r->kind == K_CHAT ? K_CHAT : K_COMPLETION;
    k->lp_mode = r->lp_mode;
    k->score_only = r->score_only;
    k->created = r->created;
    snprintf(k->id, sizeof(k->id), "%s", r->id);
    k->model = strdup(r->model ? r->model : "");
    k->route = r->route ? strdup(r->route) : NULL;        /* where each choice runs: the parent's */
    k->rf_json = r->rf_json ? strdup(r->rf_json) : NULL;  /* an upstream's response_format */
    if (r->tools.mode != RLAI_TOOLS_OFF) {                 /* each choice's call is read out of its text */
        k->tools.mode = r->tools.mode;
        k->tools.names = cJSON_Duplicate(r->tools.names, 1);
    }
    return k;
}

/* Submits one child's job through the router: chat messages (msgs,
 * n_msgs), a prompt string (text) or token ids (toks, n). Returns 0 or a
 * negative rlai_error with *n_prompt and err as rlai_router_submit. */
static int kid_submit(hreq *k, const rlai_chat_message *msgs, int n_msgs, const char *text, const rlai_token *toks,
                      int n, const rlai_gen_params *gp, int *n_prompt, char *err, size_t errlen)
{
    rlai_http *h = k->h;
    int rc = track(h, k);
    if (rc < 0) {
        snprintf(err, errlen, "%s", rlai_strerror(rc));
        return rc;
    }
    rlai_route_request rq;
    memset(&rq, 0, sizeof(rq));
    rq.text.messages = msgs;
    rq.text.n_messages = n_msgs;
    rq.text.prompt = text;
    rq.text.max_prompt_tokens = h->max_prompt_tokens;
    rq.model = k->model;
    rq.route = k->route;
    rq.response_format = k->rf_json;
    rq.on_error = gen_on_error;
    rlai_request_params *rp = &rq.text.rp;
    if (!text && !msgs) {
        rp->prompt = toks;
        rp->n_prompt = n;
    }
    rp->gen = *gp;
    if (k->lp_mode) {
        rp->gen.on_logprobs = gen_on_logprobs;
        rp->gen.logprobs_user = k;
        rq.on_remote_logprobs = gen_on_remote_logprobs;
    }
    rp->on_token = gen_on_token;
    rp->on_done = gen_on_done;
    rp->user = k;
    hreq_ref(k);
    uint64_t eid = 0;
    rc = rlai_router_submit(h->router, &rq, &eid, n_prompt, err, errlen);
    if (rc < 0) {
        untrack(h, k);
        hreq_unref(k);
        return rc;
    }
    pthread_mutex_lock(&k->mu);
    k->engine_id = eid;
    pthread_mutex_unlock(&k->mu);
    return 0;
}

static bool kids_done(hreq *r, bool *bad)
{
    bool all = true;
    *bad = false;
    for (int i = 0; i < r->n_kids; i++) {
        hreq *k = r->kids[i];
        pthread_mutex_lock(&k->mu);
        all = all && k->done;
        if (k->done && ended_badly(k))
            *bad = true;
        if (k->why == END_SHUTDOWN)
            *bad = true;
        pthread_mutex_unlock(&k->mu);
    }
    return all;
}

/* The first child that ended badly (for its error object). */
static hreq *kid_bad(hreq *r)
{
    for (int i = 0; i < r->n_kids; i++)
        if (r->kids[i]->done && ended_badly(r->kids[i]))
            return r->kids[i];
    return r->kids[0];
}

/* usage summed over the children (into r->gm) */
static void kids_usage(hreq *r)
{
    memset(&r->gm, 0, sizeof(r->gm));
    r->have_gm = true;
    for (int i = 0; i < r->n_kids; i++) {
        const rlai_gen_metrics *m = &r->kids[i]->gm;
        if (r->kids_per <= 1 || i % r->kids_per == 0) {   /* a prompt counts once, as OpenAI's n */
            r->gm.prompt_tokens += m->prompt_tokens;
            r->gm.reused_tokens += m->reused_tokens;
        }
        r->gm.gen_tokens += m->gen_tokens;
        r->gm.drafted_tokens += m->drafted_tokens;
        r->gm.accepted_tokens += m->accepted_tokens;
    }
}

/* Waits (connection thread) until every child is done or the client left. */
static bool kids_wait(hreq *r)
{
    bool bad;
    while (!kids_done(r, &bad) && !bad) {
        pthread_mutex_lock(&r->mu);
        struct timespec ts;
        deadline_in(&ts, WAIT_SLICE_MS);
        pthread_cond_timedwait(&r->cv, &r->mu, &ts);
        bool gone = r->why == END_GONE;
        pthread_mutex_unlock(&r->mu);
        if (gone || peer_check(r->fd) == PEER_GONE)
            return false;
    }
    return true;
}

/* One choice object of child i: its final body's choice, index i. */
static cJSON *kid_choice(hreq *k, int i)
{
    size_t el = k->echo_text ? strlen(k->echo_text) : 0;
    char *text = malloc(el + k->pending.len + 1);
    if (!text)
        return NULL;
    memcpy(text, k->echo_text ? k->echo_text : "", el);
    memcpy(text + el, k->pending.p ? k->pending.p : "", k->pending.len);
    text[el + k->pending.len] = 0;
    cJSON *body = final_body(k, text);
    free(text);
    cJSON *choices = cJSON_GetObjectItemCaseSensitive(body, "choices");
    cJSON *c = cJSON_DetachItemFromArray(choices, 0);
    cJSON_Delete(body);
    if (!c)
        return NULL;
    cJSON_ReplaceItemInObjectCaseSensitive(c, "index", cJSON_CreateNumber(i));
    attach_logprobs(k, c, true);
    return c;
}

static enum MHD_Result multi_blocking(hreq *r)
{
    if (!kids_wait(r)) {
        end_request(r, END_GONE);
        return MHD_NO;
    }
    bool bad;
    kids_done(r, &bad);
    if (bad) {
        hreq *k = kid_bad(r);
        const char *code;
        int st = k->done && k->status < 0 ? status_of(k->status, &code) : 503;
        cJSON *e = late_error(k);
        end_request(r, END_SHUTDOWN);
        return send_json(r, st, e);
    }
    kids_usage(r);
    cJSON *j = envelope(r, false);
    cJSON *choices = cJSON_AddArrayToObject(j, "choices");
    for (int i = 0; i < r->n_kids; i++) {
        cJSON *c = kid_choice(r->kids[i], i);
        if (!c) {
            cJSON_Delete(j);
            return send_error(r, 500, NULL, NULL, "out of memory");
        }
        cJSON_AddItemToArray(choices, c);
    }
    cJSON_AddItemToObject(j, "usage", usage_json(r));
    return send_json(r, 200, j);
}

/* Streaming: every chunk carries one choice (its "index"); each child ends
 * with its own finish_reason chunk, then usage (when asked) and [DONE]. */
static bool produce_multi(hreq *r)
{
    r->out.len = 0;
    r->opos = 0;
    if (r->phase == 2)
        return false;
    if (r->phase == 0) {
        r->phase = 1;
        for (int i = 0; i < r->n_kids; i++) {
            if (is_chat(r->kids[i]))            /* each choice's first delta names the role */
                sse_event(&r->out, NULL, at_index(chunk_json(r->kids[i], NULL, 0, true, NULL), i));
            if (echo_due(r->kids[i], false))
                sse_event(&r->out, NULL, echo_chunk(r->kids[i], i));
        }
        if (r->out.len)
            return true;
    }
    for (;;) {
        bool bad, all = kids_done(r, &bad);
        for (int i = 0; i < r->n_kids; i++) {
            hreq *k = r->kids[i];
            pthread_mutex_lock(&k->mu);
            rlai_strbuf text = k->pending;
            memset(&k->pending, 0, sizeof(k->pending));
            bool done = k->done;
            bool fin_due = done && !k->streamed;       /* streamed: here "finish sent" */
            if (fin_due)
                k->streamed = true;
            pthread_mutex_unlock(&k->mu);
            if (echo_due(k, text.len > 0 || done))
                sse_event(&r->out, NULL, echo_chunk(k, i));
            if (text.len)
                tool_hold(k, &text);             /* a call's text is kept back (tools) */
            if (fin_due && !bad && k->held.len) {
                if (text.len)                    /* text before the kept part, then the call */
                    sse_event(&r->out, NULL, at_index(chunk_json(k, text.p, text.len, false, NULL), i));
                rlai_strbuf_free(&text);
                tool_flush_to(k, &r->out, i);
            }
            if (text.len || (fin_due && !bad)) {
                cJSON *ch = at_index(chunk_json(k, text.len ? text.p : NULL, text.len, false,
                                                fin_due ? finish_reason(k) : NULL), i);
                attach_logprobs(k, first_choice(ch), false);
                sse_event(&r->out, NULL, ch);
            }
            rlai_strbuf_free(&text);
        }
        if (bad || all) {
            if (bad) {
                sse_event(&r->out, NULL, late_error(kid_bad(r)));
                end_request(r, END_SHUTDOWN);
            } else if (r->include_usage) {
                kids_usage(r);
                usage_event(r);
            }
            rlai_strbuf_str(&r->out, "data: [DONE]\n\n");
            r->phase = 2;
            return true;
        }
        if (r->out.len)
            return true;
        pthread_mutex_lock(&r->mu);
        struct timespec ts;
        deadline_in(&ts, WAIT_SLICE_MS);
        pthread_cond_timedwait(&r->cv, &r->mu, &ts);
        bool gone = r->why == END_GONE;
        pthread_mutex_unlock(&r->mu);
        if (gone || peer_check(r->fd) == PEER_GONE) {
            end_request(r, END_GONE);
            return false;
        }
    }
}

/* Chat with "n" > 1: n choices of the same messages, generated
 * concurrently (continuous batching; the prompt is prefilled once and
 * reused from the prefix cache); seeds seed, seed+1, ... Returns after
 * answering. */
static enum MHD_Result chat_multi(hreq *r, const chat_msgs *cm, gen_request *g)
{
    r->kids = calloc((size_t)g->n, sizeof(hreq *));
    if (!r->kids)
        return send_error(r, 500, NULL, NULL, "out of memory");
    r->kids_per = g->n;
    for (int k = 0; k < g->n; k++) {
        hreq *kid = kid_new(r);
        if (!kid) {
            end_request(r, END_GONE);
            return send_error(r, 500, NULL, NULL, "out of memory");
        }
        r->kids[r->n_kids++] = kid;
        rlai_gen_params gp = g->gp;
        gp.sampling.seed += (uint64_t)k;
        int n_prompt = -1;
        char err[256];
        int rc = kid_submit(kid, cm->m, cm->n, NULL, NULL, 0, &gp, &n_prompt, err, sizeof(err));
        if (rc < 0) {
            end_request(r, END_GONE);
            return send_submit_error(r, rc, n_prompt, err, "messages", "");
        }
    }
    return r->stream ? start_stream(r) : multi_blocking(r);
}

/* A list of prompts (strings or token-id lists): g->n choices per prompt
 * (OpenAI's order: prompt 0's choices, then prompt 1's, ...), generated
 * concurrently; seeds seed, seed+1, ... Returns after answering. */
static enum MHD_Result completions_multi(hreq *r, const cJSON *p, gen_request *g)
{
    int n = cJSON_GetArraySize(p), per = g->n > 1 ? g->n : 1;
    if (n > MAX_PROMPTS)
        return send_error(r, 400, "invalid_value", "prompt", "at most %d prompts per request", MAX_PROMPTS);
    if (n * per > MAX_CHOICES_TOTAL)
        return send_error(r, 400, "invalid_value", "n", "at most %d choices per request (prompts x n)",
                          MAX_CHOICES_TOTAL);
    rlai_model_info info;
    rlai_engine_info(r->h->engine, &info);
    rlai_token **toks = calloc((size_t)n, sizeof(*toks));
    int *nt = calloc((size_t)n, sizeof(int));
    r->kids = calloc((size_t)(n * per), sizeof(hreq *));
    r->kids_per = per;
    if (!toks || !nt || !r->kids) {
        free(toks);
        free(nt);
        return send_error(r, 500, NULL, NULL, "out of memory");
    }
    enum MHD_Result ret = MHD_YES;
    bool ok = true;
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, p) {
        if (cJSON_IsString(e)) {
            nt[i] = e->valuestring[0] ? 1 : RLAI_ERR_INVALID_ARG;   /* tokenized by the router */
        } else if (cJSON_IsArray(e) && cJSON_GetArraySize(e) > 0) {
            toks[i] = malloc(sizeof(rlai_token) * (size_t)cJSON_GetArraySize(e));
            const cJSON *t;
            cJSON_ArrayForEach(t, e) {
                if (!toks[i] || !json_is_int(t) || t->valuedouble < 0 || t->valuedouble >= info.n_vocab) {
                    nt[i] = RLAI_ERR_INVALID_ARG;
                    break;
                }
                toks[i][nt[i]++] = (rlai_token)t->valuedouble;
            }
        } else {
            nt[i] = RLAI_ERR_INVALID_ARG;
        }
        if (nt[i] <= 0) {
            send_error(r, 400, "invalid_value", "prompt",
                       "prompt[%d] must be a non-empty string or a non-empty list of token ids in [0, %d)", i,
                       info.n_vocab);
            ok = false;
            i++;
            break;
        }
        i++;
    }
    for (int k = 0; ok && k < n * per; k++) {
        int pi = k / per;                  /* the prompt of choice k */
        hreq *kid = kid_new(r);
        if (!kid) {
            ok = false;
            send_error(r, 500, NULL, NULL, "out of memory");
            break;
        }
        r->kids[r->n_kids++] = kid;
        const cJSON *pk = cJSON_GetArrayItem(p, pi);
        if (g->echo && cJSON_IsString(pk)) {
            kid->echo_text = strdup(pk->valuestring);
        } else if (g->echo) {
            int len = rlai_engine_detokenize(r->h->engine, toks[pi], nt[pi], true, NULL, 0);
            kid->echo_text = len >= 0 ? malloc((size_t)len + 1) : NULL;
            if (kid->echo_text)
                rlai_engine_detokenize(r->h->engine, toks[pi], nt[pi], true, kid->echo_text, (size_t)len + 1);
        }
        rlai_gen_params gp = g->gp;
        gp.sampling.seed += (uint64_t)k;
        int n_prompt = -1;
        char err[256];
        int rc = kid_submit(kid, NULL, 0, cJSON_IsString(pk) ? pk->valuestring : NULL, toks[pi], nt[pi], &gp,
                            &n_prompt, err, sizeof(err));
        if (rc < 0) {
            ok = false;
            end_request(r, END_GONE);
            char sub[32] = "";
            if (n > 1)
                snprintf(sub, sizeof(sub), "prompt[%d]: ", pi);
            send_submit_error(r, rc, n_prompt, err, "prompt", sub);
        }
    }
    for (int k = 0; k < i; k++)
        free(toks[k]);
    free(toks);
    free(nt);
    if (!ok)
        return ret;
    if (!r->stream)
        return multi_blocking(r);
    return start_stream(r);
}

/* POST /v1/embeddings (host/embeddings.c does the work). */
static enum MHD_Result embeddings(hreq *r)
{
    cJSON *body = parse_body(r);
    if (!body)
        return MHD_YES;
    const char *character;
    if (!check_model(r, body, false, &character)) {
        cJSON_Delete(body);
        return MHD_YES;
    }
    cJSON *out = NULL;
    int n_tok = 0;
    rlai_embed_error err;
    int st = rlai_embeddings_answer(r->h->engine, body, r->model, r->h->max_prompt_tokens, &out, &n_tok, &err);
    cJSON_Delete(body);
    if (st != 200)
        return send_error(r, st, err.code, err.param, "%s", err.msg);
    return send_json(r, 200, out);
}

static cJSON *model_object(rlai_http *h, const char *id)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)h->created);
    cJSON_AddStringToObject(m, "owned_by", "rtx-localai");
    return m;
}

/* Appends the chat models plugins offer (register_chat_model). */
static void add_chat_models(rlai_http *h, cJSON *data)
{
    if (!h->plugins)
        return;
    cJSON *list = rlai_plugin_host_chat_models_json(h->plugins);
    const cJSON *c;
    cJSON_ArrayForEach(c, list) {
        cJSON *m = model_object(h, cJSON_GetObjectItemCaseSensitive(c, "id")->valuestring);
        cJSON_ReplaceItemInObject(m, "owned_by",
                                  cJSON_CreateString(cJSON_GetObjectItemCaseSensitive(c, "plugin")->valuestring));
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(c, "description");
        if (cJSON_IsString(d))
            cJSON_AddStringToObject(m, "description", d->valuestring);
        cJSON_AddItemToArray(data, m);
    }
    cJSON_Delete(list);
}

static enum MHD_Result models(hreq *r, const char *which)
{
    rlai_http *h = r->h;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(j, "data");
    cJSON_AddItemToArray(data, model_object(h, h->model_id));
    cJSON_AddItemToArray(data, model_object(h, "default"));
    for (int i = 0; i < rlai_router_n_remote_models(h->router); i++) {   /* docs/REMOTE.md */
        const char *up = NULL;
        const char *name = rlai_router_remote_model(h->router, i, &up);
        cJSON *o = model_object(h, name);
        char owner[96];
        snprintf(owner, sizeof(owner), "upstream:%s", up);
        cJSON_ReplaceItemInObject(o, "owned_by", cJSON_CreateString(owner));
        cJSON_AddItemToArray(data, o);
    }
    add_chat_models(h, data);
    if (!which)
        return send_json(r, 200, j);
    const cJSON *m;
    cJSON_ArrayForEach(m, data) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(m, "id");
        if (cJSON_IsString(id) && !strcmp(id->valuestring, which)) {
            cJSON *one = cJSON_Duplicate(m, true);
            cJSON_Delete(j);
            return send_json(r, 200, one);
        }
    }
    cJSON_Delete(j);
    return send_error(r, 404, "model_not_found", "model", "The model '%.200s' does not exist", which);
}

static enum MHD_Result health(hreq *r)
{
    rlai_http *h = r->h;
    rlai_engine_stats es;
    rlai_engine_get_stats(h->engine, &es);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "status", "ok");
    cJSON_AddStringToObject(j, "model", h->model_id);
    cJSON_AddNumberToObject(j, "uptime", rlai_clock_s() - h->t_start);
    cJSON_AddNumberToObject(j, "running", es.running);
    cJSON_AddNumberToObject(j, "queued", es.queued);
    cJSON_AddNumberToObject(j, "plugin_commands", h->plugins ? rlai_plugin_host_n_commands(h->plugins) : 0);
    return send_json(r, 200, j);
}

static enum MHD_Result metrics(hreq *r)
{
    rlai_http *h = r->h;
    rlai_engine_stats es;
    rlai_engine_get_stats(h->engine, &es);
    char *text = rlai_metrics_render(h->metrics, &es, rlai_clock_s() - h->t_start);
    char *route = rlai_router_render_metrics(h->router);   /* upstreams (docs/REMOTE.md) */
    if (text && route && route[0]) {
        size_t a = strlen(text), b = strlen(route);
        char *both = realloc(text, a + b + 1);
        if (both) {
            memcpy(both + a, route, b + 1);
            text = both;
        }
    }
    free(route);
    if (!text)
        return send_error(r, 500, NULL, NULL, "out of memory");
    return send_text(r, 200, "text/plain; version=0.0.4; charset=utf-8", text);
}

static enum MHD_Result plugins_list(hreq *r)
{
    if (!r->h->plugins) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddArrayToObject(j, "commands");
        return send_json(r, 200, j);
    }
    cJSON *j = rlai_plugin_host_commands_json(r->h->plugins);
    if (!j)
        return send_error(r, 500, NULL, NULL, "out of memory");
    return send_json(r, 200, j);
}

static bool wants_stream(hreq *r)
{
    const char *q = MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, "stream");
    if (q && (!strcmp(q, "true") || !strcmp(q, "1")))
        return true;
    const char *acc = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Accept");
    return acc && strstr(acc, "text/event-stream") != NULL;
}

static enum MHD_Result plugin_call(hreq *r, const char *command)
{
    r->kind = K_PLUGIN;
    r->command = strdup(command);
    if (!r->command)
        return send_error(r, 500, NULL, NULL, "out of memory");
    const char *params = "{}";
    char *owned = NULL;
    int timeout_ms = 0;
    if (r->body.len) {
        cJSON *body = parse_body(r);
        if (!body)
            return MHD_YES;
        /* A top-level "timeout_ms" is the call's deadline, for the host,
         * not a parameter of the command. */
        cJSON *t = cJSON_GetObjectItemCaseSensitive(body, "timeout_ms");
        if (t) {
            if (!cJSON_IsNumber(t) || t->valuedouble < 1 || t->valuedouble > 86400000 ||
                t->valuedouble != (double)(int)t->valuedouble) {
                cJSON_Delete(body);
                return send_error(r, 400, "invalid_request_error", "timeout_ms",
                                  "timeout_ms must be an integer number of milliseconds in [1, 86400000]");
            }
            timeout_ms = (int)t->valuedouble;
            cJSON_DeleteItemFromObjectCaseSensitive(body, "timeout_ms");
            owned = cJSON_PrintUnformatted(body);
            if (!owned) {
                cJSON_Delete(body);
                return send_error(r, 500, NULL, NULL, "out of memory");
            }
            params = owned;
        } else {
            params = r->body.p;
        }
        cJSON_Delete(body);
    }
    if (!r->h->plugins)
        return send_error(r, 404, "command_not_found", NULL, "unknown command '%.200s' (no plugins are loaded)",
                          command);
    r->stream = wants_stream(r);
    make_id(r, "call-");
    enum MHD_Result res = run_call(r, command, params, timeout_ms);
    free(owned);
    return res;
}

/* ---------------------------------------------------------- routing */

/* Host header check against DNS rebinding when bound to loopback: a web
 * page must not be able to reach the model by rebinding its own name. */
static bool host_allowed(hreq *r)
{
    if (!r->h->bound_loopback)
        return true;                   /* a public bind answers to any name */
    const char *host = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Host");
    if (!host)
        return true;                   /* HTTP/1.0 without Host */
    char name[128];
    const char *end;
    if (host[0] == '[') {
        end = strchr(host, ']');
        if (!end || (size_t)(end - host - 1) >= sizeof(name))
            return false;
        memcpy(name, host + 1, (size_t)(end - host - 1));
        name[end - host - 1] = 0;
        end++;
    } else {
        end = strchr(host, ':');
        if (!end)
            end = host + strlen(host);
        if ((size_t)(end - host) >= sizeof(name))
            return false;
        memcpy(name, host, (size_t)(end - host));
        name[end - host] = 0;
    }
    if (*end && (*end != ':' || strspn(end + 1, "0123456789") != strlen(end + 1)))
        return false;
    if (!strcasecmp(name, "localhost"))
        return true;
    struct in_addr a4;
    struct in6_addr a6;
    if (inet_pton(AF_INET, name, &a4) == 1)
        return (ntohl(a4.s_addr) >> 24) == 127;
    if (inet_pton(AF_INET6, name, &a6) == 1)
        return IN6_IS_ADDR_LOOPBACK(&a6);
    return false;
}

/* API key: every route needs "Authorization: Bearer KEY" except GET
 * /health (liveness probes) and CORS preflight OPTIONS requests. Returns
 * true when the request may go on; otherwise a 401 has been queued. */
static bool auth_ok(hreq *r, const char *url, const char *method, enum MHD_Result *rc)
{
    if (!r->h->api_key)
        return true;
    if (!strcmp(method, "OPTIONS") || (!strcmp(method, "GET") && !strcmp(url, "/health")))
        return true;
    const char *a = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    const char *why = "missing API key: send the header 'Authorization: Bearer KEY' (the key is in the file "
                      "`rlai serve` names at start, by default ~/.config/rlai/api_key)";
    if (a) {
        while (*a == ' ')
            a++;
        if (!strncasecmp(a, "Bearer ", 7)) {
            const char *k = a + 7;
            while (*k == ' ')
                k++;
            size_t n = strlen(k);
            while (n && k[n - 1] == ' ')
                n--;
            if (rlai_api_key_equal(k, n, r->h->api_key))
                return true;
            why = "invalid API key";
        } else {
            why = "the Authorization header must be 'Bearer KEY'";
        }
    }
    rlai_metrics_count_request(r->h->metrics, "other", "http");
    r->auth_failed = true;
    *rc = send_error(r, 401, "invalid_api_key", NULL, "%s", why);
    return false;
}

/* The Origin header against the allowed list; NULL when not allowed. */
static const char *cors_match(const rlai_http *h, const char *origin)
{
    for (int i = 0; i < h->n_cors; i++)
        if (!strcasecmp(h->cors[i], origin))
            return h->cors[i];
    return NULL;
}

/* Content-Type is application/json, parameters (charset) allowed. A
 * browser can send text/plain, form data and multipart across origins
 * without asking first (a CORS "simple request"); application/json needs
 * a preflight, which only allowed origins pass. */
static bool json_content_type(hreq *r)
{
    const char *ct = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Content-Type");
    if (!ct)
        return false;
    ct += strspn(ct, " \t");
    size_t n = strlen("application/json");
    if (strncasecmp(ct, "application/json", n) != 0)
        return false;
    char c = ct[n];
    return c == 0 || c == ';' || c == ' ' || c == '\t';
}

#define CORS_METHODS "GET, POST, OPTIONS"
#define CORS_HEADERS "Authorization, Content-Type"
#define CORS_MAX_AGE "600"

/* OPTIONS: a CORS preflight (from an allowed origin: route() refused the
 * others) or a plain query of the methods. */
static enum MHD_Result options(hreq *r)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!resp)
        return MHD_NO;
    const char *acrm = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Access-Control-Request-Method");
    add_cors(r, resp);
    if (acrm && r->cors_origin) {
        MHD_add_response_header(resp, "Access-Control-Allow-Methods", CORS_METHODS);
        MHD_add_response_header(resp, "Access-Control-Allow-Headers", CORS_HEADERS);
        MHD_add_response_header(resp, "Access-Control-Max-Age", CORS_MAX_AGE);
    }
    MHD_add_response_header(resp, "Allow", CORS_METHODS);
    enum MHD_Result rc = MHD_queue_response(r->conn, MHD_HTTP_NO_CONTENT, resp);
    MHD_destroy_response(resp);
    rlai_metrics_count_http_status(r->h->metrics, 204);
    r->answered = true;
    return rc;
}

/* The connection guard's slot of a request's connection (NULL if none). */
static rlai_conn_slot *conn_slot(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
    rlai_http *h = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        *socket_context = ci ? rlai_conn_guard_opened(h->guard, ci->connect_fd) : NULL;
    } else if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
        rlai_conn_guard_closed(h->guard, *socket_context);
        *socket_context = NULL;
    }
}

static enum MHD_Result route(hreq *r, const char *url, const char *method)
{
    /* The whole request is here: the guard's request timeout stops. */
    rlai_conn_guard_set_busy(r->h->guard, conn_slot(r->conn), true);
    bool get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    const char *ep = "other";
    enum MHD_Result rc;
    if (!host_allowed(r)) {
        rlai_metrics_count_request(r->h->metrics, ep, "http");
        return send_error(r, 403, "host_not_allowed", NULL,
                          "this server answers only to localhost names (Host header refused)");
    }
    const char *origin = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Origin");
    if (origin) {
        /* A browser page on another site: only the origins given with
         * --cors-origin / http.cors_origins may use the engine. */
        r->cors_origin = cors_match(r->h, origin);
        if (!r->cors_origin) {
            rlai_metrics_count_request(r->h->metrics, ep, "http");
            return send_error(r, 403, "origin_not_allowed", NULL,
                              "requests from the web origin '%.200s' are not allowed (allow it with --cors-origin "
                              "or http.cors_origins)", origin);
        }
    }
    if (!strcmp(method, "OPTIONS")) {
        rlai_metrics_count_request(r->h->metrics, ep, "http");
        return options(r);
    }
    /* The API key after the Host/Origin guards and the preflight (browsers
     * send no credentials in a preflight), before anything else. */
    enum MHD_Result arc;
    if (!auth_ok(r, url, method, &arc))
        return arc;
    if (r->too_large) {
        rlai_metrics_count_request(r->h->metrics, ep, "http");
        return send_error(r, 413, "request_too_large", NULL, "the request body is larger than the limit of %zu bytes",
                          r->h->max_body);
    }
    if (post && !json_content_type(r)) {
        rlai_metrics_count_request(r->h->metrics, ep, "http");
        return send_error(r, 415, "unsupported_media_type", NULL,
                          "POST bodies must be sent with Content-Type: application/json");
    }
    struct { const char *path; const char *ep; bool get, post; } routes[] = {
        { "/v1/chat/completions", "chat_completions", false, true },
        { "/v1/completions", "completions", false, true },
        { "/v1/models", "models", true, false },
        { "/v1/plugins", "plugins", true, false },
        { "/health", "health", true, false },
        { "/metrics", "metrics", true, false },
        { "/v1/embeddings", "embeddings", false, true },
    };
    int hit = -1;
    for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++)
        if (!strcmp(url, routes[i].path))
            hit = (int)i;
    const char *sub = NULL;
    bool sub_post = false;
    if (hit < 0 && !strncmp(url, "/v1/models/", 11) && url[11]) {
        hit = 2;
        sub = url + 11;
    } else if (hit < 0 && !strncmp(url, "/v1/plugins/", 12) && url[12]) {
        sub = url + 12;
        sub_post = true;
    }
    if (sub_post) {
        ep = "plugin_call";
        rlai_metrics_count_plugin_call(r->h->metrics, sub, "http");
        if (!post) {
            r->allow = "POST";
            return send_error(r, 405, "method_not_allowed", NULL, "%s %s: use POST", method, url);
        }
        return plugin_call(r, sub);
    }
    if (hit < 0) {
        rlai_metrics_count_request(r->h->metrics, ep, "http");
        return send_error(r, 404, "not_found", NULL, "no route %s %.200s", method, url);
    }
    ep = routes[hit].ep;
    rlai_metrics_count_request(r->h->metrics, ep, "http");
    if ((routes[hit].get && !get) || (routes[hit].post && !post)) {
        r->allow = routes[hit].get ? "GET" : "POST";
        rc = send_error(r, 405, "method_not_allowed", NULL, "%s %s: use %s", method, url,
                        routes[hit].get ? "GET" : "POST");
        return rc;
    }
    switch (hit) {
    case 0: return chat_completions(r);
    case 1: return completions(r);
    case 2: return models(r, sub);
    case 3: return plugins_list(r);
    case 4: return health(r);
    case 6: return embeddings(r);
    default: return metrics(r);
    }
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                 const char *version, const char *upload_data, size_t *upload_data_size,
                                 void **con_cls)
{
    rlai_http *h = cls;
    hreq *r = *con_cls;
    if (!r) {
        r = calloc(1, sizeof(*r));
        if (!r)
            return MHD_NO;
        r->h = h;
        r->conn = conn;
        r->refs = 1;                   /* MHD's, dropped in on_completed */
        r->created = (long long)time(NULL);
        r->t_begin = rlai_clock_s();
        snprintf(r->method, sizeof(r->method), "%s", method ? method : "?");
        snprintf(r->path, sizeof(r->path), "%s", url ? url : "?");
        pthread_mutex_init(&r->mu, NULL);
        cond_init_monotonic(&r->cv);
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        r->fd = ci ? ci->connect_fd : -1;
        r->http11 = version && !strcmp(version, MHD_HTTP_VERSION_1_1);
        *con_cls = r;
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
        if (cl) {
            char *end;
            unsigned long long v = strtoull(cl, &end, 10);
            if (end != cl && v > h->max_body) {
                r->too_large = true;
                /* A client that waits for "100 Continue" gets the 413 before
                 * sending the body; others send it and it is discarded. */
                const char *expect = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Expect");
                if (expect && !strcasecmp(expect, "100-continue"))
                    return route(r, url, method);
            }
        }
        return MHD_YES;
    }
    if (*upload_data_size) {
        if (!r->too_large && !r->answered) {
            if (r->body.len + *upload_data_size > h->max_body) {
                r->too_large = true;
                rlai_strbuf_free(&r->body);
            } else if (rlai_strbuf_add(&r->body, upload_data, *upload_data_size) < 0) {
                return MHD_NO;
            }
        }
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (r->answered)
        return MHD_YES;
    return route(r, url, method);
}

/* One line per request on stderr (docs/SERVE.md "Request log"): UTC time,
 * method and path, status ("-" when no answer went out: the client left
 * first), prompt / completion tokens, milliseconds from the request's
 * first byte to the end of its answer. Off with rlai_http_params.quiet. */
static void log_request(hreq *r, enum MHD_RequestTerminationCode toe)
{
    if (r->h->quiet)
        return;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    int pt = 0, ct = 0;
    pthread_mutex_lock(&r->mu);
    if (r->have_gm && !r->n_kids) {      /* a list prompt: the children's */
        pt = r->gm.prompt_tokens;
        ct = r->gm.gen_tokens;
    }
    pthread_mutex_unlock(&r->mu);
    for (int i = 0; i < r->n_kids; i++) {
        pthread_mutex_lock(&r->kids[i]->mu);
        if (r->kids_per <= 1 || i % r->kids_per == 0)   /* as usage: a prompt once */
            pt += r->kids[i]->gm.prompt_tokens;
        ct += r->kids[i]->gm.gen_tokens;
        pthread_mutex_unlock(&r->kids[i]->mu);
    }
    char st[8];
    if (r->http_status)
        snprintf(st, sizeof(st), "%d", r->http_status);
    else
        snprintf(st, sizeof(st), "-");
    /* the path is the client's: keep it printable */
    char path[sizeof(r->path)];
    size_t i = 0;
    for (; r->path[i] && i < sizeof(path) - 1; i++)
        path[i] = r->path[i] > 0x20 && r->path[i] < 0x7f && r->path[i] != '"' ? r->path[i] : '_';
    path[i] = 0;
    fprintf(stderr, "rlai http: %04d-%02d-%02dT%02d:%02d:%02d.%03ldZ \"%s %s\" %s prompt_tokens=%d "
                    "completion_tokens=%d ms=%.1f%s\n",
            tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000,
            r->method, path, st, pt, ct, (rlai_clock_s() - r->t_begin) * 1e3,
            toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "" : " (connection ended early)");
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    rlai_http *h = cls;
    /* Answer over: a kept-alive connection waits again (timeout restarts). */
    rlai_conn_guard_set_busy(h->guard, conn_slot(conn), false);
    hreq *r = *con_cls;
    if (!r)
        return;
    *con_cls = NULL;
    log_request(r, toe);
    /* Nobody reads this request's output any more: stop what still runs
     * (a no-op for a request that has finished). */
    end_request(r, toe == MHD_REQUEST_TERMINATED_DAEMON_SHUTDOWN ? END_SHUTDOWN : END_GONE);
    hreq_unref(r);
}

/* ---------------------------------------------------------- lifecycle */

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char msg[512];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
        msg[--n] = 0;
    fprintf(stderr, "rlai serve: http: %s\n", msg);
}

static bool addr_is_loopback(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
        return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
    }
    if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
        if (IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr))
            return true;
        if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr))
            return in6->sin6_addr.s6_addr[12] == 127;
    }
    return false;
}

/* Creates the listening socket for "ADDR:PORT". Returns the fd or a
 * negative error with a message. */
static int open_listener(const char *bind_s, bool allow_remote, bool *v6, bool *loopback, char *err, size_t errlen)
{
    char host[256];
    const char *colon;
    const char *port_s;
    if (bind_s[0] == '[') {
        const char *close = strchr(bind_s, ']');
        if (!close || close[1] != ':' || (size_t)(close - bind_s - 1) >= sizeof(host))
            return rlai_errf(err, errlen, RLAI_ERR_INVALID_ARG, "http: '%s' is not ADDR:PORT", bind_s);
        memcpy(host, bind_s + 1, (size_t)(close - bind_s - 1));
        host[close - bind_s - 1] = 0;
        port_s = close + 2;
    } else {
        colon = strrchr(bind_s, ':');
        if (!colon || colon == bind_s || (size_t)(colon - bind_s) >= sizeof(host))
            return rlai_errf(err, errlen, RLAI_ERR_INVALID_ARG, "http: '%s' is not ADDR:PORT", bind_s);
        memcpy(host, bind_s, (size_t)(colon - bind_s));
        host[colon - bind_s] = 0;
        port_s = colon + 1;
    }
    char *end;
    long port = strtol(port_s, &end, 10);
    if (!*port_s || *end || port < 0 || port > 65535)
        return rlai_errf(err, errlen, RLAI_ERR_INVALID_ARG, "http: bad port in '%s'", bind_s);
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV };
    struct addrinfo *res = NULL;
    int gai = getaddrinfo(host, port_s, &hints, &res);
    if (gai != 0 || !res)
        return rlai_errf(err, errlen, RLAI_ERR_INVALID_ARG, "http: cannot resolve '%s': %s", host, gai_strerror(gai));
    /* Prefer IPv4 (what "localhost" users expect from curl and browsers). */
    struct addrinfo *pick = res;
    for (struct addrinfo *a = res; a; a = a->ai_next)
        if (a->ai_family == AF_INET) {
            pick = a;
            break;
        }
    *loopback = addr_is_loopback(pick->ai_addr);
    if (!allow_remote && !*loopback) {
        freeaddrinfo(res);
        return rlai_errf(err, errlen, RLAI_ERR_INVALID_ARG,
                    "http: %s is not a loopback address; set endpoints.allow_remote (or --allow-remote) "
                    "to expose the engine beyond this machine", bind_s);
    }
    int fd = socket(pick->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        freeaddrinfo(res);
        return rlai_errf(err, errlen, RLAI_ERR_IO, "http: socket: %s", strerror(errno));
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    *v6 = pick->ai_family == AF_INET6;
    if (*v6)
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
    if (bind(fd, pick->ai_addr, pick->ai_addrlen) < 0 || listen(fd, 64) < 0) {
        int e = errno;
        close(fd);
        freeaddrinfo(res);
        return rlai_errf(err, errlen, e == EADDRINUSE ? RLAI_ERR_BUSY : RLAI_ERR_IO, "http: cannot listen on %s: %s",
                    bind_s, strerror(e));
    }
    freeaddrinfo(res);
    return fd;
}

static char *model_id_from_path(const char *path)
{
    const char *base = path ? strrchr(path, '/') : NULL;
    base = base ? base + 1 : (path ? path : "model");
    size_t n = strlen(base);
    if (n > 5 && !strcasecmp(base + n - 5, ".gguf"))
        n -= 5;
    if (n == 0)
        return strdup("model");
    return strndup(base, n);
}

int rlai_http_start(const rlai_http_params *p, rlai_http **out, char *err, size_t errlen)
{
    *out = NULL;
    if (!p || !p->bind || !p->engine || !p->router)
        return rlai_errf(err, errlen, RLAI_ERR_INVALID_ARG, "http: bind address, engine and router are required");
    rlai_http *h = calloc(1, sizeof(*h));
    if (!h)
        return RLAI_ERR_NOMEM;
    h->engine = p->engine;
    h->router = p->router;
    h->plugins = p->plugins;
    h->metrics = p->metrics;
    h->max_body = p->max_body ? p->max_body : RLAI_PROTO_MAX_FRAME;
    h->max_inflight = p->max_inflight > 0 ? p->max_inflight : 64;
    h->stop_wait_ms = p->stop_wait_ms > 0 ? p->stop_wait_ms : STOP_WAIT_MS;
    h->allow_remote = p->allow_remote;
    h->quiet = p->quiet;
    if (p->api_key && *p->api_key && !(h->api_key = strdup(p->api_key))) {
        free(h);
        return RLAI_ERR_NOMEM;
    }
    h->t_start = rlai_clock_s();
    h->created = (long long)time(NULL);
    rlai_model_info info;
    rlai_engine_info(p->engine, &info);
    h->n_ctx = info.n_ctx > 0 ? info.n_ctx : 2048;
    h->max_prompt_tokens = p->max_prompt_tokens > 0 ? p->max_prompt_tokens : h->n_ctx;
    h->request_timeout_s = p->request_timeout_s;
    h->model_id = model_id_from_path(p->model_path);
    pthread_mutex_init(&h->mu, NULL);
    cond_init_monotonic(&h->cv);
    atomic_init(&h->seq, 1);
    h->listen_fd = -1;
    if (!h->model_id) {
        rlai_http_stop(&h);
        return RLAI_ERR_NOMEM;
    }
    if (p->n_cors_origins > 0) {
        h->cors = calloc((size_t)p->n_cors_origins, sizeof(char *));
        if (!h->cors) {
            rlai_http_stop(&h);
            return RLAI_ERR_NOMEM;
        }
        for (int i = 0; i < p->n_cors_origins; i++) {
            const char *o = p->cors_origins[i];
            if (!rlai_http_origin_valid(o)) {
                rlai_http_stop(&h);
                return rlai_errf(err, errlen, RLAI_ERR_INVALID_ARG,
                            "http: CORS origin '%.200s' must be scheme://host[:port] (no path, no '*')",
                            o ? o : "(null)");
            }
            size_t n = strlen(o);
            if (o[n - 1] == '/')
                n--;
            if (!(h->cors[h->n_cors++] = strndup(o, n))) {
                rlai_http_stop(&h);
                return RLAI_ERR_NOMEM;
            }
        }
    }
    bool v6 = false;
    int fd = open_listener(p->bind, p->allow_remote, &v6, &h->bound_loopback, err, errlen);
    if (fd < 0) {
        rlai_http_stop(&h);
        return fd;
    }
    h->listen_fd = fd;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0)
        h->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                 : ((struct sockaddr_in *)&ss)->sin_port);
    int max_conn = p->max_connections > 0 ? p->max_connections : RLAI_HTTP_DEFAULT_MAX_CONNECTIONS;
    int per_ip = p->max_connections_per_ip > 0 ? p->max_connections_per_ip
                 : h->bound_loopback ? 0 : RLAI_HTTP_DEFAULT_MAX_PER_IP;
    int rc_g = rlai_conn_guard_new(max_conn, 1000 * (p->header_timeout_s > 0 ? p->header_timeout_s
                                                                              : RLAI_HTTP_DEFAULT_HEADER_TIMEOUT_S),
                                   &h->guard);
    if (rc_g < 0) {
        rlai_http_stop(&h);
        return rc_g;
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ITC |
                     MHD_USE_ERROR_LOG | (v6 ? MHD_USE_IPv6 : 0);
    h->mhd = MHD_start_daemon(flags, 0, NULL, NULL, on_access, h,
                              MHD_OPTION_EXTERNAL_LOGGER, mhd_log, h,
                              MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd,
                              MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
                              MHD_OPTION_NOTIFY_CONNECTION, on_connection, h,
                              /* headroom above the guard's cap, so a new client reaches the
                                 guard, which evicts the longest-waiting connection */
                              MHD_OPTION_CONNECTION_LIMIT, (unsigned)(max_conn + 64),
                              MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)per_ip,
                              MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)120,
                              MHD_OPTION_END);
    if (!h->mhd) {
        /* Whether libmicrohttpd closed the socket on failure is not
         * documented: leave it open rather than risk a double close. */
        h->listen_fd = -1;
        rlai_http_stop(&h);
        return rlai_errf(err, errlen, RLAI_ERR_IO, "http: libmicrohttpd failed to start on %s", p->bind);
    }
    h->listen_fd = -1;                 /* owned by libmicrohttpd until quiesced */
    *out = h;
    return 0;
}

bool rlai_http_origin_valid(const char *o)
{
    if (!o)
        return false;
    const char *rest;
    if (!strncasecmp(o, "http://", 7))
        rest = o + 7;
    else if (!strncasecmp(o, "https://", 8))
        rest = o + 8;
    else
        return false;
    size_t n = strlen(rest);
    if (n && rest[n - 1] == '/')
        n--;                           /* "http://app.example/" is accepted as the origin */
    if (n == 0 || n > 255)
        return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)rest[i];
        if (!(c == '.' || c == '-' || c == ':' || c == '[' || c == ']' || c == '_' || (c >= '0' && c <= '9') ||
              (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')))
            return false;
    }
    return true;
}

int rlai_http_port(const rlai_http *h)
{
    return h ? h->port : 0;
}

/* Fronts rlai_http_stop gave up on (volatile: the stores must stay). */
static rlai_http *volatile abandoned_fronts[8];
static int n_abandoned_fronts;

void rlai_http_stop(rlai_http **self_p)
{
    if (!self_p || !*self_p)
        return;
    rlai_http *h = *self_p;
    *self_p = NULL;
    if (h->mhd) {
        /* No new connections; the listening socket is ours again. */
        int lfd = (int)MHD_quiesce_daemon(h->mhd);
        if (lfd >= 0) {
            close(lfd);
            h->listen_fd = -1;
        }
    }
    /* End every request with work in flight. */
    pthread_mutex_lock(&h->mu);
    h->stopping = true;
    int n = 0;
    for (hreq *r = h->live; r; r = r->next_live)
        n++;
    hreq **all = calloc((size_t)(n ? n : 1), sizeof(*all));
    int k = 0;
    for (hreq *r = h->live; r && all; r = r->next_live) {
        hreq_ref(r);
        all[k++] = r;
    }
    pthread_mutex_unlock(&h->mu);
    for (int i = 0; i < k; i++) {
        end_request(all[i], END_SHUTDOWN);
        hreq_unref(all[i]);
    }
    free(all);
    /* Wait for their engine callbacks (the engine thread is still running),
     * then give the streams a moment to write their closing event. */
    pthread_mutex_lock(&h->mu);
    struct timespec ts;
    deadline_in(&ts, h->stop_wait_ms);
    while (h->n_live > 0)
        if (pthread_cond_timedwait(&h->cv, &h->mu, &ts) == ETIMEDOUT)
            break;
    bool stuck = h->n_live > 0;
    deadline_in(&ts, 1000);
    while (h->n_streams > 0)
        if (pthread_cond_timedwait(&h->cv, &h->mu, &ts) == ETIMEDOUT)
            break;
    pthread_mutex_unlock(&h->mu);
    if (h->mhd)
        MHD_stop_daemon(h->mhd);
    h->mhd = NULL;
    rlai_conn_guard_free(&h->guard);   /* after the connection threads are gone */
    if (h->listen_fd >= 0)
        close(h->listen_fd);
    if (stuck) {
        /* Engine callbacks still reference h: leak it rather than crash
         * (kept reachable: it is meant to outlive the daemon). */
        if (n_abandoned_fronts < 8)
            abandoned_fronts[n_abandoned_fronts++] = h;
        fprintf(stderr, "rlai serve: http: %d request(s) did not end in %d ms; not freeing the HTTP front\n",
                h->n_live, h->stop_wait_ms);
        return;
    }
    free(h->api_key);
    free(h->model_id);
    for (int i = 0; i < h->n_cors; i++)
        free(h->cors[i]);
    free(h->cors);
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
    free(h);
}
