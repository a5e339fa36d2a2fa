/* check-accounting.c — the accounting section across keys, and the node
 * services of logging and time (kiln_cfg__check_logging, at the end).
 *
 * Accounting is on exactly when storage_host names the database server;
 * then slurmdbd needs the database password, which the cluster file only
 * points at (storage_password_file: the file is published to every node,
 * the password must not be).  Keys set while accounting is off are a
 * warning: the admin meant something that will not happen.  dbd_host
 * defaults to the head node, where slurmctld runs. */
#include <stdlib.h>
#include <string.h>

#include "config-internal.h"

void kiln_cfg__check_accounting(loader *L)
{
	kiln_cfg_accounting *a = &L->cfg->accounting;
	static const char *const words[] = { "accounting.storage_host", "accounting.storage_user",
					     "accounting.storage_loc", "accounting.dbd_host" };
	for (size_t i = 0; i < ARRAY_SIZE(words); i++)
		if (*(char **) kiln_cfg__field(kiln_cfg__find_key(words[i]), L->cfg))
			kiln_cfg__check_root_word(L, words[i], ".-_");
	if (!a->storage_host) {
		static const char *const only[] = { "accounting.storage_password_file",
						    "accounting.dbd_host" };
		for (size_t i = 0; i < ARRAY_SIZE(only); i++)
			if (*(char **) kiln_cfg__field(kiln_cfg__find_key(only[i]), L->cfg))
				kiln_cfg__add_warning(
					L, kiln_cfg__root_line(L, only[i]), only[i],
					"set accounting.storage_host to the database server",
					"no accounting.storage_host: accounting is off and this "
					"is unused");
		return;
	}
	if (!a->storage_password_file)
		kiln_cfg__root_error(
			L, "accounting.storage_host",
			"put the database password in a file (mode 0600) on the head node "
			"and set accounting.storage_password_file to it",
			"accounting needs accounting.storage_password_file (the password "
			"is never written in the cluster file)");
	if (!a->dbd_host && L->cfg->head.hostname && !(a->dbd_host = strdup(L->cfg->head.hostname)))
		L->oom = 1;
}

/* logging.url: a URL systemd-journal-upload takes; time.servers: host
 * names or addresses (one word each: timesyncd.conf splits on spaces). */
void kiln_cfg__check_logging(loader *L)
{
	const char *u = L->cfg->logging.url;
	if (u && strncmp(u, "http://", 7) != 0 && strncmp(u, "https://", 8) != 0)
		kiln_cfg__root_error(
			L, "logging.url",
			"systemd-journal-remote listens on http://HOST:19532 (or https://)",
			"\"%s\" is not an http:// or https:// URL", u);
	if (u && strpbrk(u, " \t\"'"))
		kiln_cfg__root_error(L, "logging.url", NULL, "\"%s\" holds a space or a quote", u);
	for (size_t i = 0; L->cfg->time.servers && L->cfg->time.servers[i]; i++)
		kiln_cfg__check_word(L, kiln_cfg__root_line(L, "time.servers"), "time.servers",
				     L->cfg->time.servers[i], ".-:");
}
