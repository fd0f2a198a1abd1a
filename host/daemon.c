/* daemon.c - request router and engine thread of `rlai serve` (see daemon.h). */
#include "daemon.h"
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

#define ENGINE_NAME "rtx-localai 0.1.0"

typedef struct job {
    struct job *next;          /* all-jobs list */
    rlai_conn conn;
    uint64_t id;
    rlai_msg msg;              /* owned request */
    double t_enqueue;
    bool started;
    atomic_int cancel;         /* 0, or the protocol code that ended it */
} job;

struct rlai_daemon {
    rlai_config cfg;
    rlai_engine *engine;
    rlai_server *server;
    rlai_model_info info;

    pthread_mutex_t mu;
    pthread_cond_t cv;
    job *jobs;                 /* queued and running, arrival order */
    int n_jobs;
    bool stopping;
    pthread_t engine_thread;
    bool engine_started;

    atomic_ullong n_requests, n_tokens, n_prompt_tokens, n_errors;
};

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

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
    rlai_msg_free(&j->msg);
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

static void answer_hello(rlai_daemon *d, rlai_conn conn, uint64_t id)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 4);
    pack_str(&pk, "version");
    msgpack_pack_uint32(&pk, RLAI_PROTO_VERSION);
    pack_str(&pk, "engine");
    pack_str(&pk, ENGINE_NAME);
    pack_str(&pk, "model");
    pack_str(&pk, d->info.name);
    pack_str(&pk, "limits");
    msgpack_pack_map(&pk, 4);
    pack_str(&pk, "max_frame_bytes");
    msgpack_pack_uint64(&pk, d->cfg.max_frame);
    pack_str(&pk, "max_prompt_tokens");
    msgpack_pack_int(&pk, d->cfg.max_prompt_tokens);
    pack_str(&pk, "max_inflight_per_client");
    msgpack_pack_int(&pk, d->cfg.max_inflight_client);
    pack_str(&pk, "max_inflight_total");
    msgpack_pack_int(&pk, d->cfg.max_inflight_total);
    send_result_done(d, conn, id, &sb);
    msgpack_sbuffer_destroy(&sb);
}

static void answer_stats(rlai_daemon *d, rlai_conn conn, uint64_t id)
{
    pthread_mutex_lock(&d->mu);
    int inflight = d->n_jobs, queued = 0;
    for (job *j = d->jobs; j; j = j->next)
        queued += !j->started;
    pthread_mutex_unlock(&d->mu);
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 8);
    pack_str(&pk, "engine");
    pack_str(&pk, ENGINE_NAME);
    pack_str(&pk, "requests_total");
    msgpack_pack_uint64(&pk, atomic_load(&d->n_requests));
    pack_str(&pk, "requests_inflight");
    msgpack_pack_int(&pk, inflight);
    pack_str(&pk, "queue_length");
    msgpack_pack_int(&pk, queued);
    pack_str(&pk, "errors_total");
    msgpack_pack_uint64(&pk, atomic_load(&d->n_errors));
    pack_str(&pk, "tokens_generated");
    msgpack_pack_uint64(&pk, atomic_load(&d->n_tokens));
    pack_str(&pk, "prompt_tokens");
    msgpack_pack_uint64(&pk, atomic_load(&d->n_prompt_tokens));
    pack_str(&pk, "model");
    msgpack_pack_map(&pk, 6);
    pack_str(&pk, "name");
    pack_str(&pk, d->info.name);
    pack_str(&pk, "arch");
    pack_str(&pk, d->info.arch);
    pack_str(&pk, "params");
    msgpack_pack_uint64(&pk, d->info.n_params);
    pack_str(&pk, "context");
    msgpack_pack_int(&pk, d->info.n_ctx);
    pack_str(&pk, "threads");
    msgpack_pack_int(&pk, d->info.n_threads);
    pack_str(&pk, "kernels");
    pack_str(&pk, d->info.isa);
    send_result_done(d, conn, id, &sb);
    msgpack_sbuffer_destroy(&sb);
}

