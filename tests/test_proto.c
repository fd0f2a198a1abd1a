/* test_proto.c - wire protocol codec: the hex vectors of proto/PROTOCOL.md
 * both ways, round trips of every message type, limits, UTF-8, and a
 * corpus of malformed messages (each must give its code, a message, and
 * no leak: run under ASan/LSan). */
#include <check.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

#include "rlai/protocol.h"

#ifndef RLAI_SOURCE_DIR
#error "RLAI_SOURCE_DIR must be defined (the project source root)"
#endif

/* ------------------------------------------------------------ helpers */

/* Decodes from an exact-size heap copy so ASan sees any overread. */
static int dec(const void *p, size_t n, rlai_msg *m, char *err, size_t errlen)
{
    unsigned char *copy = malloc(n ? n : 1);
    ck_assert_ptr_nonnull(copy);
    if (n) memcpy(copy, p, n);
    int rc = rlai_proto_decode(copy, n, m, err, errlen);
    free(copy);
    return rc;
}

/* Decodes, expecting failure with `code`, a non-empty message, and the
 * reported id/type. */
static void expect_fail(const void *p, size_t n, int code, uint64_t id, rlai_msg_type type,
                        const char *what)
{
    rlai_msg m;
    char err[256];
    memset(err, 'x', sizeof err);
    int rc = dec(p, n, &m, err, sizeof err);
    ck_assert_msg(rc == -code, "%s: got %d (%s), want %d", what, rc, rc ? err : "ok", -code);
    ck_assert_msg(err[0] != '\0' && strlen(err) < sizeof err, "%s: empty error message", what);
    ck_assert_msg(m.id == id, "%s: id %llu, want %llu", what, (unsigned long long)m.id,
                  (unsigned long long)id);
    ck_assert_msg(m.type == type, "%s: type %d, want %d", what, (int)m.type, (int)type);
    rlai_msg_free(&m);   /* allowed (and a no-op) after failure */
}

/* A msgpack writer for hand-made (possibly malformed) messages. */
typedef struct P {
    msgpack_sbuffer sb;
    msgpack_packer pk;
} P;

static void p_init(P *p)
{
    msgpack_sbuffer_init(&p->sb);
    msgpack_packer_init(&p->pk, &p->sb, msgpack_sbuffer_write);
}

static void p_done(P *p)
{
    msgpack_sbuffer_destroy(&p->sb);
}

static void s(P *p, const char *str)
{
    size_t n = strlen(str);
    msgpack_pack_str(&p->pk, n);
    msgpack_pack_str_body(&p->pk, str, n);
}

static void sn(P *p, const void *str, size_t n)
{
    msgpack_pack_str(&p->pk, n);
    msgpack_pack_str_body(&p->pk, str, n);
}

static void u(P *p, uint64_t v) { msgpack_pack_uint64(&p->pk, v); }
static void i64(P *p, int64_t v) { msgpack_pack_int64(&p->pk, v); }
static void f64(P *p, double v) { msgpack_pack_double(&p->pk, v); }
static void raw(P *p, const void *b, size_t n) { msgpack_sbuffer_write(&p->sb, b, n); }

static void bin(P *p, const char *str)
{
    size_t n = strlen(str);
    msgpack_pack_bin(&p->pk, n);
    msgpack_pack_bin_body(&p->pk, str, n);
}

/* map header of 3 + extra entries, then v, id, type */
static void head(P *p, size_t extra, uint64_t id, const char *type)
{
    msgpack_pack_map(&p->pk, 3 + extra);
    s(p, "v"); u(p, 1);
    s(p, "id"); u(p, id);
    s(p, "type"); s(p, type);
}

static char *repeat(char c, size_t n)
{
    char *r = malloc(n + 1);
    ck_assert_ptr_nonnull(r);
    memset(r, c, n);
    r[n] = '\0';
    return r;
}

/* ---------------------------------------------------- PROTOCOL.md vectors */

typedef struct vec {
    char name[64];
    unsigned char *data;
    size_t len;
} vec;

static vec vecs[64];
static int n_vecs;

static void load_vectors(void)
{
    if (n_vecs) return;
    const char *path = RLAI_SOURCE_DIR "/proto/PROTOCOL.md";
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    char line[1024];
    vec *cur = NULL;
    while (fgets(line, sizeof line, f)) {
        if (!cur) {
            if (strncmp(line, "```hex name=", 12) != 0) continue;
            ck_assert_int_lt(n_vecs, 64);
            cur = &vecs[n_vecs++];
            size_t k = strcspn(line + 12, " \r\n");
            ck_assert_uint_lt(k, sizeof cur->name);
            memcpy(cur->name, line + 12, k);
            cur->name[k] = '\0';
            cur->data = malloc(8192);
            ck_assert_ptr_nonnull(cur->data);
            cur->len = 0;
            continue;
        }
        if (strncmp(line, "```", 3) == 0) { cur = NULL; continue; }
        for (char *q = line; *q;) {
            if (*q == ' ' || *q == '\n' || *q == '\r' || *q == '\t') { q++; continue; }
            unsigned v;
            ck_assert_msg(sscanf(q, "%2x", &v) == 1 && q[1] && q[1] != ' ',
                          "bad hex in vector %s: %s", cur->name, line);
            ck_assert_uint_lt(cur->len, 8192);
            cur->data[cur->len++] = (unsigned char)v;
            q += 2;
        }
    }
    fclose(f);
    ck_assert_msg(cur == NULL, "unterminated hex block");
}

static void free_vectors(void)
{
    for (int i = 0; i < n_vecs; i++) free(vecs[i].data);
    n_vecs = 0;
}

static const vec *find_vec(const char *name)
{
    for (int i = 0; i < n_vecs; i++)
        if (strcmp(vecs[i].name, name) == 0) return &vecs[i];
    return NULL;
}

static void check_vector(const vec *v, const rlai_msg *m)
{
    const char *n = v->name;
    ck_assert_uint_eq(m->version, 1);
    if (!strcmp(n, "hello")) {
        ck_assert_int_eq(m->type, RLAI_MSG_HELLO);
        ck_assert_uint_eq(m->id, 1);
        ck_assert_str_eq(m->u.hello.client, "rlai-cli/0.1");
    } else if (!strcmp(n, "generate")) {
        const rlai_msg_gen *g = &m->u.generate.gen;
        ck_assert_int_eq(m->type, RLAI_MSG_GENERATE);
        ck_assert_uint_eq(m->id, 2);
        ck_assert_str_eq(m->u.generate.prompt, "Hello");
        ck_assert(g->has_max_tokens && g->max_tokens == 64);
        ck_assert(g->has_temperature && g->temperature == 0.5f);
        ck_assert(g->has_top_k && g->top_k == 40);
        ck_assert(g->has_top_p && g->top_p == 0.75f);
        ck_assert(g->has_min_p && g->min_p == 0.0625f);
        ck_assert(g->has_repeat_penalty && g->repeat_penalty == 1.125f);
        ck_assert(g->has_presence_penalty && g->presence_penalty == 0.25f);
        ck_assert(g->has_frequency_penalty && g->frequency_penalty == -0.5f);
        ck_assert(g->has_seed && g->seed == 42);
        ck_assert(g->ignore_eos);
        ck_assert_uint_eq(g->n_stop, 2);
        ck_assert_str_eq(g->stop[0], "\n\n");
        ck_assert_str_eq(g->stop[1], "User:");
    } else if (!strcmp(n, "chat")) {
        ck_assert_int_eq(m->type, RLAI_MSG_CHAT);
        ck_assert_uint_eq(m->id, 3);
        ck_assert_uint_eq(m->u.chat.n_messages, 2);
        ck_assert_str_eq(m->u.chat.messages[0].role, "system");
        ck_assert_str_eq(m->u.chat.messages[0].content, "Be brief.");
        ck_assert_str_eq(m->u.chat.messages[1].role, "user");
        ck_assert_str_eq(m->u.chat.messages[1].content, "Hi");
        ck_assert(m->u.chat.gen.has_max_tokens && m->u.chat.gen.max_tokens == 16);
        ck_assert(!m->u.chat.gen.has_temperature && !m->u.chat.gen.has_seed);
        ck_assert(!m->u.chat.gen.ignore_eos && m->u.chat.gen.n_stop == 0);
    } else if (!strcmp(n, "call")) {
        ck_assert_int_eq(m->type, RLAI_MSG_CALL);
        ck_assert_uint_eq(m->id, 4);
        ck_assert_str_eq(m->u.call.command, "models.list");
        ck_assert_str_eq(m->u.call.params_json, "{\"all\":true}");
    } else if (!strcmp(n, "cancel")) {
        ck_assert_int_eq(m->type, RLAI_MSG_CANCEL);
        ck_assert_uint_eq(m->id, 5);
        ck_assert_uint_eq(m->u.cancel.target, 2);
    } else if (!strcmp(n, "commands")) {
        ck_assert_int_eq(m->type, RLAI_MSG_COMMANDS);
        ck_assert_uint_eq(m->id, 6);
    } else if (!strcmp(n, "stats")) {
        ck_assert_int_eq(m->type, RLAI_MSG_STATS);
        ck_assert_uint_eq(m->id, 7);
    } else if (!strcmp(n, "tokenize")) {
        ck_assert_int_eq(m->type, RLAI_MSG_TOKENIZE);
        ck_assert_uint_eq(m->id, 8);
        ck_assert_str_eq(m->u.tokenize.text, "Hi <|im_end|>");
        ck_assert(!m->u.tokenize.add_special);
        ck_assert(m->u.tokenize.parse_special);
    } else if (!strcmp(n, "token")) {
        ck_assert_int_eq(m->type, RLAI_MSG_TOKEN);
        ck_assert_uint_eq(m->id, 2);
        ck_assert_str_eq(m->u.token.text, " w\xc3\xb6rld");
        ck_assert_uint_eq(m->u.token.n_tokens, 2);
        ck_assert_int_eq(m->u.token.tokens[0], 1917);
        ck_assert_int_eq(m->u.token.tokens[1], 300);
    } else if (!strcmp(n, "result")) {
        static const unsigned char data[] = {0x81, 0xa6, 't', 'o', 'k', 'e', 'n', 's',
                                             0x93, 0x01, 0xcd, 0x01, 0x2c, 0xff};
        ck_assert_int_eq(m->type, RLAI_MSG_RESULT);
        ck_assert_uint_eq(m->id, 8);
        ck_assert_uint_eq(m->u.result.len, sizeof data);
        ck_assert_mem_eq(m->u.result.data, data, sizeof data);
    } else if (!strcmp(n, "done_metrics")) {
        const rlai_msg_metrics *mt = &m->u.done.metrics;
        ck_assert_int_eq(m->type, RLAI_MSG_DONE);
        ck_assert_uint_eq(m->id, 2);
        ck_assert_str_eq(m->u.done.stop, "eog");
        ck_assert(m->u.done.has_metrics);
        ck_assert(mt->queue_ms == 0.5 && mt->ttft_ms == 12.25);
        ck_assert(mt->prefill_tps == 1024.0 && mt->decode_tps == 48.5);
        ck_assert(mt->prompt_tokens == 5 && mt->gen_tokens == 3 && mt->reused_tokens == 0);
    } else if (!strcmp(n, "done")) {
        ck_assert_int_eq(m->type, RLAI_MSG_DONE);
        ck_assert_uint_eq(m->id, 5);
        ck_assert_str_eq(m->u.done.stop, "");
        ck_assert(!m->u.done.has_metrics);
    } else if (!strcmp(n, "error")) {
        ck_assert_int_eq(m->type, RLAI_MSG_ERROR);
        ck_assert_uint_eq(m->id, 9);
        ck_assert_int_eq(m->u.error.code, RLAI_PE_BAD_REQUEST);
        ck_assert_str_eq(m->u.error.name, "BAD_REQUEST");
        ck_assert_str_eq(m->u.error.msg, "unknown message type 'foo'");
    } else {
        ck_abort_msg("vector '%s' has no expectations in test_proto.c", n);
    }
}

START_TEST(test_vectors_both_ways)
{
    load_vectors();
    static const char *const required[] = {"hello", "generate", "chat", "call", "cancel",
                                           "commands", "stats", "tokenize", "token", "result",
                                           "done_metrics", "done", "error"};
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++)
        ck_assert_msg(find_vec(required[i]) != NULL, "vector %s missing from PROTOCOL.md", required[i]);
    ck_assert_int_ge(n_vecs, 8);
    for (int i = 0; i < n_vecs; i++) {
        const vec *v = &vecs[i];
        rlai_msg m;
        char err[256];
        int rc = dec(v->data, v->len, &m, err, sizeof err);
        ck_assert_msg(rc == 0, "vector %s: %s", v->name, err);
        ck_assert_str_eq(err, "");
        check_vector(v, &m);
        rlai_buf b;
        rlai_buf_init(&b);
        ck_assert_int_eq(rlai_proto_encode(&m, &b), 0);
        ck_assert_msg(b.len == v->len && memcmp(b.data, v->data, v->len) == 0,
                      "vector %s: re-encoding differs", v->name);
        rlai_buf_free(&b);
        rlai_msg_free(&m);
    }
    free_vectors();
}
END_TEST

