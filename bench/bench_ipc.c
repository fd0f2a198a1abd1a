/* bench_ipc.c - transport latency and streaming cost.
 *
 * For ZeroMQ ipc, ZeroMQ tcp (loopback), the Unix socket and a plain
 * socketpair baseline (echo thread on the other end), measured in the same
 * run:
 *   rt p50/p99     round trip of a ~40-byte request echoed by the server
 *                  (reply queued from the I/O thread's on_message);
 *   stream us/fr   one-way stream of 10k ~60-byte frames queued by another
 *                  thread with rlai_server_send, total time / frames;
 *   paced p50/p99  one-way latency of frames sent every 200 us by another
 *                  thread (send timestamp carried in the frame): the
 *                  per-token latency the transport adds.
 * Two extra rows go through the client library (msgpack encode/decode and
 * the hello on connect), round trip only.
 *
 * Usage: bench_ipc [round_trips] (default 20000)
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "../ipc/frame.h"
#include "../ipc/server.h"
#include "rlai/client.h"
#include "rlai/protocol.h"

#define STREAM_FRAMES 10000
#define PACED_FRAMES 2000
#define PACE_NS 200000
#define FRAME_BYTES 60
#define REQ_BYTES 40

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void sleep_until(int64_t t)
{
    while (now_ns() < t) {
        int64_t left = t - now_ns();
        if (left > 60000) {
            struct timespec ts = {0, left - 50000};
            nanosleep(&ts, NULL);
        }
    }
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

static double pct(int64_t *v, size_t n, double p)
{
    qsort(v, n, sizeof *v, cmp_i64);
    size_t i = (size_t)(p * (double)(n - 1));
    return (double)v[i] / 1000.0;
}

/* ------------------------------------------------------------- server */

typedef struct job {
    rlai_conn conn;
    int kind; /* 1 stream, 2 paced */
    bool pending;
} job;

static rlai_server *g_srv;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static job g_job;
static bool g_quit;

/* Frame sent by producers: 8-byte timestamp + filler. */
static void make_frame(unsigned char *b, int64_t ts)
{
    memcpy(b, &ts, 8);
    memset(b + 8, 'x', FRAME_BYTES - 8);
}

static void *producer(void *arg)
{
    (void)arg;
    unsigned char fr[FRAME_BYTES];
    pthread_mutex_lock(&g_mu);
    for (;;) {
        while (!g_job.pending && !g_quit)
            pthread_cond_wait(&g_cv, &g_mu);
        if (g_quit)
            break;
        job j = g_job;
        g_job.pending = false;
        pthread_mutex_unlock(&g_mu);
        if (j.kind == 1) {
            for (int i = 0; i < STREAM_FRAMES; i++) {
                make_frame(fr, now_ns());
                rlai_server_send(g_srv, j.conn, fr, sizeof fr);
            }
        } else {
            int64_t t = now_ns();
            for (int i = 0; i < PACED_FRAMES; i++) {
                t += PACE_NS;
                sleep_until(t);
                make_frame(fr, now_ns());
                rlai_server_send(g_srv, j.conn, fr, sizeof fr);
            }
        }
        pthread_mutex_lock(&g_mu);
    }
    pthread_mutex_unlock(&g_mu);
    return NULL;
}

static void on_message(void *user, rlai_conn conn, const void *data, size_t len)
{
    (void)user;
    if (len == 6 && (memcmp(data, "STREAM", 6) == 0 || memcmp(data, "PACED!", 6) == 0)) {
        pthread_mutex_lock(&g_mu);
        g_job.conn = conn;
        g_job.kind = memcmp(data, "STREAM", 6) == 0 ? 1 : 2;
        g_job.pending = true;
        pthread_cond_signal(&g_cv);
        pthread_mutex_unlock(&g_mu);
        return;
    }
    /* msgpack fixmap first byte: may be a client-library request */
    if (len && (((const unsigned char *)data)[0] & 0xf0) == 0x80) {
        rlai_msg m;
        char err[64];
        if (rlai_proto_decode(data, len, &m, err, sizeof err) == 0) {
            rlai_buf b;
            rlai_buf_init(&b);
            if (m.type == RLAI_MSG_HELLO) {
                rlai_proto_encode_done(&b, m.id, "", NULL);
            } else {
                rlai_proto_encode_token(&b, m.id, "token", 5, NULL, 0);
            }
            rlai_server_send(g_srv, conn, b.data, b.len);
            rlai_buf_free(&b);
            rlai_msg_free(&m);
            return;
        }
    }
    rlai_server_send(g_srv, conn, data, len);
}

