/* server.c - the daemon's transports (see server.h): one I/O thread serving
 * a ZeroMQ ROUTER (ipc:// and/or tcp://) and a Unix-domain socket listener.
 *
 * The server moves opaque bytes; it knows nothing of msgpack.
 *
 * ZeroMQ: clients are DEALERs sending single-part messages, so the ROUTER
 * reads [routing-id, payload]. An empty delimiter part before the payload
 * (REQ-style peers) is tolerated and remembered, so replies to that peer
 * carry it too; parts after the payload are ignored. A message larger than
 * max_frame is refused by libzmq itself (ZMQ_MAXMSGSIZE): the peer's
 * connection is closed by libzmq and on_message never sees it. Routing ids
 * map to rlai_conn handles; a peer is known gone when a send to it fails
 * (ZMQ_ROUTER_MANDATORY -> EHOSTUNREACH) or when a newer peer's message
 * arrives over the file descriptor it last used (the descriptor was closed
 * and reused, so its connection is over). Which of two peers is the newer
 * is told by libzmq's own routing ids, never by the order their messages
 * are read in: the ROUTER fair-queues its peers, so the last message of a
 * peer that left can be read after the first message of the peer that got
 * its descriptor (see zmq_note_fd).
 *
 * Unix socket: 4-byte big-endian length + payload in both directions,
 * non-blocking; output that the peer does not read is buffered (up to
 * max(16 MiB, 2 * max_frame) per connection, then the connection is
 * dropped), never blocking the I/O thread.
 *
 * Threads: the connection tables are written only by the I/O thread, under
 * `lock`; other threads read them under `lock` (rlai_server_send checks a
 * handle). Replies go through a mutex-protected queue and an eventfd that
 * the I/O thread polls with zmq_poll next to its sockets.
 */
#include "server.h"
#include "rlai/clock.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "frame.h"
#include "sockdir.h"
#include "zap.h"
#include "rlai/error.h"
#include "rlai/protocol.h"

#define OUT_CAP_MIN (16u << 20)     /* per-connection output cap (bytes) */
#define READ_CHUNK (64u << 10)
#define READ_ROUNDS 8               /* reads per readable UDS conn per loop turn */
#define ZMQ_BATCH 256               /* ROUTER messages per loop turn */
#define CLOSE_GRACE_MS 5000         /* server-side close: time to flush */
#define RETRY_MS 2                  /* retry interval for ZeroMQ sends hitting HWM */
#define ZMQ_SNDHWM_MSGS 10000

enum { CONN_ZMQ = 1, CONN_UDS = 2 };

typedef struct out_msg {
    struct out_msg *next;
    rlai_conn conn;
    size_t len;
    bool close;                     /* close marker (rlai_server_close_conn) */
    unsigned char data[];
} out_msg;

typedef struct conn {
    rlai_conn id;
    int kind;
    struct conn *hnext;             /* id hash chain */
    bool closing;                   /* server-side close requested */
    int64_t close_deadline;

    /* ZeroMQ */
    struct conn *rnext;             /* routing-id hash chain */
    uint64_t rhash;
    unsigned char rid[256];
    size_t rid_len;
    bool delim;                     /* peer sends an empty delimiter (REQ) */
    int srcfd;
    out_msg *zq_head, *zq_tail;     /* sends that hit the HWM, in order */
    size_t zq_bytes;
    struct conn *pnext;             /* list of conns with zq pending */

    /* Unix socket */
    int fd;
    size_t slot;                    /* index in srv->uds */
    rlai_frame_reader rd;
    unsigned char *out;
    size_t out_off, out_len, out_cap;
    bool dirty;
} conn;

typedef struct path_rec {
    char *path;
    dev_t dev;
    ino_t ino;
    bool have;
} path_rec;

struct rlai_server {
    rlai_server_callbacks cb;
    size_t max_frame, out_max;
    int max_conn;

    void *zctx, *router;
    rlai_zap *zap;                  /* PLAIN authentication of tcp:// binds; NULL = none */
    int listen_fd;
    int wake_fd;
    path_rec zmq_file, uds_file;

    pthread_t thread;
    bool thread_started;

    pthread_mutex_t lock;           /* queue, stop flag, conn tables (writes) */
    out_msg *q_head, *q_tail;
    bool wake_pending;
    bool stopping;
    int64_t stop_deadline;
    rlai_conn next_id;

    /* id -> conn */
    conn **idtab;
    size_t idtab_cap, n_conns;
    /* routing id -> conn (ZeroMQ) */
    conn **rtab;
    size_t rtab_cap, n_rconns;
    /* fd -> ZeroMQ conn last seen on it */
    conn **fdmap;
    size_t fdmap_cap;

    conn **uds;
    size_t n_uds, uds_cap;
    conn *pending;                  /* ZeroMQ conns with zq pending */
    size_t n_closing;

    zmq_pollitem_t *items;
    conn **item_conn;
    size_t items_cap;
};

static _Thread_local rlai_server *tl_io_server;

/* ------------------------------------------------------------ helpers */

static uint64_t hash_bytes(const void *p, size_t n)
{
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 1099511628211ull;
    }
    return h ^ (h >> 29);
}

