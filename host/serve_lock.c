/* serve_lock.c - one engine per socket folder (see serve_lock.h). */
#include "serve_lock.h"
#include "sockdir.h"
#include "rlai/error.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define LOCK_NAME "engine.lock"

static const char *strip_scheme(const char *p)
{
    if (!strncmp(p, "ipc://", 6))
        return p + 6;
    if (!strncmp(p, "unix://", 7))
        return p + 7;
    if (strstr(p, "://"))
        return NULL;   /* tcp:// and others have no folder */
    return p;
}

static void folder_of(const char *path, char *dir, size_t cap)
{
    snprintf(dir, cap, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash)
        snprintf(dir, cap, ".");
    else if (slash == dir)
        dir[1] = 0;
    else
        *slash = 0;
}

void rlai_serve_lock_release(rlai_serve_lock *l)
{
    for (int i = 0; i < l->n; i++) {
        if (l->fd[i] >= 0)
            close(l->fd[i]);
        l->fd[i] = -1;
    }
    l->n = 0;
}

static int lock_one(const char *sock, char *err, size_t errlen, int *out)
{
    char dir[PATH_MAX];
    folder_of(sock, dir, sizeof(dir));
    int dfd = rlai_sockdir_open(sock, true, err, errlen);
    if (dfd < 0)
        return dfd;
    int fd = openat(dfd, LOCK_NAME, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    int e = errno;
    close(dfd);
    if (fd < 0) {
        snprintf(err, errlen, "cannot open %s/" LOCK_NAME ": %s", dir, strerror(e));
        return RLAI_ERR_IO;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
        e = errno;
        if (e == EWOULDBLOCK) {
            char buf[32] = { 0 };
            ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
            long pid = n > 0 ? strtol(buf, NULL, 10) : 0;
            if (pid > 0)
                snprintf(err, errlen, "another rlai serve (pid %ld) is already running on the socket folder %s "
                         "(stop it, or give this one other sockets: --pipe PATH --zmq ENDPOINT)", pid, dir);
            else
                snprintf(err, errlen, "another rlai serve is already running on the socket folder %s "
                         "(stop it, or give this one other sockets: --pipe PATH --zmq ENDPOINT)", dir);
            close(fd);
            return RLAI_ERR_BUSY;
        }
        snprintf(err, errlen, "cannot lock %s/" LOCK_NAME ": %s", dir, strerror(e));
        close(fd);
        return RLAI_ERR_IO;
    }
    char pid[32];
    int len = snprintf(pid, sizeof(pid), "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) < 0 || pwrite(fd, pid, (size_t)len, 0) != len) {
        snprintf(err, errlen, "cannot write %s/" LOCK_NAME ": %s", dir, strerror(errno));
        close(fd);
        return RLAI_ERR_IO;
    }
    *out = fd;
    return 0;
}

int rlai_serve_lock_acquire(rlai_serve_lock *l, const char *const *paths, int n_paths, char *err, size_t errlen)
{
    l->n = 0;
    for (int i = 0; i < RLAI_SERVE_LOCK_MAX; i++)
        l->fd[i] = -1;
    char seen[RLAI_SERVE_LOCK_MAX][PATH_MAX];
    for (int i = 0; i < n_paths; i++) {
        const char *p = paths[i] ? strip_scheme(paths[i]) : NULL;
        if (!p || !*p)
            continue;
        char dir[PATH_MAX];
        folder_of(p, dir, sizeof(dir));
        bool dup = false;
        for (int k = 0; k < l->n; k++)
            dup |= !strcmp(seen[k], dir);
        if (dup)
            continue;
        if (l->n == RLAI_SERVE_LOCK_MAX)
            break;
        int rc = lock_one(p, err, errlen, &l->fd[l->n]);
        if (rc < 0) {
            rlai_serve_lock_release(l);
            return rc;
        }
        snprintf(seen[l->n], PATH_MAX, "%s", dir);
        l->n++;
    }
    return 0;
}
