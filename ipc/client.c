/* client.c - client library for the engine daemon (see rlai/client.h).
 *
 * ZeroMQ endpoints (ipc://, tcp://) use a DEALER socket with heartbeats
 * (500 ms interval, 1500 ms timeout) and a socket monitor on an inproc PAIR:
 * a DISCONNECTED event marks the client dead, so rlai_client_recv returns
 * RLAI_ERR_DISCONNECTED (after the frames that had already arrived) when
 * the engine dies or stops answering heartbeats. unix:// endpoints use a
 * stream socket with 4-byte big-endian length framing (ipc/frame.h).
 *
 * Received frames are held raw in a queue (frames of other requests that
 * arrive while connect waits for its hello are kept there) and decoded
 * when handed to the caller.
 */
#include "rlai/client.h"
#include "rlai/error.h"
#include "rlai/clock.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "frame.h"
#include "server.h"
#include "sockdir.h"

#define MON_ADDR "inproc://rlai-client-monitor"
#define READ_CHUNK (64u << 10)

enum { CK_ZMQ = 1, CK_UNIX = 2 };

typedef struct rframe {
    struct rframe *next;
    size_t len;
    unsigned char data[];
} rframe;

struct rlai_client {
    int kind;
    char *endpoint;
    uint64_t next_id;
    rframe *q_head, *q_tail;
    rlai_buf enc;
    bool dead;

    /* ZeroMQ */
    void *ctx, *sock, *mon;
    int epfd;
    bool connected;     /* handshake with the engine completed */
    bool refused;       /* a connection attempt failed before any success */
    bool keyed;         /* PLAIN credentials were set (tcp:// with an API key) */
    bool auth_failed;   /* the engine refused our PLAIN credentials */
    bool mech_failed;   /* security mechanism mismatch (key given to a keyless endpoint or none to a keyed one) */

    /* Unix socket */
    int fd;
    rlai_frame_reader rd;
    unsigned char *rbuf;
};

/* Milliseconds left until deadline (-1 = forever). */
static int remaining(int64_t deadline)
{
    if (deadline < 0)
        return -1;
    int64_t left = deadline - rlai_clock_ms_int();
    if (left <= 0)
        return 0;
    return left > 1000000000 ? 1000000000 : (int)left;
}

/* ----------------------------------------------------------- defaults */

static int default_endpoint(char *buf, size_t cap, const char *scheme, const char *file)
{
    if (!buf)
        return RLAI_ERR_INVALID_ARG;
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    int n;
    if (xdg && xdg[0] == '/')
        n = snprintf(buf, cap, "%s%s/rlai/%s", scheme, xdg, file);
    else
        n = snprintf(buf, cap, "%s/tmp/rlai-%u/%s", scheme, (unsigned)getuid(), file);
    if (n < 0 || (size_t)n >= cap) {
        if (cap)
            buf[0] = '\0';
        return RLAI_ERR_TOO_LARGE;
    }
    return 0;
}

int rlai_default_zmq_endpoint(char *buf, size_t cap)
{
    return default_endpoint(buf, cap, "ipc://", "engine.zmq");
}

int rlai_default_pipe_endpoint(char *buf, size_t cap)
{
    return default_endpoint(buf, cap, "unix://", "engine.sock");
}

/* -------------------------------------------------------------- queue */

static int queue_push(rlai_client *c, const void *data, size_t len)
{
    rframe *f = malloc(sizeof *f + len);
    if (!f)
        return RLAI_ERR_NOMEM;
    f->next = NULL;
    f->len = len;
    memcpy(f->data, data, len);
    if (c->q_tail)
        c->q_tail->next = f;
    else
        c->q_head = f;
    c->q_tail = f;
    return 0;
}

static rframe *queue_pop(rlai_client *c)
{
    rframe *f = c->q_head;
    if (f) {
        c->q_head = f->next;
        if (!c->q_head)
            c->q_tail = NULL;
        f->next = NULL;
    }
    return f;
}

/* ------------------------------------------------------------- ZeroMQ */