static void on_disconnect(void *user, rlai_conn conn)
{
    (void)user;
    (void)conn;
}

/* ------------------------------------------------------------ clients */

typedef struct tclient {
    int kind; /* 0 zmq, 1 framed stream socket */
    void *zsock;
    int fd;
    rlai_frame_reader rd;
    unsigned char *rbuf;
    size_t rlen, roff;
} tclient;

static void tc_send(tclient *c, const void *p, size_t n)
{
    if (c->kind == 0) {
        zmq_send(c->zsock, p, n, 0);
        return;
    }
    unsigned char b[4 + 256];
    rlai_frame_header((uint32_t)n, b);
    memcpy(b + 4, p, n);
    size_t off = 0;
    while (off < n + 4) {
        ssize_t w = send(c->fd, b + off, n + 4 - off, MSG_NOSIGNAL);
        if (w <= 0) {
            perror("send");
            exit(1);
        }
        off += (size_t)w;
    }
}

/* Receives one message; returns its length and a pointer valid until the
 * next call. */
static size_t tc_recv(tclient *c, const unsigned char **out)
{
    static unsigned char zbuf[4096];
    if (c->kind == 0) {
        int n = zmq_recv(c->zsock, zbuf, sizeof zbuf, 0);
        if (n < 0) {
            fprintf(stderr, "zmq_recv: %s\n", zmq_strerror(zmq_errno()));
            exit(1);
        }
        *out = zbuf;
        return (size_t)n;
    }
    for (;;) {
        if (c->roff < c->rlen) {
            size_t used;
            const void *f;
            size_t fl;
            int rc = rlai_frame_reader_feed(&c->rd, c->rbuf + c->roff, c->rlen - c->roff, &used, &f, &fl);
            c->roff += used;
            if (rc == 1) {
                *out = f;
                return fl;
            }
            if (rc < 0) {
                fprintf(stderr, "frame error\n");
                exit(1);
            }
        }
        ssize_t r = recv(c->fd, c->rbuf, 65536, 0);
        if (r <= 0) {
            fprintf(stderr, "recv failed\n");
            exit(1);
        }
        c->rlen = (size_t)r;
        c->roff = 0;
    }
}

static void tc_open_zmq(tclient *c, void *ctx, const char *ep)
{
    memset(c, 0, sizeof *c);
    c->kind = 0;
    c->zsock = zmq_socket(ctx, ZMQ_DEALER);
    int v = 0;
    zmq_setsockopt(c->zsock, ZMQ_LINGER, &v, sizeof v);
    if (zmq_connect(c->zsock, ep) != 0) {
        fprintf(stderr, "connect %s failed\n", ep);
        exit(1);
    }
}

static void tc_open_fd(tclient *c, int fd)
{
    memset(c, 0, sizeof *c);
    c->kind = 1;
    c->fd = fd;
    rlai_frame_reader_init(&c->rd, 0);
    c->rbuf = malloc(65536);
}

static void tc_close(tclient *c)
{
    if (c->kind == 0) {
        zmq_close(c->zsock);
    } else {
        close(c->fd);
        rlai_frame_reader_free(&c->rd);
        free(c->rbuf);
    }
}

typedef struct result {
    const char *name;
    double rt50, rt99, stream_us, paced50, paced99;
} result;

