/* fit_cli.h - `rlai fit`: "can it run?" for a GGUF model on a GPU.
 *
 * Runs in-process, without the daemon: it loads the fit plugin
 * ($RLAI_PLUGIN_DIR/fit, else <exe>/../plugins/fit) into a plugin host
 * without an engine and calls its fit.check / fit.gpus commands, so the
 * command line and the plugin command can never disagree. */
#ifndef RLAI_HOST_FIT_CLI_H
#define RLAI_HOST_FIT_CLI_H

/* rlai fit MODEL.gguf --gpu NAME [--context N] [--kv-type f16|q8_0|f32]
 *          [--vram-gb X --bandwidth-gbs Y] [--json]
 * rlai fit --params '{"params_b":8.03,...}' --gpu NAME ...
 * rlai fit --list-gpus [--json]
 * argv[0] is "fit". Prints a readable table (or the plugin's JSON with
 * --json) to stdout and errors to stderr. Returns the process exit code:
 * 0 (estimate printed, whether or not the model fits), 1 (the estimate
 * failed: unreadable file, unknown GPU, plugin missing), 2 (usage). */
int rlai_fit_cli_main(int argc, char **argv);

#endif
