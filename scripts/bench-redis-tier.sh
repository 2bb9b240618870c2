#!/usr/bin/env bash
# The Redis tier under load, on the realistic benchmark model with capped tables (`synth --preset realistic
# --max-rows MAX_ROWS`, model realistic-int8: fp32 tables, INT8 graph), against a local Redis Cluster of 3 masters + 3 replicas
# (scripts/redis-cluster.sh), recserve on CPU 1 and recload on CPU 0 (the Redis nodes run where the kernel puts
# them), Zipf(1.05) ids (recload's default):
#   (a) cache: the mapped files, then the Redis tier with a row cache of 5% and of 20% of the tables' bytes: the
#       closed-loop saturation throughput, then an open loop at half that saturation: rank-call p50/p99 and the
#       cache's hit ratio over it;
#   (b) updates: on the 20% server, UPDATE_RATE row updates per second (`recserve_models.update.update_rows`,
#       batches of 100 random rows every 10 ms, one Python process) while recload offers half its saturation:
#       the publish-to-visible histogram, entries applied, and the requests' outcome;
#   (c) failover: on the 20% server (every table `unfetched = "default_row"`), an open loop at half its
#       saturation for FAILOVER_S seconds; KILL_AT seconds in, one master is killed by PID: requests answered,
#       failed, ids read from default rows, and the time until its replica said it was the master.
# recload's CPU (user + system ÷ wall) is printed beside every run. Prints the figures; reports in
# target/bench-redis-tier/.
#
# Usage: scripts/bench-redis-tier.sh            (about 5 minutes)
# Environment: MAX_ROWS [50000] DURATION [8s] WARMUP [2s] UPDATE_RATE [10000] FAILOVER_S [20] KILL_AT [6]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

MAX_ROWS=${MAX_ROWS:-50000}
DURATION=${DURATION:-8s}
WARMUP=${WARMUP:-2s}
UPDATE_RATE=${UPDATE_RATE:-10000}
FAILOVER_S=${FAILOVER_S:-20}
KILL_AT=${KILL_AT:-6}
results=$root/target/bench-redis-tier
model=realistic-int8

log() { echo "bench-redis-tier: $*" >&2; }
die() { echo "bench-redis-tier: error: $*" >&2; exit 1; }

# shellcheck source=env.sh
source scripts/env.sh
[ "$(nproc)" -ge 2 ] || die "needs 2 CPUs: recload on CPU 0, recserve on CPU 1"
command -v redis-server >/dev/null || die "redis-server is not installed (apt-get install redis-server)"
rm -rf "$results"
mkdir -p "$results"

log "building recserve and recload (release)"
cargo build --release --quiet -p recserve -p recload --bins
recserve_bin=$root/target/release/recserve
recload_bin=$root/target/release/recload

log "writing the model (synth --preset realistic --max-rows $MAX_ROWS)"
python -m recserve_models synth --preset realistic --max-rows "$MAX_ROWS" --requests 8 --out "$results/synth" >/dev/null

cluster=$results/cluster
# shellcheck source=lib/server-process.sh
source scripts/lib/server-process.sh
trap 'stop_server; scripts/redis-cluster.sh stop "$cluster"' EXIT
nodes=$(scripts/redis-cluster.sh start "$cluster")

# The mapped repository, and the Redis one: the same version with every table moved to the Redis tier.
mkdir -p "$results/repo-mapped" "$results/repo-redis/$model/1"
ln -sfn "$results/synth/$model" "$results/repo-mapped/$model"
for f in "$results/synth/$model/1/"*; do
  [ "$(basename "$f")" = model.toml ] || ln -sfn "$f" "$results/repo-redis/$model/1/$(basename "$f")"
done
sed 's/^default_row = \(.*\)$/default_row = \1\ntier = "redis"\nunfetched = "default_row"/' \
  "$results/synth/$model/1/model.toml" > "$results/repo-redis/$model/1/model.toml"
log "publishing to the cluster at $nodes"
python -m recserve_models publish "$results/repo-redis/$model/1" --redis "$nodes" 2>/dev/null
table_bytes=$(python - "$results/synth/$model/1/model.toml" <<'EOF'
import sys, tomllib
spec = tomllib.load(open(sys.argv[1], "rb"))
width = {"fp32": lambda d: 4 * d, "fp16": lambda d: 2 * d, "int8": lambda d: d + 8}
print(sum(t["rows"] * width[t["storage"]](t["dim"]) for t in spec["tables"]))
EOF
)
log "tables: $table_bytes bytes"

client=(taskset -c 0)
server=(taskset -c 1)
start_server() { # LOG REPO FLAGS... → server_pid, url
  local log=$1 repo=$2 port
  shift 2
  port=$(free_port)
  url=http://127.0.0.1:$port
  "${server[@]}" "$recserve_bin" serve --repository "$repo" --http-addr "127.0.0.1:$port" \
    --grpc-addr "127.0.0.1:$(free_port)" --executors 1 --intra-op-threads 1 --redis-url "$nodes" "$@" > "$log" 2>&1 &
  server_pid=$!
  wait_ready "$url/health/ready" "$log"
}
load() { # OUT ARGS... (recload on CPU 0, timed: OUT.json, OUT.time = "user system wall")
  local out=$1
  shift
  /usr/bin/time -f '%U %S %e' -o "$out.time" "${client[@]}" "$recload_bin" run --url "$url" --model "$model" \
    --repository "$results/repo-mapped" --quiet --json "$out.json" "$@" >&2
}
achieved() { python -c 'import json, sys; print(json.load(open(sys.argv[1]))["achieved_rps"])' "$1"; }
metrics() { curl -sf "$url/metrics" > "$1"; }

