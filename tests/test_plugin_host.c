/* test_plugin_host.c - the plugin host against test plugins built as real
 * shared modules (tests/plugins/): loading and every documented refusal
 * (newer/other ABI, failed init, duplicate command, missing symbol, broken
 * manifests, same plugin name, world-writable file), calls with streaming,
 * results, errors, cancellation, late registration, config overrides, fini,
 * and engine jobs on the real default model (generate streams what it
 * returns; a pinned prefix is reused). */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "plugin_host.h"
#include "rlai/error.h"

#ifndef RLAI_TEST_PLUGINS
#error "RLAI_TEST_PLUGINS must name the build folder of tests/plugins"
#endif
#define MODEL RLAI_MODELS_DIR "/SmolLM2-135M-Instruct.Q4_1.gguf"

/* ---------------------------------------------------------- capturing sink */

typedef struct capture {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    char text[8192];
    size_t text_len;
    int n_tokens;
    cJSON *results;              /* array of copies */
    int ended;                   /* 0, 1 = done, 2 = error */
    int code;
    char msg[1024];
    char stop[32];
    rlai_call_metrics m;
    int token_fail_after;        /* > 0: token() reports the receiver gone after N pieces */
} capture;

static void cap_init(capture *c)
{
    memset(c, 0, sizeof(*c));
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->results = cJSON_CreateArray();
}

static void cap_free(capture *c)
{
    cJSON_Delete(c->results);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
}

static int cap_token(void *u, const char *text, size_t len)
{
    capture *c = u;
    pthread_mutex_lock(&c->mu);
    if (c->text_len + len < sizeof(c->text)) {
        memcpy(c->text + c->text_len, text, len);
        c->text_len += len;
        c->text[c->text_len] = 0;
    }
    c->n_tokens++;
    int gone = c->token_fail_after > 0 && c->n_tokens >= c->token_fail_after;
    pthread_mutex_unlock(&c->mu);
    return gone;
}

static int cap_result(void *u, const cJSON *v)
{
    capture *c = u;
    pthread_mutex_lock(&c->mu);
    cJSON_AddItemToArray(c->results, cJSON_Duplicate(v, true));
    pthread_mutex_unlock(&c->mu);
    return 0;
}

static void cap_done(void *u, const char *stop, const rlai_call_metrics *m)
{
    capture *c = u;
    pthread_mutex_lock(&c->mu);
    ck_assert_int_eq(c->ended, 0);          /* exactly one terminal */
    c->ended = 1;
    snprintf(c->stop, sizeof(c->stop), "%s", stop ? stop : "");
    if (m)
        c->m = *m;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static void cap_error(void *u, int code, const char *msg)
{
    capture *c = u;
    pthread_mutex_lock(&c->mu);
    ck_assert_int_eq(c->ended, 0);
    c->ended = 2;
    c->code = code;
    snprintf(c->msg, sizeof(c->msg), "%s", msg ? msg : "");
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static rlai_call_sink sink_of(capture *c)
{
    rlai_call_sink s = { cap_token, cap_result, cap_done, cap_error, c };
    return s;
}

static void cap_wait(capture *c)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 60;
    pthread_mutex_lock(&c->mu);
    while (!c->ended)
        ck_assert_int_eq(pthread_cond_timedwait(&c->cv, &c->mu, &ts), 0);
    pthread_mutex_unlock(&c->mu);
}

/* Runs one call to its end; returns the synchronous rc. */
static int call_sync(rlai_plugin_host *h, const char *cmd, const char *params, capture *c)
{
    rlai_call_sink s = sink_of(c);
    char err[512];
    int rc = rlai_plugin_host_call(h, cmd, params, &s, NULL, err, sizeof(err));
    if (rc == 0)
        cap_wait(c);
    else
        snprintf(c->msg, sizeof(c->msg), "%s", err);
    return rc;
}

static rlai_plugin_host *new_host(rlai_engine *e, const char *config_json)
{
    cJSON *conf = config_json ? cJSON_Parse(config_json) : NULL;
    rlai_plugin_host_params p = { .engine = e, .workers = 2, .quiet = true, .plugin_config = conf };
    rlai_plugin_host *h = NULL;
    ck_assert_int_eq(rlai_plugin_host_new(&p, &h), 0);
    cJSON_Delete(conf);
    return h;
}

static int load(rlai_plugin_host *h, const char *name, char *err, size_t errlen)
{
    char dir[1024];
    snprintf(dir, sizeof(dir), "%s/%s", RLAI_TEST_PLUGINS, name);
    err[0] = 0;
    return rlai_plugin_host_load(h, dir, err, errlen);
}

static bool has_command(rlai_plugin_host *h, const char *name)
{
    cJSON *reg = rlai_plugin_host_commands_json(h);
    bool found = false;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(reg, "commands"))
        found |= strcmp(cJSON_GetObjectItem(c, "name")->valuestring, name) == 0;
    cJSON_Delete(reg);
    return found;
}

