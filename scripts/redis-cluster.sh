#!/usr/bin/env bash
# A local Redis Cluster for tests and benchmarks: 3 masters and 3 replicas of Debian's redis-server on loopback
# ports, each started in the foreground (--daemonize no) in the background of this script with its PID recorded,
# joined by `redis-cli --cluster create --cluster-replicas 1`, and ready when every node's `cluster info` says
# `cluster_state:ok`. Persistence is off (no RDB, no AOF): the cluster holds test data only. A replica's full sync
# starts at once (no diskless-sync delay), so a restarted node is a synced replica within a second. DEBUG is allowed
# from loopback (the fault test slows nodes with DEBUG SLEEP).
#
# Usage: scripts/redis-cluster.sh start DIR   starts the cluster with its files in DIR; prints the masters' and
#                                             replicas' addresses (host:port,host:port,...) on stdout and writes
#                                             them to DIR/addresses, and each node's PID to DIR/PORT.pid
#        scripts/redis-cluster.sh stop DIR    stops every node of DIR by its PID, waits for it to exit
#        scripts/redis-cluster.sh restart DIR PORT
#                                             starts node PORT of DIR again (after it was killed) with its own
#                                             cluster config, so it rejoins the cluster (as a replica if its
#                                             replica took over meanwhile); waits until it answers PING
#
# Ports are picked free at random between 20000 and 29999 (a node also uses port+10000 for the cluster bus).
set -euo pipefail

usage() {
  echo "usage: $0 start|stop DIR | restart DIR PORT" >&2
  exit 2
}
[ $# -ge 2 ] || usage
command=$1
dir=$2

free_port() {
  # A port that, with its cluster-bus port (+10000), nothing listens on now.
  python3 - "$@" <<'EOF'
import random, socket, sys
taken = {int(p) for p in sys.argv[1:]}
for _ in range(1000):
    port = random.randint(20000, 29999)
    if port in taken or port + 10000 in taken:
        continue
    try:
        for p in (port, port + 10000):
            with socket.socket() as s:
                s.bind(("127.0.0.1", p))
    except OSError:
        continue
    print(port)
    break
else:
    sys.exit("no free port")
EOF
}

stop() {
  shopt -s nullglob
  for pidfile in "$dir"/*.pid; do
    pid=$(cat "$pidfile")
    if kill -0 "$pid" 2>/dev/null; then
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 100); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.05
      done
      kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$pidfile"
  done
}

start_node() {
  # Node $1 in the foreground (--daemonize no) in the background of this script, its PID in DIR/PORT.pid.
  local port=$1 node=$dir/$1
  mkdir -p "$node"
  redis-server --port "$port" --bind 127.0.0.1 --cluster-enabled yes --cluster-config-file "$node/nodes.conf" \
    --cluster-node-timeout 2000 --dir "$node" --daemonize no --save "" --appendonly no --repl-diskless-sync-delay 0 --enable-debug-command local \
    --logfile "$node/redis.log" </dev/null >/dev/null 2>&1 &
  echo $! >"$dir/$port.pid"
}

wait_ping() {
  for _ in $(seq 200); do
    redis-cli -p "$1" ping >/dev/null 2>&1 && return 0
    sleep 0.05
  done
  return 1
}

case "$command" in
  start)
    command -v redis-server >/dev/null || { echo "redis-cluster: redis-server is not installed (apt-get install redis-server)" >&2; exit 1; }
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    ports=()
    for _ in 1 2 3 4 5 6; do
      ports+=("$(free_port "${ports[@]}")")
    done
    for port in "${ports[@]}"; do
      start_node "$port"
    done
    for port in "${ports[@]}"; do
      wait_ping "$port" || { echo "redis-cluster: node $port did not start (see $dir/$port/redis.log)" >&2; stop; exit 1; }
    done
    nodes=()
    for port in "${ports[@]}"; do nodes+=("127.0.0.1:$port"); done
    redis-cli --cluster create "${nodes[@]}" --cluster-replicas 1 --cluster-yes >"$dir/create.log" 2>&1 ||
      { echo "redis-cluster: cluster create failed:" >&2; cat "$dir/create.log" >&2; stop; exit 1; }
    # Every node must see the whole cluster as ok (slots assigned, every master reachable) and know all 6 nodes.
    for port in "${ports[@]}"; do
      for _ in $(seq 400); do
        info=$(redis-cli -p "$port" cluster info 2>/dev/null || true)
        if grep -q 'cluster_state:ok' <<<"$info" && grep -q 'cluster_known_nodes:6' <<<"$info"; then
          break
        fi
        sleep 0.05
      done
      grep -q 'cluster_state:ok' <<<"$info" || { echo "redis-cluster: node $port never reported cluster_state:ok" >&2; stop; exit 1; }
    done
    # Every master must have its replica attached and synced before a test kills one of those. A node that
    # `--cluster create` makes a replica is a master without slots for a moment after the create returns (it turns
    # into a replica once the cluster is ok), so count: 3 replicas with their link up, 3 masters with a replica each.
    synced=""
    for _ in $(seq 400); do
      replicas=0 masters=0
      for port in "${ports[@]}"; do
        role=$(redis-cli -p "$port" info replication 2>/dev/null || true)
        if grep -q 'role:slave' <<<"$role" && grep -q 'master_link_status:up' <<<"$role"; then
          replicas=$((replicas + 1))
        elif grep -q 'role:master' <<<"$role" && grep -q 'connected_slaves:1' <<<"$role"; then
          masters=$((masters + 1))
        fi
      done
      # ... and every node's view of the cluster says so (a failover needs the masters to know the replica).
      views=0
      for port in "${ports[@]}"; do
        [ "$(redis-cli -p "$port" cluster nodes 2>/dev/null | awk '$3 ~ /slave/' | wc -l)" -eq 3 ] && views=$((views + 1))
      done
      if [ "$replicas" -eq 3 ] && [ "$masters" -eq 3 ] && [ "$views" -eq 6 ]; then
        synced=yes
        break
      fi
      sleep 0.05
    done
    [ -n "$synced" ] || { echo "redis-cluster: the replicas did not all sync with their masters (see $dir/*/redis.log)" >&2; stop; exit 1; }
    (IFS=,; echo "${nodes[*]}") | tee "$dir/addresses"
    ;;
  stop)
    [ -d "$dir" ] || exit 0
    stop
    ;;
  restart)
    [ $# -eq 3 ] || usage
    port=$3
    [ -f "$dir/$port/nodes.conf" ] || { echo "redis-cluster: $dir has no node $port" >&2; exit 1; }
    if [ -f "$dir/$port.pid" ] && kill -0 "$(cat "$dir/$port.pid")" 2>/dev/null; then
      echo "redis-cluster: node $port is running" >&2
      exit 1
    fi
    dir=$(cd "$dir" && pwd)
    start_node "$port"
    wait_ping "$port" || { echo "redis-cluster: node $port did not start again (see $dir/$port/redis.log)" >&2; exit 1; }
    ;;
  *)
    usage
    ;;
esac
