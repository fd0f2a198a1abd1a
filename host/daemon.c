/* daemon.c - request router and engine thread of `rlai serve` (see daemon.h). */
#include "daemon.h"
#include "rlai/clock.h"
#include "http.h"
#include "logprobs.h"
#include "api_key.h"
#include "json_msgpack.h"
#include "metrics.h"
#include "plugin_host.h"
#include "router.h"
#include "upstream.h"
#include "gen_params.h"
#include "tools.h"
#include "server.h"
#include "rlai/engine.h"
#include "rlai/protocol.h"

#include <msgpack.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ENGINE_NAME "rtx-localai " RLAI_VERSION

typedef struct job {
    struct job *next;          /* all-jobs list */
    struct rlai_daemon *d;
    rlai_conn conn;
    uint64_t id;               /* client's request id */
    uint64_t engine_id;        /* id from rlai_router_submit */
    uint64_t call_id;          /* plugin call (rlai_plugin_host_call), 0 = generation */
    atomic_int cancel;         /* 0, or the protocol code that ended it */
    rlai_buf buf;              /* frame encoding scratch (engine thread) */
    rlai_msg_logprob lp;       /* the next token's logprobs (engine thread) */
    bool has_lp;
    rlai_msg_logprob *plp;     /* prompt logprobs not sent yet (engine thread; PLP_FRAME) */
    uint32_t n_plp;
    cJSON *rlps;               /* a remote model's logprobs for the next token frame (driving thread) */
    char where[RLAI_PROTO_MAX_WHERE + 1];   /* where the router runs it (done metrics "where") */
    char errmsg[320];          /* a remote failure's reason (router on_error) */
} job;

struct rlai_daemon {
    rlai_api_key key;          /* the API key of HTTP and tcp:// (when auth is on) */
    rlai_config cfg;
    rlai_engine *engine;
    rlai_router *router;       /* every generation goes through it (router.h) */
    rlai_server *server;
    rlai_model_info info;
    rlai_plugin_host *plugins; /* NULL when plugins are off */
    rlai_metrics *metrics;     /* fed by every transport; GET /metrics */
    rlai_http *http;           /* the HTTP front; NULL when off */

    pthread_mutex_t mu;
    job *jobs;                 /* submitted to the engine, not yet done */
    int n_jobs;
    atomic_bool stopping;
    pthread_t engine_thread;
    bool engine_started;

    atomic_ullong n_requests, n_tokens, n_prompt_tokens, n_errors;
};


/* ---------------------------------------------------------- frame out */

static void send_buf(rlai_daemon *d, rlai_conn conn, rlai_buf *b)
{
    rlai_server_send(d->server, conn, b->data, b->len);
    rlai_buf_reset(b);
}

static void send_error(rlai_daemon *d, rlai_conn conn, uint64_t id, int code, const char *msg)
{
    rlai_buf b;
    rlai_buf_init(&b);
    if (rlai_proto_encode_error(&b, id, code, msg) == 0)
        send_buf(d, conn, &b);
    rlai_buf_free(&b);
    atomic_fetch_add(&d->n_errors, 1);
}

static void send_done(rlai_daemon *d, rlai_conn conn, uint64_t id, const char *stop, const rlai_msg_metrics *m)
{
    rlai_buf b;
    rlai_buf_init(&b);
    if (rlai_proto_encode_done(&b, id, stop, m) == 0)
        send_buf(d, conn, &b);
    rlai_buf_free(&b);
}

/* Sends result(data = packed sbuffer) then done. */
static void send_result_done(rlai_daemon *d, rlai_conn conn, uint64_t id, msgpack_sbuffer *sb)
{
    rlai_buf b;
    rlai_buf_init(&b);
    if (rlai_proto_encode_result(&b, id, sb->data, sb->size) == 0)
        send_buf(d, conn, &b);
    rlai_buf_free(&b);
    send_done(d, conn, id, "", NULL);
}

static void pack_str(msgpack_packer *pk, const char *s)
{
    size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

/* ---------------------------------------------------------- jobs */

static job *find_job(rlai_daemon *d, rlai_conn conn, uint64_t id)
{
    for (job *j = d->jobs; j; j = j->next)
        if (j->conn == conn && j->id == id)
            return j;
    return NULL;
}

static void unlink_job(rlai_daemon *d, job *target)
{
    for (job **pp = &d->jobs; *pp; pp = &(*pp)->next) {
        if (*pp == target) {
            *pp = target->next;
            d->n_jobs--;
            return;
        }
    }
}

static void free_job(job *j)
{
    free(j->plp);
    cJSON_Delete(j->rlps);
    rlai_buf_free(&j->buf);
    free(j);
}

static int count_conn_jobs(rlai_daemon *d, rlai_conn conn)
{
    int n = 0;
    for (job *j = d->jobs; j; j = j->next)
        n += j->conn == conn;
    return n;
}

/* ---------------------------------------------------------- I/O thread */

/* Sends a cJSON object (owned, freed here) as the result of `id`, then
 * done: maps are sized by the encoder, never counted by hand. */
static void send_json_result(rlai_daemon *d, rlai_conn conn, uint64_t id, cJSON *v, const char *what)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    int rc = v ? rlai_json_to_msgpack(v, &pk) : RLAI_ERR_NOMEM;
    cJSON_Delete(v);
    if (rc < 0) {
        char msg[120];
        snprintf(msg, sizeof(msg), "cannot encode the %s", what);
        send_error(d, conn, id, RLAI_PE_INTERNAL, msg);
    } else {
        send_result_done(d, conn, id, &sb);
    }
    msgpack_sbuffer_destroy(&sb);
}

