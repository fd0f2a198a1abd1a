/* test_config.c - `rlai serve` configuration: defaults, JSON file keys,
 * typos and wrong types refused with the key named, loopback-only TCP. */
#include "api_key.h"
#include <sys/stat.h>
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "rlai/error.h"

START_TEST(defaults_are_private_and_limited)
{
    rlai_config c;
    ck_assert_int_eq(rlai_config_defaults(&c, "models/x.gguf"), 0);
    ck_assert_str_eq(c.model, "models/x.gguf");
    ck_assert_ptr_nonnull(c.zmq);
    ck_assert(strncmp(c.zmq, "ipc://", 6) == 0);
    ck_assert_ptr_nonnull(strstr(c.zmq, "rlai"));
    ck_assert_ptr_nonnull(strstr(c.zmq, "/engine.zmq"));
    ck_assert_ptr_nonnull(c.pipe);
    ck_assert_ptr_nonnull(strstr(c.pipe, "/engine.sock"));
    ck_assert_ptr_null(c.zmq_tcp);
    ck_assert_int_eq(c.max_inflight_client, 8);
    ck_assert_int_eq(c.max_inflight_total, 64);
    char err[256];
    ck_assert_int_eq(rlai_config_validate(&c, err, sizeof(err)), 0);
    rlai_config_free(&c);
}
END_TEST

START_TEST(json_overrides_and_errors)
{
    rlai_config c;
    char err[256];
    ck_assert_int_eq(rlai_config_defaults(&c, "m.gguf"), 0);
    const char *good = "{\"model\":\"other.gguf\",\"threads\":3,\"context\":2048,\"kv_type\":\"q8_0\","
                       "\"endpoints\":{\"zmq\":\"\",\"zmq_tcp\":\"tcp://127.0.0.1:5677\",\"pipe\":null},"
                       "\"limits\":{\"max_prompt_tokens\":100,\"max_inflight_per_client\":2},"
                       "\"spec_lookup_min\":-1}";
    ck_assert_int_eq(rlai_config_load_json(&c, good, err, sizeof(err)), 0);
    ck_assert_str_eq(c.model, "other.gguf");
    ck_assert_int_eq(c.threads, 3);
    ck_assert_int_eq(c.context, 2048);
    ck_assert(c.kv_q8_0);
    ck_assert_ptr_null(c.zmq);
    ck_assert_ptr_null(c.pipe);
    ck_assert_str_eq(c.zmq_tcp, "tcp://127.0.0.1:5677");
    ck_assert_int_eq(c.max_prompt_tokens, 100);
    ck_assert_int_eq(c.max_inflight_client, 2);
    ck_assert_int_eq(c.spec_lookup_min, -1);
    ck_assert_int_eq(rlai_config_validate(&c, err, sizeof(err)), 0);

    struct { const char *json; const char *needle; } bad[] = {
        { "{\"modle\":\"x\"}", "modle" },
        { "{\"threads\":\"two\"}", "threads" },
        { "{\"threads\":1.5}", "threads" },
        { "{\"limits\":{\"max_frame\":10}}", "limits.max_frame" },
        { "{\"endpoints\":{\"zmq\":5}}", "endpoints.zmq" },
        { "{\"endpoints\":[]}", "endpoints" },
        { "{\"kv_type\":\"q4\"}", "kv_type" },
        { "{\"spec_lookup_min\":9}", "spec_lookup_min" },
        { "{\"spec_lookup_min\":-2}", "spec_lookup_min" },
        { "[1,2]", "object" },
        { "{\"model\":", "invalid JSON" },
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = 0;
        ck_assert_int_eq(rlai_config_load_json(&c, bad[i].json, err, sizeof(err)), RLAI_ERR_FORMAT);
        ck_assert_msg(strstr(err, bad[i].needle) != NULL, "'%s' -> '%s'", bad[i].json, err);
    }
    rlai_config_free(&c);
}
END_TEST

START_TEST(remote_tcp_needs_opt_in)
{
    rlai_config c;
    char err[256];
    ck_assert_int_eq(rlai_config_defaults(&c, "m.gguf"), 0);
    ck_assert_int_eq(rlai_config_set_str(&c.zmq_tcp, "tcp://0.0.0.0:5677"), 0);
    ck_assert_int_eq(rlai_config_validate(&c, err, sizeof(err)), RLAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(err, "allow_remote"));
    c.allow_remote = true;
    ck_assert_int_eq(rlai_config_validate(&c, err, sizeof(err)), 0);
    /* Every endpoint disabled is refused. */
    rlai_config_set_str(&c.zmq, NULL);
    rlai_config_set_str(&c.zmq_tcp, NULL);
    rlai_config_set_str(&c.pipe, "");
    rlai_config_set_str(&c.http, NULL);
    ck_assert_int_eq(rlai_config_validate(&c, err, sizeof(err)), RLAI_ERR_INVALID_ARG);
    rlai_config_free(&c);
}
END_TEST

