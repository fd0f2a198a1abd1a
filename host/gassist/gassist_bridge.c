/* gassist_bridge.c - the G-Assist session: reader loop, worker, engine
 * calls, passthrough conversations. */
#include "gassist_bridge.h"
#include "rlai/clock.h"

#include "gassist_frame.h"
#include "gassist_manifest.h"
#include "gassist_msgpack.h"
#include "gassist_rpc.h"

#include "rlai/client.h"
#include "rlai/error.h"
#include "rlai/protocol.h"

#include <ctype.h>
#include <strings.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_QUEUE 4                   /* execute/input waiting for the worker */
#define MAX_FUNCTION_NAME 256
#define MAX_COMPLETE_DATA (1u << 20)  /* text in one complete notification */
#define REGISTRY_TTL_MS 30000.0
#define CANCEL_GRACE_MS 1000
#define STOP_WAIT_MS 1500
#define SESSION_MARGIN_MS 10000.0     /* end a conversation this close to the limit */

typedef enum job_kind { JOB_INIT = 1, JOB_EXECUTE, JOB_INPUT } job_kind;

typedef struct job {
    job_kind kind;
    cJSON *id;                /* the request's id (copy) */
    char *function;           /* execute */
    cJSON *arguments;         /* execute: object (owned) */
    char *content;            /* input */
    double arrived_ms;
    struct job *next;
} job;

/* The passthrough conversation in progress (worker thread only). */
typedef struct conversation {
    bool active;
    char *command;
    char *function;
    char *session;
    char *text_param;
    cJSON *arguments;         /* the first turn's arguments, without session / text */
    double started_ms;
} conversation;

struct gassist_bridge {
    gassist_bridge_config cfg;
    char *endpoint, *name;
    gassist_frame_reader rd;
    gassist_frame_writer wr;
    pthread_mutex_t log_mu;

    pthread_mutex_t mu;       /* queue */
    pthread_cond_t cv;
    job *head, *tail;
    int n_jobs;
    atomic_bool stopping;
    atomic_bool worker_done;
    atomic_bool initialized;  /* initialize arrived: `log` notifications may flow */
    pthread_t worker;
    bool worker_started;

    /* worker thread only */
    rlai_client *client;
    cJSON *registry;
    double registry_ms;
    conversation conv;
    char *last_session;       /* the latest conversation's id, for commands that take one */
    unsigned session_counter;
};

/* ------------------------------------------------------------------ util */

static const char *level_name(int level)
{
    switch (level) {
    case GASSIST_LOG_ERROR: return "error";
    case GASSIST_LOG_WARNING: return "warning";
    case GASSIST_LOG_INFO: return "info";
    default: return "debug";
    }
}

static void send_json(gassist_bridge *b, char *text)
{
    if (!text)
        return;
    gassist_frame_write(&b->wr, text, strlen(text));
    free(text);
}

/* A log line to the log file and, at notify_level or more severe and once
 * initialize has arrived, as a `log` notification. Any thread. */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static void blog(gassist_bridge *b, int level, const char *fmt, ...)
{
    if (level > b->cfg.log_level && level > b->cfg.notify_level)
        return;
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (b->cfg.log && level <= b->cfg.log_level) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        struct tm tm;
        localtime_r(&ts.tv_sec, &tm);
        pthread_mutex_lock(&b->log_mu);
        fprintf(b->cfg.log, "%04d-%02d-%02d %02d:%02d:%02d.%03ld [%s] %s\n", tm.tm_year + 1900, tm.tm_mon + 1,
                tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000L, level_name(level), msg);
        fflush(b->cfg.log);
        pthread_mutex_unlock(&b->log_mu);
    }
    if (level <= b->cfg.notify_level && atomic_load(&b->initialized) &&
        gassist_rpc_utf8_valid(msg, strlen(msg))) {
        cJSON *p = cJSON_CreateObject();
        if (p) {
            cJSON_AddStringToObject(p, "level", level_name(level));
            cJSON_AddStringToObject(p, "message", msg);
        }
        send_json(b, gassist_rpc_notification("log", p));
    }
}

static cJSON *request_params(const cJSON *id)
{
    cJSON *p = cJSON_CreateObject();
    cJSON *c = id ? cJSON_Duplicate(id, 1) : cJSON_CreateNull();
    if (!p || !c || !cJSON_AddItemToObject(p, "request_id", c)) {
        cJSON_Delete(p);
        cJSON_Delete(c);
        return NULL;
    }
    return p;
}

static void notify_stream(gassist_bridge *b, const cJSON *id, const char *text)
{
    cJSON *p = request_params(id);
    if (p && cJSON_AddStringToObject(p, "data", text))
        send_json(b, gassist_rpc_notification("stream", p));
    else
        cJSON_Delete(p);
}

static void notify_complete(gassist_bridge *b, const cJSON *id, const char *data, bool keep_session)
{
    cJSON *p = request_params(id);
    if (p && cJSON_AddBoolToObject(p, "success", 1) && cJSON_AddStringToObject(p, "data", data ? data : "") &&
        cJSON_AddBoolToObject(p, "keep_session", keep_session))
        send_json(b, gassist_rpc_notification("complete", p));
    else
        cJSON_Delete(p);
}

static void notify_error(gassist_bridge *b, const cJSON *id, int code, const char *message)
{
    blog(b, GASSIST_LOG_DEBUG, "request ends with error %d: %s", code, message);
    cJSON *p = request_params(id);
    if (p && cJSON_AddNumberToObject(p, "code", code) && cJSON_AddStringToObject(p, "message", message))
        send_json(b, gassist_rpc_notification("error", p));
    else
        cJSON_Delete(p);
}

static void respond_error(gassist_bridge *b, const cJSON *id, int code, const char *message)
{
    blog(b, GASSIST_LOG_WARNING, "answering error %d: %s", code, message);
    send_json(b, gassist_rpc_error(id, code, message));
}

/* Appends text to a growing string, up to MAX_COMPLETE_DATA bytes (cut on
 * a UTF-8 character boundary). */
typedef struct text { char *s; size_t len; bool cut; } text;

