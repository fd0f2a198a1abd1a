/* chat_repl.c - the interactive loop of `rlai chat` (see chat_repl.h). */
#include "chat_repl.h"
#include "rlai/error.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <langinfo.h>
#include <limits.h>
#include <locale.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <wchar.h>

#ifdef RLAI_HAVE_LIBEDIT
#include <histedit.h>
#endif

/* Ctrl-C: the flag, and a self-pipe that wakes the line reader. The
 * handler may run on any thread of the process (the in-process engine's
 * workers too), so a blocked read() on the main thread is not reliably
 * interrupted; and a SIGINT that lands while the reader is between reads
 * (drawing the prompt, echoing a key) interrupts nothing at all. Both
 * used to leave the flag set until the next Enter, which then dropped the
 * line just typed. The reader polls stdin and the pipe instead. */
static volatile sig_atomic_t g_sigint;
static int g_sigpipe[2] = { -1, -1 };

static void on_sigint(int sig)
{
    (void)sig;
    int saved = errno;
    g_sigint = 1;
    if (g_sigpipe[1] >= 0) {
        ssize_t w = write(g_sigpipe[1], "i", 1);   /* non-blocking; a full pipe already wakes */
        (void)w;
    }
    errno = saved;
}

/* Forgets a Ctrl-C: the flag and any bytes in the pipe. */
static void sigint_clear(void)
{
    g_sigint = 0;
    char junk[64];
    if (g_sigpipe[0] >= 0)
        while (read(g_sigpipe[0], junk, sizeof(junk)) > 0) {
        }
}

bool rlai_chat_repl_interrupted(void)
{
    return g_sigint != 0;
}

int rlai_chat_history_path(char *buf, size_t cap)
{
    const char *state = getenv("XDG_STATE_HOME");
    const char *home = getenv("HOME");
    int w;
    if (state && *state == '/')
        w = snprintf(buf, cap, "%s/rlai/chat_history", state);
    else if (home && *home)
        w = snprintf(buf, cap, "%s/.local/state/rlai/chat_history", home);
    else
        return RLAI_ERR_NOT_FOUND;
    return w > 0 && (size_t)w < cap ? 0 : RLAI_ERR_TOO_LARGE;
}

/* mkdir -p of path's folder, new folders 0700. */
static int make_parent(const char *path)
{
    char dir[PATH_MAX];
    int w = snprintf(dir, sizeof(dir), "%s", path);
    if (w <= 0 || (size_t)w >= sizeof(dir))
        return RLAI_ERR_TOO_LARGE;
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir)
        return 0;
    *slash = 0;
    for (char *p = dir + 1;; p++) {
        if (*p != '/' && *p)
            continue;
        char saved = *p;
        *p = 0;
        if (mkdir(dir, 0700) < 0 && errno != EEXIST)
            return RLAI_ERR_IO;
        *p = saved;
        if (!saved)
            break;
    }
    return 0;
}

int rlai_chat_save_json(const char *path, const rlai_chat_message *msgs, int n, char *err, size_t errlen)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *arr = root ? cJSON_AddArrayToObject(root, "messages") : NULL;
    bool ok = arr != NULL;
    for (int i = 0; ok && i < n; i++) {
        cJSON *m = cJSON_CreateObject();
        ok = m && cJSON_AddStringToObject(m, "role", msgs[i].role) &&
             cJSON_AddStringToObject(m, "content", msgs[i].content ? msgs[i].content : "");
        if (m)
            cJSON_AddItemToArray(arr, m);
    }
    char *text = ok ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (!text) {
        snprintf(err, errlen, "out of memory");
        return RLAI_ERR_NOMEM;
    }
    int rc = 0;
    FILE *f = fopen(path, "w");
    if (!f) {
        snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno));
        rc = RLAI_ERR_IO;
    } else {
        size_t len = strlen(text);
        bool wrote = fwrite(text, 1, len, f) == len && fputc('\n', f) != EOF;
        if (fclose(f) != 0 || !wrote) {
            snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno));
            rc = RLAI_ERR_IO;
        }
    }
    free(text);
    return rc;
}

/* ------------------------------------------------------------ input */

typedef enum { IN_LINE, IN_EOF, IN_INTR } in_status;

typedef struct reader {
#ifdef RLAI_HAVE_LIBEDIT
    EditLine *el;
    History *hist;
#endif
    bool edit;                 /* libedit in use */
    char history[PATH_MAX];    /* "" = no history file */
    char *buf;                 /* plain mode: getline buffer */
    size_t cap;
    const char *prompt;
    char *old_ctype;           /* LC_CTYPE to put back, or NULL */
} reader;

