/* test_upstream.c - remote upstreams (host/upstream.c, host/config.c):
 * the "upstreams"/"routing" config keys and their refusals, the API key
 * file's permission check, the circuit breaker's states, the body sent
 * upstream (and what a remote model refuses), stream chunk decoding. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cjson/cJSON.h>

#include "config.h"
#include "logprobs.h"
#include "remote.h"
#include "router.h"
#include "tools.h"
#include "upstream.h"
#include "rlai/error.h"

START_TEST(config_reads_upstreams_and_routing)
{
    rlai_config c;
    char err[256] = "";
    ck_assert_int_eq(rlai_config_defaults(&c, "m.gguf"), 0);
    const char *j = "{\"upstreams\":[{\"name\":\"c1\",\"base_url\":\"http://127.0.0.1:9/v1\","
                    "\"api_key_env\":\"K\",\"models\":{\"big\":\"org/Big-70B\"},\"spill_model\":\"small\","
                    "\"max_concurrency\":3,\"max_retries\":1,\"breaker_failures\":2,\"sampling_extras\":false}],"
                    "\"routing\":{\"spill_queued\":4,\"spill_long_prompts\":false,\"affinity\":false}}";
    ck_assert_msg(rlai_config_load_json(&c, j, err, sizeof(err)) == 0, "%s", err);
    ck_assert_int_eq(c.n_upstreams, 1);
    ck_assert_str_eq(c.upstreams[0].name, "c1");
    ck_assert_str_eq(c.upstreams[0].models[0].name, "big");
    ck_assert_str_eq(c.upstreams[0].models[0].remote, "org/Big-70B");
    ck_assert_str_eq(c.upstreams[0].spill_model, "small");
    ck_assert_int_eq(c.upstreams[0].max_concurrency, 3);
    ck_assert_int_eq(c.upstreams[0].max_retries, 1);
    ck_assert_int_eq(c.upstreams[0].first_token_timeout_ms, 60000);   /* default kept */
    ck_assert(!c.upstreams[0].sampling_extras);
    ck_assert_int_eq(c.route_spill_queued, 4);
    ck_assert(c.route_no_spill_long);
    ck_assert(c.route_no_affinity);
    ck_assert_ptr_null(c.upstreams[0].ca_file);
    rlai_config_free(&c);

    /* an https upstream with its own CA */
    ck_assert_int_eq(rlai_config_defaults(&c, "m.gguf"), 0);
    const char *tls = "{\"upstreams\":[{\"name\":\"t\",\"base_url\":\"https://10.0.0.2:8000/v1\","
                      "\"ca_file\":\"/etc/cluster/ca.pem\",\"models\":{\"a\":\"b\"}}]}";
    ck_assert_msg(rlai_config_load_json(&c, tls, err, sizeof(err)) == 0, "%s", err);
    ck_assert_str_eq(c.upstreams[0].ca_file, "/etc/cluster/ca.pem");
    rlai_upstream_config cp;
    ck_assert_int_eq(rlai_upstream_config_copy(&cp, &c.upstreams[0]), 0);
    ck_assert_str_eq(cp.ca_file, "/etc/cluster/ca.pem");
    ck_assert_ptr_ne(cp.ca_file, c.upstreams[0].ca_file);
    rlai_upstream_config_clear(&cp);
    /* a ca_file that cannot be read stops the start with its name */
    free(c.upstreams[0].ca_file);
    c.upstreams[0].ca_file = strdup("/nonexistent/rlai-ca.pem");
    rlai_remote *rm = NULL;
    ck_assert_int_eq(rlai_remote_new(c.upstreams, 1, &rm, err, sizeof(err)), RLAI_ERR_IO);
    ck_assert_ptr_null(rm);
    ck_assert_msg(strstr(err, "upstreams.t.ca_file: cannot read /nonexistent/rlai-ca.pem"), "%s", err);
    rlai_config_free(&c);

    const char *bad[][2] = {
        { "{\"upstreams\":{}}", "list" },
        { "{\"upstreams\":[{\"name\":\"x\",\"base_url\":\"ftp://h/v1\",\"models\":{\"a\":\"b\"}}]}", "base_url" },
        { "{\"upstreams\":[{\"name\":\"x y\",\"base_url\":\"http://h/v1\",\"models\":{\"a\":\"b\"}}]}", "name" },
        { "{\"upstreams\":[{\"name\":\"x\",\"base_url\":\"http://h/v1\"}]}", "models" },
        { "{\"upstreams\":[{\"name\":\"x\",\"base_url\":\"http://h/v1\",\"models\":{\"a\":\"b\"},\"colour\":1}]}",
          "upstreams[0].colour" },
        { "{\"upstreams\":[{\"name\":\"x\",\"base_url\":\"http://h/v1\",\"models\":{\"a\":\"b\"},"
          "\"api_key_env\":\"A\",\"api_key_file\":\"/f\"}]}", "not both" },
        { "{\"upstreams\":[{\"name\":\"x\",\"base_url\":\"http://h/v1\",\"models\":{\"a\":\"b\"}},"
          "{\"name\":\"x\",\"base_url\":\"http://h/v1\",\"models\":{\"a\":\"b\"}}]}", "twice" },
        { "{\"upstreams\":[{\"name\":\"x\",\"base_url\":\"http://h/v1\",\"models\":{\"a\":\"b\"},"
          "\"max_concurrency\":0}]}", "max_concurrency" },
        { "{\"routing\":{\"spill\":1}}", "routing.spill" },
        { "{\"upstreams\":[{\"name\":\"x\",\"base_url\":\"http://h/v1\",\"models\":{\"a\":\"b\"},"
          "\"ca_file\":\"/ca.pem\"}]}", "https" },
        { "{\"upstreams\":[{\"name\":\"remote\",\"base_url\":\"http://h/v1\",\"models\":{\"a\":\"b\"}}]}",
          "reserved" },
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ck_assert_int_eq(rlai_config_defaults(&c, "m.gguf"), 0);
        err[0] = 0;
        ck_assert_int_eq(rlai_config_load_json(&c, bad[i][0], err, sizeof(err)), RLAI_ERR_FORMAT);
        ck_assert_msg(strstr(err, bad[i][1]) != NULL, "case %zu: '%s' lacks '%s'", i, err, bad[i][1]);
        rlai_config_free(&c);
    }
}
END_TEST