START_TEST(test_vectors_truncated)
{
    load_vectors();
    for (int i = 0; i < n_vecs; i++)
        for (size_t n = 0; n < vecs[i].len; n++) {
            char what[96];
            snprintf(what, sizeof what, "%.60s cut at %zu", vecs[i].name, n);
            rlai_msg m;
            char err[256];
            int rc = dec(vecs[i].data, n, &m, err, sizeof err);
            ck_assert_msg(rc == -RLAI_PE_BAD_FRAME, "%s: rc %d", what, rc);
            ck_assert_msg(err[0], "%s: no message", what);
            rlai_msg_free(&m);
        }
    /* and with every vector followed by one extra byte */
    for (int i = 0; i < n_vecs; i++) {
        unsigned char buf[8200];
        memcpy(buf, vecs[i].data, vecs[i].len);
        buf[vecs[i].len] = 0xc0;
        rlai_msg m;
        char err[256];
        ck_assert_int_eq(dec(buf, vecs[i].len + 1, &m, err, sizeof err), -RLAI_PE_BAD_FRAME);
        ck_assert_ptr_nonnull(strstr(err, "trailing"));
        rlai_msg_free(&m);
    }
    free_vectors();
}
END_TEST

/* ------------------------------------------------------------ round trips */

static bool str_eq(const char *a, const char *b)
{
    return (a == NULL && b == NULL) || (a && b && strcmp(a, b) == 0);
}

static bool gen_eq(const rlai_msg_gen *a, const rlai_msg_gen *b)
{
#define SAME(f) (a->has_##f == b->has_##f && (!a->has_##f || a->f == b->f))
    if (!(SAME(max_tokens) && SAME(temperature) && SAME(top_k) && SAME(top_p) && SAME(min_p) &&
          SAME(repeat_penalty) && SAME(presence_penalty) && SAME(frequency_penalty) && SAME(seed) &&
          SAME(timeout_ms) && SAME(spec) && SAME(spec_max_draft) && SAME(top_logprobs)))
        return false;
#undef SAME
    if (a->ignore_eos != b->ignore_eos || a->prompt_logprobs != b->prompt_logprobs || a->n_stop != b->n_stop)
        return false;
    for (uint32_t i = 0; i < a->n_stop; i++)
        if (!str_eq(a->stop[i], b->stop[i])) return false;
    if ((a->model == NULL) != (b->model == NULL) || (a->model && !str_eq(a->model, b->model))) return false;
    if ((a->route == NULL) != (b->route == NULL) || (a->route && !str_eq(a->route, b->route))) return false;
    if (!str_eq(a->prediction, b->prediction)) return false;
    if (a->n_logit_bias != b->n_logit_bias) return false;
    for (uint32_t i = 0; i < a->n_logit_bias; i++)
        if (a->logit_bias[i].token != b->logit_bias[i].token || a->logit_bias[i].bias != b->logit_bias[i].bias)
            return false;
    return true;
}

static bool msg_eq(const rlai_msg *a, const rlai_msg *b)
{
    if (a->type != b->type || a->id != b->id) return false;
    switch (a->type) {
    case RLAI_MSG_HELLO: return str_eq(a->u.hello.client, b->u.hello.client);
    case RLAI_MSG_GENERATE:
        return str_eq(a->u.generate.prompt, b->u.generate.prompt) &&
               gen_eq(&a->u.generate.gen, &b->u.generate.gen);
    case RLAI_MSG_CHAT:
        if (a->u.chat.n_messages != b->u.chat.n_messages) return false;
        for (uint32_t i = 0; i < a->u.chat.n_messages; i++)
            if (!str_eq(a->u.chat.messages[i].role, b->u.chat.messages[i].role) ||
                !str_eq(a->u.chat.messages[i].content, b->u.chat.messages[i].content))
                return false;
        return gen_eq(&a->u.chat.gen, &b->u.chat.gen);
    case RLAI_MSG_CALL:
        return str_eq(a->u.call.command, b->u.call.command) &&
               str_eq(a->u.call.params_json, b->u.call.params_json) && a->u.call.timeout_ms == b->u.call.timeout_ms;
    case RLAI_MSG_CANCEL: return a->u.cancel.target == b->u.cancel.target;
    case RLAI_MSG_COMMANDS: case RLAI_MSG_STATS: return true;
    case RLAI_MSG_TOKENIZE:
        return str_eq(a->u.tokenize.text, b->u.tokenize.text) &&
               a->u.tokenize.add_special == b->u.tokenize.add_special &&
               a->u.tokenize.parse_special == b->u.tokenize.parse_special;
    case RLAI_MSG_TOKEN:
        return str_eq(a->u.token.text ? a->u.token.text : "", b->u.token.text) &&
               a->u.token.n_tokens == b->u.token.n_tokens &&
               (a->u.token.n_tokens == 0 ||
                memcmp(a->u.token.tokens, b->u.token.tokens, a->u.token.n_tokens * sizeof(int32_t)) == 0);
    case RLAI_MSG_RESULT:
        return a->u.result.len == b->u.result.len &&
               memcmp(a->u.result.data, b->u.result.data, a->u.result.len) == 0;
    case RLAI_MSG_DONE:
        return str_eq(a->u.done.stop ? a->u.done.stop : "", b->u.done.stop) &&
               a->u.done.has_metrics == b->u.done.has_metrics &&
               (!a->u.done.has_metrics ||
                (a->u.done.metrics.queue_ms == b->u.done.metrics.queue_ms &&
                 a->u.done.metrics.ttft_ms == b->u.done.metrics.ttft_ms &&
                 a->u.done.metrics.prefill_tps == b->u.done.metrics.prefill_tps &&
                 a->u.done.metrics.decode_tps == b->u.done.metrics.decode_tps &&
                 a->u.done.metrics.prompt_tokens == b->u.done.metrics.prompt_tokens &&
                 a->u.done.metrics.gen_tokens == b->u.done.metrics.gen_tokens &&
                 a->u.done.metrics.reused_tokens == b->u.done.metrics.reused_tokens &&
                 a->u.done.metrics.drafted_tokens == b->u.done.metrics.drafted_tokens &&
                 a->u.done.metrics.accepted_tokens == b->u.done.metrics.accepted_tokens &&
                 !strcmp(a->u.done.metrics.where, b->u.done.metrics.where)));
    case RLAI_MSG_ERROR:
        return a->u.error.code == b->u.error.code &&
               str_eq(a->u.error.name ? a->u.error.name : rlai_proto_code_name(a->u.error.code),
                      b->u.error.name) &&
               str_eq(a->u.error.msg ? a->u.error.msg : "", b->u.error.msg);
    default: return false;
    }
}

/* encode -> decode -> equal -> re-encode gives the same bytes */
static void roundtrip(const rlai_msg *m)
{
    rlai_buf b, b2;
    rlai_buf_init(&b);
    rlai_buf_init(&b2);
    int rc = rlai_proto_encode(m, &b);
    ck_assert_msg(rc == 0, "encode type %d: %d", (int)m->type, rc);
    rlai_msg d;
    char err[256];
    rc = dec(b.data, b.len, &d, err, sizeof err);
    ck_assert_msg(rc == 0, "decode type %d: %s", (int)m->type, err);
    ck_assert_msg(msg_eq(m, &d), "round trip of type %s differs", rlai_msg_type_name(m->type));
    ck_assert_uint_eq(d.version, 1);
    ck_assert_int_eq(rlai_proto_encode(&d, &b2), 0);
    ck_assert_uint_eq(b.len, b2.len);
    ck_assert_mem_eq(b.data, b2.data, b.len);
    rlai_msg_free(&d);
    rlai_buf_free(&b);
    rlai_buf_free(&b2);
}

static rlai_msg mk(rlai_msg_type t, uint64_t id)
{
    rlai_msg m;
    memset(&m, 0, sizeof m);
    m.type = t;
    m.version = RLAI_PROTO_VERSION;
    m.id = id;
    return m;
}

/* "model" and "route" (docs/REMOTE.md): round trip, limits, types */
START_TEST(test_model_and_route_options)
{
    rlai_msg m = mk(RLAI_MSG_CHAT, 3);
    rlai_msg_chat_message cm[1] = { { "user", "Hi" } };
    m.u.chat.messages = cm;
    m.u.chat.n_messages = 1;
    m.u.chat.gen.model = "cluster/llama-8b";
    m.u.chat.gen.route = "remote";
    roundtrip(&m);
    rlai_buf b;
    rlai_buf_init(&b);
    ck_assert_int_eq(rlai_proto_encode(&m, &b), 0);
    rlai_msg d;
    char err[256];
    ck_assert_int_eq(dec(b.data, b.len, &d, err, sizeof err), 0);
    ck_assert_str_eq(d.u.chat.gen.model, "cluster/llama-8b");
    ck_assert_str_eq(d.u.chat.gen.route, "remote");
    rlai_msg_free(&d);
    char longname[RLAI_PROTO_MAX_MODEL_NAME + 2];
    memset(longname, 'm', sizeof longname - 1);
    longname[sizeof longname - 1] = 0;
    m.u.chat.gen.model = longname;
    rlai_buf_reset(&b);
    ck_assert_int_ne(rlai_proto_encode(&m, &b), 0);
    /* a peer sending a number: refused, naming the field */
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 5);
    msgpack_pack_str_with_body(&pk, "v", 1); msgpack_pack_uint8(&pk, 1);
    msgpack_pack_str_with_body(&pk, "id", 2); msgpack_pack_uint8(&pk, 9);
    msgpack_pack_str_with_body(&pk, "type", 4); msgpack_pack_str_with_body(&pk, "generate", 8);
    msgpack_pack_str_with_body(&pk, "prompt", 6); msgpack_pack_str_with_body(&pk, "x", 1);
    msgpack_pack_str_with_body(&pk, "model", 5); msgpack_pack_uint8(&pk, 7);
    ck_assert_int_ne(dec((const uint8_t *)sb.data, sb.size, &d, err, sizeof err), 0);
    ck_assert_ptr_nonnull(strstr(err, "'model'"));
    msgpack_sbuffer_destroy(&sb);
    rlai_buf_free(&b);
}
END_TEST

