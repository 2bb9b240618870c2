#!/usr/bin/env bash
# SIGTERM under load, measured: serves the demo repository (scripts/run-demo.sh's models, release build), finds
# its closed-loop saturation with recload, drives it open loop at FRACTION of that, sends SIGTERM in the middle of
# the run, and prints what became of every request: those sent before the signal (answered, or lost: the
# connection broke or no answer came), those sent after it (answered 200 or 503, or refused: the connection was
# refused, or an open one closed unanswered), when readiness turned false (a client polling /health/ready on a keep-alive connection every
# 10 ms), and how long the process took to exit against --shutdown-timeout-s. Exits 1 when a request sent before
# the signal was lost or the process did not exit 0 within the timeout.
#
# Usage: scripts/sigterm-under-load.sh            (about a minute)
# Environment: MODEL [deepfm] FRACTION [0.7] RATE [FRACTION × saturation] DURATION [10s, SIGTERM half-way]
#   WARMUP [2s] SHUTDOWN_TIMEOUT_S [30] CONNECTIONS [64] RECSERVE_BIN, RECLOAD_BIN [target/release/...; set both
#   to skip the build] SERVER_FLAGS [more `recserve serve` flags]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

MODEL=${MODEL:-deepfm}
FRACTION=${FRACTION:-0.7}
DURATION=${DURATION:-10s}
WARMUP=${WARMUP:-2s}
SHUTDOWN_TIMEOUT_S=${SHUTDOWN_TIMEOUT_S:-30}
CONNECTIONS=${CONNECTIONS:-64}
results=$root/target/sigterm-under-load

log() { echo "sigterm-under-load: $*" >&2; }
die() { echo "sigterm-under-load: error: $*" >&2; exit 1; }
# Seconds in a recload duration: 2s, 500ms.
seconds() { python -c 'import sys; d = sys.argv[1]; print(float(d[:-2]) / 1000 if d.endswith("ms") else float(d.rstrip("s")))' "$1"; }

scripts/setup.sh
# shellcheck source=env.sh
source scripts/env.sh
if [ -z "${RECSERVE_BIN:-}" ] || [ -z "${RECLOAD_BIN:-}" ]; then
  log "building recserve and recload (release)"
  cargo build --release --quiet -p recserve -p recload --bins
fi
recserve_bin=${RECSERVE_BIN:-$root/target/release/recserve}
recload_bin=${RECLOAD_BIN:-$root/target/release/recload}
rm -rf "$results"
mkdir -p "$results"

# shellcheck source=lib/server-process.sh
source scripts/lib/server-process.sh
# recload on CPU 0, the server on the others.
cpu_layout rest
port=$(free_port)
url=http://127.0.0.1:$port
# shellcheck disable=SC2086
start_server "$results/server.log" "$url/health/ready" "$recserve_bin" serve --repository models/demo \
  --http-addr "127.0.0.1:$port" --grpc-addr "127.0.0.1:$(free_port)" --shutdown-timeout-s "$SHUTDOWN_TIMEOUT_S" \
  ${SERVER_FLAGS:-}

recload() { "${on_client[@]}" "$recload_bin" run --url "$url" --model "$MODEL" --quiet "$@"; }
if [ -z "${RATE:-}" ]; then
  log "saturation: closed loop, $CONNECTIONS connections, 5 s"
  recload --closed --concurrency "$CONNECTIONS" --warmup 1s --duration 5s --json "$results/saturation.json" \
    > /dev/null
  saturation=$(python -c 'import json, sys; print(round(json.load(open(sys.argv[1]))["achieved_rps"]))' \
    "$results/saturation.json")
  RATE=$(python -c "print(round($saturation * $FRACTION))")
  # Let the saturation run's backlog drain: the run below starts its clock at once (no settling).
  sleep 2
else
  saturation=""
fi