START_TEST(http_endpoint)
{
    rlai_config c;
    char err[256];
    ck_assert_int_eq(rlai_config_defaults(&c, "m.gguf"), 0);
    ck_assert_str_eq(c.http, "127.0.0.1:5676");
    ck_assert_str_eq(c.http, RLAI_HTTP_DEFAULT);
    ck_assert_int_eq(rlai_config_load_json(&c, "{\"endpoints\":{\"http\":\"localhost:8080\"}}", err, sizeof(err)), 0);
    ck_assert_str_eq(c.http, "localhost:8080");
    ck_assert_int_eq(rlai_config_validate(&c, err, sizeof(err)), 0);
    ck_assert_int_eq(rlai_config_load_json(&c, "{\"endpoints\":{\"http\":\"[::1]:80\"}}", err, sizeof(err)), 0);
    ck_assert_int_eq(rlai_config_validate(&c, err, sizeof(err)), 0);
    /* "" and null disable it; HTTP alone is a valid set of endpoints. */
    ck_assert_int_eq(rlai_config_load_json(&c, "{\"endpoints\":{\"http\":\"\"}}", err, sizeof(err)), 0);
    ck_assert_ptr_null(c.http);
    ck_assert_int_eq(rlai_config_load_json(&c, "{\"endpoints\":{\"http\":\"127.0.0.1:1\",\"zmq\":null,"
                                               "\"pipe\":null}}", err, sizeof(err)), 0);
    ck_assert_int_eq(rlai_config_validate(&c, err, sizeof(err)), 0);
    ck_assert_int_eq(rlai_config_load_json(&c, "{\"endpoints\":{\"http\":null}}", err, sizeof(err)), 0);
    ck_assert_ptr_null(c.http);
    ck_assert_int_eq(rlai_config_validate(&c, err, sizeof(err)), RLAI_ERR_INVALID_ARG);
    /* Wrong type names the key. */
    ck_assert_int_eq(rlai_config_load_json(&c, "{\"endpoints\":{\"http\":5676}}", err, sizeof(err)), RLAI_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(err, "endpoints.http"));
    /* Malformed addresses. */
    const char *bad[] = { "127.0.0.1", "127.0.0.1:", "127.0.0.1:http", "127.0.0.1:70000", ":5676", "[::1]5676" };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ck_assert_int_eq(rlai_config_set_str(&c.http, bad[i]), 0);
        err[0] = 0;
        ck_assert_int_eq(rlai_config_validate(&c, err, sizeof(err)), RLAI_ERR_INVALID_ARG);
        ck_assert_msg(strstr(err, "ADDR:PORT") != NULL, "'%s' -> '%s'", bad[i], err);
    }
    /* Non-loopback needs allow_remote, like zmq_tcp. */
    ck_assert_int_eq(rlai_config_set_str(&c.http, "0.0.0.0:5676"), 0);
    ck_assert_int_eq(rlai_config_validate(&c, err, sizeof(err)), RLAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(err, "allow_remote"));
    c.allow_remote = true;
    ck_assert_int_eq(rlai_config_validate(&c, err, sizeof(err)), 0);
    rlai_config_free(&c);
}
END_TEST

START_TEST(plugin_deadlines_queue_and_shutdown)
{
    rlai_config c;
    char err[256];
    ck_assert_int_eq(rlai_config_defaults(&c, "m.gguf"), 0);
    ck_assert_int_eq(c.plugin_call_timeout_s, 60);
    ck_assert_int_eq(c.shutdown_timeout_s, 5);
    ck_assert_int_eq(c.plugin_max_queue, 0);
    ck_assert_int_eq(rlai_config_load_json(&c, "{\"shutdown_timeout_s\":2,\"plugins\":{\"call_timeout_s\":0,"
                                               "\"max_queue\":3}}", err, sizeof(err)), 0);
    ck_assert_int_eq(c.shutdown_timeout_s, 2);
    ck_assert_int_eq(c.plugin_call_timeout_s, 0);
    ck_assert_int_eq(c.plugin_max_queue, 3);
    static const char *bad[] = { "{\"shutdown_timeout_s\":0}", "{\"shutdown_timeout_s\":\"5\"}",
                                 "{\"plugins\":{\"call_timeout_s\":-1}}", "{\"plugins\":{\"max_queue\":0}}" };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        ck_assert_int_eq(rlai_config_load_json(&c, bad[i], err, sizeof(err)), RLAI_ERR_FORMAT);
    rlai_config_free(&c);
}
END_TEST

