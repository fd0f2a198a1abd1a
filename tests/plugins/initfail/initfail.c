/* initfail.c - registers a command, then fails init with a message: the
 * registration must be undone and the library unloaded. */
#include <rlai/plugin.h>

#include <string.h>

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
    rlai_command_desc d = { .name = "initfail.x", .description = "x", .handler = cmd };
    host->register_command(self, &d, sizeof(d));
    const char *msg = "the lore pack is missing";
    *errmsg = host->alloc(strlen(msg) + 1);
    if (*errmsg)
        memcpy(*errmsg, msg, strlen(msg) + 1);
    return RLAI_ERR_NOT_FOUND;
}
