/* kiln/pathtrust.h — may root run (or dlopen) the file at this path?
 *
 * Why: the cluster file names code that root runs on every node
 * (health.nvml_library, which kiln-healthd dlopens as uid 0; the Slurm
 * Prolog, Epilog, HealthCheckProgram and RebootProgram).  If any user can
 * change the file, or any directory on the way to it, that user runs code
 * as root: a .so written by nobody ran its constructor inside kiln-healthd.
 * So, as sudo does for its plugins and ssh (StrictModes) for its keys, the
 * file and every directory from / down to it must be owned by root and
 * writable by no group and no other user.
 *
 * The walk follows symbolic links component by component (a link's own
 * mode means nothing; the directory it sits in and its target are
 * checked).  One exception, which the kernel makes safe: a sticky
 * directory every user may write (/tmp) is passed when the entry in it is
 * root's, because nobody else may rename or remove that entry.  A path
 * that does not exist is trusted when the directory where it would be
 * created is: only root can create it there. */
#pragma once

#include <stddef.h>
#include <sys/types.h>

/* Symbolic links followed on one path before giving up (as the kernel's
 * MAXSYMLINKS): a loop must end. */
#define KILN_PATH_TRUST_MAX_LINKS 40

enum {
	KILN_PATH_TRUSTED = 0, /* exists, and only root can change it */
	KILN_PATH_ABSENT = 1,  /* does not exist; only root could create it */
};

/* Checks path, an absolute path as seen inside root ("/" or NULL: this
 * machine's own root; otherwise a directory holding a node's tree, as
 * kiln-node-init --root has: absolute links then resolve inside it).
 * owner: the one user besides root who may own the file and the
 * directories, because the code runs as that user anyway (a program
 * loading a library into itself passes geteuid(); 0: root only, for what
 * root runs).  Group- and world-writable is refused whoever owns it.
 * Returns KILN_PATH_TRUSTED, KILN_PATH_ABSENT, or:
 *   -EINVAL  path is not absolute (or NULL)
 *   -EPERM   someone other than root can change it; err says who and where
 *   -ELOOP   more than KILN_PATH_TRUST_MAX_LINKS links
 *   -ENAMETOOLONG, other -errno from lstat/readlink
 * err (when not NULL) gets a sentence naming the component at fault. */
int kiln_path_trusted(const char *root, const char *path, uid_t owner, char *err, size_t errlen);
