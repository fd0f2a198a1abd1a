/* good.c - a well-behaved test plugin exercising the whole host API:
 * echo, streaming, errors, engine jobs, cancellation, late registration,
 * config and fini. Built as a real shared module (tests/plugins/). */
#include <rlai/plugin.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

RLAI_PLUGIN_DECLARE();

static const rlai_host_api *H;
static rlai_plugin *SELF;

typedef struct state {
    char fini_marker[512];
} state;

static int cmd_echo(rlai_call *call, const cJSON *params, void *user)
{
    (void)user;
    cJSON *r = cJSON_CreateObject();
    cJSON_AddItemToObject(r, "params", cJSON_Duplicate(params, true));
    cJSON_AddStringToObject(r, "host", H->host_version());
    return H->reply_json(call, r);
}

static int cmd_stream(rlai_call *call, const cJSON *params, void *user)
{
    (void)user;
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(params, "pieces");
    int pieces = cJSON_IsNumber(n) ? (int)n->valuedouble : 3;
    if (pieces < 0 || pieces > 1000)
        return H->reply_error(call, RLAI_ERR_INVALID_ARG, "pieces must be in [0, 1000], got %d", pieces);
    for (int i = 0; i < pieces; i++) {
        char buf[32];
        int len = snprintf(buf, sizeof(buf), "piece%d ", i);
        if (H->stream_text(call, buf, (size_t)len) < 0)
            return RLAI_ERR_CANCELLED;
    }
    cJSON *r = cJSON_CreateObject();
    cJSON_AddNumberToObject(r, "pieces", pieces);
    H->reply_json(call, r);
    cJSON *r2 = cJSON_CreateArray();
    cJSON_AddItemToArray(r2, cJSON_CreateString("second result"));
    return H->reply_json(call, r2);
}

static int cmd_fail(rlai_call *call, const cJSON *params, void *user)
{
    (void)user;
    const cJSON *how = cJSON_GetObjectItemCaseSensitive(params, "how");
    if (cJSON_IsString(how) && strcmp(how->valuestring, "return") == 0)
        return RLAI_ERR_NOT_FOUND;   /* host makes the message */
    return H->reply_error(call, RLAI_ERR_INVALID_ARG, "good.fail was asked to fail");
}

static int cmd_generate(rlai_call *call, const cJSON *params, void *user)
{
    (void)user;
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(params, "prompt");
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(params, "max_tokens");
    if (!cJSON_IsString(p))
        return H->reply_error(call, RLAI_ERR_INVALID_ARG, "prompt (string) is required");
    rlai_plugin_message msgs[1] = { { "user", p->valuestring } };
    rlai_gen_request req;
    memset(&req, 0, sizeof(req));
    req.messages = msgs;
    req.n_messages = 1;
    req.max_tokens = cJSON_IsNumber(n) ? (int)n->valuedouble : 16;
    req.stream = true;
    const cJSON *rf = cJSON_GetObjectItemCaseSensitive(params, "response_format");
    char *rft = cJSON_IsObject(rf) ? cJSON_PrintUnformatted(rf) : NULL;
    req.response_format = rft;
    /* since ABI 1.4: a predicted output and a banned token */
    const cJSON *pred = cJSON_GetObjectItemCaseSensitive(params, "prediction");
    req.prediction = cJSON_IsString(pred) ? pred->valuestring : NULL;
    const cJSON *ban = cJSON_GetObjectItemCaseSensitive(params, "ban");
    rlai_plugin_logit_bias lb = { cJSON_IsNumber(ban) ? (int32_t)ban->valuedouble : 0, -100.0f };
    if (cJSON_IsNumber(ban)) {
        req.logit_bias = &lb;
        req.n_logit_bias = 1;
    }

    rlai_gen_result res;
    int rc = H->generate(call, &req, sizeof(req), &res);
    free(rft);
    if (rc < 0)
        return H->reply_error(call, rc, "generate failed: %s", H->strerror(rc));
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "text", res.text);
    cJSON_AddNumberToObject(r, "prompt_tokens", res.prompt_tokens);
    cJSON_AddNumberToObject(r, "reused_tokens", res.reused_tokens);
    cJSON_AddNumberToObject(r, "gen_tokens", res.gen_tokens);
    cJSON_AddNumberToObject(r, "drafted_tokens", res.drafted_tokens);
    cJSON_AddNumberToObject(r, "accepted_tokens", res.accepted_tokens);
    cJSON_AddStringToObject(r, "stop", res.stop);
    H->free(res.text);
    return H->reply_json(call, r);
}