static void text_add(text *t, const char *s, size_t n)
{
    if (t->cut)
        return;
    if (t->len + n > MAX_COMPLETE_DATA) {
        n = MAX_COMPLETE_DATA - t->len;
        while (n > 0 && ((unsigned char)s[n] & 0xc0) == 0x80)
            n--;
        t->cut = true;
    }
    char *r = realloc(t->s, t->len + n + 1);
    if (!r)
        return;
    memcpy(r + t->len, s, n);
    t->len += n;
    r[t->len] = 0;
    t->s = r;
}

static void text_adds(text *t, const char *s)
{
    text_add(t, s, strlen(s));
}

/* ---------------------------------------------------------------- queue */

static void job_free(job *j)
{
    if (!j)
        return;
    cJSON_Delete(j->id);
    cJSON_Delete(j->arguments);
    free(j->function);
    free(j->content);
    free(j);
}

/* Queues j (taking ownership). Returns false when the queue is full or
 * the bridge is stopping (j is freed by the caller then). */
static bool enqueue(gassist_bridge *b, job *j)
{
    pthread_mutex_lock(&b->mu);
    bool ok = !atomic_load(&b->stopping) && b->n_jobs < MAX_QUEUE;
    if (ok) {
        if (b->tail)
            b->tail->next = j;
        else
            b->head = j;
        b->tail = j;
        b->n_jobs++;
        pthread_cond_signal(&b->cv);
    }
    pthread_mutex_unlock(&b->mu);
    return ok;
}

static job *dequeue(gassist_bridge *b)
{
    pthread_mutex_lock(&b->mu);
    while (!b->head && !atomic_load(&b->stopping))
        pthread_cond_wait(&b->cv, &b->mu);
    job *j = NULL;
    if (!atomic_load(&b->stopping) && b->head) {
        j = b->head;
        b->head = j->next;
        if (!b->head)
            b->tail = NULL;
        b->n_jobs--;
    }
    pthread_mutex_unlock(&b->mu);
    return j;
}

/* --------------------------------------------------------------- engine */

static void drop_client(gassist_bridge *b)
{
    rlai_client_close(b->client);
    b->client = NULL;
}

static const char *endpoint_text(gassist_bridge *b, char *buf, size_t cap)
{
    if (b->endpoint)
        return b->endpoint;
    if (rlai_default_zmq_endpoint(buf, cap) < 0)
        return "the default endpoint";
    return buf;
}

/* Connects when needed. Returns 0, or a negative rlai_error with a
 * user-facing message in msg. */
static int ensure_client(gassist_bridge *b, int timeout_ms, char *msg, size_t cap)
{
    if (b->client)
        return 0;
    char err[512], ep[512];
    int rc = rlai_client_connect(b->endpoint, timeout_ms, &b->client, err, sizeof(err));
    if (rc < 0) {
        b->client = NULL;
        blog(b, GASSIST_LOG_WARNING, "engine connect failed: %s", err);
        snprintf(msg, cap,
                 "The RTX-LocalAI engine is not running (nothing answers at %s). Start it with `rlai serve` "
                 "and try again.",
                 endpoint_text(b, ep, sizeof(ep)));
        return rc;
    }
    blog(b, GASSIST_LOG_INFO, "connected to the engine at %s", endpoint_text(b, ep, sizeof(ep)));
    return 0;
}

/* Fetches the registry when missing or older than REGISTRY_TTL_MS (or
 * always with force). Returns 0 or a negative rlai_error with a message. */
static int refresh_registry(gassist_bridge *b, bool force, int timeout_ms, char *msg, size_t cap)
{
    if (b->registry && !force && rlai_clock_ms() - b->registry_ms < REGISTRY_TTL_MS)
        return 0;
    int rc = ensure_client(b, timeout_ms, msg, cap);
    if (rc < 0)
        return rc;
    cJSON *reg = NULL;
    char err[512];
    rc = rlai_gassist_fetch_registry(b->client, timeout_ms, &reg, err, sizeof(err));
    if (rc == RLAI_ERR_DISCONNECTED) {
        /* The engine restarted since the last call: one fresh connection. */
        drop_client(b);
        if ((rc = ensure_client(b, timeout_ms, msg, cap)) < 0)
            return rc;
        rc = rlai_gassist_fetch_registry(b->client, timeout_ms, &reg, err, sizeof(err));
    }
    if (rc < 0) {
        blog(b, GASSIST_LOG_WARNING, "%s", err);
        if (rc == RLAI_ERR_DISCONNECTED || rc == RLAI_ERR_TIMEOUT)
            drop_client(b);
        snprintf(msg, cap, "The RTX-LocalAI engine did not answer (%s). Check that `rlai serve` is running.", err);
        return rc;
    }
    cJSON_Delete(b->registry);
    b->registry = reg;
    b->registry_ms = rlai_clock_ms();
    return 0;
}

/* Engine error frame -> protocol V2 error code and user-facing message. */
static int map_engine_error(int code, const char *emsg, const char *command, const char *function, char *out,
                            size_t cap)
{
    if (!emsg)
        emsg = "";
    switch (code) {
    case RLAI_PE_NOT_FOUND:
        snprintf(out, cap,
                 "RTX-LocalAI has no command '%s' (G-Assist function '%s'): %s. The plugin's manifest.json no "
                 "longer matches the engine's plugins: regenerate it with `rlai gassist manifest -o manifest.json` "
                 "and restart G-Assist.",
                 command, function, emsg);
        return GASSIST_RPC_METHOD_NOT_FOUND;
    case RLAI_PE_BAD_REQUEST:
    case RLAI_PE_TOO_LARGE:
        snprintf(out, cap, "The arguments for %s were refused by the engine: %s", function, emsg);
        return GASSIST_RPC_INVALID_PARAMS;
    case RLAI_PE_BUSY:
        snprintf(out, cap, "The local AI engine is busy with other requests right now; try again in a moment (%s).",
                 emsg);
        return GASSIST_RPC_RATE_LIMITED;
    case RLAI_PE_CONTEXT_FULL:
        snprintf(out, cap, "This no longer fits in the model's context; start a new conversation (%s).", emsg);
        return GASSIST_RPC_PLUGIN_ERROR;
    case RLAI_PE_SHUTDOWN:
    case RLAI_PE_CANCELLED:
        snprintf(out, cap, "The local AI engine stopped before answering (%s). Start it again with `rlai serve`.",
                 emsg);
        return GASSIST_RPC_PLUGIN_ERROR;
    case RLAI_PE_NOT_IMPLEMENTED:
        snprintf(out, cap, "%s is not available in this engine: %s", function, emsg);
        return GASSIST_RPC_PLUGIN_ERROR;
    case RLAI_PE_TIMEOUT:
        snprintf(out, cap, "%s ran past the engine's own deadline for the call (%s); the engine's limit is "
                 "plugins.call_timeout_s or the plugin manifest's timeout_ms.", function, emsg);
        return GASSIST_RPC_TIMEOUT;
    default:
        snprintf(out, cap, "The local AI engine failed on %s: %s", function, emsg);
        return GASSIST_RPC_PLUGIN_ERROR;
    }
}