static void zmq_drain_monitor(rlai_client *c)
{
    for (;;) {
        zmq_msg_t ev;
        zmq_msg_init(&ev);
        if (zmq_msg_recv(&ev, c->mon, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&ev);
            return;
        }
        uint16_t event = 0;
        if (zmq_msg_size(&ev) >= 2)
            memcpy(&event, zmq_msg_data(&ev), 2);
        bool more = zmq_msg_more(&ev);
        zmq_msg_close(&ev);
        while (more) { /* the endpoint part */
            zmq_msg_t x;
            zmq_msg_init(&x);
            if (zmq_msg_recv(&x, c->mon, ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&x);
                break;
            }
            more = zmq_msg_more(&x);
            zmq_msg_close(&x);
        }
        switch (event) {
        case ZMQ_EVENT_HANDSHAKE_SUCCEEDED:
            c->connected = true;
            break;
        case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
            c->auth_failed = true;
            c->dead = true;
            break;
        case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
            c->mech_failed = true;
            c->dead = true;
            break;
        case ZMQ_EVENT_DISCONNECTED:
        case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
            if (!c->connected)
                c->mech_failed = true;
            c->dead = true;
            break;
        case ZMQ_EVENT_CONNECT_RETRIED:
        case ZMQ_EVENT_CLOSED:
            if (!c->connected)
                c->refused = true;
            else
                c->dead = true;
            break;
        default:
            break;
        }
    }
}

/* Receives one message into the queue without waiting. 1 = got one,
 * 0 = nothing, <0 error. */
static int zmq_take(rlai_client *c)
{
    for (;;) {
        zmq_msg_t msg;
        zmq_msg_init(&msg);
        if (zmq_msg_recv(&msg, c->sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&msg);
            if (zmq_errno() == EINTR)
                continue;
            return 0;
        }
        bool more = zmq_msg_more(&msg);
        /* An empty first part is a delimiter: take the next one. */
        while (zmq_msg_size(&msg) == 0 && more) {
            zmq_msg_close(&msg);
            zmq_msg_init(&msg);
            if (zmq_msg_recv(&msg, c->sock, ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&msg);
                return 0;
            }
            more = zmq_msg_more(&msg);
        }
        int rc = 0;
        if (zmq_msg_size(&msg) > 0)
            rc = queue_push(c, zmq_msg_data(&msg), zmq_msg_size(&msg)) < 0 ? RLAI_ERR_NOMEM : 1;
        zmq_msg_close(&msg);
        while (more) {
            zmq_msg_t x;
            zmq_msg_init(&x);
            if (zmq_msg_recv(&x, c->sock, ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&x);
                break;
            }
            more = zmq_msg_more(&x);
            zmq_msg_close(&x);
        }
        if (rc != 0)
            return rc;
        /* empty message: ignored, look for another */
    }
}

/* Waits until at least one frame is queued. */
static int zmq_fetch(rlai_client *c, int64_t deadline)
{
    for (;;) {
        int rc = zmq_take(c);
        if (rc != 0)
            return rc < 0 ? rc : 0;
        zmq_drain_monitor(c);
        if (c->refused && !c->connected)
            return RLAI_ERR_DISCONNECTED; /* nothing listening there */
        if (c->dead) {
            rc = zmq_take(c);
            if (rc != 0)
                return rc < 0 ? rc : 0;
            return RLAI_ERR_DISCONNECTED;
        }
        int wait = remaining(deadline);
        if (wait == 0)
            return RLAI_ERR_TIMEOUT;
        zmq_pollitem_t items[2] = {
            {.socket = c->sock, .events = ZMQ_POLLIN},
            {.socket = c->mon, .events = ZMQ_POLLIN},
        };
        if (zmq_poll(items, 2, wait) < 0 && zmq_errno() != EINTR)
            return RLAI_ERR_DISCONNECTED;
    }
}

static int zmq_send_bytes(rlai_client *c, const void *data, size_t len)
{
    for (;;) {
        zmq_drain_monitor(c);
        if (c->dead)
            return RLAI_ERR_DISCONNECTED;
        if (zmq_send(c->sock, data, len, ZMQ_DONTWAIT) >= 0)
            return 0;
        int e = zmq_errno();
        if (e != EAGAIN && e != EINTR)
            return RLAI_ERR_DISCONNECTED;
        zmq_pollitem_t items[2] = {
            {.socket = c->sock, .events = ZMQ_POLLOUT},
            {.socket = c->mon, .events = ZMQ_POLLIN},
        };
        if (zmq_poll(items, 2, 1000) < 0 && zmq_errno() != EINTR)
            return RLAI_ERR_DISCONNECTED;
    }
}