/* Waits until cancelled (or 30 s), then says how it ended. */
static int cmd_slow(rlai_call *call, const cJSON *params, void *user)
{
    (void)params;
    (void)user;
    for (int i = 0; i < 3000 && !H->cancelled(call); i++) {
        struct timespec ts = { 0, 10 * 1000 * 1000 };
        nanosleep(&ts, NULL);
    }
    return H->cancelled(call) ? RLAI_ERR_CANCELLED : 0;
}

/* Tries to register a command after init: must be refused (BUSY). */
static int cmd_late(rlai_call *call, const cJSON *params, void *user)
{
    (void)params;
    (void)user;
    rlai_command_desc d = { .name = "good.later", .description = "never", .handler = cmd_echo };
    int rc = H->register_command(SELF, &d, sizeof(d));
    cJSON *r = cJSON_CreateObject();
    cJSON_AddNumberToObject(r, "rc", rc);
    return H->reply_json(call, r);
}

/* register_chat_model results at init (good.info reports them). */
static int chat_model_rcs[5];

static int cmd_info(rlai_call *call, const cJSON *params, void *user)
{
    (void)params;
    (void)user;
    cJSON *r = cJSON_CreateObject();
    cJSON_AddItemToObject(r, "config", cJSON_Duplicate(H->config(SELF), true));
    cJSON_AddStringToObject(r, "dir", H->plugin_dir(SELF));
    cJSON_AddBoolToObject(r, "has_gguf_describe", RLAI_HOST_HAS(H, gguf_describe));
    cJSON_AddNumberToObject(r, "abi_version", H->abi_version);
    cJSON *mi = NULL;
    int rc = H->model_info(SELF, &mi);
    cJSON_AddNumberToObject(r, "model_info_rc", rc);
    if (mi)
        cJSON_AddItemToObject(r, "model", mi);
    int nt = H->tokenize(SELF, "Hello world", false, false, NULL, 0);
    cJSON_AddNumberToObject(r, "tokens_hello_world", nt);
    cJSON *cm = cJSON_AddArrayToObject(r, "chat_model_rcs");
    for (size_t i = 0; i < sizeof(chat_model_rcs) / sizeof(chat_model_rcs[0]); i++)
        cJSON_AddItemToArray(cm, cJSON_CreateNumber(chat_model_rcs[i]));
    return H->reply_json(call, r);
}

/* The chat model good/parrot: streams "<voice><message>" in two pieces. */
static int cmd_parrot(rlai_call *call, const cJSON *params, void *user)
{
    (void)user;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(params, "voice");
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(params, "message");
    if (!cJSON_IsString(m))
        return H->reply_error(call, RLAI_ERR_INVALID_ARG, "message (string) is required");
    const char *voice = cJSON_IsString(v) ? v->valuestring : "";
    if (H->stream_text(call, voice, strlen(voice)) < 0 ||
        H->stream_text(call, m->valuestring, strlen(m->valuestring)) < 0)
        return RLAI_ERR_CANCELLED;
    cJSON *r = cJSON_CreateObject();
    cJSON_AddItemToObject(r, "params", cJSON_Duplicate(params, true));
    return H->reply_json(call, r);
}