/* A scalar as text: strings as they are, numbers in their shortest form. */
static void render_scalar(const cJSON *v, text *t)
{
    char buf[64];
    if (cJSON_IsString(v)) {
        text_adds(t, v->valuestring);
    } else if (cJSON_IsNumber(v)) {
        snprintf(buf, sizeof(buf), "%.15g", v->valuedouble);
        if (strtod(buf, NULL) != v->valuedouble)
            snprintf(buf, sizeof(buf), "%.17g", v->valuedouble);
        text_adds(t, buf);
    } else if (cJSON_IsBool(v)) {
        text_adds(t, cJSON_IsTrue(v) ? "yes" : "no");
    } else {
        text_adds(t, "none");
    }
}

static bool is_container(const cJSON *v)
{
    return cJSON_IsObject(v) || cJSON_IsArray(v);
}

static void indent(text *t, int depth)
{
    for (int i = 0; i < depth; i++)
        text_adds(t, "  ");
}

static void render_list(const cJSON *v, int depth, text *t);

/* One member of an object: "key: value", or "key:" with the container as a
 * list one level deeper. */
static void render_member(const cJSON *m, int depth, text *t)
{
    text_adds(t, m->string);
    text_adds(t, ":");
    if (is_container(m) && cJSON_GetArraySize(m) > 0) {
        text_adds(t, "\n");
        render_list(m, depth + 1, t);
    } else if (is_container(m)) {
        text_adds(t, " none");
    } else {
        text_adds(t, " ");
        render_scalar(m, t);
    }
}

/* An object or array as a Markdown list: "- key: value" per member of an
 * object, "- item" per element of an array; an object inside an array is
 * one item, its scalar members on the line ("key: value, key: value") and
 * its containers as lists below. */
static void render_list(const cJSON *v, int depth, text *t)
{
    const cJSON *m;
    cJSON_ArrayForEach(m, v) {
        if (t->len && t->s[t->len - 1] != '\n')
            text_adds(t, "\n");
        indent(t, depth);
        text_adds(t, "- ");
        if (cJSON_IsObject(v)) {
            render_member(m, depth, t);
        } else if (cJSON_IsObject(m) && cJSON_GetArraySize(m) > 0) {
            const cJSON *k;
            bool first = true;
            cJSON_ArrayForEach(k, m) {
                if (is_container(k) && cJSON_GetArraySize(k) > 0)
                    continue;
                text_adds(t, first ? "" : ", ");
                render_member(k, depth, t);
                first = false;
            }
            cJSON_ArrayForEach(k, m) {
                if (!is_container(k) || cJSON_GetArraySize(k) == 0)
                    continue;
                text_adds(t, "\n");
                indent(t, depth + 1);
                text_adds(t, "- ");
                render_member(k, depth + 1, t);
            }
        } else if (is_container(m) && cJSON_GetArraySize(m) > 0) {
            text_adds(t, "\n");
            render_list(m, depth + 1, t);
        } else if (is_container(m)) {
            text_adds(t, "none");
        } else {
            render_scalar(m, t);
        }
    }
}

/* Turns collected results into text for `complete`.data: strings as they
 * are, an object's "text"/"reply"/"message"/"answer"/"summary" string, any
 * other value as readable Markdown (render_list), never raw JSON. */
static void render_results(const cJSON *results, text *t)
{
    static const char *const fields[] = { "text", "reply", "message", "answer", "summary" };
    const cJSON *r;
    cJSON_ArrayForEach(r, results) {
        if (t->len)
            text_adds(t, "\n\n");
        if (!is_container(r)) {
            render_scalar(r, t);
            continue;
        }
        const cJSON *s = NULL;
        for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]) && !s && cJSON_IsObject(r); i++) {
            s = cJSON_GetObjectItemCaseSensitive(r, fields[i]);
            if (!cJSON_IsString(s))
                s = NULL;
        }
        if (s) {
            text_adds(t, s->valuestring);
            continue;
        }
        if (cJSON_GetArraySize(r) == 0)
            text_adds(t, "Done.");
        else
            render_list(r, 0, t);
    }
}

/* After an engine NOT_FOUND: fetches the registry afresh and tells
 * whether `command` is still one of the engine's commands (then the
 * handler's NOT_FOUND is about an argument, not the command). */
static bool command_offered(gassist_bridge *b, const char *command, double deadline_ms)
{
    char msg[512];
    int left = (int)(deadline_ms - rlai_clock_ms());
    int timeout = b->cfg.connect_timeout_ms < left ? b->cfg.connect_timeout_ms : left;
    if (timeout < 200)
        timeout = 200;
    if (refresh_registry(b, true, timeout, msg, sizeof(msg)) < 0)
        return false;
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(b->registry, "commands")) {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(e, "name");
        if (cJSON_IsString(n) && !strcmp(n->valuestring, command))
            return true;
    }
    return false;
}

/* Outcome of one engine call. */
typedef struct call_out {
    bool ok;                  /* done received */
    bool streamed;            /* at least one non-empty stream notification */
    cJSON *results;           /* array of decoded result values (owned) */
    rlai_msg_metrics metrics;
    bool has_metrics;
} call_out;

/* Runs `command` with params_json, relaying text as `stream`
 * notifications for request id, until done / error / deadline / stop. On
 * failure an `error` notification has been sent. */
