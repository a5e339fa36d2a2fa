#!/usr/bin/python3
"""test-openai-client.py — conformance of kiln-inferd with the official
`openai` Python package (the pinned version mk/deps.sh installs), run by
test-openai-client.sh.

One kiln-inferd on 127.0.0.1 (an ephemeral port) with the tiny260K
fixture and the 512-token tok512 tokenizer; the client drives it as any
application would: completions and chat completions, streamed and not,
models.list / models.retrieve, and the errors the client must raise as its
own classes (BadRequestError, NotFoundError, RateLimitError,
AuthenticationError when the server has API keys), then a stream cut by
SIGTERM, which the client must raise instead of ending quietly.  Prints TAP.

    test-openai-client.py BIN MODEL TOKENIZER
"""
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

try:
    import openai
except ImportError:
    print("1..1")
    print("ok 1 # SKIP the openai package is not installed (make deps)")
    sys.exit(0)

N = 0
FAILED = 0


def ok(desc, cond, diag=None):
    global N, FAILED
    N += 1
    if cond:
        print(f"ok {N} - {desc}")
    else:
        FAILED += 1
        print(f"not ok {N} - {desc}")
        if diag is not None:
            for line in str(diag).splitlines()[:8]:
                print(f"# {line}")
    sys.stdout.flush()


def skip(reason):
    global N
    N += 1
    print(f"ok {N} # SKIP {reason}")


def raises(cls, fn):
    """(True, exc) when fn() raises exactly the class cls (or a subclass)."""
    try:
        fn()
    except cls as e:  # noqa: PERF203
        return True, e
    except Exception as e:  # noqa: BLE001
        return False, f"{type(e).__name__}: {e}"
    return False, "no exception"