START_TEST(test_roundtrip_every_type)
{
    rlai_msg m = mk(RLAI_MSG_HELLO, 0);
    roundtrip(&m);
    m.u.hello.client = "client \xe2\x9c\x93";
    m.id = UINT64_MAX;
    roundtrip(&m);

    m = mk(RLAI_MSG_GENERATE, 1);
    m.u.generate.prompt = "";
    roundtrip(&m);
    char *stops[8] = {"a", "bb", "\xf0\x9f\x98\x80", "</s>", "e", "f", "g", "h"};
    rlai_msg_gen g = {0};
    g.max_tokens = INT32_MAX; g.has_max_tokens = true;
    g.temperature = 0.7f; g.has_temperature = true;
    g.top_k = 0; g.has_top_k = true;
    g.top_p = 1.0f; g.has_top_p = true;
    g.min_p = 0.0f; g.has_min_p = true;
    g.repeat_penalty = 1.1f; g.has_repeat_penalty = true;
    g.presence_penalty = -2.0f; g.has_presence_penalty = true;
    g.frequency_penalty = 3.4e38f; g.has_frequency_penalty = true;
    g.seed = UINT64_MAX; g.has_seed = true;
    g.ignore_eos = true;
    g.timeout_ms = UINT32_MAX; g.has_timeout_ms = true;
    g.spec = RLAI_MSG_SPEC_NGRAM; g.has_spec = true;
    g.spec_max_draft = RLAI_PROTO_MAX_DRAFT; g.has_spec_max_draft = true;
    g.top_logprobs = RLAI_PROTO_MAX_TOP_LOGPROBS; g.has_top_logprobs = true;
    g.prompt_logprobs = true;
    g.stop = stops; g.n_stop = 8;
    rlai_msg_logit_bias lb[3] = { { 0, -100.0f }, { INT32_MAX, 100.0f }, { 7761, 2.5f } };
    g.logit_bias = lb; g.n_logit_bias = 3;
    g.prediction = "int count = 0;\n";
    m.u.generate.prompt = "Once upon a time";
    m.u.generate.gen = g;
    roundtrip(&m);
    /* every option alone */
    for (int k = 0; k < 20; k++) {
        rlai_msg_gen one = {0};
        switch (k) {
        case 0: one.has_max_tokens = true; one.max_tokens = 0; break;
        case 1: one.has_temperature = true; one.temperature = 0.0f; break;
        case 2: one.has_top_k = true; one.top_k = 1; break;
        case 3: one.has_top_p = true; one.top_p = 0.9f; break;
        case 4: one.has_min_p = true; one.min_p = 0.05f; break;
        case 5: one.has_repeat_penalty = true; one.repeat_penalty = 0.0f; break;
        case 6: one.has_presence_penalty = true; one.presence_penalty = 1e-30f; break;
        case 7: one.has_frequency_penalty = true; one.frequency_penalty = -1.5f; break;
        case 8: one.has_seed = true; one.seed = 0; break;
        case 9: one.ignore_eos = true; break;
        case 10: one.has_timeout_ms = true; one.timeout_ms = 250; break;
        case 11: one.has_spec = true; one.spec = RLAI_MSG_SPEC_OFF; break;
        case 12: one.has_spec = true; one.spec = RLAI_MSG_SPEC_AUTO; break;
        case 13: one.has_spec_max_draft = true; one.spec_max_draft = 1; break;
        case 14: one.has_top_logprobs = true; one.top_logprobs = 0; break;
        case 15: one.has_spec = true; one.spec = RLAI_MSG_SPEC_DRAFT; break;
        case 16: one.has_top_logprobs = true; one.top_logprobs = 1; one.prompt_logprobs = true; break;
        case 17: one.logit_bias = lb + 2; one.n_logit_bias = 1; break;
        case 18: one.prediction = ""; break;
        default: one.stop = stops + 2; one.n_stop = 1; break;
        }
        m.u.generate.gen = one;
        roundtrip(&m);
    }

    m = mk(RLAI_MSG_CHAT, 2);
    rlai_msg_chat_message msgs[256];
    for (int i = 0; i < 256; i++) {
        msgs[i].role = i % 2 ? "assistant" : "user";
        msgs[i].content = i % 3 ? "hello" : "";
    }
    m.u.chat.messages = msgs;
    m.u.chat.n_messages = 1;
    roundtrip(&m);
    m.u.chat.n_messages = 256;
    m.u.chat.gen = g;
    roundtrip(&m);

    m = mk(RLAI_MSG_CALL, 3);
    m.u.call.command = "model.load";
    roundtrip(&m);
    m.u.call.params_json = "{\"path\": \"/models/x.gguf\"}";
    roundtrip(&m);
    m.u.call.params_json = "";
    roundtrip(&m);
    m.u.call.timeout_ms = 1500;          /* optional deadline */
    roundtrip(&m);
    m.u.call.timeout_ms = RLAI_PROTO_MAX_CALL_TIMEOUT_MS;
    roundtrip(&m);

    m = mk(RLAI_MSG_CANCEL, 4);
    m.u.cancel.target = UINT64_MAX;
    roundtrip(&m);

    m = mk(RLAI_MSG_COMMANDS, 5);
    roundtrip(&m);
    m = mk(RLAI_MSG_STATS, 6);
    roundtrip(&m);

    m = mk(RLAI_MSG_TOKENIZE, 7);
    m.u.tokenize.text = "";
    for (int k = 0; k < 4; k++) {
        m.u.tokenize.add_special = k & 1;
        m.u.tokenize.parse_special = k & 2;
        roundtrip(&m);
    }

    m = mk(RLAI_MSG_TOKEN, 8);
    roundtrip(&m);   /* text NULL -> "", no tokens */
    int32_t toks[5] = {0, -1, INT32_MAX, INT32_MIN, 128};
    m.u.token.text = "\xe4\xb8\xad";
    m.u.token.tokens = toks;
    m.u.token.n_tokens = 5;
    roundtrip(&m);

    m = mk(RLAI_MSG_RESULT, 9);
    static const unsigned char vals[][12] = {
        {0xc0}, {0xc3}, {0x7f}, {0xe0}, {0xcb, 0x40, 0x09, 0x21, 0xfb, 0x54, 0x44, 0x2d, 0x18},
        {0x90}, {0x80}, {0xa0}, {0xc4, 0x02, 0x00, 0xff}, {0xd4, 0x01, 0x05}, {0x91, 0x91, 0x90},
    };
    static const size_t lens[] = {1, 1, 1, 1, 9, 1, 1, 1, 4, 3, 3};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        m.u.result.data = (unsigned char *)vals[i];
        m.u.result.len = lens[i];
        roundtrip(&m);
    }
    /* nested exactly RLAI_PROTO_MAX_DEPTH levels is fine */
    unsigned char deep[RLAI_PROTO_MAX_DEPTH];
    memset(deep, 0x91, sizeof deep);
    deep[RLAI_PROTO_MAX_DEPTH - 1] = 0x90;
    m.u.result.data = deep;
    m.u.result.len = sizeof deep;
    roundtrip(&m);

    m = mk(RLAI_MSG_DONE, 10);
    roundtrip(&m);   /* stop NULL -> "" */
    m.u.done.stop = "max_tokens";
    roundtrip(&m);
    m.u.done.has_metrics = true;
    m.u.done.metrics = (rlai_msg_metrics){1.0 / 3.0, 1e9, 0, 123.456, UINT32_MAX, 0, 7, 12, 9, ""};
    roundtrip(&m);
    snprintf(m.u.done.metrics.where, sizeof m.u.done.metrics.where, "upstream:cluster-1");
    roundtrip(&m);

    m = mk(RLAI_MSG_ERROR, 11);
    m.u.error.code = RLAI_PE_CONTEXT_FULL;
    roundtrip(&m);   /* name from the code, msg "" */
    m.u.error.name = "CUSTOM";
    m.u.error.msg = "something \xc3\xa9 happened";
    m.u.error.code = 1000;
    roundtrip(&m);
}
END_TEST

/* ------------------------------------------------------ convenience API */

static void expect_same(rlai_buf *a, const rlai_msg *m)
{
    rlai_buf b;
    rlai_buf_init(&b);
    ck_assert_int_eq(rlai_proto_encode(m, &b), 0);
    ck_assert_uint_eq(a->len, b.len);
    ck_assert_mem_eq(a->data, b.data, b.len);
    rlai_buf_free(&b);
    rlai_buf_reset(a);
}

/* A token frame with "logprobs": decodes as a plain token frame (the C
 * decoder ignores the field) and carries the entries as documented. */
START_TEST(test_token_logprobs_frame)
{
    rlai_buf b;
    rlai_buf_init(&b);
    int32_t t = 42;
    rlai_msg_logprob lp = { .token = 42, .logprob = -0.25f, .n_top = 2 };
    lp.top_ids[0] = 42;
    lp.top_logprobs[0] = -0.25f;
    lp.top_ids[1] = 7;
    lp.top_logprobs[1] = -INFINITY;
    ck_assert_int_eq(rlai_proto_encode_token_lp(&b, 9, "hi", 2, &t, 1, &lp, 1), 0);
    rlai_msg m;
    ck_assert_int_eq(dec(b.data, b.len, &m, NULL, 0), 0);
    ck_assert_int_eq(m.type, RLAI_MSG_TOKEN);
    ck_assert_uint_eq(m.u.token.n_tokens, 1);
    rlai_msg_free(&m);
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    ck_assert_int_eq(msgpack_unpack_next(&up, (const char *)b.data, b.len, NULL), MSGPACK_UNPACK_SUCCESS);
    const msgpack_object_map *mp = &up.data.via.map;
    const msgpack_object *lps = NULL;
    for (uint32_t i = 0; i < mp->size; i++)
        if (mp->ptr[i].key.via.str.size == 8 && !memcmp(mp->ptr[i].key.via.str.ptr, "logprobs", 8))
            lps = &mp->ptr[i].val;
    ck_assert_ptr_nonnull(lps);
    ck_assert_uint_eq(lps->via.array.size, 1);
    const msgpack_object_map *e = &lps->via.array.ptr[0].via.map;
    ck_assert_uint_eq(e->size, 3);
    ck_assert_int_eq((int)e->ptr[0].val.via.u64, 42);
    ck_assert(fabs(e->ptr[1].val.via.f64 + 0.25) < 1e-9);
    const msgpack_object *top = &e->ptr[2].val;
    ck_assert_uint_eq(top->via.array.size, 2);
    ck_assert_int_eq((int)top->via.array.ptr[1].via.array.ptr[0].via.u64, 7);
    ck_assert(top->via.array.ptr[1].via.array.ptr[1].via.f64 == -9999.0);
    msgpack_unpacked_destroy(&up);
    /* no entries: exactly the plain encoder's bytes */
    rlai_buf a;
    rlai_buf_init(&a);
    rlai_buf_reset(&b);
    ck_assert_int_eq(rlai_proto_encode_token_lp(&b, 9, "hi", 2, &t, 1, NULL, 0), 0);
    ck_assert_int_eq(rlai_proto_encode_token(&a, 9, "hi", 2, &t, 1), 0);
    ck_assert_uint_eq(a.len, b.len);
    ck_assert_mem_eq(a.data, b.data, a.len);
    rlai_buf_free(&a);
    rlai_buf_free(&b);
}
END_TEST

/* The map value of key k in a msgpack map, or NULL. */
static const msgpack_object *map_get(const msgpack_object *o, const char *k)
{
    size_t n = strlen(k);
    for (uint32_t i = 0; o->type == MSGPACK_OBJECT_MAP && i < o->via.map.size; i++) {
        const msgpack_object *key = &o->via.map.ptr[i].key;
        if (key->type == MSGPACK_OBJECT_STR && key->via.str.size == n && !memcmp(key->via.str.ptr, k, n))
            return &o->via.map.ptr[i].val;
    }
    return NULL;
}

static bool str_is(const msgpack_object *o, const char *s, size_t n)
{
    return o && o->type == MSGPACK_OBJECT_STR && o->via.str.size == n && !memcmp(o->via.str.ptr, s, n);
}

/* A prompt-logprobs frame (PROTOCOL.md 6.1): a token frame with no text
 * and no ids for the C decoder; its "prompt_logprobs" entries as
 * documented, the first (NaN: no distribution) with logprob nil, top []. */
START_TEST(test_prompt_logprobs_frame)
{
    rlai_buf b;
    rlai_buf_init(&b);
    rlai_msg_logprob lp[2] = { { .token = 1, .logprob = NAN, .n_top = 2 },
                               { .token = 42, .logprob = -1.5f, .n_top = 1 } };
    lp[1].top_ids[0] = 7;
    lp[1].top_logprobs[0] = -0.5f;
    ck_assert_int_eq(rlai_proto_encode_prompt_logprobs(&b, 9, lp, 0), -RLAI_PE_BAD_REQUEST);
    ck_assert_int_eq(rlai_proto_encode_prompt_logprobs(&b, 9, lp, 2), 0);
    rlai_msg m;
    ck_assert_int_eq(dec(b.data, b.len, &m, NULL, 0), 0);
    ck_assert_int_eq(m.type, RLAI_MSG_TOKEN);
    ck_assert_uint_eq(m.id, 9);
    ck_assert_uint_eq(m.u.token.n_tokens, 0);
    ck_assert_str_eq(m.u.token.text, "");
    rlai_msg_free(&m);
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    ck_assert_int_eq(msgpack_unpack_next(&up, (const char *)b.data, b.len, NULL), MSGPACK_UNPACK_SUCCESS);
    const msgpack_object *plps = map_get(&up.data, "prompt_logprobs");
    ck_assert_ptr_nonnull(plps);
    ck_assert_uint_eq(plps->via.array.size, 2);
    const msgpack_object_map *e0 = &plps->via.array.ptr[0].via.map, *e1 = &plps->via.array.ptr[1].via.map;
    ck_assert_int_eq((int)e0->ptr[0].val.via.u64, 1);
    ck_assert_int_eq(e0->ptr[1].val.type, MSGPACK_OBJECT_NIL);
    ck_assert_uint_eq(e0->ptr[2].val.via.array.size, 0);
    ck_assert_int_eq((int)e1->ptr[0].val.via.u64, 42);
    ck_assert(fabs(e1->ptr[1].val.via.f64 + 1.5) < 1e-9);
    ck_assert_uint_eq(e1->ptr[2].val.via.array.size, 1);
    ck_assert_int_eq((int)e1->ptr[2].val.via.array.ptr[0].via.array.ptr[0].via.u64, 7);
    msgpack_unpacked_destroy(&up);
    rlai_buf_free(&b);
}
END_TEST

/* A remote model's token frame (6.1): no ids, text entries; invalid UTF-8
 * in an entry's text becomes U+FFFD, bytes go as bin, and the C decoder
 * reads it as a plain token frame. */
