/* bench_loremaster.c - time to first token of loremaster.talk over ZeroMQ,
 * with the prefix cache (lore pinned at load, earlier turns cached) against
 * the same daemon started with --no-prefix-cache (the baseline, measured in
 * the same run).
 *
 * For each mode it starts `rlai serve` (private XDG_RUNTIME_DIR, no HTTP,
 * the build tree's plugins), then for every round and character: a first
 * line in a new session, then a follow-up turn in that session. TTFT is the
 * client-side time from sending the call to the first `token` frame; the
 * table also shows the daemon's prompt/reused token counts and the engine's
 * own ttft. Greedy decoding, a few tokens per reply.
 *
 * Usage: bench_loremaster [--rlai PATH] [--model FILE] [--rounds N]
 *                         [--threads N] [--max-tokens N]
 * Default rlai: ../host/rlai next to this binary; default model: the
 * project's models/SmolLM2-135M-Instruct.Q4_1.gguf.
 */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>

#include "rlai/client.h"
#include "rlai/protocol.h"

#ifndef RLAI_MODELS_DIR
#define RLAI_MODELS_DIR "models"
#endif

#define MAX_SAMPLES 256

static const char *const CHARACTERS[] = { "brannoc", "ysolde", "pell" };
#define N_CHARACTERS 3

static const char *const FIRST_LINES[] = {
    "Good evening. I just arrived up the Ashen Road. What is this place?",
    "Hello there. Who are you, and what do you do here?",
    "Excuse me, why is the street warm under my feet?",
};
static const char *const FOLLOW_UPS[] = {
    "Have you heard anything about the masked buyer?",
    "What should a stranger like me be careful of in town?",
    "Thank you. Where can I find something to eat?",
};

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct series {
    double ttft[MAX_SAMPLES], engine_ttft[MAX_SAMPLES];
    long prompt, reused;    /* sums */
    int n;
} series;

static double median(const double *v, int n)
{
    double tmp[MAX_SAMPLES];
    memcpy(tmp, v, sizeof(double) * (size_t)n);
    qsort(tmp, (size_t)n, sizeof(double), cmp_d);
    return n ? (n % 2 ? tmp[n / 2] : (tmp[n / 2 - 1] + tmp[n / 2]) / 2) : 0;
}

static double mean(const double *v, int n)
{
    double s = 0;
    for (int i = 0; i < n; i++)
        s += v[i];
    return n ? s / n : 0;
}

typedef struct daemon_proc {
    pid_t pid;
    char dir[64];
    char log[96];
    char endpoint[128];
    double startup_ms;
} daemon_proc;

static void show_log(const daemon_proc *d)
{
    FILE *f = fopen(d->log, "r");
    if (!f)
        return;
    char line[512];
    fprintf(stderr, "--- %s ---\n", d->log);
    while (fgets(line, sizeof line, f))
        fputs(line, stderr);
    fclose(f);
}

static void stop_daemon(daemon_proc *d)
{
    if (d->pid > 0) {
        kill(d->pid, SIGTERM);
        int st;
        for (int i = 0; i < 300; i++) {
            if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
                d->pid = 0;
                break;
            }
            usleep(100000);
        }
        if (d->pid > 0) {
            kill(d->pid, SIGKILL);
            waitpid(d->pid, &st, 0);
            d->pid = 0;
        }
    }
    char path[160];
    snprintf(path, sizeof path, "%s/rlai", d->dir);
    rmdir(path);
    unlink(d->log);
    rmdir(d->dir);
}