static int zsetint(void *sock, int opt, int v)
{
    return zmq_setsockopt(sock, opt, &v, sizeof v);
}

static int zmq_open(rlai_client *c, const char *ep, const char *api_key, char *err, size_t errlen)
{
    if (strncmp(ep, "ipc://", 6) == 0) {
        const char *path = ep + 6;
        struct stat st;
        if (path[0] != '@' && stat(path, &st) < 0) {
            rlai_errf(err, errlen, 0, "no engine at %s (is `rlai serve` running?)", ep);
            return RLAI_ERR_DISCONNECTED;
        }
    }
    c->ctx = zmq_ctx_new();
    if (!c->ctx)
        goto zfail;
    zmq_ctx_set(c->ctx, ZMQ_BLOCKY, 0);
    c->sock = zmq_socket(c->ctx, ZMQ_DEALER);
    if (!c->sock)
        goto zfail;
    int64_t maxmsg = RLAI_PROTO_MAX_FRAME;
    zsetint(c->sock, ZMQ_LINGER, 0);
    zsetint(c->sock, ZMQ_HEARTBEAT_IVL, 500);
    zsetint(c->sock, ZMQ_HEARTBEAT_TIMEOUT, 1500);
    zsetint(c->sock, ZMQ_HEARTBEAT_TTL, 1500);
    zmq_setsockopt(c->sock, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    if (strncmp(ep, "tcp://", 6) == 0 && strchr(ep, '['))
        zsetint(c->sock, ZMQ_IPV6, 1);
    if (strncmp(ep, "tcp://", 6) == 0 && api_key && *api_key) {
        c->keyed = true;
        if (zmq_setsockopt(c->sock, ZMQ_PLAIN_USERNAME, RLAI_ZMQ_PLAIN_USER, strlen(RLAI_ZMQ_PLAIN_USER)) < 0 ||
            zmq_setsockopt(c->sock, ZMQ_PLAIN_PASSWORD, api_key, strlen(api_key)) < 0)
            goto zfail;
    }
    int events = ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_CLOSED |
                 ZMQ_EVENT_CONNECT_RETRIED | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                 ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;
    if (zmq_socket_monitor(c->sock, MON_ADDR, events) < 0)
        goto zfail;
    c->mon = zmq_socket(c->ctx, ZMQ_PAIR);
    if (!c->mon)
        goto zfail;
    zsetint(c->mon, ZMQ_LINGER, 0);
    if (zmq_connect(c->mon, MON_ADDR) < 0)
        goto zfail;
    if (zmq_connect(c->sock, ep) < 0) {
        rlai_errf(err, errlen, 0, "invalid endpoint %s: %s", ep, zmq_strerror(zmq_errno()));
        return RLAI_ERR_INVALID_ARG;
    }

    /* One descriptor for poll-style users: readable when either the
     * DEALER or the monitor has something (both ZMQ_FDs). */
    c->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (c->epfd < 0)
        goto sysfail;
    void *socks[2] = {c->sock, c->mon};
    for (int i = 0; i < 2; i++) {
        int zfd;
        size_t sz = sizeof zfd;
        if (zmq_getsockopt(socks[i], ZMQ_FD, &zfd, &sz) < 0)
            goto zfail;
        struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)i};
        if (epoll_ctl(c->epfd, EPOLL_CTL_ADD, zfd, &ev) < 0)
            goto sysfail;
    }
    return 0;

zfail:
    rlai_errf(err, errlen, 0, "ZeroMQ: %s", zmq_strerror(zmq_errno()));
    return RLAI_ERR_IO;
sysfail:
    rlai_errf(err, errlen, 0, "epoll: %s", strerror(errno));
    return RLAI_ERR_IO;
}

/* -------------------------------------------------------- Unix socket */