static void answer_hello(rlai_daemon *d, rlai_conn conn, uint64_t id)
{
    cJSON *r = cJSON_CreateObject();
    cJSON_AddNumberToObject(r, "version", RLAI_PROTO_VERSION);
    cJSON_AddStringToObject(r, "engine", ENGINE_NAME);
    cJSON_AddStringToObject(r, "model", d->info.name);
    cJSON *lim = cJSON_AddObjectToObject(r, "limits");
    cJSON_AddNumberToObject(lim, "max_frame_bytes", (double)d->cfg.max_frame);
    cJSON_AddNumberToObject(lim, "max_prompt_tokens", d->cfg.max_prompt_tokens);
    cJSON_AddNumberToObject(lim, "max_inflight_per_client", d->cfg.max_inflight_client);
    cJSON_AddNumberToObject(lim, "max_inflight_total", d->cfg.max_inflight_total);
    send_json_result(d, conn, id, r, "hello");
}

static void answer_stats(rlai_daemon *d, rlai_conn conn, uint64_t id)
{
    rlai_engine_stats es;
    rlai_engine_get_stats(d->engine, &es);
    pthread_mutex_lock(&d->mu);
    int inflight = d->n_jobs;
    pthread_mutex_unlock(&d->mu);
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "engine", ENGINE_NAME);
    cJSON_AddNumberToObject(r, "requests_total", (double)atomic_load(&d->n_requests));
    cJSON_AddNumberToObject(r, "requests_inflight", inflight);
    cJSON_AddNumberToObject(r, "running", es.running);
    cJSON_AddNumberToObject(r, "queue_length", es.queued);
    cJSON_AddNumberToObject(r, "errors_total", (double)atomic_load(&d->n_errors));
    if (d->cfg.n_upstreams > 0) {       /* upstream health (docs/REMOTE.md) */
        char *ups = rlai_router_upstreams_json(d->router);
        cJSON *upj = ups ? cJSON_Parse(ups) : NULL;
        free(ups);
        if (upj)
            cJSON_AddItemToObject(r, "upstreams", upj);
    }
    cJSON_AddNumberToObject(r, "tokens_generated", (double)es.gen_tokens_total);
    cJSON_AddNumberToObject(r, "prompt_tokens", (double)es.prompt_tokens_total);
    cJSON_AddNumberToObject(r, "prompt_tokens_reused", (double)es.prompt_tokens_reused_total);
    cJSON_AddNumberToObject(r, "spec_drafted_tokens", (double)es.spec_drafted_total);
    cJSON_AddNumberToObject(r, "spec_accepted_tokens", (double)es.spec_accepted_total);
    cJSON *kv = cJSON_AddObjectToObject(r, "kv_blocks");
    cJSON_AddNumberToObject(kv, "total", es.kv_blocks_total);
    cJSON_AddNumberToObject(kv, "used", es.kv_blocks_used);
    cJSON_AddNumberToObject(kv, "cached", es.kv_blocks_cached);
    cJSON_AddNumberToObject(kv, "pinned", es.kv_blocks_pinned);
    cJSON_AddNumberToObject(kv, "free", es.kv_blocks_free);
    cJSON *m = cJSON_AddObjectToObject(r, "model");
    cJSON_AddStringToObject(m, "name", d->info.name);
    cJSON_AddStringToObject(m, "arch", d->info.arch);
    cJSON_AddNumberToObject(m, "params", (double)d->info.n_params);
    cJSON_AddNumberToObject(m, "context", d->info.n_ctx);
    cJSON_AddNumberToObject(m, "threads", d->info.n_threads);
    cJSON_AddStringToObject(m, "kernels", d->info.isa);
    cJSON_AddStringToObject(m, "device", d->info.device);
    if (d->info.draft_model)
        cJSON_AddStringToObject(m, "draft_model", d->info.draft_model);
    send_json_result(d, conn, id, r, "stats");
}

static void answer_commands(rlai_daemon *d, rlai_conn conn, uint64_t id)
{
    pthread_mutex_lock(&d->mu);
    cJSON *reg = rlai_plugin_host_commands_json(d->plugins);
    if (reg)
        cJSON_AddItemToObject(reg, "plugins", rlai_plugin_host_plugins_json(d->plugins));
    pthread_mutex_unlock(&d->mu);
    send_json_result(d, conn, id, reg, "command registry");
}

/* ---------------------------------------------------------- engine callbacks
 * (engine thread) */

#define PLP_FRAME 256   /* prompt logprobs per frame (about 64 KiB with 20 alternatives) */

/* Sends the prompt logprobs kept so far in one frame (engine thread). A
 * client that is gone cancels the request. */
static void flush_prompt_logprobs(job *j)
{
    if (j->n_plp == 0)
        return;
    int erc = rlai_proto_encode_prompt_logprobs(&j->buf, j->id, j->plp, j->n_plp);
    j->n_plp = 0;
    if (erc == 0 && rlai_server_send(j->d->server, j->conn, j->buf.data, j->buf.len) == RLAI_ERR_DISCONNECTED)
        atomic_store(&j->cancel, RLAI_PE_CANCELLED);
    rlai_buf_reset(&j->buf);
}

/* Engine thread, just before on_token of the same token: keep its logprobs.
 * A prompt token's (prompt_logprobs) are gathered and sent in frames of
 * their own before the first generated token's. */
static void on_logprobs(void *user, const rlai_token_logprobs *lp)
{
    job *j = user;
    rlai_msg_logprob *m = &j->lp;
    if (lp->prompt) {
        if (!j->plp && !(j->plp = malloc(sizeof(*j->plp) * PLP_FRAME)))
            return;   /* out of memory: the entry is lost, the text is not */
        m = &j->plp[j->n_plp++];
    } else {
        flush_prompt_logprobs(j);
    }
    m->token = lp->token;
    m->logprob = lp->logprob;
    m->n_top = (uint32_t)(lp->n_top < RLAI_PROTO_MAX_TOP_LOGPROBS ? lp->n_top : RLAI_PROTO_MAX_TOP_LOGPROBS);
    for (uint32_t k = 0; k < m->n_top; k++) {
        m->top_ids[k] = lp->top_ids[k];
        m->top_logprobs[k] = lp->top_logprobs[k];
    }
    if (lp->prompt) {
        if (j->n_plp == PLP_FRAME)
            flush_prompt_logprobs(j);
        return;
    }
    j->has_lp = true;
}