START_TEST(request_timeout)
{
    rlai_config c;
    char err[256];
    ck_assert_int_eq(rlai_config_defaults(&c, "m.gguf"), 0);
    ck_assert_int_eq(c.request_timeout_s, 0);   /* off by default */
    ck_assert_int_eq(rlai_config_load_json(&c, "{\"limits\":{\"request_timeout_s\":30}}", err, sizeof(err)), 0);
    ck_assert_int_eq(c.request_timeout_s, 30);
    ck_assert_int_eq(rlai_config_load_json(&c, "{\"limits\":{\"request_timeout_s\":-1}}", err, sizeof(err)),
                     RLAI_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(err, "request_timeout_s"));
    rlai_config_free(&c);
    /* The smaller non-zero of request and cap applies. */
    ck_assert_uint_eq(rlai_config_timeout_ms(0, 0), 0);
    ck_assert_uint_eq(rlai_config_timeout_ms(250, 0), 250);
    ck_assert_uint_eq(rlai_config_timeout_ms(0, 2), 2000);
    ck_assert_uint_eq(rlai_config_timeout_ms(250, 2), 250);
    ck_assert_uint_eq(rlai_config_timeout_ms(5000, 2), 2000);
}
END_TEST

START_TEST(auth_keys)
{
    rlai_config c;
    char err[256];
    ck_assert_int_eq(rlai_config_defaults(&c, "m.gguf"), 0);
    ck_assert(!c.auth_off); /* on by default */
    ck_assert_ptr_null(c.api_key);
    ck_assert_int_eq(rlai_config_load_json(&c, "{\"auth\":{\"enabled\":false,\"api_key\":\"k1\","
                                               "\"api_key_file\":\"/x/key\"}}", err, sizeof(err)), 0);
    ck_assert(c.auth_off);
    ck_assert_str_eq(c.api_key, "k1");
    ck_assert_str_eq(c.api_key_file, "/x/key");
    const char *bad[][2] = { { "{\"auth\":{\"enabled\":1}}", "auth.enabled" },
                             { "{\"auth\":{\"key\":\"x\"}}", "auth.key" },
                             { "{\"auth\":{\"api_key\":5}}", "auth.api_key" },
                             { "{\"auth\":5}", "auth" } };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ck_assert_int_eq(rlai_config_load_json(&c, bad[i][0], err, sizeof(err)), RLAI_ERR_FORMAT);
        ck_assert_msg(strstr(err, bad[i][1]), "%s: %s", bad[i][0], err);
    }
    rlai_config_free(&c);
}
END_TEST

