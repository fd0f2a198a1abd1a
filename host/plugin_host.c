/* plugin_host.c - plugin loading, command registry and call workers (see
 * plugin_host.h; the ABI is include/rlai/plugin.h). */
#include "plugin_host.h"
#include "gen_params.h"
#include "rlai/error.h"
#include "rlai/strbuf.h"
#include "rlai/clock.h"
#include "rlai/deadline.h"
#include "rlai/plugin.h"
#include "gguf_describe.h"
#include "metrics.h"
#include "tools.h"
#include "params_schema.h"
#include "rlai/protocol.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define HOST_VERSION "rtx-localai " RLAI_VERSION
#define PLUGIN_MAGIC 0x504c5547u   /* "PLUG" */
#define CALL_MAGIC 0x43414c4cu     /* "CALL" */
#define DEAD_MAGIC 0xdeadbeefu
#define MAX_MANIFEST_BYTES (64u << 10)
#define MAX_NAME 32
/* Largest text piece / result (estimated printed size) a plugin may send:
 * the protocol's string limit, which every transport carries. Results
 * nest at most RLAI_PROTO_MAX_DEPTH containers (json_msgpack's rule). */
#define RLAI_PLUGIN_MAX_OUTPUT RLAI_PROTO_MAX_STR

typedef struct command {
    char *name, *description;
    cJSON *schema;                  /* owned */
    rlai_command_fn handler;
    void *user;
    uint32_t flags;
    struct rlai_plugin *owner;
} command;

typedef struct pin {
    struct pin *next;
    rlai_token *toks;
    int n;
} pin;

struct rlai_plugin {
    uint32_t magic;
    rlai_plugin_host *host;
    struct rlai_plugin *next;
    char *name, *version, *description, *dir, *file;
    cJSON *config;                  /* merged config (owned) */
    void *dl;
    void (*fini)(void *);
    void *state;
    bool refused;                   /* a registration was refused during init */
    char refused_why[400];          /* the first refusal's reason */
    pin *pins;                      /* prefixes this plugin pinned */
    pthread_mutex_t pin_mu;
    cJSON *timeouts;                /* manifest "timeout_ms" object (owned) or NULL */
    uint32_t abi_minor;             /* the ABI minor it was built for */
};

/* A chat model a plugin offers (register_chat_model, ABI 1.2). */
typedef struct chat_model {
    struct chat_model *next;
    char *name, *command, *description;
    char *params_json;              /* the fixed params object, printed */
    struct rlai_plugin *owner;
} chat_model;

struct rlai_call {
    uint32_t magic;
    rlai_plugin_host *h;
    struct rlai_call *next;         /* queue / active list */
    uint64_t id;
    command *cmd;
    cJSON *params;
    rlai_call_sink sink;
    atomic_bool cancel;
    atomic_bool ended;              /* terminal sent (set under sink_mu) */
    atomic_bool returned;           /* its handler has returned (or never ran) */
    atomic_int refs;                /* queue/worker 1, watchdog or stop while ending it */
    pthread_mutex_t sink_mu;        /* every sink callback runs under it */
    int timeout_ms;                 /* this call's deadline, from acceptance; 0 = none */
    double deadline;                /* CLOCK_MONOTONIC seconds; 0 = none */
    bool running;                   /* its handler runs (under h->mu) */
    bool timed_out;                 /* the watchdog ended it (under h->mu) */
    bool replaced;                  /* its worker was replaced (under h->mu) */
    bool handed_off;                /* a worker was started while it waited on the
                                       engine; its thread leaves after it (under h->mu) */
    pthread_mutex_t mu;             /* guards engine_id */
    uint64_t engine_id;             /* running engine job, 0 = none */
    rlai_call_metrics metrics;
    const char *stop;               /* last engine job's stop, or "" */
};

struct rlai_plugin_host {
    rlai_plugin_host_params p;
    rlai_router *own_router;        /* when the params gave none */
    cJSON *plugin_config;           /* owned copy */
    pthread_mutex_t mu;             /* registry, queue, active list */
    pthread_cond_t cv;
    rlai_plugin *plugins;
    command **cmds;                 /* stable pointers: calls keep theirs */
    int n_cmds, cap_cmds;
    rlai_plugin *loading;           /* plugin whose init runs now */
    rlai_call *queue, *queue_tail;
    int n_queued;
    rlai_call *active;
    uint64_t next_id;
    bool stopping;
    struct worker *workers;         /* every thread started, exited ones included */
    struct rlai_plugin_host *next_abandoned;
    int n_alive;                    /* worker threads not yet exited */
    int n_running;                  /* handlers running now */
    int n_stuck;                    /* handlers running past their deadline */
    int n_replaced;                 /* extra threads started for stuck ones, still stuck */
    int n_engine_waits;             /* handlers waiting for an engine job now */
    int n_handoff;                  /* extra threads started for them, their calls not ended */
    chat_model *chat_models;        /* register_chat_model */
    pthread_t watchdog;
    pthread_cond_t wd_cv;           /* the watchdog's tick / stop */
    bool watchdog_started;
    bool stopped;                   /* rlai_plugin_host_stop ran */
    int left_running;               /* handlers still running when stop gave up */
};

typedef struct worker {
    struct worker *next;
    rlai_plugin_host *h;
    pthread_t t;
    bool exited;                    /* under h->mu */
} worker;

static const rlai_host_api host_api;

/* ---------------------------------------------------------- small helpers */

static bool valid_ident(const char *s, size_t max)
{
    size_t n = strlen(s);
    if (n == 0 || n > max || !(s[0] >= 'a' && s[0] <= 'z'))
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_'))
            return false;
    return true;
}

static bool plugin_ok(const rlai_plugin *p)
{
    return p && p->magic == PLUGIN_MAGIC;
}

static bool call_ok(const rlai_call *c)
{
    return c && c->magic == CALL_MAGIC;
}

/* The ownership/permission rule for a plugin file or folder (already
 * fstat'd): owned by the effective user or root, not writable by group or
 * others. A root-owned sticky folder (/tmp) is accepted as the plugin root
 * only (others cannot rename or replace entries they do not own there). */
static int check_mode(const struct stat *st, const char *path, bool root_dir, char *err, size_t errlen)
{
    uid_t me = geteuid();
    if (st->st_uid != me && st->st_uid != 0) {
        rlai_errf(err, errlen, 0, "%s: refused: owned by uid %u, not by this user (%u) or root", path,
                (unsigned)st->st_uid, (unsigned)me);
        return RLAI_ERR_INVALID_ARG;
    }
    if (st->st_mode & (S_IWGRP | S_IWOTH)) {
        if (root_dir && S_ISDIR(st->st_mode) && (st->st_mode & S_ISVTX) && st->st_uid == 0)
            return 0;
        rlai_errf(err, errlen, 0, "%s: refused: the %s is %s-writable (chmod go-w)", path,
                S_ISDIR(st->st_mode) ? "folder" : "file", (st->st_mode & S_IWOTH) ? "world" : "group");
        return RLAI_ERR_INVALID_ARG;
    }
    return 0;
}

/* Opens `name` inside the folder dirfd without following a symbolic link
 * and without blocking (a FIFO or device never hangs the loader), accepts
 * a regular file only and applies check_mode. Returns the fd or a
 * negative error with a message naming `path`. */
static int open_plugin_file(int dirfd, const char *name, const char *path, char *err, size_t errlen)
{
    struct stat st;
    if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
        rlai_errf(err, errlen, 0, "%s: %s", path, strerror(errno));
        return RLAI_ERR_IO;
    }
    if (S_ISLNK(st.st_mode)) {
        rlai_errf(err, errlen, 0, "%s: refused: it is a symbolic link (put the file itself in the plugin folder)", path);
        return RLAI_ERR_INVALID_ARG;
    }
    if (!S_ISREG(st.st_mode)) {
        rlai_errf(err, errlen, 0, "%s: refused: not a regular file", path);
        return RLAI_ERR_INVALID_ARG;
    }
    int fd = openat(dirfd, name, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        int e = errno;
        rlai_errf(err, errlen, 0, e == ELOOP ? "%s: refused: it is a symbolic link" : "%s: %s", path, strerror(e));
        return e == ELOOP ? RLAI_ERR_INVALID_ARG : RLAI_ERR_IO;
    }
    struct stat fst;
    if (fstat(fd, &fst) != 0 || !S_ISREG(fst.st_mode) || fst.st_ino != st.st_ino || fst.st_dev != st.st_dev) {
        rlai_errf(err, errlen, 0, "%s: refused: not a regular file (or replaced while opening)", path);
        close(fd);
        return RLAI_ERR_INVALID_ARG;
    }
    int rc = check_mode(&fst, path, false, err, errlen);
    if (rc < 0) {
        close(fd);
        return rc;
    }
    return fd;
}

/* Reads at most max bytes of an open regular file; NUL-terminated. */
static char *read_fd_small(int fd, const char *path, size_t max, char *err, size_t errlen)
{
    char *buf = malloc(max + 2);
    if (!buf) {
        rlai_errf(err, errlen, 0, "out of memory");
        return NULL;
    }
    size_t n = 0;
    for (;;) {
        ssize_t r = read(fd, buf + n, max + 1 - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            rlai_errf(err, errlen, 0, "%s: %s", path, strerror(errno));
            free(buf);
            return NULL;
        }
        if (r == 0)
            break;
        n += (size_t)r;
        if (n > max) {
            free(buf);
            rlai_errf(err, errlen, 0, "%s: larger than %zu bytes", path, max);
            return NULL;
        }
    }
    buf[n] = 0;
    return buf;
}

/* ---------------------------------------------------------- host API: basics */

static const char *api_host_version(void)
{
    return HOST_VERSION;
}

static void *api_alloc(size_t n)
{
    return malloc(n ? n : 1);
}

static void api_free(void *p)
{
    free(p);
}

static void vlog(const rlai_plugin *p, int level, const char *fmt, va_list ap)
{
    if (level >= RLAI_LOG_INFO && p && p->host && p->host->p.quiet)
        return;
    static const char *names[] = { "", "error", "warning", "info", "debug" };
    char line[1024];
    vsnprintf(line, sizeof(line), fmt, ap);
    fprintf(stderr, "rlai: plugin %s: %s%s%s\n", p && p->name ? p->name : "?",
            level >= 1 && level <= 4 ? names[level] : "", level >= 1 && level <= 4 ? ": " : "", line);
}

static void api_log(rlai_plugin *self, int level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vlog(plugin_ok(self) ? self : NULL, level, fmt, ap);
    va_end(ap);
}