/* ---------------------------------------------------------- loading */

START_TEST(good_plugin_registers_its_commands)
{
    rlai_plugin_host *h = new_host(NULL, NULL);
    char err[1024];
    ck_assert_int_eq(load(h, "good", err, sizeof(err)), 0);
    ck_assert_int_eq(rlai_plugin_host_n_commands(h), 8);
    cJSON *reg = rlai_plugin_host_commands_json(h);
    cJSON *cmds = cJSON_GetObjectItem(reg, "commands");
    ck_assert_int_eq(cJSON_GetArraySize(cmds), 8);
    /* sorted by name, with schema, plugin and flags */
    ck_assert_str_eq(cJSON_GetArrayItem(cmds, 0)->child->valuestring, "good.echo");
    const cJSON *echo = cJSON_GetArrayItem(cmds, 0);
    ck_assert_str_eq(cJSON_GetObjectItem(echo, "description")->valuestring, "Returns its parameters.");
    ck_assert(cJSON_IsObject(cJSON_GetObjectItem(echo, "parameters")));
    ck_assert_str_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(echo, "parameters"), "type")->valuestring, "object");
    ck_assert_str_eq(cJSON_GetObjectItem(echo, "plugin")->valuestring, "good");
    const cJSON *c;
    cJSON_ArrayForEach(c, cmds) {
        const char *n = cJSON_GetObjectItem(c, "name")->valuestring;
        if (!strcmp(n, "good.stream"))
            ck_assert(cJSON_IsTrue(cJSON_GetObjectItem(c, "streams")));
        if (!strcmp(n, "good.echo"))
            ck_assert(cJSON_IsFalse(cJSON_GetObjectItem(c, "streams")));
        /* good.fail gave no schema: the default object schema */
        if (!strcmp(n, "good.fail"))
            ck_assert(cJSON_IsObject(cJSON_GetObjectItem(c, "parameters")));
    }
    cJSON_Delete(reg);
    cJSON *pl = rlai_plugin_host_plugins_json(h);
    ck_assert_int_eq(cJSON_GetArraySize(pl), 1);
    ck_assert_str_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(pl, 0), "version")->valuestring, "1.2.3");
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(cJSON_GetArrayItem(pl, 0), "commands")), 8);
    cJSON_Delete(pl);
    rlai_plugin_host_destroy(&h);
    ck_assert_ptr_null(h);
}
END_TEST

START_TEST(incompatible_abis_are_refused_naming_both_versions)
{
    rlai_plugin_host *h = new_host(NULL, NULL);
    char err[1024];
    ck_assert_int_eq(load(h, "newabi", err, sizeof(err)), RLAI_ERR_ABI);
    ck_assert_ptr_nonnull(strstr(err, "libnewabi.so"));
    ck_assert_ptr_nonnull(strstr(err, "1.2"));
    ck_assert_ptr_nonnull(strstr(err, "1.1"));
    ck_assert_ptr_nonnull(strstr(err, "newer"));
    ck_assert_int_eq(load(h, "othermajor", err, sizeof(err)), RLAI_ERR_ABI);
    ck_assert_ptr_nonnull(strstr(err, "libothermajor.so"));
    ck_assert_ptr_nonnull(strstr(err, "2.0"));
    ck_assert_ptr_nonnull(strstr(err, "another major"));
    ck_assert_int_eq(rlai_plugin_host_n_commands(h), 0);
    cJSON *pl = rlai_plugin_host_plugins_json(h);
    ck_assert_int_eq(cJSON_GetArraySize(pl), 0);
    cJSON_Delete(pl);
    rlai_plugin_host_destroy(&h);
}
END_TEST

