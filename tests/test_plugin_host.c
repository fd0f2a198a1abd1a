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

#include "metrics.h"
#include "params_schema.h"
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
    ck_assert_int_eq(rlai_plugin_host_n_commands(h), 9);
    cJSON *reg = rlai_plugin_host_commands_json(h);
    cJSON *cmds = cJSON_GetObjectItem(reg, "commands");
    ck_assert_int_eq(cJSON_GetArraySize(cmds), 9);
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
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(cJSON_GetArrayItem(pl, 0), "commands")), 9);
    cJSON_Delete(pl);
    rlai_plugin_host_free(&h);
    ck_assert_ptr_null(h);
}
END_TEST

START_TEST(incompatible_abis_are_refused_naming_both_versions)
{
    rlai_plugin_host *h = new_host(NULL, NULL);
    char err[1024];
    ck_assert_int_eq(load(h, "newabi", err, sizeof(err)), RLAI_ERR_ABI);
    ck_assert_ptr_nonnull(strstr(err, "libnewabi.so"));
    ck_assert_ptr_nonnull(strstr(err, "1.5"));
    ck_assert_ptr_nonnull(strstr(err, "1.4"));
    ck_assert_ptr_nonnull(strstr(err, "newer"));
    ck_assert_int_eq(load(h, "othermajor", err, sizeof(err)), RLAI_ERR_ABI);
    ck_assert_ptr_nonnull(strstr(err, "libothermajor.so"));
    ck_assert_ptr_nonnull(strstr(err, "2.0"));
    ck_assert_ptr_nonnull(strstr(err, "another major"));
    ck_assert_int_eq(rlai_plugin_host_n_commands(h), 0);
    cJSON *pl = rlai_plugin_host_plugins_json(h);
    ck_assert_int_eq(cJSON_GetArraySize(pl), 0);
    cJSON_Delete(pl);
    rlai_plugin_host_free(&h);
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
    rlai_plugin_host_free(&h);
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
    rlai_plugin_host_free(&h);
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
    ck_assert_int_eq(rlai_plugin_host_n_commands(h), 9);
    rlai_plugin_host_free(&h);
}
END_TEST

