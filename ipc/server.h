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
 *
 * Details: on_disconnect is also called after a framing error, after
 * rlai_server_close_conn, and when a Unix-socket peer leaves more than
 * max(16 MiB, 2 * max_frame) of replies unread; it is not called by
 * rlai_server_stop. A ZeroMQ peer is known gone when a send to it fails
 * (ROUTER_MANDATORY), or when a new peer's message arrives on the file
 * descriptor it used (the old connection was closed), so a peer that leaves
 * while idle is noticed late. A ZeroMQ message over max_frame is discarded
 * by libzmq (ZMQ_MAXMSGSIZE), which also closes that peer's connection;
 * on_message never sees it. ZeroMQ peers may send [payload] (DEALER) or
 * ["", payload] (REQ; replies then carry the delimiter too); extra parts
 * are ignored. Callbacks may call rlai_server_send and
 * rlai_server_close_conn, never rlai_server_stop.
 */
#ifndef RLAI_IPC_SERVER_H
#define RLAI_IPC_SERVER_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

typedef struct rlai_server rlai_server;

/* The PLAIN username of the tcp:// endpoints (the password is the API key). */
#define RLAI_ZMQ_PLAIN_USER "rlai"

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
    const char *zmq_tcp_api_key;  /* tcp:// binds require ZeroMQ PLAIN with username
                                     RLAI_ZMQ_PLAIN_USER and this password (checked by a
                                     ZAP handler, ipc/zap.h); NULL or "" = no authentication.
                                     ipc:// binds stay keyless (0700 directory). Copied. */
} rlai_server_config;

/* Binds every configured endpoint (creating the parent directory of ipc
 * and Unix socket paths with mode 0700 and the sockets with mode 0600,
 * replacing a stale socket file left by a dead engine but refusing to
 * replace a live one) and starts the I/O thread. On error returns a
 * negative rlai_error and a message in err: RLAI_ERR_BUSY when another
 * engine answers at a socket path ("another engine is already serving at
 * PATH") or a TCP address is in use, RLAI_ERR_INVALID_ARG for a bad
 * endpoint or an over-long path, RLAI_ERR_IO otherwise (e.g. a non-socket
 * file in the way). cfg and cb are copied; *out owned by the caller (free
 * with rlai_server_stop). *out is stored before the I/O thread starts, so
 * callbacks may use the caller's copy of it from their first call. The parent directory of every socket file must
 * be a real directory (not a symlink) owned by the effective uid with mode
 * 0700 (ipc/sockdir.h); anything else is refused with RLAI_ERR_IO and a
 * message naming the directory and what is wrong. */
int rlai_server_start(const rlai_server_config *cfg, const rlai_server_callbacks *cb,
                      rlai_server **out, char *err, size_t errlen);

/* Queues one message for a connection (data is copied; the caller keeps
 * ownership of data). Thread-safe; not to be called once rlai_server_stop
 * has begun. Returns 0, RLAI_ERR_DISCONNECTED if the connection is known
 * gone (or never existed), RLAI_ERR_TOO_LARGE above 4 GiB - 1, or
 * RLAI_ERR_NOMEM. */
int rlai_server_send(rlai_server *s, rlai_conn conn, const void *data, size_t len);

/* Closes a connection from the server side (Unix socket: after flushing
 * what is queued, at most 5 s; ZeroMQ: the handle is forgotten once its
 * queued replies are handed to libzmq). Thread-safe. on_disconnect follows. */
void rlai_server_close_conn(rlai_server *s, rlai_conn conn);

/* Flushes queued replies (bounded wait, up to timeout_ms; ZeroMQ replies
 * get the remaining time as linger), stops the I/O thread, closes sockets
 * and removes the socket files it created. Frees s. Accepts NULL. */
void rlai_server_stop(rlai_server *s, int timeout_ms);

#endif
