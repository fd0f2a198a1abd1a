/* main.c - rlai-gassist: the G-Assist plugin executable of RTX-LocalAI.
 *
 * G-Assist starts it with no arguments from its plugin folder and speaks
 * protocol V2 on its stdin/stdout (host/gassist/README.md). Settings
 * come from flags, then environment ($RLAI_ENDPOINT, $RLAI_GASSIST_LOG),
 * then config.json next to the executable, then defaults.
 *
 * Only protocol frames are ever written to stdout: the real stdout is kept
 * on a private descriptor for the bridge and descriptor 1 is pointed at the
 * log, so a stray printf from any library cannot corrupt the stream. When
 * logging to a file, stderr goes there too (G-Assist's emulator merges the
 * plugin's stderr into its stdout).
 *
 * `rlai-gassist --manifest [-o FILE]` writes manifest.json from the running
 * engine's command registry instead.
 */
#include "gassist_bridge.h"
#include "gassist_manifest.h"

#include "rlai/error.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void usage(FILE *f)
{
    fprintf(f,
        "usage: rlai-gassist [options]            serve G-Assist (protocol V2 on stdin/stdout)\n"
        "       rlai-gassist --manifest [-o FILE]  write manifest.json from the engine's commands\n"
        "\n"
        "  --endpoint E           engine: ipc://PATH, tcp://HOST:PORT or unix://PATH\n"
        "                         (default $RLAI_ENDPOINT, config.json, else the private socket of `rlai serve`)\n"
        "  --config FILE          settings file (default: config.json next to the executable, if present)\n"
        "  --log FILE|-           log file (default $RLAI_GASSIST_LOG, else rlai-gassist.log next to the\n"
        "                         executable, else in $TMPDIR); '-' = stderr\n"
        "  --log-level L          debug|info|warning|error|none (default warning; $RLAI_GASSIST_LOG_LEVEL)\n"
        "  --notify-level L       also send lines at this level as `log` notifications (default warning;\n"
        "                         $RLAI_GASSIST_NOTIFY_LEVEL)\n"
        "  -v, --verbose          info lines too (connections, each call's metrics): both levels = info\n"
        "  --timeout-ms N         end an execute/input after N ms (default 25000; G-Assist allows 30000)\n"
        "  --connect-timeout-ms N engine connect/hello time (default 2000)\n"
        "  --session-limit-ms N   length of a passthrough conversation (default 280000; G-Assist: 5 min)\n"
        "  --name NAME            plugin name (= its folder name, default \"rlai\")\n"
        "  --manifest             write the manifest and exit; with -o FILE (default stdout),\n"
        "                         --executable NAME (default \"" RLAI_GASSIST_DEFAULT_EXECUTABLE "\")\n"
        "  --version, -h/--help\n");
}

static int parse_level(const char *s, int *out)
{
    static const char *const names[] = { "none", "error", "warning", "info", "debug" };
    for (int i = 0; i < 5; i++) {
        if (!strcmp(s, names[i])) {
            *out = i;
            return 0;
        }
    }
    return -1;
}

static int parse_ms(const char *s, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < 1 || v > 3600000)
        return -1;
    *out = (int)v;
    return 0;
}

/* Directory of the running executable into buf ("" when unknown). */
static void exe_dir(char *buf, size_t cap)
{
    buf[0] = 0;
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0)
        return;
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (!slash)
        return;
    *slash = 0;
    snprintf(buf, cap, "%s", exe);
}

typedef struct settings {
    char *endpoint, *log, *name;
    int log_level, notify_level;
    int timeout_ms, connect_timeout_ms, session_limit_ms;
} settings;

static void set_str(char **dst, const char *v)
{
    free(*dst);
    *dst = v ? strdup(v) : NULL;
}

/* Reads config.json: {"endpoint", "log", "log_level", "notify_level",
 * "timeout_ms", "connect_timeout_ms", "session_limit_ms", "name"}; values
 * already set by flags win. Returns 0 or -1 with a message in err. */
