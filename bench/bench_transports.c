/* bench_transports.c - time to first token and per-token latency of the same
 * streamed chat (same prompt, greedy, N tokens with ignore_eos) over the
 * three transports of `rlai serve`: HTTP/SSE (a raw-socket HTTP/1.1 client
 * with chunked decoding), ZeroMQ and the named pipe (include/rlai/client.h).
 *
 * Baseline, measured in the same run: the engine's own figures for the same
 * requests (TTFT from submit to first sampled token, decode ms per token),
 * reported by the daemon in done frames / the final SSE chunk. A
 * transport's overhead is its client-side figure minus the engine's.
 *
 *   bench_transports [--rlai PATH] [-m MODEL] [-t THREADS] [-n TOKENS] [-r REPS]
 *   bench_transports --zmq EP --pipe PATH --http HOST:PORT   (a running engine; RLAI_API_KEY = its API key)
 *
 * Without endpoints it starts its own `rlai serve` (default binary:
 * <this exe>/../host/rlai) with private endpoints and a free HTTP port.
 */
#include "rlai/client.h"
#include "rlai/error.h"
#include "rlai/protocol.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PROMPT "Write a short story about a lighthouse keeper and a storm."
#define MAX_EVENTS 4096

typedef struct run {
    bool ok;
    double ttft_ms;          /* client: send -> first text */
    double total_ms;         /* client: send -> last text */
    int n_events;            /* text pieces received */
    int gen_tokens;          /* engine-reported */
    double engine_ttft_ms;
    double engine_decode_tps;
    double gaps[MAX_EVENTS]; /* inter-arrival of text pieces, ms */
    int n_gaps;
} run;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void note_text(run *r, double t0, double *last)
{
    double t = now_ms();
    if (r->n_events == 0)
        r->ttft_ms = t - t0;
    else if (r->n_gaps < MAX_EVENTS)
        r->gaps[r->n_gaps++] = t - *last;
    *last = t;
    r->total_ms = t - t0;
    r->n_events++;
}

/* ---------------------------------------------------------- rlai_client (ZeroMQ, pipe) */

static int run_client(rlai_client *cl, int n_tokens, run *r)
{
    memset(r, 0, sizeof(*r));
    rlai_msg_chat_message cm = { "user", PROMPT };
    rlai_msg m;
    memset(&m, 0, sizeof(m));
    m.version = RLAI_PROTO_VERSION;
    m.id = rlai_client_next_id(cl);
    m.type = RLAI_MSG_CHAT;
    m.u.chat.messages = &cm;
    m.u.chat.n_messages = 1;
    m.u.chat.gen.max_tokens = n_tokens;
    m.u.chat.gen.has_max_tokens = true;
    m.u.chat.gen.temperature = 0;
    m.u.chat.gen.has_temperature = true;
    m.u.chat.gen.ignore_eos = true;
    double t0 = now_ms(), last = t0;
    int rc = rlai_client_send(cl, &m);
    if (rc < 0)
        return rc;
    for (;;) {
        rlai_msg f;
        rc = rlai_client_recv(cl, 120000, &f);
        if (rc < 0)
            return rc;
        if (f.id != m.id) {
            rlai_msg_free(&f);
            continue;
        }
        if (f.type == RLAI_MSG_TOKEN && f.u.token.text && f.u.token.text[0]) {
            note_text(r, t0, &last);
        } else if (f.type == RLAI_MSG_DONE) {
            r->gen_tokens = (int)f.u.done.metrics.gen_tokens;
            r->engine_ttft_ms = f.u.done.metrics.ttft_ms;
            r->engine_decode_tps = f.u.done.metrics.decode_tps;
            r->ok = f.u.done.has_metrics;
            rlai_msg_free(&f);
            return 0;
        } else if (f.type == RLAI_MSG_ERROR) {
            fprintf(stderr, "bench_transports: error frame: %s\n", f.u.error.msg ? f.u.error.msg : "?");
            rlai_msg_free(&f);
            return RLAI_ERR_PROTOCOL;
        }
        rlai_msg_free(&f);
    }
}

/* ---------------------------------------------------------- HTTP/SSE */

typedef struct buf {
    char *p;
    size_t len, cap;
} buf;

static void buf_add(buf *b, const char *d, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        b->cap = (b->len + n + 1) * 2;
        b->p = realloc(b->p, b->cap);
        if (!b->p) {
            fprintf(stderr, "bench_transports: out of memory\n");
            exit(1);
        }
    }
    memcpy(b->p + b->len, d, n);
    b->len += n;
    b->p[b->len] = 0;
}