static void host_log(const rlai_plugin_host *h, const char *fmt, ...)
{
    if (h->p.quiet)
        return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "rlai: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* ---------------------------------------------------------- registry */

static command *find_cmd(rlai_plugin_host *h, const char *name)
{
    for (int i = 0; i < h->n_cmds; i++)
        if (strcmp(h->cmds[i]->name, name) == 0)
            return h->cmds[i];
    return NULL;
}

static void free_cmd(command *c)
{
    if (!c)
        return;
    free(c->name);
    free(c->description);
    cJSON_Delete(c->schema);
    free(c);
}

static int api_register_command(rlai_plugin *self, const rlai_command_desc *d_in, size_t size)
{
    if (!plugin_ok(self) || !d_in)
        return RLAI_ERR_INVALID_ARG;
    rlai_plugin_host *h = self->host;
    if (size > sizeof(rlai_command_desc)) {
        api_log(self, RLAI_LOG_ERROR, "%s: command descriptor of %zu bytes is newer than this host's (%zu)",
                self->file, size, sizeof(rlai_command_desc));
        self->refused = true;
        return RLAI_ERR_UNSUPPORTED;
    }
    rlai_command_desc d;
    memset(&d, 0, sizeof(d));
    memcpy(&d, d_in, size);
    pthread_mutex_lock(&h->mu);
    int rc = 0;
    char why[600] = "";
    size_t nlen = strlen(self->name);
    cJSON *schema = NULL;
    if (h->loading != self) {
        rc = RLAI_ERR_BUSY;
        snprintf(why, sizeof(why), "commands can only be registered during rlai_plugin_init");
    } else if (size < offsetof(rlai_command_desc, user) || !d.name || !d.handler) {
        rc = RLAI_ERR_INVALID_ARG;
        snprintf(why, sizeof(why), "a command needs a name and a handler");
    } else if (strncmp(d.name, self->name, nlen) != 0 || d.name[nlen] != '.' ||
               !valid_ident(d.name + nlen + 1, 64)) {
        rc = RLAI_ERR_INVALID_ARG;
        snprintf(why, sizeof(why), "command name '%.100s' is not '%s.<verb>' (verb of a-z, 0-9, _)",
                 d.name, self->name);
    } else if (!d.description || !*d.description) {
        rc = RLAI_ERR_INVALID_ARG;
        snprintf(why, sizeof(why), "command '%.100s' has no description", d.name);
    } else if (find_cmd(h, d.name)) {
        rc = RLAI_ERR_EXISTS;
        snprintf(why, sizeof(why), "command '%.100s' is already registered by plugin '%s'", d.name,
                 find_cmd(h, d.name)->owner->name);
    } else {
        schema = d.params_schema ? cJSON_Parse(d.params_schema) : cJSON_Parse("{\"type\":\"object\"}");
        char serr[400];
        if (!cJSON_IsObject(schema)) {
            rc = RLAI_ERR_INVALID_ARG;
            snprintf(why, sizeof(why), "command '%.100s': params_schema is not a JSON object", d.name);
        } else if (rlai_params_schema_check(schema, serr, sizeof(serr)) < 0) {
            rc = RLAI_ERR_INVALID_ARG;
            snprintf(why, sizeof(why), "command '%.100s': %.400s", d.name, serr);
        }
    }
    if (rc == 0 && h->n_cmds == h->cap_cmds) {
        int cap = h->cap_cmds ? h->cap_cmds * 2 : 16;
        command **nc = realloc(h->cmds, sizeof(command *) * (size_t)cap);
        if (!nc) {
            rc = RLAI_ERR_NOMEM;
            snprintf(why, sizeof(why), "out of memory");
        } else {
            h->cmds = nc;
            h->cap_cmds = cap;
        }
    }
    if (rc == 0) {
        command *c = calloc(1, sizeof(*c));
        if (!c) {
            cJSON_Delete(schema);
            pthread_mutex_unlock(&h->mu);
            self->refused = true;
            return RLAI_ERR_NOMEM;
        }
        c->name = strdup(d.name);
        c->description = strdup(d.description);
        c->schema = schema;
        schema = NULL;
        c->handler = d.handler;
        c->user = d.user;
        c->flags = d.flags;
        c->owner = self;
        if (!c->name || !c->description) {
            free_cmd(c);
            rc = RLAI_ERR_NOMEM;
            snprintf(why, sizeof(why), "out of memory");
        } else {
            h->cmds[h->n_cmds++] = c;
        }
    }
    pthread_mutex_unlock(&h->mu);
    cJSON_Delete(schema);
    if (rc < 0) {
        if (!self->refused)
            snprintf(self->refused_why, sizeof(self->refused_why), "%.399s", why);
        self->refused = true;
        api_log(self, RLAI_LOG_ERROR, "%s: registration refused: %s", self->file, why);
    }
    return rc;
}

/* Removes every command of plugin p (load failure or unload). */
static void free_chat_model(chat_model *m)
{
    free(m->name);
    free(m->command);
    free(m->description);
    free(m->params_json);
    free(m);
}

static void unregister_all(rlai_plugin_host *h, rlai_plugin *p)
{
    pthread_mutex_lock(&h->mu);
    int w = 0;
    for (int i = 0; i < h->n_cmds; i++) {
        if (h->cmds[i]->owner == p)
            free_cmd(h->cmds[i]);
        else
            h->cmds[w++] = h->cmds[i];
    }
    h->n_cmds = w;
    for (chat_model **mp = &h->chat_models; *mp;) {
        chat_model *m = *mp;
        if (m->owner == p) {
            *mp = m->next;
            free_chat_model(m);
        } else {
            mp = &m->next;
        }
    }
    pthread_mutex_unlock(&h->mu);
}

static void api_set_state(rlai_plugin *self, void *state)
{
    if (plugin_ok(self))
        self->state = state;
}

static bool valid_model_id(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 200)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
              c == '-'))
            return false;
    }
    return true;
}

static int api_register_chat_model(rlai_plugin *self, const char *model, const char *command_name,
                                   const char *params_json, const char *description)
{
    if (!plugin_ok(self) || !model || !command_name)
        return RLAI_ERR_INVALID_ARG;
    rlai_plugin_host *h = self->host;
    size_t nlen = strlen(self->name);
    cJSON *params = params_json ? cJSON_Parse(params_json) : cJSON_CreateObject();
    char *printed = cJSON_IsObject(params) ? cJSON_PrintUnformatted(params) : NULL;
    bool params_ok = cJSON_IsObject(params);
    cJSON_Delete(params);
    pthread_mutex_lock(&h->mu);
    int rc = 0;
    char why[400] = "";
    const command *cmd = find_cmd(h, command_name);
    if (h->loading != self) {
        rc = RLAI_ERR_BUSY;
        snprintf(why, sizeof(why), "chat models can only be registered during rlai_plugin_init");
    } else if (strncmp(model, self->name, nlen) != 0 || model[nlen] != '/' || !valid_model_id(model + nlen + 1)) {
        rc = RLAI_ERR_INVALID_ARG;
        snprintf(why, sizeof(why), "chat model '%.100s' is not '%s/<id>' (id of A-Z, a-z, 0-9, '.', '_', '-')",
                 model, self->name);
    } else if (!cmd || cmd->owner != self) {
        rc = RLAI_ERR_INVALID_ARG;
        snprintf(why, sizeof(why), "chat model '%.100s': '%.100s' is not a command of plugin '%s'", model,
                 command_name, self->name);
    } else if (!params_ok) {
        rc = RLAI_ERR_INVALID_ARG;
        snprintf(why, sizeof(why), "chat model '%.100s': params are not a JSON object", model);
    } else {
        for (const chat_model *m = h->chat_models; m; m = m->next)
            if (!strcmp(m->name, model)) {
                rc = RLAI_ERR_EXISTS;
                snprintf(why, sizeof(why), "chat model '%.100s' is already registered", model);
            }
    }
    if (rc == 0) {
        chat_model *m = calloc(1, sizeof(*m));
        if (m && (m->name = strdup(model)) && (m->command = strdup(command_name)) &&
            (!description || (m->description = strdup(description))) && printed) {
            m->params_json = printed;
            printed = NULL;
            m->owner = self;
            chat_model **tail = &h->chat_models;   /* keep registration order */
            while (*tail)
                tail = &(*tail)->next;
            *tail = m;
        } else {
            if (m)
                free_chat_model(m);
            rc = RLAI_ERR_NOMEM;
        }
    }
    pthread_mutex_unlock(&h->mu);
    free(printed);
    if (rc < 0 && rc != RLAI_ERR_NOMEM)
        api_log(self, RLAI_LOG_ERROR, "%s: %s", self->file, why);
    return rc;
}

static const cJSON *api_config(rlai_plugin *self)
{
    return plugin_ok(self) ? self->config : NULL;
}

static const char *api_plugin_dir(rlai_plugin *self)
{
    return plugin_ok(self) ? self->dir : NULL;
}

/* ---------------------------------------------------------- host API: replies */

/* Sink access. Every sink callback runs under call->sink_mu and only while
 * the call has not ended, so the watchdog (TIMEOUT), a shutdown and the
 * handler never race on a sink whose receiver is gone after its terminal. */

/* Ends the call with an error unless it already ended. Returns true when
 * this sent the terminal. */
static bool end_with_error(rlai_call *c, int code, const char *msg)
{
    pthread_mutex_lock(&c->sink_mu);
    bool first = !atomic_load(&c->ended);
    if (first) {
        atomic_store(&c->ended, true);
        c->sink.error(c->sink.user, code, msg && *msg ? msg : rlai_strerror(code));
    }
    pthread_mutex_unlock(&c->sink_mu);
    return first;
}

/* own_thread: called by the handler's worker (c->metrics is then stable);
 * stop() ending a call whose handler may still run passes no metrics. */
static bool end_with_done(rlai_call *c, const char *stop, bool own_thread)
{
    pthread_mutex_lock(&c->sink_mu);
    bool first = !atomic_load(&c->ended);
    if (first) {
        atomic_store(&c->ended, true);
        static const rlai_call_metrics none = { .valid = false };
        c->sink.done(c->sink.user, stop, own_thread ? &c->metrics : &none);
    }
    pthread_mutex_unlock(&c->sink_mu);
    return first;
}

/* A token piece to the sink (handler or engine thread). Returns 0 or
 * RLAI_ERR_CANCELLED (ended, cancelled or receiver gone). */
static int send_token(rlai_call *c, const char *text, size_t len)
{
    int rc = 0;
    pthread_mutex_lock(&c->sink_mu);
    if (atomic_load(&c->ended) || atomic_load(&c->cancel)) {
        rc = RLAI_ERR_CANCELLED;
    } else if (c->sink.token(c->sink.user, text, len) != 0) {
        atomic_store(&c->cancel, true);
        rc = RLAI_ERR_CANCELLED;
    }
    pthread_mutex_unlock(&c->sink_mu);
    return rc;
}

/* Strict UTF-8 (no overlong forms, surrogates or code points past
 * U+10FFFF) without NUL. Returns the offset of the first bad byte, or
 * len when all is well; *nul tells a NUL apart. */