static int load_config(const char *path, settings *s, const bool *from_flag, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    char buf[65536];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    cJSON *c = cJSON_ParseWithLength(buf, n);
    if (!cJSON_IsObject(c)) {
        snprintf(err, errlen, "%s is not a JSON object", path);
        cJSON_Delete(c);
        return -1;
    }
    static const char *const str_keys[] = { "endpoint", "log", "name" };
    char **str_dst[] = { &s->endpoint, &s->log, &s->name };
    for (int i = 0; i < 3; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(c, str_keys[i]);
        if (!v)
            continue;
        if (!cJSON_IsString(v)) {
            snprintf(err, errlen, "%s: \"%s\" must be a string", path, str_keys[i]);
            cJSON_Delete(c);
            return -1;
        }
        if (!from_flag[i])
            set_str(str_dst[i], v->valuestring);
    }
    static const char *const int_keys[] = { "timeout_ms", "connect_timeout_ms", "session_limit_ms" };
    int *int_dst[] = { &s->timeout_ms, &s->connect_timeout_ms, &s->session_limit_ms };
    for (int i = 0; i < 3; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(c, int_keys[i]);
        if (!v)
            continue;
        if (!cJSON_IsNumber(v) || v->valuedouble < 1 || v->valuedouble > 3600000) {
            snprintf(err, errlen, "%s: \"%s\" must be a number of milliseconds", path, int_keys[i]);
            cJSON_Delete(c);
            return -1;
        }
        if (!from_flag[3 + i])
            *int_dst[i] = (int)v->valuedouble;
    }
    static const char *const lvl_keys[] = { "log_level", "notify_level" };
    int *lvl_dst[] = { &s->log_level, &s->notify_level };
    for (int i = 0; i < 2; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(c, lvl_keys[i]);
        int lv;
        if (!v)
            continue;
        if (!cJSON_IsString(v) || parse_level(v->valuestring, &lv) < 0) {
            snprintf(err, errlen, "%s: \"%s\" must be debug, info, warning, error or none", path, lvl_keys[i]);
            cJSON_Delete(c);
            return -1;
        }
        if (!from_flag[6 + i])
            *lvl_dst[i] = lv;
    }
    cJSON_Delete(c);
    return 0;
}

static FILE *open_log(const char *path, char *used, size_t cap)
{
    FILE *f = fopen(path, "a");
    if (f)
        snprintf(used, cap, "%s", path);
    return f;
}

