/* test-pathtrust.c — kiln_path_trusted() on real files: a root-owned file
 * in root-only directories is trusted; a file owned by nobody, a file or
 * directory its group or every user may write, a link owned by nobody, a
 * missing file in a directory every user may write, and a link loop are
 * refused with a message naming the component; absolute links inside a
 * --root tree resolve inside it.  Needs root (chown to nobody): skipped
 * otherwise. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kiln/macro.h"
#include "kiln/pathtrust.h"

#define NOBODY 65534

static char top[64]; /* a root-owned 0755 directory in /tmp */

static void mk(const char *rel, mode_t mode, uid_t uid)
{
	char p[PATH_MAX];
	snprintf(p, sizeof(p), "%s/%s", top, rel);
	if (rel[strlen(rel) - 1] == '/') {
		assert_int_equal(mkdir(p, 0755), 0);
	} else {
		FILE *f = fopen(p, "w");
		assert_non_null(f);
		fputs("x", f);
		fclose(f);
	}
	assert_int_equal(chmod(p, mode), 0);
	assert_int_equal(chown(p, uid, 0), 0);
}

static int check(const char *rel, char *err, size_t errlen)
{
	char p[PATH_MAX];
	snprintf(p, sizeof(p), "%s/%s", top, rel);
	return kiln_path_trusted(NULL, p, 0, err, errlen);
}

static int setup(void **state)
{
	if (geteuid() != 0)
		return 0;
	snprintf(top, sizeof(top), "/tmp/kiln-test-pathtrust.XXXXXX");
	if (!mkdtemp(top) || chmod(top, 0755) < 0)
		return -1;
	return 0;
}

static int teardown(void **state)
{
	if (top[0]) {
		char cmd[128];
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", top);
		return system(cmd) == 0 ? 0 : -1;
	}
	return 0;
}

static void test_trusted(void **state)
{
	if (geteuid() != 0)
		skip();
	char err[512] = "";
	mk("lib/", 0755, 0);
	mk("lib/libnvidia-ml.so.1", 0644, 0);
	assert_int_equal(check("lib/libnvidia-ml.so.1", err, sizeof(err)), KILN_PATH_TRUSTED);
	/* through /tmp (sticky, every user writes it): root's entry in it is safe */
	assert_int_equal(check("lib/./libnvidia-ml.so.1", err, sizeof(err)), KILN_PATH_TRUSTED);
	assert_int_equal(check("lib/../lib/libnvidia-ml.so.1", err, sizeof(err)),
			 KILN_PATH_TRUSTED);
	/* missing, in a root-only directory: only root could create it */
	assert_int_equal(check("lib/missing.so", err, sizeof(err)), KILN_PATH_ABSENT);
	/* a root-owned link (mode 0777, as every link) to a trusted file */
	char p[PATH_MAX];
	snprintf(p, sizeof(p), "%s/lib/libnvidia-ml.so", top);
	assert_int_equal(symlink("libnvidia-ml.so.1", p), 0);
	assert_int_equal(check("lib/libnvidia-ml.so", err, sizeof(err)), KILN_PATH_TRUSTED);
	/* the system's own: /bin/sh (a link chain on merged /usr) */
	assert_int_equal(kiln_path_trusted(NULL, "/bin/sh", 0, err, sizeof(err)),
			 KILN_PATH_TRUSTED);
	/* not absolute */
	assert_int_equal(kiln_path_trusted(NULL, "lib/x.so", 0, err, sizeof(err)), -EINVAL);
}