START_TEST(failed_init_undoes_registrations)
{
    rlai_plugin_host *h = new_host(NULL, NULL);
    char err[1024];
    ck_assert_int_eq(load(h, "initfail", err, sizeof(err)), RLAI_ERR_NOT_FOUND);
    ck_assert_ptr_nonnull(strstr(err, "libinitfail.so"));
    ck_assert_ptr_nonnull(strstr(err, "init failed"));
    ck_assert_ptr_nonnull(strstr(err, "the lore pack is missing"));
    ck_assert(!has_command(h, "initfail.x"));
    ck_assert_int_eq(rlai_plugin_host_n_commands(h), 0);
    /* the host still loads a good plugin afterwards */
    ck_assert_int_eq(load(h, "good", err, sizeof(err)), 0);
    rlai_plugin_host_destroy(&h);
}
END_TEST

START_TEST(duplicate_command_refuses_the_plugin)
{
    rlai_plugin_host *h = new_host(NULL, NULL);
    char err[1024];
    ck_assert_int_eq(load(h, "dup", err, sizeof(err)), RLAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(err, "libdup.so"));
    ck_assert_ptr_nonnull(strstr(err, "registration was refused"));
    ck_assert(!has_command(h, "dup.same"));
    ck_assert_int_eq(rlai_plugin_host_n_commands(h), 0);
    rlai_plugin_host_destroy(&h);
}
END_TEST

START_TEST(broken_plugins_and_manifests_are_refused)
{
    rlai_plugin_host *h = new_host(NULL, NULL);
    char err[1024];
    ck_assert_int_eq(load(h, "nosym", err, sizeof(err)), RLAI_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(err, "rlai_plugin_abi_record"));
    ck_assert_int_eq(load(h, "badjson", err, sizeof(err)), RLAI_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(err, "manifest.json"));
    ck_assert_ptr_nonnull(strstr(err, "not valid JSON"));
    ck_assert_int_eq(load(h, "badfields", err, sizeof(err)), RLAI_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(err, "\"version\" must be a string"));
    ck_assert_int_eq(load(h, "does-not-exist", err, sizeof(err)), RLAI_ERR_IO);
    ck_assert_int_eq(load(h, "good", err, sizeof(err)), 0);
    ck_assert_int_eq(load(h, "samename", err, sizeof(err)), RLAI_ERR_EXISTS);
    ck_assert_ptr_nonnull(strstr(err, "already loaded"));
    ck_assert_int_eq(rlai_plugin_host_n_commands(h), 8);
    rlai_plugin_host_destroy(&h);
}
END_TEST

/* Writes a manifest text into dir/manifest.json. */
static void write_file(const char *dir, const char *name, const char *text)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

START_TEST(manifest_validation_names_the_key)
{
    char dir[] = "/tmp/rlai-manifest-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    struct { const char *json; const char *needle; } cases[] = {
        { "[]", "not a JSON object" },
        { "{\"version\":\"1\",\"entry\":\"x.so\",\"description\":\"d\"}", "\"name\" is missing" },
        { "{\"name\":\"Bad-Name\",\"version\":\"1\",\"entry\":\"x.so\",\"description\":\"d\"}", "\"name\" must be" },
        { "{\"name\":\"a\",\"version\":\"1\",\"entry\":\"../x.so\",\"description\":\"d\"}", "\"entry\" must be" },
        { "{\"name\":\"a\",\"version\":\"1\",\"entry\":\"x.so\"}", "\"description\" is missing" },
        { "{\"name\":\"a\",\"version\":\"1\",\"entry\":\"x.so\",\"description\":\"d\",\"config\":[]}",
          "\"config\" must be an object" },
        { "{\"name\":\"a\",\"version\":\"1\",\"entry\":\"x.so\",\"description\":\"d\",\"entyr\":1}",
          "\"entyr\" is not a manifest key" },
        { "{\"name\":\"a\",\"version\":\"1\",\"entry\":\"x.so\",\"description\":\"d\",\"abi\":2}", "ABI" },
        { "{\"name\":\"a\",\"version\":\"1\",\"entry\":\"missing.so\",\"description\":\"d\"}", "missing.so" },
    };
    rlai_plugin_host *h = new_host(NULL, NULL);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        write_file(dir, "manifest.json", cases[i].json);
        char err[1024] = "";
        ck_assert_int_lt(rlai_plugin_host_load(h, dir, err, sizeof(err)), 0);
        if (!strstr(err, cases[i].needle))
            ck_abort_msg("case %zu: '%s' lacks '%s'", i, err, cases[i].needle);
    }
    rlai_plugin_host_destroy(&h);
    char path[1100];
    snprintf(path, sizeof(path), "%s/manifest.json", dir);
    unlink(path);
    rmdir(dir);
}
END_TEST

