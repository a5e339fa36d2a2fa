/* sse.c — Server-Sent Events, OpenAI's streaming format, on kiln/http.h's
 * byte streams.
 *
 * common/http.c streams bytes (backpressure, cancel, the shutdown flush)
 * and knows nothing of their format; this file frames them: each event is
 * "data: <line>\n" per line of its text and a blank line, a stream that
 * finishes ends with "data: [DONE]", and one cut by the server's stop ends
 * with OpenAI's error shape and "[DONE]" (inferd_sse_shutdown, which
 * main.c hands to the server as its shutdown bytes). */
#include <errno.h>
#include <string.h>

#include "inferd.h"
#include "kiln/strbuf.h"

#define SSE_DONE "data: [DONE]\n\n"

/* What a stream cut by SIGTERM ends with: OpenAI's error shape, which the
 * openai client raises as an APIError mid-stream, rather than a silent end
 * with finish_reason null, then [DONE]. */
const char inferd_sse_shutdown[] =
	"data: {\"error\":{\"message\":\"kiln-inferd is shutting down; this stream was cut "
	"short. Retry the request.\",\"type\":\"server_error\",\"param\":null,\"code\":"
	"\"server_shutdown\"}}\n\n" SSE_DONE;

int inferd_sse_event(kiln_strbuf *b, const char *data)
{
	const char *p = data;
	for (;;) {
		size_t n = strcspn(p, "\n");
		kiln_strbuf_append(b, "data: ");
		kiln_strbuf_append_n(b, p, n);
		kiln_strbuf_append(b, "\n");
		if (!p[n])
			break;
		p += n + 1;
	}
	return kiln_strbuf_append(b, "\n");
}

int inferd_sse_reply(kiln_http_request *r, kiln_http_cancel_fn on_cancel, void *userdata,
		     kiln_http_stream **ret)
{
	return kiln_http_reply_stream(r, "text/event-stream", on_cancel, userdata, ret);
}

int inferd_sse_send(kiln_http_stream *s, const char *data, int timeout_ms)
{
	assert_return(s && data, -EINVAL);
	_cleanup_(kiln_strbuf_freep) kiln_strbuf b;
	kiln_strbuf_init(&b);
	if (inferd_sse_event(&b, data) < 0)
		return -ENOMEM;
	return kiln_http_stream_write(s, b.s, b.len, timeout_ms);
}

int inferd_sse_send_json(kiln_http_stream *s, const json_t *event, int timeout_ms)
{
	assert_return(s && event, -EINVAL);
	_cleanup_free_ char *txt = json_dumps(event, JSON_COMPACT | JSON_ENCODE_ANY);
	if (!txt)
		return -ENOMEM;
	return inferd_sse_send(s, txt, timeout_ms);
}

int inferd_sse_close(kiln_http_stream *s, bool done)
{
	return done ? kiln_http_stream_close(s, SSE_DONE, strlen(SSE_DONE))
		    : kiln_http_stream_close(s, NULL, 0);
}