/* Writes a manifest text into dir/manifest.json. */
static void write_file(const char *dir, const char *name, const char *text)
{
    char path[2200];
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
    rlai_plugin_host_free(&h);
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
    rlai_plugin_host_free(&h);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* A copy of the good plugin at <root>/p (root 0755, folder 0755, files
 * 0644/0755) for the file-safety cases. */
static void make_copy(char *root, char *pdir, size_t plen)
{
    ck_assert_ptr_nonnull(mkdtemp(root));
    ck_assert_int_eq(chmod(root, 0755), 0);
    snprintf(pdir, plen, "%s/p", root);
    ck_assert_int_eq(mkdir(pdir, 0755), 0);
    char cmd[2400];
    snprintf(cmd, sizeof(cmd), "cp '%s/good/libgood.so' '%s/libgood.so' && chmod 0755 '%s/libgood.so'",
             RLAI_TEST_PLUGINS, pdir, pdir);
    ck_assert_int_eq(system(cmd), 0);
    write_file(pdir, "manifest.json",
               "{\"name\":\"good\",\"version\":\"1.0.0\",\"entry\":\"libgood.so\",\"description\":\"copy\"}");
    char m[1300];
    snprintf(m, sizeof(m), "%s/manifest.json", pdir);
    ck_assert_int_eq(chmod(m, 0644), 0);
}

static void expect_refused(rlai_plugin_host *h, const char *pdir, const char *needle1, const char *needle2)
{
    char err[1024] = "";
    int rc = rlai_plugin_host_load(h, pdir, err, sizeof(err));
    if (rc == 0)
        ck_abort_msg("loaded although it should be refused for '%s'", needle2);
    if (!strstr(err, needle1) || !strstr(err, needle2))
        ck_abort_msg("'%s' lacks '%s' / '%s'", err, needle1, needle2);
}

START_TEST(group_writable_and_special_files_are_refused)
{
    char root[] = "/tmp/rlai-gw-XXXXXX", pdir[1100], path[1300], cmd[2400];
    make_copy(root, pdir, sizeof(pdir));
    rlai_plugin_host *h = new_host(NULL, NULL);

    /* group-writable entry file, manifest, plugin folder, plugin root */
    snprintf(path, sizeof(path), "%s/libgood.so", pdir);
    ck_assert_int_eq(chmod(path, 0775), 0);
    expect_refused(h, pdir, "libgood.so", "group-writable");
    ck_assert_int_eq(chmod(path, 0755), 0);
    snprintf(path, sizeof(path), "%s/manifest.json", pdir);
    ck_assert_int_eq(chmod(path, 0666), 0);
    expect_refused(h, pdir, "manifest.json", "world-writable");
    ck_assert_int_eq(chmod(path, 0664), 0);
    expect_refused(h, pdir, "manifest.json", "group-writable");
    ck_assert_int_eq(chmod(path, 0644), 0);
    ck_assert_int_eq(chmod(pdir, 0777), 0);
    expect_refused(h, pdir, "/p", "world-writable");
    ck_assert_int_eq(chmod(pdir, 0775), 0);
    expect_refused(h, pdir, "/p", "group-writable");
    ck_assert_int_eq(chmod(pdir, 0755), 0);
    ck_assert_int_eq(chmod(root, 0775), 0);
    expect_refused(h, pdir, root, "group-writable");
    ck_assert_int_eq(chmod(root, 0755), 0);

    /* owned by another user (root can make one) */
    if (geteuid() == 0) {
        snprintf(path, sizeof(path), "%s/libgood.so", pdir);
        ck_assert_int_eq(chown(path, 65534, 65534), 0);
        expect_refused(h, pdir, "libgood.so", "owned by uid 65534");
        ck_assert_int_eq(chown(path, 0, 0), 0);
        snprintf(path, sizeof(path), "%s/manifest.json", pdir);
        ck_assert_int_eq(chown(path, 65534, 65534), 0);
        expect_refused(h, pdir, "manifest.json", "owned by uid 65534");
        ck_assert_int_eq(chown(path, 0, 0), 0);
    }

    /* symlinked entry and manifest */
    snprintf(cmd, sizeof(cmd), "cd '%s' && mv libgood.so real.so && ln -s real.so libgood.so", pdir);
    ck_assert_int_eq(system(cmd), 0);
    expect_refused(h, pdir, "libgood.so", "symbolic link");
    snprintf(cmd, sizeof(cmd), "cd '%s' && rm libgood.so && mv real.so libgood.so && mv manifest.json m.json && "
             "ln -s m.json manifest.json", pdir);
    ck_assert_int_eq(system(cmd), 0);
    expect_refused(h, pdir, "manifest.json", "symbolic link");

    /* a FIFO named manifest.json must not hang the loader; a folder named
     * like the entry is not a regular file either */
    snprintf(cmd, sizeof(cmd), "cd '%s' && rm manifest.json && mkfifo -m 0644 manifest.json", pdir);
    ck_assert_int_eq(system(cmd), 0);
    expect_refused(h, pdir, "manifest.json", "not a regular file");
    /* load_all skips it and keeps going with the others */
    char good[1100];
    snprintf(good, sizeof(good), "%s/zgood", root);
    snprintf(cmd, sizeof(cmd), "cp -r '%s/good' '%s' && chmod -R go-w '%s'", RLAI_TEST_PLUGINS, good, good);
    ck_assert_int_eq(system(cmd), 0);
    ck_assert_int_eq(rlai_plugin_host_load_all(h, root), 1);
    ck_assert(has_command(h, "good.echo"));
    rlai_plugin_host_free(&h);

    /* everything fixed: it loads */
    h = new_host(NULL, NULL);
    snprintf(cmd, sizeof(cmd), "cd '%s' && rm manifest.json && mv m.json manifest.json", pdir);
    ck_assert_int_eq(system(cmd), 0);
    char err[1024] = "";
    ck_assert_msg(rlai_plugin_host_load(h, pdir, err, sizeof(err)) == 0, "%s", err);
    rlai_plugin_host_free(&h);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

START_TEST(load_all_loads_only_the_good_ones)
{
    rlai_plugin_host *h = new_host(NULL, NULL);
    /* stderr gets one line per refused folder; the good ones (good, stuck,
     * typed, oldabi: an older minor is accepted) load */
    ck_assert_int_eq(rlai_plugin_host_load_all(h, RLAI_TEST_PLUGINS), 4);
    ck_assert_int_eq(rlai_plugin_host_n_commands(h), 9 + 7 + 3 + 1);
    ck_assert_int_eq(rlai_plugin_host_load_all(h, "/nonexistent/rlai"), RLAI_ERR_IO);
    rlai_plugin_host_free(&h);
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
    rlai_plugin_host_free(&h);
}
END_TEST

/* ---------------------------------------------------------- params_schema */

START_TEST(params_schema_is_enforced_before_the_handler)
{
    rlai_plugin_host *h = new_host(NULL, NULL);
    char err[1024];
    ck_assert_msg(load(h, "typed", err, sizeof(err)) == 0, "%s", err);
    capture c;
    cap_init(&c);
    ck_assert_int_eq(call_sync(h, "typed.set",
                               "{\"name\":\"ab\",\"temperature\":1.5,\"count\":3,\"mode\":\"fast\","
                               "\"tags\":[\"a\"],\"flag\":null}",
                               &c), 0);
    ck_assert_int_eq(c.ended, 1);
    ck_assert_str_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(c.results, 0), "params"), "name")
                         ->valuestring, "ab");
    cap_free(&c);
    cap_init(&c);   /* length counts code points: 8 of them in 16 bytes pass maxLength 8 */
    ck_assert_int_eq(call_sync(h, "typed.set", "{\"name\":\"\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\"}", &c), 0);
    ck_assert_int_eq(c.ended, 1);
    cap_free(&c);
    static const struct { const char *cmd, *params, *msg; } bad[] = {
        { "typed.set", "{\"temperature\":1}", "'name' is required" },
        { "typed.set", "{\"name\":\"a\",\"temperature\":2.5}", "'temperature' must be <= 2" },
        { "typed.set", "{\"name\":\"a\",\"temperature\":-0.5}", "'temperature' must be >= 0" },
        { "typed.set", "{\"name\":\"a\",\"temperature\":\"hot\"}", "'temperature' must be a number" },
        { "typed.set", "{\"name\":\"a\",\"count\":0}", "'count' must be > 0" },
        { "typed.set", "{\"name\":\"a\",\"count\":11}", "'count' must be <= 10" },
        { "typed.set", "{\"name\":\"a\",\"count\":2.5}", "'count' must be an integer" },
        { "typed.set", "{\"name\":\"\"}", "'name' must be at least 1 character long" },
        { "typed.set", "{\"name\":\"abcdefghi\"}", "'name' must be at most 8 characters long (it has 9)" },
        { "typed.set", "{\"name\":\"a\",\"mode\":\"medium\"}", "'mode' must be one of \"fast\", \"slow\"" },
        { "typed.set", "{\"name\":\"a\",\"tags\":[\"x\",3]}", "'tags[1]' must be a string" },
        { "typed.set", "{\"name\":\"a\",\"tags\":[\"a\",\"b\",\"c\",\"d\"]}", "'tags' must have at most 3 items" },
        { "typed.set", "{\"name\":\"a\",\"flag\":1}", "'flag' must be a boolean or null" },
        { "typed.set", "{\"name\":\"a\",\"colour\":\"red\"}",
          "'colour' is not accepted (additionalProperties is false; parameters: name, temperature, count, mode, "
          "tags, flag)" },
        { "typed.open", "{\"model\":{\"n_layer\":0}}", "'model.n_layer' must be >= 1" },
        { "typed.open", "{\"model\":{}}", "'model.n_layer' is required" },
        { "typed.open", "{\"model\":5}", "'model' matches none of its 2 oneOf forms" },
        { "typed.fail", "{}", "'code' is required" },
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cap_init(&c);
        ck_assert_int_eq(call_sync(h, bad[i].cmd, bad[i].params, &c), RLAI_ERR_INVALID_ARG);
        ck_assert_msg(strstr(c.msg, bad[i].msg) != NULL, "%s %s: got \"%s\", want \"%s\"", bad[i].cmd,
                      bad[i].params, c.msg, bad[i].msg);
        ck_assert_ptr_nonnull(strstr(c.msg, bad[i].cmd));   /* names the command */
        ck_assert_int_eq(c.ended, 0);                       /* the handler never ran */
        cap_free(&c);
    }
    /* no additionalProperties: extra keys are accepted (JSON Schema's default) */
    cap_init(&c);
    ck_assert_int_eq(call_sync(h, "typed.open", "{\"model\":\"m.gguf\",\"extra\":[1]}", &c), 0);
    ck_assert_int_eq(c.ended, 1);
    cap_free(&c);
    cap_init(&c);
    ck_assert_int_eq(call_sync(h, "typed.open", "{\"model\":{\"n_layer\":4}}", &c), 0);
    ck_assert_int_eq(c.ended, 1);
    cap_free(&c);
    rlai_plugin_host_free(&h);
}
END_TEST

