/* dup.c - registers the same command name twice: the second registration
 * is refused (RLAI_ERR_EXISTS) and the plugin is not loaded even though
 * its init ignores the error. */
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
    rlai_command_desc d = { .name = "dup.same", .description = "first", .handler = cmd };
    host->register_command(self, &d, sizeof(d));
    d.description = "second";
    host->register_command(self, &d, sizeof(d));   /* refused; init still says OK */
    return 0;
}
