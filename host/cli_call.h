/* cli_call.h - `rlai call` and `rlai plugins`: clients of a running engine
 * for plugin commands (see docs/PLUGINS.md). */
#ifndef RLAI_HOST_CLI_CALL_H
#define RLAI_HOST_CLI_CALL_H

/* rlai call [--endpoint E] [--quiet] plugin.verb ['{json}']: streams the
 * command's text to stdout as it arrives, then prints each result as JSON
 * (one per line); a metrics line goes to stderr unless --quiet. Returns
 * the process exit code: 0, 1 (engine error or unreachable), 2 (usage). */
int rlai_cli_call_main(int argc, char **argv);

/* rlai plugins [--endpoint E] [--json]: the loaded plugins and their
 * commands with parameters. Returns the exit code. */
int rlai_cli_plugins_main(int argc, char **argv);

#endif
