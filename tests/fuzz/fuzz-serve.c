/* fuzz-serve.c — libFuzzer target for kiln serve's request parsing
 * (config/cli/serve.h): the request path, the Range header and the URL /
 * listen address splits, on bytes straight from the network.
 *
 * The input is split at its first two NUL bytes into a path, a Range
 * header and a URL (missing parts are empty).  Besides no crash, leak or
 * undefined behaviour it checks the invariants the server relies on: a
 * file target is one name that kiln_serve_name_ok() accepts (no '/', no
 * leading '.'), a path that routes anywhere starts with the base and the
 * base is followed by '/'; a satisfiable range lies inside the file and is
 * not empty; a split URL's base has no trailing '/' and fits its buffer.
 * Built by tests/fuzz/build.mk with clang -fsanitize=fuzzer,address,
 * undefined; run by tests/fuzz/fuzz-serve.sh (make test-full). */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "serve.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_route(const char *base, const char *path)
{
	kiln_serve_target t;
	kiln_serve_kind k = kiln_serve_route(base, path, &t);
	if (k != t.kind)
		abort();
	if (k == KILN_SERVE_NONE) {
		if (!t.why)
			abort();
		return;
	}
	size_t bl = strlen(base);
	if (strncmp(path, base, bl) != 0 || path[bl] != '/')
		abort();
	if (k == KILN_SERVE_FILE && (!kiln_serve_name_ok(t.name) || strchr(t.name, '/') ||
				     t.name[0] == '.' || strcmp(t.name, path + bl + 1) != 0))
		abort();
	if (k == KILN_SERVE_SECRET && !kiln_serve_secret_name(t.secret))
		abort();
}

static void check_range(const char *h, uint64_t size)
{
	uint64_t off = 0, len = 0;
	int r = kiln_serve_parse_range(h, size, &off, &len);
	if (r == 1 && (len == 0 || off >= size || len > size - off))
		abort();
	if (r != 1 && r != 0 && r != -ERANGE)
		abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *buf = malloc(size + 3);
	if (!buf)
		return 0;
	memcpy(buf, data, size);
	buf[size] = buf[size + 1] = buf[size + 2] = 0;
	const char *path = buf;
	const char *range = path + strlen(path) + 1;
	if (range > buf + size)
		range = buf + size + 1;
	const char *url = range + strlen(range) + 1;
	if (url > buf + size + 1)
		url = buf + size + 2;

	check_route("/kiln", path);
	check_route("", path);
	check_range(range, 0);
	check_range(range, 1);
	check_range(range, 4194304);
	check_range(range, UINT64_MAX);
	uint8_t mac[6];
	(void) kiln_serve_parse_mac(path, mac);

	char host[KILN_SERVE_HOST_MAX], base[KILN_SERVE_BASE_MAX];
	uint16_t port;
	if (kiln_serve_split_url(url, host, &port, base) == 0) {
		size_t n = strlen(base);
		if (n >= KILN_SERVE_BASE_MAX || (n > 0 && base[n - 1] == '/') || !host[0])
			abort();
		check_route(base, path);
	}
	if (kiln_serve_split_listen(url, host, &port) == 0 && !host[0])
		abort();
	free(buf);
	return 0;
}