static void measure_rt(tclient *c, int iters, result *res)
{
    unsigned char req[REQ_BYTES];
    memset(req, 'r', sizeof req);
    int64_t *lat = malloc(sizeof *lat * (size_t)iters);
    for (int i = 0; i < iters / 10 + 100; i++) { /* warm-up */
        const unsigned char *p;
        tc_send(c, req, sizeof req);
        tc_recv(c, &p);
    }
    for (int i = 0; i < iters; i++) {
        const unsigned char *p;
        int64_t t0 = now_ns();
        tc_send(c, req, sizeof req);
        size_t n = tc_recv(c, &p);
        lat[i] = now_ns() - t0;
        if (n != sizeof req) {
            fprintf(stderr, "bad echo length %zu\n", n);
            exit(1);
        }
    }
    res->rt50 = pct(lat, (size_t)iters, 0.50);
    res->rt99 = pct(lat, (size_t)iters, 0.99);
    free(lat);
}

static void measure_stream(tclient *c, result *res)
{
    const unsigned char *p;
    int64_t t0 = now_ns();
    tc_send(c, "STREAM", 6);
    for (int i = 0; i < STREAM_FRAMES; i++)
        if (tc_recv(c, &p) != FRAME_BYTES) {
            fprintf(stderr, "bad stream frame\n");
            exit(1);
        }
    res->stream_us = (double)(now_ns() - t0) / 1000.0 / STREAM_FRAMES;

    int64_t *lat = malloc(sizeof *lat * PACED_FRAMES);
    tc_send(c, "PACED!", 6);
    for (int i = 0; i < PACED_FRAMES; i++) {
        if (tc_recv(c, &p) != FRAME_BYTES) {
            fprintf(stderr, "bad paced frame\n");
            exit(1);
        }
        int64_t ts;
        memcpy(&ts, p, 8);
        lat[i] = now_ns() - ts;
    }
    res->paced50 = pct(lat, PACED_FRAMES, 0.50);
    res->paced99 = pct(lat, PACED_FRAMES, 0.99);
    free(lat);
}

/* ---------------------------------------------------- socketpair echo */

static void *pair_echo(void *arg)
{
    int fd = *(int *)arg;
    tclient c;
    tc_open_fd(&c, fd);
    unsigned char fr[FRAME_BYTES];
    for (;;) {
        const unsigned char *p;
        ssize_t r;
        if (c.roff >= c.rlen) {
            r = recv(fd, c.rbuf, 65536, 0);
            if (r <= 0)
                break;
            c.rlen = (size_t)r;
            c.roff = 0;
        }
        size_t used;
        const void *f;
        size_t fl;
        int rc = rlai_frame_reader_feed(&c.rd, c.rbuf + c.roff, c.rlen - c.roff, &used, &f, &fl);
        c.roff += used;
        if (rc != 1)
            continue;
        p = f;
        if (fl == 6 && memcmp(p, "STREAM", 6) == 0) {
            for (int i = 0; i < STREAM_FRAMES; i++) {
                make_frame(fr, now_ns());
                tc_send(&c, fr, sizeof fr);
            }
        } else if (fl == 6 && memcmp(p, "PACED!", 6) == 0) {
            int64_t t = now_ns();
            for (int i = 0; i < PACED_FRAMES; i++) {
                t += PACE_NS;
                sleep_until(t);
                make_frame(fr, now_ns());
                tc_send(&c, fr, sizeof fr);
            }
        } else {
            unsigned char copy[256];
            memcpy(copy, p, fl);
            tc_send(&c, copy, fl);
        }
    }
    rlai_frame_reader_free(&c.rd);
    free(c.rbuf);
    return NULL;
}

/* ------------------------------------------- raw libzmq ROUTER echo */

typedef struct raw_arg {
    void *ctx;
    const char *ep;
    volatile int ready;
} raw_arg;

/* The libzmq floor: a ROUTER in its own thread answering directly
 * (blocking recv/send, no queue, no poll set). Stops on "QUIT". */
