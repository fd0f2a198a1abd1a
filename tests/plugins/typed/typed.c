/* typed.c - a test plugin whose commands declare parameter schemas the host
 * enforces before the handler runs (host/params_schema.h), and a command
 * that fails with the rlai error code its caller asks for (the code must
 * reach every client). */
#include <rlai/plugin.h>

#include <string.h>

RLAI_PLUGIN_DECLARE();

static const rlai_host_api *H;

/* Returns its params: only called with params that passed the schema. */
static int cmd_echo(rlai_call *call, const cJSON *params, void *user)
{
    (void)user;
    cJSON *r = cJSON_CreateObject();
    cJSON_AddItemToObject(r, "params", cJSON_Duplicate(params, true));
    return H->reply_json(call, r);
}

/* Fails with params.code (a negative rlai_error) and a message. */
static int cmd_fail(rlai_call *call, const cJSON *params, void *user)
{
    (void)user;
    int code = (int)cJSON_GetObjectItemCaseSensitive(params, "code")->valuedouble;
    const cJSON *ret = cJSON_GetObjectItemCaseSensitive(params, "return");
    if (cJSON_IsTrue(ret))
        return code;   /* the host makes the message from strerror */
    return H->reply_error(call, code, "typed.fail failed with code %d as asked", code);
}

static const char SET_SCHEMA[] =
    "{\"type\":\"object\",\"properties\":{"
    "\"name\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":8},"
    "\"temperature\":{\"type\":\"number\",\"minimum\":0,\"maximum\":2},"
    "\"count\":{\"type\":\"integer\",\"exclusiveMinimum\":0,\"maximum\":10},"
    "\"mode\":{\"type\":\"string\",\"enum\":[\"fast\",\"slow\"]},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"maxItems\":3},"
    "\"flag\":{\"type\":[\"boolean\",\"null\"]}},"
    "\"required\":[\"name\"],\"additionalProperties\":false}";

static const char OPEN_SCHEMA[] =
    "{\"type\":\"object\",\"properties\":{"
    "\"model\":{\"description\":\"a path or counts\",\"oneOf\":[{\"type\":\"string\"},"
    "{\"type\":\"object\",\"required\":[\"n_layer\"],\"properties\":{\"n_layer\":{\"type\":\"integer\","
    "\"minimum\":1}}}]}}}";

static const char FAIL_SCHEMA[] =
    "{\"type\":\"object\",\"properties\":{\"code\":{\"type\":\"integer\",\"minimum\":-18,\"maximum\":-1},"
    "\"return\":{\"type\":\"boolean\"}},\"required\":[\"code\"],\"additionalProperties\":false}";

RLAI_PLUGIN_EXPORT int rlai_plugin_init(const rlai_host_api *host, rlai_plugin *self, char **errmsg)
{
    (void)errmsg;
    H = host;
    const rlai_command_desc cmds[] = {
        { .name = "typed.set", .description = "Echoes strictly typed params.", .params_schema = SET_SCHEMA,
          .handler = cmd_echo },
        { .name = "typed.open", .description = "Echoes params; extra keys allowed.", .params_schema = OPEN_SCHEMA,
          .handler = cmd_echo },
        { .name = "typed.fail", .description = "Fails with the given rlai error code.",
          .params_schema = FAIL_SCHEMA, .handler = cmd_fail },
    };
    for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++) {
        int rc = host->register_command(self, &cmds[i], sizeof(cmds[i]));
        if (rc < 0)
            return rc;
    }
    return 0;
}
