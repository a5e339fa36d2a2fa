/* config-internal.h — what the loader, the schema table and the renderers of
 * libkiln-config share but callers do not see. */
#pragma once

#include "kiln/config.h"

/* Which struct a schema key's offset is relative to. */
enum {
	BASE_NONE,  /* containers and keys stored by hand (addresses, macs) */
	BASE_ROOT,  /* kiln_cfg */
	BASE_GROUP, /* kiln_cfg_group */
	BASE_PART,  /* kiln_cfg_partition */
	BASE_XID,   /* kiln_cfg_xid */
};

const char *const *kiln_cfg__action_names(void);
const char *const *kiln_cfg__quant_names(void);
const char *const *kiln_cfg__state_names(void);