static int cmd_pin(rlai_call *call, const cJSON *params, void *user)
{
    (void)user;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(params, "text");
    if (!cJSON_IsString(t))
        return H->reply_error(call, RLAI_ERR_INVALID_ARG, "text (string) is required");
    int rc = H->pin_prefix(SELF, t->valuestring);
    cJSON *r = cJSON_CreateObject();
    cJSON_AddNumberToObject(r, "pinned", rc);
    return H->reply_json(call, r);
}

RLAI_PLUGIN_EXPORT int rlai_plugin_init(const rlai_host_api *host, rlai_plugin *self, char **errmsg)
{
    (void)errmsg;
    H = host;
    SELF = self;
    static const struct { const char *name, *desc, *schema; rlai_command_fn fn; uint32_t flags; } cmds[] = {
        { "good.echo", "Returns its parameters.", "{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"number\"}}}",
          cmd_echo, 0 },
        { "good.stream", "Streams numbered pieces, then two results.",
          "{\"type\":\"object\",\"properties\":{\"pieces\":{\"type\":\"integer\"}}}", cmd_stream, RLAI_CMD_STREAMS },
        { "good.fail", "Always fails.", NULL, cmd_fail, 0 },
        { "good.generate", "Generates text with the shared engine.",
          "{\"type\":\"object\",\"properties\":{\"prompt\":{\"type\":\"string\"},\"max_tokens\":{\"type\":"
          "\"integer\",\"minimum\":1},\"prediction\":{\"type\":\"string\"},\"ban\":{\"type\":\"integer\"}},"
          "\"required\":[\"prompt\"]}",
          cmd_generate, RLAI_CMD_STREAMS | RLAI_CMD_USES_ENGINE },
        { "good.slow", "Runs until cancelled.", NULL, cmd_slow, 0 },
        { "good.late", "Registers a command too late.", NULL, cmd_late, 0 },
        { "good.info", "Reports config and host features.", NULL, cmd_info, 0 },
        { "good.pin", "Pins a prefix.", NULL, cmd_pin, RLAI_CMD_USES_ENGINE },
        { "good.parrot", "Repeats the message in a voice (the chat model good/parrot).", NULL, cmd_parrot,
          RLAI_CMD_STREAMS },
    };
    for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++) {
        rlai_command_desc d = { .name = cmds[i].name, .description = cmds[i].desc,
                                .params_schema = cmds[i].schema, .handler = cmds[i].fn, .flags = cmds[i].flags };
        int rc = host->register_command(self, &d, sizeof(d));
        if (rc < 0)
            return rc;
    }
    /* One good chat model, then refusals: a duplicate, a name outside the
     * plugin, a command of nobody, params that are not an object. */
    chat_model_rcs[0] = host->register_chat_model(self, "good/parrot", "good.parrot", "{\"voice\":\"Squawk: \"}",
                                                  "A parrot (test chat model)");
    chat_model_rcs[1] = host->register_chat_model(self, "good/parrot", "good.parrot", NULL, NULL);
    chat_model_rcs[2] = host->register_chat_model(self, "other/parrot", "good.parrot", NULL, NULL);
    chat_model_rcs[3] = host->register_chat_model(self, "good/ghost", "good.nothing", NULL, NULL);
    chat_model_rcs[4] = host->register_chat_model(self, "good/bad", "good.parrot", "[1]", NULL);
    state *st = calloc(1, sizeof(*st));
    if (!st)
        return RLAI_ERR_NOMEM;
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(host->config(self), "fini_marker");
    if (cJSON_IsString(m))
        snprintf(st->fini_marker, sizeof(st->fini_marker), "%s", m->valuestring);
    host->set_state(self, st);
    return 0;
}

RLAI_PLUGIN_EXPORT void rlai_plugin_fini(void *p)
{
    state *st = p;
    if (st && st->fini_marker[0]) {
        FILE *f = fopen(st->fini_marker, "w");
        if (f) {
            fputs("fini\n", f);
            fclose(f);
        }
    }
    free(st);
}