static uint64_t hash_id(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

/* ------------------------------------------------------- conn tables */

static int tab_grow(conn ***tab, size_t *cap, size_t n, bool by_rid)
{
    if (n < *cap)
        return 0;
    size_t ncap = *cap ? *cap * 2 : 64;
    conn **nt = calloc(ncap, sizeof *nt);
    if (!nt)
        return RLAI_ERR_NOMEM;
    for (size_t i = 0; i < *cap; i++) {
        conn *c = (*tab)[i];
        while (c) {
            conn *nx = by_rid ? c->rnext : c->hnext;
            size_t b = (by_rid ? c->rhash : hash_id(c->id)) & (ncap - 1);
            if (by_rid) {
                c->rnext = nt[b];
            } else {
                c->hnext = nt[b];
            }
            nt[b] = c;
            c = nx;
        }
    }
    free(*tab);
    *tab = nt;
    *cap = ncap;
    return 0;
}

static conn *find_id(const rlai_server *s, rlai_conn id)
{
    if (!s->idtab_cap)
        return NULL;
    for (conn *c = s->idtab[hash_id(id) & (s->idtab_cap - 1)]; c; c = c->hnext)
        if (c->id == id)
            return c;
    return NULL;
}

static conn *find_rid(const rlai_server *s, const void *rid, size_t len, uint64_t h)
{
    if (!s->rtab_cap)
        return NULL;
    for (conn *c = s->rtab[h & (s->rtab_cap - 1)]; c; c = c->rnext)
        if (c->rhash == h && c->rid_len == len && memcmp(c->rid, rid, len) == 0)
            return c;
    return NULL;
}

/* Registers c (id assigned here). I/O thread only. */
static int conn_register(rlai_server *s, conn *c)
{
    pthread_mutex_lock(&s->lock);
    int rc = tab_grow(&s->idtab, &s->idtab_cap, s->n_conns, false);
    if (rc == 0 && c->kind == CONN_ZMQ)
        rc = tab_grow(&s->rtab, &s->rtab_cap, s->n_rconns, true);
    if (rc == 0) {
        c->id = ++s->next_id;
        size_t b = hash_id(c->id) & (s->idtab_cap - 1);
        c->hnext = s->idtab[b];
        s->idtab[b] = c;
        s->n_conns++;
        if (c->kind == CONN_ZMQ) {
            b = c->rhash & (s->rtab_cap - 1);
            c->rnext = s->rtab[b];
            s->rtab[b] = c;
            s->n_rconns++;
        }
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

static void conn_unregister(rlai_server *s, conn *c)
{
    pthread_mutex_lock(&s->lock);
    conn **pp = &s->idtab[hash_id(c->id) & (s->idtab_cap - 1)];
    while (*pp && *pp != c)
        pp = &(*pp)->hnext;
    if (*pp) {
        *pp = c->hnext;
        s->n_conns--;
    }
    if (c->kind == CONN_ZMQ) {
        pp = &s->rtab[c->rhash & (s->rtab_cap - 1)];
        while (*pp && *pp != c)
            pp = &(*pp)->rnext;
        if (*pp) {
            *pp = c->rnext;
            s->n_rconns--;
        }
    }
    pthread_mutex_unlock(&s->lock);
}

static void free_msgs(out_msg *m)
{
    while (m) {
        out_msg *nx = m->next;
        free(m);
        m = nx;
    }
}

/* Forgets a connection: closes it, calls on_disconnect when notify. I/O
 * thread only; c is freed. */
static void conn_drop(rlai_server *s, conn *c, bool notify)
{
    conn_unregister(s, c);
    if (c->closing && s->n_closing)
        s->n_closing--;
    if (c->kind == CONN_UDS) {
        close(c->fd);
        size_t last = s->n_uds - 1;
        if (c->slot != last) {
            s->uds[c->slot] = s->uds[last];
            s->uds[c->slot]->slot = c->slot;
        }
        s->n_uds--;
        rlai_frame_reader_free(&c->rd);
        free(c->out);
    } else {
        if (c->zq_head) {
            conn **pp = &s->pending;
            while (*pp && *pp != c)
                pp = &(*pp)->pnext;
            if (*pp)
                *pp = c->pnext;
            free_msgs(c->zq_head);
        }
        if (c->srcfd >= 0 && (size_t)c->srcfd < s->fdmap_cap && s->fdmap[c->srcfd] == c)
            s->fdmap[c->srcfd] = NULL;
    }
    rlai_conn id = c->id;
    free(c);
    if (notify && s->cb.on_disconnect)
        s->cb.on_disconnect(s->cb.user, id);
}

/* ------------------------------------------------------------- queue */

static void wake(rlai_server *s)
{
    uint64_t one = 1;
    ssize_t n;
    do {
        n = write(s->wake_fd, &one, sizeof one);
    } while (n < 0 && errno == EINTR);
}

static void enqueue(rlai_server *s, out_msg *m)
{
    bool do_wake = false;
    m->next = NULL;
    /* lock held by the caller */
    if (s->q_tail)
        s->q_tail->next = m;
    else
        s->q_head = m;
    s->q_tail = m;
    if (tl_io_server != s && !s->wake_pending) {
        s->wake_pending = true;
        do_wake = true;
    }
    pthread_mutex_unlock(&s->lock);
    if (do_wake)
        wake(s);
}

int rlai_server_send(rlai_server *s, rlai_conn conn_id, const void *data, size_t len)
{
    if (!s || (len && !data))
        return RLAI_ERR_INVALID_ARG;
    if (len > UINT32_MAX)
        return RLAI_ERR_TOO_LARGE;
    out_msg *m = malloc(sizeof *m + len);
    if (!m)
        return RLAI_ERR_NOMEM;
    m->conn = conn_id;
    m->len = len;
    m->close = false;
    if (len)
        memcpy(m->data, data, len);
    pthread_mutex_lock(&s->lock);
    if (!find_id(s, conn_id)) {
        pthread_mutex_unlock(&s->lock);
        free(m);
        return RLAI_ERR_DISCONNECTED;
    }
    enqueue(s, m);
    return 0;
}

void rlai_server_close_conn(rlai_server *s, rlai_conn conn_id)
{
    if (!s)
        return;
    out_msg *m = malloc(sizeof *m);
    if (!m)
        return;
    m->conn = conn_id;
    m->len = 0;
    m->close = true;
    pthread_mutex_lock(&s->lock);
    if (!find_id(s, conn_id)) {
        pthread_mutex_unlock(&s->lock);
        free(m);
        return;
    }
    enqueue(s, m);
}

/* ----------------------------------------------------- Unix sockets */

/* Appends one framed message to c's output buffer. Returns -1 when the
 * cap is exceeded or memory runs out (the caller drops the conn). */
static int uds_append(rlai_server *s, conn *c, const void *data, size_t len)
{
    size_t pending = c->out_len - c->out_off;
    if (pending + 4 + len > s->out_max)
        return -1;
    if (c->out_off && c->out_len + 4 + len > c->out_cap) {
        memmove(c->out, c->out + c->out_off, pending);
        c->out_off = 0;
        c->out_len = pending;
    }
    if (c->out_len + 4 + len > c->out_cap) {
        size_t cap = c->out_cap ? c->out_cap : 4096;
        while (cap < c->out_len + 4 + len)
            cap *= 2;
        unsigned char *nb = realloc(c->out, cap);
        if (!nb)
            return -1;
        c->out = nb;
        c->out_cap = cap;
    }
    rlai_frame_header((uint32_t)len, c->out + c->out_len);
    if (len)
        memcpy(c->out + c->out_len + 4, data, len);
    c->out_len += 4 + len;
    c->dirty = true;
    return 0;
}

/* Writes what the socket takes. Returns -1 if c was dropped. */
static int uds_flush(rlai_server *s, conn *c)
{
    c->dirty = false;
    while (c->out_off < c->out_len) {
        ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            c->out_off += (size_t)n;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            return 0;
        } else {
            conn_drop(s, c, true);
            return -1;
        }
    }
    c->out_off = c->out_len = 0;
    if (c->out_cap > (1u << 20)) {
        free(c->out);
        c->out = NULL;
        c->out_cap = 0;
    }
    if (c->closing) {
        conn_drop(s, c, true);
        return -1;
    }
    return 0;
}

static void uds_read(rlai_server *s, conn *c)
{
    unsigned char buf[READ_CHUNK];
    for (int round = 0; round < READ_ROUNDS; round++) {
        ssize_t n = recv(c->fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n == 0) {
            conn_drop(s, c, true);
            return;
        }
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return;
            conn_drop(s, c, true);
            return;
        }
        size_t off = 0;
        while (off < (size_t)n) {
            size_t used = 0;
            const void *f = NULL;
            size_t flen = 0;
            int rc = rlai_frame_reader_feed(&c->rd, buf + off, (size_t)n - off, &used, &f, &flen);
            off += used;
            if (rc == 1) {
                if (!c->closing && s->cb.on_message)
                    s->cb.on_message(s->cb.user, c->id, f, flen);
            } else if (rc == 0) {
                break;
            } else {
                if (s->cb.on_frame_error)
                    s->cb.on_frame_error(s->cb.user, c->id,
                                         rc == RLAI_ERR_TOO_LARGE ? "frame length over the limit"
                                         : rc == RLAI_ERR_PROTOCOL ? "zero frame length"
                                                                   : "out of memory");
                conn_drop(s, c, true);
                return;
            }
        }
        if ((size_t)n < sizeof buf)
            return;
    }
}

static void uds_accept(rlai_server *s)
{
    for (;;) {
        int fd = accept4(s->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            return; /* EAGAIN, or EMFILE & co: retried on the next readiness */
        }
        if (s->n_uds >= (size_t)s->max_conn) {
            close(fd);
            continue;
        }
        if (s->n_uds == s->uds_cap) {
            size_t ncap = s->uds_cap ? s->uds_cap * 2 : 16;
            conn **nu = realloc(s->uds, ncap * sizeof *nu);
            if (!nu) {
                close(fd);
                continue;
            }
            s->uds = nu;
            s->uds_cap = ncap;
        }
        conn *c = calloc(1, sizeof *c);
        if (!c) {
            close(fd);
            continue;
        }
        c->kind = CONN_UDS;
        c->fd = fd;
        c->srcfd = -1;
        rlai_frame_reader_init(&c->rd, s->max_frame);
        if (conn_register(s, c) < 0) {
            close(fd);
            free(c);
            continue;
        }
        c->slot = s->n_uds;
        s->uds[s->n_uds++] = c;
    }
}

/* ------------------------------------------------------------ ZeroMQ */

static void free_hint(void *data, void *hint)
{
    (void)data;
    free(hint);
}

/* Sends m to c. Returns 0 (sent; m consumed), 1 (HWM reached: m kept) or
 * -1 (peer gone; m kept). */
static int zmq_try_send(rlai_server *s, conn *c, out_msg *m)
{
    if (zmq_send(s->router, c->rid, c->rid_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
        return (zmq_errno() == EAGAIN || zmq_errno() == EINTR) ? 1 : -1;
    if (c->delim)
        zmq_send(s->router, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_msg_t msg;
    if (m->len > 64) {
        if (zmq_msg_init_data(&msg, m->data, m->len, free_hint, m) == 0) {
            if (zmq_msg_send(&msg, s->router, ZMQ_DONTWAIT) < 0)
                zmq_msg_close(&msg); /* frees m through free_hint */
            return 0;
        }
    }
    zmq_send(s->router, m->data, m->len, ZMQ_DONTWAIT);
    free(m);
    return 0;
}

static void pending_add(rlai_server *s, conn *c, out_msg *m)
{
    m->next = NULL;
    if (!c->zq_head) {
        c->zq_head = c->zq_tail = m;
        c->pnext = s->pending;
        s->pending = c;
    } else {
        c->zq_tail->next = m;
        c->zq_tail = m;
    }
    c->zq_bytes += m->len;
}

/* Retries sends that hit the HWM. */
static void zmq_retry(rlai_server *s)
{
    conn *c = s->pending;
    while (c) {
        conn *nx = c->pnext;
        int rc = 0;
        while (c->zq_head) {
            out_msg *m = c->zq_head;
            out_msg *mnext = m->next;
            size_t mlen = m->len;
            rc = zmq_try_send(s, c, m);
            if (rc != 0)
                break;
            c->zq_head = mnext;
            c->zq_bytes -= mlen;
        }
        if (rc < 0) {
            conn_drop(s, c, true);
        } else if (!c->zq_head) {
            c->zq_tail = NULL;
            conn **pp = &s->pending;
            while (*pp != c)
                pp = &(*pp)->pnext;
            *pp = c->pnext;
            if (c->closing)
                conn_drop(s, c, true);
        }
        c = nx;
    }
}

static conn *zmq_conn_for(rlai_server *s, const void *rid, size_t rid_len)
{
    uint64_t h = hash_bytes(rid, rid_len);
    conn *c = find_rid(s, rid, rid_len, h);
    if (c)
        return c;
    if (rid_len > sizeof c->rid)
        return NULL;
    c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->kind = CONN_ZMQ;
    c->fd = -1;
    c->srcfd = -1;
    c->rhash = h;
    memcpy(c->rid, rid, rid_len);
    c->rid_len = rid_len;
    if (conn_register(s, c) < 0) {
        free(c);
        return NULL;
    }
    return c;
}

/* Which of two ROUTER peers connected later, when that can be known. A peer
 * that chose no routing id of its own (every rlai client) is named by
 * libzmq 0x00 + a big-endian 32-bit counter that the ROUTER increments for
 * each new connection, so the larger counter (serial-number arithmetic: it
 * may wrap) is the newer connection. Returns > 0 when a is newer than b,
 * < 0 when older, 0 when unknown (a routing id a peer chose itself). */
static int zmq_conn_order(const conn *a, const conn *b)
{
    if (a->rid_len != 5 || b->rid_len != 5 || a->rid[0] != 0 || b->rid[0] != 0)
        return 0;
    uint32_t x = (uint32_t)a->rid[1] << 24 | (uint32_t)a->rid[2] << 16 | (uint32_t)a->rid[3] << 8 | a->rid[4];
    uint32_t y = (uint32_t)b->rid[1] << 24 | (uint32_t)b->rid[2] << 16 | (uint32_t)b->rid[3] << 8 | b->rid[4];
    uint32_t d = x - y;
    return d == 0 ? 0 : d < 0x80000000u ? 1 : -1;
}

/* Records that c's message came over fd. Another conn that last used the
 * same descriptor is over (the descriptor was closed and reused), unless c
 * is the older of the two: then the message is the late last one of a
 * peer that has left, read after the first message of the peer that now
 * has its descriptor (the ROUTER fair-queues its peers). Returns true when
 * the message is to be delivered, false when c was dropped instead. When
 * the order cannot be known (a routing id a peer chose), neither conn is
 * dropped: a gone peer is then found at the next send to it. */
static bool zmq_note_fd(rlai_server *s, conn *c, int fd)
{
    if (fd < 0 || c->srcfd == fd)
        return true;
    if ((size_t)fd >= s->fdmap_cap) {
        size_t ncap = s->fdmap_cap ? s->fdmap_cap : 64;
        while (ncap <= (size_t)fd)
            ncap *= 2;
        conn **nm = realloc(s->fdmap, ncap * sizeof *nm);
        if (!nm)
            return true;
        memset(nm + s->fdmap_cap, 0, (ncap - s->fdmap_cap) * sizeof *nm);
        s->fdmap = nm;
        s->fdmap_cap = ncap;
    }
    conn *old = s->fdmap[fd];
    if (old && old != c) {
        int order = zmq_conn_order(c, old);
        if (order < 0) {
            conn_drop(s, c, true);   /* c left; old has its descriptor now */
            return false;
        }
        old->srcfd = -1;
        if (order > 0)
            conn_drop(s, old, true); /* old left; c has its descriptor */
    }
    if (c->srcfd >= 0 && (size_t)c->srcfd < s->fdmap_cap && s->fdmap[c->srcfd] == c)
        s->fdmap[c->srcfd] = NULL;
    s->fdmap[fd] = c;
    c->srcfd = fd;
    return true;
}

static void zmq_read(rlai_server *s)
{
    for (int i = 0; i < ZMQ_BATCH; i++) {
        zmq_msg_t rid, part;
        zmq_msg_init(&rid);
        if (zmq_msg_recv(&rid, s->router, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&rid);
            if (zmq_errno() == EINTR)
                continue;
            return;
        }
        if (!zmq_msg_more(&rid)) {
            zmq_msg_close(&rid);
            continue;
        }
        zmq_msg_init(&part);
        int ok = zmq_msg_recv(&part, s->router, ZMQ_DONTWAIT) >= 0;
        bool delim = false;
        if (ok && zmq_msg_size(&part) == 0 && zmq_msg_more(&part)) {
            delim = true;
            zmq_msg_close(&part);
            zmq_msg_init(&part);
            ok = zmq_msg_recv(&part, s->router, ZMQ_DONTWAIT) >= 0;
        }
        if (ok) {
            int more = zmq_msg_more(&part);
            while (more) { /* extra parts: ignored */
                zmq_msg_t x;
                zmq_msg_init(&x);
                if (zmq_msg_recv(&x, s->router, ZMQ_DONTWAIT) < 0) {
                    zmq_msg_close(&x);
                    break;
                }
                more = zmq_msg_more(&x);
                zmq_msg_close(&x);
            }
            conn *c = zmq_conn_for(s, zmq_msg_data(&rid), zmq_msg_size(&rid));
            if (c) {
                c->delim = delim;
                if (zmq_note_fd(s, c, zmq_msg_get(&part, ZMQ_SRCFD)) && !c->closing && s->cb.on_message)
                    s->cb.on_message(s->cb.user, c->id, zmq_msg_data(&part), zmq_msg_size(&part));
            }
        }
        zmq_msg_close(&part);
        zmq_msg_close(&rid);
    }
}

/* ------------------------------------------------------------ I/O loop */

static void drain_queue(rlai_server *s)
{
    pthread_mutex_lock(&s->lock);
    out_msg *m = s->q_head;
    s->q_head = s->q_tail = NULL;
    s->wake_pending = false;
    pthread_mutex_unlock(&s->lock);
    if (!m)
        return;
    while (m) {
        out_msg *nx = m->next;
        conn *c = find_id(s, m->conn);
        if (!c) {
            free(m);
        } else if (m->close) {
            free(m);
            if (c->kind == CONN_UDS) {
                if (!c->closing) {
                    c->closing = true;
                    c->close_deadline = rlai_clock_ms_int() + CLOSE_GRACE_MS;
                    s->n_closing++;
                }
                c->dirty = true; /* uds_flush drops it once the output is written */
            } else if (c->zq_head) {
                if (!c->closing) {
                    c->closing = true;
                    c->close_deadline = rlai_clock_ms_int() + CLOSE_GRACE_MS;
                    s->n_closing++;
                }
            } else {
                conn_drop(s, c, true);
            }
        } else if (c->kind == CONN_UDS) {
            int rc = uds_append(s, c, m->data, m->len);
            free(m);
            if (rc < 0)
                conn_drop(s, c, true);
        } else if (c->zq_head) {
            pending_add(s, c, m);
            if (c->zq_bytes > s->out_max)
                conn_drop(s, c, true);
        } else {
            int rc = zmq_try_send(s, c, m);
            if (rc == 1) {
                pending_add(s, c, m);
            } else if (rc < 0) {
                free(m);
                conn_drop(s, c, true);
            }
        }
        m = nx;
    }
    for (size_t i = 0; i < s->n_uds;) {
        conn *c = s->uds[i];
        if (c->dirty && uds_flush(s, c) < 0)
            continue; /* dropped: slot i now holds another conn */
        i++;
    }
}

static void expire_closing(rlai_server *s, int64_t now)
{
    for (size_t i = 0; i < s->n_uds;) {
        conn *c = s->uds[i];
        if (c->closing && now >= c->close_deadline) {
            conn_drop(s, c, true);
            continue;
        }
        i++;
    }
    for (conn *c = s->pending; c;) {
        conn *nx = c->pnext;
        if (c->closing && now >= c->close_deadline)
            conn_drop(s, c, true);
        c = nx;
    }
}

static bool output_pending(const rlai_server *s)
{
    if (s->pending)
        return true;
    for (size_t i = 0; i < s->n_uds; i++)
        if (s->uds[i]->out_len > s->uds[i]->out_off)
            return true;
    return false;
}

static int items_reserve(rlai_server *s, size_t n)
{
    if (n <= s->items_cap)
        return 0;
    size_t ncap = s->items_cap ? s->items_cap : 16;
    while (ncap < n)
        ncap *= 2;
    zmq_pollitem_t *ni = realloc(s->items, ncap * sizeof *ni);
    if (!ni)
        return -1;
    s->items = ni;
    conn **nc = realloc(s->item_conn, ncap * sizeof *nc);
    if (!nc)
        return -1;
    s->item_conn = nc;
    s->items_cap = ncap;
    return 0;
}

static void *io_main(void *arg)
{
    rlai_server *s = arg;
    tl_io_server = s;
    for (;;) {
        drain_queue(s);
        if (s->pending)
            zmq_retry(s);
        int64_t now = rlai_clock_ms_int();
        if (s->n_closing)
            expire_closing(s, now);

        pthread_mutex_lock(&s->lock);
        bool stopping = s->stopping;
        int64_t deadline = s->stop_deadline;
        bool queued = s->q_head != NULL;
        pthread_mutex_unlock(&s->lock);
        /* More replies already queued: poll without sleeping (so a steady
         * stream of replies cannot starve input), then drain again. */
        if (stopping && ((!queued && !output_pending(s)) || now >= deadline))
            break;

        size_t n = 0;
        if (items_reserve(s, 3 + s->n_uds) < 0) {
            /* cannot build the poll set: wait a little and retry */
            struct timespec ts = {0, 10 * 1000000};
            nanosleep(&ts, NULL);
            continue;
        }
        s->items[n] = (zmq_pollitem_t){.socket = NULL, .fd = s->wake_fd, .events = ZMQ_POLLIN};
        s->item_conn[n++] = NULL;
        size_t i_router = SIZE_MAX, i_listen = SIZE_MAX;
        if (s->router && !stopping) {
            i_router = n;
            s->items[n] = (zmq_pollitem_t){.socket = s->router, .events = ZMQ_POLLIN};
            s->item_conn[n++] = NULL;
        }
        if (s->listen_fd >= 0 && !stopping) {
            i_listen = n;
            s->items[n] = (zmq_pollitem_t){.socket = NULL, .fd = s->listen_fd, .events = ZMQ_POLLIN};
            s->item_conn[n++] = NULL;
        }
        size_t first_conn = n;
        for (size_t i = 0; i < s->n_uds; i++) {
            conn *c = s->uds[i];
            short ev = stopping ? 0 : ZMQ_POLLIN;
            if (c->out_len > c->out_off)
                ev |= ZMQ_POLLOUT;
            s->items[n] = (zmq_pollitem_t){.socket = NULL, .fd = c->fd, .events = ev};
            s->item_conn[n++] = c;
        }

        long timeout = -1;
        if (queued)
            timeout = 0;
        else if (s->pending)
            timeout = RETRY_MS;
        else if (s->n_closing)
            timeout = 100;
        if (stopping) {
            long left = (long)(deadline - now);
            if (left < 0)
                left = 0;
            if (timeout < 0 || left < timeout)
                timeout = left;
        }
        int rc = zmq_poll(s->items, (int)n, timeout);
        if (rc < 0) {
            if (zmq_errno() == EINTR)
                continue;
            /* ETERM/EFAULT cannot happen while we own the context; stop. */
            break;
        }
        if (rc == 0)
            continue;
        if (s->items[0].revents & ZMQ_POLLIN) {
            uint64_t v;
            ssize_t r = read(s->wake_fd, &v, sizeof v);
            (void)r;
        }
        if (i_router != SIZE_MAX && (s->items[i_router].revents & ZMQ_POLLIN))
            zmq_read(s);
        /* Unix-socket conns: each item's conn may only be dropped while it
         * is handled, so the snapshot in item_conn stays valid. The
         * exception is a conn accepted below, which is not in the snapshot. */
        for (size_t i = first_conn; i < n; i++) {
            conn *c = s->item_conn[i];
            short rev = s->items[i].revents;
            if (!rev)
                continue;
            if (rev & ZMQ_POLLOUT) {
                if (uds_flush(s, c) < 0)
                    continue;
            }
            if (rev & (ZMQ_POLLIN | ZMQ_POLLERR)) {
                if (stopping) {
                    if (rev & ZMQ_POLLERR)
                        conn_drop(s, c, false);
                } else {
                    uds_read(s, c);
                }
            }
        }
        if (i_listen != SIZE_MAX && (s->items[i_listen].revents & ZMQ_POLLIN))
            uds_accept(s);
    }

    /* Shutdown: close connections without callbacks. */
    while (s->n_uds) {
        conn *c = s->uds[s->n_uds - 1];
        conn_drop(s, c, false);
    }
    while (s->pending)
        conn_drop(s, s->pending, false);
    if (s->router) {
        int64_t left = s->stop_deadline - rlai_clock_ms_int();
        int linger = left > 0 ? (int)(left > INT_MAX ? INT_MAX : left) : 0;
        zmq_setsockopt(s->router, ZMQ_LINGER, &linger, sizeof linger);
        zmq_close(s->router);
        s->router = NULL;
    }
    tl_io_server = NULL;
    return NULL;
}

/* ------------------------------------------------------------- set-up */

static int fill_sun(struct sockaddr_un *sa, const char *path, char *err, size_t errlen)
{
    memset(sa, 0, sizeof *sa);
    sa->sun_family = AF_UNIX;
    if (strlen(path) >= sizeof sa->sun_path) {
        rlai_errf(err, errlen, 0, "socket path too long (max %zu bytes): %s", sizeof sa->sun_path - 1, path);
        return RLAI_ERR_INVALID_ARG;
    }
    strcpy(sa->sun_path, path);
    return 0;
}

/* Removes a stale socket file at path; fails if a live server answers. */
static int check_stale(const char *path, char *err, size_t errlen)
{
    struct stat st;
    if (lstat(path, &st) < 0) {
        if (errno == ENOENT)
            return 0;
        rlai_errf(err, errlen, 0, "cannot stat %s: %s", path, strerror(errno));
        return RLAI_ERR_IO;
    }
    if (!S_ISSOCK(st.st_mode)) {
        rlai_errf(err, errlen, 0, "%s exists and is not a socket; not replacing it", path);
        return RLAI_ERR_IO;
    }
    struct sockaddr_un sa;
    int rc = fill_sun(&sa, path, err, errlen);
    if (rc < 0)
        return rc;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        rlai_errf(err, errlen, 0, "socket: %s", strerror(errno));
        return RLAI_ERR_IO;
    }
    int r;
    do {
        r = connect(fd, (struct sockaddr *)&sa, sizeof sa);
    } while (r < 0 && errno == EINTR);
    int e = errno;
    close(fd);
    if (r == 0 || e == EAGAIN) {
        rlai_errf(err, errlen, 0, "another engine is already serving at %s", path);
        return RLAI_ERR_BUSY;
    }
    if (e == ECONNREFUSED) {
        if (unlink(path) < 0 && errno != ENOENT) {
            rlai_errf(err, errlen, 0, "cannot remove stale socket %s: %s", path, strerror(errno));
            return RLAI_ERR_IO;
        }
        return 0;
    }
    if (e == ENOENT)
        return 0;
    rlai_errf(err, errlen, 0, "cannot check existing socket %s: %s", path, strerror(e));
    return RLAI_ERR_IO;
}

static int record_file(path_rec *pr, const char *path, char *err, size_t errlen)
{
    pr->path = strdup(path);
    if (!pr->path)
        return RLAI_ERR_NOMEM;
    if (chmod(path, 0600) < 0) {
        rlai_errf(err, errlen, 0, "cannot chmod 0600 %s: %s", path, strerror(errno));
        return RLAI_ERR_IO;
    }
    struct stat st;
    if (stat(path, &st) == 0) {
        pr->dev = st.st_dev;
        pr->ino = st.st_ino;
        pr->have = true;
    }
    return 0;
}

static void remove_file(path_rec *pr)
{
    if (!pr->path)
        return;
    struct stat st;
    if (pr->have && lstat(pr->path, &st) == 0 && st.st_dev == pr->dev && st.st_ino == pr->ino)
        unlink(pr->path);
    free(pr->path);
    pr->path = NULL;
}

static int zsetint(void *sock, int opt, int v)
{
    return zmq_setsockopt(sock, opt, &v, sizeof v);
}

static int bind_zmq(rlai_server *s, const char *ep, bool is_primary, char *err, size_t errlen)
{
    const char *ipc_path = NULL;
    bool is_tcp = false;
    int dfd = -1;
    if (strncmp(ep, "ipc://", 6) == 0) {
        ipc_path = ep + 6;
        if (ipc_path[0] == '@' || strcmp(ipc_path, "*") == 0 || ipc_path[0] == '\0')
            ipc_path = NULL; /* abstract namespace / wildcard: no file */
    } else if (strncmp(ep, "tcp://", 6) == 0) {
        is_tcp = true;
        if (strchr(ep, '['))
            zsetint(s->router, ZMQ_IPV6, 1);
    } else {
        rlai_errf(err, errlen, 0, "unsupported ZeroMQ endpoint %s (expected ipc:// or tcp://)", ep);
        return RLAI_ERR_INVALID_ARG;
    }
    if (ipc_path) {
        struct sockaddr_un sa;
        int rc = fill_sun(&sa, ipc_path, err, errlen);
        if (rc < 0)
            return rc;
        if ((dfd = rlai_sockdir_open(ipc_path, true, err, errlen)) < 0)
            return dfd;
        if ((rc = check_stale(ipc_path, err, errlen)) < 0) {
            close(dfd);
            return rc;
        }
    }
    /* Security options are taken by each listener at bind time: PLAIN
     * (checked by the ZAP handler) for tcp:// when a key is set, the NULL
     * mechanism for ipc:// (guarded by the 0700 directory). */
    bool plain = is_tcp && s->zap;
    zsetint(s->router, ZMQ_PLAIN_SERVER, plain ? 1 : 0);
    zmq_setsockopt(s->router, ZMQ_ZAP_DOMAIN, plain ? "rlai" : "", plain ? 4 : 0);
    if (zmq_bind(s->router, ep) < 0) {
        int e = zmq_errno();
        rlai_errf(err, errlen, 0, "cannot bind %s: %s", ep, zmq_strerror(e));
        if (dfd >= 0)
            close(dfd);
        return e == EADDRINUSE ? RLAI_ERR_BUSY : RLAI_ERR_IO;
    }
    if (dfd >= 0) {
        bool same = rlai_sockdir_same(dfd, ipc_path);
        close(dfd);
        if (!same) {
            rlai_errf(err, errlen, 0, "the socket directory of %s was replaced while binding; refusing it", ipc_path);
            return RLAI_ERR_IO;
        }
    }
    if (ipc_path) {
        path_rec *pr = &s->zmq_file;
        if (!is_primary && pr->path) {
            /* Two ipc endpoints: keep the first record (rare configuration). */
            return 0;
        }
        return record_file(pr, ipc_path, err, errlen);
    }
    return 0;
}

static int bind_uds(rlai_server *s, const char *path, char *err, size_t errlen)
{
    struct sockaddr_un sa;
    int rc = fill_sun(&sa, path, err, errlen);
    if (rc < 0)
        return rc;
    int dfd = rlai_sockdir_open(path, true, err, errlen);
    if (dfd < 0)
        return dfd;
    if ((rc = check_stale(path, err, errlen)) < 0) {
        close(dfd);
        return rc;
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        rlai_errf(err, errlen, 0, "socket: %s", strerror(errno));
        close(dfd);
        return RLAI_ERR_IO;
    }
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
        int e = errno;
        close(fd);
        close(dfd);
        rlai_errf(err, errlen, 0, "cannot bind %s: %s", path, strerror(e));
        return e == EADDRINUSE ? RLAI_ERR_BUSY : RLAI_ERR_IO;
    }
    s->listen_fd = fd;
    bool same = rlai_sockdir_same(dfd, path);
    close(dfd);
    if (!same) {
        rlai_errf(err, errlen, 0, "the socket directory of %s was replaced while binding; refusing it", path);
        return RLAI_ERR_IO;
    }
    if ((rc = record_file(&s->uds_file, path, err, errlen)) < 0)
        return rc;
    if (listen(fd, 128) < 0) {
        rlai_errf(err, errlen, 0, "listen %s: %s", path, strerror(errno));
        return RLAI_ERR_IO;
    }
    return 0;
}

static void server_free(rlai_server *s)
{
    if (s->router)
        zmq_close(s->router);
    if (s->zctx) {
        zmq_ctx_shutdown(s->zctx); /* ends the ZAP handler's receive */
        rlai_zap_stop(s->zap);
        s->zap = NULL;
        zmq_ctx_term(s->zctx);
    }
    if (s->listen_fd >= 0)
        close(s->listen_fd);
    remove_file(&s->uds_file);
    remove_file(&s->zmq_file);
    if (s->wake_fd >= 0)
        close(s->wake_fd);
    /* conns left by an early failure (none normally: the I/O thread drops them) */
    for (size_t i = 0; i < s->idtab_cap; i++) {
        conn *c = s->idtab[i];
        while (c) {
            conn *nx = c->hnext;
            if (c->kind == CONN_UDS) {
                close(c->fd);
                rlai_frame_reader_free(&c->rd);
                free(c->out);
            } else {
                free_msgs(c->zq_head);
            }
            free(c);
            c = nx;
        }
    }
    free(s->idtab);
    free(s->rtab);
    free(s->fdmap);
    free(s->uds);
    free(s->items);
    free(s->item_conn);
    free_msgs(s->q_head);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

int rlai_server_start(const rlai_server_config *cfg, const rlai_server_callbacks *cb,
                      rlai_server **out, char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = '\0';
    if (!out || !cfg || !cb) {
        rlai_errf(err, errlen, 0, "rlai_server_start: NULL argument");
        return RLAI_ERR_INVALID_ARG;
    }
    *out = NULL;
    bool has_zmq = (cfg->zmq_endpoint && *cfg->zmq_endpoint) ||
                   (cfg->zmq_tcp_endpoint && *cfg->zmq_tcp_endpoint);
    bool has_uds = cfg->uds_path && *cfg->uds_path;
    if (!has_zmq && !has_uds) {
        rlai_errf(err, errlen, 0, "no endpoint configured");
        return RLAI_ERR_INVALID_ARG;
    }
    rlai_server *s = calloc(1, sizeof *s);
    if (!s)
        return RLAI_ERR_NOMEM;
    s->cb = *cb;
    s->max_frame = cfg->max_frame ? cfg->max_frame : RLAI_PROTO_MAX_FRAME;
    if (s->max_frame > UINT32_MAX)
        s->max_frame = UINT32_MAX;
    s->out_max = s->max_frame * 2 > OUT_CAP_MIN ? s->max_frame * 2 : OUT_CAP_MIN;
    s->max_conn = cfg->max_connections > 0 ? cfg->max_connections : 256;
    s->listen_fd = -1;
    s->wake_fd = -1;
    pthread_mutex_init(&s->lock, NULL);

    int rc = 0;
    s->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (s->wake_fd < 0) {
        rlai_errf(err, errlen, 0, "eventfd: %s", strerror(errno));
        rc = RLAI_ERR_IO;
        goto fail;
    }
    if (has_zmq) {
        s->zctx = zmq_ctx_new();
        if (!s->zctx) {
            rlai_errf(err, errlen, 0, "zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
            rc = RLAI_ERR_IO;
            goto fail;
        }
        zmq_ctx_set(s->zctx, ZMQ_BLOCKY, 0);
        s->router = zmq_socket(s->zctx, ZMQ_ROUTER);
        if (!s->router) {
            rlai_errf(err, errlen, 0, "zmq_socket: %s", zmq_strerror(zmq_errno()));
            rc = RLAI_ERR_IO;
            goto fail;
        }
        int64_t maxmsg = (int64_t)s->max_frame;
        zsetint(s->router, ZMQ_ROUTER_MANDATORY, 1);
        zsetint(s->router, ZMQ_HEARTBEAT_IVL, 500);
        zsetint(s->router, ZMQ_HEARTBEAT_TIMEOUT, 1500);
        zsetint(s->router, ZMQ_HEARTBEAT_TTL, 1500);
        zsetint(s->router, ZMQ_LINGER, 100);
        zsetint(s->router, ZMQ_SNDHWM, ZMQ_SNDHWM_MSGS);
        zmq_setsockopt(s->router, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
        bool any_tcp = (cfg->zmq_endpoint && !strncmp(cfg->zmq_endpoint, "tcp://", 6)) ||
                       (cfg->zmq_tcp_endpoint && !strncmp(cfg->zmq_tcp_endpoint, "tcp://", 6));
        if (any_tcp && cfg->zmq_tcp_api_key && *cfg->zmq_tcp_api_key &&
            (rc = rlai_zap_start(s->zctx, RLAI_ZMQ_PLAIN_USER, cfg->zmq_tcp_api_key, &s->zap, err, errlen)) < 0)
            goto fail;
        if (cfg->zmq_endpoint && *cfg->zmq_endpoint &&
            (rc = bind_zmq(s, cfg->zmq_endpoint, true, err, errlen)) < 0)
            goto fail;
        if (cfg->zmq_tcp_endpoint && *cfg->zmq_tcp_endpoint &&
            (rc = bind_zmq(s, cfg->zmq_tcp_endpoint, false, err, errlen)) < 0)
            goto fail;
    }
    if (has_uds && (rc = bind_uds(s, cfg->uds_path, err, errlen)) < 0)
        goto fail;

    /* *out is set before the I/O thread starts: a client that connects as
     * soon as the socket exists gets its first frame handled on that
     * thread, and a callback answering through the caller's copy of *out
     * (rlai_server_send) must already find the server there. */
    *out = s;
    if (pthread_create(&s->thread, NULL, io_main, s) != 0) {
        *out = NULL;
        rlai_errf(err, errlen, 0, "cannot start the I/O thread");
        rc = RLAI_ERR_NOMEM;
        goto fail;
    }
    s->thread_started = true;
    return 0;

fail:
    if (s->router) {
        zsetint(s->router, ZMQ_LINGER, 0);
    }
    server_free(s);
    return rc;
}

void rlai_server_stop(rlai_server *s, int timeout_ms)
{
    if (!s)
        return;
    if (timeout_ms < 0)
        timeout_ms = 0;
    pthread_mutex_lock(&s->lock);
    s->stopping = true;
    s->stop_deadline = rlai_clock_ms_int() + timeout_ms;
    pthread_mutex_unlock(&s->lock);
    if (s->thread_started) {
        wake(s);
        pthread_join(s->thread, NULL);
    }
    server_free(s);
}