static void run_call(gassist_bridge *b, const cJSON *id, const char *function, const char *command,
                     const char *params_json, double deadline_ms, call_out *out)
{
    memset(out, 0, sizeof(*out));
    out->results = cJSON_CreateArray();
    char msg[2048];
    int left = (int)(deadline_ms - rlai_clock_ms());
    int ctimeout = b->cfg.connect_timeout_ms < left ? b->cfg.connect_timeout_ms : left;
    if (ctimeout <= 0 || ensure_client(b, ctimeout, msg, sizeof(msg)) < 0) {
        if (ctimeout <= 0)
            snprintf(msg, sizeof(msg), "No time was left to ask the local AI engine.");
        notify_error(b, id, ctimeout <= 0 ? GASSIST_RPC_TIMEOUT : GASSIST_RPC_PLUGIN_ERROR, msg);
        return;
    }
    rlai_msg m;
    memset(&m, 0, sizeof(m));
    m.version = RLAI_PROTO_VERSION;
    m.type = RLAI_MSG_CALL;
    m.u.call.command = (char *)command;
    m.u.call.params_json = (char *)params_json;
    m.id = rlai_client_next_id(b->client);
    int rc = rlai_client_send(b->client, &m);
    if (rc == RLAI_ERR_DISCONNECTED) {
        drop_client(b);
        if (ensure_client(b, ctimeout, msg, sizeof(msg)) < 0) {
            notify_error(b, id, GASSIST_RPC_PLUGIN_ERROR, msg);
            return;
        }
        m.id = rlai_client_next_id(b->client);
        rc = rlai_client_send(b->client, &m);
    }
    if (rc < 0) {
        snprintf(msg, sizeof(msg), "Could not send %s to the local AI engine: %s.", function, rlai_strerror(rc));
        if (rc == RLAI_ERR_DISCONNECTED)
            drop_client(b);
        notify_error(b, id, rc == RLAI_ERR_TOO_LARGE ? GASSIST_RPC_INVALID_PARAMS : GASSIST_RPC_PLUGIN_ERROR, msg);
        return;
    }
    blog(b, GASSIST_LOG_DEBUG, "call %s (engine request %llu) params %.300s", command, (unsigned long long)m.id,
         params_json);
    double cancel_at = 0;
    bool stopped = false;
    for (;;) {
        double now = rlai_clock_ms();
        if (!cancel_at && (now >= deadline_ms || atomic_load(&b->stopping))) {
            stopped = atomic_load(&b->stopping);
            rlai_client_cancel(b->client, m.id);
            cancel_at = now;
        }
        if (cancel_at && now - cancel_at > CANCEL_GRACE_MS)
            break;
        rlai_msg f;
        rc = rlai_client_recv(b->client, 100, &f);
        if (rc == RLAI_ERR_TIMEOUT)
            continue;
        if (rc == RLAI_ERR_PROTOCOL) {
            blog(b, GASSIST_LOG_WARNING, "an engine frame did not decode; skipped");
            continue;
        }
        if (rc < 0) {
            drop_client(b);
            if (!cancel_at) {
                snprintf(msg, sizeof(msg), "The local AI engine went away while answering %s (%s). "
                         "Start it again with `rlai serve`.", function, rlai_strerror(rc));
                notify_error(b, id, GASSIST_RPC_PLUGIN_ERROR, msg);
                return;
            }
            break;
        }
        if (f.id != m.id) {
            rlai_msg_free(&f);
            continue;
        }
        bool end = false;
        switch (f.type) {
        case RLAI_MSG_TOKEN:
            if (!cancel_at && f.u.token.text && f.u.token.text[0]) {
                notify_stream(b, id, f.u.token.text);
                out->streamed = true;
            }
            break;
        case RLAI_MSG_RESULT: {
            cJSON *v = NULL;
            char err[160];
            if (gassist_msgpack_to_json(f.u.result.data, f.u.result.len, &v, err, sizeof(err)) < 0)
                blog(b, GASSIST_LOG_WARNING, "result of %s skipped: %s", command, err);
            else if (!out->results || !cJSON_AddItemToArray(out->results, v))
                cJSON_Delete(v);
            break;
        }
        case RLAI_MSG_DONE:
            end = true;
            out->has_metrics = f.u.done.has_metrics;
            out->metrics = f.u.done.metrics;
            if (cancel_at)
                break;
            out->ok = true;
            if (f.u.done.has_metrics) {
                const rlai_msg_metrics *mt = &f.u.done.metrics;
                blog(b, GASSIST_LOG_INFO,
                     "%s done: stop=%s prompt_tokens=%u reused_tokens=%u gen_tokens=%u ttft_ms=%.1f "
                     "decode_tps=%.1f queue_ms=%.1f",
                     command, f.u.done.stop ? f.u.done.stop : "", mt->prompt_tokens, mt->reused_tokens,
                     mt->gen_tokens, mt->ttft_ms, mt->decode_tps, mt->queue_ms);
            } else {
                blog(b, GASSIST_LOG_INFO, "%s done", command);
            }
            break;
        case RLAI_MSG_ERROR:
            end = true;
            if (!cancel_at) {
                blog(b, GASSIST_LOG_WARNING, "%s: engine error %s: %s", command,
                     f.u.error.name ? f.u.error.name : "?", f.u.error.msg ? f.u.error.msg : "");
                int code;
                if (f.u.error.code == RLAI_PE_NOT_FOUND && command_offered(b, command, deadline_ms)) {
                    /* The command exists: its handler did not find something
                     * an argument names (an unknown character). */
                    snprintf(msg, sizeof(msg), "The arguments for %s were refused by the engine: %s", function,
                             f.u.error.msg ? f.u.error.msg : "");
                    code = GASSIST_RPC_INVALID_PARAMS;
                } else {
                    code = map_engine_error(f.u.error.code, f.u.error.msg, command, function, msg, sizeof(msg));
                }
                notify_error(b, id, code, msg);
                rlai_msg_free(&f);
                return;
            }
            break;
        default:
            break;
        }
        rlai_msg_free(&f);
        if (end)
            break;
    }
    if (cancel_at && !stopped) {
        snprintf(msg, sizeof(msg),
                 "%s did not finish within %.1f s and was stopped. That is the RTX-LocalAI bridge's own limit for "
                 "one answer (timeout_ms = %d, kept under G-Assist's 30 s), not the engine's: raise it with "
                 "`--timeout-ms N` or \"timeout_ms\" in the bridge's config.json, or ask for a shorter answer.",
                 function, b->cfg.execute_timeout_ms / 1000.0, b->cfg.execute_timeout_ms);
        notify_error(b, id, GASSIST_RPC_TIMEOUT, msg);
    }
}

