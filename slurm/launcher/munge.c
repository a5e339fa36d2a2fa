/* munge.c — the job secret through MUNGE, for a multi-node job started
 * without KILN_RUN_SECRET.
 *
 * MUNGE (munged on every node, one key for the cluster: Slurm's own
 * authentication) proves who made a credential.  The agent that hosts the
 * store first makes a random secret; every other agent connects, presents a
 * credential it encoded (munged writes its uid and gid into it) whose
 * payload names the job, through the store's token hook; the store host
 * decodes it and accepts only the job's uid, then answers with the secret
 * inside a credential only that uid may decode (MUNGE_OPT_UID_RESTRICTION,
 * payload encrypted with the cluster key).  The agent decodes it and checks
 * that the store host too is the job's uid, so a process of another user
 * squatting the store port cannot hand out a secret of its own.  munged's
 * replay cache makes each credential good for one decode.
 *
 * Nothing here is used when KILN_RUN_SECRET is set or the job has one
 * node. */
#include <errno.h>
#include <munge.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kiln/log.h"
#include "kiln/macro.h"
#include "kiln/store.h"
#include "launcher.h"

/* A context on munged's socket: libmunge's default, or $KILN_RUN_MUNGE_SOCKET
 * where munged listens elsewhere (as Slurm's AuthInfo=socket= allows).
 * NULL when out of memory or the socket cannot be set. */
static munge_ctx_t ctx_new(void)
{
	munge_ctx_t ctx = munge_ctx_create();
	const char *sock = getenv(KR_ENV_MUNGE_SOCKET);
	if (ctx && sock && *sock && munge_ctx_set(ctx, MUNGE_OPT_SOCKET, sock) != EMUNGE_SUCCESS) {
		munge_ctx_destroy(ctx);
		return NULL;
	}
	return ctx;
}

/* What the agents' credentials carry: the job they are for, so that a
 * credential made for anything else (another job of the same user, another
 * program) is refused. */
static void payload_for(const char *job_id, char *buf, size_t len)
{
	snprintf(buf, len, "kiln-run agent of job %s", strna(job_id));
}

int kr_munge_available(char *why, size_t len)
{
	char *cred = NULL;
	munge_ctx_t ctx = ctx_new();
	if (!ctx) {
		snprintf(why, len, "cannot use the socket in $%s", KR_ENV_MUNGE_SOCKET);
		return 0;
	}
	munge_err_t e = munge_encode(&cred, ctx, NULL, 0);
	munge_ctx_destroy(ctx);
	free(cred);
	if (e != EMUNGE_SUCCESS) {
		snprintf(why, len, "%s", munge_strerror(e));
		return 0;
	}
	return 1;
}

int kr_munge_token(const char *job_id, char **ret)
{
	char p[256];
	payload_for(job_id, p, sizeof(p));
	char *cred = NULL;
	munge_ctx_t ctx = ctx_new();
	if (!ctx)
		return -ENOMEM;
	munge_err_t e = munge_encode(&cred, ctx, p, (int) strlen(p));
	munge_ctx_destroy(ctx);
	if (e != EMUNGE_SUCCESS) {
		free(cred);
		log_error("MUNGE could not encode this agent's credential: %s", munge_strerror(e));
		return -EACCES;
	}
	*ret = cred;
	return 0;
}

int kr_munge_check(const void *token, size_t len, void **reply, size_t *reply_len, void *userdata)
{
	const kr_munge_ctx *m = userdata;
	_cleanup_free_ char *cred = strndup(token, len);
	if (!cred || strlen(cred) != len)
		return -EINVAL;
	void *payload = NULL;
	int plen = 0;
	uid_t uid = (uid_t) -1;
	gid_t gid;
	munge_ctx_t dctx = ctx_new();
	if (!dctx)
		return -ENOMEM;
	munge_err_t e = munge_decode(cred, dctx, &payload, &plen, &uid, &gid);
	munge_ctx_destroy(dctx);
	char want[256];
	payload_for(m->job_id, want, sizeof(want));
	bool ok = e == EMUNGE_SUCCESS && uid == geteuid() && plen == (int) strlen(want) &&
		  memcmp(payload, want, (size_t) plen) == 0;
	free(payload);
	if (!ok) {
		if (e != EMUNGE_SUCCESS)
			log_warning("Refused an agent's MUNGE credential: %s", munge_strerror(e));
		else if (uid != geteuid())
			log_warning("Refused an agent's MUNGE credential: made by uid %u, not the "
				    "job's uid %u",
				    (unsigned) uid, (unsigned) geteuid());
		else
			log_warning("Refused a MUNGE credential made for something else than "
				    "this job");
		return -EACCES;
	}
	munge_ctx_t ctx = ctx_new();
	if (!ctx)
		return -ENOMEM;
	char *out = NULL;
	e = munge_ctx_set(ctx, MUNGE_OPT_UID_RESTRICTION, geteuid());
	if (e == EMUNGE_SUCCESS)
		e = munge_encode(&out, ctx, m->secret, (int) strlen(m->secret));
	munge_ctx_destroy(ctx);
	if (e != EMUNGE_SUCCESS) {
		free(out);
		log_warning("MUNGE could not encode the job secret for an agent: %s",
			    munge_strerror(e));
		return -EACCES;
	}
	*reply = out;
	*reply_len = strlen(out);
	return 0;
}

int kr_munge_secret(const char *reply, char *secret, size_t len)
{
	void *payload = NULL;
	int plen = 0;
	uid_t uid = (uid_t) -1;
	gid_t gid;
	munge_ctx_t ctx = ctx_new();
	if (!ctx)
		return -ENOMEM;
	munge_err_t e = munge_decode(reply, ctx, &payload, &plen, &uid, &gid);
	munge_ctx_destroy(ctx);
	int r = 0;
	if (e != EMUNGE_SUCCESS) {
		log_error("The store's answer is not a MUNGE credential this agent can read: %s",
			  munge_strerror(e));
		r = -EACCES;
	} else if (uid != geteuid()) {
		log_error("The store's answer was made by uid %u, not the job's uid %u: something "
			  "else listens on the store port",
			  (unsigned) uid, (unsigned) geteuid());
		r = -EACCES;
	} else if (plen <= 0 || (size_t) plen >= len || plen > (int) KILN_STORE_SECRET_MAX ||
		   memchr(payload, 0, (size_t) plen)) {
		log_error("The store's answer holds no usable job secret");
		r = -EPROTO;
	} else {
		memcpy(secret, payload, (size_t) plen);
		secret[plen] = 0;
	}
	if (payload)
		explicit_bzero(payload, (size_t) MAX(plen, 0));
	free(payload);
	return r;
}