def main():
    binary, model, tok = sys.argv[1:4]
    work = tempfile.mkdtemp(prefix="kiln-openai-client.")
    log_path = os.path.join(work, "log")
    args = [binary, "-m", model, "--name", "m", "-p", "0", "--tokenizer", tok,
            "--max-running", "2", "--max-waiting", "8", "--drain-grace", "0", "--prefix-caching"]
    key = None
    helptext = subprocess.run([binary, "--help"], capture_output=True, text=True).stdout
    m = re.search(r"--(api-keys?(?:-file)?) ", helptext)
    if m:
        key = "sk-kiln-conformance"
        kf = os.path.join(work, "keys")
        with open(kf, "w") as f:
            f.write(key + "\n")
        os.chmod(kf, 0o600)
        args += ["--" + m.group(1), kf]
    env = dict(os.environ, KK_CPU_THREADS="1", OPENBLAS_NUM_THREADS="1")
    log = open(log_path, "w")
    srv = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
    port = None
    for _ in range(200):
        with open(log_path) as f:
            mm = re.search(r"http://127\.0\.0\.1:(\d+)", f.read())
        if mm:
            port = int(mm.group(1))
            break
        if srv.poll() is not None:
            break
        time.sleep(0.05)
    ok("kiln-inferd starts and logs its port", port is not None, open(log_path).read())
    if port is None:
        srv.kill()
        print(f"1..{N}")
        return 1
    base = f"http://127.0.0.1:{port}/v1"
    c = openai.OpenAI(base_url=base, api_key=key or "unused", max_retries=0, timeout=30)
    diag = print

    # ---- models
    ms = c.models.list()
    ok("models.list: one model, id m, object model",
       [x.id for x in ms.data] == ["m"] and ms.data[0].object == "model", ms)
    mo = c.models.retrieve("m")
    ok("models.retrieve('m'): id m, owned_by set", mo.id == "m" and bool(mo.owned_by), mo)
    good, e = raises(openai.NotFoundError, lambda: c.models.retrieve("nope"))
    ok("models.retrieve('nope') raises NotFoundError (404)",
       good and e.status_code == 404, e)

    # ---- completions
    P = "Once upon a time, there was a kiln"
    r = c.completions.create(model="m", prompt=P, max_tokens=24, temperature=0)
    ch = r.choices[0]
    ok("completions.create: a Completion with text, finish_reason length, usage",
       r.object == "text_completion" and isinstance(ch.text, str) and ch.finish_reason == "length"
       and r.usage.completion_tokens == 24
       and r.usage.total_tokens == r.usage.prompt_tokens + 24, r)
    text = ch.text
    parts = []
    finish = None
    usage = None
    for ev in c.completions.create(model="m", prompt=P, max_tokens=24, temperature=0, stream=True,
                                   stream_options={"include_usage": True}):
        if ev.choices:
            parts.append(ev.choices[0].text)
            finish = ev.choices[0].finish_reason or finish
        if ev.usage:
            usage = ev.usage
    ok("  ... streamed: the chunks join to the same text, finish length, usage chunk",
       "".join(parts) == text and finish == "length" and usage is not None
       and usage.completion_tokens == 24, ("".join(parts), text, finish, usage))
    r = c.completions.create(model="m", prompt=[P, P + " and"], max_tokens=4, temperature=0)
    ok("a batch of two prompts: choices indexed 0, 1",
       [x.index for x in r.choices] == [0, 1], r)

    # ---- chat
    msgs = [{"role": "system", "content": "You are brief."},
            {"role": "user", "content": "Tell me a story."}]
    r = c.chat.completions.create(model="m", messages=msgs, max_tokens=20, temperature=0)
    ch = r.choices[0]
    ok("chat.completions.create: a ChatCompletion, role assistant, content, usage",
       r.object == "chat.completion" and ch.message.role == "assistant"
       and isinstance(ch.message.content, str) and r.usage.completion_tokens >= 1, r)
    content = ch.message.content
    parts = []
    roles = []
    finish = None
    for ev in c.chat.completions.create(model="m", messages=msgs, max_tokens=20, temperature=0,
                                        stream=True):
        for x in ev.choices:
            if x.delta.role:
                roles.append(x.delta.role)
            if x.delta.content:
                parts.append(x.delta.content)
            finish = x.finish_reason or finish
    ok("  ... streamed: role first, deltas join to the same content, a finish_reason",
       roles == ["assistant"] and "".join(parts) == content and finish in ("stop", "length"),
       (roles, "".join(parts), content, finish))
    r = c.chat.completions.create(
        model="m", max_tokens=8, temperature=0,
        messages=[{"role": "developer", "content": "You are brief."},
                  {"role": "user", "content": [{"type": "text", "text": "Tell me a story."}]}])
    ok("the developer role and text content parts are accepted", r.choices[0].message.role == "assistant", r)
    # the neutral values a stock client sends
    r = c.chat.completions.create(model="m", messages=msgs, max_tokens=4, temperature=0, n=1,
                                  presence_penalty=0, frequency_penalty=0, logit_bias={},
                                  logprobs=False, store=False, user="u1", metadata={"a": "b"},
                                  response_format={"type": "text"})
    ok("neutral values of n, penalties, logit_bias, logprobs, store, user, metadata, response_format",
       len(r.choices) == 1, r)

    # ---- logprobs, n, penalties, logit_bias (issue 11's sampling fields)
    r = c.completions.create(model="m", prompt=P, max_tokens=12, temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    ok("completions logprobs=3: tokens, token_logprobs, top_logprobs (3 each), text_offset",
       lp is not None and len(lp.tokens) == 12 and len(lp.token_logprobs) == 12
       and all(len(t) == 3 for t in lp.top_logprobs) and len(lp.text_offset) == 12
       and lp.text_offset == sorted(lp.text_offset)
       and all(x <= 0 for x in lp.token_logprobs), lp)
    ok("  ... greedy: each token's logprob is its top alternative's",
       all(abs(lp.token_logprobs[i] - max(lp.top_logprobs[i].values())) < 1e-6 for i in range(12)), lp)
    toks, lps = [], []
    for ev in c.completions.create(model="m", prompt=P, max_tokens=12, temperature=0, logprobs=3,
                                   stream=True):
        if ev.choices and ev.choices[0].logprobs:
            toks += ev.choices[0].logprobs.tokens
            lps += ev.choices[0].logprobs.token_logprobs
    ok("  ... streamed: the same tokens and logprobs (to 1e-4)",
       toks == lp.tokens and all(abs(a - b) < 1e-4 for a, b in zip(lps, lp.token_logprobs)),
       (toks, lp.tokens))
    # ---- prompt logprobs: echo with logprobs, max_tokens 0 (the way
    # lm-eval-harness's loglikelihood asks: context + continuation as one
    # prompt, the continuation's logprobs and whether each was the greedy one)
    cont = lp.tokens[:6]
    r = c.completions.create(model="m", prompt=P + "".join(cont), max_tokens=0, echo=True,
                             logprobs=1, temperature=0, seed=1234)
    el = r.choices[0].logprobs
    n_prompt = r.usage.prompt_tokens
    ok("echo=True, logprobs=1, max_tokens=0: the prompt's tokens, the first null, nothing generated",
       el is not None and len(el.tokens) == n_prompt and el.token_logprobs[0] is None
       and el.top_logprobs[0] is None and all(x < 0 for x in el.token_logprobs[1:])
       and r.choices[0].text == P + "".join(cont) and r.usage.completion_tokens == 0
       and r.choices[0].finish_reason == "length", r)
    ok("  ... the continuation scored as the generating run scored it (to 1e-4), each greedy",
       el.tokens[-6:] == cont
       and all(abs(a - b) < 1e-4 for a, b in zip(el.token_logprobs[-6:], lp.token_logprobs[:6]))
       and all(max(t.values()) == x for t, x in zip(el.top_logprobs[-6:], el.token_logprobs[-6:])),
       (el.tokens[-6:], el.token_logprobs[-6:], lp.token_logprobs[:6]))
    r = c.completions.create(model="m", prompt=P, max_tokens=4, echo=True, logprobs=2, temperature=0)
    el = r.choices[0].logprobs
    ok("echo=True with 4 tokens generated: the prompt's logprobs, then the completion's",
       len(el.tokens) == r.usage.prompt_tokens + 4 and el.token_logprobs[0] is None
       and r.choices[0].text.startswith(P) and el.text_offset[r.usage.prompt_tokens] == len(P.encode()), el)
    r = c.chat.completions.create(model="m", messages=msgs, max_tokens=10, temperature=0,
                                  logprobs=True, top_logprobs=2)
    cl = r.choices[0].logprobs
    ok("chat logprobs=True, top_logprobs=2: one content entry per token, with bytes and 2 alternatives",
       cl is not None and len(cl.content) == r.usage.completion_tokens
       and all(len(x.top_logprobs) == 2 and isinstance(x.bytes, list) for x in cl.content)
       and all(x.logprob == x.top_logprobs[0].logprob for x in cl.content), cl)
    st = []
    for ev in c.chat.completions.create(model="m", messages=msgs, max_tokens=10, temperature=0,
                                        logprobs=True, top_logprobs=2, stream=True):
        for x in ev.choices:
            if x.logprobs and x.logprobs.content:
                st += [y.token for y in x.logprobs.content]
    ok("  ... streamed: the same tokens", st == [x.token for x in cl.content], st)
    r = c.completions.create(model="m", prompt=P, max_tokens=8, temperature=1, seed=5, n=3)
    ok("n=3: three choices indexed 0..2, usage counts the prompt once and every completion",
       [x.index for x in r.choices] == [0, 1, 2] and r.usage.completion_tokens == 24
       and len({x.text for x in r.choices}) > 1, r)
    r2 = c.completions.create(model="m", prompt=P, max_tokens=8, temperature=1, seed=5, n=3)
    ok("  ... the same seed gives the same three", [x.text for x in r.choices] == [x.text for x in r2.choices])
    r = c.chat.completions.create(model="m", messages=msgs, max_tokens=6, temperature=0, n=2, stream=True)
    got = {}
    for ev in r:
        for x in ev.choices:
            got[x.index] = got.get(x.index, "") + (x.delta.content or "")
    ok("chat n=2 streamed: both choices, greedy so equal", sorted(got) == [0, 1] and got[0] == got[1], got)
    r = c.completions.create(model="m", prompt=P, max_tokens=6, temperature=0, logit_bias={"300": 100})
    ok("logit_bias {300: 100}: every token is 300",
       getattr(r.choices[0], "token_ids", None) == [300] * 6, r.choices[0])
    plain = c.completions.create(model="m", prompt=P, max_tokens=30, temperature=0)
    pen = c.completions.create(model="m", prompt=P, max_tokens=30, temperature=0,
                               presence_penalty=1.5, frequency_penalty=1.5)
    rep = c.completions.create(model="m", prompt=P, max_tokens=30, temperature=0,
                               extra_body={"repetition_penalty": 1.5, "min_tokens": 30})
    def distinct(x):
        return len(set(x.choices[0].token_ids))
    ok("presence/frequency penalties: more distinct tokens than without (%d vs %d)"
       % (distinct(pen), distinct(plain)), distinct(pen) > distinct(plain))
    ok("repetition_penalty (extra_body): output changes, min_tokens 30 gives 30 tokens",
       rep.choices[0].text != plain.choices[0].text and rep.usage.completion_tokens == 30, rep)
    # min_tokens holds off stop strings too (vLLM): the greedy text's first
    # character as a stop string ends it at once, but not before 5 tokens
    st0 = plain.choices[0].text.strip()[:1]
    a = c.completions.create(model="m", prompt=P, max_tokens=30, temperature=0, stop=[st0])
    b = c.completions.create(model="m", prompt=P, max_tokens=30, temperature=0, stop=[st0],
                             extra_body={"min_tokens": 5})
    ok("min_tokens 5 holds off the stop string %r (%d tokens without, %d with)"
       % (st0, a.usage.completion_tokens, b.usage.completion_tokens),
       a.usage.completion_tokens < 5 <= b.usage.completion_tokens)
    good, e = raises(openai.BadRequestError, lambda: c.completions.create(
        model="m", prompt=P, max_tokens=4, logit_bias={"999": 1}))
    ok("logit_bias of a token outside the vocabulary raises BadRequestError naming it",
       good and (e.body or {}).get("param") == "logit_bias.999", e)
    good, e = raises(openai.BadRequestError, lambda: c.chat.completions.create(
        model="m", messages=msgs, max_tokens=4, response_format={"type": "json_object"}))
    ok("response_format json_object raises BadRequestError naming it",
       good and (e.body or {}).get("param") == "response_format.type", e)
    good, e = raises(openai.BadRequestError, lambda: c.chat.completions.create(
        model="m", max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]))
    ok("an image content part raises BadRequestError naming it",
       good and "image_url" in str(e), e)

    # ---- prefix caching: the same long prompt twice (the first finished)
    def metric(name):
        import urllib.request
        rq = urllib.request.Request(f"http://127.0.0.1:{port}/metrics",
                                    headers={"Authorization": f"Bearer {key}"} if key else {})
        body = urllib.request.urlopen(rq, timeout=10).read().decode()
        # kiln's name, or vLLM's (vllm:..., with a model_name label) if
        # the server speaks those instead
        for n in (name, name.replace("kiln_inferd_", "vllm:")):
            m = re.search(r"^" + re.escape(n) + r"(\{[^}]*\})? ([0-9.e+]+)$", body, re.M)
            if m:
                return float(m.group(2))
        return None
    long_p = " ".join([P] * 12)
    h0 = metric("kiln_inferd_prefix_cache_hits_total")
    r1 = c.completions.create(model="m", prompt=long_p, max_tokens=8, temperature=0)
    h1 = metric("kiln_inferd_prefix_cache_hits_total")
    r2 = c.completions.create(model="m", prompt=long_p, max_tokens=8, temperature=0)
    h2 = metric("kiln_inferd_prefix_cache_hits_total")
    ok("prefix caching: a %d-token prompt again hits the finished one's blocks (%s -> %s tokens), same greedy text"
       % (r1.usage.prompt_tokens, h1, h2),
       h0 is not None and h2 - h1 >= r1.usage.prompt_tokens - 16 and r1.choices[0].text == r2.choices[0].text,
       (h0, h1, h2, r1.choices[0].text, r2.choices[0].text))

    # ---- errors the client raises as its own classes
    good, e = raises(openai.BadRequestError, lambda: c.completions.create(
        model="m", prompt=P, max_tokens=4, extra_body={"temperture": 0}))
    ok("an unknown field raises BadRequestError (400) naming it",
       good and e.status_code == 400 and "temperture" in str(e), e)
    good, e = raises(openai.BadRequestError, lambda: c.completions.create(
        model="m", prompt=P, max_tokens=4, temperature=3))
    ok("a bad value raises BadRequestError (400) with param temperature",
       good and (e.body or {}).get("param") == "temperature", e)
    good, e = raises(openai.BadRequestError, lambda: c.chat.completions.create(
        model="m", messages=msgs, max_tokens=4, tools=[{"type": "function", "function": {"name": "f"}}]))
    ok("tools raise BadRequestError naming tools", good and (e.body or {}).get("param") == "tools", e)
    good, e = raises(openai.BadRequestError, lambda: c.completions.create(
        model="m", prompt=P, max_tokens=600))
    ok("prompt + max_tokens over the context raises BadRequestError, code context_length_exceeded",
       good and e.code == "context_length_exceeded", e)
    good, e = raises(openai.BadRequestError, lambda: c.completions.create(
        model="m", prompt=[3] * 600, max_tokens=1))
    ok("a prompt longer than the context raises BadRequestError, code context_length_exceeded",
       good and e.code == "context_length_exceeded", e)
    good, e = raises(openai.NotFoundError, lambda: c.completions.create(
        model="gpt-4", prompt=P, max_tokens=4))
    ok("an unknown model raises NotFoundError (404), code model_not_found",
       good and e.status_code == 404 and e.code == "model_not_found", e)
    good, e = raises(openai.NotFoundError, lambda: c.chat.completions.create(
        model="gpt-4", messages=msgs, max_tokens=4))
    ok("  ... and for chat", good and e.status_code == 404, e)
    # 429: a batch of 12 prompts is 12 engine requests; 2 running + 8
    # waiting is all the engine holds (the first token's callback waits for
    # the handler, so none can finish before the last is submitted).
    good, e = raises(openai.RateLimitError, lambda: c.completions.create(
        model="m", prompt=[[1]] * 12, max_tokens=100))
    ok("a full queue raises RateLimitError (429) with Retry-After",
       good and e.status_code == 429 and e.response.headers.get("retry-after") == "1", e)
    if key:
        bad = openai.OpenAI(base_url=base, api_key="sk-wrong", max_retries=0)
        good, e = raises(openai.AuthenticationError, lambda: bad.models.list())
        ok("a wrong API key raises AuthenticationError (401)", good and e.status_code == 401, e)
    else:
        skip("AuthenticationError: this kiln-inferd has no API key option (--api-key... in --help)")
    # The refused batch's accepted part is cancelled asynchronously: wait
    # until the queue is empty again (at most 10 s) before going on.
    for _ in range(200):
        if metric("kiln_inferd_num_requests_waiting") == 0 and metric("kiln_inferd_num_requests_running") == 0:
            break
        time.sleep(0.05)
    r = c.completions.create(model="m", prompt=P, max_tokens=4, temperature=0)
    ok("the server still answers after the errors", r.usage.completion_tokens == 4, r)

    # ---- a stream cut by shutdown: 8 prompts x 511 tokens on 2 slots run
    # for seconds; SIGTERM (with --drain-grace 0) after the first chunk.
    got = 0
    err = None
    t0 = time.time()
    try:
        for ev in c.completions.create(model="m", prompt=[[1]] * 8, max_tokens=511, stream=True,
                                       extra_body={"ignore_eos": True}):
            got += 1
            if got == 1:
                srv.send_signal(signal.SIGTERM)
    except openai.APIError as ex:
        err = ex
    ok("a stream cut by SIGTERM raises APIError (server_shutdown), not a quiet end",
       err is not None and not isinstance(err, openai.APIConnectionError)
       and err.code == "server_shutdown", f"{got} chunks, {type(err).__name__}: {err}")
    try:
        rc = srv.wait(timeout=10)
    except subprocess.TimeoutExpired:
        srv.kill()
        rc = None
    ok("  ... and the server exits 0", rc == 0, open(log_path).read()[-2000:])
    diag(f"# {got} chunks before the cut; {time.time() - t0:.2f}s from the request to the exit")
    print(f"1..{N}")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
