/* xidstate.c — the XIDs that keep a GPU drained, kept on disk.
 *
 * An XID whose action drains the node (drain, reset, reboot) stays until
 * the GPU is reset or the machine reboots; the daemon may restart before
 * that (crash, upgrade).  Each such XID is written to a small text file
 * under the runtime directory (/run/kiln-healthd/xid.state: survives a
 * service restart, cleared at reboot), one line per GPU and XID:
 *
 *   # kiln-healthd XID state v1: gpu uuid xid action unix-time
 *   1 GPU-00000000-0000-4000-8000-000000000001 79 reboot 1795830000
 *
 * Entries are matched to GPUs by UUID ("-" when NVML gave none: then by
 * index).  Library code: returns -errno, logs nothing. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "healthd.h"

#define HD_XID_STATE_HEADER "# kiln-healthd XID state v1: gpu uuid xid action unix-time\n"
/* HD_XID_STATE_MAX lines of about 75 bytes fit well below this */
#define HD_XID_STATE_FILE_MAX (256 * 1024)

static int action_from_string(const char *s, kiln_cfg_action *ret)
{
	for (int a = 0; a < _KILN_ACTION_MAX; a++)
		if (streq(s, kiln_cfg_action_to_string(a))) {
			*ret = a;
			return 0;
		}
	return -EINVAL;
}

int hd_xid_state_parse(const char *text, hd_xid_state *st, int *ret_line)
{
	_cleanup_free_ hd_xid_state *n = calloc(1, sizeof(*n)); /* large: off the stack */
	int line = 0;
	const char *p = text;
	*ret_line = 0;
	if (!n)
		return -ENOMEM;
	while (p && *p) {
		const char *e = strchr(p, '\n');
		size_t len = e ? (size_t) (e - p) : strlen(p);
		line++;
		char buf[256];
		if (len >= sizeof(buf)) {
			*ret_line = line;
			return -EBADMSG;
		}
		memcpy(buf, p, len);
		buf[len] = 0;
		p = e ? e + 1 : NULL;
		char *s = buf + strspn(buf, " \t");
		if (!*s || *s == '#')
			continue;
		char f[5][96], extra[2];
		int nf = sscanf(s, "%95s %95s %95s %95s %95s %1s", f[0], f[1], f[2], f[3], f[4],
				extra);
		hd_xid_entry x = {};
		int64_t t;
		if (nf != 5 || kiln_parse_int(f[0], 0, HD_GPUS_MAX - 1, &x.gpu) < 0 ||
		    strlen(f[1]) >= sizeof(x.uuid) || kiln_parse_int(f[2], 0, 65535, &x.xid) < 0 ||
		    action_from_string(f[3], &x.action) < 0 ||
		    kiln_parse_int64(f[4], 0, INT64_MAX, &t) < 0 || n->n >= HD_XID_STATE_MAX) {
			*ret_line = line;
			return -EBADMSG;
		}
		snprintf(x.uuid, sizeof(x.uuid), "%s", streq(f[1], "-") ? "" : f[1]);
		x.time = t;
		n->v[n->n++] = x;
	}
	*st = *n;
	return 0;
}

int hd_xid_state_load(const char *path, hd_xid_state *st, int *ret_line)
{
	_cleanup_free_ char *text = NULL;
	size_t len = 0;
	*ret_line = 0;
	int r = kiln_read_file(path, HD_XID_STATE_FILE_MAX, &text, &len);
	if (r < 0)
		return r;
	if (strlen(text) != len) /* a NUL byte: not text (a torn write on a bad disk) */
		return -EBADMSG;
	return hd_xid_state_parse(text, st, ret_line);
}

int hd_xid_state_format(const hd_xid_state *st, kiln_strbuf *b)
{
	kiln_strbuf_printf(b, "%s", HD_XID_STATE_HEADER);
	for (int i = 0; i < st->n; i++)
		kiln_strbuf_printf(b, "%d %s %d %s %lld\n", st->v[i].gpu,
				   st->v[i].uuid[0] ? st->v[i].uuid : "-", st->v[i].xid,
				   kiln_cfg_action_to_string(st->v[i].action),
				   (long long) st->v[i].time);
	return kiln_strbuf_error(b);
}

int hd_xid_state_save(const char *path, const hd_xid_state *st)
{
	_cleanup_strbuf_ kiln_strbuf b;
	kiln_strbuf_init(&b);
	int r = hd_xid_state_format(st, &b);
	if (r < 0)
		return r;
	return kiln_write_file_atomic(path, b.s, b.len, 0644);
}

static bool entry_is(const hd_xid_entry *x, int gpu, const char *uuid)
{
	return uuid && uuid[0] && x->uuid[0] ? streq(x->uuid, uuid) : x->gpu == gpu;
}

bool hd_xid_state_add(hd_xid_state *st, int gpu, const char *uuid, int xid, kiln_cfg_action action,
		      int64_t time)
{
	for (int i = 0; i < st->n; i++)
		if (st->v[i].xid == xid && entry_is(&st->v[i], gpu, uuid))
			return false;
	if (st->n >= HD_XID_STATE_MAX)
		return false;
	hd_xid_entry *x = &st->v[st->n++];
	*x = (hd_xid_entry){ .gpu = gpu, .xid = xid, .action = action, .time = time };
	snprintf(x->uuid, sizeof(x->uuid), "%s", strempty(uuid));
	return true;
}

int hd_xid_state_clear(hd_xid_state *st, const char *which)
{
	int gpu = -1, removed = 0, k = 0;
	bool all = streq(which, "all");
	if (!all &&
	    kiln_parse_int(startswith(which, "gpu") ?: which, 0, HD_GPUS_MAX - 1, &gpu) < 0 &&
	    !startswith(which, "GPU-") && !startswith(which, "MIG-"))
		return -EINVAL;
	for (int i = 0; i < st->n; i++) {
		const hd_xid_entry *x = &st->v[i];
		bool hit = all || (gpu >= 0 ? x->gpu == gpu : streq(x->uuid, which));
		if (hit)
			removed++;
		else
			st->v[k++] = *x;
	}
	st->n = k;
	return removed;
}

void hd_xid_state_apply(const hd_xid_state *st, hd_node *n)
{
	for (int i = 0; i < n->n_gpus; i++)
		n->gpus[i].sticky.n = 0;
	for (int k = 0; k < st->n; k++) {
		const hd_xid_entry *x = &st->v[k];
		int gi = hd_xid_state_find_gpu(x, n);
		if (gi >= 0)
			hd_gpu_add_sticky_xid(&n->gpus[gi], x->xid, x->action);
	}
}

int hd_xid_state_find_gpu(const hd_xid_entry *x, const hd_node *n)
{
	for (int i = 0; i < n->n_gpus; i++) {
		const hd_sample *s = &n->gpus[i].cur;
		if (x->uuid[0] ? streq(s->uuid, x->uuid) : (i == x->gpu && s->present))
			return i;
	}
	return -1;
}