/* A remote model's log-probabilities (the router's driving thread, just
 * before on_token of the same chunk's text; router.h): kept for that
 * token frame. Takes ownership of entries. */
static void on_remote_logprobs(void *user, cJSON *entries)
{
    job *j = user;
    if (!j->rlps) {
        j->rlps = entries;
        return;
    }
    cJSON *e;
    while ((e = cJSON_DetachItemFromArray(entries, 0)))
        cJSON_AddItemToArray(j->rlps, e);
    cJSON_Delete(entries);
}

/* The token frame of a remote model's text with its pending text
 * logprobs (PROTOCOL.md 6.1). Returns 0 or a negative code. */
static int encode_remote_token(job *j, const char *text, size_t len)
{
    rlai_msg_text_logprob *v = NULL;
    uint8_t *pool = NULL;
    int n = rlai_logprobs_wire_entries(j->rlps, &v, &pool);
    int rc = n < 0 ? n : rlai_proto_encode_token_text_lp(&j->buf, j->id, text, len, v, (uint32_t)n);
    free(v);
    free(pool);
    cJSON_Delete(j->rlps);
    j->rlps = NULL;
    return rc;
}

static int on_token(void *user, rlai_token tok, const char *text, size_t len)
{
    job *j = user;
    if (atomic_load(&j->cancel))
        return 1;
    int32_t t = tok;
    bool lp = j->has_lp && tok >= 0 && j->lp.token == tok;
    j->has_lp = false;
    int erc = -1;
    if (tok < 0 && j->rlps) {
        erc = encode_remote_token(j, text, len);
        if (erc < 0)            /* entries the frame cannot carry: the text still goes */
            rlai_buf_reset(&j->buf);
    }
    if (erc < 0)
        erc = rlai_proto_encode_token_lp(&j->buf, j->id, text, len, &t, tok >= 0 ? 1 : 0, &j->lp, lp ? 1 : 0);
    if (erc == 0) {
        int rc = rlai_server_send(j->d->server, j->conn, j->buf.data, j->buf.len);
        rlai_buf_reset(&j->buf);
        if (rc == RLAI_ERR_DISCONNECTED) {
            atomic_store(&j->cancel, RLAI_PE_CANCELLED);
            return 1;
        }
    }
    return 0;
}

/* Wire code of an engine error: the one table in rlai/error.h. */
static int map_engine_error(int rc)
{
    return rlai_err_wire_code(rc);
}

/* A remote request failed (router thread, just before on_done): its reason. */
static void on_job_error(void *user, uint64_t id, int status, const char *msg)
{
    (void)id;
    (void)status;
    job *j = user;
    snprintf(j->errmsg, sizeof(j->errmsg), "%s", msg);
}

/* Is `name` a model of this daemon: "", "default", the model file's name
 * without .gguf (the HTTP model id), or a remote model (docs/REMOTE.md)? */
static bool model_known(rlai_daemon *d, const char *name)
{
    if (!name || !*name || !strcmp(name, "default") || rlai_router_is_remote_model(d->router, name))
        return true;
    const char *base = d->cfg.model ? strrchr(d->cfg.model, '/') : NULL;
    base = base ? base + 1 : d->cfg.model ? d->cfg.model : "";
    size_t n = strlen(base);
    if (n > 5 && !strcmp(base + n - 5, ".gguf"))
        n -= 5;
    return strlen(name) == n && !strncmp(name, base, n);
}

static void on_done(void *user, uint64_t engine_id, int status, const rlai_gen_metrics *gm)
{
    (void)engine_id;
    job *j = user;
    rlai_daemon *d = j->d;
    if (status == 0)
        flush_prompt_logprobs(j);   /* a request that generated nothing */
    int cancel = atomic_load(&j->cancel);
    /* Before the reply: a client that reads /metrics after its done frame sees it. */
    rlai_metrics_count_request(d->metrics, "generate", "ipc");
    rlai_metrics_observe_generation(d->metrics, "ipc", cancel == RLAI_PE_SHUTDOWN ? RLAI_ERR_CANCELLED : status, gm);
    if (cancel == RLAI_PE_SHUTDOWN) {
        send_error(d, j->conn, j->id, RLAI_PE_SHUTDOWN, "engine shutting down: request ended");
    } else if (status < 0) {
        send_error(d, j->conn, j->id, map_engine_error(status), j->errmsg[0] ? j->errmsg : rlai_strerror(status));
    } else {
        rlai_msg_metrics mm = {
            .queue_ms = gm->queue_ms, .ttft_ms = gm->ttft_ms, .prefill_tps = gm->prefill_tps,
            .decode_tps = gm->decode_tps, .prompt_tokens = (uint32_t)gm->prompt_tokens,
            .gen_tokens = (uint32_t)gm->gen_tokens, .reused_tokens = (uint32_t)gm->reused_tokens,
            .drafted_tokens = (uint32_t)gm->drafted_tokens, .accepted_tokens = (uint32_t)gm->accepted_tokens,
        };
        snprintf(mm.where, sizeof(mm.where), "%s", j->where);
        send_done(d, j->conn, j->id, cancel ? "cancelled" : rlai_stop_reason_name(gm->stop), &mm);
    }
    pthread_mutex_lock(&d->mu);
    unlink_job(d, j);
    pthread_mutex_unlock(&d->mu);
    free_job(j);
}

/* ---------------------------------------------------------- I/O thread */