static void test_owned_by_nobody(void **state)
{
	if (geteuid() != 0)
		skip();
	char err[512] = "";
	mk("nob/", 0755, 0);
	mk("nob/evil.so", 0755, NOBODY); /* the exploit: a .so written by nobody */
	assert_int_equal(check("nob/evil.so", err, sizeof(err)), -EPERM);
	assert_non_null(strstr(err, "evil.so is owned by"));
	assert_non_null(strstr(err, "not root"));
	/* a directory on the way owned by nobody */
	mk("nobdir/", 0755, NOBODY);
	mk("nobdir/ok.so", 0644, 0);
	assert_int_equal(check("nobdir/ok.so", err, sizeof(err)), -EPERM);
	assert_non_null(strstr(err, "directory"));
	assert_non_null(strstr(err, "nobdir is owned by"));
	/* a link owned by nobody in a sticky directory (as /tmp lets users make) */
	char p[PATH_MAX], t[PATH_MAX];
	mk("sticky/", 01777, 0);
	mk("sticky/real.so", 0644, 0);
	snprintf(p, sizeof(p), "%s/sticky/link.so", top);
	snprintf(t, sizeof(t), "%s/sticky/real.so", top);
	assert_int_equal(symlink(t, p), 0);
	assert_int_equal(lchown(p, NOBODY, 0), 0);
	assert_int_equal(check("sticky/link.so", err, sizeof(err)), -EPERM);
	assert_int_equal(check("sticky/real.so", err, sizeof(err)), KILN_PATH_TRUSTED);
	/* a program loading code into itself may own it: owner = its uid */
	char q[PATH_MAX];
	snprintf(q, sizeof(q), "%s/nob/evil.so", top);
	assert_int_equal(kiln_path_trusted(NULL, q, NOBODY, err, sizeof(err)), KILN_PATH_TRUSTED);
	assert_int_equal(kiln_path_trusted(NULL, q, 1234, err, sizeof(err)), -EPERM);
	/* ... but never group- or world-writable, whoever owns it */
	assert_int_equal(chmod(q, 0775), 0);
	assert_int_equal(kiln_path_trusted(NULL, q, NOBODY, err, sizeof(err)), -EPERM);
	assert_non_null(strstr(err, "writable by its group"));
	/* missing in a directory every user may write: anyone could create it */
	assert_int_equal(check("sticky/later.so", err, sizeof(err)), -EPERM);
	assert_non_null(strstr(err, "every user may create it"));
}

static void test_writable(void **state)
{
	if (geteuid() != 0)
		skip();
	char err[512] = "";
	mk("w/", 0755, 0);
	mk("w/g.so", 0664, 0);
	assert_int_equal(check("w/g.so", err, sizeof(err)), -EPERM);
	assert_non_null(strstr(err, "writable by its group"));
	mk("w/o.so", 0646, 0);
	assert_int_equal(check("w/o.so", err, sizeof(err)), -EPERM);
	assert_non_null(strstr(err, "writable by every user"));
	assert_non_null(strstr(err, "chmod go-w"));
	/* a world-writable directory (no sticky bit) above a root-owned file */
	mk("ww/", 0777, 0);
	mk("ww/ok.so", 0644, 0);
	assert_int_equal(check("ww/ok.so", err, sizeof(err)), -EPERM);
	assert_non_null(strstr(err, "directory"));
	/* group-writable directory */
	mk("gw/", 0775, 0);
	mk("gw/ok.so", 0644, 0);
	assert_int_equal(check("gw/ok.so", err, sizeof(err)), -EPERM);
	/* a sticky world-writable directory as the final object */
	mk("st2/", 01777, 0);
	assert_int_equal(check("st2", err, sizeof(err)), -EPERM);
	/* a trusted link to an untrusted target */
	char p[PATH_MAX];
	snprintf(p, sizeof(p), "%s/w/link.so", top);
	assert_int_equal(symlink("o.so", p), 0);
	assert_int_equal(check("w/link.so", err, sizeof(err)), -EPERM);
}

static void test_links_and_root(void **state)
{
	if (geteuid() != 0)
		skip();
	char err[512] = "", p[PATH_MAX], root[PATH_MAX];
	/* a loop */
	mk("loop/", 0755, 0);
	snprintf(p, sizeof(p), "%s/loop/a", top);
	assert_int_equal(symlink("b", p), 0);
	snprintf(p, sizeof(p), "%s/loop/b", top);
	assert_int_equal(symlink("a", p), 0);
	assert_int_equal(check("loop/a", err, sizeof(err)), -ELOOP);
	/* a node tree: /usr/lib/x.so -> /opt/x.so resolves inside the tree */
	mk("node/", 0755, 0);
	mk("node/usr/", 0755, 0);
	mk("node/usr/lib/", 0755, 0);
	mk("node/opt/", 0777, 0); /* the target's directory is world-writable */
	mk("node/opt/x.so", 0644, 0);
	snprintf(p, sizeof(p), "%s/node/usr/lib/x.so", top);
	assert_int_equal(symlink("/opt/x.so", p), 0);
	snprintf(root, sizeof(root), "%s/node", top);
	assert_int_equal(kiln_path_trusted(root, "/usr/lib/x.so", 0, err, sizeof(err)), -EPERM);
	assert_non_null(strstr(err, "/opt"));
	snprintf(p, sizeof(p), "%s/node/opt", top);
	assert_int_equal(chmod(p, 0755), 0);
	assert_int_equal(kiln_path_trusted(root, "/usr/lib/x.so", 0, err, sizeof(err)),
			 KILN_PATH_TRUSTED);
	assert_int_equal(kiln_path_trusted(root, "/usr/lib/none.so", 0, err, sizeof(err)),
			 KILN_PATH_ABSENT);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_trusted),
		cmocka_unit_test(test_owned_by_nobody),
		cmocka_unit_test(test_writable),
		cmocka_unit_test(test_links_and_root),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