START_TEST(key_file_must_be_private)
{
    char path[] = "/tmp/rlai-upkey-XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, "  sk-secret\n", 12), 12);
    close(fd);
    rlai_upstream_config u;
    rlai_upstream_config_init(&u);
    u.name = strdup("c");
    u.api_key_file = strdup(path);
    char *key = NULL;
    char err[256] = "";
    ck_assert_int_eq(chmod(path, 0600), 0);
    ck_assert_int_eq(rlai_upstream_read_key(&u, &key, err, sizeof(err)), 0);
    ck_assert_str_eq(key, "sk-secret");
    free(key);
    ck_assert_int_eq(chmod(path, 0644), 0);
    ck_assert_int_eq(rlai_upstream_read_key(&u, &key, err, sizeof(err)), RLAI_ERR_INVALID_ARG);
    ck_assert_ptr_null(key);
    ck_assert_ptr_nonnull(strstr(err, "0644"));
    unlink(path);
    free(u.api_key_file);
    u.api_key_file = NULL;
    u.api_key_env = strdup("RLAI_TEST_UPSTREAM_KEY_UNSET");
    unsetenv("RLAI_TEST_UPSTREAM_KEY_UNSET");
    ck_assert_int_eq(rlai_upstream_read_key(&u, &key, err, sizeof(err)), RLAI_ERR_NOT_FOUND);
    setenv("RLAI_TEST_UPSTREAM_KEY_UNSET", "k2", 1);
    ck_assert_int_eq(rlai_upstream_read_key(&u, &key, err, sizeof(err)), 0);
    ck_assert_str_eq(key, "k2");
    free(key);
    rlai_upstream_config_clear(&u);
}
END_TEST

