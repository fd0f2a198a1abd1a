/* rlai/client.h - client library for the RTX-LocalAI engine daemon.
 *
 * Talks to `rlai serve` over ZeroMQ (DEALER to the engine's ROUTER) or the
 * named pipe (Unix domain socket; 4-byte big-endian length + msgpack; POSIX
 * only in this build, no Windows named pipe yet), with
 * the messages of rlai/protocol.h. Blocking use: send a request, then call
 * rlai_client_recv() until the request's done or error frame. Poll-friendly
 * use: wait for rlai_client_fd() to be readable, then rlai_client_recv()
 * with timeout 0 until it returns RLAI_ERR_TIMEOUT.
 *
 * One client is used by one thread at a time. Errors are rlai_error codes:
 * RLAI_ERR_DISCONNECTED when the engine is absent or has gone away (noticed
 * within ~2 s through ZeroMQ heartbeats, at once on a Unix socket),
 * RLAI_ERR_TIMEOUT when nothing arrived in time.
 */
#ifndef RLAI_CLIENT_H
#define RLAI_CLIENT_H

#include <stddef.h>
#include <stdint.h>
#include "rlai/error.h"
#include "rlai/protocol.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rlai_client rlai_client;

/* Default endpoints, private to the user:
 *   zmq:  ipc://$XDG_RUNTIME_DIR/rlai/engine.zmq
 *   pipe: unix://$XDG_RUNTIME_DIR/rlai/engine.sock
 * ($XDG_RUNTIME_DIR falling back to /tmp/rlai-$UID). Writes into buf
 * (caller-owned); returns 0 or RLAI_ERR_TOO_LARGE if cap is too small. */
int rlai_default_zmq_endpoint(char *buf, size_t cap);
int rlai_default_pipe_endpoint(char *buf, size_t cap);

/* Connects to `endpoint`: "ipc://PATH" or "tcp://HOST:PORT" (ZeroMQ), or
 * "unix://PATH" (named pipe). NULL means the default ZeroMQ endpoint. The
 * call checks that the engine answers (a hello round trip within
 * timeout_ms; <= 0 means 2000 ms) so an absent engine is reported here as
 * RLAI_ERR_DISCONNECTED with a message in err. *out is owned by the caller
 * (rlai_client_close). For tcp:// the API key comes from $RLAI_API_KEY
 * (rlai_client_connect_opts to pass one). */
int rlai_client_connect(const char *endpoint, int timeout_ms, rlai_client **out,
                        char *err, size_t errlen);

/* Connection options (zero-initialise, then set what you need). */
typedef struct rlai_client_options {
    int timeout_ms;        /* hello round trip; <= 0 means 2000 ms */
    const char *api_key;   /* for tcp:// endpoints: ZeroMQ PLAIN credentials (username "rlai",
                              password = the key); NULL or "" = $RLAI_API_KEY if set, else none.
                              Ignored for ipc:// and unix:// (keyless, guarded by the 0700
                              directory). Borrowed during the call only. */
} rlai_client_options;

/* Like rlai_client_connect with options (opts may be NULL). A tcp://
 * engine that refuses the key, or wants one that was not given, is
 * reported as RLAI_ERR_IO with a message saying so.
 *
 * Both connect calls first check the socket directory of an ipc:// or
 * unix:// endpoint: it must be a real directory (not a symlink) owned by
 * the effective uid with mode 0700, as the engine creates it; otherwise
 * they refuse with RLAI_ERR_IO and a message naming the directory and what
 * is wrong (another user could be standing in for the engine). */
int rlai_client_connect_opts(const char *endpoint, const rlai_client_options *opts, rlai_client **out,
                             char *err, size_t errlen);

/* Closes the connection and frees the client. Accepts NULL. */
void rlai_client_close(rlai_client *c);

/* Returns a fresh request id (1, 2, 3, ... per client; connect's hello
 * uses the first). */
uint64_t rlai_client_next_id(rlai_client *c);

/* Encodes and sends a request (m is not modified or kept; m->id and
 * m->version must be set, see rlai_client_next_id). Returns 0,
 * RLAI_ERR_INVALID_ARG for a message the encoder refuses,
 * RLAI_ERR_TOO_LARGE over RLAI_PROTO_MAX_FRAME, RLAI_ERR_DISCONNECTED.
 * Blocks only while the transport is full (reading replies meanwhile on a
 * Unix socket). */
int rlai_client_send(rlai_client *c, const rlai_msg *m);

/* Receives the next frame of any request into *out (caller frees with
 * rlai_msg_free). timeout_ms < 0 waits forever, 0 polls. Frames that had
 * arrived before the engine went away are returned first, then
 * RLAI_ERR_DISCONNECTED (for good: reconnect with a new client). A frame
 * that does not decode is consumed and reported as RLAI_ERR_PROTOCOL. */
int rlai_client_recv(rlai_client *c, int timeout_ms, rlai_msg *out);

/* Sends a cancel request for `target`; its stream still ends with one done
 * (stop "cancelled") or error frame, which the caller should read. */
int rlai_client_cancel(rlai_client *c, uint64_t target);

/* A file descriptor that becomes readable when rlai_client_recv may have
 * something (ZMQ_FD semantics for ZeroMQ: edge-like, always drain). For
 * ZeroMQ it is an epoll descriptor watching the socket's ZMQ_FD and the
 * connection monitor's, so an engine death also wakes it; for unix:// it is
 * the socket. Owned by the client: do not close or read it. */
int rlai_client_fd(const rlai_client *c);

#ifdef __cplusplus
}
#endif
#endif
