/* pathtrust.c — the walk behind kiln_path_trusted() (kiln/pathtrust.h):
 * from / down to a file, every directory and the file itself owned by root
 * and writable by nobody else, following symbolic links by hand so that a
 * node's tree under --root resolves its absolute links inside that tree. */
#include <errno.h>
#include <limits.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kiln/error.h"
#include "kiln/macro.h"
#include "kiln/pathtrust.h"


static const char *user_name(uid_t uid, char *buf, size_t len)
{
	struct passwd pw, *res = NULL;
	char tmp[1024];
	if (getpwuid_r(uid, &pw, tmp, sizeof(tmp), &res) == 0 && res)
		snprintf(buf, len, "%s (uid %u)", res->pw_name, (unsigned) uid);
	else
		snprintf(buf, len, "uid %u", (unsigned) uid);
	return buf;
}

/* Is the object st (at shown) one only root can change?  last: the file
 * itself (no sticky exception for it).  0 or -EPERM with err set. */
static int judge(const struct stat *st, const char *shown, bool last, uid_t owner, char *err,
		 size_t errlen)
{
	const char *what = S_ISDIR(st->st_mode) ? "directory" : "file";
	if (st->st_uid != 0 && st->st_uid != owner) {
		char u[96];
		kiln_errbuf_printf(err, errlen,
		       "%s %s is owned by %s, not root: that user can change what root "
		       "runs; chown root: it (and check its contents)",
		       what, shown, user_name(st->st_uid, u, sizeof(u)));
		return -EPERM;
	}
	mode_t w = st->st_mode & (S_IWGRP | S_IWOTH);
	if (!w)
		return 0;
	/* a sticky directory: others cannot replace root's entries in it */
	if (S_ISDIR(st->st_mode) && (st->st_mode & S_ISVTX) && !last)
		return 0;
	kiln_errbuf_printf(err, errlen,
	       "%s %s is writable by %s (mode %04o): any such user can change what "
	       "root runs; chmod go-w it",
	       what, shown, (w & S_IWOTH) ? "every user" : "its group",
	       (unsigned) (st->st_mode & 07777));
	return -EPERM;
}

/* May every user write the directory root+dir (already judged)? */
static bool may_all_write(const char *root, size_t rl, const char *dir)
{
	char full[PATH_MAX * 2];
	struct stat st;
	snprintf(full, sizeof(full), "%.*s%s", (int) rl, root, dir[0] ? dir : "/");
	return lstat(full, &st) == 0 && (st.st_mode & S_IWOTH);
}

int kiln_path_trusted(const char *root, const char *path, uid_t owner, char *err, size_t errlen)
{
	if (!path || path[0] != '/') {
		kiln_errbuf_printf(err, errlen, "'%s' is not an absolute path", path ? path : "(null)");
		return -EINVAL;
	}
	if (!root || streq(root, "/"))
		root = "";
	size_t rl = strlen(root);
	while (rl > 0 && root[rl - 1] == '/')
		rl--;

	/* todo: what is left to walk; cur: the resolved path inside root */
	char todo[PATH_MAX], cur[PATH_MAX], full[PATH_MAX * 2], link[PATH_MAX];
	if (strlen(path) >= sizeof(todo))
		return -ENAMETOOLONG;
	strcpy(todo, path);
	cur[0] = '\0';
	int links = 0;
	bool sticky_parent = false; /* cur is a sticky directory others may write */
	struct stat st;

	snprintf(full, sizeof(full), "%.*s/", (int) rl, root);
	if (lstat(full, &st) < 0) {
		int r = -errno;
		kiln_errbuf_printf(err, errlen, "cannot stat %s: %s", full, strerror(errno));
		return r;
	}
	int r = judge(&st, "/", false, owner, err, errlen);
	if (r < 0)
		return r;
	sticky_parent = (st.st_mode & S_IWOTH) != 0;

	char *p = todo;
	while (*p) {
		while (*p == '/')
			p++;
		if (!*p)
			break;
		char *e = strchrnul(p, '/');
		size_t cl = (size_t) (e - p);
		if (cl == 1 && p[0] == '.') {
			p = e;
			continue;
		}
		if (cl == 2 && p[0] == '.' && p[1] == '.') {
			char *s = strrchr(cur, '/');
			if (s)
				*s = '\0';
			p = e;
			/* the parent was judged on the way down */
			sticky_parent = may_all_write(root, rl, cur);
			continue;
		}
		size_t ul = strlen(cur);
		if (ul + 1 + cl >= sizeof(cur))
			return -ENAMETOOLONG;
		cur[ul] = '/';
		memcpy(cur + ul + 1, p, cl);
		cur[ul + 1 + cl] = '\0';
		p = e;
		bool last = strspn(p, "/") == strlen(p);
		snprintf(full, sizeof(full), "%.*s%s", (int) rl, root, cur);
		if (lstat(full, &st) < 0) {
			if (errno != ENOENT && errno != ENOTDIR) {
				r = -errno;
				kiln_errbuf_printf(err, errlen, "cannot stat %s: %s", cur, strerror(errno));
				return r;
			}
			if (sticky_parent) {
				kiln_errbuf_printf(err, errlen,
				       "%s does not exist, and every user may create it in "
				       "its directory; use a path under a directory only root can "
				       "write",
				       cur);
				return -EPERM;
			}
			kiln_errbuf_printf(err, errlen, "%s does not exist", cur);
			return KILN_PATH_ABSENT;
		}
		if (S_ISLNK(st.st_mode)) {
			/* the link sits in a directory judged above; its owner must
			 * still be root (a sticky directory lets users make links) */
			if (st.st_uid != 0 && st.st_uid != owner) {
				r = judge(&st, cur, false, owner, err, errlen);
				return r < 0 ? r : -EPERM;
			}
			if (++links > KILN_PATH_TRUST_MAX_LINKS) {
				kiln_errbuf_printf(err, errlen, "more than %d symbolic links on the way to %s",
				       KILN_PATH_TRUST_MAX_LINKS, path);
				return -ELOOP;
			}
			ssize_t n = readlink(full, link, sizeof(link) - 1);
			if (n < 0) {
				r = -errno;
				kiln_errbuf_printf(err, errlen, "cannot read the link %s: %s", cur,
				       strerror(errno));
				return r;
			}
			link[n] = '\0';
			/* the rest of the walk: the target, then what followed */
			char rest[PATH_MAX];
			size_t pl = strlen(p);
			if ((size_t) n + 1 + pl >= sizeof(rest))
				return -ENAMETOOLONG;
			memcpy(rest, link, (size_t) n);
			size_t k = (size_t) n;
			if (pl)
				rest[k++] = '/';
			memcpy(rest + k, p, pl + 1);
			memcpy(todo, rest, k + pl + 1);
			p = todo;
			/* a relative target continues in the link's directory */
			char *s = strrchr(cur, '/');
			if (link[0] == '/')
				cur[0] = '\0';
			else if (s)
				*s = '\0';
			sticky_parent = may_all_write(root, rl, cur);
			continue;
		}
		r = judge(&st, cur, last, owner, err, errlen);
		if (r < 0)
			return r;
		sticky_parent = S_ISDIR(st.st_mode) && (st.st_mode & S_IWOTH);
	}
	return KILN_PATH_TRUSTED;
}