START_TEST(breaker_opens_half_opens_and_closes)
{
    rlai_breaker b;
    rlai_breaker_init(&b, 3, 1000);
    ck_assert(rlai_breaker_allow(&b, 0));
    rlai_breaker_failure(&b, 10);
    rlai_breaker_failure(&b, 20);
    ck_assert_int_eq(b.state, RLAI_BREAKER_CLOSED);
    rlai_breaker_failure(&b, 30);
    ck_assert_int_eq(b.state, RLAI_BREAKER_OPEN);
    ck_assert(!rlai_breaker_allow(&b, 500));
    ck_assert(!rlai_breaker_would_allow(&b, 1029));
    ck_assert(rlai_breaker_would_allow(&b, 1030));
    ck_assert(rlai_breaker_allow(&b, 1030));          /* the one trial */
    ck_assert_int_eq(b.state, RLAI_BREAKER_HALF_OPEN);
    ck_assert(!rlai_breaker_allow(&b, 1031));         /* not a second one */
    rlai_breaker_failure(&b, 1100);                   /* trial failed: open again */
    ck_assert_int_eq(b.state, RLAI_BREAKER_OPEN);
    ck_assert(!rlai_breaker_allow(&b, 2000));
    ck_assert(rlai_breaker_allow(&b, 2100));
    rlai_breaker_success(&b);
    ck_assert_int_eq(b.state, RLAI_BREAKER_CLOSED);
    ck_assert_int_eq(b.fails, 0);
    ck_assert_uint_eq(b.opens_total, 2);
    ck_assert_str_eq(rlai_breaker_state_name(RLAI_BREAKER_HALF_OPEN), "half_open");
}
END_TEST