static void buf_drop(buf *b, size_t n)
{
    memmove(b->p, b->p + n, b->len - n);
    b->len -= n;
    b->p[b->len] = 0;
}

/* Handles complete SSE events in sse; returns 1 at [DONE], -1 on an error event. */
static int sse_events(buf *sse, run *r, double t0, double *last)
{
    char *end;
    while (sse->len && (end = strstr(sse->p, "\n\n")) != NULL) {
        *end = 0;
        int ret = 0;
        if (!strncmp(sse->p, "data: ", 6)) {
            const char *data = sse->p + 6;
            if (!strcmp(data, "[DONE]")) {
                ret = 1;
            } else {
                cJSON *j = cJSON_Parse(data);
                const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
                const cJSON *content = cJSON_GetObjectItem(cJSON_GetObjectItem(ch, "delta"), "content");
                if (cJSON_IsString(content) && content->valuestring[0])
                    note_text(r, t0, last);
                const cJSON *u = cJSON_GetObjectItem(j, "usage");
                if (cJSON_IsObject(u))
                    r->gen_tokens = cJSON_GetObjectItem(u, "completion_tokens")->valueint;
                const cJSON *tm = cJSON_GetObjectItem(j, "timings");
                if (cJSON_IsObject(tm)) {
                    r->engine_ttft_ms = cJSON_GetObjectItem(tm, "ttft_ms")->valuedouble;
                    r->engine_decode_tps = cJSON_GetObjectItem(tm, "decode_tokens_per_second")->valuedouble;
                }
                if (cJSON_GetObjectItem(j, "error")) {
                    fprintf(stderr, "bench_transports: HTTP error event: %s\n", data);
                    ret = -1;
                }
                cJSON_Delete(j);
            }
        }
        buf_drop(sse, (size_t)(end - sse->p) + 2);
        if (ret)
            return ret;
    }
    return 0;
}

static int run_http(const char *host, const char *port, int n_tokens, run *r)
{
    memset(r, 0, sizeof(*r));
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM }, *ai = NULL;
    if (getaddrinfo(host, port, &hints, &ai) != 0 || !ai)
        return RLAI_ERR_INVALID_ARG;
    char body[512], req[1024];
    int bl = snprintf(body, sizeof(body),
                      "{\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}],\"max_tokens\":%d,\"temperature\":0,"
                      "\"ignore_eos\":true,\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
                      PROMPT, n_tokens);
    /* The engine's API key (HTTP needs it unless served with --no-auth). */
    const char *key = getenv("RLAI_API_KEY");
    char auth[400] = "";
    if (key && *key)
        snprintf(auth, sizeof(auth), "Authorization: Bearer %s\r\n", key);
    int rl = snprintf(req, sizeof(req),
                      "POST /v1/chat/completions HTTP/1.1\r\nHost: %s:%s\r\n%sContent-Type: application/json\r\n"
                      "Accept: text/event-stream\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s",
                      host, port, auth, bl, body);
    double t0 = now_ms(), last = t0;
    int fd = socket(ai->ai_family, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
        freeaddrinfo(ai);
        if (fd >= 0)
            close(fd);
        return RLAI_ERR_DISCONNECTED;
    }
    freeaddrinfo(ai);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (send(fd, req, (size_t)rl, MSG_NOSIGNAL) != rl) {
        close(fd);
        return RLAI_ERR_DISCONNECTED;
    }
    buf raw = { 0 }, sse = { 0 };
    bool headers = false, chunked = false;
    size_t chunk_left = 0;       /* bytes of the current chunk still to copy */
    int state = 0;               /* 0 = at a size line, 1 = in data, 2 = at the CRLF after data */
    int rc = RLAI_ERR_PROTOCOL;
    char tmp[16384];
    for (;;) {
        ssize_t n = recv(fd, tmp, sizeof(tmp), 0);
        if (n <= 0)
            break;
        buf_add(&raw, tmp, (size_t)n);
        if (!headers) {
            char *e = strstr(raw.p, "\r\n\r\n");
            if (!e)
                continue;
            *e = 0;
            if (strncmp(raw.p, "HTTP/1.1 200", 12) != 0) {
                fprintf(stderr, "bench_transports: HTTP answered: %.80s\n", raw.p);
                break;
            }
            chunked = strcasestr(raw.p, "transfer-encoding: chunked") != NULL;
            headers = true;
            buf_drop(&raw, (size_t)(e - raw.p) + 4);
        }
        /* De-chunk what has arrived. */
        bool progress = true;
        while (progress && raw.len) {
            progress = false;
            if (!chunked) {
                buf_add(&sse, raw.p, raw.len);
                raw.len = 0;
                break;
            }
            if (state == 0) {
                char *e = strstr(raw.p, "\r\n");
                if (!e)
                    break;
                chunk_left = strtoul(raw.p, NULL, 16);
                buf_drop(&raw, (size_t)(e - raw.p) + 2);
                state = chunk_left ? 1 : 3;
                progress = true;
            } else if (state == 1) {
                size_t take = raw.len < chunk_left ? raw.len : chunk_left;
                buf_add(&sse, raw.p, take);
                buf_drop(&raw, take);
                chunk_left -= take;
                if (!chunk_left)
                    state = 2;
                progress = take > 0;
            } else if (state == 2 && raw.len >= 2) {
                buf_drop(&raw, 2);
                state = 0;
                progress = true;
            }
        }
        int ev = sse_events(&sse, r, t0, &last);
        if (ev) {
            rc = ev > 0 ? 0 : RLAI_ERR_PROTOCOL;
            break;
        }
    }
    close(fd);
    free(raw.p);
    free(sse.p);
    r->ok = rc == 0 && r->engine_decode_tps > 0;
    return rc;
}

