/* nosym.c - a shared object without the ABI record (no
 * RLAI_PLUGIN_DECLARE): must be refused before init runs. */
#include <rlai/plugin.h>

RLAI_PLUGIN_EXPORT int rlai_plugin_init(const rlai_host_api *host, rlai_plugin *self, char **errmsg)
{
    (void)host;
    (void)self;
    (void)errmsg;
    return 0;
}