START_TEST(body_maps_the_request_and_refuses_what_it_cannot_honour)
{
    rlai_chat_message msgs[2] = { { "system", "You are terse." }, { "user", "Hi" } };
    const char *stops[] = { "\n\n", NULL };
    rlai_route_request rq;
    memset(&rq, 0, sizeof(rq));
    rq.text.messages = msgs;
    rq.text.n_messages = 2;
    rlai_gen_params_init(&rq.text.rp.gen);
    rq.text.rp.gen.max_tokens = 7;
    rq.text.rp.gen.stop = stops;
    rq.text.rp.gen.sampling.top_k = 40;
    rq.text.rp.gen.sampling.seed = 42;
    char *body = NULL;
    bool chat = false;
    char err[256] = "";
    ck_assert_int_eq(rlai_upstream_build_body(&rq, "org/M", true, &body, &chat, err, sizeof(err)), 0);
    ck_assert(chat);
    cJSON *j = cJSON_Parse(body);
    ck_assert_ptr_nonnull(j);
    ck_assert_str_eq(cJSON_GetObjectItem(j, "model")->valuestring, "org/M");
    ck_assert(cJSON_IsTrue(cJSON_GetObjectItem(j, "stream")));
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(j, "messages")), 2);
    ck_assert_str_eq(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "messages"), 0)->child->valuestring, "system");
    ck_assert_int_eq((int)cJSON_GetObjectItem(j, "max_tokens")->valuedouble, 7);
    ck_assert_int_eq((int)cJSON_GetObjectItem(j, "temperature")->valuedouble, 0);
    ck_assert_int_eq((int)cJSON_GetObjectItem(j, "top_k")->valuedouble, 40);
    ck_assert_int_eq((int)cJSON_GetObjectItem(j, "seed")->valuedouble, 42);
    cJSON_Delete(j);
    free(body);
    /* a large seed stays an exact integer literal (no exponent), 63 bits */
    rq.text.rp.gen.sampling.seed = UINT64_C(0xFEDCBA9876543210);
    ck_assert_int_eq(rlai_upstream_build_body(&rq, "org/M", true, &body, &chat, err, sizeof(err)), 0);
    ck_assert_ptr_nonnull(strstr(body, "\"seed\":9141386507638288912"));
    j = cJSON_Parse(body);
    ck_assert_str_eq(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "stop"), 0)->valuestring, "\n\n");
    cJSON_Delete(j);
    free(body);
    /* neutral knobs are sent too (an upstream's defaults must not apply) */
    rq.text.rp.gen.sampling.top_k = 0;
    ck_assert_int_eq(rlai_upstream_build_body(&rq, "org/M", true, &body, &chat, err, sizeof(err)), 0);
    ck_assert_ptr_nonnull(strstr(body, "\"top_k\":0"));
    ck_assert_ptr_nonnull(strstr(body, "\"min_p\":0"));
    ck_assert_ptr_nonnull(strstr(body, "\"top_p\":1"));
    ck_assert_ptr_null(strstr(body, "repetition_penalty"));
    ck_assert_ptr_null(strstr(body, "ignore_eos"));
    free(body);
    /* without extras: no top_k */
    ck_assert_int_eq(rlai_upstream_build_body(&rq, "org/M", false, &body, &chat, err, sizeof(err)), 0);
    ck_assert_ptr_null(strstr(body, "top_k"));
    free(body);
    /* logit_bias as OpenAI's map of token id strings; a token's last entry counts */
    const rlai_logit_bias lb[3] = { { 7761, -100.0f }, { 12, 2.5f }, { 7761, 1.0f } };
    rq.text.rp.gen.logit_bias = lb;
    rq.text.rp.gen.n_logit_bias = 3;
    ck_assert_int_eq(rlai_upstream_build_body(&rq, "org/M", false, &body, &chat, err, sizeof(err)), 0);
    j = cJSON_Parse(body);
    const cJSON *jb = cJSON_GetObjectItem(j, "logit_bias");
    ck_assert_int_eq(cJSON_GetArraySize(jb), 2);
    ck_assert(cJSON_GetObjectItem(jb, "7761")->valuedouble == 1.0);
    ck_assert(cJSON_GetObjectItem(jb, "12")->valuedouble == 2.5);
    cJSON_Delete(j);
    free(body);
    rq.text.rp.gen.logit_bias = NULL;
    rq.text.rp.gen.n_logit_bias = 0;
    ck_assert_int_eq(rlai_upstream_build_body(&rq, "org/M", false, &body, &chat, err, sizeof(err)), 0);
    ck_assert_ptr_null(strstr(body, "logit_bias"));
    free(body);
    /* a prediction as OpenAI's {"type": "content", "content": text} (chat) */
    rq.text.rp.gen.prediction = "int count = 0;\n";
    ck_assert_int_eq(rlai_upstream_build_body(&rq, "org/M", false, &body, &chat, err, sizeof(err)), 0);
    j = cJSON_Parse(body);
    const cJSON *jp = cJSON_GetObjectItem(j, "prediction");
    ck_assert_str_eq(cJSON_GetObjectItem(jp, "type")->valuestring, "content");
    ck_assert_str_eq(cJSON_GetObjectItem(jp, "content")->valuestring, "int count = 0;\n");
    cJSON_Delete(j);
    free(body);
    rq.text.rp.gen.prediction = "";
    ck_assert_int_eq(rlai_upstream_build_body(&rq, "org/M", false, &body, &chat, err, sizeof(err)), 0);
    ck_assert_ptr_null(strstr(body, "prediction"));
    free(body);
    rq.text.rp.gen.prediction = NULL;
    /* ignore_eos is forwarded with extras, refused without (a strict OpenAI endpoint) */
    rq.text.rp.gen.ignore_eos = true;
    ck_assert_int_eq(rlai_upstream_build_body(&rq, "org/M", true, &body, &chat, err, sizeof(err)), 0);
    ck_assert_ptr_nonnull(strstr(body, "\"ignore_eos\":true"));
    free(body);
    ck_assert_int_eq(rlai_upstream_build_body(&rq, "org/M", false, &body, &chat, err, sizeof(err)),
                     RLAI_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(err, "sampling_extras"));
    ck_assert_ptr_null(body);
    rq.text.rp.gen.ignore_eos = false;
    /* a prompt goes to completions */
    rq.text.messages = NULL;
    rq.text.n_messages = 0;
    rq.text.prompt = "Once";
    rq.response_format = "{\"type\":\"json_object\"}";
    ck_assert_int_eq(rlai_upstream_build_body(&rq, "m", true, &body, &chat, err, sizeof(err)), 0);
    ck_assert(!chat);
    ck_assert_ptr_nonnull(strstr(body, "\"prompt\":\"Once\""));
    ck_assert_ptr_nonnull(strstr(body, "\"response_format\":{\"type\":\"json_object\"}"));
    free(body);
    /* refusals */
    rq.response_format = "[1]";
    ck_assert_int_eq(rlai_upstream_build_body(&rq, "m", true, &body, &chat, err, sizeof(err)), RLAI_ERR_INVALID_ARG);
    rq.response_format = NULL;
    rq.text.rp.gen.grammar = (const rlai_grammar *)(uintptr_t)1;   /* never dereferenced */
    ck_assert_int_eq(rlai_upstream_build_body(&rq, "m", true, &body, &chat, err, sizeof(err)), RLAI_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(err, "not implemented"));
    rq.text.rp.gen.grammar = NULL;
    rq.text.rp.gen.top_logprobs = 2;
    rq.text.rp.gen.on_logprobs = (rlai_logprobs_cb)(uintptr_t)1;
    ck_assert_int_eq(rlai_upstream_build_body(&rq, "m", true, &body, &chat, err, sizeof(err)), RLAI_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(err, "logprobs"));
    ck_assert_ptr_null(body);
    /* a front that takes a remote model's logprobs (HTTP) gets them asked for */
    rq.on_remote_logprobs = (void (*)(void *, cJSON *))(uintptr_t)1;
    rq.text.rp.gen.prompt_logprobs = true;   /* echo with logprobs: the prompt's are local-only */
    ck_assert_int_eq(rlai_upstream_build_body(&rq, "m", true, &body, &chat, err, sizeof(err)),
                     RLAI_ERR_NOT_IMPLEMENTED);
    ck_assert_ptr_nonnull(strstr(err, "echo"));
    ck_assert_ptr_null(body);
    rq.text.rp.gen.prompt_logprobs = false;
    ck_assert_int_eq(rlai_upstream_build_body(&rq, "m", true, &body, &chat, err, sizeof(err)), 0);
    ck_assert_ptr_nonnull(strstr(body, "\"logprobs\":2"));              /* completions: alternatives */
    free(body);
    rq.text.prompt = NULL;
    rq.text.messages = msgs;
    rq.text.n_messages = 2;
    ck_assert_int_eq(rlai_upstream_build_body(&rq, "m", true, &body, &chat, err, sizeof(err)), 0);
    ck_assert_ptr_nonnull(strstr(body, "\"logprobs\":true,\"top_logprobs\":2"));
    free(body);
}
END_TEST