/* Starts `rlai serve` and waits until it answers; returns a connected client. */
static rlai_client *start_daemon(daemon_proc *d, const char *rlai, const char *model, const char *plugins,
                                 int threads, bool prefix_cache)
{
    memset(d, 0, sizeof *d);
    snprintf(d->dir, sizeof d->dir, "/tmp/rlai-bench-lm-XXXXXX");
    if (!mkdtemp(d->dir)) {
        perror("mkdtemp");
        exit(1);
    }
    snprintf(d->log, sizeof d->log, "%s/serve.log", d->dir);
    snprintf(d->endpoint, sizeof d->endpoint, "ipc://%s/rlai/engine.zmq", d->dir);
    char tstr[16];
    snprintf(tstr, sizeof tstr, "%d", threads);
    double t0 = now_ms();
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        exit(1);
    }
    if (pid == 0) {
        int fd = open(d->log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        setenv("XDG_RUNTIME_DIR", d->dir, 1);
        const char *argv[16];
        int n = 0;
        argv[n++] = rlai;
        argv[n++] = "serve";
        argv[n++] = "-m";
        argv[n++] = model;
        argv[n++] = "-t";
        argv[n++] = tstr;
        argv[n++] = "-c";
        argv[n++] = "2048";
        argv[n++] = "--http";
        argv[n++] = "";
        argv[n++] = "--plugins";
        argv[n++] = plugins;
        if (!prefix_cache)
            argv[n++] = "--no-prefix-cache";
        argv[n] = NULL;
        execv(rlai, (char *const *)argv);
        fprintf(stderr, "exec %s: %s\n", rlai, strerror(errno));
        _exit(127);
    }
    d->pid = pid;
    char sock[128];
    snprintf(sock, sizeof sock, "%s/rlai/engine.zmq", d->dir);
    rlai_client *c = NULL;
    char err[256] = "";
    while (now_ms() - t0 < 300000) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            d->pid = 0;
            fprintf(stderr, "rlai serve exited during start\n");
            show_log(d);
            exit(1);
        }
        struct stat sb;
        if (stat(sock, &sb) == 0 && rlai_client_connect(d->endpoint, 2000, &c, err, sizeof err) == 0)
            break;
        usleep(100000);
    }
    if (!c) {
        fprintf(stderr, "rlai serve did not come up: %s\n", err);
        show_log(d);
        stop_daemon(d);
        exit(1);
    }
    d->startup_ms = now_ms() - t0;
    return c;
}

/* One loremaster.talk call; returns 0 and fills the figures. */
static int talk(rlai_client *c, const char *character, const char *session, const char *line, int max_tokens,
                double *ttft, double *engine_ttft, long *prompt, long *reused)
{
    char params[1024];
    if (session)
        snprintf(params, sizeof params,
                 "{\"character\":\"%s\",\"session\":\"%s\",\"message\":\"%s\",\"temperature\":0,\"max_tokens\":%d}",
                 character, session, line, max_tokens);
    else
        snprintf(params, sizeof params, "{\"character\":\"%s\",\"message\":\"%s\",\"temperature\":0,\"max_tokens\":%d}",
                 character, line, max_tokens);
    char command[] = "loremaster.talk";
    rlai_msg m;
    memset(&m, 0, sizeof m);
    m.type = RLAI_MSG_CALL;
    m.version = RLAI_PROTO_VERSION;
    m.id = rlai_client_next_id(c);
    m.u.call.command = command;
    m.u.call.params_json = params;
    double t0 = now_ms();
    int rc = rlai_client_send(c, &m);
    if (rc != 0) {
        fprintf(stderr, "send failed: %s\n", rlai_strerror(rc));
        return rc;
    }
    *ttft = -1;
    for (;;) {
        rlai_msg f;
        rc = rlai_client_recv(c, 300000, &f);
        if (rc != 0) {
            fprintf(stderr, "recv failed: %s\n", rlai_strerror(rc));
            return rc;
        }
        if (f.id != m.id) {
            rlai_msg_free(&f);
            continue;
        }
        if (f.type == RLAI_MSG_TOKEN && *ttft < 0)
            *ttft = now_ms() - t0;
        if (f.type == RLAI_MSG_ERROR) {
            fprintf(stderr, "loremaster.talk %s: %s %s\n", character, f.u.error.name ? f.u.error.name : "",
                    f.u.error.msg ? f.u.error.msg : "");
            rlai_msg_free(&f);
            return RLAI_ERR_PROTOCOL;
        }
        if (f.type == RLAI_MSG_DONE) {
            if (f.u.done.has_metrics) {
                *engine_ttft = f.u.done.metrics.ttft_ms;
                *prompt = f.u.done.metrics.prompt_tokens;
                *reused = f.u.done.metrics.reused_tokens;
            }
            rlai_msg_free(&f);
            break;
        }
        rlai_msg_free(&f);
    }
    if (*ttft < 0)   /* no text at all (immediate end): count the whole call */
        *ttft = now_ms() - t0;
    return 0;
}

