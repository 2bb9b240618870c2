# shellcheck shell=bash
# Sourced by the benchmark scripts (scripts/bench-batching.sh, loadtest/peers/run.sh): a free local port, and one
# background server process at a time in $server_pid, stopped on exit.

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