/* Tokenizes text (special tokens parsed, BOS as the model wants).
 * *out malloc'd. Returns count or negative error. */
static int tokenize_all(rlai_engine *e, const char *text, bool add_special, bool parse_special,
                        rlai_token **out)
{
    size_t len = strlen(text);
    int n = rlai_engine_tokenize(e, text, len, add_special, parse_special, NULL, 0);
    if (n < 0)
        return n;
    rlai_token *t = malloc(sizeof(rlai_token) * (size_t)(n > 0 ? n : 1));
    if (!t)
        return RLAI_ERR_NOMEM;
    n = rlai_engine_tokenize(e, text, len, add_special, parse_special, t, n);
    *out = t;
    return n;
}

static void answer_tokenize(rlai_daemon *d, rlai_conn conn, const rlai_msg *m)
{
    rlai_token *toks = NULL;
    int n = tokenize_all(d->engine, m->u.tokenize.text ? m->u.tokenize.text : "", m->u.tokenize.add_special,
                         m->u.tokenize.parse_special, &toks);
    if (n < 0) {
        send_error(d, conn, m->id, map_engine_error(n), rlai_strerror(n));
        return;
    }
    if (n > RLAI_PROTO_MAX_TOKENS_ARRAY) {
        free(toks);
        send_error(d, conn, m->id, RLAI_PE_TOO_LARGE, "text has more tokens than one result frame may carry");
        return;
    }
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 1);
    pack_str(&pk, "tokens");
    msgpack_pack_array(&pk, (size_t)n);
    for (int i = 0; i < n; i++)
        msgpack_pack_int32(&pk, toks[i]);
    send_result_done(d, conn, m->id, &sb);
    msgpack_sbuffer_destroy(&sb);
    free(toks);
}

/* Submits a generate/chat request through the router (the one request
 * path: template, tokenize, prompt limit, submit). */
static void submit_generation(rlai_daemon *d, rlai_conn conn, const rlai_msg *m)
{
    const rlai_msg_gen *g = m->type == RLAI_MSG_CHAT ? &m->u.chat.gen : &m->u.generate.gen;
    if (!model_known(d, g->model)) {
        char msg[400];
        snprintf(msg, sizeof(msg), "unknown model '%.200s': this daemon serves its local model ('default') "
                 "and the remote models of its upstreams (docs/REMOTE.md)", g->model);
        send_error(d, conn, m->id, RLAI_PE_BAD_REQUEST, msg);
        return;
    }
    rlai_route_request rq;
    memset(&rq, 0, sizeof(rq));
    rlai_chat_message *cm = NULL;
    if (m->type == RLAI_MSG_CHAT) {
        cm = calloc(m->u.chat.n_messages ? m->u.chat.n_messages : 1, sizeof(*cm));
        if (!cm) {
            send_error(d, conn, m->id, RLAI_PE_INTERNAL, "out of memory");
            return;
        }
        for (uint32_t i = 0; i < m->u.chat.n_messages; i++) {
            cm[i].role = m->u.chat.messages[i].role;
            cm[i].content = m->u.chat.messages[i].content;
        }
        rq.text.messages = cm;
        rq.text.n_messages = (int)m->u.chat.n_messages;
    } else {
        rq.text.prompt = m->u.generate.prompt ? m->u.generate.prompt : "";
    }
    rq.text.max_prompt_tokens = d->cfg.max_prompt_tokens;
    rq.response_format = g->response_format;
    rq.model = g->model;                  /* docs/REMOTE.md */
    rq.route = g->route;
    rq.on_error = on_job_error;
    job *j = calloc(1, sizeof(*j));
    const char **stops = NULL;
    rlai_grammar *grammar = NULL;
    if (!j || (g->n_stop && !(stops = calloc(g->n_stop + 1, sizeof(char *))))) {
        free(cm);
        free(j);
        send_error(d, conn, m->id, RLAI_PE_INTERNAL, "out of memory");
        return;
    }
    j->d = d;
    j->conn = conn;
    j->id = m->id;
    atomic_init(&j->cancel, 0);
    rlai_buf_init(&j->buf);
    rlai_request_params *rp = &rq.text.rp;
    rlai_gen_params_from_wire(g, &rp->gen);
    rp->gen.timeout_ms = rlai_config_timeout_ms(rp->gen.timeout_ms, d->cfg.request_timeout_s);
    for (uint32_t i = 0; i < g->n_stop; i++)
        stops[i] = g->stop[i];
    rp->gen.stop = stops;
    if (g->has_top_logprobs) {
        rp->gen.on_logprobs = on_logprobs;
        rp->gen.logprobs_user = j;
        rq.on_remote_logprobs = on_remote_logprobs;   /* a remote model's come as text (6.1) */
    }
    /* Structured output (docs/STRUCTURED.md): the engine takes its own
     * reference to the grammar at submit. */
    if (g->response_format) {
        char gerr[300] = "";
        cJSON *rf = cJSON_Parse(g->response_format);
        int grc = rf ? rlai_response_format_grammar(rf, &grammar, gerr, sizeof(gerr)) : RLAI_ERR_INVALID_ARG;
        cJSON_Delete(rf);
        if (grc < 0) {
            free(stops);
            free(cm);
            free_job(j);
            send_error(d, conn, m->id, RLAI_PE_BAD_REQUEST, gerr[0] ? gerr : "response_format is not a JSON object");
            return;
        }
        rp->gen.grammar = grammar;
    }
    rp->on_token = on_token;
    rp->on_done = on_done;
    rp->user = j;
    /* Link the job first: on_done may run on the engine thread as soon as
     * the request is submitted. */
    char err[256];
    pthread_mutex_lock(&d->mu);
    j->next = d->jobs;
    d->jobs = j;
    d->n_jobs++;
    rq.where = j->where;
    rq.where_len = sizeof(j->where);
    int rc = rlai_router_submit(d->router, &rq, &j->engine_id, NULL, err, sizeof(err));
    if (rc < 0) {
        unlink_job(d, j);
        pthread_mutex_unlock(&d->mu);
        free_job(j);
        send_error(d, conn, m->id, map_engine_error(rc), err[0] ? err : rlai_strerror(rc));
    } else {
        pthread_mutex_unlock(&d->mu);
    }
    rlai_grammar_unref(grammar);
    free(stops);
    free(cm);
}

