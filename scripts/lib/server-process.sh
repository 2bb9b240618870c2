# shellcheck shell=bash
# Sourced by the benchmark scripts (scripts/bench-batching.sh, scripts/sigterm-under-load.sh, scripts/bench-peers-tail.sh):
# a free local port, one background server process at a time in $server_pid (stopped on exit), and waiting for it
# to be ready.

free_port() { python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

server_pid=""
stop_server() {
  if [ -n "$server_pid" ]; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    server_pid=""
  fi
}
trap stop_server EXIT

# Polls URL until it answers 2xx (120 s at most); fails, with the end of LOG, if $server_pid exits first.
wait_ready() { # URL LOG
  for _ in $(seq 600); do
    if ! kill -0 "$server_pid" 2>/dev/null; then
      tail -20 "$2" >&2
      echo "the server exited before it was ready; log: $2" >&2
      return 1
    fi
    curl -sf -o /dev/null "$1" && return 0
    sleep 0.2
  done
  tail -20 "$2" >&2
  echo "not ready after 120 s: $1; log: $2" >&2
  return 1
}