/* Reads what is available (waiting up to `wait` ms for the first byte)
 * and queues complete frames. 1 = something queued, 0 = nothing yet,
 * <0 error (the connection is then dead). */
static int unix_read(rlai_client *c, int wait)
{
    struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
    int pr = poll(&pfd, 1, wait);
    if (pr < 0)
        return errno == EINTR ? 0 : RLAI_ERR_DISCONNECTED;
    if (pr == 0)
        return 0;
    int got = 0;
    for (;;) {
        ssize_t n = recv(c->fd, c->rbuf, READ_CHUNK, MSG_DONTWAIT);
        if (n == 0) {
            c->dead = true;
            return got ? 1 : RLAI_ERR_DISCONNECTED;
        }
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return got;
            c->dead = true;
            return got ? 1 : RLAI_ERR_DISCONNECTED;
        }
        size_t off = 0;
        while (off < (size_t)n) {
            size_t used = 0;
            const void *f = NULL;
            size_t flen = 0;
            int rc = rlai_frame_reader_feed(&c->rd, c->rbuf + off, (size_t)n - off, &used, &f, &flen);
            off += used;
            if (rc == 1) {
                if (queue_push(c, f, flen) < 0)
                    return RLAI_ERR_NOMEM;
                got = 1;
            } else if (rc == 0) {
                break;
            } else {
                c->dead = true;
                return got ? 1 : (rc == RLAI_ERR_NOMEM ? rc : RLAI_ERR_PROTOCOL);
            }
        }
        if ((size_t)n < READ_CHUNK)
            return got;
    }
}

static int unix_fetch(rlai_client *c, int64_t deadline)
{
    for (;;) {
        if (c->dead)
            return RLAI_ERR_DISCONNECTED;
        int wait = remaining(deadline);
        int rc = unix_read(c, wait);
        if (rc != 0)
            return rc < 0 ? rc : 0;
        if (wait == 0 || remaining(deadline) == 0)
            return RLAI_ERR_TIMEOUT;
    }
}

static int unix_send_bytes(rlai_client *c, const void *data, size_t len)
{
    if (c->dead)
        return RLAI_ERR_DISCONNECTED;
    unsigned char hdr[4];
    rlai_frame_header((uint32_t)len, hdr);
    size_t total = 4 + len, done = 0;
    while (done < total) {
        struct iovec iov[2];
        int niov = 0;
        if (done < 4) {
            iov[niov++] = (struct iovec){hdr + done, 4 - done};
            if (len)
                iov[niov++] = (struct iovec){(void *)data, len};
        } else {
            iov[niov++] = (struct iovec){(unsigned char *)data + (done - 4), total - done};
        }
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)niov};
        ssize_t n = sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            done += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            /* Wait for room, reading replies meanwhile so that neither
             * side can block the other forever. */
            struct pollfd pfd = {.fd = c->fd, .events = POLLOUT | POLLIN};
            if (poll(&pfd, 1, 1000) < 0 && errno != EINTR) {
                c->dead = true;
                return RLAI_ERR_DISCONNECTED;
            }
            if (pfd.revents & POLLIN) {
                int rc = unix_read(c, 0);
                if (rc < 0 && rc != RLAI_ERR_DISCONNECTED)
                    return rc;
                if (c->dead)
                    return RLAI_ERR_DISCONNECTED;
            }
            continue;
        }
        c->dead = true;
        return RLAI_ERR_DISCONNECTED;
    }
    return 0;
}