static void answer_commands(rlai_daemon *d, rlai_conn conn, uint64_t id)
{
    /* No plugin host yet: the registry is empty. */
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 1);
    pack_str(&pk, "commands");
    msgpack_pack_array(&pk, 0);
    send_result_done(d, conn, id, &sb);
    msgpack_sbuffer_destroy(&sb);
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
        rlai_msg_free(&m);
        return;
    case RLAI_MSG_STATS:
        answer_stats(d, conn, m.id);
        rlai_msg_free(&m);
        return;
    case RLAI_MSG_COMMANDS:
        answer_commands(d, conn, m.id);
        rlai_msg_free(&m);
        return;
    case RLAI_MSG_CALL: {
        char msg[300];
        snprintf(msg, sizeof(msg), "unknown command '%.200s' (no plugins are loaded in this build)",
                 m.u.call.command ? m.u.call.command : "");
        send_error(d, conn, m.id, RLAI_PE_NOT_FOUND, msg);
        rlai_msg_free(&m);
        return;
    }
    case RLAI_MSG_CANCEL: {
        pthread_mutex_lock(&d->mu);
        job *t = find_job(d, conn, m.u.cancel.target);
        bool found = t != NULL;
        if (t && !t->started) {
            unlink_job(d, t);
            pthread_mutex_unlock(&d->mu);
            send_done(d, conn, t->id, "cancelled", NULL);
            free_job(t);
        } else {
            if (t)
                atomic_store(&t->cancel, RLAI_PE_CANCELLED);
            pthread_mutex_unlock(&d->mu);
        }
        if (found)
            send_done(d, conn, m.id, "", NULL);
        else
            send_error(d, conn, m.id, RLAI_PE_NOT_FOUND, "no request with that id in flight");
        rlai_msg_free(&m);
        return;
    }
    case RLAI_MSG_GENERATE:
    case RLAI_MSG_CHAT:
    case RLAI_MSG_TOKENIZE:
        break;
    default:
        send_error(d, conn, m.id, RLAI_PE_BAD_REQUEST, "not a request type");
        rlai_msg_free(&m);
        return;
    }

    pthread_mutex_lock(&d->mu);
    const char *why = NULL;
    int code = 0;
    if (d->stopping) {
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
    job *j = NULL;
    if (!why) {
        j = calloc(1, sizeof(*j));
        if (!j) {
            code = RLAI_PE_INTERNAL;
            why = "out of memory";
        }
    }
    if (why) {
        pthread_mutex_unlock(&d->mu);
        send_error(d, conn, m.id, code, why);
        rlai_msg_free(&m);
        return;
    }
    j->conn = conn;
    j->id = m.id;
    j->msg = m;
    j->t_enqueue = now_ms();
    atomic_init(&j->cancel, 0);
    job **pp = &d->jobs;
    while (*pp)
        pp = &(*pp)->next;
    *pp = j;
    d->n_jobs++;
    pthread_cond_signal(&d->cv);
    pthread_mutex_unlock(&d->mu);
}

static void on_disconnect(void *user, rlai_conn conn)
{
    rlai_daemon *d = user;
    pthread_mutex_lock(&d->mu);
    job **pp = &d->jobs;
    while (*pp) {
        job *j = *pp;
        if (j->conn == conn && !j->started) {
            *pp = j->next;
            d->n_jobs--;
            free_job(j);
            continue;
        }
        if (j->conn == conn)
            atomic_store(&j->cancel, RLAI_PE_CANCELLED);
        pp = &j->next;
    }
    pthread_mutex_unlock(&d->mu);
}

static void on_frame_error(void *user, rlai_conn conn, const char *why)
{
    (void)conn;
    rlai_daemon *d = user;
    atomic_fetch_add(&d->n_errors, 1);
    fprintf(stderr, "rlai serve: closing a pipe connection: %s\n", why);
}

/* ---------------------------------------------------------- engine thread */

typedef struct stream_ctx {
    rlai_daemon *d;
    job *j;
    rlai_buf buf;
} stream_ctx;

static int stream_cb(void *user, rlai_token tok, const char *text, size_t len)
{
    stream_ctx *s = user;
    if (atomic_load(&s->j->cancel))
        return 1;
    int32_t t = tok;
    if (rlai_proto_encode_token(&s->buf, s->j->id, text, len, &t, tok >= 0 ? 1 : 0) == 0) {
        int rc = rlai_server_send(s->d->server, s->j->conn, s->buf.data, s->buf.len);
        rlai_buf_reset(&s->buf);
        if (rc == RLAI_ERR_DISCONNECTED) {
            atomic_store(&s->j->cancel, RLAI_PE_CANCELLED);
            return 1;
        }
    }
    return 0;
}

static int map_engine_error(int rc)
{
    switch (rc) {
    case RLAI_ERR_CONTEXT_FULL: return RLAI_PE_CONTEXT_FULL;
    case RLAI_ERR_INVALID_ARG: return RLAI_PE_BAD_REQUEST;
    case RLAI_ERR_TOO_LARGE: return RLAI_PE_TOO_LARGE;
    case RLAI_ERR_TOKENIZER: return RLAI_PE_BAD_REQUEST;
    case RLAI_ERR_KV_FULL: return RLAI_PE_BUSY;
    default: return RLAI_PE_ENGINE;
    }
}