START_TEST(chunks_decode)
{
    rlai_upstream_delta d;
    char msg[256];
    const char *c1 = "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"},\"finish_reason\":null}]}";
    ck_assert_int_eq(rlai_upstream_parse_chunk(c1, strlen(c1), &d, msg, sizeof(msg)), 0);
    ck_assert_str_eq(d.text, "Hel");
    ck_assert_uint_eq(d.len, 3);
    ck_assert_int_eq(d.finish, RLAI_STOP_NONE);
    free(d.text);
    const char *c2 = "{\"choices\":[{\"index\":0,\"text\":\"lo\",\"finish_reason\":\"length\"}]}";
    ck_assert_int_eq(rlai_upstream_parse_chunk(c2, strlen(c2), &d, msg, sizeof(msg)), 0);
    ck_assert_str_eq(d.text, "lo");
    ck_assert_int_eq(d.finish, RLAI_STOP_MAX_TOKENS);
    free(d.text);
    const char *c3 = "{\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":5}}";
    ck_assert_int_eq(rlai_upstream_parse_chunk(c3, strlen(c3), &d, msg, sizeof(msg)), 0);
    ck_assert_ptr_null(d.text);
    ck_assert_int_eq(d.prompt_tokens, 12);
    ck_assert_int_eq(d.completion_tokens, 5);
    ck_assert_int_eq(d.accepted_prediction, -1);
    ck_assert_int_eq(d.rejected_prediction, -1);
    const char *c3p = "{\"usage\":{\"completion_tokens\":9,\"completion_tokens_details\":"
                      "{\"accepted_prediction_tokens\":6,\"rejected_prediction_tokens\":2}}}";
    ck_assert_int_eq(rlai_upstream_parse_chunk(c3p, strlen(c3p), &d, msg, sizeof(msg)), 0);
    ck_assert_int_eq(d.accepted_prediction, 6);
    ck_assert_int_eq(d.rejected_prediction, 2);
    const char *c4 = "{\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\",\"stop_reason\":\"\\n\"}]}";
    ck_assert_int_eq(rlai_upstream_parse_chunk(c4, strlen(c4), &d, msg, sizeof(msg)), 0);
    ck_assert_int_eq(d.finish, RLAI_STOP_STRING);
    ck_assert_int_eq(rlai_upstream_parse_chunk(" [DONE]", 7, &d, msg, sizeof(msg)), 1);
    ck_assert_int_eq(rlai_upstream_parse_chunk("{\"choi", 6, &d, msg, sizeof(msg)), RLAI_ERR_FORMAT);
    ck_assert_int_eq(rlai_upstream_parse_chunk("{\"x\":1}", 7, &d, msg, sizeof(msg)), RLAI_ERR_FORMAT);
    const char *c5 = "{\"choices\":[{\"delta\":{\"content\":7}}]}";
    ck_assert_int_eq(rlai_upstream_parse_chunk(c5, strlen(c5), &d, msg, sizeof(msg)), RLAI_ERR_FORMAT);
    const char *c6 = "{\"error\":{\"message\":\"overloaded\"}}";
    ck_assert_int_eq(rlai_upstream_parse_chunk(c6, strlen(c6), &d, msg, sizeof(msg)), RLAI_ERR_DISCONNECTED);
    ck_assert_ptr_nonnull(strstr(msg, "overloaded"));
}
END_TEST

