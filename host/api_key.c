/* api_key.c - resolving, creating and checking the API key (api_key.h). */
#include "api_key.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rlai/error.h"

/* A key is 1..RLAI_API_KEY_MAX visible ASCII characters (it travels in an
 * HTTP header and as a ZeroMQ PLAIN password). */
static bool key_ok(const char *k, size_t n)
{
    if (n == 0 || n > RLAI_API_KEY_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)k[i] <= 0x20 || (unsigned char)k[i] >= 0x7f)
            return false;
    return true;
}

int rlai_api_key_default_path(char *buf, size_t cap)
{
    const char *xdg = getenv("XDG_CONFIG_HOME");
    const char *home = getenv("HOME");
    int n;
    if (xdg && xdg[0] == '/')
        n = snprintf(buf, cap, "%s/rlai/api_key", xdg);
    else if (home && home[0] == '/')
        n = snprintf(buf, cap, "%s/.config/rlai/api_key", home);
    else
        return RLAI_ERR_NOT_FOUND;
    return n < 0 || (size_t)n >= cap ? RLAI_ERR_TOO_LARGE : 0;
}

int rlai_api_key_read_file(const char *path, char *key, char *err, size_t errlen)
{
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        struct stat lst;
        if (e == ENOENT)
            return rlai_errf(err, errlen, RLAI_ERR_NOT_FOUND, "API key file %s does not exist", path);
        if (lstat(path, &lst) == 0 && S_ISLNK(lst.st_mode))
            return rlai_errf(err, errlen, RLAI_ERR_IO, "refusing API key file %s: it is a symbolic link", path);
        return rlai_errf(err, errlen, RLAI_ERR_IO, "cannot open API key file %s: %s", path, strerror(e));
    }
    struct stat st;
    int rc = 0;
    if (fstat(fd, &st) < 0)
        rc = rlai_errf(err, errlen, RLAI_ERR_IO, "cannot stat API key file %s: %s", path, strerror(errno));
    else if (!S_ISREG(st.st_mode))
        rc = rlai_errf(err, errlen, RLAI_ERR_IO, "refusing API key file %s: not a regular file", path);
    else if (st.st_uid != geteuid())
        rc = rlai_errf(err, errlen, RLAI_ERR_IO, "refusing API key file %s: owned by uid %u, not by this user (uid %u)",
                  path, (unsigned)st.st_uid, (unsigned)geteuid());
    else if (st.st_mode & 077)
        rc = rlai_errf(err, errlen, RLAI_ERR_IO,
                  "refusing API key file %s: mode %04o lets other users read or change it; it must be 0600 "
                  "(chmod 600 %s)", path, (unsigned)(st.st_mode & 07777), path);
    if (rc < 0) {
        close(fd);
        return rc;
    }
    char buf[RLAI_API_KEY_MAX + 8];
    size_t n = 0;
    for (;;) {
        ssize_t r = read(fd, buf + n, sizeof buf - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            close(fd);
            return rlai_errf(err, errlen, RLAI_ERR_IO, "cannot read API key file %s: %s", path, strerror(errno));
        }
        if (r == 0 || (n += (size_t)r) == sizeof buf)
            break;
    }
    close(fd);
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ' || buf[n - 1] == '\t'))
        n--;
    if (!key_ok(buf, n))
        return rlai_errf(err, errlen, RLAI_ERR_FORMAT,
                    "API key file %s must hold one key of 1 to %d visible ASCII characters", path, RLAI_API_KEY_MAX);
    memcpy(key, buf, n);
    key[n] = '\0';
    return 0;
}

/* mkdir -p of path's folder, new folders 0700. */
static int make_parent(const char *path, char *err, size_t errlen)
{
    char dir[PATH_MAX];
    size_t len = strlen(path);
    if (len >= sizeof dir)
        return rlai_errf(err, errlen, RLAI_ERR_IO, "API key file path too long");
    memcpy(dir, path, len + 1);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir)
        return 0;
    *slash = '\0';
    for (char *p = dir + 1;; p++) {
        if (*p != '/' && *p != '\0')
            continue;
        char saved = *p;
        *p = '\0';
        if (mkdir(dir, 0700) < 0 && errno != EEXIST)
            return rlai_errf(err, errlen, RLAI_ERR_IO, "cannot create %s for the API key: %s", dir, strerror(errno));
        *p = saved;
        if (!saved)
            break;
    }
    return 0;
}