static void add(series *s, double ttft, double ettft, long prompt, long reused)
{
    if (s->n >= MAX_SAMPLES)
        return;
    s->ttft[s->n] = ttft;
    s->engine_ttft[s->n] = ettft;
    s->prompt += prompt;
    s->reused += reused;
    s->n++;
}

typedef struct mode_result {
    series first, follow;
    double startup_ms;
} mode_result;

static void run_mode(mode_result *r, const char *rlai, const char *model, const char *plugins, int threads,
                     bool prefix_cache, int rounds, int max_tokens)
{
    memset(r, 0, sizeof *r);
    daemon_proc d;
    rlai_client *c = start_daemon(&d, rlai, model, plugins, threads, prefix_cache);
    r->startup_ms = d.startup_ms;
    double t, et = 0;
    long p = 0, u = 0;
    /* Warm-up (not measured): page in the weights and the call path. */
    if (talk(c, "pell", NULL, "Hi.", 4, &t, &et, &p, &u) != 0)
        goto fail;
    for (int round = 0; round < rounds; round++) {
        for (int i = 0; i < N_CHARACTERS; i++) {
            char session[64];
            snprintf(session, sizeof session, "bench-%d-%d", round, i);
            const char *first = FIRST_LINES[(round + i) % 3], *follow = FOLLOW_UPS[(round + i) % 3];
            if (talk(c, CHARACTERS[i], session, first, max_tokens, &t, &et, &p, &u) != 0)
                goto fail;
            add(&r->first, t, et, p, u);
            if (talk(c, CHARACTERS[i], session, follow, max_tokens, &t, &et, &p, &u) != 0)
                goto fail;
            add(&r->follow, t, et, p, u);
        }
    }
    rlai_client_close(c);
    stop_daemon(&d);
    return;
fail:
    rlai_client_close(c);
    show_log(&d);
    stop_daemon(&d);
    exit(1);
}

static void row(const char *name, const series *a, const series *b)
{
    double a50 = median(a->ttft, a->n), b50 = median(b->ttft, b->n);
    printf("%-26s %8.1f %8.1f %8.1f %6ld/%-6ld | %8.1f %8.1f %8.1f %6ld/%-6ld | %6.2fx\n", name, a50,
           mean(a->ttft, a->n), median(a->engine_ttft, a->n), a->n ? a->prompt / a->n : 0,
           a->n ? a->reused / a->n : 0, b50, mean(b->ttft, b->n), median(b->engine_ttft, b->n),
           b->n ? b->prompt / b->n : 0, b->n ? b->reused / b->n : 0, a50 > 0 ? b50 / a50 : 0);
}

static void usage(void)
{
    fprintf(stderr, "usage: bench_loremaster [--rlai PATH] [--model FILE] [--rounds N] [--threads N] "
                    "[--max-tokens N]\n");
}