/* Each of the n chunks is a format error that decodes nothing and whose
 * message names `what`. */
static void refused_chunks(const char *const *bad, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++) {
        rlai_upstream_delta d;
        char msg[256] = "";
        ck_assert_int_eq(rlai_upstream_parse_chunk(bad[i], strlen(bad[i]), &d, msg, sizeof(msg)), RLAI_ERR_FORMAT);
        ck_assert_ptr_null(d.text);
        ck_assert_ptr_null(d.logprobs);
        ck_assert_ptr_null(d.tool_calls);
        ck_assert_msg(strstr(msg, what) != NULL, "chunk %zu: '%s' lacks '%s'", i, msg, what);
    }
}

/* The three entries' tokens, logprobs and first alternatives. */
static void check_entries(const cJSON *a, const char *t0, double l0, const char *alt0)
{
    ck_assert(cJSON_IsArray(a));
    const cJSON *e = cJSON_GetArrayItem(a, 0);
    ck_assert_str_eq(cJSON_GetObjectItem(e, "token")->valuestring, t0);
    ck_assert_double_eq_tol(cJSON_GetObjectItem(e, "logprob")->valuedouble, l0, 1e-12);
    const cJSON *b = cJSON_GetObjectItem(e, "bytes");
    ck_assert_int_eq(cJSON_GetArraySize(b), (int)strlen(t0));
    for (int i = 0; i < (int)strlen(t0); i++)
        ck_assert_int_eq((int)cJSON_GetArrayItem(b, i)->valuedouble, (unsigned char)t0[i]);
    const cJSON *top = cJSON_GetObjectItem(e, "top_logprobs");
    ck_assert_str_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(top, 0), "token")->valuestring, alt0);
}