/* ---------------------------------------------------------- self-started engine */

static pid_t serve_pid;
static char rundir[64];

static void stop_serve(void)
{
    if (serve_pid > 0) {
        kill(serve_pid, SIGTERM);
        waitpid(serve_pid, NULL, 0);
        serve_pid = 0;
    }
    if (rundir[0]) {
        char cmd[PATH_MAX + 16];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", rundir);
        if (system(cmd) != 0)
            fprintf(stderr, "bench_transports: could not remove %s\n", rundir);
    }
}

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t l = sizeof(a);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || getsockname(fd, (struct sockaddr *)&a, &l) < 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    close(fd);
    return ntohs(a.sin_port);
}

static int start_serve(const char *rlai, const char *model, int threads, char *zmq, char *pipe, char *http,
                       size_t cap)
{
    snprintf(rundir, sizeof(rundir), "/tmp/rlai-bench-XXXXXX");
    if (!mkdtemp(rundir))
        return RLAI_ERR_IO;
    int port = free_port();
    if (port < 0)
        return RLAI_ERR_IO;
    snprintf(zmq, cap, "ipc://%s/rlai/engine.zmq", rundir);
    snprintf(pipe, cap, "unix://%s/rlai/engine.sock", rundir);
    snprintf(http, cap, "127.0.0.1:%d", port);
    char th[16];
    snprintf(th, sizeof(th), "%d", threads);
    /* A fresh API key for this engine (it takes RLAI_API_KEY before its key
     * file, so the user's ~/.config is not touched); run_http sends it. */
    unsigned char raw[16];
    char key[33];
    if (getrandom(raw, sizeof(raw), 0) != (ssize_t)sizeof(raw))
        return RLAI_ERR_IO;
    for (int i = 0; i < 16; i++)
        snprintf(key + 2 * i, 3, "%02x", raw[i]);
    setenv("RLAI_API_KEY", key, 1);
    serve_pid = fork();
    if (serve_pid < 0)
        return RLAI_ERR_IO;
    if (serve_pid == 0) {
        setenv("XDG_RUNTIME_DIR", rundir, 1);
        const char *argv[16];
        int a = 0;
        argv[a++] = rlai;
        argv[a++] = "serve";
        argv[a++] = "--http";
        argv[a++] = http;
        argv[a++] = "--no-plugins";
        if (threads > 0) {
            argv[a++] = "-t";
            argv[a++] = th;
        }
        if (model) {
            argv[a++] = "-m";
            argv[a++] = model;
        }
        argv[a] = NULL;
        execv(rlai, (char *const *)argv);
        fprintf(stderr, "bench_transports: cannot run %s: %s\n", rlai, strerror(errno));
        _exit(127);
    }
    /* Wait until the pipe answers (the model is loaded). */
    for (int i = 0; i < 1200; i++) {
        int st;
        if (waitpid(serve_pid, &st, WNOHANG) == serve_pid) {
            serve_pid = 0;
            return RLAI_ERR_DISCONNECTED;
        }
        rlai_client *cl = NULL;
        char err[256];
        if (rlai_client_connect(pipe, 1000, &cl, err, sizeof(err)) == 0) {
            rlai_client_close(cl);
            return 0;
        }
        usleep(100 * 1000);
    }
    return RLAI_ERR_TIMEOUT;
}