#ifdef RLAI_HAVE_LIBEDIT
/* libedit's character source: one character from stdin, decoded in the
 * current locale, or -1 with errno EINTR as soon as a Ctrl-C is pending,
 * whenever it landed (the built-in source only sees a SIGINT that
 * interrupts its read()). */
static int tty_getc(EditLine *el, wchar_t *wc)
{
    (void)el;
    char buf[MB_LEN_MAX];
    size_t n = 0;
    for (;;) {
        if (g_sigint) {
            errno = EINTR;
            return -1;
        }
        struct pollfd pf[2] = { { STDIN_FILENO, POLLIN, 0 }, { g_sigpipe[0], POLLIN, 0 } };
        int r = poll(pf, g_sigpipe[0] >= 0 ? 2 : 1, -1);
        if (r < 0 && errno != EINTR)
            return -1;
        if (r <= 0)
            continue;
        if (pf[1].revents && !g_sigint)
            sigint_clear();    /* a stale byte: the flag was cleared without it */
        if (!pf[0].revents || g_sigint)
            continue;
        ssize_t got = read(STDIN_FILENO, buf + n, 1);
        if (got < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (got < 0)
            return -1;
        if (got == 0) {
            *wc = 0;
            return 0;
        }
        n++;
        mbstate_t st;
        memset(&st, 0, sizeof(st));
        size_t k = mbrtowc(wc, buf, n, &st);
        if (k == (size_t)-2 && n < sizeof(buf))
            continue;          /* a multibyte character goes on */
        if (k == (size_t)-1 || k == (size_t)-2) {
            n = 0;             /* not a character here: dropped, as libedit does */
            continue;
        }
        return 1;
    }
}

/* Line editing needs the terminal's characters decoded: in the "C" locale
 * (no LANG, a bare ssh session or container) libedit dropped every byte
 * above 127, so "héllo" reached the model as "hllo". Text in rlai is
 * UTF-8 throughout, so LC_CTYPE is the user's when that is UTF-8, else
 * C.UTF-8. Only LC_CTYPE, and only while the loop runs. */
static void reader_locale(reader *r)
{
    const char *cur = setlocale(LC_CTYPE, NULL);
    r->old_ctype = cur ? strdup(cur) : NULL;
    if (setlocale(LC_CTYPE, "") && !strcmp(nl_langinfo(CODESET), "UTF-8"))
        return;
    if (setlocale(LC_CTYPE, "C.UTF-8") && !strcmp(nl_langinfo(CODESET), "UTF-8"))
        return;
    if (setlocale(LC_CTYPE, "C.utf8") && !strcmp(nl_langinfo(CODESET), "UTF-8"))
        return;
    if (r->old_ctype)
        setlocale(LC_CTYPE, r->old_ctype);   /* no UTF-8 locale here: as before */
}

static char *el_prompt(EditLine *el)
{
    void *data = NULL;
    el_get(el, EL_CLIENTDATA, &data);
    reader *r = data;
    return (char *)(r && r->prompt ? r->prompt : "> ");
}
#endif

static void reader_open(reader *r)
{
    memset(r, 0, sizeof(*r));
    r->prompt = "> ";
    if (rlai_chat_history_path(r->history, sizeof(r->history)) < 0 || make_parent(r->history) < 0)
        r->history[0] = 0;
#ifdef RLAI_HAVE_LIBEDIT
    if (!isatty(STDIN_FILENO) || !isatty(STDOUT_FILENO))
        return;
    reader_locale(r);
    r->el = el_init("rlai", stdin, stdout, stderr);
    r->hist = history_init();
    if (!r->el || !r->hist) {
        if (r->el)
            el_end(r->el);
        if (r->hist)
            history_end(r->hist);
        r->el = NULL;
        r->hist = NULL;
        return;
    }
    HistEvent ev;
    history(r->hist, &ev, H_SETSIZE, 1000);
    history(r->hist, &ev, H_SETUNIQUE, 1);
    el_set(r->el, EL_CLIENTDATA, r);
    el_set(r->el, EL_EDITOR, "emacs");
    el_set(r->el, EL_PROMPT, el_prompt);
    el_set(r->el, EL_HIST, history, r->hist);
    el_set(r->el, EL_SIGNAL, 0);
    el_set(r->el, EL_GETCFN, tty_getc);
    if (r->history[0])
        history(r->hist, &ev, H_LOAD, r->history);
    r->edit = true;
#endif
}

static void reader_add_history(reader *r, const char *line)
{
#ifdef RLAI_HAVE_LIBEDIT
    if (!r->edit)
        return;
    HistEvent ev;
    history(r->hist, &ev, H_ENTER, line);
    if (r->history[0]) {
        /* Saved after every line (a crash keeps it), then made 0600. */
        int fd = open(r->history, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
        if (fd >= 0) {
            fchmod(fd, 0600);
            close(fd);
        }
        history(r->hist, &ev, H_SAVE, r->history);
    }
#else
    (void)r;
    (void)line;
#endif
}

static void reader_close(reader *r)
{
#ifdef RLAI_HAVE_LIBEDIT
    if (r->el)
        el_end(r->el);
    if (r->hist)
        history_end(r->hist);
#endif
    if (r->old_ctype)
        setlocale(LC_CTYPE, r->old_ctype);
    free(r->old_ctype);
    free(r->buf);
}

/* Reads one line into *out (valid until the next call), without its
 * newline. IN_INTR: Ctrl-C; *had_text says whether the line had text. */
static in_status reader_get(reader *r, const char *prompt, const char **out, bool *had_text)
{
    r->prompt = prompt;
    *had_text = false;
    sigint_clear();
#ifdef RLAI_HAVE_LIBEDIT
    if (r->edit) {
        int count = 0;
        const char *line = el_gets(r->el, &count);
        if (g_sigint || (count < 0 && errno == EINTR)) {
            const LineInfo *li = el_line(r->el);
            *had_text = li && li->lastchar > li->buffer;
            el_reset(r->el);
            fputc('\n', stdout);
            fflush(stdout);
            sigint_clear();
            return IN_INTR;
        }
        if (!line || count <= 0)
            return IN_EOF;
        size_t len = strlen(line);
        free(r->buf);
        r->buf = malloc(len + 1);
        if (!r->buf)
            return IN_EOF;
        memcpy(r->buf, line, len + 1);
        while (len > 0 && (r->buf[len - 1] == '\n' || r->buf[len - 1] == '\r'))
            r->buf[--len] = 0;
        *out = r->buf;
        return IN_LINE;
    }
#endif
    fputs(prompt, stderr);
    fflush(stderr);
    errno = 0;
    ssize_t got = getline(&r->buf, &r->cap, stdin);
    if (got < 0 && (g_sigint || errno == EINTR)) {
        clearerr(stdin);
        fputc('\n', stderr);
        sigint_clear();
        return IN_INTR;
    }
    if (got <= 0)
        return IN_EOF;
    while (got > 0 && (r->buf[got - 1] == '\n' || r->buf[got - 1] == '\r'))
        r->buf[--got] = 0;
    *out = r->buf;
    return IN_LINE;
}

/* ------------------------------------------------------------ the loop */

typedef struct convo {
    rlai_chat_message *m;      /* contents malloc'd; roles are literals */
    int n, cap;
} convo;

static int convo_add(convo *c, const char *role, char *content)
{
    if (!content)
        return RLAI_ERR_NOMEM;
    if (c->n == c->cap) {
        int nc = c->cap ? c->cap * 2 : 8;
        rlai_chat_message *nm = realloc(c->m, sizeof(*nm) * (size_t)nc);
        if (!nm) {
            free(content);
            return RLAI_ERR_NOMEM;
        }
        c->m = nm;
        c->cap = nc;
    }
    c->m[c->n++] = (rlai_chat_message){ role, content };
    return 0;
}

static void convo_clear(convo *c, bool keep_system)
{
    int keep = 0;
    for (int i = 0; i < c->n; i++) {
        if (keep_system && !strcmp(c->m[i].role, "system"))
            c->m[keep++] = c->m[i];
        else
            free((char *)c->m[i].content);
    }
    c->n = keep;
}

/* /system TEXT: replaces the system message (or puts one first). */
static int convo_set_system(convo *c, const char *text)
{
    char *copy = strdup(text);
    if (!copy)
        return RLAI_ERR_NOMEM;
    if (c->n > 0 && !strcmp(c->m[0].role, "system")) {
        free((char *)c->m[0].content);
        c->m[0].content = copy;
        return 0;
    }
    int rc = convo_add(c, "system", copy);
    if (rc < 0)
        return rc;
    rlai_chat_message sys = c->m[c->n - 1];
    memmove(c->m + 1, c->m, sizeof(*c->m) * (size_t)(c->n - 1));
    c->m[0] = sys;
    return 0;
}

static void print_help(void)
{
    fprintf(stderr,
            "commands:\n"
            "  /help          this list\n"
            "  /reset         start the conversation over (asks first; keeps the system prompt)\n"
            "  /system TEXT   set the system prompt\n"
            "  /save FILE     write the conversation as JSON ({\"messages\": [...]})\n"
            "keys: Up/Down recall earlier lines; Ctrl-C stops a reply (the conversation is kept);\n"
            "      Ctrl-C at an empty prompt or Ctrl-D quits; an empty line is ignored\n");
}

int rlai_chat_repl_run(const rlai_chat_repl_params *p)
{
    struct sigaction sa, old;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;   /* no SA_RESTART: a blocked read returns EINTR */
    if (pipe(g_sigpipe) < 0) {
        g_sigpipe[0] = g_sigpipe[1] = -1;   /* then a Ctrl-C wakes only a read it interrupts */
    } else {
        for (int i = 0; i < 2; i++) {
            fcntl(g_sigpipe[i], F_SETFL, fcntl(g_sigpipe[i], F_GETFL) | O_NONBLOCK);
            fcntl(g_sigpipe[i], F_SETFD, FD_CLOEXEC);
        }
    }
    sigaction(SIGINT, &sa, &old);

    reader rd;
    reader_open(&rd);
    convo cv = { NULL, 0, 0 };
    int status = 0;
    if (p->system && p->system[0] && convo_set_system(&cv, p->system) < 0)
        status = 1;
    fprintf(stderr, "rlai chat: type a message; /help for commands; Ctrl-D or Ctrl-C at an empty prompt quits\n");
    while (status == 0) {
        const char *line = NULL;
        bool had_text = false;
        in_status st = reader_get(&rd, "> ", &line, &had_text);
        if (st == IN_EOF)
            break;
        if (st == IN_INTR) {
            if (had_text)
                continue;      /* Ctrl-C drops the line being typed */
            break;
        }
        if (!line[0])
            continue;          /* an empty line does not quit */
        reader_add_history(&rd, line);
        if (line[0] == '/') {
            char err[512];
            if (!strcmp(line, "/help") || !strcmp(line, "/?")) {
                print_help();
            } else if (!strcmp(line, "/reset")) {
                const char *ans = NULL;
                bool ht;
                in_status a = reader_get(&rd, "reset the conversation? [y/N] ", &ans, &ht);
                if (a == IN_LINE && (!strcmp(ans, "y") || !strcmp(ans, "Y") || !strcmp(ans, "yes"))) {
                    convo_clear(&cv, true);
                    fprintf(stderr, "(conversation reset)\n");
                } else {
                    fprintf(stderr, "(kept)\n");
                    if (a == IN_EOF)
                        break;
                }
            } else if (!strncmp(line, "/system ", 8) && line[8]) {
                if (convo_set_system(&cv, line + 8) < 0)
                    status = 1;
                else
                    fprintf(stderr, "(system prompt set)\n");
            } else if (!strncmp(line, "/save ", 6) && line[6]) {
                if (rlai_chat_save_json(line + 6, cv.m, cv.n, err, sizeof(err)) < 0)
                    fprintf(stderr, "rlai chat: %s\n", err);
                else
                    fprintf(stderr, "(saved %d messages to %s)\n", cv.n, line + 6);
            } else {
                fprintf(stderr, "rlai chat: unknown command '%s' (/help lists them)\n", line);
            }
            continue;
        }
        if (convo_add(&cv, "user", strdup(line)) < 0) {
            status = 1;
            break;
        }
        /* g_sigint is not cleared here: a Ctrl-C that lands after Enter but
         * before the reply starts (reader_get cleared it when the line
         * began) stops that reply at its first token. */
        char *reply = NULL;
        int rc = p->generate(p->user, cv.m, cv.n, &reply);
        bool stopped = g_sigint != 0;
        sigint_clear();
        if (rc < 0) {
            free(reply);
            free((char *)cv.m[--cv.n].content);
            if (p->end_on_error)
                status = 1;
            continue;
        }
        if (stopped)
            fprintf(stderr, "(reply stopped; the conversation is kept)\n");
        if (convo_add(&cv, "assistant", reply ? reply : strdup("")) < 0)
            status = 1;
    }
    convo_clear(&cv, false);
    free(cv.m);
    reader_close(&rd);
    sigaction(SIGINT, &old, NULL);
    int fds[2] = { g_sigpipe[0], g_sigpipe[1] };
    g_sigpipe[0] = g_sigpipe[1] = -1;   /* before close: a late handler must not write to a reused fd */
    for (int i = 0; i < 2; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    return status;
}
