/* serve_lock.h - one engine per socket folder.
 *
 * `rlai serve` takes an exclusive flock(2) on engine.lock in the folder of
 * each of its socket files (the pipe and the ipc:// ZeroMQ endpoint) before
 * it loads anything, and writes its pid there; a second engine on the same
 * folder is refused with the running one's pid. The lock goes away with
 * the process (also when it is killed), so a stale file never blocks. */
#ifndef RLAI_SERVE_LOCK_H
#define RLAI_SERVE_LOCK_H

#include <stddef.h>

#define RLAI_SERVE_LOCK_MAX 2

typedef struct rlai_serve_lock {
    int fd[RLAI_SERVE_LOCK_MAX];   /* -1 = unused */
    int n;
} rlai_serve_lock;

/* Locks the folders of the socket paths (NULL entries and duplicates
 * skipped; "ipc://" and "unix://" prefixes accepted; tcp:// ignored),
 * creating a missing folder 0700 as the server would. On success *l holds
 * the locks (release with rlai_serve_lock_release). On failure nothing is
 * held and err names the folder and, when another engine holds it, that
 * engine's pid: RLAI_ERR_BUSY (held), RLAI_ERR_IO (folder unusable). */
int rlai_serve_lock_acquire(rlai_serve_lock *l, const char *const *paths, int n_paths, char *err, size_t errlen);

/* Drops the locks (the pid files stay; they are rewritten by the next
 * holder). Safe on a zeroed-out or already released lock. */
void rlai_serve_lock_release(rlai_serve_lock *l);

#endif