/* ---------------------------------------------------------- conversation */

static void conversation_end(conversation *c)
{
    free(c->command);
    free(c->function);
    free(c->session);
    free(c->text_param);
    cJSON_Delete(c->arguments);
    memset(c, 0, sizeof(*c));
}

static const cJSON *schema_of(const cJSON *entry)
{
    return cJSON_GetObjectItemCaseSensitive(entry, "parameters");
}

static bool takes_session(const cJSON *entry)
{
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(schema_of(entry), "properties");
    return cJSON_GetObjectItemCaseSensitive(props, RLAI_GASSIST_SESSION_PARAM) != NULL;
}

/* A streaming command with a "session" parameter holds a conversation
 * (loremaster.talk); a non-streaming one that takes a session acts on the
 * latest conversation (loremaster.reset). */
static bool is_conversational(const cJSON *entry)
{
    return takes_session(entry) && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(entry, "streams"));
}

static bool string_prop(const cJSON *props, const char *name)
{
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(props, name);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "type");
    return p && (!t || (cJSON_IsString(t) && !strcmp(t->valuestring, "string")));
}

/* The parameter that carries the user's words in follow-up turns: a
 * conventional name the schema has, else its first required string
 * parameter, else its first string parameter, else "input". */
static char *text_param_of(const cJSON *entry)
{
    static const char *const names[] = { "input", "message", "text", "prompt", "content", "query", "utterance" };
    const cJSON *schema = schema_of(entry);
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(schema, "properties");
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (string_prop(props, names[i]))
            return strdup(names[i]);
    const cJSON *r;
    cJSON_ArrayForEach(r, cJSON_GetObjectItemCaseSensitive(schema, "required")) {
        if (cJSON_IsString(r) && strcmp(r->valuestring, RLAI_GASSIST_SESSION_PARAM) &&
            string_prop(props, r->valuestring))
            return strdup(r->valuestring);
    }
    cJSON_ArrayForEach(r, props) {
        if (r->string && strcmp(r->string, RLAI_GASSIST_SESSION_PARAM) && string_prop(props, r->string))
            return strdup(r->string);
    }
    return strdup("input");
}

static bool is_exit_word(const char *s)
{
    static const char *const words[] = { "exit", "quit", "bye", "goodbye", "stop", "end", "leave" };
    while (*s && (isspace((unsigned char)*s) || *s == '/'))
        s++;
    size_t n = strlen(s);
    while (n && (isspace((unsigned char)s[n - 1]) || s[n - 1] == '.' || s[n - 1] == '!'))
        n--;
    for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++)
        if (strlen(words[i]) == n && !strncasecmp(s, words[i], n))
            return true;
    return false;
}

/* The session id of a call's results, when a result object carries one. */
static const char *result_session(const cJSON *results)
{
    const cJSON *r;
    cJSON_ArrayForEach(r, results) {
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(r, RLAI_GASSIST_SESSION_PARAM);
        if (cJSON_IsString(s) && s->valuestring[0])
            return s->valuestring;
        if (cJSON_IsNumber(s))
            return NULL;
    }
    return NULL;
}

/* ------------------------------------------------------------------ jobs */

static void do_initialize(gassist_bridge *b, job *j)
{
    char msg[1024];
    cJSON *commands = cJSON_CreateArray();
    int timeout = b->cfg.connect_timeout_ms < 1000 ? b->cfg.connect_timeout_ms : 1000;
    if (refresh_registry(b, true, timeout, msg, sizeof(msg)) == 0) {
        char err[256];
        rlai_gassist_manifest_opts o = { 0 };
        o.name = b->name;
        cJSON *m = rlai_gassist_manifest_build(b->registry, &o, err, sizeof(err));
        const cJSON *f;
        cJSON_ArrayForEach(f, cJSON_GetObjectItemCaseSensitive(m, "functions")) {
            cJSON *c = cJSON_CreateObject();
            cJSON_AddItemToObject(c, "name", cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(f, "name"), 1));
            cJSON_AddItemToObject(c, "description",
                                  cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(f, "description"), 1));
            cJSON_AddItemToArray(commands, c);
        }
        if (!m)
            blog(b, GASSIST_LOG_WARNING, "initialize: %s", err);
        cJSON_Delete(m);
    } else {
        blog(b, GASSIST_LOG_WARNING, "initialize: %s The functions of manifest.json are served once it runs.", msg);
    }
    int n_functions = cJSON_GetArraySize(commands);
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "name", b->name);
    cJSON_AddStringToObject(r, "version", RLAI_GASSIST_VERSION);
    cJSON_AddStringToObject(r, "description", "RTX-LocalAI bridge: commands of the local engine's plugins.");
    cJSON_AddStringToObject(r, "protocol_version", "2.0");
    cJSON_AddItemToObject(r, "commands", commands);
    cJSON *caps = cJSON_CreateArray();
    cJSON_AddItemToArray(caps, cJSON_CreateString("streaming"));
    cJSON_AddItemToArray(caps, cJSON_CreateString("passthrough"));
    cJSON_AddItemToObject(r, "capabilities", caps);
    send_json(b, gassist_rpc_result(j->id, r));
    blog(b, GASSIST_LOG_INFO, "initialized (%d functions)", n_functions);
}

/* Finds the registry entry for a G-Assist function (refreshing the
 * registry once on a miss). Sends the error notification and returns NULL
 * when there is none. */