START_TEST(test_token_text_logprobs_frame)
{
    rlai_buf b;
    rlai_buf_init(&b);
    rlai_msg_text_logprob lp[2] = {
        { .text = "Hi", .text_len = 2, .bytes = (const uint8_t *)"Hi", .n_bytes = 2, .logprob = -0.5, .n_top = 2 },
        { .text = "\xE2\x80!", .text_len = 3,        /* half a character, then "!" */
          .logprob = -INFINITY, .n_top = 0 },
    };
    lp[0].top_text[0] = "Hi";
    lp[0].top_len[0] = 2;
    lp[0].top_logprobs[0] = -0.5;
    lp[0].top_text[1] = "Hello";
    lp[0].top_len[1] = 5;
    lp[0].top_logprobs[1] = -1.75;
    ck_assert_int_eq(rlai_proto_encode_token_text_lp(&b, 5, "Hi", 2, lp, 2), 0);
    rlai_msg m;
    ck_assert_int_eq(dec(b.data, b.len, &m, NULL, 0), 0);
    ck_assert_int_eq(m.type, RLAI_MSG_TOKEN);
    ck_assert_str_eq(m.u.token.text, "Hi");
    ck_assert_uint_eq(m.u.token.n_tokens, 0);
    rlai_msg_free(&m);
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    ck_assert_int_eq(msgpack_unpack_next(&up, (const char *)b.data, b.len, NULL), MSGPACK_UNPACK_SUCCESS);
    const msgpack_object *lps = map_get(&up.data, "logprobs");
    ck_assert_ptr_nonnull(lps);
    ck_assert_uint_eq(lps->via.array.size, 2);
    const msgpack_object *e0 = &lps->via.array.ptr[0], *e1 = &lps->via.array.ptr[1];
    ck_assert(str_is(map_get(e0, "text"), "Hi", 2));
    ck_assert_ptr_null(map_get(e0, "token"));              /* no id: a client cannot mistake it for one */
    ck_assert(fabs(map_get(e0, "logprob")->via.f64 + 0.5) < 1e-12);
    const msgpack_object *bytes = map_get(e0, "bytes");
    ck_assert(bytes && bytes->type == MSGPACK_OBJECT_BIN && bytes->via.bin.size == 2);
    ck_assert_mem_eq(bytes->via.bin.ptr, "Hi", 2);
    const msgpack_object *top = map_get(e0, "top");
    ck_assert_uint_eq(top->via.array.size, 2);
    ck_assert(str_is(&top->via.array.ptr[1].via.array.ptr[0], "Hello", 5));
    ck_assert(fabs(top->via.array.ptr[1].via.array.ptr[1].via.f64 + 1.75) < 1e-12);
    ck_assert(str_is(map_get(e1, "text"), "\xEF\xBF\xBD\xEF\xBF\xBD!", 7));   /* each bad byte: U+FFFD */
    ck_assert(map_get(e1, "logprob")->via.f64 == -9999.0);
    ck_assert_ptr_null(map_get(e1, "bytes"));
    ck_assert_uint_eq(map_get(e1, "top")->via.array.size, 0);
    msgpack_unpacked_destroy(&up);
    /* the frame's own text must be valid UTF-8 */
    rlai_buf_reset(&b);
    ck_assert_int_lt(rlai_proto_encode_token_text_lp(&b, 5, "\xE2\x80", 2, lp, 2), 0);
    ck_assert_int_lt(rlai_proto_encode_token_text_lp(&b, 5, "x", 1, NULL, 1), 0);
    rlai_buf_free(&b);
}
END_TEST

START_TEST(test_convenience_encoders)
{
    rlai_buf a;
    rlai_buf_init(&a);
    int32_t toks[3] = {5, 6, 7};
    /* text with a length: not NUL-terminated */
    ck_assert_int_eq(rlai_proto_encode_token(&a, 42, "abcdef", 3, toks, 3), 0);
    rlai_msg m = mk(RLAI_MSG_TOKEN, 42);
    m.u.token.text = "abc";
    m.u.token.tokens = toks;
    m.u.token.n_tokens = 3;
    expect_same(&a, &m);
    ck_assert_int_eq(rlai_proto_encode_token(&a, 42, NULL, 0, NULL, 0), 0);
    m.u.token.text = "";
    m.u.token.n_tokens = 0;
    expect_same(&a, &m);

    rlai_msg_metrics mt = {1, 2, 3, 4, 5, 6, 7, 8, 9, ""};
    ck_assert_int_eq(rlai_proto_encode_done(&a, 7, "eog", &mt), 0);
    m = mk(RLAI_MSG_DONE, 7);
    m.u.done.stop = "eog";
    m.u.done.has_metrics = true;
    m.u.done.metrics = mt;
    expect_same(&a, &m);
    ck_assert_int_eq(rlai_proto_encode_done(&a, 7, NULL, NULL), 0);
    m.u.done.stop = "";
    m.u.done.has_metrics = false;
    expect_same(&a, &m);

    ck_assert_int_eq(rlai_proto_encode_error(&a, 8, RLAI_PE_BUSY, "too many"), 0);
    m = mk(RLAI_MSG_ERROR, 8);
    m.u.error.code = RLAI_PE_BUSY;
    m.u.error.name = "BUSY";
    m.u.error.msg = "too many";
    expect_same(&a, &m);

    static const unsigned char data[] = {0x92, 0x01, 0xa1, 'x'};
    ck_assert_int_eq(rlai_proto_encode_result(&a, 9, data, sizeof data), 0);
    m = mk(RLAI_MSG_RESULT, 9);
    m.u.result.data = (unsigned char *)data;
    m.u.result.len = sizeof data;
    expect_same(&a, &m);

    /* appending: two frames back to back in one buffer */
    ck_assert_int_eq(rlai_proto_encode_done(&a, 1, "", NULL), 0);
    size_t first = a.len;
    ck_assert_int_eq(rlai_proto_encode_done(&a, 2, "", NULL), 0);
    ck_assert_uint_eq(a.len, 2 * first);
    rlai_msg d;
    char err[128];
    ck_assert_int_eq(dec(a.data + first, first, &d, err, sizeof err), 0);
    ck_assert_uint_eq(d.id, 2);
    rlai_msg_free(&d);

    /* non-finite metrics are written as 0 */
    rlai_buf_reset(&a);
    rlai_msg_metrics bad = {NAN, INFINITY, -INFINITY, 2.5, 1, 1, 1, 0, 0, ""};
    ck_assert_int_eq(rlai_proto_encode_done(&a, 3, "eog", &bad), 0);
    ck_assert_int_eq(dec(a.data, a.len, &d, err, sizeof err), 0);
    ck_assert(d.u.done.metrics.queue_ms == 0 && d.u.done.metrics.ttft_ms == 0 &&
              d.u.done.metrics.prefill_tps == 0 && d.u.done.metrics.decode_tps == 2.5);
    rlai_msg_free(&d);

    /* error text: invalid UTF-8 replaced, over-long text cut */
    rlai_buf_reset(&a);
    ck_assert_int_eq(rlai_proto_encode_error(&a, 4, RLAI_PE_NOT_FOUND, "no file \xff\xc3(x\xe2\x82"), 0);
    ck_assert_int_eq(dec(a.data, a.len, &d, err, sizeof err), 0);
    ck_assert_str_eq(d.u.error.msg, "no file ?" "?(x?" "?");
    ck_assert_str_eq(d.u.error.name, "NOT_FOUND");
    rlai_msg_free(&d);
    rlai_buf_reset(&a);
    char *big = repeat('e', RLAI_PROTO_MAX_STR + 10);
    big[RLAI_PROTO_MAX_STR - 1] = '\xc3';   /* a character cut by the limit */
    ck_assert_int_eq(rlai_proto_encode_error(&a, 4, RLAI_PE_ENGINE, big), 0);
    ck_assert_int_eq(dec(a.data, a.len, &d, err, sizeof err), 0);
    ck_assert_uint_eq(strlen(d.u.error.msg), RLAI_PROTO_MAX_STR);
    ck_assert_int_eq(d.u.error.msg[RLAI_PROTO_MAX_STR - 1], '?');
    rlai_msg_free(&d);
    free(big);
    rlai_buf_free(&a);
}
END_TEST

/* Encoder refuses what the decoder would refuse; the buffer is untouched. */
static void expect_enc_fail(const rlai_msg *m, int code, const char *what)
{
    rlai_buf b;
    rlai_buf_init(&b);
    ck_assert_int_eq(rlai_proto_encode_done(&b, 1, "", NULL), 0);
    size_t len = b.len;
    unsigned char keep[64];
    memcpy(keep, b.data, len);
    int rc = rlai_proto_encode(m, &b);
    ck_assert_msg(rc == -code, "%s: encode gave %d, want %d", what, rc, -code);
    ck_assert_uint_eq(b.len, len);
    ck_assert_mem_eq(b.data, keep, len);
    rlai_buf_free(&b);
}

START_TEST(test_encoder_rejects)
{
    rlai_msg m = mk(RLAI_MSG_INVALID, 1);
    expect_enc_fail(&m, RLAI_PE_BAD_REQUEST, "invalid type");
    m.type = (rlai_msg_type)99;
    expect_enc_fail(&m, RLAI_PE_BAD_REQUEST, "type 99");
    ck_assert_int_eq(rlai_proto_encode(NULL, NULL), -RLAI_PE_BAD_REQUEST);

    m = mk(RLAI_MSG_GENERATE, 1);
    expect_enc_fail(&m, RLAI_PE_BAD_REQUEST, "NULL prompt");
    m.u.generate.prompt = "bad \xc0\x80";
    expect_enc_fail(&m, RLAI_PE_BAD_REQUEST, "overlong prompt");
    m.u.generate.prompt = "ok";
    rlai_msg_gen *g = &m.u.generate.gen;
    g->has_temperature = true;
    g->temperature = NAN;
    expect_enc_fail(&m, RLAI_PE_BAD_REQUEST, "NaN temperature");
    g->temperature = INFINITY;
    expect_enc_fail(&m, RLAI_PE_BAD_REQUEST, "inf temperature");
    g->temperature = -1;
    expect_enc_fail(&m, RLAI_PE_BAD_REQUEST, "negative temperature");
    g->temperature = 1;
    g->has_top_p = true;
    g->top_p = 1.5f;
    expect_enc_fail(&m, RLAI_PE_BAD_REQUEST, "top_p 1.5");
    g->top_p = 1;
    g->has_max_tokens = true;
    g->max_tokens = -1;
    expect_enc_fail(&m, RLAI_PE_BAD_REQUEST, "max_tokens -1");
    g->max_tokens = 1;
    char *stops[9] = {"a", "b", "c", "d", "e", "f", "g", "h", "i"};
    g->stop = stops;
    g->n_stop = 9;
    expect_enc_fail(&m, RLAI_PE_TOO_LARGE, "9 stops");
    g->n_stop = 1;
    stops[0] = "";
    expect_enc_fail(&m, RLAI_PE_BAD_REQUEST, "empty stop");
    char *long_stop = repeat('s', RLAI_PROTO_MAX_STOP_LEN + 1);
    stops[0] = long_stop;
    expect_enc_fail(&m, RLAI_PE_TOO_LARGE, "long stop");
    free(long_stop);
    stops[0] = NULL;
    expect_enc_fail(&m, RLAI_PE_BAD_REQUEST, "NULL stop");
    g->stop = NULL;
    expect_enc_fail(&m, RLAI_PE_BAD_REQUEST, "NULL stop array");
    g->n_stop = 0;
    char *big = repeat('p', RLAI_PROTO_MAX_STR + 1);
    m.u.generate.prompt = big;
    expect_enc_fail(&m, RLAI_PE_TOO_LARGE, "prompt over 1 MiB");
    free(big);

    m = mk(RLAI_MSG_CHAT, 1);
    expect_enc_fail(&m, RLAI_PE_BAD_REQUEST, "no messages");
    rlai_msg_chat_message msgs[257];
    for (int i = 0; i < 257; i++) msgs[i] = (rlai_msg_chat_message){"user", "x"};
    m.u.chat.messages = msgs;
    m.u.chat.n_messages = 257;
    expect_enc_fail(&m, RLAI_PE_TOO_LARGE, "257 messages");
    m.u.chat.n_messages = 2;
    msgs[1].role = "";
    expect_enc_fail(&m, RLAI_PE_BAD_REQUEST, "empty role");
    msgs[1].role = "user";
    msgs[1].content = NULL;
    expect_enc_fail(&m, RLAI_PE_BAD_REQUEST, "NULL content");

    m = mk(RLAI_MSG_CALL, 1);
    m.u.call.command = "";
    expect_enc_fail(&m, RLAI_PE_BAD_REQUEST, "empty command");

    m = mk(RLAI_MSG_TOKEN, 1);
    m.u.token.n_tokens = 3;
    expect_enc_fail(&m, RLAI_PE_BAD_REQUEST, "tokens NULL");
    m.u.token.n_tokens = RLAI_PROTO_MAX_TOKENS_ARRAY + 1;
    expect_enc_fail(&m, RLAI_PE_TOO_LARGE, "too many tokens");

    m = mk(RLAI_MSG_RESULT, 1);
    expect_enc_fail(&m, RLAI_PE_BAD_REQUEST, "no data");
    static const unsigned char two[] = {0x01, 0x02};
    m.u.result.data = (unsigned char *)two;
    m.u.result.len = 2;
    expect_enc_fail(&m, RLAI_PE_BAD_REQUEST, "two values");
    static const unsigned char cut[] = {0x92, 0x01};
    m.u.result.data = (unsigned char *)cut;
    expect_enc_fail(&m, RLAI_PE_BAD_REQUEST, "truncated data");
    unsigned char deep[RLAI_PROTO_MAX_DEPTH + 1];
    memset(deep, 0x91, sizeof deep);
    deep[RLAI_PROTO_MAX_DEPTH] = 0x90;
    m.u.result.data = deep;
    m.u.result.len = sizeof deep;
    expect_enc_fail(&m, RLAI_PE_TOO_LARGE, "data too deep");

    m = mk(RLAI_MSG_ERROR, 1);
    m.u.error.code = 0;
    expect_enc_fail(&m, RLAI_PE_BAD_REQUEST, "error code 0");
    m.u.error.code = 1;
    m.u.error.msg = "\xed\xa0\x80";
    expect_enc_fail(&m, RLAI_PE_BAD_REQUEST, "surrogate in msg");

    m = mk(RLAI_MSG_DONE, 1);
    m.u.done.stop = "\xff";
    expect_enc_fail(&m, RLAI_PE_BAD_REQUEST, "bad stop");

    rlai_buf b;
    rlai_buf_init(&b);
    ck_assert_int_eq(rlai_proto_encode_error(&b, 1, 0, "x"), -RLAI_PE_BAD_REQUEST);
    ck_assert_int_eq(rlai_proto_encode_error(&b, 1, -3, "x"), -RLAI_PE_BAD_REQUEST);
    ck_assert_int_eq(rlai_proto_encode_token(&b, 1, "\xff", 1, NULL, 0), -RLAI_PE_BAD_REQUEST);
    ck_assert_int_eq(rlai_proto_encode_token(&b, 1, NULL, 3, NULL, 0), -RLAI_PE_BAD_REQUEST);
    ck_assert_int_eq(rlai_proto_encode_token(&b, 1, "a\0b", 3, NULL, 0), -RLAI_PE_BAD_REQUEST);
    ck_assert_int_eq(rlai_proto_encode_result(&b, 1, NULL, 0), -RLAI_PE_BAD_REQUEST);
    ck_assert_int_eq(rlai_proto_encode_done(&b, 1, "\xc3", NULL), -RLAI_PE_BAD_REQUEST);
    ck_assert_uint_eq(b.len, 0);
    rlai_buf_free(&b);
}
END_TEST

