/* sockdir.h - the private directory that holds the engine's socket files.
 *
 * A socket directory is accepted only when it is a real directory (never
 * a symbolic link: it is opened with O_DIRECTORY | O_NOFOLLOW and checked
 * with fstat on that descriptor), owned by the effective uid and with no
 * group or other permission bits (mode 0700 or tighter). Anything else
 * would let another local user replace the socket, read prompts and forge
 * answers. Used by the server before it binds and by the client before it
 * connects.
 */
#ifndef RLAI_IPC_SOCKDIR_H
#define RLAI_IPC_SOCKDIR_H

#include <stdbool.h>
#include <stddef.h>

/* Opens and checks the parent directory of the socket file `path` ("."
 * for a bare file name). With create, missing directories are made with
 * mkdir(0700) first (intermediate ones too), then the last one is checked
 * the same way. Returns an O_DIRECTORY descriptor (owned by the caller,
 * close it) or a negative rlai_error with a message in err naming the
 * directory and what is wrong: RLAI_ERR_IO (symlink, not a directory,
 * other owner, group/other bits, cannot open), RLAI_ERR_INVALID_ARG for
 * an over-long path. */
int rlai_sockdir_open(const char *path, bool create, char *err, size_t errlen);

/* True when the parent directory of `path`, resolved again now, is still
 * the directory open as dirfd (same device and inode, not a symlink). */
bool rlai_sockdir_same(int dirfd, const char *path);

#endif