# Readiness, seen by a client that keeps one connection open and asks every 10 ms.
python - "$port" > "$results/readiness.csv" <<'PY' &
import http.client, sys, time
port = int(sys.argv[1])
conn = None
end = time.time() + 600
while time.time() < end:
    try:
        if conn is None:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/health/ready")
        response = conn.getresponse()
        response.read()
        print(f"{time.time_ns()},{response.status}", flush=True)
        if response.getheader("connection", "").lower() == "close":
            conn.close()
            conn = None
    except OSError as e:
        print(f"{time.time_ns()},{type(e).__name__}", flush=True)
        conn = None
        if isinstance(e, ConnectionRefusedError):
            break
    time.sleep(0.01)
PY
poller=$!

log "open loop at $RATE/s (saturation ${saturation:-not measured}) on $CONNECTIONS connections; SIGTERM half-way through $DURATION"
recload --rate "$RATE" --connections "$CONNECTIONS" --warmup "$WARMUP" --duration "$DURATION" --timeout 5s \
  --settle-timeout 0s --log-requests "$results/requests.csv" --json "$results/run.json" > "$results/run.txt" &
loader=$!
sleep "$(python -c "print($(seconds "$WARMUP") + $(seconds "$DURATION") / 2)")"
signal_ns=$(date +%s%N)
kill -TERM "$server_pid"
status=0
wait "$server_pid" || status=$?
exit_ns=$(date +%s%N)
server_pid=""
wait "$loader" || true
wait "$poller" || true

python - "$results" "$signal_ns" "$exit_ns" "$status" "$SHUTDOWN_TIMEOUT_S" "$RATE" "${saturation:-}" <<'PY'
import csv, sys
results, signal_ns, exit_ns, status, timeout_s, rate, saturation = sys.argv[1:]
signal_ns, exit_ns, status, timeout_s = int(signal_ns), int(exit_ns), int(status), int(timeout_s)
before = {"answered": 0, "answered_503": 0, "lost": 0}
after = {"answered_200": 0, "answered_503": 0, "answered_other": 0, "connect_refused": 0, "closed_unanswered": 0,
         "timed_out": 0}
not_sent = 0
with open(f"{results}/requests.csv") as f:
    for row in csv.DictReader(f):
        outcome = row["outcome"]
        if not row["sent_unix_ns"]:
            not_sent += 1
            continue
        answered = outcome == "ok" or outcome.startswith("http_")
        if int(row["sent_unix_ns"]) < signal_ns:
            if answered:
                before["answered"] += 1
                before["answered_503"] += outcome == "http_503"
            else:
                before["lost"] += 1
        elif outcome == "ok":
            after["answered_200"] += 1
        elif outcome == "http_503":
            after["answered_503"] += 1
        elif answered:
            after["answered_other"] += 1
        elif outcome == "connect":
            after["connect_refused"] += 1
        elif outcome == "connection":
            after["closed_unanswered"] += 1
        else:
            after["timed_out"] += 1
ready_false = None
with open(f"{results}/readiness.csv") as f:
    for line in f:
        at, what = line.strip().split(",")
        if int(at) >= signal_ns and what != "200":
            ready_false = (int(at) - signal_ns) / 1e6, what
            break
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(f"CPU: {cpu}; open loop at {rate}/s" + (f" ({float(rate) / float(saturation):.0%} of the closed-loop saturation, {saturation}/s)" if saturation else ""))
print(f"sent before SIGTERM: {before['answered'] + before['lost']}: answered {before['answered']} "
      f"(of which 503: {before['answered_503']}), lost {before['lost']}")
print(f"sent after SIGTERM:  {sum(after.values())}: answered 200 {after['answered_200']}, answered 503 "
      f"{after['answered_503']}, other answers {after['answered_other']}; refused: connection refused "
      f"{after['connect_refused']}, closed unanswered {after['closed_unanswered']}; timed out {after['timed_out']}")
if not_sent:
    print(f"never sent (every connection busy past --timeout): {not_sent}")
if ready_false:
    print(f"readiness false {ready_false[0]:.1f} ms after SIGTERM (first answer: {ready_false[1]})")
else:
    print("readiness: no poll after SIGTERM")
took = (exit_ns - signal_ns) / 1e9
print(f"exit status {status}, {took:.2f} s after SIGTERM (--shutdown-timeout-s {timeout_s})")
ok = before["lost"] == 0 and status == 0 and took < timeout_s
print("PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
PY