/* ----------------------------------------------------- decoder leniency */

START_TEST(test_accepted_variants)
{
    rlai_msg m;
    char err[256];
    P p;

    /* every int width, fields in any order, unknown fields of every kind */
    p_init(&p);
    msgpack_pack_map(&p.pk, 9);
    s(&p, "prompt"); s(&p, "x");
    s(&p, "type"); s(&p, "generate");
    s(&p, "max_tokens"); raw(&p, "\xd3\x00\x00\x00\x00\x00\x00\x00\x05", 9);   /* int64 5 */
    s(&p, "id"); raw(&p, "\xcf\x00\x00\x00\x00\x00\x00\x01\x00", 9);           /* uint64 256 */
    s(&p, "v"); raw(&p, "\xd0\x01", 2);                                         /* int8 1 */
    s(&p, "temperature"); raw(&p, "\xca\x3f\x00\x00\x00", 5);                   /* float32 0.5 */
    s(&p, "top_p"); u(&p, 1);                                                   /* int for float */
    u(&p, 7); msgpack_pack_map(&p.pk, 1); bin(&p, "k"); msgpack_pack_array(&p.pk, 0);
    s(&p, "future_field"); raw(&p, "\xc7\x01\x05\xaa", 4);                      /* ext8 */
    ck_assert_msg(dec(p.sb.data, p.sb.size, &m, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(m.id, 256);
    ck_assert_int_eq(m.u.generate.gen.max_tokens, 5);
    ck_assert(m.u.generate.gen.temperature == 0.5f);
    ck_assert(m.u.generate.gen.top_p == 1.0f);
    rlai_msg_free(&m);
    p_done(&p);

    /* nil for optional fields means absent; nil params / client */
    p_init(&p);
    head(&p, 3, 3, "generate");
    s(&p, "prompt"); s(&p, "x");
    s(&p, "seed"); msgpack_pack_nil(&p.pk);
    s(&p, "stop"); msgpack_pack_nil(&p.pk);
    ck_assert_int_eq(dec(p.sb.data, p.sb.size, &m, err, sizeof err), 0);
    ck_assert(!m.u.generate.gen.has_seed && m.u.generate.gen.n_stop == 0);
    rlai_msg_free(&m);
    p_done(&p);
    p_init(&p);
    head(&p, 2, 3, "call");
    s(&p, "command"); s(&p, "c");
    s(&p, "params"); msgpack_pack_nil(&p.pk);
    ck_assert_int_eq(dec(p.sb.data, p.sb.size, &m, err, sizeof err), 0);
    ck_assert_ptr_null(m.u.call.params_json);
    ck_assert_uint_eq(m.u.call.timeout_ms, 0);
    /* call timeout_ms: a uint up to one day; over it, negative or a string is refused */
    {
        static const struct { int kind; int64_t v; int rc; } tc[] = {
            { 0, 250, 0 }, { 0, 86400000, 0 }, { 0, 86400001, -RLAI_PE_BAD_REQUEST },
            { 0, -1, -RLAI_PE_BAD_REQUEST }, { 1, 0, -RLAI_PE_BAD_REQUEST },
        };
        for (size_t i = 0; i < sizeof tc / sizeof tc[0]; i++) {
            rlai_msg t;
            P q;
            p_init(&q);
            head(&q, 2, 3, "call");
            s(&q, "command"); s(&q, "c");
            s(&q, "timeout_ms");
            if (tc[i].kind) s(&q, "250");
            else msgpack_pack_int64(&q.pk, tc[i].v);
            int rc = dec(q.sb.data, q.sb.size, &t, err, sizeof err);
            ck_assert_msg(rc == tc[i].rc, "case %zu: rc %d (%s)", i, rc, err);
            if (rc == 0) {
                ck_assert_uint_eq(t.u.call.timeout_ms, (uint32_t)tc[i].v);
                rlai_msg_free(&t);
            }
            p_done(&q);
        }
    }
    rlai_msg_free(&m);
    p_done(&p);

    /* a result's data may be nil; unknown keys in chat messages and metrics */
    p_init(&p);
    head(&p, 1, 3, "result");
    s(&p, "data"); msgpack_pack_nil(&p.pk);
    ck_assert_int_eq(dec(p.sb.data, p.sb.size, &m, err, sizeof err), 0);
    ck_assert_uint_eq(m.u.result.len, 1);
    ck_assert_int_eq(m.u.result.data[0], 0xc0);
    rlai_msg_free(&m);
    p_done(&p);
    p_init(&p);
    head(&p, 1, 3, "chat");
    s(&p, "messages"); msgpack_pack_array(&p.pk, 1);
    msgpack_pack_map(&p.pk, 3);
    s(&p, "name"); s(&p, "bob");
    s(&p, "content"); s(&p, "hi");
    s(&p, "role"); s(&p, "user");
    ck_assert_int_eq(dec(p.sb.data, p.sb.size, &m, err, sizeof err), 0);
    ck_assert_str_eq(m.u.chat.messages[0].content, "hi");
    rlai_msg_free(&m);
    p_done(&p);
    p_init(&p);
    head(&p, 2, 3, "done");
    s(&p, "stop"); s(&p, "a_future_reason");
    s(&p, "metrics"); msgpack_pack_map(&p.pk, 2);
    s(&p, "gen_tokens"); u(&p, 9);
    s(&p, "power_w"); f64(&p, 300.0);
    ck_assert_int_eq(dec(p.sb.data, p.sb.size, &m, err, sizeof err), 0);
    ck_assert(m.u.done.has_metrics && m.u.done.metrics.gen_tokens == 9 &&
              m.u.done.metrics.prompt_tokens == 0);
    rlai_msg_free(&m);
    p_done(&p);

    /* decoding into a message that holds garbage is fine (it is overwritten) */
    memset(&m, 0xab, sizeof m);
    load_vectors();
    const vec *v = find_vec("chat");
    ck_assert_ptr_nonnull(v);
    ck_assert_int_eq(dec(v->data, v->len, &m, NULL, 0), 0);
    rlai_msg_free(&m);
    rlai_msg_free(&m);   /* second free is harmless */
    rlai_msg_free(NULL);
    free_vectors();
}
END_TEST

START_TEST(test_limits_boundaries)
{
    rlai_msg m;
    char err[256];
    P p;

    /* strings of exactly 1 MiB pass; one byte more is TOO_LARGE */
    char *big = repeat('a', RLAI_PROTO_MAX_STR + 1);
    for (int extra = 0; extra <= 1; extra++) {
        p_init(&p);
        head(&p, 1, 5, "generate");
        s(&p, "prompt"); sn(&p, big, RLAI_PROTO_MAX_STR + (size_t)extra);
        int rc = dec(p.sb.data, p.sb.size, &m, err, sizeof err);
        ck_assert_int_eq(rc, extra ? -RLAI_PE_TOO_LARGE : 0);
        if (!rc) ck_assert_uint_eq(strlen(m.u.generate.prompt), RLAI_PROTO_MAX_STR);
        else ck_assert(m.id == 5 && m.type == RLAI_MSG_GENERATE);
        rlai_msg_free(&m);
        p_done(&p);
    }
    free(big);

    /* frame of 4 MiB + 1 */
    p_init(&p);
    head(&p, 1, 5, "result");
    s(&p, "data");
    size_t need = RLAI_PROTO_MAX_FRAME + 1 - p.sb.size - 5;
    char *blob = repeat('b', need);
    msgpack_pack_bin(&p.pk, need);
    msgpack_pack_bin_body(&p.pk, blob, need);
    ck_assert_uint_eq(p.sb.size, RLAI_PROTO_MAX_FRAME + 1);
    expect_fail(p.sb.data, p.sb.size, RLAI_PE_TOO_LARGE, 0, RLAI_MSG_INVALID, "frame 4 MiB + 1");
    /* ... and exactly 4 MiB is fine */
    ck_assert_int_eq(dec(p.sb.data, p.sb.size - 1, &m, err, sizeof err), -RLAI_PE_BAD_FRAME);
    p_done(&p);
    p_init(&p);
    head(&p, 1, 5, "result");
    s(&p, "data");
    msgpack_pack_bin(&p.pk, need - 1);
    msgpack_pack_bin_body(&p.pk, blob, need - 1);
    ck_assert_uint_eq(p.sb.size, RLAI_PROTO_MAX_FRAME);
    ck_assert_int_eq(dec(p.sb.data, p.sb.size, &m, err, sizeof err), 0);
    rlai_msg_free(&m);
    p_done(&p);
    free(blob);

    /* 8 stop strings of 256 bytes pass */
    char *st = repeat('s', RLAI_PROTO_MAX_STOP_LEN);
    p_init(&p);
    head(&p, 2, 5, "generate");
    s(&p, "prompt"); s(&p, "x");
    s(&p, "stop"); msgpack_pack_array(&p.pk, RLAI_PROTO_MAX_STOPS);
    for (int i = 0; i < RLAI_PROTO_MAX_STOPS; i++) s(&p, st);
    ck_assert_int_eq(dec(p.sb.data, p.sb.size, &m, err, sizeof err), 0);
    ck_assert_uint_eq(m.u.generate.gen.n_stop, RLAI_PROTO_MAX_STOPS);
    rlai_msg_free(&m);
    p_done(&p);
    free(st);

    /* 256 chat messages pass */
    p_init(&p);
    head(&p, 1, 5, "chat");
    s(&p, "messages"); msgpack_pack_array(&p.pk, RLAI_PROTO_MAX_MESSAGES);
    for (int i = 0; i < RLAI_PROTO_MAX_MESSAGES; i++) {
        msgpack_pack_map(&p.pk, 2);
        s(&p, "role"); s(&p, "user");
        s(&p, "content"); s(&p, "c");
    }
    ck_assert_int_eq(dec(p.sb.data, p.sb.size, &m, err, sizeof err), 0);
    ck_assert_uint_eq(m.u.chat.n_messages, RLAI_PROTO_MAX_MESSAGES);
    rlai_msg_free(&m);
    p_done(&p);

    /* 65536 token ids pass, 65537 do not */
    for (int extra = 0; extra <= 1; extra++) {
        p_init(&p);
        head(&p, 2, 5, "token");
        s(&p, "text"); s(&p, "");
        s(&p, "tokens"); msgpack_pack_array(&p.pk, RLAI_PROTO_MAX_TOKENS_ARRAY + (size_t)extra);
        for (int i = 0; i < RLAI_PROTO_MAX_TOKENS_ARRAY + extra; i++) msgpack_pack_int32(&p.pk, i * 3);
        int rc = dec(p.sb.data, p.sb.size, &m, err, sizeof err);
        ck_assert_int_eq(rc, extra ? -RLAI_PE_TOO_LARGE : 0);
        if (!rc) ck_assert_int_eq(m.u.token.tokens[65535], 65535 * 3);
        rlai_msg_free(&m);
        p_done(&p);
    }

    /* nesting: 16 levels inside a field pass, 17 do not */
    for (int extra = 0; extra <= 1; extra++) {
        p_init(&p);
        head(&p, 1, 5, "result");
        s(&p, "data");
        for (int i = 0; i < RLAI_PROTO_MAX_DEPTH + extra; i++) msgpack_pack_map(&p.pk, 1), s(&p, "k");
        u(&p, 1);
        int rc = dec(p.sb.data, p.sb.size, &m, err, sizeof err);
        ck_assert_int_eq(rc, extra ? -RLAI_PE_TOO_LARGE : 0);
        ck_assert_uint_eq(m.id, 5);
        rlai_msg_free(&m);
        p_done(&p);
    }
}
END_TEST

/* ------------------------------------------------------------ UTF-8 */

/* Minimal message of some type whose field `which` is the given string. */
enum sfield { SF_CLIENT, SF_PROMPT, SF_STOP, SF_ROLE, SF_CONTENT, SF_COMMAND, SF_PARAMS,
              SF_TOKENIZE_TEXT, SF_TOKEN_TEXT, SF_DONE_STOP, SF_ERR_NAME, SF_ERR_MSG, SF_COUNT };

static void build_with_str(P *p, enum sfield f, const char *str, size_t n)
{
    switch (f) {
    case SF_CLIENT: head(p, 1, 9, "hello"); s(p, "client"); sn(p, str, n); break;
    case SF_PROMPT: head(p, 1, 9, "generate"); s(p, "prompt"); sn(p, str, n); break;
    case SF_STOP:
        head(p, 2, 9, "generate"); s(p, "prompt"); s(p, "x");
        s(p, "stop"); msgpack_pack_array(&p->pk, 2); s(p, "ok"); sn(p, str, n);
        break;
    case SF_ROLE: case SF_CONTENT:
        head(p, 1, 9, "chat"); s(p, "messages"); msgpack_pack_array(&p->pk, 1);
        msgpack_pack_map(&p->pk, 2);
        s(p, "role"); if (f == SF_ROLE) sn(p, str, n); else s(p, "user");
        s(p, "content"); if (f == SF_CONTENT) sn(p, str, n); else s(p, "x");
        break;
    case SF_COMMAND: head(p, 1, 9, "call"); s(p, "command"); sn(p, str, n); break;
    case SF_PARAMS: head(p, 2, 9, "call"); s(p, "command"); s(p, "c"); s(p, "params"); sn(p, str, n); break;
    case SF_TOKENIZE_TEXT: head(p, 1, 9, "tokenize"); s(p, "text"); sn(p, str, n); break;
    case SF_TOKEN_TEXT:
        head(p, 2, 9, "token"); s(p, "text"); sn(p, str, n); s(p, "tokens"); msgpack_pack_array(&p->pk, 0);
        break;
    case SF_DONE_STOP: head(p, 1, 9, "done"); s(p, "stop"); sn(p, str, n); break;
    case SF_ERR_NAME:
        head(p, 3, 9, "error"); s(p, "code"); u(p, 1); s(p, "name"); sn(p, str, n); s(p, "msg"); s(p, "");
        break;
    default:
        head(p, 3, 9, "error"); s(p, "code"); u(p, 1); s(p, "name"); s(p, "N"); s(p, "msg"); sn(p, str, n);
        break;
    }
}

static const rlai_msg_type sfield_type[SF_COUNT] = {
    RLAI_MSG_HELLO, RLAI_MSG_GENERATE, RLAI_MSG_GENERATE, RLAI_MSG_CHAT, RLAI_MSG_CHAT, RLAI_MSG_CALL,
    RLAI_MSG_CALL, RLAI_MSG_TOKENIZE, RLAI_MSG_TOKEN, RLAI_MSG_DONE, RLAI_MSG_ERROR, RLAI_MSG_ERROR,
};

START_TEST(test_utf8_every_string_field)
{
    static const char *const bad[] = {
        "\x80",                 /* lone continuation */
        "a\xc3",                /* truncated 2-byte */
        "\xe2\x82",             /* truncated 3-byte */
        "\xc0\x80",             /* overlong NUL */
        "\xc1\xbf",             /* overlong 2-byte */
        "\xe0\x80\xaf",         /* overlong 3-byte '/' */
        "\xf0\x80\x80\xaf",     /* overlong 4-byte */
        "\xed\xa0\x80",         /* surrogate U+D800 */
        "\xed\xbf\xbf",         /* surrogate U+DFFF */
        "\xf4\x90\x80\x80",     /* U+110000 */
        "\xf5\x80\x80\x80",     /* lead byte F5 */
        "\xff",
        "ok\xe2\x28\xa1",       /* bad continuation */
    };
    static const char *const good[] = {
        "\x7f", "\xc2\x80", "\xdf\xbf", "\xe0\xa0\x80", "\xed\x9f\xbf", "\xee\x80\x80",
        "\xef\xbf\xbf", "\xf0\x90\x80\x80", "\xf4\x8f\xbf\xbf", "caf\xc3\xa9 \xe6\x97\xa5 \xf0\x9f\x98\x80",
    };
    for (int f = 0; f < SF_COUNT; f++) {
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            P p;
            p_init(&p);
            build_with_str(&p, (enum sfield)f, bad[i], strlen(bad[i]));
            char what[64];
            snprintf(what, sizeof what, "field %d bad utf8 %zu", f, i);
            expect_fail(p.sb.data, p.sb.size, RLAI_PE_BAD_REQUEST, 9, sfield_type[f], what);
            p_done(&p);
        }
        for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
            P p;
            p_init(&p);
            build_with_str(&p, (enum sfield)f, good[i], strlen(good[i]));
            rlai_msg m;
            char err[256];
            int rc = dec(p.sb.data, p.sb.size, &m, err, sizeof err);
            ck_assert_msg(rc == 0, "field %d good utf8 %zu: %s", f, i, err);
            rlai_msg_free(&m);
            p_done(&p);
        }
        /* an embedded NUL */
        {
            P p;
            p_init(&p);
            build_with_str(&p, (enum sfield)f, "a\0b", 3);
            char what[64];
            snprintf(what, sizeof what, "field %d with NUL", f);
            expect_fail(p.sb.data, p.sb.size, RLAI_PE_BAD_REQUEST, 9, sfield_type[f], what);
            p_done(&p);
        }
        /* bin instead of str */
        P p;
        p_init(&p);
        build_with_str(&p, (enum sfield)f, "ok", 2);
        /* patch the first "ok" str header (0xa2) that follows the field into bin8 */
        unsigned char *d = (unsigned char *)p.sb.data;
        size_t n = p.sb.size;
        unsigned char *q = NULL;
        for (size_t k = 0; k + 2 < n; k++)
            if (d[k] == 0xa2 && d[k + 1] == 'o' && d[k + 2] == 'k') { q = d + k; break; }
        ck_assert_ptr_nonnull(q);
        unsigned char *fixed = malloc(n + 1);
        size_t pre = (size_t)(q - d);
        memcpy(fixed, d, pre);
        fixed[pre] = 0xc4;
        fixed[pre + 1] = 2;
        memcpy(fixed + pre + 2, q + 1, n - pre - 1);
        char what[64];
        snprintf(what, sizeof what, "field %d as bin", f);
        expect_fail(fixed, n + 1, RLAI_PE_BAD_REQUEST, 9, sfield_type[f], what);
        free(fixed);
        p_done(&p);
    }
}
END_TEST