START_TEST(world_writable_plugin_file_is_refused)
{
    char dir[] = "/tmp/rlai-ww-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char src[1024], dst[1100], cmd[2400];
    snprintf(src, sizeof(src), "%s/good/libgood.so", RLAI_TEST_PLUGINS);
    snprintf(dst, sizeof(dst), "%s/libgood.so", dir);
    snprintf(cmd, sizeof(cmd), "cp '%s' '%s'", src, dst);
    ck_assert_int_eq(system(cmd), 0);
    write_file(dir, "manifest.json",
               "{\"name\":\"good\",\"version\":\"1.0.0\",\"entry\":\"libgood.so\",\"description\":\"copy\"}");
    ck_assert_int_eq(chmod(dst, 0777), 0);
    rlai_plugin_host *h = new_host(NULL, NULL);
    char err[1024];
    ck_assert_int_eq(rlai_plugin_host_load(h, dir, err, sizeof(err)), RLAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(err, "world-writable"));
    ck_assert_int_eq(chmod(dst, 0755), 0);
    ck_assert_int_eq(rlai_plugin_host_load(h, dir, err, sizeof(err)), 0);
    rlai_plugin_host_destroy(&h);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

START_TEST(load_all_loads_only_the_good_ones)
{
    rlai_plugin_host *h = new_host(NULL, NULL);
    /* stderr gets one line per refused folder; the good one loads */
    ck_assert_int_eq(rlai_plugin_host_load_all(h, RLAI_TEST_PLUGINS), 1);
    ck_assert_int_eq(rlai_plugin_host_n_commands(h), 8);
    ck_assert_int_eq(rlai_plugin_host_load_all(h, "/nonexistent/rlai"), RLAI_ERR_IO);
    rlai_plugin_host_destroy(&h);
}
END_TEST

/* ---------------------------------------------------------- calls */

START_TEST(calls_reply_stream_and_fail)
{
    rlai_plugin_host *h = new_host(NULL, NULL);
    char err[1024];
    ck_assert_int_eq(load(h, "good", err, sizeof(err)), 0);

    capture c;
    cap_init(&c);
    ck_assert_int_eq(call_sync(h, "good.echo", "{\"x\":42,\"s\":\"\xc3\xa9\"}", &c), 0);
    ck_assert_int_eq(c.ended, 1);
    ck_assert_str_eq(c.stop, "");
    ck_assert(!c.m.valid);
    ck_assert_int_eq(cJSON_GetArraySize(c.results), 1);
    cJSON *p = cJSON_GetObjectItem(cJSON_GetArrayItem(c.results, 0), "params");
    ck_assert_int_eq(cJSON_GetObjectItem(p, "x")->valueint, 42);
    ck_assert_str_eq(cJSON_GetObjectItem(p, "s")->valuestring, "\xc3\xa9");
    cap_free(&c);

    cap_init(&c);   /* no params = {} */
    ck_assert_int_eq(call_sync(h, "good.echo", NULL, &c), 0);
    ck_assert(cJSON_IsObject(cJSON_GetObjectItem(cJSON_GetArrayItem(c.results, 0), "params")));
    cap_free(&c);

    cap_init(&c);
    ck_assert_int_eq(call_sync(h, "good.stream", "{\"pieces\":5}", &c), 0);
    ck_assert_int_eq(c.ended, 1);
    ck_assert_int_eq(c.n_tokens, 5);
    ck_assert_str_eq(c.text, "piece0 piece1 piece2 piece3 piece4 ");
    ck_assert_int_eq(cJSON_GetArraySize(c.results), 2);
    ck_assert_int_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(c.results, 0), "pieces")->valueint, 5);
    ck_assert(cJSON_IsArray(cJSON_GetArrayItem(c.results, 1)));
    cap_free(&c);

    cap_init(&c);
    ck_assert_int_eq(call_sync(h, "good.stream", "{\"pieces\":-1}", &c), 0);
    ck_assert_int_eq(c.ended, 2);
    ck_assert_int_eq(c.code, RLAI_ERR_INVALID_ARG);
    ck_assert_str_eq(c.msg, "pieces must be in [0, 1000], got -1");
    cap_free(&c);

    cap_init(&c);
    ck_assert_int_eq(call_sync(h, "good.fail", "{}", &c), 0);
    ck_assert_int_eq(c.ended, 2);
    ck_assert_int_eq(c.code, RLAI_ERR_INVALID_ARG);
    ck_assert_str_eq(c.msg, "good.fail was asked to fail");
    cap_free(&c);

    cap_init(&c);   /* an error returned without reply_error gets strerror's text */
    ck_assert_int_eq(call_sync(h, "good.fail", "{\"how\":\"return\"}", &c), 0);
    ck_assert_int_eq(c.ended, 2);
    ck_assert_int_eq(c.code, RLAI_ERR_NOT_FOUND);
    ck_assert_str_eq(c.msg, rlai_strerror(RLAI_ERR_NOT_FOUND));
    cap_free(&c);

    /* refusals before any handler runs: the sink is never called */
    cap_init(&c);
    ck_assert_int_eq(call_sync(h, "good.nope", "{}", &c), RLAI_ERR_NOT_FOUND);
    ck_assert_ptr_nonnull(strstr(c.msg, "good.nope"));
    ck_assert_int_eq(call_sync(h, "good.echo", "[1,2]", &c), RLAI_ERR_INVALID_ARG);
    ck_assert_int_eq(call_sync(h, "good.echo", "{\"x\":", &c), RLAI_ERR_INVALID_ARG);
    ck_assert_int_eq(call_sync(h, "good.echo", "{} trailing", &c), RLAI_ERR_INVALID_ARG);
    ck_assert_int_eq(call_sync(h, "good.generate", "{\"prompt\":\"hi\"}", &c), RLAI_ERR_NOT_IMPLEMENTED);
    ck_assert_ptr_nonnull(strstr(c.msg, "needs a loaded model"));
    ck_assert_int_eq(c.ended, 0);
    cap_free(&c);

    cap_init(&c);   /* registration after init is refused */
    ck_assert_int_eq(call_sync(h, "good.late", "{}", &c), 0);
    ck_assert_int_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(c.results, 0), "rc")->valueint, RLAI_ERR_BUSY);
    ck_assert(!has_command(h, "good.later"));
    cap_free(&c);
    rlai_plugin_host_destroy(&h);
}
END_TEST