/* ---------------------------------------------------------- plugin calls
 * (sink callbacks run on the plugin host's worker threads) */

static int map_call_error(int rc)
{
    return rlai_err_wire_code(rc);
}

static void end_job(rlai_daemon *d, job *j)
{
    pthread_mutex_lock(&d->mu);
    unlink_job(d, j);
    pthread_mutex_unlock(&d->mu);
    free_job(j);
}

static int call_token(void *user, const char *text, size_t len)
{
    job *j = user;
    if (atomic_load(&j->cancel))
        return 1;
    if (rlai_proto_encode_token(&j->buf, j->id, text, len, NULL, 0) == 0) {
        int rc = rlai_server_send(j->d->server, j->conn, j->buf.data, j->buf.len);
        rlai_buf_reset(&j->buf);
        if (rc == RLAI_ERR_DISCONNECTED) {
            atomic_store(&j->cancel, RLAI_PE_CANCELLED);
            return 1;
        }
    }
    return 0;
}

static int call_result(void *user, const cJSON *value)
{
    job *j = user;
    if (atomic_load(&j->cancel))
        return 1;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    int rc = rlai_json_to_msgpack(value, &pk);
    if (rc == 0 && sb.size <= j->d->cfg.max_frame - 64 &&
        rlai_proto_encode_result(&j->buf, j->id, sb.data, sb.size) == 0) {
        rc = rlai_server_send(j->d->server, j->conn, j->buf.data, j->buf.len);
        rlai_buf_reset(&j->buf);
        if (rc == RLAI_ERR_DISCONNECTED)
            atomic_store(&j->cancel, RLAI_PE_CANCELLED);
    } else {
        /* A result the client could not receive: the host ends the call
         * with this error (client and plugin both get it). */
        msgpack_sbuffer_destroy(&sb);
        return rc < 0 ? rc : RLAI_ERR_TOO_LARGE;
    }
    msgpack_sbuffer_destroy(&sb);
    return atomic_load(&j->cancel) ? 1 : 0;
}

static void call_done(void *user, const char *stop, const rlai_call_metrics *m)
{
    job *j = user;
    rlai_daemon *d = j->d;
    int cancel = atomic_load(&j->cancel);
    if (cancel == RLAI_PE_SHUTDOWN) {
        send_error(d, j->conn, j->id, RLAI_PE_SHUTDOWN, "engine shutting down: request ended");
    } else {
        rlai_msg_metrics mm = { 0 };
        if (m && m->valid)
            mm = (rlai_msg_metrics){
                .queue_ms = m->queue_ms, .ttft_ms = m->ttft_ms, .prefill_tps = m->prefill_tps,
                .decode_tps = m->decode_tps, .prompt_tokens = (uint32_t)m->prompt_tokens,
                .gen_tokens = (uint32_t)m->gen_tokens, .reused_tokens = (uint32_t)m->reused_tokens,
                .drafted_tokens = (uint32_t)m->drafted_tokens, .accepted_tokens = (uint32_t)m->accepted_tokens,
            };
        send_done(d, j->conn, j->id, cancel ? "cancelled" : (stop ? stop : ""), m && m->valid ? &mm : NULL);
    }
    end_job(d, j);
}

static void call_error(void *user, int code, const char *msg)
{
    job *j = user;
    rlai_daemon *d = j->d;
    if (atomic_load(&j->cancel) == RLAI_PE_SHUTDOWN)
        send_error(d, j->conn, j->id, RLAI_PE_SHUTDOWN, "engine shutting down: request ended");
    else
        send_error(d, j->conn, j->id, map_call_error(code), msg);
    end_job(d, j);
}

static void submit_call(rlai_daemon *d, rlai_conn conn, const rlai_msg *m)
{
    job *j = calloc(1, sizeof(*j));
    if (!j) {
        send_error(d, conn, m->id, RLAI_PE_INTERNAL, "out of memory");
        return;
    }
    j->d = d;
    j->conn = conn;
    j->id = m->id;
    atomic_init(&j->cancel, 0);
    rlai_buf_init(&j->buf);
    rlai_call_sink sink = { call_token, call_result, call_done, call_error, j };
    char err[512] = "";
    /* Link first: the sink may end the job on a worker before call returns. */
    pthread_mutex_lock(&d->mu);
    j->next = d->jobs;
    d->jobs = j;
    d->n_jobs++;
    j->call_id = UINT64_MAX;   /* marks a call until the host gives its id */
    rlai_metrics_count_plugin_call(d->metrics, m->u.call.command, "ipc");
    bool have_plugins = d->plugins != NULL;   /* read under mu: shutdown clears it */
    int rc = have_plugins ? rlai_plugin_host_call_timed(d->plugins, m->u.call.command, m->u.call.params_json,
                                                        (int)m->u.call.timeout_ms, &sink, &j->call_id, err,
                                                        sizeof(err))
                          : RLAI_ERR_NOT_FOUND;
    if (rc < 0) {
        unlink_job(d, j);
        pthread_mutex_unlock(&d->mu);
        free_job(j);
        if (!have_plugins)
            snprintf(err, sizeof(err), "unknown command '%.200s' (plugins are disabled)",
                     m->u.call.command ? m->u.call.command : "");
        send_error(d, conn, m->id, map_call_error(rc), err);
        return;
    }
    pthread_mutex_unlock(&d->mu);
}