/* ------------------------------------------------------ malformed corpus */

typedef void (*build_fn)(P *p);

#define BC(name) static void bc_##name(P *p)

BC(empty) { (void)p; }
BC(top_array) { msgpack_pack_array(&p->pk, 2); u(p, 1); u(p, 2); }
BC(top_str) { s(p, "hello"); }
BC(top_nil) { msgpack_pack_nil(&p->pk); }
BC(top_int) { u(p, 1); }
BC(top_deep_arrays) { for (int i = 0; i < 1000; i++) msgpack_pack_array(&p->pk, 1); u(p, 1); }
BC(trailing_byte) { head(p, 0, 1, "stats"); raw(p, "\x00", 1); }
BC(two_messages) { head(p, 0, 1, "stats"); head(p, 0, 2, "stats"); }
BC(reserved_c1) { head(p, 1, 1, "hello"); s(p, "client"); raw(p, "\xc1", 1); }
BC(map32_huge) { raw(p, "\xdf\xff\xff\xff\xff\xa1v\x01", 8); }
BC(map16_huge) { raw(p, "\xde\xff\xff\xa1v\x01", 6); }
BC(array32_huge) { head(p, 1, 1, "chat"); s(p, "messages"); raw(p, "\xdd\xff\xff\xff\xff\x90", 6); }
BC(array16_huge) { head(p, 1, 1, "token"); s(p, "tokens"); raw(p, "\xdc\xff\xff\x01\x02", 5); }
BC(str32_huge) { head(p, 1, 1, "generate"); s(p, "prompt"); raw(p, "\xdb\xff\xff\xff\xff" "abc", 8); }
BC(bin32_huge) { head(p, 1, 1, "generate"); s(p, "x"); raw(p, "\xc6\x7f\xff\xff\xff\x00", 6); }
BC(ext32_huge) { head(p, 1, 1, "generate"); s(p, "x"); raw(p, "\xc9\xff\xff\xff\xff\x01\x00", 7); }
BC(key_str_huge) { raw(p, "\x81\xda\xff\xff", 4); }
BC(nested_huge) {
    head(p, 1, 1, "result"); s(p, "data");
    for (int i = 0; i < 10; i++) msgpack_pack_array(&p->pk, 1);
    raw(p, "\xdd\x7f\xff\xff\xff", 5);
}
BC(data_deep_1000) {
    head(p, 1, 11, "result"); s(p, "data");
    for (int i = 0; i < 1000; i++) msgpack_pack_array(&p->pk, 1);
    u(p, 1);
}
BC(unknown_deep_17) {
    msgpack_pack_map(&p->pk, 4);
    s(p, "junk");
    for (int i = 0; i < 17; i++) msgpack_pack_map(&p->pk, 1), u(p, 0);
    msgpack_pack_nil(&p->pk);
    s(p, "v"); u(p, 1); s(p, "id"); u(p, 12); s(p, "type"); s(p, "stats");
}
BC(deep_key) {
    msgpack_pack_map(&p->pk, 4);
    for (int i = 0; i < 40; i++) msgpack_pack_array(&p->pk, 1);
    u(p, 0); u(p, 0);
    s(p, "v"); u(p, 1); s(p, "id"); u(p, 13); s(p, "type"); s(p, "stats");
}
BC(missing_v) { msgpack_pack_map(&p->pk, 2); s(p, "id"); u(p, 3); s(p, "type"); s(p, "stats"); }
BC(v2) { msgpack_pack_map(&p->pk, 4); s(p, "v"); u(p, 2); s(p, "id"); u(p, 77); s(p, "type"); s(p, "generate"); s(p, "prompt"); s(p, "x"); }
BC(v0) { msgpack_pack_map(&p->pk, 3); s(p, "v"); u(p, 0); s(p, "id"); u(p, 78); s(p, "type"); s(p, "stats"); }
BC(v_str) { msgpack_pack_map(&p->pk, 3); s(p, "v"); s(p, "1"); s(p, "id"); u(p, 79); s(p, "type"); s(p, "stats"); }
BC(v_negative) { msgpack_pack_map(&p->pk, 3); s(p, "v"); i64(p, -1); s(p, "id"); u(p, 80); s(p, "type"); s(p, "stats"); }
BC(v_float) { msgpack_pack_map(&p->pk, 3); s(p, "v"); f64(p, 1.0); s(p, "id"); u(p, 81); s(p, "type"); s(p, "stats"); }
BC(v2_unknown_type) { msgpack_pack_map(&p->pk, 3); s(p, "v"); u(p, 2); s(p, "id"); u(p, 82); s(p, "type"); s(p, "newthing"); }
BC(missing_id) { msgpack_pack_map(&p->pk, 2); s(p, "v"); u(p, 1); s(p, "type"); s(p, "stats"); }
BC(negative_id) { msgpack_pack_map(&p->pk, 3); s(p, "v"); u(p, 1); s(p, "id"); i64(p, -5); s(p, "type"); s(p, "stats"); }
BC(id_str) { msgpack_pack_map(&p->pk, 3); s(p, "v"); u(p, 1); s(p, "id"); s(p, "5"); s(p, "type"); s(p, "stats"); }
BC(id_float) { msgpack_pack_map(&p->pk, 3); s(p, "v"); u(p, 1); s(p, "id"); f64(p, 5.0); s(p, "type"); s(p, "stats"); }
BC(missing_type) { msgpack_pack_map(&p->pk, 2); s(p, "v"); u(p, 1); s(p, "id"); u(p, 14); }
BC(type_bin) { msgpack_pack_map(&p->pk, 3); s(p, "v"); u(p, 1); s(p, "id"); u(p, 15); s(p, "type"); bin(p, "stats"); }
BC(type_int) { msgpack_pack_map(&p->pk, 3); s(p, "v"); u(p, 1); s(p, "id"); u(p, 16); s(p, "type"); u(p, 2); }
BC(unknown_type) { head(p, 0, 17, "foo"); }
BC(type_case) { head(p, 0, 18, "STATS"); }
BC(type_bad_utf8) { msgpack_pack_map(&p->pk, 3); s(p, "v"); u(p, 1); s(p, "id"); u(p, 19); s(p, "type"); sn(p, "st\xffts", 5); }
BC(dup_v) { msgpack_pack_map(&p->pk, 4); s(p, "v"); u(p, 1); s(p, "id"); u(p, 20); s(p, "type"); s(p, "stats"); s(p, "v"); u(p, 1); }
BC(dup_prompt) { head(p, 2, 21, "generate"); s(p, "prompt"); s(p, "a"); s(p, "prompt"); s(p, "b"); }
BC(gen_no_prompt) { head(p, 1, 22, "generate"); s(p, "max_tokens"); u(p, 5); }
BC(prompt_bin) { head(p, 1, 23, "generate"); s(p, "prompt"); bin(p, "hi"); }
BC(prompt_int) { head(p, 1, 24, "generate"); s(p, "prompt"); u(p, 1); }
BC(prompt_nil) { head(p, 1, 25, "generate"); s(p, "prompt"); msgpack_pack_nil(&p->pk); }
BC(prompt_array) { head(p, 1, 26, "generate"); s(p, "prompt"); msgpack_pack_array(&p->pk, 1); s(p, "x"); }
#define GEN1(name, id, key, val)                                                   \
    BC(name) { head(p, 2, id, "generate"); s(p, "prompt"); s(p, "x"); s(p, key); val; }