int main(int argc, char **argv)
{
    enum { O_ENDPOINT = 256, O_CONFIG, O_LOG, O_LOGLEVEL, O_NOTIFY, O_TIMEOUT, O_CTIMEOUT, O_SESSION, O_NAME,
           O_MANIFEST, O_EXEC, O_VERSION, O_VERBOSE };
    static const struct option opts[] = {
        { "endpoint", required_argument, 0, O_ENDPOINT }, { "config", required_argument, 0, O_CONFIG },
        { "log", required_argument, 0, O_LOG }, { "log-level", required_argument, 0, O_LOGLEVEL },
        { "notify-level", required_argument, 0, O_NOTIFY }, { "timeout-ms", required_argument, 0, O_TIMEOUT },
        { "connect-timeout-ms", required_argument, 0, O_CTIMEOUT },
        { "session-limit-ms", required_argument, 0, O_SESSION }, { "name", required_argument, 0, O_NAME },
        { "manifest", no_argument, 0, O_MANIFEST }, { "executable", required_argument, 0, O_EXEC },
        { "output", required_argument, 0, 'o' }, { "version", no_argument, 0, O_VERSION },
        { "verbose", no_argument, 0, 'v' }, { "help", no_argument, 0, 'h' }, { 0, 0, 0, 0 }
    };
    settings s = { 0 };
    s.log_level = s.notify_level = 2;   /* warning: info lines only when asked (-v) */
    /* endpoint log name timeout ctimeout session log_level notify_level */
    bool from_flag[8] = { false };
    const char *config = NULL, *output = NULL, *executable = NULL;
    bool manifest = false;
    int c, bad = 0;
    while ((c = getopt_long(argc, argv, "o:hv", opts, NULL)) != -1) {
        switch (c) {
        case O_ENDPOINT: set_str(&s.endpoint, optarg); from_flag[0] = true; break;
        case O_LOG: set_str(&s.log, optarg); from_flag[1] = true; break;
        case O_NAME: set_str(&s.name, optarg); from_flag[2] = true; break;
        case O_TIMEOUT: bad |= parse_ms(optarg, &s.timeout_ms); from_flag[3] = true; break;
        case O_CTIMEOUT: bad |= parse_ms(optarg, &s.connect_timeout_ms); from_flag[4] = true; break;
        case O_SESSION: bad |= parse_ms(optarg, &s.session_limit_ms); from_flag[5] = true; break;
        case O_LOGLEVEL: bad |= parse_level(optarg, &s.log_level); from_flag[6] = true; break;
        case O_NOTIFY: bad |= parse_level(optarg, &s.notify_level); from_flag[7] = true; break;
        case O_CONFIG: config = optarg; break;
        case O_MANIFEST: manifest = true; break;
        case O_EXEC: executable = optarg; break;
        case 'o': output = optarg; break;
        case O_VERSION: printf("rlai-gassist %s (G-Assist protocol 2.0)\n", RLAI_GASSIST_VERSION); return 0;
        case 'v':
            if (!from_flag[6])
                s.log_level = 3;
            if (!from_flag[7])
                s.notify_level = 3;
            from_flag[6] = from_flag[7] = true;
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (bad || optind != argc) {
        fprintf(stderr, "rlai-gassist: invalid option or value%s%s\n", optind != argc ? ": " : "",
                optind != argc ? argv[optind] : "");
        usage(stderr);
        return 2;
    }
    if (!from_flag[0]) {
        const char *env = getenv("RLAI_ENDPOINT");
        if (env && *env) {
            set_str(&s.endpoint, env);
            from_flag[0] = true;
        }
    }
    static const char *const lvl_env[] = { "RLAI_GASSIST_LOG_LEVEL", "RLAI_GASSIST_NOTIFY_LEVEL" };
    int *lvl_dst[] = { &s.log_level, &s.notify_level };
    for (int i = 0; i < 2; i++) {
        const char *env = getenv(lvl_env[i]);
        if (from_flag[6 + i] || !env || !*env)
            continue;
        if (parse_level(env, lvl_dst[i]) < 0) {
            fprintf(stderr, "rlai-gassist: %s=%s is not a level (debug|info|warning|error|none)\n", lvl_env[i], env);
            free(s.endpoint);
            free(s.log);
            free(s.name);
            return 2;
        }
        from_flag[6 + i] = true;
    }
    if (!from_flag[1]) {
        const char *env = getenv("RLAI_GASSIST_LOG");
        if (env && *env) {
            set_str(&s.log, env);
            from_flag[1] = true;
        }
    }
    char dir[PATH_MAX], path[PATH_MAX + 32], err[2 * PATH_MAX];
    exe_dir(dir, sizeof(dir));
    if (!config && dir[0]) {
        snprintf(path, sizeof(path), "%s/config.json", dir);
        if (access(path, R_OK) == 0)
            config = path;
    }
    if (config && load_config(config, &s, from_flag, err, sizeof(err)) < 0) {
        fprintf(stderr, "rlai-gassist: %s\n", err);
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);

    if (manifest) {
        rlai_gassist_manifest_opts mo = { 0 };
        mo.endpoint = s.endpoint;
        mo.name = s.name;
        mo.executable = executable;
        mo.timeout_ms = s.connect_timeout_ms > 0 ? s.connect_timeout_ms + 1000 : 0;
        int rc = rlai_gassist_manifest_save(&mo, output, err, sizeof(err));
        if (rc < 0)
            fprintf(stderr, "rlai-gassist: %s\n", err);
        else if (output && strcmp(output, "-"))
            fprintf(stderr, "rlai-gassist: wrote %s\n", output);
        free(s.endpoint);
        free(s.log);
        free(s.name);
        return rc < 0 ? 1 : 0;
    }

    /* Logging: a file unless "-"; stderr follows it. */
    FILE *log = NULL;
    char used[PATH_MAX + 32] = "";
    bool to_stderr = s.log && !strcmp(s.log, "-");
    if (to_stderr) {
        log = stderr;
    } else if (s.log) {
        log = open_log(s.log, used, sizeof(used));
        if (!log) {
            fprintf(stderr, "rlai-gassist: cannot open the log %s: %s\n", s.log, strerror(errno));
            return 1;
        }
    } else {
        if (dir[0]) {
            snprintf(path, sizeof(path), "%s/rlai-gassist.log", dir);
            log = open_log(path, used, sizeof(used));
        }
        if (!log) {
            const char *tmp = getenv("TMPDIR");
            snprintf(path, sizeof(path), "%s/rlai-gassist.log", tmp && *tmp ? tmp : "/tmp");
            log = open_log(path, used, sizeof(used));
        }
    }
    /* The protocol keeps the real stdout; descriptor 1 goes to the log. */
    int out_fd = fcntl(1, F_DUPFD_CLOEXEC, 3);
    if (out_fd < 0) {
        fprintf(stderr, "rlai-gassist: stdout is not open: %s\n", strerror(errno));
        return 1;
    }
    int sink = log ? fileno(log) : open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (sink >= 0) {
        dup2(sink, 1);
        if (log && !to_stderr)
            dup2(sink, 2);
        if (!log)
            close(sink);
    }
    if (log && log != stderr)
        setvbuf(log, NULL, _IOLBF, 0);

    gassist_bridge_config cfg = { 0 };
    cfg.endpoint = s.endpoint;
    cfg.in_fd = 0;
    cfg.out_fd = out_fd;
    cfg.connect_timeout_ms = s.connect_timeout_ms;
    cfg.execute_timeout_ms = s.timeout_ms;
    cfg.session_limit_ms = s.session_limit_ms;
    cfg.log = log;
    cfg.log_level = log ? s.log_level : 0;
    cfg.notify_level = s.notify_level;
    cfg.name = s.name;
    gassist_bridge *b;
    int status = 1;
    if (gassist_bridge_new(&cfg, &b) == 0) {
        status = gassist_bridge_run(b);
        gassist_bridge_destroy(&b);
    } else if (log) {
        fprintf(log, "rlai-gassist: out of memory\n");
    }
    close(out_fd);
    if (log && log != stderr)
        fclose(log);
    free(s.endpoint);
    free(s.log);
    free(s.name);
    return status;
}