static void on_message(void *user, rlai_conn conn, const void *data, size_t len)
{
    rlai_daemon *d = user;
    rlai_msg m;
    char err[256];
    int rc = rlai_proto_decode(data, len, &m, err, sizeof(err));
    if (rc < 0) {
        send_error(d, conn, m.id, -rc, err);
        rlai_msg_free(&m);
        return;
    }
    atomic_fetch_add(&d->n_requests, 1);
    switch (m.type) {
    case RLAI_MSG_HELLO:
        answer_hello(d, conn, m.id);
        break;
    case RLAI_MSG_STATS:
        answer_stats(d, conn, m.id);
        break;
    case RLAI_MSG_COMMANDS:
        answer_commands(d, conn, m.id);
        break;
    case RLAI_MSG_TOKENIZE:
        answer_tokenize(d, conn, &m);
        break;
    case RLAI_MSG_CANCEL: {
        pthread_mutex_lock(&d->mu);
        job *t = find_job(d, conn, m.u.cancel.target);
        uint64_t eid = t ? t->engine_id : 0, cid = t ? t->call_id : 0;
        if (t && !atomic_load(&t->cancel))
            atomic_store(&t->cancel, RLAI_PE_CANCELLED);
        if (t && cid)   /* under d->mu: d->plugins cannot go away meanwhile */
            rlai_plugin_host_cancel(d->plugins, cid);
        pthread_mutex_unlock(&d->mu);
        if (t) {
            if (!cid)
                rlai_router_cancel(d->router, eid);
            send_done(d, conn, m.id, "", NULL);
        } else {
            send_error(d, conn, m.id, RLAI_PE_NOT_FOUND, "no request with that id in flight");
        }
        break;
    }
    case RLAI_MSG_CALL:
    case RLAI_MSG_GENERATE:
    case RLAI_MSG_CHAT: {
        pthread_mutex_lock(&d->mu);
        const char *why = NULL;
        int code = 0;
        if (atomic_load(&d->stopping)) {
            code = RLAI_PE_SHUTDOWN;
            why = "engine is shutting down";
        } else if (find_job(d, conn, m.id)) {
            code = RLAI_PE_DUPLICATE_ID;
            why = "a request with this id is already in flight";
        } else if (count_conn_jobs(d, conn) >= d->cfg.max_inflight_client) {
            code = RLAI_PE_BUSY;
            why = "too many requests in flight for this client";
        } else if (d->n_jobs >= d->cfg.max_inflight_total) {
            code = RLAI_PE_BUSY;
            why = "too many requests in flight in the engine";
        }
        pthread_mutex_unlock(&d->mu);
        if (why)
            send_error(d, conn, m.id, code, why);
        else if (m.type == RLAI_MSG_CALL)
            submit_call(d, conn, &m);
        else
            submit_generation(d, conn, &m);
        break;
    }
    default:
        send_error(d, conn, m.id, RLAI_PE_BAD_REQUEST, "not a request type");
        break;
    }
    rlai_msg_free(&m);
}

static void on_disconnect(void *user, rlai_conn conn)
{
    rlai_daemon *d = user;
    uint64_t ids[64];
    int n = 0;
    pthread_mutex_lock(&d->mu);
    for (job *j = d->jobs; j; j = j->next) {
        if (j->conn != conn)
            continue;
        atomic_store(&j->cancel, RLAI_PE_CANCELLED);
        if (j->call_id)
            rlai_plugin_host_cancel(d->plugins, j->call_id);
        else if (n < 64)
            ids[n++] = j->engine_id;
    }
    pthread_mutex_unlock(&d->mu);
    for (int i = 0; i < n; i++)
        rlai_router_cancel(d->router, ids[i]);
}

static void on_frame_error(void *user, rlai_conn conn, const char *why)
{
    (void)conn;
    rlai_daemon *d = user;
    atomic_fetch_add(&d->n_errors, 1);
    fprintf(stderr, "rlai serve: closing a pipe connection: %s\n", why);
}

/* ---------------------------------------------------------- engine thread */

static void *engine_main(void *arg)
{
    rlai_daemon *d = arg;
    for (;;) {
        bool work = rlai_engine_wait_work(d->engine, 200);
        if (!work) {
            if (atomic_load(&d->stopping))
                break;
            continue;
        }
        int rc = rlai_engine_step(d->engine);
        if (rc < 0)
            fprintf(stderr, "rlai serve: engine step failed: %s\n", rlai_strerror(rc));
    }
    return NULL;
}

/* ---------------------------------------------------------- lifecycle */

static rlai_metrics *volatile abandoned_metrics;   /* see rlai_daemon_shutdown */

static int shutdown_ms(const rlai_config *cfg)
{
    return (cfg->shutdown_timeout_s > 0 ? cfg->shutdown_timeout_s : 5) * 1000;
}