START_TEST(handler_error_codes_reach_the_caller)
{
    rlai_plugin_host *h = new_host(NULL, NULL);
    char err[1024];
    ck_assert_msg(load(h, "typed", err, sizeof(err)) == 0, "%s", err);
    static const int codes[] = { RLAI_ERR_NOT_FOUND, RLAI_ERR_TOO_LARGE, RLAI_ERR_BUSY, RLAI_ERR_UNSUPPORTED,
                                 RLAI_ERR_CONTEXT_FULL, RLAI_ERR_IO };
    for (size_t i = 0; i < sizeof(codes) / sizeof(codes[0]); i++) {
        for (int ret = 0; ret < 2; ret++) {
            capture c;
            cap_init(&c);
            char params[64];
            snprintf(params, sizeof(params), "{\"code\":%d,\"return\":%s}", codes[i], ret ? "true" : "false");
            ck_assert_int_eq(call_sync(h, "typed.fail", params, &c), 0);
            ck_assert_int_eq(c.ended, 2);
            ck_assert_int_eq(c.code, codes[i]);
            char want[80];
            snprintf(want, sizeof(want), "typed.fail failed with code %d as asked", codes[i]);
            ck_assert_str_eq(c.msg, ret ? rlai_strerror(codes[i]) : want);
            cap_free(&c);
        }
    }
    rlai_plugin_host_free(&h);
}
END_TEST