START_TEST(cancel_and_receiver_gone_end_calls)
{
    rlai_plugin_host *h = new_host(NULL, NULL);
    char err[1024];
    ck_assert_int_eq(load(h, "good", err, sizeof(err)), 0);
    capture c;
    cap_init(&c);
    rlai_call_sink s = sink_of(&c);
    uint64_t id = 0;
    ck_assert_int_eq(rlai_plugin_host_call(h, "good.slow", "{}", &s, &id, err, sizeof(err)), 0);
    ck_assert_uint_gt(id, 0);
    struct timespec ts = { 0, 50 * 1000 * 1000 };
    nanosleep(&ts, NULL);
    ck_assert_int_eq(c.ended, 0);
    ck_assert_int_eq(rlai_plugin_host_cancel(h, id), 0);
    cap_wait(&c);
    ck_assert_int_eq(c.ended, 1);
    ck_assert_str_eq(c.stop, "cancelled");
    ck_assert_int_eq(rlai_plugin_host_cancel(h, id), RLAI_ERR_NOT_FOUND);
    cap_free(&c);

    /* the receiver disappears after 3 pieces: the handler sees it */
    cap_init(&c);
    c.token_fail_after = 3;
    ck_assert_int_eq(call_sync(h, "good.stream", "{\"pieces\":100}", &c), 0);
    ck_assert_int_eq(c.n_tokens, 3);
    ck_assert_str_eq(c.stop, "cancelled");
    ck_assert_int_eq(cJSON_GetArraySize(c.results), 0);
    cap_free(&c);

    /* destroy with a call still running ends it */
    cap_init(&c);
    s = sink_of(&c);
    ck_assert_int_eq(rlai_plugin_host_call(h, "good.slow", "{}", &s, &id, err, sizeof(err)), 0);
    nanosleep(&ts, NULL);
    rlai_plugin_host_destroy(&h);
    ck_assert_int_eq(c.ended, 1);
    ck_assert_str_eq(c.stop, "cancelled");
    cap_free(&c);
}
END_TEST