static int create_file(const char *path, char *key, char *err, size_t errlen)
{
    int rc = make_parent(path, err, errlen);
    if (rc < 0)
        return rc;
    unsigned char raw[32];
    size_t got = 0;
    while (got < sizeof raw) {
        ssize_t r = getrandom(raw + got, sizeof raw - got, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return rlai_errf(err, errlen, RLAI_ERR_IO, "getrandom: %s", strerror(errno));
        got += (size_t)r;
    }
    static const char hex[] = "0123456789abcdef";
    char text[65 + 1];
    for (size_t i = 0; i < sizeof raw; i++) {
        text[2 * i] = hex[raw[i] >> 4];
        text[2 * i + 1] = hex[raw[i] & 15];
    }
    text[64] = '\n';
    text[65] = '\0';
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        if (errno == EEXIST) /* created meanwhile: use that one, with the checks */
            return 1;
        return rlai_errf(err, errlen, RLAI_ERR_IO, "cannot create API key file %s: %s", path, strerror(errno));
    }
    if (fchmod(fd, 0600) < 0 || write(fd, text, 65) != 65 || fsync(fd) < 0) {
        int e = errno;
        close(fd);
        unlink(path);
        return rlai_errf(err, errlen, RLAI_ERR_IO, "cannot write API key file %s: %s", path, strerror(e));
    }
    close(fd);
    memcpy(key, text, 64);
    key[64] = '\0';
    return 0;
}

int rlai_api_key_resolve(const char *config_key, const char *config_file, rlai_api_key *out, char *err,
                         size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (config_key && *config_key) {
        if (!key_ok(config_key, strlen(config_key)))
            return rlai_errf(err, errlen, RLAI_ERR_FORMAT,
                        "config auth.api_key must be 1 to %d visible ASCII characters", RLAI_API_KEY_MAX);
        strcpy(out->key, config_key);
        snprintf(out->source, sizeof out->source, "config auth.api_key");
        return 0;
    }
    const char *env = getenv("RLAI_API_KEY");
    if (env && *env) {
        if (!key_ok(env, strlen(env)))
            return rlai_errf(err, errlen, RLAI_ERR_FORMAT,
                        "RLAI_API_KEY must be 1 to %d visible ASCII characters", RLAI_API_KEY_MAX);
        strcpy(out->key, env);
        snprintf(out->source, sizeof out->source, "environment RLAI_API_KEY");
        return 0;
    }
    char path[4096];
    if (config_file && *config_file) {
        if (strlen(config_file) >= sizeof path)
            return rlai_errf(err, errlen, RLAI_ERR_IO, "API key file path too long");
        strcpy(path, config_file);
    } else {
        int rc = rlai_api_key_default_path(path, sizeof path);
        if (rc < 0)
            return rlai_errf(err, errlen, RLAI_ERR_IO,
                        "no place for the API key file (set HOME or XDG_CONFIG_HOME, or pass --api-key-file)");
    }
    out->from_file = true;
    snprintf(out->source, sizeof out->source, "%s", path);
    int rc = rlai_api_key_read_file(path, out->key, err, errlen);
    if (rc != RLAI_ERR_NOT_FOUND)
        return rc;
    rc = create_file(path, out->key, err, errlen);
    if (rc == 1)
        return rlai_api_key_read_file(path, out->key, err, errlen);
    if (rc == 0)
        out->created = true;
    return rc;
}

bool rlai_api_key_equal(const char *given, size_t len, const char *expected)
{
    size_t elen = strlen(expected);
    unsigned diff = (unsigned)(len != elen);
    for (size_t i = 0; i < elen; i++)
        diff |= (unsigned)((unsigned char)expected[i] ^ (i < len ? (unsigned char)given[i] : 0u));
    return diff == 0 && elen > 0;
}