START_TEST(broken_params_schema_refuses_the_plugin)
{
    rlai_plugin_host *h = new_host(NULL, NULL);
    char err[1024];
    ck_assert_int_eq(load(h, "badschema", err, sizeof(err)), RLAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(err, "libbadschema.so"));
    ck_assert_msg(strstr(err, "command 'badschema.bad': params_schema: name: keyword \"pattern\" is not supported") !=
                      NULL, "%s", err);
    ck_assert(!has_command(h, "badschema.ok"));   /* the whole plugin is refused */
    ck_assert_int_eq(rlai_plugin_host_n_commands(h), 0);
    ck_assert_int_eq(load(h, "typed", err, sizeof(err)), 0);   /* the host keeps loading others */
    rlai_plugin_host_free(&h);

    static const struct { const char *schema, *msg; } bad[] = {
        { "{\"type\":\"string\"}", "\"type\" must be \"object\"" },
        { "{\"properties\":{\"a\":{\"minimum\":\"x\"}}}", "a: \"minimum\" must be a number" },
        { "{\"properties\":{\"a\":{\"minimum\":3,\"maximum\":1}}}", "a: \"minimum\" is greater than \"maximum\"" },
        { "{\"properties\":{\"a\":{\"minLength\":-1}}}", "a: \"minLength\" must be a non-negative integer" },
        { "{\"properties\":{\"a\":{\"minLength\":5,\"maxLength\":2}}}", "\"minLength\" is greater than" },
        { "{\"properties\":{\"a\":{\"type\":\"strin\"}}}", "a: unknown type \"strin\"" },
        { "{\"properties\":{\"a\":{\"type\":[]}}}", "a: \"type\" must be a type name" },
        { "{\"properties\":{\"a\":{\"enum\":[]}}}", "a: \"enum\" must be a non-empty array" },
        { "{\"properties\":{\"a\":{\"items\":[{}]}}}", "tuple form" },
        { "{\"properties\":{\"a\":{\"oneOf\":[]}}}", "\"oneOf\" must be a non-empty array" },
        { "{\"properties\":{\"a\":{\"oneOf\":[{\"type\":\"x\"}]}}}", "a.oneOf[0]: unknown type" },
        { "{\"properties\":{\"a\":5}}", "a: a schema must be an object or a boolean" },
        { "{\"properties\":[]}", "\"properties\" must be an object" },
        { "{\"required\":\"a\"}", "\"required\" must be an array of names" },
        { "{\"required\":[\"z\"],\"additionalProperties\":false}", "no value could pass" },
        { "{\"additionalProperties\":{\"type\":3}}", "additionalProperties: \"type\" must be" },
        { "{\"propertys\":{}}", "keyword \"propertys\" is not supported" },
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cJSON *s = cJSON_Parse(bad[i].schema);
        ck_assert_ptr_nonnull(s);
        ck_assert_int_eq(rlai_params_schema_check(s, err, sizeof(err)), RLAI_ERR_INVALID_ARG);
        ck_assert_msg(strstr(err, bad[i].msg) != NULL, "%s: got \"%s\"", bad[i].schema, err);
        cJSON_Delete(s);
    }
    /* nesting past the limit */
    char deep[2048] = "{\"type\":\"object\"";
    for (int i = 0; i < RLAI_PARAMS_SCHEMA_MAX_DEPTH + 2; i++)
        strcat(deep, ",\"properties\":{\"a\":{\"type\":\"object\"");
    for (int i = 0; i < RLAI_PARAMS_SCHEMA_MAX_DEPTH + 2; i++)
        strcat(deep, "}}");
    strcat(deep, "}");
    cJSON *s = cJSON_Parse(deep);
    ck_assert_ptr_nonnull(s);
    ck_assert_int_eq(rlai_params_schema_check(s, err, sizeof(err)), RLAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(err, "nested deeper"));
    cJSON_Delete(s);
    /* annotations and boolean subschemas are fine */
    s = cJSON_Parse("{\"title\":\"t\",\"$schema\":\"x\",\"properties\":{\"a\":true,\"b\":false,\"c\":{\"default\":1,"
                    "\"examples\":[1],\"format\":\"uri\",\"description\":\"d\"}}}");
    ck_assert_int_eq(rlai_params_schema_check(s, err, sizeof(err)), 0);
    cJSON *v = cJSON_Parse("{\"a\":[1],\"c\":2}");
    ck_assert_int_eq(rlai_params_schema_validate(s, v, err, sizeof(err)), 0);
    cJSON_Delete(v);
    v = cJSON_Parse("{\"b\":1}");
    ck_assert_int_eq(rlai_params_schema_validate(s, v, err, sizeof(err)), RLAI_ERR_INVALID_ARG);
    ck_assert_str_eq(err, "'b' is not accepted");
    cJSON_Delete(v);
    cJSON_Delete(s);
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
    rlai_plugin_host_free(&h);
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
    rlai_plugin_host_free(&h);
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
    char *first = strdup(c.text);
    cap_free(&c);

    /* ABI 1.4: a predicted output (the same text, its drafts accepted) and
     * a banned token (the answer's first token no longer comes first) */
    cJSON *pp = cJSON_CreateObject();
    cJSON_AddStringToObject(pp, "prompt", "Name a colour.");
    cJSON_AddNumberToObject(pp, "max_tokens", 12);
    cJSON_AddStringToObject(pp, "prediction", first);
    char *ps = cJSON_PrintUnformatted(pp);
    cap_init(&c);
    ck_assert_int_eq(call_sync(h, "good.generate", ps, &c), 0);
    r = cJSON_GetArrayItem(c.results, 0);
    ck_assert_str_eq(cJSON_GetObjectItem(r, "text")->valuestring, first);
    ck_assert_int_ge(cJSON_GetObjectItem(r, "accepted_tokens")->valueint, 4);
    cap_free(&c);
    int32_t ids[16];
    int nid = rlai_engine_tokenize(e, first, strlen(first), false, false, ids, 16);
    ck_assert_int_gt(nid, 0);
    cJSON_DeleteItemFromObject(pp, "prediction");
    cJSON_AddNumberToObject(pp, "ban", ids[0]);
    free(ps);
    ps = cJSON_PrintUnformatted(pp);
    cap_init(&c);
    ck_assert_int_eq(call_sync(h, "good.generate", ps, &c), 0);
    r = cJSON_GetArrayItem(c.results, 0);
    const char *banned = cJSON_GetObjectItem(r, "text")->valuestring;
    ck_assert_int_eq(rlai_engine_tokenize(e, banned, strlen(banned), false, false, ids + 8, 8) > 0, 1);
    ck_assert_int_ne(ids[8], ids[0]);
    cap_free(&c);
    cJSON_ReplaceItemInObject(pp, "ban", cJSON_CreateNumber(10000000));   /* not a token: refused */
    free(ps);
    ps = cJSON_PrintUnformatted(pp);
    cap_init(&c);
    ck_assert_int_eq(call_sync(h, "good.generate", ps, &c), 0);
    ck_assert_int_eq(c.ended, 2);                 /* the engine's refusal ends the call */
    ck_assert_msg(strstr(c.msg, "invalid argument"), "%s", c.msg);
    cap_free(&c);
    free(ps);
    cJSON_Delete(pp);
    free(first);

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
    rlai_plugin_host_free(&h);
    rlai_engine_get_stats(e, &es);
    ck_assert_int_eq(es.kv_blocks_pinned, 0);   /* the host unpinned at unload */

    atomic_store(&st.stop, true);
    rlai_engine_wakeup(e);
    pthread_join(st.t, NULL);
    rlai_engine_close(e);
}
END_TEST