static void *raw_router(void *arg)
{
    raw_arg *a = arg;
    void *r = zmq_socket(a->ctx, ZMQ_ROUTER);
    int v = 0;
    zmq_setsockopt(r, ZMQ_LINGER, &v, sizeof v);
    v = 100000;
    zmq_setsockopt(r, ZMQ_SNDHWM, &v, sizeof v);
    if (zmq_bind(r, a->ep) != 0) {
        fprintf(stderr, "raw bind failed\n");
        exit(1);
    }
    __atomic_store_n(&a->ready, 1, __ATOMIC_RELEASE);
    unsigned char id[256], buf[256], fr[FRAME_BYTES];
    for (;;) {
        int il = zmq_recv(r, id, sizeof id, 0);
        int n = zmq_recv(r, buf, sizeof buf, 0);
        if (il < 0 || n < 0)
            break;
        if (n == 4 && memcmp(buf, "QUIT", 4) == 0)
            break;
        if (n == 6 && memcmp(buf, "STREAM", 6) == 0) {
            for (int i = 0; i < STREAM_FRAMES; i++) {
                make_frame(fr, now_ns());
                zmq_send(r, id, (size_t)il, ZMQ_SNDMORE);
                zmq_send(r, fr, sizeof fr, 0);
            }
        } else if (n == 6 && memcmp(buf, "PACED!", 6) == 0) {
            int64_t t = now_ns();
            for (int i = 0; i < PACED_FRAMES; i++) {
                t += PACE_NS;
                sleep_until(t);
                make_frame(fr, now_ns());
                zmq_send(r, id, (size_t)il, ZMQ_SNDMORE);
                zmq_send(r, fr, sizeof fr, 0);
            }
        } else {
            zmq_send(r, id, (size_t)il, ZMQ_SNDMORE);
            zmq_send(r, buf, (size_t)n, 0);
        }
    }
    zmq_close(r);
    return NULL;
}

/* ----------------------------------------------------- client library */

static void measure_lib(const char *ep, int iters, result *res)
{
    char err[256];
    rlai_client *c = NULL;
    if (rlai_client_connect(ep, 3000, &c, err, sizeof err) != 0) {
        fprintf(stderr, "client connect %s: %s\n", ep, err);
        exit(1);
    }
    int64_t *lat = malloc(sizeof *lat * (size_t)iters);
    rlai_msg m;
    memset(&m, 0, sizeof m);
    m.type = RLAI_MSG_GENERATE;
    m.version = RLAI_PROTO_VERSION;
    m.u.generate.prompt = (char *)"Hello, how are you?";
    for (int i = -iters / 10 - 100; i < iters; i++) {
        m.id = rlai_client_next_id(c);
        int64_t t0 = now_ns();
        rlai_msg r;
        if (rlai_client_send(c, &m) != 0 || rlai_client_recv(c, 3000, &r) != 0) {
            fprintf(stderr, "client round trip failed\n");
            exit(1);
        }
        rlai_msg_free(&r);
        if (i >= 0)
            lat[i] = now_ns() - t0;
    }
    res->rt50 = pct(lat, (size_t)iters, 0.50);
    res->rt99 = pct(lat, (size_t)iters, 0.99);
    res->stream_us = res->paced50 = res->paced99 = -1;
    free(lat);
    rlai_client_close(c);
}

static int connect_unix(const char *path)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof sa.sun_path) {
        fprintf(stderr, "path too long\n");
        exit(1);
    }
    memcpy(sa.sun_path, path, strlen(path) + 1);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        perror("connect");
        exit(1);
    }
    return fd;
}

