/* badschema.c - registers one valid command, then one whose params_schema
 * uses a keyword the host cannot enforce: the registration is refused and
 * so is the whole plugin (the engine serves the others). */
#include <rlai/plugin.h>

RLAI_PLUGIN_DECLARE();

static int cmd(rlai_call *call, const cJSON *params, void *user)
{
    (void)call;
    (void)params;
    (void)user;
    return 0;
}

RLAI_PLUGIN_EXPORT int rlai_plugin_init(const rlai_host_api *host, rlai_plugin *self, char **errmsg)
{
    (void)errmsg;
    rlai_command_desc d = { .name = "badschema.ok", .description = "valid",
                            .params_schema = "{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"integer\"}}}",
                            .handler = cmd };
    int rc = host->register_command(self, &d, sizeof(d));
    if (rc < 0)
        return rc;
    d.name = "badschema.bad";
    d.description = "a schema the host cannot enforce";
    d.params_schema = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"pattern\":\"^a\"}}}";
    return host->register_command(self, &d, sizeof(d));
}