START_TEST(chunk_logprobs_decode_to_chat_entries)
{
    rlai_upstream_delta d;
    char msg[256];
    /* chat: entries kept (bytes given or made from the token) */
    const char *c1 = "{\"choices\":[{\"delta\":{\"content\":\" Mars\"},\"logprobs\":{\"content\":["
                     "{\"token\":\" Mars\",\"logprob\":-0.25,\"bytes\":[32,77,97,114,115],\"top_logprobs\":["
                     "{\"token\":\" Mars\",\"logprob\":-0.25},{\"token\":\" Venus\",\"logprob\":-1.5}]}]}}]}";
    ck_assert_int_eq(rlai_upstream_parse_chunk(c1, strlen(c1), &d, msg, sizeof(msg)), 0);
    ck_assert_str_eq(d.text, " Mars");
    check_entries(d.logprobs, " Mars", -0.25, " Mars");
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(cJSON_GetArrayItem(d.logprobs, 0), "top_logprobs")), 2);
    free(d.text);
    cJSON_Delete(d.logprobs);
    /* legacy completions: arrays turned into entries; null = -9999 */
    const char *c2 = "{\"choices\":[{\"text\":\" Paris.\",\"logprobs\":{\"tokens\":[\" Paris\",\".\"],"
                     "\"token_logprobs\":[-0.5,null],\"top_logprobs\":[{\" Lyon\":-2.0},null],\"text_offset\":[0,6]}}]}";
    ck_assert_int_eq(rlai_upstream_parse_chunk(c2, strlen(c2), &d, msg, sizeof(msg)), 0);
    check_entries(d.logprobs, " Paris", -0.5, " Lyon");
    const cJSON *e1 = cJSON_GetArrayItem(d.logprobs, 1);
    ck_assert_double_eq(cJSON_GetObjectItem(e1, "logprob")->valuedouble, -9999.0);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(e1, "top_logprobs")), 0);
    /* and back to the legacy arrays, offsets continuing from 3 */
    size_t off = 3;
    cJSON *leg = rlai_logprobs_completion_from_entries(d.logprobs, &off);
    ck_assert_int_eq(off, 3 + 7);
    char *txt = cJSON_PrintUnformatted(leg);
    ck_assert_str_eq(txt, "{\"tokens\":[\" Paris\",\".\"],\"token_logprobs\":[-0.5,-9999],"
                          "\"top_logprobs\":[{\" Lyon\":-2},{}],\"text_offset\":[3,9]}");
    free(txt);
    cJSON_Delete(leg);
    free(d.text);
    cJSON_Delete(d.logprobs);
    /* none, null, and malformed ones */
    const char *c3 = "{\"choices\":[{\"delta\":{\"content\":\"x\"},\"logprobs\":null}]}";
    ck_assert_int_eq(rlai_upstream_parse_chunk(c3, strlen(c3), &d, msg, sizeof(msg)), 0);
    ck_assert_ptr_null(d.logprobs);
    free(d.text);
    const char *bad[] = {
        "{\"choices\":[{\"delta\":{\"content\":\"x\"},\"logprobs\":{\"content\":[{\"token\":1,\"logprob\":0}]}}]}",
        "{\"choices\":[{\"delta\":{\"content\":\"x\"},\"logprobs\":{\"content\":[{\"token\":\"x\",\"logprob\":\"-1\"}]}}]}",
        "{\"choices\":[{\"text\":\"x\",\"logprobs\":{\"tokens\":[\"x\"],\"token_logprobs\":[]}}]}",
        "{\"choices\":[{\"text\":\"x\",\"logprobs\":{\"other\":1}}]}",
    };
    refused_chunks(bad, sizeof(bad) / sizeof(bad[0]), "logprobs");
}
END_TEST

