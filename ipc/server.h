/* server.h - the daemon's transports: a ZeroMQ ROUTER and a Unix-domain
 * socket listener served by one I/O thread.
 *
 * The I/O thread receives whole messages and hands them to on_message with
 * a connection handle; it never runs inference. Any thread may queue a
 * reply with rlai_server_send(); the I/O thread writes it to that
 * connection (ZeroMQ: routed by identity; Unix socket: 4-byte big-endian
 * length + payload, buffered without blocking). When a connection goes
 * away (socket closed, or a ZeroMQ peer found unreachable on send),
 * on_disconnect is called once for it.
 */
#ifndef RLAI_IPC_SERVER_H
#define RLAI_IPC_SERVER_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

typedef struct rlai_server rlai_server;

/* Opaque connection handle: unique for the server's lifetime (never reused). */
typedef uint64_t rlai_conn;

typedef struct rlai_server_callbacks {
    /* Called on the I/O thread with one complete message (data valid only
     * during the call). */
    void (*on_message)(void *user, rlai_conn conn, const void *data, size_t len);
    /* Called on the I/O thread once when a connection is gone. */
    void (*on_disconnect)(void *user, rlai_conn conn);
    /* Called on the I/O thread for a frame error on a Unix-socket
     * connection (zero or oversize length) before it is closed; may be NULL. */
    void (*on_frame_error)(void *user, rlai_conn conn, const char *why);
    void *user;
} rlai_server_callbacks;

typedef struct rlai_server_config {
    const char *zmq_endpoint;     /* e.g. "ipc:///run/user/1000/rlai/engine.zmq"; NULL = none */
    const char *zmq_tcp_endpoint; /* optional second ZeroMQ bind, "tcp://127.0.0.1:5677"; NULL = none */
    const char *uds_path;         /* Unix socket path; NULL = none */
    size_t max_frame;             /* messages larger than this are refused (0 = RLAI_PROTO_MAX_FRAME) */
    int max_connections;          /* Unix socket connections (0 = 256) */
} rlai_server_config;

/* Binds every configured endpoint (creating the parent directory of ipc
 * and Unix socket paths with mode 0700 and the sockets with mode 0600,
 * replacing a stale socket file left by a dead engine but refusing to
 * replace a live one) and starts the I/O thread. On error returns a
 * negative rlai_error and a message in err. *out owned by the caller. */
int rlai_server_start(const rlai_server_config *cfg, const rlai_server_callbacks *cb,
                      rlai_server **out, char *err, size_t errlen);

/* Queues one message for a connection (data is copied). Thread-safe.
 * Returns 0, RLAI_ERR_DISCONNECTED if the connection is known gone, or
 * RLAI_ERR_NOMEM. */
int rlai_server_send(rlai_server *s, rlai_conn conn, const void *data, size_t len);

/* Closes a connection from the server side (Unix socket: after flushing
 * what is queued). Thread-safe. */
void rlai_server_close_conn(rlai_server *s, rlai_conn conn);

/* Flushes queued replies (bounded wait, up to timeout_ms), stops the I/O
 * thread, closes sockets and removes the socket files. Accepts NULL. */
void rlai_server_stop(rlai_server *s, int timeout_ms);

#endif