GEN1(max_tokens_str, 30, "max_tokens", s(p, "5"))
GEN1(max_tokens_negative, 31, "max_tokens", i64(p, -1))
GEN1(max_tokens_2p31, 32, "max_tokens", u(p, UINT64_C(1) << 31))
GEN1(max_tokens_float, 33, "max_tokens", f64(p, 5.0))
GEN1(temperature_str, 34, "temperature", s(p, "0.5"))
GEN1(temperature_nan, 35, "temperature", f64(p, NAN))
GEN1(temperature_inf32, 36, "temperature", msgpack_pack_float(&p->pk, INFINITY))
GEN1(temperature_negative, 37, "temperature", f64(p, -0.5))
GEN1(temperature_1e300, 38, "temperature", f64(p, 1e300))
GEN1(top_p_1_5, 39, "top_p", f64(p, 1.5))
GEN1(min_p_negative, 40, "min_p", i64(p, -1))
GEN1(top_k_float, 41, "top_k", f64(p, 40.0))
GEN1(top_k_negative, 42, "top_k", i64(p, -40))
GEN1(repeat_penalty_nan32, 43, "repeat_penalty", msgpack_pack_float(&p->pk, NAN))
GEN1(presence_penalty_inf, 44, "presence_penalty", f64(p, -INFINITY))
GEN1(frequency_penalty_bool, 45, "frequency_penalty", msgpack_pack_true(&p->pk))
GEN1(seed_negative, 46, "seed", i64(p, -1))
GEN1(seed_str, 47, "seed", s(p, "42"))
GEN1(ignore_eos_int, 48, "ignore_eos", u(p, 1))
GEN1(stop_str, 49, "stop", s(p, "\n"))
GEN1(stop_int_elem, 50, "stop", (msgpack_pack_array(&p->pk, 2), s(p, "a"), u(p, 1)))
GEN1(stop_bin_elem, 51, "stop", (msgpack_pack_array(&p->pk, 1), bin(p, "a")))
GEN1(stop_empty_elem, 52, "stop", (msgpack_pack_array(&p->pk, 1), s(p, "")))
GEN1(stop_nil_elem, 53, "stop", (msgpack_pack_array(&p->pk, 1), msgpack_pack_nil(&p->pk)))
GEN1(timeout_ms_negative, 160, "timeout_ms", i64(p, -1))
GEN1(timeout_ms_str, 161, "timeout_ms", s(p, "100"))
GEN1(timeout_ms_2p32, 162, "timeout_ms", u(p, UINT64_C(1) << 32))
GEN1(timeout_ms_float, 163, "timeout_ms", f64(p, 100.0))
GEN1(spec_unknown, 164, "spec", s(p, "fast"))
GEN1(spec_self, 165, "spec", s(p, "self"))
GEN1(spec_int, 166, "spec", u(p, 2))
GEN1(spec_max_draft_0, 167, "spec_max_draft", u(p, 0))
GEN1(spec_max_draft_17, 168, "spec_max_draft", u(p, 17))
GEN1(top_logprobs_21, 169, "top_logprobs", u(p, 21))
GEN1(top_logprobs_negative, 170, "top_logprobs", i64(p, -1))
GEN1(prompt_logprobs_without_top, 171, "prompt_logprobs", msgpack_pack_true(&p->pk))
GEN1(prompt_logprobs_int, 172, "prompt_logprobs", u(p, 1))
GEN1(logit_bias_array, 173, "logit_bias", (msgpack_pack_array(&p->pk, 1), u(p, 1)))
GEN1(logit_bias_negative_key, 174, "logit_bias", (msgpack_pack_map(&p->pk, 1), i64(p, -1), f64(p, 1.0)))
GEN1(logit_bias_word_key, 175, "logit_bias", (msgpack_pack_map(&p->pk, 1), s(p, "12a"), f64(p, 1.0)))
GEN1(logit_bias_2p31_key, 176, "logit_bias", (msgpack_pack_map(&p->pk, 1), u(p, UINT64_C(1) << 31), f64(p, 1.0)))
GEN1(logit_bias_101, 177, "logit_bias", (msgpack_pack_map(&p->pk, 1), u(p, 5), u(p, 101)))
GEN1(logit_bias_nan, 178, "logit_bias", (msgpack_pack_map(&p->pk, 1), s(p, "5"), f64(p, NAN)))
GEN1(logit_bias_str_value, 179, "logit_bias", (msgpack_pack_map(&p->pk, 1), u(p, 5), s(p, "1")))
GEN1(prediction_bin, 181, "prediction", (msgpack_pack_bin(&p->pk, 1), msgpack_pack_bin_body(&p->pk, "x", 1)))
GEN1(prediction_map, 182, "prediction", msgpack_pack_map(&p->pk, 0))
BC(logit_bias_1025) {
    head(p, 2, 180, "generate"); s(p, "prompt"); s(p, "x");
    s(p, "logit_bias"); msgpack_pack_map(&p->pk, 1025);
    for (int i = 0; i < 1025; i++) { u(p, (uint64_t)i); f64(p, 1.0); }
}
BC(stop_9) {
    head(p, 2, 54, "generate"); s(p, "prompt"); s(p, "x");
    s(p, "stop"); msgpack_pack_array(&p->pk, 9);
    for (int i = 0; i < 9; i++) s(p, "s");
}
BC(stop_257_bytes) {
    char b[258];
    memset(b, 's', 257);
    b[257] = 0;
    head(p, 2, 55, "generate"); s(p, "prompt"); s(p, "x");
    s(p, "stop"); msgpack_pack_array(&p->pk, 1); s(p, b);
}
BC(chat_no_messages) { head(p, 0, 60, "chat"); }
BC(chat_empty) { head(p, 1, 61, "chat"); s(p, "messages"); msgpack_pack_array(&p->pk, 0); }
BC(chat_257) {
    head(p, 1, 62, "chat"); s(p, "messages"); msgpack_pack_array(&p->pk, 257);
    for (int i = 0; i < 257; i++) { msgpack_pack_map(&p->pk, 2); s(p, "role"); s(p, "user"); s(p, "content"); s(p, "x"); }
}
BC(chat_messages_map) { head(p, 1, 63, "chat"); s(p, "messages"); msgpack_pack_map(&p->pk, 1); s(p, "role"); s(p, "user"); }
BC(chat_elem_str) { head(p, 1, 64, "chat"); s(p, "messages"); msgpack_pack_array(&p->pk, 1); s(p, "hi"); }
BC(chat_no_content) {
    head(p, 1, 65, "chat"); s(p, "messages"); msgpack_pack_array(&p->pk, 1);
    msgpack_pack_map(&p->pk, 1); s(p, "role"); s(p, "user");
}
BC(chat_no_role) {
    head(p, 1, 66, "chat"); s(p, "messages"); msgpack_pack_array(&p->pk, 1);
    msgpack_pack_map(&p->pk, 1); s(p, "content"); s(p, "x");
}
BC(chat_role_bin) {
    head(p, 1, 67, "chat"); s(p, "messages"); msgpack_pack_array(&p->pk, 1);
    msgpack_pack_map(&p->pk, 2); s(p, "role"); bin(p, "user"); s(p, "content"); s(p, "x");
}
BC(chat_role_empty) {
    head(p, 1, 68, "chat"); s(p, "messages"); msgpack_pack_array(&p->pk, 1);
    msgpack_pack_map(&p->pk, 2); s(p, "role"); s(p, ""); s(p, "content"); s(p, "x");
}
BC(chat_dup_role) {
    head(p, 1, 69, "chat"); s(p, "messages"); msgpack_pack_array(&p->pk, 1);
    msgpack_pack_map(&p->pk, 3); s(p, "role"); s(p, "user"); s(p, "content"); s(p, "x"); s(p, "role"); s(p, "system");
}
BC(chat_content_int) {
    head(p, 1, 70, "chat"); s(p, "messages"); msgpack_pack_array(&p->pk, 2);
    msgpack_pack_map(&p->pk, 2); s(p, "role"); s(p, "user"); s(p, "content"); s(p, "x");
    msgpack_pack_map(&p->pk, 2); s(p, "role"); s(p, "user"); s(p, "content"); u(p, 7);
}
BC(chat_bad_temperature) {
    head(p, 2, 71, "chat"); s(p, "messages"); msgpack_pack_array(&p->pk, 1);
    msgpack_pack_map(&p->pk, 2); s(p, "role"); s(p, "user"); s(p, "content"); s(p, "x");
    s(p, "temperature"); f64(p, NAN);
}
BC(call_no_command) { head(p, 1, 80, "call"); s(p, "params"); s(p, "{}"); }
BC(call_params_map) { head(p, 2, 81, "call"); s(p, "command"); s(p, "c"); s(p, "params"); msgpack_pack_map(&p->pk, 0); }
BC(call_command_empty) { head(p, 1, 82, "call"); s(p, "command"); s(p, ""); }
BC(cancel_no_target) { head(p, 0, 90, "cancel"); }
BC(cancel_target_negative) { head(p, 1, 91, "cancel"); s(p, "target"); i64(p, -2); }
BC(cancel_target_str) { head(p, 1, 92, "cancel"); s(p, "target"); s(p, "2"); }
BC(tokenize_no_text) { head(p, 1, 100, "tokenize"); s(p, "add_special"); msgpack_pack_true(&p->pk); }
BC(tokenize_add_special_str) { head(p, 2, 101, "tokenize"); s(p, "text"); s(p, "x"); s(p, "add_special"); s(p, "yes"); }
BC(token_no_tokens) { head(p, 1, 110, "token"); s(p, "text"); s(p, "x"); }
BC(token_str_elem) { head(p, 2, 111, "token"); s(p, "text"); s(p, "x"); s(p, "tokens"); msgpack_pack_array(&p->pk, 1); s(p, "1"); }
BC(token_id_2p31) { head(p, 2, 112, "token"); s(p, "text"); s(p, "x"); s(p, "tokens"); msgpack_pack_array(&p->pk, 1); u(p, UINT64_C(1) << 31); }
BC(token_tokens_int) { head(p, 2, 113, "token"); s(p, "text"); s(p, "x"); s(p, "tokens"); u(p, 1); }
BC(result_no_data) { head(p, 0, 120, "result"); }
BC(result_dup_data) { head(p, 2, 121, "result"); s(p, "data"); u(p, 1); s(p, "data"); u(p, 2); }
BC(done_no_stop) { head(p, 0, 130, "done"); }
BC(done_stop_int) { head(p, 1, 131, "done"); s(p, "stop"); u(p, 1); }
BC(done_metrics_array) { head(p, 2, 132, "done"); s(p, "stop"); s(p, ""); s(p, "metrics"); msgpack_pack_array(&p->pk, 0); }
BC(done_metrics_negative) {
    head(p, 2, 133, "done"); s(p, "stop"); s(p, "eog"); s(p, "metrics");
    msgpack_pack_map(&p->pk, 1); s(p, "gen_tokens"); i64(p, -1);
}
BC(done_metrics_2p32) {
    head(p, 2, 134, "done"); s(p, "stop"); s(p, "eog"); s(p, "metrics");
    msgpack_pack_map(&p->pk, 1); s(p, "prompt_tokens"); u(p, UINT64_C(1) << 32);
}
BC(done_metrics_ttft_str) {
    head(p, 2, 135, "done"); s(p, "stop"); s(p, "eog"); s(p, "metrics");
    msgpack_pack_map(&p->pk, 1); s(p, "ttft_ms"); s(p, "1");
}
BC(error_code_0) { head(p, 3, 140, "error"); s(p, "code"); u(p, 0); s(p, "name"); s(p, "X"); s(p, "msg"); s(p, ""); }
BC(error_code_negative) { head(p, 3, 141, "error"); s(p, "code"); i64(p, -3); s(p, "name"); s(p, "X"); s(p, "msg"); s(p, ""); }
BC(error_no_name) { head(p, 2, 142, "error"); s(p, "code"); u(p, 3); s(p, "msg"); s(p, ""); }
BC(error_no_msg) { head(p, 2, 143, "error"); s(p, "code"); u(p, 3); s(p, "name"); s(p, "X"); }
BC(hello_client_257) {
    char b[258];
    memset(b, 'c', 257);
    b[257] = 0;
    head(p, 1, 150, "hello"); s(p, "client"); s(p, b);
}
BC(hello_client_int) { head(p, 1, 151, "hello"); s(p, "client"); u(p, 1); }