static void apply_gen(const rlai_msg_gen *g, rlai_gen_params *gp)
{
    rlai_gen_params_init(gp);
    if (g->has_max_tokens) gp->max_tokens = g->max_tokens;
    if (g->has_temperature) gp->sampling.temperature = g->temperature;
    if (g->has_top_k) gp->sampling.top_k = g->top_k;
    if (g->has_top_p) gp->sampling.top_p = g->top_p;
    if (g->has_min_p) gp->sampling.min_p = g->min_p;
    if (g->has_repeat_penalty) gp->sampling.repeat_penalty = g->repeat_penalty;
    if (g->has_presence_penalty) gp->sampling.presence_penalty = g->presence_penalty;
    if (g->has_frequency_penalty) gp->sampling.frequency_penalty = g->frequency_penalty;
    if (g->has_seed) gp->sampling.seed = g->seed;
    gp->ignore_eos = g->ignore_eos;
}

static const char *stop_name(rlai_stop_reason r)
{
    switch (r) {
    case RLAI_STOP_EOG: return "eog";
    case RLAI_STOP_MAX_TOKENS: return "max_tokens";
    case RLAI_STOP_STRING: return "stop_string";
    case RLAI_STOP_CONTEXT: return "context";
    case RLAI_STOP_CANCELLED: return "cancelled";
    default: return "";
    }
}

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