/* host/api_key.c: the file is created 0600 and reused; insecure ones refused. */
START_TEST(api_key_file)
{
    char dir[] = "/tmp/rlai-key-test-XXXXXX", path[128], err[512];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/sub/api_key", dir);
    unsetenv("RLAI_API_KEY");
    rlai_api_key k1, k2;
    ck_assert_int_eq(rlai_api_key_resolve(NULL, path, &k1, err, sizeof(err)), 0);
    ck_assert(k1.created && k1.from_file);
    ck_assert_str_eq(k1.source, path);
    ck_assert_uint_eq(strlen(k1.key), 64);
    struct stat st;
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert_uint_eq(st.st_mode & 07777, 0600);
    ck_assert_int_eq(rlai_api_key_resolve(NULL, path, &k2, err, sizeof(err)), 0);
    ck_assert(!k2.created);
    ck_assert_str_eq(k1.key, k2.key);
    ck_assert(rlai_api_key_equal(k1.key, 64, k2.key));
    ck_assert(!rlai_api_key_equal(k1.key, 63, k2.key));
    ck_assert(!rlai_api_key_equal("", 0, k2.key));
    char other[65];
    memcpy(other, k1.key, 65);
    other[10] ^= 1;
    ck_assert(!rlai_api_key_equal(other, 64, k1.key));
    /* config, then env, come before the file */
    ck_assert_int_eq(rlai_api_key_resolve("cfgkey", path, &k2, err, sizeof(err)), 0);
    ck_assert_str_eq(k2.key, "cfgkey");
    setenv("RLAI_API_KEY", "envkey", 1);
    ck_assert_int_eq(rlai_api_key_resolve(NULL, path, &k2, err, sizeof(err)), 0);
    ck_assert_str_eq(k2.key, "envkey");
    unsetenv("RLAI_API_KEY");
    /* group-readable: refused */
    ck_assert_int_eq(chmod(path, 0640), 0);
    ck_assert_int_eq(rlai_api_key_resolve(NULL, path, &k2, err, sizeof(err)), RLAI_ERR_IO);
    ck_assert_msg(strstr(err, path) && strstr(err, "0640"), "%s", err);
    ck_assert_int_eq(chmod(path, 0600), 0);
    /* a symlink to it: refused */
    char link[160];
    snprintf(link, sizeof(link), "%s/link", dir);
    ck_assert_int_eq(symlink(path, link), 0);
    ck_assert_int_eq(rlai_api_key_resolve(NULL, link, &k2, err, sizeof(err)), RLAI_ERR_IO);
    ck_assert_msg(strstr(err, "symbolic link"), "%s", err);
    char cmd[200];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

START_TEST(http_section)
{
    rlai_config c;
    char err[256];
    ck_assert_int_eq(rlai_config_defaults(&c, "m.gguf"), 0);
    ck_assert_int_eq(c.n_cors_origins, 0);
    ck_assert_int_eq(c.http_max_connections, 256);
    ck_assert_int_eq(c.http_max_connections_per_ip, 0);   /* auto */
    ck_assert_int_eq(c.http_header_timeout_s, 10);
    const char *good = "{\"http\":{\"cors_origins\":[\"https://app.example:8443\",\"http://localhost:3000/\"],"
                       "\"max_connections\":100,\"max_connections_per_ip\":10}}";
    ck_assert_int_eq(rlai_config_load_json(&c, good, err, sizeof(err)), 0);
    ck_assert_int_eq(c.n_cors_origins, 2);
    ck_assert_str_eq(c.cors_origins[0], "https://app.example:8443");
    ck_assert_int_eq(c.http_max_connections, 100);
    ck_assert_int_eq(c.http_max_connections_per_ip, 10);
    ck_assert_int_eq(rlai_config_validate(&c, err, sizeof(err)), 0);
    /* A second list replaces the first. */
    ck_assert_int_eq(rlai_config_load_json(&c, "{\"http\":{\"cors_origins\":[\"http://a.example\"]}}", err,
                                           sizeof(err)), 0);
    ck_assert_int_eq(c.n_cors_origins, 1);
    /* Origins that are not scheme://host[:port] are refused at validation. */
    const char *bad_origins[] = { "*", "app.example", "https://app.example/path", "ftp://x", "http://", "null" };
    for (size_t i = 0; i < sizeof(bad_origins) / sizeof(bad_origins[0]); i++) {
        rlai_config_clear_cors_origins(&c);
        ck_assert_int_eq(rlai_config_add_cors_origin(&c, bad_origins[i]), 0);
        ck_assert_int_eq(rlai_config_validate(&c, err, sizeof(err)), RLAI_ERR_INVALID_ARG);
        ck_assert_ptr_nonnull(strstr(err, "CORS origin"));
    }
    rlai_config_clear_cors_origins(&c);
    struct { const char *json; const char *needle; } bad[] = {
        { "{\"http\":{\"cors_origins\":\"https://a.example\"}}", "http.cors_origins" },
        { "{\"http\":{\"cors_origins\":[5]}}", "http.cors_origins" },
        { "{\"http\":{\"max_connections\":0}}", "http.max_connections" },
        { "{\"http\":{\"max_connections_per_ip\":\"5\"}}", "http.max_connections_per_ip" },
        { "{\"http\":{\"api\":1}}", "http.api" },
        { "{\"http\":[]}", "http" },
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = 0;
        ck_assert_int_eq(rlai_config_load_json(&c, bad[i].json, err, sizeof(err)), RLAI_ERR_FORMAT);
        ck_assert_msg(strstr(err, bad[i].needle) != NULL, "%s: %s", bad[i].json, err);
    }
    rlai_config_free(&c);
}
END_TEST

START_TEST(file_loading)
{
    rlai_config c;
    char err[256];
    ck_assert_int_eq(rlai_config_defaults(&c, "m.gguf"), 0);
    ck_assert_int_eq(rlai_config_load_file(&c, "/nonexistent/rlai.json", err, sizeof(err)), RLAI_ERR_IO);
    char path[] = "/tmp/rlai-config-XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    FILE *f = fdopen(fd, "w");
    fputs("{ \"threads\": 1, \"limits\": { \"max_inflight_total\": 5 } }", f);
    fclose(f);
    ck_assert_int_eq(rlai_config_load_file(&c, path, err, sizeof(err)), 0);
    ck_assert_int_eq(c.threads, 1);
    ck_assert_int_eq(c.max_inflight_total, 5);
    unlink(path);
    rlai_config_free(&c);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("config");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, defaults_are_private_and_limited);
    tcase_add_test(tc, json_overrides_and_errors);
    tcase_add_test(tc, remote_tcp_needs_opt_in);
    tcase_add_test(tc, http_endpoint);
    tcase_add_test(tc, file_loading);
    tcase_add_test(tc, plugin_deadlines_queue_and_shutdown);
    tcase_add_test(tc, request_timeout);
    tcase_add_test(tc, auth_keys);
    tcase_add_test(tc, api_key_file);
    tcase_add_test(tc, http_section);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