int main(int argc, char **argv)
{
    int iters = argc > 1 ? atoi(argv[1]) : 20000;
    if (iters < 100)
        iters = 100;
    char dir[] = "/tmp/rlai-bench-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    char zpath[128], zep[160], upath[128], tep[64], lib_unix[160];
    snprintf(zpath, sizeof zpath, "%s/engine.zmq", dir);
    snprintf(zep, sizeof zep, "ipc://%s", zpath);
    snprintf(upath, sizeof upath, "%s/engine.sock", dir);
    snprintf(lib_unix, sizeof lib_unix, "unix://%s", upath);

    rlai_server_callbacks cb = {on_message, on_disconnect, NULL, NULL};
    char err[256];
    int rc = -1;
    for (int port = 35791; port < 35891 && rc != 0; port++) {
        snprintf(tep, sizeof tep, "tcp://127.0.0.1:%d", port);
        rlai_server_config cfg = {.zmq_endpoint = zep, .zmq_tcp_endpoint = tep, .uds_path = upath};
        rc = rlai_server_start(&cfg, &cb, &g_srv, err, sizeof err);
    }
    if (rc != 0) {
        fprintf(stderr, "server: %s\n", err);
        return 1;
    }
    pthread_t prod;
    pthread_create(&prod, NULL, producer, NULL);
    void *ctx = zmq_ctx_new();

    result res[7];
    memset(res, 0, sizeof res);
    tclient c;

    /* baseline: socketpair with an echo thread */
    int sv[2];
    socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv);
    pthread_t echo_th;
    pthread_create(&echo_th, NULL, pair_echo, &sv[1]);
    tc_open_fd(&c, sv[0]);
    res[0].name = "socketpair (baseline)";
    measure_rt(&c, iters, &res[0]);
    measure_stream(&c, &res[0]);
    shutdown(sv[0], SHUT_RDWR);
    pthread_join(echo_th, NULL);
    tc_close(&c);
    close(sv[1]);

    /* baseline: libzmq alone (ROUTER thread answering directly) */
    char rawep[160];
    snprintf(rawep, sizeof rawep, "ipc://%s/raw.zmq", dir);
    void *rawctx = zmq_ctx_new();
    raw_arg ra = {rawctx, rawep, 0};
    pthread_t raw_th;
    pthread_create(&raw_th, NULL, raw_router, &ra);
    while (!__atomic_load_n(&ra.ready, __ATOMIC_ACQUIRE))
        usleep(1000);
    tc_open_zmq(&c, ctx, rawep);
    res[6].name = "raw libzmq ipc (floor)";
    measure_rt(&c, iters, &res[6]);
    measure_stream(&c, &res[6]);
    tc_send(&c, "QUIT", 4);
    pthread_join(raw_th, NULL);
    tc_close(&c);
    zmq_ctx_term(rawctx);
    unlink(rawep + 6);

    tc_open_zmq(&c, ctx, zep);
    res[1].name = "zmq ipc";
    measure_rt(&c, iters, &res[1]);
    measure_stream(&c, &res[1]);
    tc_close(&c);

    tc_open_zmq(&c, ctx, tep);
    res[2].name = "zmq tcp 127.0.0.1";
    measure_rt(&c, iters, &res[2]);
    measure_stream(&c, &res[2]);
    tc_close(&c);

    tc_open_fd(&c, connect_unix(upath));
    res[3].name = "unix socket";
    measure_rt(&c, iters, &res[3]);
    measure_stream(&c, &res[3]);
    tc_close(&c);

    res[4].name = "client lib, zmq ipc";
    measure_lib(zep, iters, &res[4]);
    res[5].name = "client lib, unix";
    measure_lib(lib_unix, iters, &res[5]);

    printf("IPC transport benchmark: %d round trips of %d bytes; stream %d x %d-byte frames;\n"
           "paced %d frames every %d us (one-way latency)\n\n",
           iters, REQ_BYTES, STREAM_FRAMES, FRAME_BYTES, PACED_FRAMES, PACE_NS / 1000);
    printf("%-24s %10s %10s %14s %12s %12s\n", "transport", "rt p50 us", "rt p99 us", "stream us/fr",
           "paced p50", "paced p99");
    static const int order[7] = {0, 6, 1, 2, 3, 4, 5};
    for (int k = 0; k < 7; k++) {
        int i = order[k];
        printf("%-24s %10.1f %10.1f", res[i].name, res[i].rt50, res[i].rt99);
        if (res[i].stream_us >= 0)
            printf(" %14.2f %12.1f %12.1f\n", res[i].stream_us, res[i].paced50, res[i].paced99);
        else
            printf(" %14s %12s %12s\n", "-", "-", "-");
    }

    pthread_mutex_lock(&g_mu);
    g_quit = true;
    pthread_cond_signal(&g_cv);
    pthread_mutex_unlock(&g_mu);
    pthread_join(prod, NULL);
    zmq_ctx_term(ctx);
    rlai_server_stop(g_srv, 1000);
    rmdir(dir);
    return 0;
}