int rlai_daemon_start(const rlai_config *cfg, rlai_daemon **out, char *err, size_t errlen)
{
    *out = NULL;
    rlai_daemon *d = calloc(1, sizeof(*d));
    if (!d)
        return RLAI_ERR_NOMEM;
    d->cfg = *cfg;   /* strings borrowed from the caller's config, which outlives the daemon */
    pthread_mutex_init(&d->mu, NULL);
    atomic_init(&d->stopping, false);
    int rc;
    /* The API key guards the network endpoints (HTTP, tcp:// ZeroMQ); the
     * pipe and the ipc:// endpoint are guarded by their 0700 directory. */
    bool any_tcp = (cfg->zmq && !strncmp(cfg->zmq, "tcp://", 6)) || cfg->zmq_tcp;
    const char *key = NULL;
    if (!cfg->auth_off && (cfg->http || any_tcp)) {
        if ((rc = rlai_api_key_resolve(cfg->api_key, cfg->api_key_file, &d->key, err, errlen)) < 0)
            goto fail;
        key = d->key.key;
        if (d->key.from_file)
            fprintf(stderr, "rlai serve: api key  %s %s (Authorization: Bearer <key> on HTTP; PLAIN on tcp://)\n",
                    d->key.created ? "created in" : "read from", d->key.source);
        else
            fprintf(stderr, "rlai serve: api key  from %s\n", d->key.source);
    } else if (cfg->auth_off && (cfg->http || any_tcp)) {
        fprintf(stderr, "rlai serve: WARNING: --no-auth: HTTP and tcp:// endpoints accept anyone on this machine\n");
    }
    rlai_engine_params ep;
    rlai_engine_params_init(&ep);
    ep.n_threads = cfg->threads;
    ep.n_ctx = cfg->context;
    ep.kv_blocks = cfg->kv_blocks;
    ep.kv_type = cfg->kv_q8_0 ? RLAI_KV_Q8_0 : RLAI_KV_F16;
    ep.device = cfg->device;
    ep.max_queue = cfg->max_inflight_total;
    ep.spec = (rlai_spec_mode)cfg->spec;
    ep.spec_max_draft = cfg->spec_max_draft;
    ep.draft_model = cfg->draft_model;
    ep.spec_lookup_min = cfg->spec_lookup_min;
    rc = rlai_engine_open(cfg->model, &ep, &d->engine, err, errlen);
    if (rc < 0)
        goto fail;
    if (cfg->draft_model)
        fprintf(stderr, "rlai serve: draft    %s (speculative decoding: docs/SPECULATIVE.md)\n", cfg->draft_model);
    if (cfg->mmproj && (rc = rlai_engine_load_mmproj(d->engine, cfg->mmproj, err, errlen)) < 0)
        goto fail;
    if (cfg->mmproj)
        fprintf(stderr, "rlai serve: vision   %s (images in prompts: docs/SCREEN.md \"Vision\")\n", cfg->mmproj);
    rlai_engine_info(d->engine, &d->info);
    if ((rc = rlai_router_new(d->engine, &d->router)) < 0) {
        snprintf(err, errlen, "cannot create the request router: %s", rlai_strerror(rc));
        goto fail;
    }
    {   /* remote upstreams (docs/REMOTE.md) */
        rlai_route_policy pol;
        rlai_route_policy_init(&pol);
        pol.spill_queued = cfg->route_spill_queued;
        pol.spill_long_prompts = !cfg->route_no_spill_long;
        pol.affinity = !cfg->route_no_affinity;
        char uerr[300] = "";
        if ((rc = rlai_router_set_upstreams(d->router, cfg->upstreams, cfg->n_upstreams, &pol, uerr,
                                            sizeof(uerr))) < 0) {
            snprintf(err, errlen, "%s", uerr[0] ? uerr : rlai_strerror(rc));
            goto fail;
        }
        for (int i = 0; i < cfg->n_upstreams; i++)
            fprintf(stderr, "rlai serve: upstream %s at %s (%d model%s%s)\n", cfg->upstreams[i].name,
                    cfg->upstreams[i].base_url, cfg->upstreams[i].n_models,
                    cfg->upstreams[i].n_models == 1 ? "" : "s",
                    cfg->upstreams[i].spill_model ? ", takes spills" : "");
    }
    if (cfg->no_prefix_cache)
        rlai_engine_set_prefix_cache(d->engine, false);
    if (pthread_create(&d->engine_thread, NULL, engine_main, d) != 0) {
        snprintf(err, errlen, "cannot start the engine thread");
        rc = RLAI_ERR_NOMEM;
        goto fail;
    }
    d->engine_started = true;
    if ((rc = rlai_metrics_new(&d->metrics)) < 0)
        goto fail;
    if (!cfg->plugins_off) {
        /* Plugins load with the engine thread running (they may pin
         * prefixes) and before any transport accepts a call. */
        cJSON *pconf = cfg->plugin_config ? cJSON_Parse(cfg->plugin_config) : NULL;
        rlai_plugin_host_params hp = {
            .engine = d->engine, .router = d->router, .workers = cfg->plugin_workers,
            .max_queue = cfg->plugin_max_queue > 0 ? cfg->plugin_max_queue : cfg->max_inflight_total,
            .max_prompt_tokens = cfg->max_prompt_tokens, .plugin_config = pconf,
            .call_timeout_ms = cfg->plugin_call_timeout_s > 0 ? cfg->plugin_call_timeout_s * 1000 : -1,
            .metrics = d->metrics,
        };
        rc = rlai_plugin_host_new(&hp, &d->plugins);
        cJSON_Delete(pconf);
        if (rc < 0) {
            snprintf(err, errlen, "cannot start the plugin host: %s", rlai_strerror(rc));
            goto fail;
        }
        if (cfg->plugins_dir) {
            int n = rlai_plugin_host_load_all(d->plugins, cfg->plugins_dir);
            if (n < 0)
                fprintf(stderr, "rlai serve: plugin folder %s cannot be read; serving without plugins\n",
                        cfg->plugins_dir);
            else
                fprintf(stderr, "rlai serve: %d plugin%s loaded from %s (%d commands)\n", n, n == 1 ? "" : "s",
                        cfg->plugins_dir, rlai_plugin_host_n_commands(d->plugins));
        }
        for (int i = 0; i < cfg->n_plugin_dirs_extra; i++) {   /* --plugins DIR: added folders */
            const char *dir = cfg->plugin_dirs_extra[i];
            int n = rlai_plugin_host_load_all(d->plugins, dir);
            if (n < 0)
                fprintf(stderr, "rlai serve: plugin folder %s cannot be read; skipped\n", dir);
            else
                fprintf(stderr, "rlai serve: %d plugin%s loaded from %s (%d commands)\n", n, n == 1 ? "" : "s",
                        dir, rlai_plugin_host_n_commands(d->plugins));
        }
    }
    rlai_server_config sc = {
        .zmq_endpoint = cfg->zmq, .zmq_tcp_endpoint = cfg->zmq_tcp, .uds_path = cfg->pipe,
        .max_frame = cfg->max_frame, .max_connections = 256, .zmq_tcp_api_key = key,
    };
    rlai_server_callbacks cb = { on_message, on_disconnect, on_frame_error, d };
    if ((rc = rlai_server_start(&sc, &cb, &d->server, err, errlen)) < 0)
        goto fail;
    /* HTTP last: once /health answers, every transport is up (a client
     * that waits for it may connect to the pipe or ZeroMQ at once). */
    if (cfg->http) {
        rlai_http_params hp = {
            .bind = cfg->http, .allow_remote = cfg->allow_remote, .engine = d->engine, .router = d->router,
            .model_path = cfg->model,
            .plugins = d->plugins, .metrics = d->metrics, .max_body = cfg->max_frame,
            .max_prompt_tokens = cfg->max_prompt_tokens, .max_inflight = cfg->max_inflight_total,
            .stop_wait_ms = shutdown_ms(cfg) / 2,
            .request_timeout_s = cfg->request_timeout_s,
            .api_key = key,
            .cors_origins = (const char *const *)cfg->cors_origins, .n_cors_origins = cfg->n_cors_origins,
            .max_connections = cfg->http_max_connections,
            .max_connections_per_ip = cfg->http_max_connections_per_ip,
            .header_timeout_s = cfg->http_header_timeout_s,
        };
        rc = rlai_http_start(&hp, &d->http, err, errlen);
        if (rc == RLAI_ERR_BUSY && !strcmp(cfg->http, RLAI_HTTP_DEFAULT)) {
            fprintf(stderr, "rlai serve: %s; serving without HTTP (--http ADDR:PORT to choose another)\n", err);
        } else if (rc < 0) {
            goto fail;
        } else {
            fprintf(stderr, "rlai serve: http     http://%s/v1\n", cfg->http);
        }
    }
    *out = d;
    return 0;
fail:
    rlai_daemon_shutdown(d);
    return rc;
}

