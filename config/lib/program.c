/* program.c — the cluster-file lookup every kiln program shares
 * (kiln_cfg_open in kiln/config.h).
 *
 * The rest of libkiln-config never prints; this file is the program edge:
 * kiln, kiln-healthd, kiln-run, kiln-train and kiln-inferd call it instead
 * of each wording "no such file" and "the file has errors" its own way. */
#include <errno.h>
#include <stdio.h>
#include <unistd.h>

#include "kiln/config.h"
#include "kiln/log.h"

int kiln_cfg_open(const char *path, unsigned flags, kiln_cfg **ret)
{
	assert_return(ret, -EINVAL);
	*ret = NULL;
	bool explicit = path || !streq(strempty(getenv(KILN_CFG_ENV)), "");
	if (!path)
		path = kiln_cfg_default_path();
	if ((flags & KILN_CFG_OPEN_OPTIONAL) && !explicit && access(path, F_OK) < 0)
		return 0;

	_cleanup_(kiln_cfg_errors_freep) kiln_cfg_errors errs;
	kiln_cfg_errors_init(&errs);
	int r = kiln_cfg_load(path, ret, &errs);
	if (r >= 0 && (flags & KILN_CFG_OPEN_WARNINGS)) {
		kiln_cfg_errors_print(&errs, stderr); /* only warnings on success */
		return (int) errs.n;
	}
	if (r == -EINVAL && errs.n > 0) {
		kiln_cfg_errors_print(&errs, stderr);
		if (!(flags & KILN_CFG_OPEN_NO_HINT))
			log_error("%s has errors (listed above); fix them and check with 'kiln "
				  "check -c %s'.",
				  path, path);
		return -EINVAL;
	}
	if (r == -ENOENT) {
		log_error("Cluster file '%s' does not exist; pass -c FILE or set $" KILN_CFG_ENV
			  ".",
			  path);
		return -EINVAL;
	}
	if (r == -EFBIG) {
		log_error("Cluster file '%s' is larger than %u MiB; is it the right file?", path,
			  KILN_CFG_FILE_MAX / (1024u * 1024u));
		return -EINVAL;
	}
	if (r == -ENOMEM)
		return log_error_errno(r, "Out of memory reading cluster file '%s'.", path);
	if (r < 0)
		return log_error_errno(r, "Failed to read cluster file '%s': %m", path);
	return 0;
}