static int unix_open(rlai_client *c, const char *ep, const char *path, char *err, size_t errlen)
{
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof sa.sun_path) {
        rlai_errf(err, errlen, 0, "socket path too long: %s", path);
        return RLAI_ERR_INVALID_ARG;
    }
    strcpy(sa.sun_path, path);
    c->rbuf = malloc(READ_CHUNK);
    if (!c->rbuf)
        return RLAI_ERR_NOMEM;
    rlai_frame_reader_init(&c->rd, RLAI_PROTO_MAX_FRAME);
    c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c->fd < 0) {
        rlai_errf(err, errlen, 0, "socket: %s", strerror(errno));
        return RLAI_ERR_IO;
    }
    int r;
    do {
        r = connect(c->fd, (struct sockaddr *)&sa, sizeof sa);
    } while (r < 0 && errno == EINTR);
    if (r < 0) {
        int e = errno;
        if (e == ENOENT || e == ECONNREFUSED || e == ENOTSOCK || e == ENOTDIR)
            rlai_errf(err, errlen, 0, "no engine at %s (is `rlai serve` running?)", ep);
        else
            rlai_errf(err, errlen, 0, "cannot connect to %s: %s", ep, strerror(e));
        return e == EACCES || e == EPERM ? RLAI_ERR_IO : RLAI_ERR_DISCONNECTED;
    }
    int fl = fcntl(c->fd, F_GETFL);
    if (fl < 0 || fcntl(c->fd, F_SETFL, fl | O_NONBLOCK) < 0) {
        rlai_errf(err, errlen, 0, "fcntl: %s", strerror(errno));
        return RLAI_ERR_IO;
    }
    return 0;
}

/* ----------------------------------------------------------- generic */

static int fetch(rlai_client *c, int64_t deadline)
{
    return c->kind == CK_ZMQ ? zmq_fetch(c, deadline) : unix_fetch(c, deadline);
}

static int send_bytes(rlai_client *c, const void *data, size_t len)
{
    if (len > RLAI_PROTO_MAX_FRAME)
        return RLAI_ERR_TOO_LARGE;
    return c->kind == CK_ZMQ ? zmq_send_bytes(c, data, len) : unix_send_bytes(c, data, len);
}

static int decode_frame(rframe *f, rlai_msg *out)
{
    char derr[128];
    memset(out, 0, sizeof *out);
    int rc = rlai_proto_decode(f->data, f->len, out, derr, sizeof derr);
    free(f);
    if (rc < 0) {
        rlai_msg_free(out);
        memset(out, 0, sizeof *out);
        return RLAI_ERR_PROTOCOL;
    }
    return 0;
}

void rlai_client_close(rlai_client *c)
{
    if (!c)
        return;
    if (c->sock)
        zmq_socket_monitor(c->sock, NULL, 0);
    if (c->mon)
        zmq_close(c->mon);
    if (c->sock)
        zmq_close(c->sock);
    if (c->ctx)
        zmq_ctx_term(c->ctx);
    if (c->epfd >= 0)
        close(c->epfd);
    if (c->fd >= 0)
        close(c->fd);
    rlai_frame_reader_free(&c->rd);
    free(c->rbuf);
    rframe *f;
    while ((f = queue_pop(c)))
        free(f);
    rlai_buf_free(&c->enc);
    free(c->endpoint);
    free(c);
}

uint64_t rlai_client_next_id(rlai_client *c)
{
    return c ? c->next_id++ : 0;
}

int rlai_client_send(rlai_client *c, const rlai_msg *m)
{
    if (!c || !m)
        return RLAI_ERR_INVALID_ARG;
    rlai_buf_reset(&c->enc);
    int rc = rlai_proto_encode(m, &c->enc);
    if (rc < 0)
        return rc == -RLAI_PE_INTERNAL ? RLAI_ERR_NOMEM : RLAI_ERR_INVALID_ARG;
    return send_bytes(c, c->enc.data, c->enc.len);
}

int rlai_client_recv(rlai_client *c, int timeout_ms, rlai_msg *out)
{
    if (!c || !out)
        return RLAI_ERR_INVALID_ARG;
    int64_t deadline = timeout_ms < 0 ? -1 : rlai_clock_ms_int() + timeout_ms;
    if (!c->q_head) {
        int rc = fetch(c, deadline);
        if (rc < 0)
            return rc;
    }
    return decode_frame(queue_pop(c), out);
}

int rlai_client_cancel(rlai_client *c, uint64_t target)
{
    if (!c)
        return RLAI_ERR_INVALID_ARG;
    rlai_msg m;
    memset(&m, 0, sizeof m);
    m.type = RLAI_MSG_CANCEL;
    m.version = RLAI_PROTO_VERSION;
    m.id = rlai_client_next_id(c);
    m.u.cancel.target = target;
    return rlai_client_send(c, &m);
}