static size_t utf8_check(const unsigned char *s, size_t len, bool *nul)
{
    *nul = false;
    size_t i = 0;
    while (i < len) {
        unsigned char b = s[i];
        if (b == 0) {
            *nul = true;
            return i;
        }
        if (b < 0x80) {
            i++;
            continue;
        }
        size_t n;
        uint32_t cp, min;
        if ((b & 0xe0) == 0xc0) { n = 2; cp = b & 0x1f; min = 0x80; }
        else if ((b & 0xf0) == 0xe0) { n = 3; cp = b & 0x0f; min = 0x800; }
        else if ((b & 0xf8) == 0xf0) { n = 4; cp = b & 0x07; min = 0x10000; }
        else return i;
        if (len - i < n)
            return i;
        for (size_t k = 1; k < n; k++) {
            if ((s[i + k] & 0xc0) != 0x80)
                return i;
            cp = cp << 6 | (s[i + k] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return i;
        i += n;
    }
    return len;
}

/* Checks a result value: nesting, strings and keys (UTF-8, no NUL), and
 * the printed size. Returns 0 or an error with a message in why. */
static int check_json(const cJSON *v, int depth, size_t *budget, char *why, size_t whylen)
{
    for (const cJSON *it = v; it; it = depth ? it->next : NULL) {
        if ((cJSON_IsArray(it) || cJSON_IsObject(it)) && depth >= RLAI_PROTO_MAX_DEPTH) {
            rlai_errf(why, whylen, 0, "the value nests deeper than %d levels", RLAI_PROTO_MAX_DEPTH);
            return RLAI_ERR_TOO_LARGE;
        }
        bool nul;
        const char *strs[2] = { it->string, cJSON_IsString(it) ? it->valuestring : NULL };
        for (int k = 0; k < 2; k++) {
            if (!strs[k])
                continue;
            size_t n = strlen(strs[k]);
            if (utf8_check((const unsigned char *)strs[k], n, &nul) != n) {
                rlai_errf(why, whylen, 0, "a %s is not valid UTF-8", k ? "string" : "key");
                return RLAI_ERR_INVALID_ARG;
            }
            if (n + 8 > *budget) {
                rlai_errf(why, whylen, 0, "the value is larger than %u bytes", RLAI_PLUGIN_MAX_OUTPUT);
                return RLAI_ERR_TOO_LARGE;
            }
            *budget -= n + 8;
        }
        if (*budget < 16) {
            rlai_errf(why, whylen, 0, "the value is larger than %u bytes", RLAI_PLUGIN_MAX_OUTPUT);
            return RLAI_ERR_TOO_LARGE;
        }
        *budget -= 16;
        if ((cJSON_IsArray(it) || cJSON_IsObject(it)) && it->child) {
            int rc = check_json(it->child, depth + 1, budget, why, whylen);
            if (rc < 0)
                return rc;
        }
        if (!depth)
            break;
    }
    return 0;
}

/* Output a plugin sends that no transport could carry ends the call with
 * an error (the same on every transport) and the code goes back to the
 * plugin. */
static int refuse_output(rlai_call *c, int code, const char *what, const char *why)
{
    char msg[512];
    snprintf(msg, sizeof(msg), "plugin output refused: %s of '%s': %s", what, c->cmd ? c->cmd->name : "?", why);
    if (c->cmd && c->cmd->owner)
        api_log(c->cmd->owner, RLAI_LOG_ERROR, "%s", msg);
    end_with_error(c, code, msg);
    return code;
}

static int api_reply_json(rlai_call *call, cJSON *value)
{
    if (!call_ok(call)) {
        cJSON_Delete(value);
        return RLAI_ERR_INVALID_ARG;
    }
    int rc = 0;
    if (!value) {
        rc = RLAI_ERR_INVALID_ARG;
    } else if (atomic_load(&call->ended) || atomic_load(&call->cancel)) {
        rc = RLAI_ERR_CANCELLED;
    } else {
        char why[200];
        size_t budget = RLAI_PLUGIN_MAX_OUTPUT;
        rc = check_json(value, 0, &budget, why, sizeof(why));
        if (rc < 0) {
            refuse_output(call, rc, "reply_json", why);
        } else {
            int src = 0;
            pthread_mutex_lock(&call->sink_mu);
            if (atomic_load(&call->ended) || atomic_load(&call->cancel)) {
                rc = RLAI_ERR_CANCELLED;
            } else if ((src = call->sink.result(call->sink.user, value)) > 0) {
                atomic_store(&call->cancel, true);
                rc = RLAI_ERR_CANCELLED;
            }
            pthread_mutex_unlock(&call->sink_mu);
            if (src < 0)   /* the transport cannot carry it (e.g. over its frame limit) */
                rc = refuse_output(call, src, "reply_json", "the transport cannot carry the value (over its "
                                                            "frame limit)");
        }
    }
    cJSON_Delete(value);
    return rc;
}

static int api_reply_error(rlai_call *call, int code, const char *fmt, ...)
{
    if (!call_ok(call))
        return code;
    if (code >= 0)
        code = RLAI_ERR_INVALID_ARG;
    if (atomic_load(&call->ended))
        return code;
    char msg[1024] = "";
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
    }
    /* the message goes into an error frame: make it valid UTF-8 */
    bool nul;
    size_t n = strlen(msg), at;
    while ((at = utf8_check((const unsigned char *)msg, n, &nul)) < n)
        msg[at] = '?';
    end_with_error(call, code, msg);
    return code;
}

static int api_stream_text(rlai_call *call, const char *text, size_t len)
{
    if (!call_ok(call) || (!text && len))
        return RLAI_ERR_INVALID_ARG;
    if (atomic_load(&call->ended) || atomic_load(&call->cancel))
        return RLAI_ERR_CANCELLED;
    if (len > RLAI_PLUGIN_MAX_OUTPUT) {
        char why[96];
        snprintf(why, sizeof(why), "%zu bytes, larger than %u", len, RLAI_PLUGIN_MAX_OUTPUT);
        return refuse_output(call, RLAI_ERR_TOO_LARGE, "stream_text", why);
    }
    bool nul;
    size_t at = utf8_check((const unsigned char *)(text ? text : ""), len, &nul);
    if (at < len) {
        char why[96];
        snprintf(why, sizeof(why), nul ? "the text holds a NUL byte (at byte %zu)"
                                       : "the text is not valid UTF-8 (at byte %zu)", at);
        return refuse_output(call, RLAI_ERR_INVALID_ARG, "stream_text", why);
    }
    return send_token(call, text ? text : "", len);
}

static bool api_cancelled(rlai_call *call)
{
    return !call_ok(call) || atomic_load(&call->cancel) || atomic_load(&call->ended);
}

/* ---------------------------------------------------------- host API: engine */

static rlai_engine *engine_of_plugin(rlai_plugin *self)
{
    return plugin_ok(self) ? self->host->p.engine : NULL;
}

static int tokenize_text(rlai_engine *e, const char *text, rlai_token **out)
{
    size_t len = strlen(text);
    int n = rlai_engine_tokenize(e, text, len, true, true, NULL, 0);
    if (n < 0)
        return n;
    rlai_token *t = malloc(sizeof(rlai_token) * (size_t)(n > 0 ? n : 1));
    if (!t)
        return RLAI_ERR_NOMEM;
    n = rlai_engine_tokenize(e, text, len, true, true, t, n);
    if (n < 0) {
        free(t);
        return n;
    }
    *out = t;
    return n;
}

/* The engine's message array for a plugin's (*out malloc'd; the strings
 * stay borrowed). Returns 0, RLAI_ERR_INVALID_ARG or RLAI_ERR_NOMEM. */
static int chat_messages_of(const rlai_plugin_message *msgs, int n, rlai_chat_message **out)
{
    if (!msgs || n <= 0)
        return RLAI_ERR_INVALID_ARG;
    rlai_chat_message *cm = calloc((size_t)n, sizeof(*cm));
    if (!cm)
        return RLAI_ERR_NOMEM;
    for (int i = 0; i < n; i++) {
        if (!msgs[i].role || !msgs[i].content) {
            free(cm);
            return RLAI_ERR_INVALID_ARG;
        }
        cm[i].role = msgs[i].role;
        cm[i].content = msgs[i].content;
    }
    *out = cm;
    return 0;
}

/* Text (out) or, with toks, safe tokens (*toks malloc'd, count returned). */
static int format_chat_any(rlai_engine *e, const rlai_plugin_message *msgs, int n, bool gen, char **out,
                           rlai_token **toks)
{
    rlai_chat_message *cm = NULL;
    int crc = chat_messages_of(msgs, n, &cm);
    if (crc < 0)
        return crc;
    int rc;
    if (toks) {
        int nt = 0;
        rc = rlai_engine_tokenize_chat(e, cm, n, gen, toks, &nt);
        if (rc == 0)
            rc = nt;
    } else {
        rc = rlai_engine_apply_chat(e, cm, n, gen, out);
    }
    free(cm);
    return rc;
}

static int format_chat(rlai_engine *e, const rlai_plugin_message *msgs, int n, bool gen, char **out)
{
    return format_chat_any(e, msgs, n, gen, out, NULL);
}

typedef struct gen_wait {
    rlai_call *call;
    bool stream;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    int status;
    rlai_gen_metrics m;
    rlai_strbuf text;            /* the generation so far */
} gen_wait;

static int gen_on_token(void *user, rlai_token tok, const char *text, size_t len)
{
    (void)tok;
    gen_wait *w = user;
    if (len) {
        if (rlai_strbuf_add(&w->text, text, len) < 0)
            return 1;
        if (w->stream)
            send_token(w->call, text, len);
    }
    return atomic_load(&w->call->cancel) ? 1 : 0;
}

static void gen_on_done(void *user, uint64_t id, int status, const rlai_gen_metrics *m)
{
    (void)id;
    gen_wait *w = user;
    pthread_mutex_lock(&w->mu);
    w->status = status;
    if (m)
        w->m = *m;
    w->done = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static int start_worker(rlai_plugin_host *h);

/* The handler of `call` is about to wait for an engine job: when no other
 * worker is idle, start one so queued calls keep being served (the
 * "blocked client" of Redis modules, with the plugin API kept blocking).
 * The call's thread leaves the pool after the call, restoring its size.
 * At most max_queue such threads exist at once. */
static void engine_wait_begin(rlai_call *call)
{
    rlai_plugin_host *h = call->h;
    pthread_mutex_lock(&h->mu);
    h->n_engine_waits++;
    int idle = h->n_alive - h->n_running;
    if (idle <= 0 && !call->handed_off && !call->replaced && !h->stopping && h->n_handoff < h->p.max_queue &&
        start_worker(h) == 0) {
        call->handed_off = true;
        h->n_handoff++;
    }
    pthread_mutex_unlock(&h->mu);
}

static void engine_wait_end(rlai_call *call)
{
    rlai_plugin_host *h = call->h;
    pthread_mutex_lock(&h->mu);
    h->n_engine_waits--;
    pthread_mutex_unlock(&h->mu);
}

static int api_generate(rlai_call *call, const rlai_gen_request *req_in, size_t size, rlai_gen_result *out_p)
{
    if (!call_ok(call) || !req_in || !out_p)
        return RLAI_ERR_INVALID_ARG;
    /* The plugin's struct is as large as its ABI minor defines: write no
     * more than that (a 1.0/1.1 plugin has no drafted/accepted fields). */
    size_t out_size = call->cmd->owner->abi_minor >= 2 ? sizeof(rlai_gen_result) : RLAI_GEN_RESULT_SIZE_1_0;
    memset(out_p, 0, out_size);
    rlai_gen_result out_full, *out = &out_full;
    memset(out, 0, sizeof(*out));
    if (size > sizeof(rlai_gen_request))
        return RLAI_ERR_UNSUPPORTED;
    rlai_gen_request req;
    memset(&req, 0, sizeof(req));
    memcpy(&req, req_in, size);
    rlai_plugin_host *h = call->h;
    rlai_engine *e = h->p.engine;
    if (!e)
        return RLAI_ERR_NOT_IMPLEMENTED;
    if (api_cancelled(call))
        return RLAI_ERR_CANCELLED;
    int rc;
    rlai_route_request rq;
    memset(&rq, 0, sizeof(rq));
    rlai_chat_message *cm = NULL;
    if (req.messages && req.n_messages > 0) {   /* content never parsed for special tokens */
        if ((rc = chat_messages_of(req.messages, req.n_messages, &cm)) < 0)
            return rc;
        rq.text.messages = cm;
        rq.text.n_messages = req.n_messages;
    } else if (req.prompt) {
        rq.text.prompt = req.prompt;
    } else {
        return RLAI_ERR_INVALID_ARG;
    }
    rq.text.max_prompt_tokens = h->p.max_prompt_tokens;
    rq.response_format = req.response_format;
    rq.text.image_rgb = req.image_rgb;      /* the engine expands the prompt's <image> (engine.h) */
    rq.image_url = req.image_url;           /* a remote model's (router.h) */
    if (req.image_url && (req.image_rgb || !req.messages || req.n_messages <= 0)) {
        free(cm);
        return RLAI_ERR_INVALID_ARG;          /* plugin.h: with messages, not with image_rgb */
    }
    rq.text.image_width = req.image_width;
    rq.text.image_height = req.image_height;
    rq.model = req.model;                 /* zero for plugins that pass a smaller req_size */
    if (req.model && req.model[0] && strcmp(req.model, "default") &&
        !rlai_router_is_remote_model(h->p.router, req.model)) {
        free(cm);
        return RLAI_ERR_NOT_FOUND;        /* docs/REMOTE.md: NULL, "default" or a remote model */
    }
    gen_wait w;
    memset(&w, 0, sizeof(w));
    w.call = call;
    w.stream = req.stream;
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    rlai_request_params *rp = &rq.text.rp;
    rlai_gen_params_from_plugin(&req, &rp->gen);
    rlai_grammar *grammar = NULL;   /* structured output (host/tools.c) */
    if (req.response_format) {
        char gerr[300];
        cJSON *rf = cJSON_Parse(req.response_format);
        rc = rf ? rlai_response_format_grammar(rf, &grammar, gerr, sizeof(gerr)) : RLAI_ERR_INVALID_ARG;
        cJSON_Delete(rf);
        if (rc < 0) {
            free(cm);
            pthread_mutex_destroy(&w.mu);
            pthread_cond_destroy(&w.cv);
            return rc;
        }
        rp->gen.grammar = grammar;
    }
    rp->on_token = gen_on_token;
    rp->on_done = gen_on_done;
    rp->user = &w;
    uint64_t eid = 0;
    /* Publish the engine id before the job can run so a cancel finds it. */
    pthread_mutex_lock(&call->mu);
    rc = rlai_router_submit(h->p.router, &rq, &eid, NULL, NULL, 0);
    if (rc == 0)
        call->engine_id = eid;
    pthread_mutex_unlock(&call->mu);
    free(cm);
    rlai_grammar_unref(grammar);   /* the engine holds its own reference */
    if (rc < 0) {
        pthread_mutex_destroy(&w.mu);
        pthread_cond_destroy(&w.cv);
        return rc;
    }
    /* A cancel that raced the submit is re-applied here. */
    if (atomic_load(&call->cancel))
        rlai_router_cancel(h->p.router, eid);
    engine_wait_begin(call);
    pthread_mutex_lock(&w.mu);
    while (!w.done)
        pthread_cond_wait(&w.cv, &w.mu);
    pthread_mutex_unlock(&w.mu);
    engine_wait_end(call);
    pthread_mutex_lock(&call->mu);
    call->engine_id = 0;
    pthread_mutex_unlock(&call->mu);
    pthread_mutex_destroy(&w.mu);
    pthread_cond_destroy(&w.cv);
    if (w.status < 0 || w.text.oom) {
        rlai_strbuf_free(&w.text);
        return w.status < 0 ? w.status : RLAI_ERR_NOMEM;
    }
    rlai_strbuf_str(&w.text, "");              /* no text at all is "" */
    out->text = rlai_strbuf_take(&w.text);
    if (!out->text)
        return RLAI_ERR_NOMEM;
    out->prompt_tokens = w.m.prompt_tokens;
    out->reused_tokens = w.m.reused_tokens;
    out->gen_tokens = w.m.gen_tokens;
    out->queue_ms = w.m.queue_ms;
    out->ttft_ms = w.m.ttft_ms;
    out->prefill_tps = w.m.prefill_tps;
    out->decode_tps = w.m.decode_tps;
    out->stop = atomic_load(&call->cancel) ? "cancelled" : rlai_stop_reason_name(w.m.stop);
    out->drafted_tokens = w.m.drafted_tokens;
    out->accepted_tokens = w.m.accepted_tokens;
    call->metrics = (rlai_call_metrics){
        .valid = true, .prompt_tokens = out->prompt_tokens, .reused_tokens = out->reused_tokens,
        .gen_tokens = out->gen_tokens, .queue_ms = out->queue_ms, .ttft_ms = out->ttft_ms,
        .prefill_tps = out->prefill_tps, .decode_tps = out->decode_tps,
        .drafted_tokens = w.m.drafted_tokens, .accepted_tokens = w.m.accepted_tokens,
    };
    call->stop = out->stop;
    memcpy(out_p, out, out_size);
    return 0;
}

static int api_tokenize(rlai_plugin *self, const char *text, bool add_special, bool parse_special,
                        int32_t *out, int cap)
{
    rlai_engine *e = engine_of_plugin(self);
    if (!plugin_ok(self) || !text || cap < 0 || (cap > 0 && !out))
        return RLAI_ERR_INVALID_ARG;
    if (!e)
        return RLAI_ERR_NOT_IMPLEMENTED;
    return rlai_engine_tokenize(e, text, strlen(text), add_special, parse_special, out, cap);
}

static int api_apply_chat(rlai_plugin *self, const rlai_plugin_message *msgs, int n, bool gen, char **out)
{
    rlai_engine *e = engine_of_plugin(self);
    if (!plugin_ok(self) || !out)
        return RLAI_ERR_INVALID_ARG;
    *out = NULL;
    if (!e)
        return RLAI_ERR_NOT_IMPLEMENTED;
    return format_chat(e, msgs, n, gen, out);
}

static int api_tokenize_chat(rlai_plugin *self, const rlai_plugin_message *msgs, int n, bool gen, int32_t *out,
                             int cap)
{
    rlai_engine *e = engine_of_plugin(self);
    if (!plugin_ok(self) || cap < 0 || (cap > 0 && !out))
        return RLAI_ERR_INVALID_ARG;
    if (!e)
        return RLAI_ERR_NOT_IMPLEMENTED;
    rlai_token *toks = NULL;
    int nt = format_chat_any(e, msgs, n, gen, NULL, &toks);
    if (nt > 0 && out)
        memcpy(out, toks, sizeof(rlai_token) * (size_t)(nt < cap ? nt : cap));
    free(toks);
    return nt;
}

static int api_pin_prefix(rlai_plugin *self, const char *text)
{
    rlai_engine *e = engine_of_plugin(self);
    if (!plugin_ok(self) || !text)
        return RLAI_ERR_INVALID_ARG;
    if (!e)
        return RLAI_ERR_NOT_IMPLEMENTED;
    rlai_token *toks = NULL;
    int n = tokenize_text(e, text, &toks);
    if (n <= 0) {
        free(toks);
        return n < 0 ? n : 0;
    }
    pin *pn = calloc(1, sizeof(*pn));
    if (!pn) {
        free(toks);
        return RLAI_ERR_NOMEM;
    }
    int rc = rlai_engine_pin_prefix(e, toks, n);
    if (rc <= 0) {
        free(toks);
        free(pn);
        return rc;
    }
    pn->toks = toks;
    pn->n = n;
    pthread_mutex_lock(&self->pin_mu);
    pn->next = self->pins;
    self->pins = pn;
    pthread_mutex_unlock(&self->pin_mu);
    return rc;
}

static int api_unpin_prefix(rlai_plugin *self, const char *text)
{
    rlai_engine *e = engine_of_plugin(self);
    if (!plugin_ok(self) || !text)
        return RLAI_ERR_INVALID_ARG;
    if (!e)
        return RLAI_ERR_NOT_IMPLEMENTED;
    rlai_token *toks = NULL;
    int n = tokenize_text(e, text, &toks);
    if (n < 0)
        return n;
    int rc = RLAI_ERR_NOT_FOUND;
    pthread_mutex_lock(&self->pin_mu);
    for (pin **pp = &self->pins; *pp; pp = &(*pp)->next) {
        pin *pn = *pp;
        if (pn->n == n && memcmp(pn->toks, toks, sizeof(rlai_token) * (size_t)n) == 0) {
            *pp = pn->next;
            rc = rlai_engine_unpin_prefix(e, pn->toks, pn->n);
            free(pn->toks);
            free(pn);
            break;
        }
    }
    pthread_mutex_unlock(&self->pin_mu);
    free(toks);
    return rc;
}

static int api_model_info(rlai_plugin *self, cJSON **out)
{
    rlai_engine *e = engine_of_plugin(self);
    if (!plugin_ok(self) || !out)
        return RLAI_ERR_INVALID_ARG;
    *out = NULL;
    if (!e)
        return RLAI_ERR_NOT_IMPLEMENTED;
    rlai_model_info mi;
    rlai_engine_info(e, &mi);
    rlai_engine_stats st;
    rlai_engine_get_stats(e, &st);
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return RLAI_ERR_NOMEM;
    cJSON_AddStringToObject(o, "name", mi.name);
    cJSON_AddStringToObject(o, "arch", mi.arch);
    cJSON_AddNumberToObject(o, "n_ctx", mi.n_ctx);
    cJSON_AddNumberToObject(o, "n_ctx_train", mi.n_ctx_train);
    cJSON_AddNumberToObject(o, "n_layer", mi.n_layer);
    cJSON_AddNumberToObject(o, "n_embd", mi.n_embd);
    cJSON_AddNumberToObject(o, "n_head", mi.n_head);
    cJSON_AddNumberToObject(o, "n_head_kv", mi.n_head_kv);
    cJSON_AddNumberToObject(o, "head_dim", mi.head_dim);
    cJSON_AddNumberToObject(o, "n_ff", mi.n_ff);
    cJSON_AddNumberToObject(o, "n_vocab", mi.n_vocab);
    cJSON_AddNumberToObject(o, "n_params", (double)mi.n_params);
    cJSON_AddNumberToObject(o, "weight_bytes", (double)mi.weight_bytes);
    cJSON_AddStringToObject(o, "kernels", mi.isa);
    cJSON_AddNumberToObject(o, "threads", mi.n_threads);
    cJSON_AddNumberToObject(o, "kv_blocks_total", st.kv_blocks_total);
    cJSON_AddNumberToObject(o, "kv_blocks_free", st.kv_blocks_free);
    cJSON_AddNumberToObject(o, "kv_blocks_pinned", st.kv_blocks_pinned);
    cJSON_AddNumberToObject(o, "max_prompt_tokens",
                            self->host->p.max_prompt_tokens > 0 ? self->host->p.max_prompt_tokens : mi.n_ctx - 1);
    rlai_vision_info vi;
    if (rlai_engine_vision_info(e, &vi) == 0) {   /* rlai serve --mmproj */
        cJSON *v = cJSON_AddObjectToObject(o, "vision");
        if (v) {
            cJSON_AddNumberToObject(v, "n_tokens", vi.n_tokens);
            cJSON_AddNumberToObject(v, "image_size", vi.image_size);
            if (vi.image_token >= 0)
                cJSON_AddStringToObject(v, "image_token", vi.image_token_text);
            cJSON_AddStringToObject(v, "mmproj", vi.path);
        }
    }
    *out = o;
    return 0;
}

static int api_gguf_describe(const char *path, cJSON **out, char *err, size_t errlen)
{
    return rlai_host_gguf_describe(path, out, err, errlen);
}

static const rlai_host_api host_api = {
    .abi_version = RLAI_PLUGIN_ABI_VERSION,
    .struct_size = sizeof(rlai_host_api),
    .host_version = api_host_version,
    .strerror = rlai_strerror,
    .alloc = api_alloc,
    .free = api_free,
    .log = api_log,
    .register_command = api_register_command,
    .register_chat_model = api_register_chat_model,
    .set_state = api_set_state,
    .config = api_config,
    .plugin_dir = api_plugin_dir,
    .reply_json = api_reply_json,
    .reply_error = api_reply_error,
    .stream_text = api_stream_text,
    .cancelled = api_cancelled,
    .generate = api_generate,
    .tokenize = api_tokenize,
    .apply_chat = api_apply_chat,
    .pin_prefix = api_pin_prefix,
    .unpin_prefix = api_unpin_prefix,
    .model_info = api_model_info,
    .gguf_describe = api_gguf_describe,
    .tokenize_chat = api_tokenize_chat,
};

/* ---------------------------------------------------------- workers */

static void call_unref(rlai_call *c)
{
    if (atomic_fetch_sub(&c->refs, 1) != 1)
        return;
    cJSON_Delete(c->params);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->sink_mu);
    c->magic = DEAD_MAGIC;
    free(c);
}

static void run_call(rlai_call *c)
{
    int rc;
    if (atomic_load(&c->cancel)) {
        rc = RLAI_ERR_CANCELLED;
    } else {
        rc = c->cmd->handler(c, c->params, c->cmd->user);
    }
    /* before the terminal: a caller that saw it must find the call gone */
    atomic_store(&c->returned, true);
    if (atomic_load(&c->cancel))
        end_with_done(c, "cancelled", true);
    else if (rc < 0)
        end_with_error(c, rc, rlai_strerror(rc));
    else
        end_with_done(c, c->stop, true);
}

static void remove_from(rlai_call **list, rlai_call *c)
{
    for (rlai_call **pp = list; *pp; pp = &(*pp)->next)
        if (*pp == c) {
            *pp = c->next;
            c->next = NULL;
            return;
        }
}

static void publish_stuck(rlai_plugin_host *h)
{
    rlai_metrics_set_plugin_workers_stuck(h->p.metrics, h->n_stuck);
}

static int start_worker(rlai_plugin_host *h);

static void *worker_main(void *arg)
{
    worker *self = arg;
    rlai_plugin_host *h = self->h;
    pthread_mutex_lock(&h->mu);
    for (;;) {
        while (!h->queue && !h->stopping)
            pthread_cond_wait(&h->cv, &h->mu);
        if (!h->queue)
            break;   /* stopping and drained */
        rlai_call *c = h->queue;
        h->queue = c->next;
        if (!h->queue)
            h->queue_tail = NULL;
        h->n_queued--;
        if (h->stopping)
            atomic_store(&c->cancel, true);
        c->next = h->active;
        h->active = c;
        c->running = true;
        h->n_running++;
        pthread_mutex_unlock(&h->mu);
        run_call(c);
        pthread_mutex_lock(&h->mu);
        remove_from(&h->active, c);
        c->running = false;
        h->n_running--;
        bool leave = false;
        if (c->handed_off) {
            h->n_handoff--;
            leave = true;       /* a worker started while it waited took its place */
        }
        if (c->timed_out) {
            h->n_stuck--;
            if (c->replaced) {
                h->n_replaced--;
                leave = true;   /* a replacement took this thread's place */
            }
            publish_stuck(h);
        }
        pthread_cond_broadcast(&h->cv);
        pthread_mutex_unlock(&h->mu);
        call_unref(c);
        pthread_mutex_lock(&h->mu);
        if (leave)
            break;
    }
    self->exited = true;
    h->n_alive--;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

/* Under h->mu. */
static int start_worker(rlai_plugin_host *h)
{
    worker *w = calloc(1, sizeof(*w));
    if (!w)
        return RLAI_ERR_NOMEM;
    w->h = h;
    if (pthread_create(&w->t, NULL, worker_main, w) != 0) {
        free(w);
        return RLAI_ERR_NOMEM;
    }
    w->next = h->workers;
    h->workers = w;
    h->n_alive++;
    return 0;
}

/* Fails calls past their deadline with RLAI_ERR_TIMEOUT: queued ones are
 * dropped from the queue; running ones are ended, their engine job
 * cancelled, and their worker replaced (up to max_stuck extra threads) so
 * the pool keeps serving while the handler is stuck. The handler's late
 * output is dropped (the call has ended) and the call is freed when the
 * handler finally returns (refcount). */
static void *watchdog_main(void *arg)
{
    rlai_plugin_host *h = arg;
    pthread_mutex_lock(&h->mu);
    while (!h->stopping) {
        struct timespec ts;
        rlai_deadline_in(&ts, CLOCK_REALTIME, 50);
        pthread_cond_timedwait(&h->wd_cv, &h->mu, &ts);
        if (h->stopping)
            break;
        /* Reap threads that left (a replaced worker whose handler finally
         * returned): exited is set under h->mu just before the thread
         * returns, so the join is immediate. */
        for (worker **wp = &h->workers; *wp;) {
            worker *w = *wp;
            if (w->exited) {
                *wp = w->next;
                pthread_join(w->t, NULL);
                free(w);
            } else {
                wp = &w->next;
            }
        }
        double now = rlai_clock_s();
        rlai_call *expired = NULL;     /* linked through ->next (queued) */
        rlai_call *stuck[64];
        int n_stuck = 0;
        for (rlai_call **pp = &h->queue; *pp;) {
            rlai_call *c = *pp;
            if (c->deadline > 0 && now >= c->deadline) {
                *pp = c->next;
                if (h->queue_tail == c)
                    h->queue_tail = NULL;
                h->n_queued--;
                c->next = expired;
                expired = c;
            } else {
                pp = &c->next;
            }
        }
        if (!h->queue)
            h->queue_tail = NULL;
        else if (!h->queue_tail)
            for (h->queue_tail = h->queue; h->queue_tail->next;)
                h->queue_tail = h->queue_tail->next;
        for (rlai_call *c = h->active; c && n_stuck < 64; c = c->next) {
            if (c->timed_out || c->deadline <= 0 || now < c->deadline)
                continue;
            c->timed_out = true;
            h->n_stuck++;
            if (!c->handed_off && h->n_replaced < h->p.max_stuck && start_worker(h) == 0) {
                c->replaced = true;
                h->n_replaced++;
            }
            atomic_fetch_add(&c->refs, 1);
            stuck[n_stuck++] = c;
        }
        if (n_stuck)
            publish_stuck(h);
        pthread_mutex_unlock(&h->mu);
        for (rlai_call *c = expired, *next; c; c = next) {
            next = c->next;
            char msg[400];
            snprintf(msg, sizeof(msg), "command '%s' waited past its deadline of %d ms for a free plugin worker",
                     c->cmd->name, c->timeout_ms);
            fprintf(stderr, "rlai: plugin call timed out: %s\n", msg);
            rlai_metrics_count_plugin_timeout(h->p.metrics, c->cmd->name);
            end_with_error(c, RLAI_ERR_TIMEOUT, msg);
            call_unref(c);
        }
        for (int i = 0; i < n_stuck; i++) {
            rlai_call *c = stuck[i];
            atomic_store(&c->cancel, true);
            pthread_mutex_lock(&c->mu);
            if (c->engine_id && h->p.engine)
                rlai_router_cancel(h->p.router, c->engine_id);
            pthread_mutex_unlock(&c->mu);
            char msg[400];
            snprintf(msg, sizeof(msg), "command '%s' (plugin %s) did not finish within its deadline of %d ms",
                     c->cmd->name, c->cmd->owner->name, c->timeout_ms);
            fprintf(stderr, "rlai: plugin call timed out: %s; its handler is still running (%s)\n", msg,
                    c->replaced ? "worker replaced" : "no worker replaced: limit of stuck workers reached");
            rlai_metrics_count_plugin_timeout(h->p.metrics, c->cmd->name);
            end_with_error(c, RLAI_ERR_TIMEOUT, msg);
            call_unref(c);
        }
        pthread_mutex_lock(&h->mu);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

/* ---------------------------------------------------------- public */

int rlai_plugin_host_new(const rlai_plugin_host_params *p, rlai_plugin_host **out)
{
    if (!out)
        return RLAI_ERR_INVALID_ARG;
    *out = NULL;
    rlai_plugin_host *h = calloc(1, sizeof(*h));
    if (!h)
        return RLAI_ERR_NOMEM;
    if (p)
        h->p = *p;
    if (h->p.engine && !h->p.router) {
        int rrc = rlai_router_new(h->p.engine, &h->own_router);
        if (rrc < 0) {
            free(h);
            return rrc;
        }
        h->p.router = h->own_router;
    }
    if (h->p.workers <= 0)
        h->p.workers = 4;
    if (h->p.workers > 64)
        h->p.workers = 64;
    if (h->p.max_queue <= 0)
        h->p.max_queue = 64;
    if (h->p.call_timeout_ms == 0)
        h->p.call_timeout_ms = RLAI_PLUGIN_DEFAULT_TIMEOUT_MS;
    if (h->p.max_stuck <= 0)
        h->p.max_stuck = h->p.workers;
    if (h->p.max_stuck > 256)
        h->p.max_stuck = 256;
    h->plugin_config = p && p->plugin_config ? cJSON_Duplicate(p->plugin_config, true) : NULL;
    h->p.plugin_config = h->plugin_config;
    h->next_id = 1;
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    pthread_cond_init(&h->wd_cv, NULL);
    pthread_mutex_lock(&h->mu);
    int rc = 0;
    for (int i = 0; i < h->p.workers && rc == 0; i++)
        rc = start_worker(h);
    if (rc == 0 && pthread_create(&h->watchdog, NULL, watchdog_main, h) != 0)
        rc = RLAI_ERR_NOMEM;
    else if (rc == 0)
        h->watchdog_started = true;
    pthread_mutex_unlock(&h->mu);
    publish_stuck(h);
    if (rc < 0) {
        rlai_plugin_host_free(&h);
        return rc;
    }
    *out = h;
    return 0;
}

static void plugin_unload(rlai_plugin_host *h, rlai_plugin *p, bool run_fini)
{
    unregister_all(h, p);
    if (run_fini && p->fini)
        p->fini(p->state);
    while (p->pins) {
        pin *pn = p->pins;
        p->pins = pn->next;
        if (h->p.engine)
            rlai_engine_unpin_prefix(h->p.engine, pn->toks, pn->n);
        free(pn->toks);
        free(pn);
    }
    if (p->dl)
        dlclose(p->dl);
    cJSON_Delete(p->config);
    cJSON_Delete(p->timeouts);
    free(p->name);
    free(p->version);
    free(p->description);
    free(p->dir);
    free(p->file);
    pthread_mutex_destroy(&p->pin_mu);
    p->magic = DEAD_MAGIC;
    free(p);
}

/* Hosts given up on because handlers still ran in them: kept reachable
 * (never freed, plugins never unloaded) so a late handler finds valid
 * memory and code until the process exits. */
static rlai_plugin_host *volatile abandoned_hosts;
static pthread_mutex_t abandoned_mu = PTHREAD_MUTEX_INITIALIZER;

int rlai_plugin_host_stop(rlai_plugin_host *h, int timeout_ms)
{
    if (!h)
        return 0;
    pthread_mutex_lock(&h->mu);
    if (h->stopped) {
        int left = h->left_running;
        pthread_mutex_unlock(&h->mu);
        return left;
    }
    /* Cancel queued and running calls; workers end queued ones with a
     * "cancelled" terminal, running handlers see cancelled() and their
     * engine jobs are cancelled. */
    h->stopping = true;
    for (rlai_call *c = h->queue; c; c = c->next)
        atomic_store(&c->cancel, true);
    for (rlai_call *c = h->active; c; c = c->next) {
        atomic_store(&c->cancel, true);
        pthread_mutex_lock(&c->mu);
        if (c->engine_id && h->p.engine)
            rlai_router_cancel(h->p.router, c->engine_id);
        pthread_mutex_unlock(&c->mu);
    }
    pthread_cond_broadcast(&h->cv);
    pthread_cond_broadcast(&h->wd_cv);
    pthread_mutex_unlock(&h->mu);
    if (h->watchdog_started) {
        pthread_join(h->watchdog, NULL);
        h->watchdog_started = false;
    }
    struct timespec ts;
    rlai_deadline_in(&ts, CLOCK_REALTIME, timeout_ms);   /* unused when timeout_ms < 0 */
    pthread_mutex_lock(&h->mu);
    while (h->n_alive > 0) {
        if (timeout_ms < 0)
            pthread_cond_wait(&h->cv, &h->mu);
        else if (pthread_cond_timedwait(&h->cv, &h->mu, &ts) == ETIMEDOUT)
            break;
    }
    /* Past the deadline: end what is left ourselves (each caller gets its
     * terminal now), and leave the stuck handlers running. */
    rlai_call *left[256];
    int n = 0;
    while (h->queue && n < 256) {
        rlai_call *c = h->queue;
        h->queue = c->next;
        h->n_queued--;
        left[n++] = c;              /* the queue's reference moves to us */
    }
    if (!h->queue)
        h->queue_tail = NULL;
    int n_queued_left = n;
    for (rlai_call *c = h->active; c && n < 256; c = c->next) {
        atomic_fetch_add(&c->refs, 1);
        left[n++] = c;
    }
    h->stopped = true;
    h->left_running = h->n_running;
    int running = h->n_running;
    pthread_mutex_unlock(&h->mu);
    for (int i = 0; i < n; i++) {
        if (i >= n_queued_left)
            fprintf(stderr, "rlai: plugin command '%s' ignored the shutdown; its call is ended, its handler left "
                    "running\n", left[i]->cmd->name);
        end_with_done(left[i], "cancelled", false);
        call_unref(left[i]);
    }
    return running;
}

void rlai_plugin_host_free(rlai_plugin_host **self_p)
{
    if (!self_p || !*self_p)
        return;
    rlai_plugin_host *h = *self_p;
    *self_p = NULL;
    if (rlai_plugin_host_stop(h, -1) > 0) {
        /* Handlers still run plugin code with their calls: keep the host,
         * its commands and the libraries. Its threads are never joined:
         * detached, each frees its own resources when its handler returns. */
        pthread_mutex_lock(&h->mu);
        for (worker *w = h->workers; w; w = w->next)
            pthread_detach(w->t);
        pthread_mutex_unlock(&h->mu);
        pthread_mutex_lock(&abandoned_mu);
        h->next_abandoned = abandoned_hosts;
        abandoned_hosts = h;
        pthread_mutex_unlock(&abandoned_mu);
        return;
    }
    while (h->workers) {
        worker *w = h->workers;
        h->workers = w->next;
        pthread_join(w->t, NULL);
        free(w);
    }
    while (h->plugins) {
        rlai_plugin *p = h->plugins;
        h->plugins = p->next;
        plugin_unload(h, p, true);
    }
    for (int i = 0; i < h->n_cmds; i++)
        free_cmd(h->cmds[i]);
    free(h->cmds);
    cJSON_Delete(h->plugin_config);
    rlai_router_free(h->own_router);
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->cv);
    pthread_cond_destroy(&h->wd_cv);
    free(h);
}

int rlai_plugin_host_running(rlai_plugin_host *h)
{
    if (!h)
        return 0;
    pthread_mutex_lock(&h->mu);
    int n = h->n_running;
    pthread_mutex_unlock(&h->mu);
    return n;
}

int rlai_plugin_host_stuck(rlai_plugin_host *h)
{
    if (!h)
        return 0;
    pthread_mutex_lock(&h->mu);
    int n = h->n_stuck;
    pthread_mutex_unlock(&h->mu);
    return n;
}

/* "timeout_ms": {"*" | "<name>.<verb>": ms}. */
static bool timeouts_ok(const cJSON *t, const char *name)
{
    if (!t)
        return true;
    size_t nlen = strlen(name);
    for (const cJSON *it = t->child; it; it = it->next) {
        bool key_ok = strcmp(it->string, "*") == 0 ||
                      (strncmp(it->string, name, nlen) == 0 && it->string[nlen] == '.');
        if (!key_ok || !cJSON_IsNumber(it) || it->valuedouble < 1 || it->valuedouble > 86400000)
            return false;
    }
    return true;
}

/* Validates manifest.json of folder dir; fills name/version/description/
 * entry/config. Returns 0 or RLAI_ERR_FORMAT with a message. */
static int read_manifest(int dirfd, const char *dir, cJSON **root_out, char *err, size_t errlen)
{
    char path[PATH_MAX + 32];
    snprintf(path, sizeof(path), "%s/manifest.json", dir);
    int fd = open_plugin_file(dirfd, "manifest.json", path, err, errlen);
    if (fd < 0)
        return fd;
    char *text = read_fd_small(fd, path, MAX_MANIFEST_BYTES, err, errlen);
    close(fd);
    if (!text)
        return RLAI_ERR_IO;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(text, &end, true);
    if (!root) {
        size_t off = end ? (size_t)(end - text) : 0;
        rlai_errf(err, errlen, 0, "%s: not valid JSON (near byte %zu)", path, off);
        free(text);
        return RLAI_ERR_FORMAT;
    }
    free(text);
    static const struct { const char *key; bool required; int type; } keys[] = {
        { "name", true, cJSON_String }, { "version", true, cJSON_String },
        { "entry", true, cJSON_String }, { "description", true, cJSON_String },
        { "abi", false, cJSON_Number }, { "config", false, cJSON_Object },
        { "commands", false, cJSON_Array }, { "author", false, cJSON_String },
        { "license", false, cJSON_String }, { "homepage", false, cJSON_String },
        { "timeout_ms", false, cJSON_Object }, { "isolation", false, cJSON_String },
    };
    const char *why = NULL, *key = NULL;
    if (!cJSON_IsObject(root))
        why = "is not a JSON object";
    for (size_t i = 0; !why && i < sizeof(keys) / sizeof(keys[0]); i++) {
        cJSON *v = cJSON_GetObjectItemCaseSensitive(root, keys[i].key);
        key = keys[i].key;
        if (!v && keys[i].required)
            why = "is missing";
        else if (v && !(v->type & keys[i].type))
            why = keys[i].type == cJSON_String ? "must be a string"
                : keys[i].type == cJSON_Number ? "must be a number"
                : keys[i].type == cJSON_Object ? "must be an object" : "must be an array";
    }
    if (!why) {
        for (cJSON *it = root->child; it && !why; it = it->next) {
            bool known = false;
            for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
                known |= strcmp(it->string, keys[i].key) == 0;
            if (!known) {
                key = it->string;
                why = "is not a manifest key (name, version, entry, description, abi, config, "
                      "commands, author, license, homepage, timeout_ms, isolation)";
            }
        }
    }
    if (!why) {
        const char *name = cJSON_GetObjectItemCaseSensitive(root, "name")->valuestring;
        const char *entry = cJSON_GetObjectItemCaseSensitive(root, "entry")->valuestring;
        const char *version = cJSON_GetObjectItemCaseSensitive(root, "version")->valuestring;
        cJSON *abi = cJSON_GetObjectItemCaseSensitive(root, "abi");
        cJSON *isolation = cJSON_GetObjectItemCaseSensitive(root, "isolation");
        if (!valid_ident(name, MAX_NAME)) {
            key = "name";
            why = "must be 1-32 characters of a-z, 0-9, _ starting with a letter";
        } else if (!*entry || strchr(entry, '/') || strchr(entry, '\\') || strcmp(entry, "..") == 0 ||
                   strcmp(entry, ".") == 0) {
            key = "entry";
            why = "must be a file name inside the plugin folder";
        } else if (!*version || strlen(version) > 32) {
            key = "version";
            why = "must be a version such as \"1.0.0\"";
        } else if (!timeouts_ok(cJSON_GetObjectItemCaseSensitive(root, "timeout_ms"), name)) {
            key = "timeout_ms";
            why = "must map \"*\" or \"<name>.<verb>\" command names to milliseconds (1 to 86400000)";
        } else if (isolation && strcmp(isolation->valuestring, "in-process") != 0) {
            bool process = strcmp(isolation->valuestring, "process") == 0;
            rlai_errf(err, errlen, 0, process ? "%s: \"isolation\": \"process\" is not implemented in this build "
                                           "(plugins run inside the engine process; see docs/PLUGINS.md)"
                                         : "%s: \"isolation\" must be \"in-process\" (\"process\" is not "
                                           "implemented in this build)", path);
            cJSON_Delete(root);
            return process ? RLAI_ERR_NOT_IMPLEMENTED : RLAI_ERR_FORMAT;
        } else if (abi && abi->valuedouble != RLAI_PLUGIN_ABI_MAJOR) {
            rlai_errf(err, errlen, 0, "%s: \"abi\" is %g but this host speaks plugin ABI %d.%d", path,
                    abi->valuedouble, RLAI_PLUGIN_ABI_MAJOR, RLAI_PLUGIN_ABI_MINOR);
            cJSON_Delete(root);
            return RLAI_ERR_ABI;
        }
    }
    if (why) {
        if (key)
            rlai_errf(err, errlen, 0, "%s: \"%s\" %s", path, key, why);
        else
            rlai_errf(err, errlen, 0, "%s %s", path, why);
        cJSON_Delete(root);
        return RLAI_ERR_FORMAT;
    }
    *root_out = root;
    return 0;
}

/* check_mode for an open folder. */
static int check_dir_fd(int fd, const char *path, bool root_dir, char *err, size_t errlen)
{
    struct stat st;
    if (fstat(fd, &st) != 0) {
        rlai_errf(err, errlen, 0, "%s: %s", path, strerror(errno));
        return RLAI_ERR_IO;
    }
    return check_mode(&st, path, root_dir, err, errlen);
}

static cJSON *merge_config(const cJSON *base, const cJSON *over)
{
    cJSON *c = base ? cJSON_Duplicate(base, true) : cJSON_CreateObject();
    if (!c || !cJSON_IsObject(over))
        return c;
    for (const cJSON *it = over->child; it; it = it->next) {
        cJSON *v = cJSON_Duplicate(it, true);
        if (!v)
            continue;
        if (cJSON_GetObjectItemCaseSensitive(c, it->string))
            cJSON_ReplaceItemInObjectCaseSensitive(c, it->string, v);
        else
            cJSON_AddItemToObject(c, it->string, v);
    }
    return c;
}

int rlai_plugin_host_load(rlai_plugin_host *h, const char *dir, char *err, size_t errlen)
{
    if (!h || !dir)
        return RLAI_ERR_INVALID_ARG;
    char absdir[PATH_MAX];
    if (!realpath(dir, absdir)) {
        rlai_errf(err, errlen, 0, "%s: %s", dir, strerror(errno));
        return RLAI_ERR_IO;
    }
    /* The folder and its parent (the plugin root) must be ours or root's
     * and not writable by others; files are then opened relative to the
     * folder's fd, never through a symbolic link. */
    int dirfd = open(absdir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dirfd < 0) {
        rlai_errf(err, errlen, 0, "%s: %s", absdir, strerror(errno));
        return RLAI_ERR_IO;
    }
    int rc = check_dir_fd(dirfd, absdir, false, err, errlen);
    if (rc == 0) {
        int pfd = openat(dirfd, "..", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        char parent[PATH_MAX];
        snprintf(parent, sizeof(parent), "%s", absdir);
        char *slash = strrchr(parent, '/');
        if (slash)
            *(slash == parent ? slash + 1 : slash) = 0;
        if (pfd < 0) {
            rlai_errf(err, errlen, 0, "%s: %s", parent, strerror(errno));
            rc = RLAI_ERR_IO;
        } else {
            rc = check_dir_fd(pfd, parent, true, err, errlen);
            close(pfd);
        }
    }
    cJSON *man = NULL;
    if (rc == 0)
        rc = read_manifest(dirfd, absdir, &man, err, errlen);
    if (rc < 0) {
        close(dirfd);
        return rc;
    }
    const char *name = cJSON_GetObjectItemCaseSensitive(man, "name")->valuestring;
    char file[PATH_MAX + 64];
    snprintf(file, sizeof(file), "%s/%s", absdir, cJSON_GetObjectItemCaseSensitive(man, "entry")->valuestring);
    for (rlai_plugin *q = h->plugins; q; q = q->next)
        if (strcmp(q->name, name) == 0) {
            rlai_errf(err, errlen, 0, "%s: a plugin named '%s' is already loaded from %s", file, name, q->dir);
            cJSON_Delete(man);
            close(dirfd);
            return RLAI_ERR_EXISTS;
        }
    int efd = open_plugin_file(dirfd, cJSON_GetObjectItemCaseSensitive(man, "entry")->valuestring, file, err,
                               errlen);
    close(dirfd);
    if (efd < 0) {
        cJSON_Delete(man);
        return efd;
    }
    /* dlopen goes by path: the checks above make sure only this user or
     * root can change what the path names. */
    close(efd);
    rlai_plugin *p = calloc(1, sizeof(*p));
    if (!p) {
        cJSON_Delete(man);
        return RLAI_ERR_NOMEM;
    }
    p->magic = PLUGIN_MAGIC;
    p->host = h;
    pthread_mutex_init(&p->pin_mu, NULL);
    p->name = strdup(name);
    p->version = strdup(cJSON_GetObjectItemCaseSensitive(man, "version")->valuestring);
    p->description = strdup(cJSON_GetObjectItemCaseSensitive(man, "description")->valuestring);
    p->dir = strdup(absdir);
    p->file = strdup(file);
    const cJSON *over = h->plugin_config ? cJSON_GetObjectItemCaseSensitive(h->plugin_config, name) : NULL;
    p->config = merge_config(cJSON_GetObjectItemCaseSensitive(man, "config"), over);
    p->timeouts = cJSON_DetachItemFromObjectCaseSensitive(man, "timeout_ms");
    cJSON_Delete(man);
    if (!p->name || !p->version || !p->description || !p->dir || !p->file || !p->config) {
        plugin_unload(h, p, false);
        return RLAI_ERR_NOMEM;
    }
    p->dl = dlopen(file, RTLD_NOW | RTLD_LOCAL);
    if (!p->dl) {
        const char *de = dlerror();
        rlai_errf(err, errlen, 0, "%s: cannot load: %s", file, de ? de : "unknown dlopen error");
        plugin_unload(h, p, false);
        return RLAI_ERR_IO;
    }
    const rlai_plugin_abi *abi = dlsym(p->dl, "rlai_plugin_abi_record");
    int (*init)(const rlai_host_api *, rlai_plugin *, char **) = NULL;
    *(void **)&init = dlsym(p->dl, "rlai_plugin_init");
    *(void **)&p->fini = dlsym(p->dl, "rlai_plugin_fini");
    if (!abi || !init) {
        rlai_errf(err, errlen, 0, "%s: not an RTX-LocalAI plugin: symbol %s is missing", file,
                !abi ? "rlai_plugin_abi_record (RLAI_PLUGIN_DECLARE())" : "rlai_plugin_init");
        plugin_unload(h, p, false);
        return RLAI_ERR_FORMAT;
    }
    if (abi->major != RLAI_PLUGIN_ABI_MAJOR || abi->minor > RLAI_PLUGIN_ABI_MINOR) {
        rlai_errf(err, errlen, 0, "%s: refused: built for plugin ABI %u.%u, this host has %d.%d (%s)", file,
                abi->major, abi->minor, RLAI_PLUGIN_ABI_MAJOR, RLAI_PLUGIN_ABI_MINOR,
                abi->major != RLAI_PLUGIN_ABI_MAJOR ? "another major version"
                                                    : "newer than the host: update RTX-LocalAI");
        plugin_unload(h, p, false);
        return RLAI_ERR_ABI;
    }
    p->abi_minor = abi->minor;
    if (!abi->signature || strcmp(abi->signature, RLAI_PLUGIN_SIGNATURE) != 0) {
        rlai_errf(err, errlen, 0, "%s: refused: build signature \"%s\" differs from the host's \"%s\"", file,
                abi->signature ? abi->signature : "(none)", RLAI_PLUGIN_SIGNATURE);
        plugin_unload(h, p, false);
        return RLAI_ERR_ABI;
    }
    char *msg = NULL;
    pthread_mutex_lock(&h->mu);
    h->loading = p;
    pthread_mutex_unlock(&h->mu);
    int irc = init(&host_api, p, &msg);
    pthread_mutex_lock(&h->mu);
    h->loading = NULL;
    pthread_mutex_unlock(&h->mu);
    if (irc != 0 || p->refused) {
        if (irc != 0)
            rlai_errf(err, errlen, 0, "%s: plugin '%s' %s: init failed (%d%s%s)%s%s%s%s", file, p->name, p->version, irc,
                    irc < 0 ? ": " : "", irc < 0 ? rlai_strerror(irc) : "", msg ? ": " : "", msg ? msg : "",
                    p->refused_why[0] ? "; registration refused: " : "", p->refused_why);
        else
            rlai_errf(err, errlen, 0, "%s: plugin '%s' %s: refused: a command registration was refused%s%s", file,
                    p->name, p->version, p->refused_why[0] ? ": " : " (see above)", p->refused_why);
        free(msg);
        /* Undo: registrations, pins; fini only runs for a plugin whose init
         * succeeded (it may hold state). */
        plugin_unload(h, p, irc == 0);
        return irc < 0 ? irc : RLAI_ERR_INVALID_ARG;
    }
    free(msg);
    pthread_mutex_lock(&h->mu);
    rlai_plugin **pp = &h->plugins;
    while (*pp)
        pp = &(*pp)->next;
    *pp = p;
    int n = 0;
    for (int i = 0; i < h->n_cmds; i++)
        n += h->cmds[i]->owner == p;
    pthread_mutex_unlock(&h->mu);
    host_log(h, "loaded plugin %s %s (%d command%s) from %s", p->name, p->version, n, n == 1 ? "" : "s", p->dir);
    return 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int rlai_plugin_host_load_all(rlai_plugin_host *h, const char *root)
{
    DIR *d = opendir(root);
    if (!d)
        return RLAI_ERR_IO;
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        char mpath[PATH_MAX];
        snprintf(mpath, sizeof(mpath), "%s/%s/manifest.json", root, de->d_name);
        if (access(mpath, F_OK) != 0)
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            char **nn = realloc(names, cap * sizeof(char *));
            if (!nn)
                break;
            names = nn;
        }
        if (!(names[n] = strdup(de->d_name)))
            break;
        n++;
    }
    closedir(d);
    if (n)
        qsort(names, n, sizeof(char *), cmp_str);
    int loaded = 0;
    for (size_t i = 0; i < n; i++) {
        char dir[PATH_MAX], err[1024] = "";
        snprintf(dir, sizeof(dir), "%s/%s", root, names[i]);
        if (rlai_plugin_host_load(h, dir, err, sizeof(err)) == 0)
            loaded++;
        else
            fprintf(stderr, "rlai: plugin not loaded: %s\n", err);
        free(names[i]);
    }
    free(names);
    return loaded;
}

int rlai_plugin_host_call(rlai_plugin_host *h, const char *command_name, const char *params_json,
                          const rlai_call_sink *sink, uint64_t *call_id, char *err, size_t errlen)
{
    return rlai_plugin_host_call_timed(h, command_name, params_json, 0, sink, call_id, err, errlen);
}

/* The deadline of a call of cmd: the request's, else the manifest's
 * "timeout_ms" for the command (or "*"), else the host's. 0 = none. */
static int call_timeout(const rlai_plugin_host *h, const command *cmd, int request_ms)
{
    if (request_ms > 0)
        return request_ms;
    const cJSON *t = cmd->owner ? cmd->owner->timeouts : NULL;
    const cJSON *v = t ? cJSON_GetObjectItemCaseSensitive(t, cmd->name) : NULL;
    if (!v && t)
        v = cJSON_GetObjectItemCaseSensitive(t, "*");
    if (cJSON_IsNumber(v) && v->valuedouble >= 1)
        return (int)v->valuedouble;
    return h->p.call_timeout_ms > 0 ? h->p.call_timeout_ms : 0;
}

int rlai_plugin_host_call_timed(rlai_plugin_host *h, const char *command_name, const char *params_json,
                                int timeout_ms, const rlai_call_sink *sink, uint64_t *call_id, char *err,
                                size_t errlen)
{
    if (call_id)
        *call_id = 0;
    if (!h || !command_name || !sink || !sink->token || !sink->result || !sink->done || !sink->error) {
        rlai_errf(err, errlen, 0, "invalid call");
        return RLAI_ERR_INVALID_ARG;
    }
    cJSON *params = NULL;
    if (params_json && *params_json) {
        const char *end = NULL;
        params = cJSON_ParseWithOpts(params_json, &end, true);
        if (!cJSON_IsObject(params)) {
            cJSON_Delete(params);
            rlai_errf(err, errlen, 0, "params of '%.200s' must be a JSON object", command_name);
            return RLAI_ERR_INVALID_ARG;
        }
    } else {
        params = cJSON_CreateObject();
    }
    if (!params) {
        rlai_errf(err, errlen, 0, "out of memory");
        return RLAI_ERR_NOMEM;
    }
    rlai_call *c = calloc(1, sizeof(*c));
    if (!c) {
        cJSON_Delete(params);
        rlai_errf(err, errlen, 0, "out of memory");
        return RLAI_ERR_NOMEM;
    }
    c->magic = CALL_MAGIC;
    c->h = h;
    c->params = params;
    c->sink = *sink;
    c->stop = "";
    atomic_init(&c->cancel, false);
    atomic_init(&c->ended, false);
    atomic_init(&c->returned, false);
    atomic_init(&c->refs, 1);
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->sink_mu, NULL);
    int rc = 0;
    char verr[640];
    pthread_mutex_lock(&h->mu);
    command *cmd = find_cmd(h, command_name);
    if (cmd && cmd->owner == h->loading)
        cmd = NULL;   /* its plugin's init has not succeeded yet */
    if (h->stopping) {
        rc = RLAI_ERR_CANCELLED;
        rlai_errf(err, errlen, 0, "engine shutting down");
    } else if (!cmd) {
        rc = RLAI_ERR_NOT_FOUND;
        rlai_errf(err, errlen, 0, "unknown command '%.200s' (%d command%s registered; see `rlai plugins`)",
                command_name, h->n_cmds, h->n_cmds == 1 ? "" : "s");
    } else if (rlai_params_schema_validate(cmd->schema, params, verr, sizeof(verr)) < 0) {
        rc = RLAI_ERR_INVALID_ARG;
        rlai_errf(err, errlen, 0, "invalid params for %.200s: %s", command_name, verr);
    } else if ((cmd->flags & RLAI_CMD_USES_ENGINE) && !h->p.engine) {
        rc = RLAI_ERR_NOT_IMPLEMENTED;
        rlai_errf(err, errlen, 0, "command '%.200s' needs a loaded model; none is loaded here", command_name);
    } else if (h->n_queued >= h->p.max_queue) {
        rc = RLAI_ERR_BUSY;
        rlai_errf(err, errlen, 0, "too many plugin calls waiting (%d)", h->n_queued);
    } else {
        c->cmd = cmd;
        c->id = h->next_id++;
        c->timeout_ms = call_timeout(h, cmd, timeout_ms);
        c->deadline = c->timeout_ms > 0 ? rlai_clock_s() + c->timeout_ms / 1000.0 : 0;
        if (h->queue_tail)
            h->queue_tail->next = c;
        else
            h->queue = c;
        h->queue_tail = c;
        h->n_queued++;
        if (call_id)
            *call_id = c->id;
        pthread_cond_signal(&h->cv);
    }
    pthread_mutex_unlock(&h->mu);
    if (rc < 0)
        call_unref(c);
    return rc;
}

int rlai_plugin_host_cancel(rlai_plugin_host *h, uint64_t call_id)
{
    if (!h || !call_id)
        return RLAI_ERR_INVALID_ARG;
    int rc = RLAI_ERR_NOT_FOUND;
    pthread_mutex_lock(&h->mu);
    for (int l = 0; l < 2 && rc; l++)
        for (rlai_call *c = l ? h->active : h->queue; c; c = c->next)
            if (c->id == call_id) {
                atomic_store(&c->cancel, true);
                pthread_mutex_lock(&c->mu);
                if (c->engine_id && h->p.engine)
                    rlai_router_cancel(h->p.router, c->engine_id);
                pthread_mutex_unlock(&c->mu);
                /* once its handler returned the call is over for its
                 * caller, even while its worker is still leaving the
                 * active list (a timed-out call whose handler still runs
                 * stays present) */
                rc = atomic_load(&c->returned) ? RLAI_ERR_NOT_FOUND : 0;
                l = 2;
                break;
            }
    pthread_mutex_unlock(&h->mu);
    return rc;
}

static int cmp_cmd(const void *a, const void *b)
{
    return strcmp((*(command *const *)a)->name, (*(command *const *)b)->name);
}

cJSON *rlai_plugin_host_commands_json(rlai_plugin_host *h)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *arr = root ? cJSON_AddArrayToObject(root, "commands") : NULL;
    if (!arr) {
        cJSON_Delete(root);
        return NULL;
    }
    if (!h)
        return root;
    pthread_mutex_lock(&h->mu);
    command **sorted = malloc(sizeof(command *) * (size_t)(h->n_cmds ? h->n_cmds : 1));
    if (sorted) {
        for (int i = 0; i < h->n_cmds; i++)
            sorted[i] = h->cmds[i];
        qsort(sorted, (size_t)h->n_cmds, sizeof(command *), cmp_cmd);
        for (int i = 0; i < h->n_cmds; i++) {
            cJSON *o = cJSON_CreateObject();
            if (!o)
                break;
            cJSON_AddStringToObject(o, "name", sorted[i]->name);
            cJSON_AddStringToObject(o, "description", sorted[i]->description);
            cJSON_AddItemToObject(o, "parameters", cJSON_Duplicate(sorted[i]->schema, true));
            cJSON_AddStringToObject(o, "plugin", sorted[i]->owner->name);
            cJSON_AddBoolToObject(o, "streams", (sorted[i]->flags & RLAI_CMD_STREAMS) != 0);
            cJSON_AddBoolToObject(o, "uses_engine", (sorted[i]->flags & RLAI_CMD_USES_ENGINE) != 0);
            cJSON_AddItemToArray(arr, o);
        }
        free(sorted);
    }
    pthread_mutex_unlock(&h->mu);
    return root;
}

cJSON *rlai_plugin_host_plugins_json(rlai_plugin_host *h)
{
    cJSON *arr = cJSON_CreateArray();
    if (!arr || !h)
        return arr;
    pthread_mutex_lock(&h->mu);
    for (rlai_plugin *p = h->plugins; p; p = p->next) {
        cJSON *o = cJSON_CreateObject();
        if (!o)
            break;
        cJSON_AddStringToObject(o, "name", p->name);
        cJSON_AddStringToObject(o, "version", p->version);
        cJSON_AddStringToObject(o, "description", p->description);
        cJSON_AddStringToObject(o, "dir", p->dir);
        cJSON *cmds = cJSON_AddArrayToObject(o, "commands");
        for (int i = 0; cmds && i < h->n_cmds; i++)
            if (h->cmds[i]->owner == p)
                cJSON_AddItemToArray(cmds, cJSON_CreateString(h->cmds[i]->name));
        cJSON_AddItemToArray(arr, o);
    }
    pthread_mutex_unlock(&h->mu);
    return arr;
}

int rlai_plugin_host_n_commands(rlai_plugin_host *h)
{
    if (!h)
        return 0;
    pthread_mutex_lock(&h->mu);
    int n = h->n_cmds;
    pthread_mutex_unlock(&h->mu);
    return n;
}

cJSON *rlai_plugin_host_chat_models_json(rlai_plugin_host *h)
{
    cJSON *a = cJSON_CreateArray();
    if (!h || !a)
        return a;
    pthread_mutex_lock(&h->mu);
    for (const chat_model *m = h->chat_models; m; m = m->next) {
        if (m->owner == h->loading)
            continue;   /* its plugin's init has not succeeded yet */
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "id", m->name);
        cJSON_AddStringToObject(o, "plugin", m->owner->name);
        if (m->description)
            cJSON_AddStringToObject(o, "description", m->description);
        cJSON_AddItemToArray(a, o);
    }
    pthread_mutex_unlock(&h->mu);
    return a;
}