int main(int argc, char **argv)
{
    char self_dir[4096] = ".";
    ssize_t n = readlink("/proc/self/exe", self_dir, sizeof self_dir - 1);
    if (n > 0) {
        self_dir[n] = '\0';
        char *slash = strrchr(self_dir, '/');
        if (slash)
            *slash = '\0';
    }
    char rlai_buf[4200], model_buf[4200], plugins[4400];
    snprintf(rlai_buf, sizeof rlai_buf, "%s/../host/rlai", self_dir);
    snprintf(model_buf, sizeof model_buf, "%s/SmolLM2-135M-Instruct.Q4_1.gguf", RLAI_MODELS_DIR);
    const char *rlai = rlai_buf, *model = model_buf;
    int rounds = 2, threads = 2, max_tokens = 8;
    static const struct option opts[] = {
        { "rlai", required_argument, 0, 'r' }, { "model", required_argument, 0, 'm' },
        { "rounds", required_argument, 0, 'n' }, { "threads", required_argument, 0, 't' },
        { "max-tokens", required_argument, 0, 'x' }, { "help", no_argument, 0, 'h' }, { 0, 0, 0, 0 },
    };
    int o;
    while ((o = getopt_long(argc, argv, "r:m:n:t:x:h", opts, NULL)) != -1) {
        switch (o) {
        case 'r': rlai = optarg; break;
        case 'm': model = optarg; break;
        case 'n': rounds = atoi(optarg); break;
        case 't': threads = atoi(optarg); break;
        case 'x': max_tokens = atoi(optarg); break;
        default: usage(); return o == 'h' ? 0 : 2;
        }
    }
    if (rounds < 1 || rounds * N_CHARACTERS > MAX_SAMPLES || threads < 1 || max_tokens < 1) {
        usage();
        return 2;
    }
    if (access(rlai, X_OK) != 0) {
        fprintf(stderr, "bench_loremaster: %s: not an executable (use --rlai PATH)\n", rlai);
        return 1;
    }
    if (access(model, R_OK) != 0) {
        fprintf(stderr, "bench_loremaster: %s: model not found (use --model FILE)\n", model);
        return 1;
    }
    /* plugins/ of the build tree holding that rlai: <rlai dir>/../plugins */
    snprintf(plugins, sizeof plugins, "%s", rlai);
    char *slash = strrchr(plugins, '/');
    if (slash)
        *slash = '\0';
    else
        snprintf(plugins, sizeof plugins, ".");
    strncat(plugins, "/../plugins", sizeof plugins - strlen(plugins) - 1);
    char manifest[4500];
    snprintf(manifest, sizeof manifest, "%s/loremaster/manifest.json", plugins);
    if (access(manifest, R_OK) != 0) {
        fprintf(stderr, "bench_loremaster: %s missing (build the loremaster plugin)\n", manifest);
        return 1;
    }

    double t0 = now_ms();
    mode_result cached, baseline;
    run_mode(&cached, rlai, model, plugins, threads, true, rounds, max_tokens);
    run_mode(&baseline, rlai, model, plugins, threads, false, rounds, max_tokens);

    printf("loremaster.talk TTFT over ZeroMQ ipc: %s, %d threads, %d characters x %d rounds, greedy, "
           "max_tokens %d\n", model, threads, N_CHARACTERS, rounds, max_tokens);
    printf("TTFT = send to first token frame (client side, ms); engine = the daemon's ttft_ms (median);\n"
           "tokens = mean prompt/reused tokens. Baseline: the same daemon with --no-prefix-cache.\n\n");
    printf("%-26s %-40s | %-40s | %s\n", "", "prefix cache (lore pinned)", "no prefix cache (baseline)", "speedup");
    printf("%-26s %8s %8s %8s %13s | %8s %8s %8s %13s | %7s\n", "case", "p50", "mean", "engine", "prompt/reused",
           "p50", "mean", "engine", "prompt/reused", "(p50)");
    row("first line (new session)", &cached.first, &baseline.first);
    row("follow-up turn", &cached.follow, &baseline.follow);
    printf("\ndaemon start to first answer (model load + lore pinning): %.0f ms with the prefix cache, %.0f ms "
           "without\n", cached.startup_ms, baseline.startup_ms);
    printf("total bench time %.1f s\n", (now_ms() - t0) / 1000.0);
    return 0;
}