START_TEST(tool_calls_pass_through)
{
    /* the body: messages and forwarded members as they are */
    rlai_chat_message msgs[1] = { { "user", "converted text" } };
    rlai_route_request rq;
    memset(&rq, 0, sizeof(rq));
    rq.text.messages = msgs;
    rq.text.n_messages = 1;
    rlai_gen_params_init(&rq.text.rp.gen);
    rq.messages_json = "[{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"21\"}]";
    rq.forward_json = "{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"tool_choice\":\"auto\"}";
    char *body = NULL;
    bool chat = false;
    char err[256] = "";
    ck_assert_int_eq(rlai_upstream_build_body(&rq, "m", true, &body, &chat, err, sizeof(err)), 0);
    cJSON *j = cJSON_Parse(body);
    ck_assert_str_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "messages"), 0), "tool_call_id")
                         ->valuestring, "c1");
    ck_assert_ptr_null(strstr(body, "converted text"));
    ck_assert_str_eq(cJSON_GetObjectItem(j, "tool_choice")->valuestring, "auto");
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(j, "tools")), 1);
    cJSON_Delete(j);
    free(body);
    rq.forward_json = "[1]";
    ck_assert_int_eq(rlai_upstream_build_body(&rq, "m", true, &body, &chat, err, sizeof(err)), RLAI_ERR_INVALID_ARG);
    ck_assert_ptr_null(body);

    /* a plugin's image URL joins the last user turn as [text, image_url] */
    rlai_chat_message turns[3] = { { "system", "S" }, { "user", "look" }, { "assistant", "ok" } };
    memset(&rq, 0, sizeof(rq));
    rq.text.messages = turns;
    rq.text.n_messages = 3;
    rlai_gen_params_init(&rq.text.rp.gen);
    rq.image_url = "data:image/png;base64,AAAA";
    ck_assert_int_eq(rlai_upstream_build_body(&rq, "m", true, &body, &chat, err, sizeof(err)), 0);
    ck_assert_ptr_nonnull(strstr(body, "{\"role\":\"system\",\"content\":\"S\"}"));
    ck_assert_ptr_nonnull(strstr(body, "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"look\"},"
                                       "{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:image/png;base64,AAAA\"}}]}"));
    ck_assert_ptr_nonnull(strstr(body, "{\"role\":\"assistant\",\"content\":\"ok\"}"));
    free(body);
    rq.text.messages = NULL;
    rq.text.n_messages = 0;
    rq.text.prompt = "raw";
    ck_assert_int_eq(rlai_upstream_build_body(&rq, "m", true, &body, &chat, err, sizeof(err)), RLAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(err, "image URL needs messages"));

    /* chunks: fragments copied; a wrong shape is a format error */
    rlai_upstream_delta d;
    char msg[256];
    const char *c1 = "{\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\",\"type\":\"function\","
                     "\"function\":{\"name\":\"get_weather\",\"arguments\":\"\"}}]}}]}";
    const char *c2 = "{\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{\\\"city\\\":\"}},"
                     "{\"index\":1,\"id\":\"call_2\",\"function\":{\"name\":\"now\"}}]}}]}";
    const char *c3 = "{\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"\\\"Oslo\\\"}\"}}]},"
                     "\"finish_reason\":\"tool_calls\"}]}";
    cJSON *calls = cJSON_CreateArray();
    const char *cs[] = { c1, c2, c3 };
    for (int i = 0; i < 3; i++) {
        ck_assert_msg(rlai_upstream_parse_chunk(cs[i], strlen(cs[i]), &d, msg, sizeof(msg)) == 0, "%d: %s", i, msg);
        ck_assert(cJSON_IsArray(d.tool_calls));
        ck_assert_ptr_null(d.text);
        ck_assert_int_eq(rlai_tool_calls_merge(calls, d.tool_calls), 0);
        cJSON_Delete(d.tool_calls);
    }
    cJSON *m = rlai_tool_calls_message(calls);
    char *txt = cJSON_PrintUnformatted(m);
    ck_assert_str_eq(txt, "[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
                          "\"arguments\":\"{\\\"city\\\":\\\"Oslo\\\"}\"}},"
                          "{\"id\":\"call_2\",\"type\":\"function\",\"function\":{\"name\":\"now\",\"arguments\":\"\"}}]");
    free(txt);
    cJSON_Delete(m);
    cJSON_Delete(calls);
    const char *bad[] = {
        "{\"choices\":[{\"delta\":{\"tool_calls\":{}}}]}",
        "{\"choices\":[{\"delta\":{\"tool_calls\":[{\"id\":\"x\"}]}}]}",
        "{\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":{}}}]}}]}",
        "{\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":-1}]}}]}",
    };
    refused_chunks(bad, sizeof(bad) / sizeof(bad[0]), "tool_calls");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("upstream");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, config_reads_upstreams_and_routing);
    tcase_add_test(tc, key_file_must_be_private);
    tcase_add_test(tc, breaker_opens_half_opens_and_closes);
    tcase_add_test(tc, body_maps_the_request_and_refuses_what_it_cannot_honour);
    tcase_add_test(tc, chunks_decode);
    tcase_add_test(tc, chunk_logprobs_decode_to_chat_entries);
    tcase_add_test(tc, tool_calls_pass_through);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
