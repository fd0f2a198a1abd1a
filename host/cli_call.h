/* cli_call.h - `rlai call` and `rlai plugins`: clients of a running engine
 * for plugin commands (see docs/PLUGINS.md). */
#ifndef RLAI_HOST_CLI_CALL_H
#define RLAI_HOST_CLI_CALL_H

#include <stddef.h>
#include "rlai/client.h"

/* Connects the `rlai` command-line clients (run, chat, stats, call,
 * plugins) to endpoint (NULL = default). For a tcp:// endpoint the API key
 * is $RLAI_API_KEY, else the default key file (host/api_key.h) when it
 * exists and passes its checks; ipc:// and unix:// are keyless. Returns 0
 * or a negative rlai_error with a message in err; *out owned by the caller. */
int rlai_cli_connect(const char *endpoint, int timeout_ms, rlai_client **out, char *err, size_t errlen);

/* rlai call [--endpoint E] [--quiet] plugin.verb ['{json}']: streams the
 * command's text to stdout as it arrives, then prints each result as JSON
 * (one per line); a metrics line goes to stderr unless --quiet. Returns
 * the process exit code: 0, 1 (engine error or unreachable), 2 (usage). */
int rlai_cli_call_main(int argc, char **argv);

/* rlai plugins [--endpoint E] [--json]: the loaded plugins and their
 * commands with parameters. Returns the exit code. */
int rlai_cli_plugins_main(int argc, char **argv);

#endif
