/* othermajor.c - claims another major ABI: must be refused. */
#include <rlai/plugin.h>

RLAI_PLUGIN_EXPORT const rlai_plugin_abi rlai_plugin_abi_record = {
    RLAI_PLUGIN_ABI_MAJOR + 1, 0, RLAI_PLUGIN_SIGNATURE };

RLAI_PLUGIN_EXPORT int rlai_plugin_init(const rlai_host_api *host, rlai_plugin *self, char **errmsg)
{
    (void)host;
    (void)self;
    (void)errmsg;
    return 0;
}
