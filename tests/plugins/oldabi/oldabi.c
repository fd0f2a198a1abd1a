/* oldabi.c - a plugin built for ABI 1.1, whose rlai_gen_result ends before
 * the fields 1.2 appended. It passes a 1.1-sized result followed by a
 * canary: the host must fill the result and leave the canary alone. */
#include <rlai/plugin.h>

#include <string.h>

RLAI_PLUGIN_EXPORT const rlai_plugin_abi rlai_plugin_abi_record = { 1, 1, RLAI_PLUGIN_SIGNATURE };

static const rlai_host_api *H;

#define CANARY 0x5a5a5a5a5a5a5a5aull

static int cmd_generate(rlai_call *call, const cJSON *params, void *user)
{
    (void)params;
    (void)user;
    struct {
        unsigned char result[RLAI_GEN_RESULT_SIZE_1_0];   /* what a 1.1 build has */
        unsigned long long canary[2];
    } buf;
    memset(&buf, 0, sizeof(buf));
    buf.canary[0] = buf.canary[1] = CANARY;
    rlai_gen_request req;
    memset(&req, 0, sizeof(req));
    req.prompt = "Hello";
    req.max_tokens = 4;
    /* A 1.1 build passes the request size it knows: up to response_format. */
    int rc = H->generate(call, &req, offsetof(rlai_gen_request, response_format), (rlai_gen_result *)(void *)&buf);
    if (rc < 0)
        return H->reply_error(call, rc, "generate failed: %s", H->strerror(rc));
    char *text;
    memcpy(&text, buf.result + offsetof(rlai_gen_result, text), sizeof(text));
    int gen_tokens;
    memcpy(&gen_tokens, buf.result + offsetof(rlai_gen_result, gen_tokens), sizeof(gen_tokens));
    cJSON *r = cJSON_CreateObject();
    cJSON_AddBoolToObject(r, "canary_intact", buf.canary[0] == CANARY && buf.canary[1] == CANARY);
    cJSON_AddNumberToObject(r, "gen_tokens", gen_tokens);
    cJSON_AddBoolToObject(r, "has_text", text != NULL);
    H->free(text);
    return H->reply_json(call, r);
}

RLAI_PLUGIN_EXPORT int rlai_plugin_init(const rlai_host_api *host, rlai_plugin *self, char **errmsg)
{
    (void)errmsg;
    H = host;
    rlai_command_desc d = { .name = "oldabi.generate", .description = "Generates with a 1.1-sized result.",
                            .handler = cmd_generate, .flags = RLAI_CMD_USES_ENGINE };
    return host->register_command(self, &d, sizeof(d));
}