# (a) saturation, then latency at half of it, per configuration.
half=""
for config in mapped cache-5 cache-20; do
  dir=$results/$config
  mkdir -p "$dir"
  case $config in
    mapped) start_server "$dir/recserve.log" "$results/repo-mapped" ;;
    cache-5) start_server "$dir/recserve.log" "$results/repo-redis" --embedding-cache-bytes $((table_bytes * 5 / 100)) ;;
    cache-20) start_server "$dir/recserve.log" "$results/repo-redis" --embedding-cache-bytes $((table_bytes * 20 / 100)) ;;
  esac
  load "$dir/closed" --closed --concurrency 64 --warmup "$WARMUP" --duration "$DURATION"
  half=$(python -c "print(max(1, round($(achieved "$dir/closed.json") / 2)))")
  metrics "$dir/metrics-before.txt"
  load "$dir/open" --rate "$half" --connections 128 --timeout 2s --warmup "$WARMUP" --duration "$DURATION"
  metrics "$dir/metrics-after.txt"
  if [ "$config" = cache-20 ]; then
    own_half=$half
    # (b) row updates while serving at half this server's saturation.
    dir=$results/updates
    mkdir -p "$dir"
    metrics "$dir/metrics-before.txt"
    python - "$results/repo-redis/$model/1" "$nodes" "$UPDATE_RATE" "$(python -c "print(float('${DURATION%s}') + float('${WARMUP%s}') + 1)")" \
      > "$dir/writer.json" <<'EOF' &
import json, os, sys, time
import numpy as np
from redis.cluster import ClusterNode, RedisCluster
from recserve_models.publish import cluster_nodes
from recserve_models.update import open_target, update_rows

version, url, rate, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
client = RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in cluster_nodes(url)])
target = open_target(version, client)
tables = list(target.tables.values())
weights = np.array([t.rows for t in tables], dtype=float)
weights /= weights.sum()
rng = np.random.default_rng(18)
batch, period = 100, 100 / rate
start = time.monotonic()
cpu = time.process_time()
sent = 0
while time.monotonic() - start < seconds:
    due = start + sent / rate
    if (late := due - time.monotonic()) > 0:
        time.sleep(late)
    # A batch of distinct random rows of a table drawn by its size.
    t = tables[rng.choice(len(tables), p=weights)]
    ids = rng.choice(t.rows, size=min(batch, t.rows), replace=False)
    update_rows(client, target, {t.name: (ids, rng.standard_normal((len(ids), t.dim), dtype=np.float32) * 0.05)})
    sent += len(ids)
wall = time.monotonic() - start
print(json.dumps({"rows": sent, "seconds": wall, "rows_per_s": sent / wall, "cpu": (time.process_time() - cpu) / wall}))
EOF
    writer=$!
    load "$dir/open" --rate "$own_half" --connections 128 --timeout 2s --warmup "$WARMUP" --duration "$DURATION"
    wait "$writer"
    metrics "$dir/metrics-after.txt"

    # (c) a master killed by PID at half this server's saturation.
    dir=$results/failover
    mkdir -p "$dir"
    metrics "$dir/metrics-before.txt"
    (
      sleep "$KILL_AT"
      victim=""
      for port in $(tr ',' '\n' <<<"$nodes" | cut -d: -f2); do
        if redis-cli -p "$port" role 2>/dev/null | head -1 | grep -q master; then victim=$port; break; fi
      done
      # Its replica: the node whose `cluster nodes` line says `slave <victim's id>`.
      id=$(redis-cli -p "$victim" cluster myid)
      replica=$(redis-cli -p "$victim" cluster nodes | awk -v id="$id" '$4 == id {split($2, a, "[:@]"); print a[2]}')
      killed=$(date +%s.%N)
      kill -9 "$(cat "$cluster/$victim.pid")"
      # Taken over when the replica says it is a master.
      for _ in $(seq 1200); do
        redis-cli -p "$replica" role 2>/dev/null | head -1 | grep -q master && break
        sleep 0.02
      done
      python -c "import json; print(json.dumps({'victim': $victim, 'replica': $replica, 'takeover_s': $(date +%s.%N) - $killed}))" > "$dir/kill.json"
    ) &
    killer=$!
    load "$dir/open" --rate "$own_half" --connections 128 --timeout 2s --warmup 0s --duration "${FAILOVER_S}s"
    wait "$killer"
    metrics "$dir/metrics-after.txt"
  fi
  stop_server
done

python - "$results" "$table_bytes" <<'EOF'
import json, sys
from pathlib import Path