int rlai_client_fd(const rlai_client *c)
{
    if (!c)
        return -1;
    return c->kind == CK_ZMQ ? c->epfd : c->fd;
}

/* A clear message when a ZeroMQ handshake failed over the API key. */
static bool zmq_auth_message(rlai_client *c, char *err, size_t errlen)
{
    if (c->kind != CK_ZMQ || strncmp(c->endpoint, "tcp://", 6) != 0)
        return false;
    zmq_drain_monitor(c);
    if (c->connected && !c->auth_failed)
        return false;
    if (c->auth_failed)
        rlai_errf(err, errlen, 0, "the engine at %s refused the API key (wrong key; see RLAI_API_KEY and the key file "
                "~/.config/rlai/api_key)", c->endpoint);
    else if (c->mech_failed && !c->connected && c->keyed)
        rlai_errf(err, errlen, 0, "the engine at %s did not accept an authenticated connection (is it serving that "
                "endpoint without a key, --no-auth? then unset RLAI_API_KEY)", c->endpoint);
    else if (c->mech_failed && !c->connected)
        rlai_errf(err, errlen, 0, "the engine at %s requires an API key on this tcp:// endpoint (set RLAI_API_KEY or "
                "pass one; the key file is ~/.config/rlai/api_key)", c->endpoint);
    else
        return false;
    return true;
}

/* Sends a hello and waits for its done frame; frames of other ids stay
 * queued for the caller. */
static int hello(rlai_client *c, int timeout_ms, char *err, size_t errlen)
{
    rlai_msg h;
    memset(&h, 0, sizeof h);
    h.type = RLAI_MSG_HELLO;
    h.version = RLAI_PROTO_VERSION;
    h.id = rlai_client_next_id(c);
    h.u.hello.client = (char *)"librlai";
    int rc = rlai_client_send(c, &h);
    if (rc < 0) {
        if (zmq_auth_message(c, err, errlen))
            rc = RLAI_ERR_IO;
        else if (rc == RLAI_ERR_DISCONNECTED)
            rlai_errf(err, errlen, 0, "no engine at %s (is `rlai serve` running?)", c->endpoint);
        else
            rlai_errf(err, errlen, 0, "cannot send hello to %s: %s", c->endpoint, rlai_strerror(rc));
        return rc;
    }
    int64_t deadline = rlai_clock_ms_int() + timeout_ms;
    rframe *held = NULL, **held_tail = &held;
    for (;;) {
        if (!c->q_head) {
            rc = fetch(c, deadline);
            if (rc < 0) {
                if (zmq_auth_message(c, err, errlen)) {
                    rc = RLAI_ERR_IO;
                } else if (rc == RLAI_ERR_TIMEOUT) {
                    rc = RLAI_ERR_DISCONNECTED;
                    rlai_errf(err, errlen, 0, "no answer from an engine at %s within %d ms (is `rlai serve` running?)",
                            c->endpoint, timeout_ms);
                } else if (rc == RLAI_ERR_DISCONNECTED) {
                    rlai_errf(err, errlen, 0, "no engine at %s (is `rlai serve` running?)", c->endpoint);
                } else {
                    rlai_errf(err, errlen, 0, "hello with the engine at %s failed: %s", c->endpoint,
                            rlai_strerror(rc));
                }
                break;
            }
        }
        rframe *f = queue_pop(c);
        rlai_msg m;
        char derr[160];
        memset(&m, 0, sizeof m);
        int drc = rlai_proto_decode(f->data, f->len, &m, derr, sizeof derr);
        if (drc == 0 && m.id == h.id) {
            free(f);
            if (m.type == RLAI_MSG_DONE) {
                rlai_msg_free(&m);
                rc = 0;
                break;
            }
            if (m.type == RLAI_MSG_ERROR) {
                rlai_errf(err, errlen, 0, "engine at %s refused hello: %s: %s", c->endpoint,
                        m.u.error.name ? m.u.error.name : "?", m.u.error.msg ? m.u.error.msg : "");
                rlai_msg_free(&m);
                rc = RLAI_ERR_PROTOCOL;
                break;
            }
            rlai_msg_free(&m); /* e.g. a result frame with engine info */
            continue;
        }
        rlai_msg_free(&m);
        *held_tail = f; /* another request's frame: keep it in order */
        held_tail = &f->next;
    }
    /* put held frames back in front of the queue */
    if (held) {
        *held_tail = c->q_head;
        if (!c->q_head) {
            rframe *t = held;
            while (t->next)
                t = t->next;
            c->q_tail = t;
        }
        c->q_head = held;
    }
    return rc;
}