static const cJSON *resolve(gassist_bridge *b, const cJSON *id, const char *function, double deadline_ms)
{
    char msg[2048];
    int left = (int)(deadline_ms - rlai_clock_ms());
    int timeout = b->cfg.connect_timeout_ms < left ? b->cfg.connect_timeout_ms : left;
    if (timeout <= 0) {
        notify_error(b, id, GASSIST_RPC_TIMEOUT, "No time was left to ask the local AI engine.");
        return NULL;
    }
    bool fresh = !b->registry || rlai_clock_ms() - b->registry_ms >= REGISTRY_TTL_MS;
    if (refresh_registry(b, false, timeout, msg, sizeof(msg)) < 0) {
        notify_error(b, id, GASSIST_RPC_PLUGIN_ERROR, msg);
        return NULL;
    }
    const cJSON *e = rlai_gassist_registry_find(b->registry, function);
    if (!e && !fresh) {
        if (refresh_registry(b, true, timeout, msg, sizeof(msg)) < 0) {
            notify_error(b, id, GASSIST_RPC_PLUGIN_ERROR, msg);
            return NULL;
        }
        e = rlai_gassist_registry_find(b->registry, function);
    }
    if (!e) {
        text list = { 0 };
        const cJSON *c;
        char fn[RLAI_GASSIST_MAX_FUNCTION + 1];
        cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(b->registry, "commands")) {
            const cJSON *n = cJSON_GetObjectItemCaseSensitive(c, "name");
            if (cJSON_IsString(n) && rlai_gassist_function_name(n->valuestring, fn, sizeof(fn)) == 0) {
                text_adds(&list, list.len ? ", " : "");
                text_adds(&list, fn);
            }
        }
        snprintf(msg, sizeof(msg),
                 "RTX-LocalAI has no function '%.200s' (the engine offers: %.1200s). The plugin's manifest.json "
                 "no longer matches the engine's plugins: regenerate it with `rlai gassist manifest -o "
                 "manifest.json` and restart G-Assist.",
                 function, list.len ? list.s : "nothing; is `rlai serve` running with its plugins?");
        free(list.s);
        notify_error(b, id, GASSIST_RPC_METHOD_NOT_FOUND, msg);
    }
    return e;
}

/* Ends a successful call with `complete`. */
static void finish_call(gassist_bridge *b, const cJSON *id, call_out *co, bool keep_session, const char *note)
{
    text t = { 0 };
    if (!co->streamed)
        render_results(co->results, &t);
    if (!co->streamed && !t.len)
        text_adds(&t, "Done.");
    if (note)
        text_adds(&t, note);
    notify_complete(b, id, t.s ? t.s : "", keep_session);
    free(t.s);
}

static void do_execute(gassist_bridge *b, job *j)
{
    double deadline = j->arrived_ms + b->cfg.execute_timeout_ms;
    /* An execute means G-Assist is not (or no longer) in passthrough. */
    conversation_end(&b->conv);
    const cJSON *e = resolve(b, j->id, j->function, deadline);
    if (!e)
        return;
    const char *command = cJSON_GetObjectItemCaseSensitive(e, "name")->valuestring;
    char *cmd = strdup(command);       /* the registry may be refreshed below */
    bool conversational = is_conversational(e);
    char *text_param = conversational ? text_param_of(e) : NULL;
    cJSON *args = j->arguments ? cJSON_Duplicate(j->arguments, 1) : cJSON_CreateObject();
    char *session = NULL;
    if (conversational) {
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(args, RLAI_GASSIST_SESSION_PARAM);
        if (cJSON_IsString(s) && s->valuestring[0]) {
            session = strdup(s->valuestring);
        } else {
            char buf[96];
            snprintf(buf, sizeof(buf), "gassist-%ld-%ld-%u", (long)getpid(), (long)time(NULL),
                     ++b->session_counter);
            session = strdup(buf);
            cJSON_DeleteItemFromObjectCaseSensitive(args, RLAI_GASSIST_SESSION_PARAM);
            cJSON_AddStringToObject(args, RLAI_GASSIST_SESSION_PARAM, session);
        }
    } else if (takes_session(e) && b->last_session &&
               !cJSON_GetObjectItemCaseSensitive(args, RLAI_GASSIST_SESSION_PARAM)) {
        cJSON_AddStringToObject(args, RLAI_GASSIST_SESSION_PARAM, b->last_session);
    }
    char *params = cJSON_PrintUnformatted(args);
    call_out co;
    run_call(b, j->id, j->function, cmd, params ? params : "{}", deadline, &co);
    if (co.ok) {
        if (conversational && session) {
            const char *rs = result_session(co.results);
            b->conv.active = true;
            b->conv.command = cmd;
            cmd = NULL;
            b->conv.function = strdup(j->function);
            b->conv.session = strdup(rs ? rs : session);
            b->conv.text_param = text_param;
            text_param = NULL;
            cJSON_DeleteItemFromObjectCaseSensitive(args, RLAI_GASSIST_SESSION_PARAM);
            b->conv.arguments = args;
            args = NULL;
            b->conv.started_ms = j->arrived_ms;
            free(b->last_session);
            b->last_session = strdup(b->conv.session);
            blog(b, GASSIST_LOG_INFO, "conversation %s with %s started (passthrough)", b->conv.session,
                 b->conv.command);
            finish_call(b, j->id, &co, true,
                        "\n\n_(Conversation mode: keep typing to continue; say \"exit\" to leave.)_");
        } else {
            finish_call(b, j->id, &co, false, NULL);
        }
    }
    cJSON_Delete(co.results);
    cJSON_Delete(args);
    free(params);
    free(session);
    free(text_param);
    free(cmd);
}

static void do_input(gassist_bridge *b, job *j)
{
    conversation *c = &b->conv;
    if (!c->active) {
        notify_error(b, j->id, GASSIST_RPC_PLUGIN_ERROR,
                     "No conversation is in progress here (the bridge may have restarted). Ask G-Assist again to "
                     "start one.");
        return;
    }
    if (is_exit_word(j->content)) {
        blog(b, GASSIST_LOG_INFO, "conversation %s ended by the user", c->session);
        conversation_end(c);
        notify_complete(b, j->id, "Conversation ended.", false);
        return;
    }
    double now = rlai_clock_ms();
    double session_end = c->started_ms + b->cfg.session_limit_ms;
    if (session_end - now < SESSION_MARGIN_MS) {
        blog(b, GASSIST_LOG_INFO, "conversation %s reached the session limit", c->session);
        conversation_end(c);
        notify_complete(b, j->id,
                        "This conversation reached G-Assist's time limit for one session. Start a new one to "
                        "keep talking.", false);
        return;
    }
    double deadline = j->arrived_ms + b->cfg.execute_timeout_ms;
    if (deadline > session_end)
        deadline = session_end;
    cJSON *args = c->arguments ? cJSON_Duplicate(c->arguments, 1) : cJSON_CreateObject();
    cJSON_DeleteItemFromObjectCaseSensitive(args, c->text_param);
    cJSON_AddStringToObject(args, c->text_param, j->content);
    cJSON_AddStringToObject(args, RLAI_GASSIST_SESSION_PARAM, c->session);
    char *params = cJSON_PrintUnformatted(args);
    cJSON_Delete(args);
    call_out co;
    run_call(b, j->id, c->function, c->command, params ? params : "{}", deadline, &co);
    free(params);
    if (co.ok) {
        const char *rs = result_session(co.results);
        if (rs && strcmp(rs, c->session)) {
            free(c->session);
            c->session = strdup(rs);
            free(b->last_session);
            b->last_session = strdup(rs);
        }
        bool keep = session_end - rlai_clock_ms() >= SESSION_MARGIN_MS;
        finish_call(b, j->id, &co, keep,
                    keep ? NULL : "\n\n_(This conversation reached G-Assist's time limit for one session.)_");
        if (!keep)
            conversation_end(c);
    } else {
        /* The error notification ends G-Assist's passthrough too. */
        conversation_end(c);
    }
    cJSON_Delete(co.results);
}