/* ---------------------------------------------------------- stuck plugins, bad output */

static rlai_plugin_host *new_stuck_host(int workers, int max_queue, int timeout_ms, rlai_metrics *m)
{
    rlai_plugin_host_params p = { .workers = workers, .max_queue = max_queue, .quiet = true,
                                  .call_timeout_ms = timeout_ms, .metrics = m };
    rlai_plugin_host *h = NULL;
    ck_assert_int_eq(rlai_plugin_host_new(&p, &h), 0);
    char err[1024];
    ck_assert_msg(load(h, "stuck", err, sizeof(err)) == 0, "%s", err);
    return h;
}

static cJSON *status_of_stuck(rlai_plugin_host *h)
{
    capture c;
    cap_init(&c);
    ck_assert_int_eq(call_sync(h, "stuck.status", "{}", &c), 0);
    ck_assert_int_eq(c.ended, 1);
    cJSON *r = cJSON_Duplicate(cJSON_GetArrayItem(c.results, 0), true);
    cap_free(&c);
    return r;
}

/* Waits (bounded) until no stuck handler runs any more. */
static cJSON *wait_handlers_gone(rlai_plugin_host *h)
{
    for (int i = 0; i < 600; i++) {
        cJSON *st = status_of_stuck(h);
        if (cJSON_GetObjectItem(st, "running")->valueint == 0)
            return st;
        cJSON_Delete(st);
        struct timespec ts = { 0, 50 * 1000 * 1000 };
        nanosleep(&ts, NULL);
    }
    ck_abort_msg("stuck handlers never returned");
    return NULL;
}

START_TEST(stuck_calls_time_out_and_the_pool_keeps_serving)
{
    rlai_metrics *m = NULL;
    ck_assert_int_eq(rlai_metrics_new(&m), 0);
    rlai_plugin_host *h = new_stuck_host(2, 16, 60000, m);
    capture c[4];
    char err[512];
    for (int i = 0; i < 4; i++) {
        cap_init(&c[i]);
        rlai_call_sink s = sink_of(&c[i]);
        ck_assert_int_eq(rlai_plugin_host_call_timed(h, i % 2 ? "stuck.spin" : "stuck.sleep", "{\"ms\":4000}", 300,
                                                     &s, NULL, err, sizeof(err)), 0);
    }
    /* every stuck call ends with TIMEOUT naming its command, queued ones too */
    for (int i = 0; i < 4; i++) {
        cap_wait(&c[i]);
        ck_assert_int_eq(c[i].ended, 2);
        ck_assert_int_eq(c[i].code, RLAI_ERR_TIMEOUT);
        ck_assert_ptr_nonnull(strstr(c[i].msg, i % 2 ? "stuck.spin" : "stuck.sleep"));
    }
    /* the pool still serves while the handlers are stuck */
    ck_assert_int_gt(rlai_plugin_host_stuck(h), 0);
    capture p;
    cap_init(&p);
    ck_assert_int_eq(call_sync(h, "stuck.ping", "{}", &p), 0);
    ck_assert_int_eq(p.ended, 1);
    ck_assert(cJSON_IsTrue(cJSON_GetObjectItem(cJSON_GetArrayItem(p.results, 0), "pong")));
    cap_free(&p);
    char *text = rlai_metrics_render(m, NULL, 1.0);
    ck_assert_ptr_nonnull(strstr(text, "rlai_plugin_calls_timed_out_total{command=\"stuck.sleep\"} 2"));
    ck_assert_ptr_nonnull(strstr(text, "rlai_plugin_calls_timed_out_total{command=\"stuck.spin\"} 2"));
    ck_assert_ptr_nonnull(strstr(text, "rlai_plugin_workers_stuck "));
    free(text);
    /* the late replies are dropped (the client saw one terminal only) */
    cJSON *st = wait_handlers_gone(h);
    ck_assert_int_eq(cJSON_GetObjectItem(st, "late_rc")->valueint, RLAI_ERR_CANCELLED);
    cJSON_Delete(st);
    ck_assert_int_eq(rlai_plugin_host_stuck(h), 0);
    text = rlai_metrics_render(m, NULL, 1.0);
    ck_assert_ptr_nonnull(strstr(text, "rlai_plugin_workers_stuck 0"));
    free(text);
    for (int i = 0; i < 4; i++)
        cap_free(&c[i]);
    rlai_plugin_host_free(&h);
    rlai_metrics_free(&m);
}
END_TEST

