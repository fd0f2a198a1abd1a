/* stuck.c - a misbehaving test plugin (tests/plugins/): handlers that
 * ignore cancel and sleep or spin for a while, then try to answer late
 * (the host must drop that safely), and handlers that send output no
 * transport can carry (invalid UTF-8, NUL, too deep or too large JSON),
 * recording what the host returned to them. */
#include <rlai/plugin.h>

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

RLAI_PLUGIN_DECLARE();

static const rlai_host_api *H;
static atomic_int last_rc;         /* what the last bad* command got back */
static atomic_int late_rc = 1;     /* what the last late reply got back (1 = none yet) */
static atomic_int running;         /* handlers in sleep/spin now */

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int ms_param(const cJSON *params, int dflt)
{
    const cJSON *ms = cJSON_GetObjectItemCaseSensitive(params, "ms");
    return cJSON_IsNumber(ms) ? (int)ms->valuedouble : dflt;
}

/* Ignores cancel: sleeps (or spins) `ms`, then answers anyway. */
static int hang(rlai_call *call, const cJSON *params, bool spin)
{
    atomic_fetch_add(&running, 1);
    double end = now_ms() + ms_param(params, 3000);
    while (now_ms() < end) {
        if (!spin) {
            struct timespec ts = { 0, 5 * 1000 * 1000 };
            nanosleep(&ts, NULL);
        }
    }
    int rc = H->stream_text(call, "late ", 5);
    cJSON *r = cJSON_CreateObject();
    cJSON_AddBoolToObject(r, "late", true);
    int rc2 = H->reply_json(call, r);
    atomic_store(&late_rc, rc < 0 ? rc : rc2);
    atomic_fetch_sub(&running, 1);
    return 0;
}

static int cmd_sleep(rlai_call *call, const cJSON *params, void *user)
{
    (void)user;
    return hang(call, params, false);
}

static int cmd_spin(rlai_call *call, const cJSON *params, void *user)
{
    (void)user;
    return hang(call, params, true);
}

static int cmd_ping(rlai_call *call, const cJSON *params, void *user)
{
    (void)params;
    (void)user;
    cJSON *r = cJSON_CreateObject();
    cJSON_AddBoolToObject(r, "pong", true);
    return H->reply_json(call, r);
}

/* What the host returned to the last bad* command and the last late reply. */
static int cmd_status(rlai_call *call, const cJSON *params, void *user)
{
    (void)params;
    (void)user;
    cJSON *r = cJSON_CreateObject();
    cJSON_AddNumberToObject(r, "last_rc", atomic_load(&last_rc));
    cJSON_AddNumberToObject(r, "late_rc", atomic_load(&late_rc));
    cJSON_AddNumberToObject(r, "running", atomic_load(&running));
    return H->reply_json(call, r);
}

/* {"kind": "utf8" | "nul" | "overlong" | "big"}: one stream_text the host must refuse. */
static int cmd_badtext(rlai_call *call, const cJSON *params, void *user)
{
    (void)user;
    const cJSON *k = cJSON_GetObjectItemCaseSensitive(params, "kind");
    const char *kind = cJSON_IsString(k) ? k->valuestring : "utf8";
    int rc;
    H->stream_text(call, "ok ", 3);
    if (!strcmp(kind, "nul")) {
        rc = H->stream_text(call, "a\0b", 3);
    } else if (!strcmp(kind, "overlong")) {
        rc = H->stream_text(call, "\xc0\xaf", 2);
    } else if (!strcmp(kind, "big")) {
        size_t n = (2u << 20);
        char *t = malloc(n);
        memset(t, 'x', n);
        rc = H->stream_text(call, t, n);
        free(t);
    } else {
        rc = H->stream_text(call, "caf\xc3", 4);   /* cut in the middle of a character */
    }
    atomic_store(&last_rc, rc);
    if (rc < 0)
        return rc;
    return H->reply_json(call, cJSON_CreateString("accepted"));
}

/* {"kind": "deep" | "big" | "utf8"}: one reply_json the host must refuse. */
static int cmd_badjson(rlai_call *call, const cJSON *params, void *user)
{
    (void)user;
    const cJSON *k = cJSON_GetObjectItemCaseSensitive(params, "kind");
    const char *kind = cJSON_IsString(k) ? k->valuestring : "deep";
    cJSON *v;
    if (!strcmp(kind, "big")) {
        v = cJSON_CreateArray();
        char s[1025];
        memset(s, 'y', 1024);
        s[1024] = 0;
        for (int i = 0; i < 2048; i++)
            cJSON_AddItemToArray(v, cJSON_CreateString(s));
    } else if (!strcmp(kind, "utf8")) {
        v = cJSON_CreateObject();
        cJSON_AddStringToObject(v, "bad", "\xff\xfe");
    } else {
        v = cJSON_CreateArray();
        cJSON *cur = v;
        for (int i = 0; i < 40; i++) {
            cJSON *n = cJSON_CreateArray();
            cJSON_AddItemToArray(cur, n);
            cur = n;
        }
    }
    int rc = H->reply_json(call, v);
    atomic_store(&last_rc, rc);
    return rc < 0 ? rc : 0;
}

RLAI_PLUGIN_EXPORT int rlai_plugin_init(const rlai_host_api *host, rlai_plugin *self, char **errmsg)
{
    (void)errmsg;
    H = host;
    static const struct { const char *name, *desc; rlai_command_fn fn; } cmds[] = {
        { "stuck.sleep", "Sleeps params.ms (default 3000) ignoring cancel, then answers late.", cmd_sleep },
        { "stuck.spin", "Spins params.ms ignoring cancel, then answers late.", cmd_spin },
        { "stuck.short", "Like stuck.sleep; its manifest default timeout is 300 ms.", cmd_sleep },
        { "stuck.ping", "Answers {\"pong\": true} at once.", cmd_ping },
        { "stuck.status", "What the host returned to the last bad and late replies.", cmd_status },
        { "stuck.badtext", "Streams text the host must refuse.", cmd_badtext },
        { "stuck.badjson", "Replies JSON the host must refuse.", cmd_badjson },
    };
    for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++) {
        rlai_command_desc d = { .name = cmds[i].name, .description = cmds[i].desc, .handler = cmds[i].fn };
        int rc = host->register_command(self, &d, sizeof(d));
        if (rc < 0)
            return rc;
    }
    return 0;
}