static void *worker_main(void *arg)
{
    gassist_bridge *b = arg;
    job *j;
    while ((j = dequeue(b)) != NULL) {
        switch (j->kind) {
        case JOB_INIT: do_initialize(b, j); break;
        case JOB_EXECUTE: do_execute(b, j); break;
        case JOB_INPUT: do_input(b, j); break;
        }
        job_free(j);
    }
    atomic_store(&b->worker_done, true);
    return NULL;
}

/* ---------------------------------------------------------------- reader */

static job *new_job(job_kind kind, const cJSON *id)
{
    job *j = calloc(1, sizeof(*j));
    if (!j)
        return NULL;
    j->kind = kind;
    j->id = id ? cJSON_Duplicate(id, 1) : cJSON_CreateNull();
    j->arrived_ms = rlai_clock_ms();
    return j;
}

static void handle_request(gassist_bridge *b, const gassist_rpc_msg *m)
{
    const char *method = m->method;
    const cJSON *params = m->params;
    char msg[512];
    if (!strcmp(method, "ping")) {
        cJSON *r = cJSON_CreateObject();
        const cJSON *ts = cJSON_GetObjectItemCaseSensitive(params, "timestamp");
        if (r && ts)
            cJSON_AddItemToObject(r, "timestamp", cJSON_Duplicate(ts, 1));
        send_json(b, gassist_rpc_result(m->id, r));
        return;
    }
    bool known = !strcmp(method, "initialize") || !strcmp(method, "execute") || !strcmp(method, "input") ||
                 !strcmp(method, "shutdown");
    if (!known) {
        snprintf(msg, sizeof(msg), "Method not found: '%.200s' (this plugin speaks initialize, ping, execute, "
                 "input and shutdown)", method);
        respond_error(b, m->id, GASSIST_RPC_METHOD_NOT_FOUND, msg);
        return;
    }
    if (params && !cJSON_IsObject(params)) {
        snprintf(msg, sizeof(msg), "Invalid params: %s takes an object", method);
        respond_error(b, m->id, GASSIST_RPC_INVALID_PARAMS, msg);
        return;
    }
    if (!strcmp(method, "shutdown")) {
        send_json(b, gassist_rpc_result(m->id, cJSON_CreateObject()));
        atomic_store(&b->stopping, true);
        return;
    }
    if (!strcmp(method, "initialize")) {
        const cJSON *pv = cJSON_GetObjectItemCaseSensitive(params, "protocol_version");
        if (pv && (!cJSON_IsString(pv) || strcmp(pv->valuestring, "2.0"))) {
            respond_error(b, m->id, GASSIST_RPC_INVALID_PARAMS,
                          "Invalid params: unsupported protocol_version (this plugin speaks \"2.0\")");
            return;
        }
        atomic_store(&b->initialized, true);
        job *j = new_job(JOB_INIT, m->id);
        if (!j || !enqueue(b, j)) {
            job_free(j);
            respond_error(b, m->id, GASSIST_RPC_RATE_LIMITED, "Rate limited: the plugin is busy");
        }
        return;
    }
    if (!strcmp(method, "execute")) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(params, "function");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(params, "arguments");
        if (!cJSON_IsString(fn) || !fn->valuestring[0] || strlen(fn->valuestring) > MAX_FUNCTION_NAME) {
            respond_error(b, m->id, GASSIST_RPC_INVALID_PARAMS,
                          "Invalid params: execute needs \"function\", a non-empty string of at most 256 bytes");
            return;
        }
        if (args && !cJSON_IsObject(args) && !cJSON_IsNull(args)) {
            respond_error(b, m->id, GASSIST_RPC_INVALID_PARAMS, "Invalid params: \"arguments\" must be an object");
            return;
        }
        job *j = new_job(JOB_EXECUTE, m->id);
        if (j) {
            j->function = strdup(fn->valuestring);
            j->arguments = cJSON_IsObject(args) ? cJSON_Duplicate(args, 1) : cJSON_CreateObject();
        }
        if (!j || !j->function || !j->arguments || !enqueue(b, j)) {
            job_free(j);
            notify_error(b, m->id, GASSIST_RPC_RATE_LIMITED,
                         "Too many requests are waiting for the local AI engine; try again in a moment.");
        }
        return;
    }
    /* input: acknowledge at once (the engine waits 2 s), then work. */
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(params, "content");
    if (!cJSON_IsString(content)) {
        respond_error(b, m->id, GASSIST_RPC_INVALID_PARAMS, "Invalid params: input needs \"content\", a string");
        return;
    }
    cJSON *ack = cJSON_CreateObject();
    cJSON_AddBoolToObject(ack, "acknowledged", 1);
    send_json(b, gassist_rpc_result(m->id, ack));
    job *j = new_job(JOB_INPUT, m->id);
    if (j)
        j->content = strdup(content->valuestring);
    if (!j || !j->content || !enqueue(b, j)) {
        job_free(j);
        notify_error(b, m->id, GASSIST_RPC_RATE_LIMITED,
                     "Too many requests are waiting for the local AI engine; try again in a moment.");
    }
}