/* The socket directory of an ipc:// or unix:// endpoint must be private
 * to this user (ipc/sockdir.h), or a local attacker could stand in for the
 * engine. A missing directory is left to the connect (no engine there). */
static int check_dir(const char *ep, char *err, size_t errlen)
{
    const char *path = NULL;
    if (strncmp(ep, "ipc://", 6) == 0)
        path = ep + 6;
    else if (strncmp(ep, "unix://", 7) == 0)
        path = ep + 7;
    if (!path || path[0] == '@' || path[0] == '\0' || strcmp(path, "*") == 0)
        return 0;
    char derr[512];
    int fd = rlai_sockdir_open(path, false, derr, sizeof derr);
    if (fd >= 0) {
        close(fd);
        return 0;
    }
    if (strstr(derr, "does not exist")) {
        rlai_errf(err, errlen, 0, "no engine at %s (is `rlai serve` running?)", ep);
        return RLAI_ERR_DISCONNECTED;
    }
    rlai_errf(err, errlen, 0, "not connecting to %s: %s", ep, derr);
    return fd;
}

int rlai_client_connect(const char *endpoint, int timeout_ms, rlai_client **out, char *err,
                        size_t errlen)
{
    rlai_client_options o = {.timeout_ms = timeout_ms};
    return rlai_client_connect_opts(endpoint, &o, out, err, errlen);
}

int rlai_client_connect_opts(const char *endpoint, const rlai_client_options *opts, rlai_client **out,
                             char *err, size_t errlen)
{
    int timeout_ms = opts ? opts->timeout_ms : 0;
    const char *api_key = opts && opts->api_key && *opts->api_key ? opts->api_key : getenv("RLAI_API_KEY");
    if (err && errlen)
        err[0] = '\0';
    if (!out)
        return RLAI_ERR_INVALID_ARG;
    *out = NULL;
    char defbuf[512];
    if (!endpoint) {
        int rc = rlai_default_zmq_endpoint(defbuf, sizeof defbuf);
        if (rc < 0) {
            rlai_errf(err, errlen, 0, "default endpoint path too long");
            return rc;
        }
        endpoint = defbuf;
    }
    if (timeout_ms <= 0)
        timeout_ms = 2000;
    rlai_client *c = calloc(1, sizeof *c);
    if (!c)
        return RLAI_ERR_NOMEM;
    c->fd = -1;
    c->epfd = -1;
    c->next_id = 1;
    rlai_buf_init(&c->enc);
    c->endpoint = strdup(endpoint);
    if (!c->endpoint) {
        free(c);
        return RLAI_ERR_NOMEM;
    }
    int rc;
    if (strncmp(endpoint, "ipc://", 6) == 0 || strncmp(endpoint, "tcp://", 6) == 0) {
        c->kind = CK_ZMQ;
        rc = check_dir(endpoint, err, errlen);
        if (rc == 0)
            rc = zmq_open(c, endpoint, api_key, err, errlen);
    } else if (strncmp(endpoint, "unix://", 7) == 0) {
        c->kind = CK_UNIX;
        rc = check_dir(endpoint, err, errlen);
        if (rc == 0)
            rc = unix_open(c, endpoint, endpoint + 7, err, errlen);
    } else {
        rlai_errf(err, errlen, 0, "unsupported endpoint \"%s\" (expected ipc://PATH, tcp://HOST:PORT or unix://PATH)",
                endpoint);
        rc = RLAI_ERR_INVALID_ARG;
    }
    if (rc == 0)
        rc = hello(c, timeout_ms, err, errlen);
    if (rc < 0) {
        rlai_client_close(c);
        return rc;
    }
    *out = c;
    return 0;
}
