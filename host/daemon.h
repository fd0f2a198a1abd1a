/* daemon.h - `rlai serve`: the engine process.
 *
 * Owns one rlai_engine, the transports (ipc/server.h) and the request
 * router. Threads: the transports' I/O thread decodes requests, answers
 * the cheap ones (hello, stats, commands, cancel) and queues the rest; one
 * engine thread runs them in arrival order and streams frames back through
 * the server's thread-safe send queue. Limits (frame size, prompt tokens,
 * requests in flight per client and in total) answer with error frames.
 */
#ifndef RLAI_HOST_DAEMON_H
#define RLAI_HOST_DAEMON_H

#include <stddef.h>
#include "config.h"

typedef struct rlai_daemon rlai_daemon;

/* Loads the model, binds the endpoints and starts the threads. cfg is
 * copied where needed. On error returns a negative rlai_error with a
 * message in err. *out owned by the caller (rlai_daemon_shutdown). */
int rlai_daemon_start(const rlai_config *cfg, rlai_daemon **out, char *err, size_t errlen);

/* Stops accepting requests, ends every queued and running request with an
 * error frame (SHUTDOWN), flushes, removes socket files and frees. */
void rlai_daemon_shutdown(rlai_daemon *d);

#endif