static void run_job(rlai_daemon *d, job *j)
{
    rlai_msg *m = &j->msg;
    double t_start = now_ms();
    if (m->type == RLAI_MSG_TOKENIZE) {
        rlai_token *toks = NULL;
        int n = tokenize_all(d->engine, m->u.tokenize.text ? m->u.tokenize.text : "", m->u.tokenize.add_special,
                             m->u.tokenize.parse_special, &toks);
        if (n < 0) {
            send_error(d, j->conn, j->id, map_engine_error(n), rlai_strerror(n));
            return;
        }
        if (n > RLAI_PROTO_MAX_TOKENS_ARRAY) {
            free(toks);
            send_error(d, j->conn, j->id, RLAI_PE_TOO_LARGE, "text has more tokens than one result frame may carry");
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
        send_result_done(d, j->conn, j->id, &sb);
        msgpack_sbuffer_destroy(&sb);
        free(toks);
        return;
    }

    char *prompt = NULL;
    const rlai_msg_gen *g;
    if (m->type == RLAI_MSG_CHAT) {
        g = &m->u.chat.gen;
        rlai_chat_message *cm = calloc(m->u.chat.n_messages ? m->u.chat.n_messages : 1, sizeof(*cm));
        if (!cm) {
            send_error(d, j->conn, j->id, RLAI_PE_INTERNAL, "out of memory");
            return;
        }
        for (uint32_t i = 0; i < m->u.chat.n_messages; i++) {
            cm[i].role = m->u.chat.messages[i].role;
            cm[i].content = m->u.chat.messages[i].content;
        }
        int rc = rlai_engine_apply_chat(d->engine, cm, (int)m->u.chat.n_messages, true, &prompt);
        free(cm);
        if (rc < 0) {
            send_error(d, j->conn, j->id, RLAI_PE_BAD_REQUEST,
                       "chat messages rejected by the template (roles: system, user, assistant)");
            return;
        }
    } else {
        g = &m->u.generate.gen;
        prompt = strdup(m->u.generate.prompt ? m->u.generate.prompt : "");
        if (!prompt) {
            send_error(d, j->conn, j->id, RLAI_PE_INTERNAL, "out of memory");
            return;
        }
    }
    rlai_token *toks = NULL;
    int n = tokenize_all(d->engine, prompt, true, true, &toks);
    free(prompt);
    if (n < 0) {
        send_error(d, j->conn, j->id, map_engine_error(n), rlai_strerror(n));
        return;
    }
    if (n == 0) {
        free(toks);
        send_error(d, j->conn, j->id, RLAI_PE_BAD_REQUEST, "empty prompt");
        return;
    }
    if (n > d->cfg.max_prompt_tokens) {
        char msg[160];
        snprintf(msg, sizeof(msg), "prompt has %d tokens; the limit is %d", n, d->cfg.max_prompt_tokens);
        free(toks);
        send_error(d, j->conn, j->id, RLAI_PE_TOO_LARGE, msg);
        return;
    }
    rlai_gen_params gp;
    apply_gen(g, &gp);
    const char **stops = NULL;
    if (g->n_stop) {
        stops = calloc(g->n_stop + 1, sizeof(char *));
        if (!stops) {
            free(toks);
            send_error(d, j->conn, j->id, RLAI_PE_INTERNAL, "out of memory");
            return;
        }
        for (uint32_t i = 0; i < g->n_stop; i++)
            stops[i] = g->stop[i];
        gp.stop = stops;
    }
    stream_ctx sc = { d, j, { 0 } };
    rlai_buf_init(&sc.buf);
    rlai_gen_metrics gm;
    int rc = rlai_engine_generate_tokens(d->engine, toks, n, &gp, stream_cb, &sc, &gm);
    rlai_buf_free(&sc.buf);
    free(stops);
    free(toks);
    atomic_fetch_add(&d->n_prompt_tokens, (unsigned long long)n);
    atomic_fetch_add(&d->n_tokens, (unsigned long long)(gm.gen_tokens > 0 ? gm.gen_tokens : 0));
    int cancel = atomic_load(&j->cancel);
    if (cancel == RLAI_PE_SHUTDOWN) {
        send_error(d, j->conn, j->id, RLAI_PE_SHUTDOWN, "engine shutting down: request ended");
        return;
    }
    if (rc < 0) {
        send_error(d, j->conn, j->id, map_engine_error(rc), rlai_strerror(rc));
        return;
    }
    rlai_msg_metrics mm = {
        .queue_ms = t_start - j->t_enqueue, .ttft_ms = gm.ttft_ms, .prefill_tps = gm.prefill_tps,
        .decode_tps = gm.decode_tps, .prompt_tokens = (uint32_t)gm.prompt_tokens,
        .gen_tokens = (uint32_t)gm.gen_tokens, .reused_tokens = 0,
    };
    send_done(d, j->conn, j->id, cancel ? "cancelled" : stop_name(gm.stop), &mm);
}

static void *engine_main(void *arg)
{
    rlai_daemon *d = arg;
    pthread_mutex_lock(&d->mu);
    for (;;) {
        job *j = NULL;
        for (job *it = d->jobs; it; it = it->next) {
            if (!it->started) {
                j = it;
                break;
            }
        }
        if (!j) {
            if (d->stopping)
                break;
            pthread_cond_wait(&d->cv, &d->mu);
            continue;
        }
        j->started = true;
        pthread_mutex_unlock(&d->mu);
        if (atomic_load(&j->cancel) == RLAI_PE_SHUTDOWN)
            send_error(d, j->conn, j->id, RLAI_PE_SHUTDOWN, "engine shutting down: request not run");
        else if (atomic_load(&j->cancel))
            send_done(d, j->conn, j->id, "cancelled", NULL);
        else
            run_job(d, j);
        pthread_mutex_lock(&d->mu);
        unlink_job(d, j);
        free_job(j);
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

/* ---------------------------------------------------------- lifecycle */

int rlai_daemon_start(const rlai_config *cfg, rlai_daemon **out, char *err, size_t errlen)
{
    *out = NULL;
    rlai_daemon *d = calloc(1, sizeof(*d));
    if (!d)
        return RLAI_ERR_NOMEM;
    d->cfg = *cfg;   /* strings borrowed from the caller's config, which outlives the daemon */
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv, NULL);
    rlai_engine_params ep;
    rlai_engine_params_init(&ep);
    ep.n_threads = cfg->threads;
    ep.n_ctx = cfg->context;
    ep.kv_blocks = cfg->kv_blocks;
    int rc = rlai_engine_open(cfg->model, &ep, &d->engine, err, errlen);
    if (rc < 0)
        goto fail;
    rlai_engine_info(d->engine, &d->info);
    if ((rc = pthread_create(&d->engine_thread, NULL, engine_main, d)) != 0) {
        snprintf(err, errlen, "cannot start the engine thread");
        rc = RLAI_ERR_NOMEM;
        goto fail;
    }
    d->engine_started = true;
    rlai_server_config sc = {
        .zmq_endpoint = cfg->zmq, .zmq_tcp_endpoint = cfg->zmq_tcp, .uds_path = cfg->pipe,
        .max_frame = cfg->max_frame, .max_connections = 256,
    };
    rlai_server_callbacks cb = { on_message, on_disconnect, on_frame_error, d };
    if ((rc = rlai_server_start(&sc, &cb, &d->server, err, errlen)) < 0)
        goto fail;
    *out = d;
    return 0;
fail:
    rlai_daemon_shutdown(d);
    return rc;
}

void rlai_daemon_shutdown(rlai_daemon *d)
{
    if (!d)
        return;
    pthread_mutex_lock(&d->mu);
    d->stopping = true;
    for (job *j = d->jobs; j; j = j->next)
        atomic_store(&j->cancel, RLAI_PE_SHUTDOWN);
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
    if (d->engine_started)
        pthread_join(d->engine_thread, NULL);
    rlai_server_stop(d->server, 1000);
    /* Jobs that arrived after the engine thread left (none normally). */
    while (d->jobs) {
        job *j = d->jobs;
        d->jobs = j->next;
        free_job(j);
    }
    rlai_engine_close(d->engine);
    pthread_mutex_destroy(&d->mu);
    pthread_cond_destroy(&d->cv);
    free(d);
}
