# shellcheck shell=bash
# shellcheck disable=SC2034  # client_cpus, server_cores, on_client, on_server: set for the scripts that source this
# Sourced by the benchmark scripts: the shell side of scripts/lib/bench.py. Where the load generator and the server
# run (cpu_layout, pin), a free local port, one background server process at a time in $server_pid (started
# pinned, waited for until ready, stopped by PID on exit), and the server's /metrics and resident memory.

_bench_py="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/bench.py"

free_port() { python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# The command prefix that runs a command on the CPUs in CPUS (a taskset list) into pinned; empty when CPUS is.
pin_prefix() { # CPUS
  pinned=()
  [ -z "$1" ] || pinned=(taskset -c "$1")
}

# Runs COMMAND on the CPUs in CPUS, or unpinned when CPUS is empty.
pin() { # CPUS COMMAND...
  pin_prefix "$1"
  shift
  "${pinned[@]}" "$@"
}

# Where the load generator and the server run: client_cpus and server_cpus (taskset lists, empty: not pinned),
# server_cores, and the prefixes on_client and on_server ("${on_client[@]}" recload ...). LAYOUT:
#   one    the load generator on CPU 0, the server on CPU 1 (fails with fewer than 2 CPUs)
#   rest   the load generator on CPU 0, the server on every other CPU; nothing pinned on one CPU
#   none   nothing pinned: the server sized to every CPU, sharing them with the load generator (the default)
cpu_layout() { # LAYOUT
  local cpus
  cpus=$(nproc)
  client_cpus=""; server_cpus=""; server_cores=$cpus
  case $1 in
    none) ;;
    one | rest)
      if [ "$cpus" -lt 2 ] && [ "$1" = one ]; then
        echo "needs 2 CPUs: the load generator on CPU 0, the server on CPU 1" >&2
        return 1
      elif [ "$cpus" -ge 2 ]; then
        client_cpus=0; server_cpus=1; server_cores=1
        if [ "$1" = rest ] && [ "$cpus" -gt 2 ]; then server_cpus="1-$((cpus - 1))"; server_cores=$((cpus - 1)); fi
      fi ;;
    *) echo "cpu_layout: one, rest or none, not $1" >&2; return 2 ;;
  esac
  pin_prefix "$client_cpus"; on_client=("${pinned[@]}")
  pin_prefix "$server_cpus"; on_server=("${pinned[@]}")
}
cpu_layout none

server_pid=""
stop_server() {
  if [ -n "$server_pid" ]; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    server_pid=""
  fi
}
trap stop_server EXIT

# Polls URL until it answers 2xx (120 s at most); fails, with the end of LOG, if $server_pid exits first. An
# https:// URL is trusted through the CA certificate in $ready_cafile.
ready_cafile=""
wait_ready() { # URL LOG
  python "$_bench_py" wait-ready "$1" "$server_pid" "$2" ${ready_cafile:+--cafile "$ready_cafile"}
}

# Starts COMMAND in the background on the server's CPUs, its output in LOG, sets server_pid (the server's own: the
# prefix execs it), and waits until READY-URL answers 2xx. Environment for the server only: COMMAND = env VAR=...
start_server() { # LOG READY-URL COMMAND...
  local log=$1 ready=$2
  shift 2
  "${on_server[@]}" "$@" > "$log" 2>&1 &
  server_pid=$!
  wait_ready "$ready" "$log"
}

# The server's /metrics into OUT (fails when it does not answer).
scrape() { # URL OUT
  python "$_bench_py" scrape "$1" "$2"
}

# The server's resident memory in MiB now.
server_rss_mib() { python "$_bench_py" rss --mib "$server_pid"; }

# One top-level field of a JSON report (e.g. achieved_rps).
json_field() { # FILE KEY
  python "$_bench_py" json "$1" "$2"
}
