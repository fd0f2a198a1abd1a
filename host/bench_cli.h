/* bench_cli.h - `rlai bench`: end-to-end speed of any GGUF model in
 * llama-bench's table shape (docs/CLI.md).
 *
 * Loads the model in this process (include/rlai/engine.h), with the prefix
 * cache off so that every repetition prefills its whole prompt, and prints
 * one row per test, mean ± sample standard deviation over the repetitions:
 *   ppP       prompt processing: P random prompt tokens, tokens/s
 *   tgN       decoding one sequence: N tokens, tokens/s
 *   ttft pP   time to first token of a P-token prompt, milliseconds
 *   tgN xB    B sequences decoding N tokens each at once (continuous
 *             batching): all generated tokens / wall time, tokens/s */
#ifndef RLAI_BENCH_CLI_H
#define RLAI_BENCH_CLI_H

/* Runs `rlai bench` with argv[0] == "bench". Returns the exit status:
 * 0, 1 (model cannot be loaded / a run failed), 2 (usage). */
int rlai_bench_cli_main(int argc, char **argv, const char *default_model);

#endif
