/* newabi.c - claims a newer minor ABI than the host: must be refused. */
#include <rlai/plugin.h>

RLAI_PLUGIN_EXPORT const rlai_plugin_abi rlai_plugin_abi_record = {
    RLAI_PLUGIN_ABI_MAJOR, RLAI_PLUGIN_ABI_MINOR + 1, RLAI_PLUGIN_SIGNATURE };

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
    rlai_command_desc d = { .name = "newabi.x", .description = "x", .handler = cmd };
    return host->register_command(self, &d, sizeof(d));
}