/* ---------------------------------------------------------- report */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    if (n <= 0)
        return NAN;
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static double pct(double *v, int n, double p)
{
    if (n <= 0)
        return NAN;
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    int i = (int)ceil(p * n) - 1;
    return v[i < 0 ? 0 : i >= n ? n - 1 : i];
}

typedef struct summary {
    double ttft, eng_ttft, per_tok, eng_per_tok, p99_gap;
    int events, tokens, ok_runs;
} summary;

static summary summarize(run *runs, int n)
{
    summary s = { 0 };
    double a[64], b[64], c[64], d[64];
    double *gaps = malloc(sizeof(double) * (size_t)n * MAX_EVENTS);
    int ng = 0, k = 0;
    for (int i = 0; i < n; i++) {
        run *r = &runs[i];
        if (!r->ok)
            continue;
        a[k] = r->ttft_ms;
        b[k] = r->engine_ttft_ms;
        c[k] = r->gen_tokens > 1 ? (r->total_ms - r->ttft_ms) / (r->gen_tokens - 1) : NAN;
        d[k] = r->engine_decode_tps > 0 ? 1000.0 / r->engine_decode_tps : NAN;
        s.events = r->n_events;
        s.tokens = r->gen_tokens;
        for (int g = 0; gaps && g < r->n_gaps; g++)
            gaps[ng++] = r->gaps[g];
        k++;
    }
    s.ok_runs = k;
    s.ttft = median(a, k);
    s.eng_ttft = median(b, k);
    s.per_tok = median(c, k);
    s.eng_per_tok = median(d, k);
    s.p99_gap = gaps ? pct(gaps, ng, 0.99) : NAN;
    free(gaps);
    return s;
}