typedef struct bad_case {
    const char *name;
    build_fn build;
    int code;
    uint64_t id;
    rlai_msg_type type;
} bad_case;

#define F RLAI_PE_BAD_FRAME
#define V RLAI_PE_BAD_VERSION
#define R RLAI_PE_BAD_REQUEST
#define L RLAI_PE_TOO_LARGE
#define C(name, code, id, type) {#name, bc_##name, code, id, RLAI_MSG_##type}
static const bad_case bad_cases[] = {
    C(empty, F, 0, INVALID),
    C(top_array, F, 0, INVALID),
    C(top_str, F, 0, INVALID),
    C(top_nil, F, 0, INVALID),
    C(top_int, F, 0, INVALID),
    C(top_deep_arrays, F, 0, INVALID),
    C(trailing_byte, F, 1, STATS),
    C(two_messages, F, 1, STATS),
    C(reserved_c1, F, 1, HELLO),
    C(map32_huge, F, 0, INVALID),
    C(map16_huge, F, 0, INVALID),
    C(array32_huge, F, 1, CHAT),
    C(array16_huge, F, 1, TOKEN),
    C(str32_huge, F, 1, GENERATE),
    C(bin32_huge, F, 1, GENERATE),
    C(ext32_huge, F, 1, GENERATE),
    C(key_str_huge, F, 0, INVALID),
    C(nested_huge, F, 1, RESULT),
    C(data_deep_1000, L, 11, RESULT),
    C(unknown_deep_17, L, 12, STATS),
    C(deep_key, L, 13, STATS),
    C(missing_v, V, 3, STATS),
    C(v2, V, 77, GENERATE),
    C(v0, V, 78, STATS),
    C(v_str, V, 79, STATS),
    C(v_negative, V, 80, STATS),
    C(v_float, V, 81, STATS),
    C(v2_unknown_type, V, 82, INVALID),
    C(missing_id, R, 0, STATS),
    C(negative_id, R, 0, STATS),
    C(id_str, R, 0, STATS),
    C(id_float, R, 0, STATS),
    C(missing_type, R, 14, INVALID),
    C(type_bin, R, 15, INVALID),
    C(type_int, R, 16, INVALID),
    C(unknown_type, R, 17, INVALID),
    C(type_case, R, 18, INVALID),
    C(type_bad_utf8, R, 19, INVALID),
    C(dup_v, R, 20, STATS),
    C(dup_prompt, R, 21, GENERATE),
    C(gen_no_prompt, R, 22, GENERATE),
    C(prompt_bin, R, 23, GENERATE),
    C(prompt_int, R, 24, GENERATE),
    C(prompt_nil, R, 25, GENERATE),
    C(prompt_array, R, 26, GENERATE),
    C(max_tokens_str, R, 30, GENERATE),
    C(max_tokens_negative, R, 31, GENERATE),
    C(max_tokens_2p31, R, 32, GENERATE),
    C(max_tokens_float, R, 33, GENERATE),
    C(temperature_str, R, 34, GENERATE),
    C(temperature_nan, R, 35, GENERATE),
    C(temperature_inf32, R, 36, GENERATE),
    C(temperature_negative, R, 37, GENERATE),
    C(temperature_1e300, R, 38, GENERATE),
    C(top_p_1_5, R, 39, GENERATE),
    C(min_p_negative, R, 40, GENERATE),
    C(top_k_float, R, 41, GENERATE),
    C(top_k_negative, R, 42, GENERATE),
    C(repeat_penalty_nan32, R, 43, GENERATE),
    C(presence_penalty_inf, R, 44, GENERATE),
    C(frequency_penalty_bool, R, 45, GENERATE),
    C(seed_negative, R, 46, GENERATE),
    C(seed_str, R, 47, GENERATE),
    C(ignore_eos_int, R, 48, GENERATE),
    C(stop_str, R, 49, GENERATE),
    C(stop_int_elem, R, 50, GENERATE),
    C(stop_bin_elem, R, 51, GENERATE),
    C(stop_empty_elem, R, 52, GENERATE),
    C(stop_nil_elem, R, 53, GENERATE),
    C(timeout_ms_negative, R, 160, GENERATE),
    C(timeout_ms_str, R, 161, GENERATE),
    C(timeout_ms_2p32, R, 162, GENERATE),
    C(timeout_ms_float, R, 163, GENERATE),
    C(spec_unknown, R, 164, GENERATE),
    C(spec_self, R, 165, GENERATE),
    C(spec_int, R, 166, GENERATE),
    C(spec_max_draft_0, R, 167, GENERATE),
    C(spec_max_draft_17, R, 168, GENERATE),
    C(top_logprobs_21, R, 169, GENERATE),
    C(top_logprobs_negative, R, 170, GENERATE),
    C(prompt_logprobs_without_top, R, 171, GENERATE),
    C(prompt_logprobs_int, R, 172, GENERATE),
    C(logit_bias_array, R, 173, GENERATE),
    C(logit_bias_negative_key, R, 174, GENERATE),
    C(logit_bias_word_key, R, 175, GENERATE),
    C(logit_bias_2p31_key, R, 176, GENERATE),
    C(logit_bias_101, R, 177, GENERATE),
    C(logit_bias_nan, R, 178, GENERATE),
    C(logit_bias_str_value, R, 179, GENERATE),
    C(logit_bias_1025, L, 180, GENERATE),
    C(prediction_bin, R, 181, GENERATE),
    C(prediction_map, R, 182, GENERATE),
    C(stop_9, L, 54, GENERATE),
    C(stop_257_bytes, L, 55, GENERATE),
    C(chat_no_messages, R, 60, CHAT),
    C(chat_empty, R, 61, CHAT),
    C(chat_257, L, 62, CHAT),
    C(chat_messages_map, R, 63, CHAT),
    C(chat_elem_str, R, 64, CHAT),
    C(chat_no_content, R, 65, CHAT),
    C(chat_no_role, R, 66, CHAT),
    C(chat_role_bin, R, 67, CHAT),
    C(chat_role_empty, R, 68, CHAT),
    C(chat_dup_role, R, 69, CHAT),
    C(chat_content_int, R, 70, CHAT),
    C(chat_bad_temperature, R, 71, CHAT),
    C(call_no_command, R, 80, CALL),
    C(call_params_map, R, 81, CALL),
    C(call_command_empty, R, 82, CALL),
    C(cancel_no_target, R, 90, CANCEL),
    C(cancel_target_negative, R, 91, CANCEL),
    C(cancel_target_str, R, 92, CANCEL),
    C(tokenize_no_text, R, 100, TOKENIZE),
    C(tokenize_add_special_str, R, 101, TOKENIZE),
    C(token_no_tokens, R, 110, TOKEN),
    C(token_str_elem, R, 111, TOKEN),
    C(token_id_2p31, R, 112, TOKEN),
    C(token_tokens_int, R, 113, TOKEN),
    C(result_no_data, R, 120, RESULT),
    C(result_dup_data, R, 121, RESULT),
    C(done_no_stop, R, 130, DONE),
    C(done_stop_int, R, 131, DONE),
    C(done_metrics_array, R, 132, DONE),
    C(done_metrics_negative, R, 133, DONE),
    C(done_metrics_2p32, R, 134, DONE),
    C(done_metrics_ttft_str, R, 135, DONE),
    C(error_code_0, R, 140, ERROR),
    C(error_code_negative, R, 141, ERROR),
    C(error_no_name, R, 142, ERROR),
    C(error_no_msg, R, 143, ERROR),
    C(hello_client_257, L, 150, HELLO),
    C(hello_client_int, R, 151, HELLO),
};
#undef C
#undef F
#undef V
#undef R
#undef L
#define N_BAD ((int)(sizeof bad_cases / sizeof bad_cases[0]))

START_TEST(test_malformed_corpus)
{
    const bad_case *bc = &bad_cases[_i];
    P p;
    p_init(&p);
    bc->build(&p);
    expect_fail(p.sb.data, p.sb.size, bc->code, bc->id, bc->type, bc->name);
    /* no error buffer at all is fine too */
    rlai_msg m;
    ck_assert_int_eq(dec(p.sb.data, p.sb.size, &m, NULL, 0), -bc->code);
    char tiny[1];
    ck_assert_int_eq(dec(p.sb.data, p.sb.size, &m, tiny, 1), -bc->code);
    ck_assert_int_eq(tiny[0], '\0');
    p_done(&p);
}
END_TEST

START_TEST(test_names)
{
    ck_assert_str_eq(rlai_proto_code_name(RLAI_PE_BAD_FRAME), "BAD_FRAME");
    ck_assert_str_eq(rlai_proto_code_name(RLAI_PE_DUPLICATE_ID), "DUPLICATE_ID");
    ck_assert_str_eq(rlai_proto_code_name(RLAI_PE_NOT_IMPLEMENTED), "NOT_IMPLEMENTED");
    ck_assert_str_eq(rlai_proto_code_name(0), "UNKNOWN");
    ck_assert_str_eq(rlai_proto_code_name(-1), "UNKNOWN");
    ck_assert_str_eq(rlai_proto_code_name(RLAI_PE_TIMEOUT), "TIMEOUT");
    ck_assert_str_eq(rlai_proto_code_name(15), "UNKNOWN");
    for (int c = 1; c <= 14; c++) ck_assert_str_ne(rlai_proto_code_name(c), "UNKNOWN");
    ck_assert_ptr_null(rlai_msg_type_name(RLAI_MSG_INVALID));
    ck_assert_ptr_null(rlai_msg_type_name((rlai_msg_type)13));
    ck_assert_ptr_null(rlai_msg_type_name((rlai_msg_type)-1));
    ck_assert_str_eq(rlai_msg_type_name(RLAI_MSG_TOKENIZE), "tokenize");
    ck_assert_str_eq(rlai_msg_type_name(RLAI_MSG_ERROR), "error");
    /* every code named in PROTOCOL.md's table */
    FILE *f = fopen(RLAI_SOURCE_DIR "/proto/PROTOCOL.md", "r");
    ck_assert_ptr_nonnull(f);
    static char text[65536];
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    for (int c = 1; c <= 14; c++) {
        char row[64];
        snprintf(row, sizeof row, "| %-4d | `%s`", c, rlai_proto_code_name(c));
        ck_assert_msg(strstr(text, row) != NULL, "PROTOCOL.md lacks row '%s'", row);
    }

    rlai_buf b;
    rlai_buf_init(&b);
    rlai_buf_reset(&b);
    rlai_buf_free(&b);
    rlai_buf_free(NULL);
    rlai_buf_init(NULL);
    rlai_buf_reset(NULL);
    rlai_msg m;
    ck_assert_int_eq(rlai_proto_decode(NULL, 5, &m, NULL, 0), -RLAI_PE_BAD_FRAME);
    ck_assert_int_eq(rlai_proto_decode("\x80", 1, NULL, NULL, 0), -RLAI_PE_INTERNAL);
}
END_TEST

static Suite *proto_suite(void)
{
    Suite *su = suite_create("proto");
    TCase *tc = tcase_create("vectors");
    tcase_add_test(tc, test_vectors_both_ways);
    tcase_add_test(tc, test_vectors_truncated);
    suite_add_tcase(su, tc);
    tc = tcase_create("codec");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_roundtrip_every_type);
    tcase_add_test(tc, test_model_and_route_options);
    tcase_add_test(tc, test_convenience_encoders);
    tcase_add_test(tc, test_token_logprobs_frame);
    tcase_add_test(tc, test_prompt_logprobs_frame);
    tcase_add_test(tc, test_token_text_logprobs_frame);
    tcase_add_test(tc, test_encoder_rejects);
    tcase_add_test(tc, test_accepted_variants);
    tcase_add_test(tc, test_limits_boundaries);
    tcase_add_test(tc, test_utf8_every_string_field);
    tcase_add_test(tc, test_names);
    suite_add_tcase(su, tc);
    tc = tcase_create("malformed");
    tcase_add_loop_test(tc, test_malformed_corpus, 0, N_BAD);
    suite_add_tcase(su, tc);
    return su;
}

int main(void)
{
    SRunner *sr = srunner_create(proto_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