results, table_bytes = Path(sys.argv[1]), int(sys.argv[2])

def read_metrics(path):
    out = {}
    for line in open(path):
        if line.startswith("#") or not line.strip():
            continue
        name, value = line.rsplit(" ", 1)
        out[name] = out.get(name, 0.0) + float(value)
    return out

def delta(d, prefix):
    a, b = read_metrics(d / "metrics-before.txt"), read_metrics(d / "metrics-after.txt")
    return sum(v - a.get(k, 0.0) for k, v in b.items() if k.startswith(prefix))

def cpu(run):
    user, system, wall = map(float, open(f"{run}.time").read().split())
    return f"{(user + system) / wall:.0%}"

def run(path):
    return json.load(open(f"{path}.json"))

def quantile(d, name, q):
    """histogram_quantile over the run (linear inside the bucket, as Prometheus does)."""
    a, b = read_metrics(d / "metrics-before.txt"), read_metrics(d / "metrics-after.txt")
    buckets = {}
    for k, v in b.items():
        if k.startswith(name + "_bucket{"):
            le = k.split('le="')[1].split('"')[0]
            buckets[float("inf") if le == "+Inf" else float(le)] = buckets.get(le, 0) + v - a.get(k, 0.0)
    bounds = sorted(buckets)
    total = buckets[bounds[-1]]
    if total == 0:
        return None
    rank, lower, below = q * total, 0.0, 0.0
    for bound in bounds:
        if buckets[bound] >= rank:
            if bound == float("inf"):
                return lower
            return lower + (bound - lower) * (rank - below) / max(buckets[bound] - below, 1e-9)
        lower, below = bound, buckets[bound]
    return lower

print(f"tables {table_bytes / 2**20:.1f} MiB; ids Zipf(1.05); recserve 1 executor on CPU 1, recload on CPU 0")
print("| path | saturation (closed loop) | open loop offered | p50 | p99 | failed | hit ratio | recload CPU |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for config in ("mapped", "cache-5", "cache-20"):
    d = results / config
    closed, open_ = run(d / "closed"), run(d / "open")
    hits = delta(d, 'recserve_embedding_cache_lookups_total{model="realistic-int8",result="hit"}')
    misses = delta(d, 'recserve_embedding_cache_lookups_total{model="realistic-int8",result="miss"}')
    ratio = f"{hits / (hits + misses):.3f}" if hits + misses else "—"
    lat = open_["latency_ms"] or {}
    failed = open_["requests"]["scheduled"] - open_["requests"]["ok"]
    print(f"| {config} | {closed['achieved_rps']:.0f}/s | {open_['offered_rps']:.0f}/s | {lat.get('p50_ms', 0):.2f} ms | "
          f"{lat.get('p99_ms', 0):.2f} ms | {failed} | {ratio} | {cpu(d / 'closed')}, {cpu(d / 'open')} |")

d = results / "updates"
writer = json.load(open(d / "writer.json"))
open_ = run(d / "open")
name = "recserve_embedding_update_visible_seconds"
p50, p99 = quantile(d, name, 0.5), quantile(d, name, 0.99)
entries = delta(d, "recserve_embedding_update_entries_total")
rows = delta(d, "recserve_embedding_updated_rows_total")
errors = delta(d, "recserve_embedding_update_errors_total")
lat = open_["latency_ms"] or {}
print(f"updates: writer {writer['rows_per_s']:.0f} rows/s for {writer['seconds']:.1f} s (its CPU {writer['cpu']:.0%}); "
      f"server applied {entries:.0f} entries, {rows:.0f} rows, {errors:.0f} follow errors; publish-to-visible "
      f"p50 {p50 * 1e3:.2f} ms, p99 {p99 * 1e3:.2f} ms (interpolated in the histogram's buckets); requests at "
      f"{open_['offered_rps']:.0f}/s: p50 {lat.get('p50_ms', 0):.2f} ms, p99 {lat.get('p99_ms', 0):.2f} ms, "
      f"{open_['requests']['scheduled'] - open_['requests']['ok']} failed {open_['errors']}; recload CPU {cpu(d / 'open')}")

d = results / "failover"
kill = json.load(open(d / "kill.json"))
open_ = run(d / "open")
defaulted = delta(d, "recserve_embedding_unfetched_default_total")
tier_errors = delta(d, "recserve_embedding_tier_errors_total")
lat = open_["latency_ms"] or {}
print(f"failover: master {kill['victim']} killed by PID; its replica {kill['replica']} was master {kill['takeover_s']:.2f} s later; "
      f"requests at {open_['offered_rps']:.0f}/s for {open_['duration_s']:.0f} s: {open_['requests']['scheduled']} "
      f"scheduled, {open_['requests']['ok']} answered 200, "
      f"{open_['requests']['scheduled'] - open_['requests']['ok']} failed {open_['errors']}; {defaulted:.0f} ids read "
      f"default rows ({tier_errors:.0f} rows not fetched); p50 {lat.get('p50_ms', 0):.2f} ms, p99 "
      f"{lat.get('p99_ms', 0):.2f} ms; recload CPU {cpu(d / 'open')}")
EOF
