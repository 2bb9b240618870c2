"""An HTTP/2 client that never reads, against a running recserve: CONNECTIONS h2c connections with
SETTINGS_INITIAL_WINDOW_SIZE = 0, each opening STREAMS large recall requests (8 at a time, each after the previous
ones' response heads), answering pings and never granting a flow-control window. Prints the server's RSS before,
every second while the connections are held, and after they are closed, and whether the server closed them.

Usage: python scripts/h2_slow_reader.py URL PID [--connections 4] [--streams 200] [--hold 30] [--model lightgcn]
       [--k 40981]
Needs the `h2` package (pip install h2); not part of the tests (tests/connections.rs covers the rule).
"""
import argparse
import json
import socket
import threading
import time
from urllib.parse import urlparse

import h2.config
import h2.connection
import h2.events
import h2.settings


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) // 1024
    return -1


def hold(host, port, args, state, index):
    sock = socket.create_connection((host, port))
    conn = h2.connection.H2Connection(config=h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
    sock.sendall(conn.data_to_send())
    body = json.dumps({"user_id": 7, "k": args.k}).encode()
    heads, opened, closed = 0, 0, False
    sock.settimeout(1.0)
    deadline = time.time() + args.hold

    def send():
        try:
            sock.sendall(conn.data_to_send())
            return True
        except OSError:
            return False

    while time.time() < deadline:
        while opened < args.streams and opened - heads < 8:
            sid = conn.get_next_available_stream_id()
            conn.send_headers(sid, [(":method", "POST"), (":path", f"/v1/models/{args.model}/recall"),
                                    (":scheme", "http"), (":authority", host),
                                    ("content-type", "application/json")])
            conn.send_data(sid, body, end_stream=True)
            opened += 1
        if not send():
            closed = True
            break
        try:
            data = sock.recv(65536)
        except socket.timeout:
            continue
        except OSError:
            data = b""
        if not data:
            closed = True
            break
        for event in conn.receive_data(data):
            if isinstance(event, h2.events.ResponseReceived):
                heads += 1
            elif isinstance(event, h2.events.ConnectionTerminated):
                closed = True
        # Pings are acknowledged by the library; no WINDOW_UPDATE is ever sent.
        if not send() or closed:
            closed = True
            break
    state[index] = (heads, closed)
    sock.close()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("pid", type=int)
    p.add_argument("--connections", type=int, default=4)
    p.add_argument("--streams", type=int, default=200)
    p.add_argument("--hold", type=float, default=30)
    p.add_argument("--model", default="lightgcn")
    p.add_argument("--k", type=int, default=40981)
    args = p.parse_args()
    u = urlparse(args.url)
    print(f"RSS before: {rss_mib(args.pid)} MiB")
    state = [None] * args.connections
    threads = [threading.Thread(target=hold, args=(u.hostname, u.port, args, state, i))
               for i in range(args.connections)]
    start = time.time()
    for t in threads:
        t.start()
    peak = 0
    while any(t.is_alive() for t in threads):
        r = rss_mib(args.pid)
        peak = max(peak, r)
        print(f"  t={time.time() - start:5.1f} s RSS {r} MiB")
        time.sleep(1)
    for t in threads:
        t.join()
    heads = sum(s[0] for s in state)
    closed = sum(1 for s in state if s[1])
    print(f"held {time.time() - start:.1f} s: {heads} response heads on {args.connections} connections, "
          f"{closed} closed by the server; peak RSS {peak} MiB")
    time.sleep(5)
    print(f"RSS 5 s after the client left: {rss_mib(args.pid)} MiB")


if __name__ == "__main__":
    main()