START_TEST(config_overrides_and_fini)
{
    char marker[] = "/tmp/rlai-fini-XXXXXX";
    int fd = mkstemp(marker);
    ck_assert_int_ge(fd, 0);
    close(fd);
    unlink(marker);
    char conf[512];
    snprintf(conf, sizeof(conf), "{\"good\":{\"greeting\":\"yo\",\"fini_marker\":\"%s\",\"extra\":[1]}}", marker);
    rlai_plugin_host *h = new_host(NULL, conf);
    char err[1024];
    ck_assert_int_eq(load(h, "good", err, sizeof(err)), 0);
    capture c;
    cap_init(&c);
    ck_assert_int_eq(call_sync(h, "good.info", "{}", &c), 0);
    const cJSON *r = cJSON_GetArrayItem(c.results, 0);
    const cJSON *cfg = cJSON_GetObjectItem(r, "config");
    ck_assert_str_eq(cJSON_GetObjectItem(cfg, "greeting")->valuestring, "yo");
    ck_assert(cJSON_IsArray(cJSON_GetObjectItem(cfg, "extra")));
    ck_assert_ptr_nonnull(strstr(cJSON_GetObjectItem(r, "dir")->valuestring, "/good"));
    ck_assert(cJSON_IsTrue(cJSON_GetObjectItem(r, "has_gguf_describe")));
    ck_assert_int_eq(cJSON_GetObjectItem(r, "model_info_rc")->valueint, RLAI_ERR_NOT_IMPLEMENTED);
    ck_assert_int_eq(cJSON_GetObjectItem(r, "tokens_hello_world")->valueint, RLAI_ERR_NOT_IMPLEMENTED);
    cap_free(&c);
    ck_assert_int_ne(access(marker, F_OK), 0);
    rlai_plugin_host_destroy(&h);
    ck_assert_int_eq(access(marker, F_OK), 0);   /* fini ran at unload */
    unlink(marker);
}
END_TEST

/* ---------------------------------------------------------- engine jobs */

typedef struct waiter {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    int status;
    rlai_gen_metrics m;
} waiter;

