#!/usr/bin/env python3
"""hostile-serve.py — connection abuse against a kiln serve on loopback,
for test-serve-hostile.sh.  Every mode prints one line and exits 0 when
the server behaved, 1 when not:

  idle PORT N          N idle sockets, 4 from each of the addresses
                       127.0.2.1.. (so the per-client cap does not refuse
                       them): the server must hold them and still answer
                       a real client from 127.0.0.5 within 2 s.
  dribble PORT S       a request line, then nothing: the server must close
                       the connection within S seconds.
  bigheader PORT KB    one header of KB KiB: a 431 (or a closed
                       connection), never a 200 or a hang.
  parallel PORT PATH N SIZE CRC32
                       N downloads of PATH at once, each from its own
                       address 127.0.1.K (a node each), each SIZE bytes
                       with that CRC-32 (no body is kept in memory):
                       prints the aggregate MB/s.
"""
import socket
import sys
import threading
import time
import zlib


def get(addr, port, path, src=None, timeout=10):
    s = socket.socket()
    if src:
        s.bind((src, 0))
    s.settimeout(timeout)
    s.connect((addr, port))
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    data = b""
    while True:
        d = s.recv(1 << 20)
        if not d:
            break
        data += d
    s.close()
    return data


def idle(port, n):
    socks = []
    for i in range(n):
        s = socket.socket()
        s.bind((f"127.0.2.{i // 4 + 1}", 0))
        s.connect(("127.0.0.1", port))
        socks.append(s)
    time.sleep(0.5)
    t0 = time.monotonic()
    reply = get("127.0.0.1", port, "/kiln/boot.ipxe", src="127.0.0.5", timeout=5)
    dt = time.monotonic() - t0
    # still open: a recv with a short timeout times out rather than EOF
    held = 0
    for s in socks:
        s.settimeout(0.01)
        try:
            held += s.recv(1) != b""
        except socket.timeout:
            held += 1
        except OSError:
            pass
    status = reply.split(b"\r\n")[0].decode() if reply else "nothing"
    print(f"{n} idle sockets from {(n + 3) // 4} addresses: {held} held open; "
          f"another client got {status} in {dt:.3f} s")
    for s in socks:
        s.close()
    return reply.startswith(b"HTTP/1.1 200") and dt < 2.0 and held == n


def dribble(port, limit):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"GET /kiln/vmlinuz HTTP/1.1\r\nHost: x\r\n")
    t0 = time.monotonic()
    s.settimeout(limit + 5)
    try:
        d = s.recv(4096)
    except socket.timeout:
        print(f"a dribbling client still connected after {limit + 5} s")
        return False
    except ConnectionResetError:
        d = b""
    dt = time.monotonic() - t0
    print(f"a dribbling client was cut after {dt:.1f} s (limit {limit} s), got {d[:12]!r}")
    return dt <= limit + 1 and not d.startswith(b"HTTP/1.1 200")


def bigheader(port, kb):
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(10)
    req = b"GET /kiln/vmlinuz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (kb * 1024) + b"\r\n\r\n"
    try:
        s.sendall(req)
    except (BrokenPipeError, ConnectionResetError):
        pass
    try:
        d = s.recv(4096)
    except (socket.timeout, ConnectionResetError):
        d = b""
    status = d.split(b"\r\n")[0].decode() if d else "connection closed"
    print(f"a {kb} KiB header: {status}")
    return not d.startswith(b"HTTP/1.1 200")


def download(port, path, src, timeout):
    """GET path from source address src without keeping the body: returns
    (status line, body bytes, crc32 of the body) or (error, 0, 0)."""
    s = socket.socket()
    s.bind((src, 0))
    s.settimeout(timeout)
    s.connect(("127.0.0.1", port))
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        d = s.recv(65536)
        if not d:
            return (head.split(b"\r\n")[0].decode() or "closed before the headers", 0, 0)
        head += d
    head, _, body = head.partition(b"\r\n\r\n")
    n, crc = len(body), zlib.crc32(body)
    while True:
        d = s.recv(1 << 20)
        if not d:
            break
        n += len(d)
        crc = zlib.crc32(d, crc)
    s.close()
    return (head.split(b"\r\n")[0].decode(), n, crc)


def parallel(port, path, n, size, want_crc):
    results = [None] * n
    start = threading.Barrier(n + 1)

    def one(i):
        start.wait()
        try:
            results[i] = download(port, path, f"127.0.1.{i + 1}", 120)
        except OSError as e:
            results[i] = (f"error: {e}", 0, 0)

    ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    start.wait()
    t0 = time.monotonic()
    for t in ts:
        t.join()
    dt = time.monotonic() - t0
    good = 0
    for i, (status, got, crc) in enumerate(results):
        if status.startswith("HTTP/1.1 200") and got == size and crc == want_crc:
            good += 1
        else:
            print(f"download {i} from 127.0.1.{i + 1}: {status}, {got} bytes")
    mb = n * size / 1e6
    print(f"{n} parallel downloads of {size / 1e6:.0f} MB: {good} complete and intact, "
          f"{mb:.0f} MB in {dt:.2f} s = {mb / dt:.0f} MB/s")
    return good == n


def main():
    mode, port = sys.argv[1], int(sys.argv[2])
    if mode == "idle":
        ok = idle(port, int(sys.argv[3]))
    elif mode == "dribble":
        ok = dribble(port, float(sys.argv[3]))
    elif mode == "bigheader":
        ok = bigheader(port, int(sys.argv[3]))
    elif mode == "parallel":
        ok = parallel(port, sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]))
    else:
        sys.exit(f"unknown mode {mode}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
