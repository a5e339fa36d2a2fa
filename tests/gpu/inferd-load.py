#!/usr/bin/env python3
"""tests/gpu/inferd-load.py URL OUT.json — one kiln-inferd under test (run.sh's
`inferd` step): a greedy completion's token ids, then N concurrent greedy
requests of M tokens each; prints one line and writes the ids and numbers to
OUT.json.  Standard library only (the GPU machine has no network to fetch
packages).  Exit status 1 when a request fails or returns fewer tokens."""
import http.client
import json
import sys
import threading
import time
import urllib.parse

url, out = sys.argv[1], sys.argv[2]
conc = int(sys.argv[3]) if len(sys.argv) > 3 else 64
ntok = int(sys.argv[4]) if len(sys.argv) > 4 else 128
u = urllib.parse.urlsplit(url)


def complete(prompt, max_tokens):
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=300)
    body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0})
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {data[:300]!r}")
    return json.loads(data)["choices"][0]["token_ids"]


greedy = complete([1], 200)
ok = len(greedy) == 200
results, errors = [None] * conc, []


def worker(i):
    try:
        results[i] = complete([1, 5 + i % 100, 9], ntok)
    except Exception as e:  # noqa: BLE001 - reported below
        errors.append(f"request {i}: {e}")


threads = [threading.Thread(target=worker, args=(i,)) for i in range(conc)]
t0 = time.monotonic()
for t in threads:
    t.start()
for t in threads:
    t.join()
wall = time.monotonic() - t0
got = sum(len(r) for r in results if r)
ok = ok and not errors and got == conc * ntok
print(f"greedy {len(greedy)} ids; {conc} concurrent x {ntok} tokens: {got} tokens in "
      f"{wall:.2f} s = {got / wall:.0f} tok/s{'' if ok else ' FAILED'}")
for e in errors[:5]:
    print(e)
json.dump({"greedy": greedy, "tok_s": got / wall, "wall": wall, "ok": ok,
           "errors": errors}, open(out, "w"))
sys.exit(0 if ok else 1)
