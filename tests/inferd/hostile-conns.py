#!/usr/bin/env python3
"""hostile-conns.py — connection abuse against a kiln-inferd on loopback,
for test-inferd.sh.  Modes (each prints one line and exits 0 when the
server behaved, 1 when not):

  idle PORT N CAP   opens N idle sockets from 127.0.0.1: at most CAP stay
                    open (the rest are refused at once), and meanwhile a
                    request from 127.0.0.2 (another client) is answered.
  dribble PORT S    sends a request line, then nothing: the server must cut
                    the connection within S seconds.
  streams PORT N    N streaming completions at once, each socket closed
                    right after its first SSE event: every one must have
                    got an event (the server then cancels the rest; the
                    suite checks that in /metrics).
"""
import socket
import sys
import time


def held_open(s, wait):
    """True when s is still open after wait seconds (no EOF, no reset)."""
    s.settimeout(wait)
    try:
        return s.recv(1) != b""
    except socket.timeout:
        return True
    except OSError:
        return False


def idle(port, n, cap):
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        socks.append(s)
    time.sleep(0.5)
    t0 = time.monotonic()
    opened = sum(held_open(s, 0.05) for s in socks)
    c = socket.socket()
    c.bind(("127.0.0.2", 0))
    c.settimeout(5)
    c.connect(("127.0.0.1", port))
    c.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    reply = b""
    while True:
        d = c.recv(4096)
        if not d:
            break
        reply += d
    ok = opened <= cap and reply.startswith(b"HTTP/1.1 200")
    status = reply.split(b"\r\n")[0].decode() if reply else "nothing"
    print(f"{n} idle sockets: {opened} held open (cap {cap}); another client got "
          f"{status} in {time.monotonic() - t0:.2f}s")
    for s in socks:
        s.close()
    return ok


def dribble(port, limit):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
    t0 = time.monotonic()
    s.settimeout(limit)
    try:
        while s.recv(4096):  # EOF, or an error reply then EOF
            pass
        cut = True
    except socket.timeout:
        cut = False
    except OSError:
        cut = True
    print(f"a header dribbled and stopped: {'cut' if cut else 'still open'} after "
          f"{time.monotonic() - t0:.1f}s (limit {limit}s)")
    return cut


def streams(port, n):
    body = b'{"model":"m","prompt":[1],"max_tokens":400,"ignore_eos":true,"stream":true}'
    req = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
           b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)) + body
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=60)
        s.sendall(req)
        socks.append(s)
    got = 0
    for s in socks:
        buf = b""
        try:
            while b"data: " not in buf:
                chunk = s.recv(4096)
                if not chunk:
                    break
                buf += chunk
        except OSError:
            pass
        got += b"data: " in buf
        s.close()  # mid-stream: the rest of its 400 tokens has nowhere to go
    print(f"# {got} of {n} streams got an event before their client left")
    return got == n


if __name__ == "__main__":
    mode, port = sys.argv[1], int(sys.argv[2])
    if mode == "idle":
        r = idle(port, int(sys.argv[3]), int(sys.argv[4]))
    elif mode == "streams":
        r = streams(port, int(sys.argv[3]))
    else:
        r = dribble(port, float(sys.argv[3]))
    sys.exit(0 if r else 1)