int rlai_plugin_host_chat_model(rlai_plugin_host *h, const char *model, bool by_id, char **name_out, char **command,
                                cJSON **params)
{
    if (!h || !model)
        return RLAI_ERR_NOT_FOUND;
    int rc = RLAI_ERR_NOT_FOUND;
    pthread_mutex_lock(&h->mu);
    for (const chat_model *m = h->chat_models; m; m = m->next) {
        if (m->owner == h->loading)
            continue;
        const char *id = strchr(m->name, '/') + 1;
        if (strcmp(m->name, model) != 0 && !(by_id && !strcmp(id, model)))
            continue;
        *name_out = strdup(m->name);
        *command = strdup(m->command);
        *params = cJSON_Parse(m->params_json);
        rc = *name_out && *command && *params ? 0 : RLAI_ERR_NOMEM;
        if (rc < 0) {
            free(*name_out);
            free(*command);
            cJSON_Delete(*params);
            *name_out = *command = NULL;
            *params = NULL;
        }
        break;
    }
    pthread_mutex_unlock(&h->mu);
    return rc;
}

void rlai_plugin_host_threads(rlai_plugin_host *h, int *alive, int *engine_waits, int *handoff)
{
    pthread_mutex_lock(&h->mu);
    if (alive)
        *alive = h->n_alive;
    if (engine_waits)
        *engine_waits = h->n_engine_waits;
    if (handoff)
        *handoff = h->n_handoff;
    pthread_mutex_unlock(&h->mu);
}