START_TEST(deadlines_come_from_manifest_request_and_host)
{
    rlai_plugin_host *h = new_stuck_host(2, 16, 60000, NULL);
    /* the manifest's 300 ms for stuck.short beats the host's 60 s */
    capture c;
    cap_init(&c);
    ck_assert_int_eq(call_sync(h, "stuck.short", "{\"ms\":2000}", &c), 0);
    ck_assert_int_eq(c.ended, 2);
    ck_assert_int_eq(c.code, RLAI_ERR_TIMEOUT);
    ck_assert_ptr_nonnull(strstr(c.msg, "300 ms"));
    cap_free(&c);
    /* the request's own timeout_ms */
    cap_init(&c);
    rlai_call_sink s = sink_of(&c);
    char err[512];
    ck_assert_int_eq(rlai_plugin_host_call_timed(h, "stuck.sleep", "{\"ms\":2000}", 200, &s, NULL, err, sizeof(err)),
                     0);
    cap_wait(&c);
    ck_assert_int_eq(c.ended, 2);
    ck_assert_int_eq(c.code, RLAI_ERR_TIMEOUT);
    ck_assert_ptr_nonnull(strstr(c.msg, "200 ms"));
    cap_free(&c);
    /* a call inside its deadline ends normally */
    cap_init(&c);
    ck_assert_int_eq(call_sync(h, "stuck.sleep", "{\"ms\":20}", &c), 0);
    ck_assert_int_eq(c.ended, 1);
    ck_assert_int_eq(cJSON_GetArraySize(c.results), 1);
    cap_free(&c);
    cJSON_Delete(wait_handlers_gone(h));
    rlai_plugin_host_free(&h);
}
END_TEST

START_TEST(a_full_queue_answers_busy_at_once)
{
    rlai_plugin_host *h = new_stuck_host(1, 1, 60000, NULL);
    capture a, b, x;
    cap_init(&a);
    cap_init(&b);
    cap_init(&x);
    rlai_call_sink sa = sink_of(&a), sb = sink_of(&b), sx = sink_of(&x);
    char err[512];
    uint64_t ida = 0, idb = 0;
    ck_assert_int_eq(rlai_plugin_host_call(h, "stuck.sleep", "{\"ms\":600}", &sa, &ida, err, sizeof(err)), 0);
    /* wait until it runs, so the next one is the queued one */
    for (int i = 0; i < 400; i++) {
        if (rlai_plugin_host_running(h) == 1)
            break;
        struct timespec ts = { 0, 5 * 1000 * 1000 };
        nanosleep(&ts, NULL);
    }
    ck_assert_int_eq(rlai_plugin_host_call(h, "stuck.ping", "{}", &sb, &idb, err, sizeof(err)), 0);
    ck_assert_int_eq(rlai_plugin_host_call(h, "stuck.ping", "{}", &sx, NULL, err, sizeof(err)), RLAI_ERR_BUSY);
    ck_assert_ptr_nonnull(strstr(err, "waiting"));
    cap_wait(&a);
    cap_wait(&b);
    ck_assert_int_eq(b.ended, 1);
    ck_assert_int_eq(x.ended, 0);
    cap_free(&a);
    cap_free(&b);
    cap_free(&x);
    rlai_plugin_host_free(&h);
}
END_TEST

START_TEST(stop_gives_up_on_stuck_handlers_at_its_deadline)
{
    rlai_plugin_host *h = new_stuck_host(2, 16, 60000, NULL);
    capture c;
    cap_init(&c);
    rlai_call_sink s = sink_of(&c);
    char err[512];
    ck_assert_int_eq(rlai_plugin_host_call(h, "stuck.sleep", "{\"ms\":1500}", &s, NULL, err, sizeof(err)), 0);
    for (int i = 0; i < 400 && rlai_plugin_host_running(h) < 1; i++) {
        struct timespec ts = { 0, 5 * 1000 * 1000 };
        nanosleep(&ts, NULL);
    }
    /* the handler ignores the cancel: stop ends the call itself and says
     * one handler is left running */
    ck_assert_int_eq(rlai_plugin_host_stop(h, 200), 1);
    ck_assert_int_eq(c.ended, 1);
    ck_assert_str_eq(c.stop, "cancelled");
    capture n;
    cap_init(&n);
    s = sink_of(&n);
    ck_assert_int_eq(rlai_plugin_host_call(h, "stuck.ping", "{}", &s, NULL, err, sizeof(err)), RLAI_ERR_CANCELLED);
    rlai_plugin_host_free(&h);   /* abandons the host: the handler still runs in it */
    /* the late reply lands on the abandoned host after this (ASan would
     * report a use after free) */
    struct timespec ts = { 1, 600 * 1000 * 1000 };
    nanosleep(&ts, NULL);
    ck_assert_int_eq(c.ended, 1);
    cap_free(&c);
    cap_free(&n);
}
END_TEST