static void handle_payload(gassist_bridge *b, const char *p, size_t n)
{
    gassist_rpc_msg m;
    cJSON *err_id = NULL;
    char err[256];
    int rc = gassist_rpc_parse(p, n, &m, &err_id, err, sizeof(err));
    if (rc < 0) {
        respond_error(b, err_id, rc, err);
        cJSON_Delete(err_id);
        return;
    }
    switch (m.kind) {
    case GASSIST_RPC_REQUEST:
        blog(b, GASSIST_LOG_DEBUG, "request %s", m.method);
        handle_request(b, &m);
        break;
    case GASSIST_RPC_NOTIFICATION:
        if (!strcmp(m.method, "shutdown"))
            atomic_store(&b->stopping, true);
        else
            blog(b, GASSIST_LOG_WARNING, "ignoring the notification '%.200s'", m.method);
        break;
    case GASSIST_RPC_RESPONSE:
        blog(b, GASSIST_LOG_DEBUG, "ignoring a response (this plugin sends no requests)");
        break;
    }
    gassist_rpc_msg_free(&m);
}

int gassist_bridge_new(const gassist_bridge_config *cfg, gassist_bridge **out)
{
    *out = NULL;
    gassist_bridge *b = calloc(1, sizeof(*b));
    if (!b)
        return RLAI_ERR_NOMEM;
    b->cfg = *cfg;
    if (b->cfg.connect_timeout_ms <= 0)
        b->cfg.connect_timeout_ms = 2000;
    if (b->cfg.execute_timeout_ms <= 0)
        b->cfg.execute_timeout_ms = 25000;
    if (b->cfg.session_limit_ms <= 0)
        b->cfg.session_limit_ms = 280000;
    b->endpoint = cfg->endpoint && *cfg->endpoint ? strdup(cfg->endpoint) : NULL;
    b->name = strdup(cfg->name ? cfg->name : RLAI_GASSIST_DEFAULT_NAME);
    b->cfg.endpoint = b->endpoint;
    b->cfg.name = b->name;
    gassist_frame_reader_init(&b->rd, cfg->in_fd);
    if (!b->name || (cfg->endpoint && *cfg->endpoint && !b->endpoint) ||
        gassist_frame_writer_init(&b->wr, cfg->out_fd) < 0) {
        free(b->endpoint);
        free(b->name);
        free(b);
        return RLAI_ERR_NOMEM;
    }
    pthread_mutex_init(&b->log_mu, NULL);
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->cv, NULL);
    atomic_init(&b->stopping, false);
    atomic_init(&b->worker_done, false);
    atomic_init(&b->initialized, false);
    *out = b;
    return 0;
}

int gassist_bridge_run(gassist_bridge *b)
{
    if (pthread_create(&b->worker, NULL, worker_main, b) != 0) {
        blog(b, GASSIST_LOG_ERROR, "cannot start the worker thread");
        return GASSIST_EXIT_PROTOCOL;
    }
    b->worker_started = true;
    char ep[512];
    blog(b, GASSIST_LOG_INFO, "rlai-gassist %s started (pid %ld, engine %s)", RLAI_GASSIST_VERSION,
         (long)getpid(), endpoint_text(b, ep, sizeof(ep)));
    int status = GASSIST_EXIT_OK;
    char msg[256];
    while (!atomic_load(&b->stopping)) {
        char *p = NULL;
        size_t n = 0;
        int rc = gassist_frame_read(&b->rd, &p, &n);
        if (rc == GASSIST_FRAME_OK) {
            handle_payload(b, p, n);
            free(p);
        } else if (rc == GASSIST_FRAME_EOF) {
            blog(b, GASSIST_LOG_INFO, "input closed: stopping");
            break;
        } else if (rc == GASSIST_FRAME_EMPTY) {
            respond_error(b, NULL, GASSIST_RPC_INVALID_REQUEST, "Invalid Request: a frame length of 0 is not allowed");
        } else if (rc == GASSIST_FRAME_OVERSIZE) {
            snprintf(msg, sizeof(msg),
                     "Invalid Request: a frame of %u bytes exceeds the 10 MiB (%u bytes) limit; it was skipped",
                     b->rd.last_length, GASSIST_FRAME_MAX);
            respond_error(b, NULL, GASSIST_RPC_INVALID_REQUEST, msg);
        } else {
            if (rc == RLAI_ERR_PROTOCOL && b->rd.last_length > GASSIST_FRAME_DRAIN_MAX) {
                snprintf(msg, sizeof(msg),
                         "Parse error: a frame header announces %u bytes; the input is not protocol V2 framing "
                         "(4-byte big-endian length + JSON). Stopping.", b->rd.last_length);
                respond_error(b, NULL, GASSIST_RPC_PARSE_ERROR, msg);
            } else {
                blog(b, GASSIST_LOG_ERROR, "input lost: %s", rc == RLAI_ERR_PROTOCOL
                     ? "it ended inside a frame" : rlai_strerror(rc));
            }
            status = GASSIST_EXIT_PROTOCOL;
            break;
        }
        if (gassist_frame_writer_broken(&b->wr)) {
            blog(b, GASSIST_LOG_ERROR, "output closed: stopping");
            status = GASSIST_EXIT_PROTOCOL;
            break;
        }
    }
    pthread_mutex_lock(&b->mu);
    atomic_store(&b->stopping, true);
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
    double until = rlai_clock_ms() + STOP_WAIT_MS;
    while (!atomic_load(&b->worker_done) && rlai_clock_ms() < until)
        usleep(10000);
    if (!atomic_load(&b->worker_done)) {
        /* The worker is blocked in the engine client: do not wait past
         * G-Assist's 2 s shutdown grace. */
        blog(b, GASSIST_LOG_WARNING, "the worker did not stop in time; exiting");
        _exit(status);
    }
    pthread_join(b->worker, NULL);
    b->worker_started = false;
    blog(b, GASSIST_LOG_INFO, "stopped");
    return status;
}

void gassist_bridge_destroy(gassist_bridge **self_p)
{
    if (!self_p || !*self_p)
        return;
    gassist_bridge *b = *self_p;
    job *j = b->head;
    while (j) {
        job *n = j->next;
        job_free(j);
        j = n;
    }
    conversation_end(&b->conv);
    free(b->last_session);
    cJSON_Delete(b->registry);
    rlai_client_close(b->client);
    gassist_frame_writer_destroy(&b->wr);
    pthread_mutex_destroy(&b->log_mu);
    pthread_mutex_destroy(&b->mu);
    pthread_cond_destroy(&b->cv);
    free(b->endpoint);
    free(b->name);
    free(b);
    *self_p = NULL;
}
