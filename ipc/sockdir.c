/* sockdir.c - checks of the socket directory (see sockdir.h). */
#include "sockdir.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rlai/error.h"

static void set_err(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* The parent directory of path into dir. */
static int parent_of(const char *path, char *dir, size_t cap)
{
    size_t len = strlen(path);
    if (len >= cap)
        return RLAI_ERR_INVALID_ARG;
    memcpy(dir, path, len + 1);
    char *slash = strrchr(dir, '/');
    if (!slash)
        strcpy(dir, ".");
    else if (slash == dir)
        dir[1] = '\0';
    else
        *slash = '\0';
    return 0;
}

static int open_nofollow(const char *dir)
{
    return open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
}

int rlai_sockdir_open(const char *path, bool create, char *err, size_t errlen)
{
    char dir[PATH_MAX];
    if (!path || parent_of(path, dir, sizeof dir) < 0) {
        set_err(err, errlen, "socket path too long: %s", path ? path : "(null)");
        return RLAI_ERR_INVALID_ARG;
    }
    bool created = false;
    if (create && strcmp(dir, ".") != 0 && strcmp(dir, "/") != 0) {
        for (char *p = dir + 1;; p++) {
            if (*p != '/' && *p != '\0')
                continue;
            char saved = *p;
            *p = '\0';
            if (mkdir(dir, 0700) == 0) {
                if (saved == '\0')
                    created = true;
            } else if (errno != EEXIST) {
                set_err(err, errlen, "cannot create socket directory %s: %s", dir, strerror(errno));
                return RLAI_ERR_IO;
            }
            *p = saved;
            if (saved == '\0')
                break;
        }
    }
    int fd = open_nofollow(dir);
    if (fd < 0) {
        int e = errno;
        struct stat lst;
        if (lstat(dir, &lst) == 0 && S_ISLNK(lst.st_mode))
            set_err(err, errlen, "refusing socket directory %s: it is a symbolic link (it must be a real directory "
                    "owned by this user, mode 0700)", dir);
        else if (e == ENOTDIR)
            set_err(err, errlen, "refusing socket directory %s: not a directory", dir);
        else if (e == ENOENT)
            set_err(err, errlen, "socket directory %s does not exist", dir);
        else
            set_err(err, errlen, "cannot open socket directory %s: %s", dir, strerror(e));
        return RLAI_ERR_IO;
    }
    struct stat st;
    if (fstat(fd, &st) < 0) {
        set_err(err, errlen, "cannot stat socket directory %s: %s", dir, strerror(errno));
        close(fd);
        return RLAI_ERR_IO;
    }
    if (created && st.st_uid == geteuid() && (st.st_mode & 07777) != 0700)
        fchmod(fd, 0700); /* a umask that also took owner bits */
    if (!S_ISDIR(st.st_mode)) {
        set_err(err, errlen, "refusing socket directory %s: not a directory", dir);
        close(fd);
        return RLAI_ERR_IO;
    }
    if (st.st_uid != geteuid()) {
        set_err(err, errlen, "refusing socket directory %s: owned by uid %u, not by this user (uid %u); "
                "another user could replace the socket", dir, (unsigned)st.st_uid, (unsigned)geteuid());
        close(fd);
        return RLAI_ERR_IO;
    }
    if (st.st_mode & 077) {
        set_err(err, errlen, "refusing socket directory %s: mode %04o gives other users access; it must be 0700 "
                "(chmod 700 %s)", dir, (unsigned)(st.st_mode & 07777), dir);
        close(fd);
        return RLAI_ERR_IO;
    }
    return fd;
}

bool rlai_sockdir_same(int dirfd, const char *path)
{
    char dir[PATH_MAX];
    if (parent_of(path, dir, sizeof dir) < 0)
        return false;
    int fd = open_nofollow(dir);
    if (fd < 0)
        return false;
    struct stat a, b;
    bool same = fstat(fd, &a) == 0 && fstat(dirfd, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
    close(fd);
    return same;
}