START_TEST(invalid_plugin_output_is_an_error_for_plugin_and_client)
{
    /* one worker: stuck.status runs after the bad command's handler returned */
    rlai_plugin_host *h = new_stuck_host(1, 16, 60000, NULL);
    static const struct { const char *cmd, *kind; int code; const char *needle; } cases[] = {
        { "stuck.badtext", "utf8", RLAI_ERR_INVALID_ARG, "not valid UTF-8" },
        { "stuck.badtext", "overlong", RLAI_ERR_INVALID_ARG, "not valid UTF-8" },
        { "stuck.badtext", "nul", RLAI_ERR_INVALID_ARG, "NUL" },
        { "stuck.badtext", "big", RLAI_ERR_TOO_LARGE, "larger than" },
        { "stuck.badjson", "deep", RLAI_ERR_TOO_LARGE, "nests deeper" },
        { "stuck.badjson", "big", RLAI_ERR_TOO_LARGE, "larger than" },
        { "stuck.badjson", "utf8", RLAI_ERR_INVALID_ARG, "not valid UTF-8" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char params[64];
        snprintf(params, sizeof(params), "{\"kind\":\"%s\"}", cases[i].kind);
        capture c;
        cap_init(&c);
        ck_assert_int_eq(call_sync(h, cases[i].cmd, params, &c), 0);
        if (c.ended != 2 || c.code != cases[i].code || !strstr(c.msg, cases[i].needle))
            ck_abort_msg("case %zu (%s %s): ended %d code %d msg '%s'", i, cases[i].cmd, cases[i].kind, c.ended,
                         c.code, c.msg);
        ck_assert_int_eq(cJSON_GetArraySize(c.results), 0);
        if (!strcmp(cases[i].cmd, "stuck.badtext"))
            ck_assert_str_eq(c.text, "ok ");          /* what came before still went out */
        cap_free(&c);
        cJSON *st = status_of_stuck(h);
        ck_assert_int_eq(cJSON_GetObjectItem(st, "last_rc")->valueint, cases[i].code);
        cJSON_Delete(st);
    }
    rlai_plugin_host_free(&h);
}
END_TEST

START_TEST(process_isolation_is_refused_as_not_implemented)
{
    rlai_plugin_host *h = new_host(NULL, NULL);
    char err[1024];
    ck_assert_int_eq(load(h, "isolation", err, sizeof(err)), RLAI_ERR_NOT_IMPLEMENTED);
    ck_assert_ptr_nonnull(strstr(err, "\"isolation\": \"process\""));
    ck_assert_ptr_nonnull(strstr(err, "not implemented in this build"));
    rlai_plugin_host_free(&h);
}
END_TEST

/* ---------------------------------------------------------- ABI 1.2 */

/* register_chat_model: the good plugin offers good/parrot; its refusals
 * (duplicate, foreign name, unknown command, params not an object) come
 * back as codes; the registry lists and finds the model. */
START_TEST(chat_models_are_checked_listed_and_found)
{
    rlai_plugin_host *h = new_host(NULL, NULL);
    char err[1024];
    ck_assert_int_eq(load(h, "good", err, sizeof(err)), 0);
    cJSON *list = rlai_plugin_host_chat_models_json(h);
    ck_assert_int_eq(cJSON_GetArraySize(list), 1);
    const cJSON *m = cJSON_GetArrayItem(list, 0);
    ck_assert_str_eq(cJSON_GetObjectItem(m, "id")->valuestring, "good/parrot");
    ck_assert_str_eq(cJSON_GetObjectItem(m, "plugin")->valuestring, "good");
    ck_assert_str_eq(cJSON_GetObjectItem(m, "description")->valuestring, "A parrot (test chat model)");
    cJSON_Delete(list);
    char *name = NULL, *cmd = NULL;
    cJSON *params = NULL;
    for (int by_id = 0; by_id < 2; by_id++) {
        ck_assert_int_eq(rlai_plugin_host_chat_model(h, by_id ? "parrot" : "good/parrot", by_id, &name, &cmd, &params),
                         0);
        ck_assert_str_eq(name, "good/parrot");
        ck_assert_str_eq(cmd, "good.parrot");
        ck_assert_str_eq(cJSON_GetObjectItem(params, "voice")->valuestring, "Squawk: ");
        free(name);
        free(cmd);
        cJSON_Delete(params);
    }
    ck_assert_int_eq(rlai_plugin_host_chat_model(h, "parrot", false, &name, &cmd, &params), RLAI_ERR_NOT_FOUND);
    ck_assert_int_eq(rlai_plugin_host_chat_model(h, "good/owl", true, &name, &cmd, &params), RLAI_ERR_NOT_FOUND);
    capture c;
    cap_init(&c);
    ck_assert_int_eq(call_sync(h, "good.info", "{}", &c), 0);
    const cJSON *rcs = cJSON_GetObjectItem(cJSON_GetArrayItem(c.results, 0), "chat_model_rcs");
    int want[5] = { 0, RLAI_ERR_EXISTS, RLAI_ERR_INVALID_ARG, RLAI_ERR_INVALID_ARG, RLAI_ERR_INVALID_ARG };
    for (int i = 0; i < 5; i++)
        ck_assert_int_eq(cJSON_GetArrayItem(rcs, i)->valueint, want[i]);
    cap_free(&c);
    /* the parrot streams its voice and the message */
    cap_init(&c);
    ck_assert_int_eq(call_sync(h, "good.parrot", "{\"voice\":\"Squawk: \",\"message\":\"hello\"}", &c), 0);
    ck_assert_str_eq(c.text, "Squawk: hello");
    cap_free(&c);
    rlai_plugin_host_free(&h);
}
END_TEST

static rlai_engine *open_model(void)
{
    if (access(MODEL, R_OK) != 0) {
        fprintf(stderr, "test_plugin_host: %s missing (scripts/setup.sh fetches it)\n", MODEL);
        ck_abort_msg("default model missing");
    }
    rlai_engine_params ep;
    rlai_engine_params_init(&ep);
    ep.n_threads = 2;
    ep.n_ctx = 512;
    rlai_engine *e = NULL;
    char err[1024];
    ck_assert_int_eq(rlai_engine_open(MODEL, &ep, &e, err, sizeof(err)), 0);
    return e;
}

static int wait_threads(rlai_plugin_host *h, int want_alive, int want_waits, int want_handoff)
{
    for (int i = 0; i < 1000; i++) {   /* up to 10 s */
        int alive, waits, handoff;
        rlai_plugin_host_threads(h, &alive, &waits, &handoff);
        if ((want_alive < 0 || alive == want_alive) && (want_waits < 0 || waits == want_waits) &&
            (want_handoff < 0 || handoff == want_handoff))
            return 0;
        usleep(10000);
    }
    return -1;
}

/* Handlers blocked in generate do not starve the pool: with 2 workers and
 * an engine nobody steps yet, three generate calls wait on the engine and
 * a fourth call (echo) is still served; once the engine runs they finish
 * and the pool shrinks back to its 2 workers. */
START_TEST(handlers_waiting_on_the_engine_do_not_starve_the_pool)
{
    rlai_engine *e = open_model();
    rlai_plugin_host *h = new_host(e, NULL);   /* workers = 2 */
    char err[1024];
    ck_assert_int_eq(load(h, "good", err, sizeof(err)), 0);
    capture g[3];
    for (int i = 0; i < 3; i++) {
        cap_init(&g[i]);
        rlai_call_sink s = sink_of(&g[i]);
        ck_assert_int_eq(rlai_plugin_host_call(h, "good.generate", "{\"prompt\":\"Hi\",\"max_tokens\":4}", &s, NULL,
                                               err, sizeof(err)), 0);
    }
    ck_assert_int_eq(wait_threads(h, -1, 3, -1), 0);
    int alive, waits, handoff;
    rlai_plugin_host_threads(h, &alive, &waits, &handoff);
    ck_assert_int_ge(handoff, 1);
    ck_assert_int_eq(alive, 2 + handoff);
    capture c;
    cap_init(&c);
    ck_assert_int_eq(call_sync(h, "good.echo", "{\"x\":1}", &c), 0);   /* served while 3 wait */
    ck_assert_int_eq(c.ended, 1);
    cap_free(&c);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(g[i].ended, 0);   /* nobody stepped the engine yet */
    stepper st = { .e = e };
    atomic_init(&st.stop, false);
    ck_assert_int_eq(pthread_create(&st.t, NULL, step_main, &st), 0);
    for (int i = 0; i < 3; i++) {
        cap_wait(&g[i]);
        ck_assert_int_eq(g[i].ended, 1);
        cap_free(&g[i]);
    }
    ck_assert_int_eq(wait_threads(h, 2, 0, 0), 0);   /* back to the configured pool */
    rlai_plugin_host_free(&h);
    atomic_store(&st.stop, true);
    pthread_join(st.t, NULL);
    rlai_engine_close(e);
}
END_TEST

/* A plugin built for ABI 1.1 passes a shorter rlai_gen_result: the host
 * fills it and writes nothing past it. */
START_TEST(an_older_plugins_result_struct_is_not_overrun)
{
    rlai_engine *e = open_model();
    stepper st = { .e = e };
    atomic_init(&st.stop, false);
    ck_assert_int_eq(pthread_create(&st.t, NULL, step_main, &st), 0);
    rlai_plugin_host *h = new_host(e, NULL);
    char err[1024];
    ck_assert_int_eq(load(h, "oldabi", err, sizeof(err)), 0);
    capture c;
    cap_init(&c);
    ck_assert_int_eq(call_sync(h, "oldabi.generate", "{}", &c), 0);
    ck_assert_int_eq(c.ended, 1);
    const cJSON *r = cJSON_GetArrayItem(c.results, 0);
    ck_assert(cJSON_IsTrue(cJSON_GetObjectItem(r, "canary_intact")));
    ck_assert(cJSON_IsTrue(cJSON_GetObjectItem(r, "has_text")));
    ck_assert_int_gt(cJSON_GetObjectItem(r, "gen_tokens")->valueint, 0);
    cap_free(&c);
    rlai_plugin_host_free(&h);
    atomic_store(&st.stop, true);
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
    tcase_add_test(tc, group_writable_and_special_files_are_refused);
    tcase_add_test(tc, load_all_loads_only_the_good_ones);
    tcase_add_test(tc, calls_reply_stream_and_fail);
    tcase_add_test(tc, params_schema_is_enforced_before_the_handler);
    tcase_add_test(tc, handler_error_codes_reach_the_caller);
    tcase_add_test(tc, broken_params_schema_refuses_the_plugin);
    tcase_add_test(tc, cancel_and_receiver_gone_end_calls);
    tcase_add_test(tc, config_overrides_and_fini);
    tcase_add_test(tc, engine_jobs_stream_and_reuse_a_pinned_prefix);
    tcase_add_test(tc, stuck_calls_time_out_and_the_pool_keeps_serving);
    tcase_add_test(tc, deadlines_come_from_manifest_request_and_host);
    tcase_add_test(tc, a_full_queue_answers_busy_at_once);
    tcase_add_test(tc, stop_gives_up_on_stuck_handlers_at_its_deadline);
    tcase_add_test(tc, invalid_plugin_output_is_an_error_for_plugin_and_client);
    tcase_add_test(tc, process_isolation_is_refused_as_not_implemented);
    tcase_add_test(tc, chat_models_are_checked_listed_and_found);
    tcase_add_test(tc, handlers_waiting_on_the_engine_do_not_starve_the_pool);
    tcase_add_test(tc, an_older_plugins_result_struct_is_not_overrun);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