/* Engines whose plugin host was abandoned at shutdown (handlers stuck in
 * plugin code may still call into them): kept reachable, never closed. */
static rlai_engine *volatile abandoned_engines[8];   /* volatile: the stores must stay */
static rlai_router *volatile abandoned_routers[8];
static int n_abandoned_engines;

void rlai_daemon_shutdown(rlai_daemon *d)
{
    if (!d)
        return;
    /* The whole shutdown is bounded by shutdown_timeout_s (plus the
     * server's own teardown): what has not ended by then is ended for the
     * client and left behind, and the sockets are removed anyway. */
    double deadline = rlai_clock_ms() + shutdown_ms(&d->cfg);
    /* HTTP first: it ends its requests while the engine and plugins run
     * (it waits at most half the budget: stop_wait_ms). */
    rlai_http_stop(&d->http);
    /* No new requests; every in-flight one ends with a SHUTDOWN error. */
    atomic_store(&d->stopping, true);
    uint64_t *ids = NULL;
    int n = 0;
    pthread_mutex_lock(&d->mu);
    ids = malloc(sizeof(uint64_t) * (size_t)(d->n_jobs > 0 ? d->n_jobs : 1));
    for (job *j = d->jobs; j && ids; j = j->next) {
        atomic_store(&j->cancel, RLAI_PE_SHUTDOWN);
        if (!j->call_id)
            ids[n++] = j->engine_id;
    }
    pthread_mutex_unlock(&d->mu);
    for (int i = 0; i < n; i++)
        rlai_router_cancel(d->router, ids[i]);
    free(ids);
    /* Plugin calls end (SHUTDOWN) and plugins unload while the engine
     * thread still runs, so their engine jobs can finish cancelling. A
     * handler that ignores the cancel past the deadline is left running:
     * its call is ended for the client and its host is abandoned. */
    pthread_mutex_lock(&d->mu);
    rlai_plugin_host *plugins = d->plugins;
    d->plugins = NULL;
    pthread_mutex_unlock(&d->mu);
    int left = 0;
    if (plugins) {
        double wait = deadline - rlai_clock_ms();
        left = rlai_plugin_host_stop(plugins, wait > 100 ? (int)wait : 100);
        if (left > 0)
            fprintf(stderr, "rlai serve: %d plugin handler%s did not stop within shutdown_timeout_s (%d s); "
                    "exiting without waiting for %s\n", left, left == 1 ? "" : "s", shutdown_ms(&d->cfg) / 1000,
                    left == 1 ? "it" : "them");
        rlai_plugin_host_free(&plugins);
    }
    if (d->engine_started) {
        rlai_engine_wakeup(d->engine);
        pthread_join(d->engine_thread, NULL);
    }
    /* remote requests end on the router's thread: their done/error frames
     * go out before the transports stop */
    rlai_router_wait_remote(d->router, 2000);
    rlai_server_stop(d->server, 1000);
    if (left > 0 && n_abandoned_engines < 8) {
        abandoned_engines[n_abandoned_engines++] = d->engine;   /* a stuck handler may still use it */
        abandoned_routers[n_abandoned_engines - 1] = d->router;  /* ... and the router */
    } else {
        rlai_router_free(d->router);
        rlai_engine_close(d->engine);
    }
    while (d->jobs) {
        job *j = d->jobs;
        d->jobs = j->next;
        free_job(j);
    }
    if (left == 0)
        rlai_metrics_free(&d->metrics);   /* else the abandoned host may still count into it */
    else
        abandoned_metrics = d->metrics;
    pthread_mutex_destroy(&d->mu);
    free(d);
}