static void on_done_wait(void *user, uint64_t id, int status, const rlai_gen_metrics *m)
{
    (void)id;
    waiter *w = user;
    pthread_mutex_lock(&w->mu);
    w->status = status;
    w->m = *m;
    w->done = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

typedef struct stepper {
    rlai_engine *e;
    atomic_bool stop;
    pthread_t t;
} stepper;

static void *step_main(void *arg)
{
    stepper *s = arg;
    while (!atomic_load(&s->stop))
        if (rlai_engine_wait_work(s->e, 20))
            rlai_engine_step(s->e);
    return NULL;
}

START_TEST(engine_jobs_stream_and_reuse_a_pinned_prefix)
{
    if (access(MODEL, R_OK) != 0) {
        fprintf(stderr, "test_plugin_host: %s missing (scripts/setup.sh fetches it)\n", MODEL);
        ck_abort_msg("default model missing");
    }
    rlai_engine_params ep;
    rlai_engine_params_init(&ep);
    ep.n_threads = 2;
    ep.n_ctx = 1024;
    rlai_engine *e = NULL;
    char err[1024];
    ck_assert_int_eq(rlai_engine_open(MODEL, &ep, &e, err, sizeof(err)), 0);
    stepper st = { .e = e };
    atomic_init(&st.stop, false);
    ck_assert_int_eq(pthread_create(&st.t, NULL, step_main, &st), 0);

    rlai_plugin_host *h = new_host(e, NULL);
    ck_assert_int_eq(load(h, "good", err, sizeof(err)), 0);

    capture c;
    cap_init(&c);
    ck_assert_int_eq(call_sync(h, "good.generate", "{\"prompt\":\"Name a colour.\",\"max_tokens\":12}", &c), 0);
    ck_assert_int_eq(c.ended, 1);
    const cJSON *r = cJSON_GetArrayItem(c.results, 0);
    ck_assert_ptr_nonnull(r);
    ck_assert_int_gt(c.n_tokens, 0);
    ck_assert_str_eq(cJSON_GetObjectItem(r, "text")->valuestring, c.text);   /* streamed == returned */
    ck_assert_int_gt(cJSON_GetObjectItem(r, "gen_tokens")->valueint, 0);
    ck_assert_int_le(cJSON_GetObjectItem(r, "gen_tokens")->valueint, 12);
    ck_assert(c.m.valid);
    ck_assert_int_eq(c.m.prompt_tokens, cJSON_GetObjectItem(r, "prompt_tokens")->valueint);
    ck_assert_int_gt(c.m.prompt_tokens, 10);
    ck_assert(strcmp(c.stop, "eog") == 0 || strcmp(c.stop, "max_tokens") == 0);
    cap_free(&c);

    cap_init(&c);
    ck_assert_int_eq(call_sync(h, "good.info", "{}", &c), 0);
    r = cJSON_GetArrayItem(c.results, 0);
    ck_assert_int_eq(cJSON_GetObjectItem(r, "model_info_rc")->valueint, 0);
    ck_assert_int_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(r, "model"), "n_layer")->valueint, 30);
    ck_assert_int_gt(cJSON_GetObjectItem(r, "tokens_hello_world")->valueint, 0);
    cap_free(&c);

    /* pin a 40-token-ish prefix: 2 whole blocks are pinned, and a later
     * prompt that starts with it reuses them */
    const char *lore = "The city of Vael sits on a cliff above a grey sea; its lighthouse has burned "
                       "for nine hundred years, tended by a guild of silent keepers.";
    char params[512];
    snprintf(params, sizeof(params), "{\"text\":\"%s\"}", lore);
    cap_init(&c);
    ck_assert_int_eq(call_sync(h, "good.pin", params, &c), 0);
    int pinned = cJSON_GetObjectItem(cJSON_GetArrayItem(c.results, 0), "pinned")->valueint;
    ck_assert_int_ge(pinned, 16);
    ck_assert_int_eq(pinned % 16, 0);
    cap_free(&c);
    rlai_engine_stats es;
    rlai_engine_get_stats(e, &es);
    ck_assert_int_eq(es.kv_blocks_pinned, pinned / 16);

    /* a raw request starting with the pinned text reuses every pinned block */
    rlai_token toks[256];
    int n = rlai_engine_tokenize(e, lore, strlen(lore), true, true, toks, 200);
    ck_assert_int_gt(n, pinned);
    toks[n++] = toks[1];   /* one more token after the prefix */
    waiter w = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER };
    rlai_request_params rp;
    memset(&rp, 0, sizeof(rp));
    rp.prompt = toks;
    rp.n_prompt = n;
    rlai_gen_params_init(&rp.gen);
    rp.gen.max_tokens = 2;
    rp.on_done = on_done_wait;
    rp.user = &w;
    uint64_t rid;
    ck_assert_int_eq(rlai_engine_submit(e, &rp, &rid), 0);
    pthread_mutex_lock(&w.mu);
    while (!w.done)
        pthread_cond_wait(&w.cv, &w.mu);
    pthread_mutex_unlock(&w.mu);
    ck_assert_int_eq(w.status, 0);
    ck_assert_int_ge(w.m.reused_tokens, pinned);
    rlai_plugin_host_destroy(&h);
    rlai_engine_get_stats(e, &es);
    ck_assert_int_eq(es.kv_blocks_pinned, 0);   /* the host unpinned at unload */

    atomic_store(&st.stop, true);
    rlai_engine_wakeup(e);
    pthread_join(st.t, NULL);
    rlai_engine_close(e);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("plugin_host");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, good_plugin_registers_its_commands);
    tcase_add_test(tc, incompatible_abis_are_refused_naming_both_versions);
    tcase_add_test(tc, failed_init_undoes_registrations);
    tcase_add_test(tc, duplicate_command_refuses_the_plugin);
    tcase_add_test(tc, broken_plugins_and_manifests_are_refused);
    tcase_add_test(tc, manifest_validation_names_the_key);
    tcase_add_test(tc, world_writable_plugin_file_is_refused);
    tcase_add_test(tc, load_all_loads_only_the_good_ones);
    tcase_add_test(tc, calls_reply_stream_and_fail);
    tcase_add_test(tc, cancel_and_receiver_gone_end_calls);
    tcase_add_test(tc, config_overrides_and_fini);
    tcase_add_test(tc, engine_jobs_stream_and_reuse_a_pinned_prefix);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