int main(int argc, char **argv)
{
    const char *rlai = NULL, *model = NULL;
    char zmq[PATH_MAX + 16] = "", pipe[PATH_MAX + 16] = "", http[PATH_MAX + 16] = "";
    int n_tokens = 64, reps = 5, threads = 0;
    static const struct option opts[] = {
        { "rlai", required_argument, 0, 'R' }, { "zmq", required_argument, 0, 'Z' },
        { "pipe", required_argument, 0, 'P' }, { "http", required_argument, 0, 'H' },
        { "model", required_argument, 0, 'm' }, { "threads", required_argument, 0, 't' },
        { "tokens", required_argument, 0, 'n' }, { "reps", required_argument, 0, 'r' },
        { "help", no_argument, 0, 'h' }, { 0, 0, 0, 0 }
    };
    int c;
    while ((c = getopt_long(argc, argv, "m:t:n:r:h", opts, NULL)) != -1) {
        switch (c) {
        case 'R': rlai = optarg; break;
        case 'Z': snprintf(zmq, sizeof(zmq), "%s", optarg); break;
        case 'P': snprintf(pipe, sizeof(pipe), "%s%s", strncmp(optarg, "unix://", 7) ? "unix://" : "", optarg); break;
        case 'H': snprintf(http, sizeof(http), "%s", optarg); break;
        case 'm': model = optarg; break;
        case 't': threads = atoi(optarg); break;
        case 'n': n_tokens = atoi(optarg); break;
        case 'r': reps = atoi(optarg); break;
        default:
            fprintf(c == 'h' ? stdout : stderr,
                    "usage: bench_transports [--rlai PATH] [-m MODEL] [-t THREADS] [-n TOKENS] [-r REPS]\n"
                    "       bench_transports --zmq EP --pipe PATH --http HOST:PORT  (a running engine)\n");
            return c == 'h' ? 0 : 2;
        }
    }
    if (n_tokens < 2 || n_tokens > 4096 || reps < 1 || reps > 64) {
        fprintf(stderr, "bench_transports: need 2 <= tokens <= 4096 and 1 <= reps <= 64\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    char exe_rlai[PATH_MAX + 16];
    bool self = !zmq[0] && !pipe[0] && !http[0];
    if (self) {
        if (!rlai) {
            char exe[PATH_MAX];
            ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
            if (n <= 0) {
                fprintf(stderr, "bench_transports: cannot find myself; pass --rlai PATH\n");
                return 2;
            }
            exe[n] = 0;
            char *slash = strrchr(exe, '/');
            if (slash)
                *slash = 0;
            snprintf(exe_rlai, sizeof(exe_rlai), "%s/../host/rlai", exe);
            rlai = exe_rlai;
        }
        int rc = start_serve(rlai, model, threads, zmq, pipe, http, sizeof(zmq));
        if (rc < 0) {
            fprintf(stderr, "bench_transports: could not start %s serve: %s\n", rlai, rlai_strerror(rc));
            stop_serve();
            return 1;
        }
        atexit(stop_serve);
    }
    char host[256] = "127.0.0.1", port[16] = "";
    if (http[0]) {
        char *colon = strrchr(http, ':');
        if (!colon) {
            fprintf(stderr, "bench_transports: --http wants HOST:PORT\n");
            return 2;
        }
        snprintf(host, sizeof(host), "%.*s", (int)(colon - http), http);
        snprintf(port, sizeof(port), "%s", colon + 1);
    }
    rlai_client *zc = NULL, *pc = NULL;
    char err[256];
    if (zmq[0] && rlai_client_connect(zmq, 5000, &zc, err, sizeof(err)) < 0) {
        fprintf(stderr, "bench_transports: zeromq %s: %s\n", zmq, err);
        return 1;
    }
    if (pipe[0] && rlai_client_connect(pipe, 5000, &pc, err, sizeof(err)) < 0) {
        fprintf(stderr, "bench_transports: pipe %s: %s\n", pipe, err);
        return 1;
    }
    enum { T_ZMQ, T_PIPE, T_HTTP, NT };
    const char *names[NT] = { "zeromq", "pipe (unix socket)", "http/sse" };
    bool have[NT] = { zc != NULL, pc != NULL, http[0] != 0 };
    run *runs = calloc((size_t)NT * (size_t)reps, sizeof(run));
    if (!runs)
        return 1;
    /* One warm-up per transport (fills the prefix cache and page cache),
     * then the transports interleaved so drift hits all alike. */
    run warm;
    for (int t = 0; t < NT; t++) {
        if (!have[t])
            continue;
        int rc = t == T_HTTP ? run_http(host, port, n_tokens, &warm)
                             : run_client(t == T_ZMQ ? zc : pc, n_tokens, &warm);
        if (rc < 0 || !warm.ok) {
            fprintf(stderr, "bench_transports: %s warm-up failed: %s\n", names[t], rlai_strerror(rc));
            have[t] = false;
        }
    }
    for (int i = 0; i < reps; i++)
        for (int t = 0; t < NT; t++) {
            if (!have[t])
                continue;
            run *r = &runs[t * reps + i];
            if (t == T_HTTP)
                run_http(host, port, n_tokens, r);
            else
                run_client(t == T_ZMQ ? zc : pc, n_tokens, r);
        }
    summary s[NT];
    for (int t = 0; t < NT; t++)
        s[t] = summarize(&runs[t * reps], reps);
    printf("bench_transports: chat \"%s\", greedy, %d tokens (ignore_eos), %d runs each, medians\n", PROMPT, n_tokens,
           reps);
    printf("%-20s %10s %11s %10s %12s %12s %10s %8s %7s\n", "transport", "TTFT ms", "engine ms", "overhead",
           "ms/token", "engine/tok", "p99 gap", "pieces", "tokens");
    /* Baseline row: the engine's own figures over every run. */
    double eb[3 * 64], et[3 * 64];
    int ne = 0;
    for (int t = 0; t < NT; t++)
        for (int i = 0; i < reps; i++)
            if (runs[t * reps + i].ok && runs[t * reps + i].engine_decode_tps > 0) {
                eb[ne] = runs[t * reps + i].engine_ttft_ms;
                et[ne] = 1000.0 / runs[t * reps + i].engine_decode_tps;
                ne++;
            }
    printf("%-20s %10s %11.2f %10s %12s %12.3f %10s %8s %7s\n", "engine (baseline)", "-", median(eb, ne), "-", "-",
           median(et, ne), "-", "-", "-");
    int failed = 0;
    for (int t = 0; t < NT; t++) {
        if (!have[t] || !s[t].ok_runs) {
            printf("%-20s %10s\n", names[t], have[t] ? "failed" : "skipped");
            failed += have[t];
            continue;
        }
        printf("%-20s %10.2f %11.2f %+10.2f %12.3f %12.3f %10.3f %8d %7d\n", names[t], s[t].ttft, s[t].eng_ttft,
               s[t].ttft - s[t].eng_ttft, s[t].per_tok, s[t].eng_per_tok, s[t].p99_gap, s[t].events, s[t].tokens);
        if (s[t].ok_runs < reps)
            failed++;
    }
    printf("overhead = client TTFT - engine TTFT of the same requests; ms/token = (last - first text) / "
           "(tokens - 1) at the client\n");
    rlai_client_close(zc);
    rlai_client_close(pc);
    free(runs);
    return failed ? 1 : 0;
}
