#!/usr/bin/env bash
# The Redis tier under load, on the realistic benchmark model with capped tables (`synth --preset realistic
# --max-rows MAX_ROWS`, model realistic-int8: fp32 tables, INT8 graph), against a local Redis Cluster of 3 masters + 3 replicas
# (scripts/redis-cluster.sh), recserve on CPU 1 and recload on CPU 0 (the Redis nodes run where the kernel puts
# them), Zipf(1.05) ids (recload's default):
#   (a) cache: the mapped files, then the Redis tier with a row cache of 5% and of 20% of the tables' bytes: the
#       closed-loop saturation throughput, then an open loop at half that saturation: rank-call p50/p99 and the
#       cache's hit ratio over it;
#   (b) updates: a server like the 20% one whose tables have `unfetched = "unavailable"` (a row not fetched fails
#       its request instead of reading the default row), UPDATE_RATE row updates per second while recload offers
#       half the 20% server's saturation. The updates flip rows of the item table C21 that the run's requests read
#       between two whole versions, as published (A) and negated (B) (scripts/lib/flip-rows.py: batches of 200 rows
#       written and announced with `recserve_models.update.update_rows`, one Python process), and recload checks
#       every answer, warm-up included (`--check-scores`, tolerance 0): each candidate's score must be, bit for bit,
#       the one a mapped-file server gives it with C21 all A or all B (saved before the run with `recload check`). A torn row, part A and
#       part B, gives a score that is neither and is counted (TORN=1 makes the writer write such rows, to see the
#       check catch them); the script fails if any candidate matched neither. Also the publish-to-visible
#       histogram and the entries applied;
#   (c) failover: on the 20% server (every table `unfetched = "default_row"`), an open loop at half its
#       saturation for FAILOVER_S seconds; KILL_AT seconds in, one master is killed by PID: requests answered,
#       failed, ids read from default rows, and the time until its replica said it was the master. The killed node
#       is started again after the run (it rejoins as a replica);
#   (d) slow node: a server like the 20% one whose requests have a deadline of SLOW_DEADLINE_MS
#       (--default-deadline-ms), an open loop at half the 20% server's saturation for SLOW_S seconds; SLOW_AT
#       seconds after the warm-up, one master is blocked for SLEEP_S seconds (`DEBUG SLEEP`, answering nothing):
#       requests answered, answered with default rows, failed, p50/p99/max latency against the deadline, and the
#       server's own count of requests that took longer than their deadline.
# recload's CPU (user + system ÷ wall) is printed beside every run. Prints the figures; reports in
# target/bench-redis-tier/.
#
# Usage: scripts/bench-redis-tier.sh            (about 6 minutes)
# Environment: MAX_ROWS [50000] DURATION [8s] WARMUP [2s] UPDATE_RATE [10000] FAILOVER_S [20] KILL_AT [6]
#              SLOW_S [15] SLOW_AT [4] SLEEP_S [3] SLOW_DEADLINE_MS [250] POOL [1000] TORN [0]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

MAX_ROWS=${MAX_ROWS:-50000}
DURATION=${DURATION:-8s}
WARMUP=${WARMUP:-2s}
UPDATE_RATE=${UPDATE_RATE:-10000}
FAILOVER_S=${FAILOVER_S:-20}
KILL_AT=${KILL_AT:-6}
SLOW_S=${SLOW_S:-15}
SLOW_AT=${SLOW_AT:-4}
SLEEP_S=${SLEEP_S:-3}
SLOW_DEADLINE_MS=${SLOW_DEADLINE_MS:-250}
POOL=${POOL:-1000}
TORN=${TORN:-0}
results=$root/target/bench-redis-tier
model=realistic-int8

log() { echo "bench-redis-tier: $*" >&2; }
die() { echo "bench-redis-tier: error: $*" >&2; exit 1; }

# shellcheck source=env.sh
source scripts/env.sh
# shellcheck source=lib/server-process.sh
source scripts/lib/server-process.sh
# recload on CPU 0, recserve on CPU 1 (the Redis nodes where the kernel puts them).
cpu_layout one || die "needs 2 CPUs"
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
# For (b): the same published version with unfetched = "unavailable", and a mapped copy whose table C21 holds the
# updates' other version of every row (negated).
mkdir -p "$results/repo-strict/$model/1" "$results/repo-mapped-b/$model/1"
for f in "$results/synth/$model/1/"*; do
  name=$(basename "$f")
  ln -sfn "$f" "$results/repo-strict/$model/1/$name"
  case $name in
    model.toml | tables.safetensors) ;;
    *) ln -sfn "$f" "$results/repo-mapped-b/$model/1/$name" ;;
  esac
done
rm "$results/repo-strict/$model/1/model.toml"
sed 's/unfetched = "default_row"/unfetched = "unavailable"/' "$results/repo-redis/$model/1/model.toml" \
  > "$results/repo-strict/$model/1/model.toml"
cp "$results/synth/$model/1/model.toml" "$results/repo-mapped-b/$model/1/model.toml"
python -c '
import sys
from safetensors.numpy import load_file, save_file
tables = load_file(sys.argv[1])
tables["C21"] = -tables["C21"]
save_file(tables, sys.argv[2])
' "$results/synth/$model/1/tables.safetensors" "$results/repo-mapped-b/$model/1/tables.safetensors"
table_bytes=$(python - "$results/synth/$model/1/model.toml" <<'EOF'
import sys, tomllib
spec = tomllib.load(open(sys.argv[1], "rb"))
width = {"fp32": lambda d: 4 * d, "fp16": lambda d: 2 * d, "int8": lambda d: d + 8}
print(sum(t["rows"] * width[t["storage"]](t["dim"]) for t in spec["tables"]))
EOF
)
log "tables: $table_bytes bytes"

start_recserve() { # LOG REPO FLAGS... → server_pid, url
  local log=$1 repo=$2 port
  shift 2
  port=$(free_port)
  url=http://127.0.0.1:$port
  start_server "$log" "$url/health/ready" "$recserve_bin" serve --repository "$repo" --http-addr "127.0.0.1:$port" \
    --grpc-addr "127.0.0.1:$(free_port)" --executors 1 --intra-op-threads 1 --redis-url "$nodes" "$@"
}
load() { # OUT ARGS... (recload on CPU 0, timed: OUT.json, OUT.time = "user system wall")
  local out=$1
  shift
  /usr/bin/time -f '%U %S %e' -o "$out.time" "${on_client[@]}" "$recload_bin" run --url "$url" --model "$model" \
    --repository "$results/repo-mapped" --pool "$POOL" --quiet --json "$out.json" "$@" >&2
}
metrics() { scrape "$url/metrics" "$1"; }

# (a) saturation, then latency at half of it, per configuration.
half=""
for config in mapped cache-5 cache-20; do
  dir=$results/$config
  mkdir -p "$dir"
  case $config in
    mapped) start_recserve "$dir/recserve.log" "$results/repo-mapped" ;;
    cache-5) start_recserve "$dir/recserve.log" "$results/repo-redis" --embedding-cache-bytes $((table_bytes * 5 / 100)) ;;
    cache-20) start_recserve "$dir/recserve.log" "$results/repo-redis" --embedding-cache-bytes $((table_bytes * 20 / 100)) ;;
  esac
  load "$dir/closed" --closed --concurrency 64 --warmup "$WARMUP" --duration "$DURATION"
  half=$(python -c "print(max(1, round($(json_field "$dir/closed.json" achieved_rps) / 2)))")
  metrics "$dir/metrics-before.txt"
  load "$dir/open" --rate "$half" --connections 128 --timeout 2s --warmup "$WARMUP" --duration "$DURATION"
  metrics "$dir/metrics-after.txt"
  [ "$config" = cache-20 ] && own_half=$half
  stop_server
done

# (b) row updates while serving at half the 20% server's saturation, every answer checked. The references: the
# scores of the run's pool of requests from mapped files with C21 all A, then all B.
dir=$results/updates
mkdir -p "$dir"
for version in a b; do
  repo=$results/repo-mapped
  [ $version = b ] && repo=$results/repo-mapped-b
  start_recserve "$dir/reference-$version.log" "$repo"
  "${on_client[@]}" "$recload_bin" check --url "$url" --model "$model" --repository "$results/repo-mapped" \
    --samples "$POOL" --save "$dir/scores-$version.json" >&2
  stop_server
done
start_recserve "$dir/recserve.log" "$results/repo-strict" --embedding-cache-bytes $((table_bytes * 20 / 100))
metrics "$dir/metrics-before.txt"
python scripts/lib/flip-rows.py "$results/repo-strict/$model/1" "$nodes" "$UPDATE_RATE" \
  "$(python -c "print(float('${DURATION%s}') + float('${WARMUP%s}') + 1)")" "$dir/scores-a.json" "$TORN" \
  > "$dir/writer.json" &
writer=$!
load "$dir/open" --rate "$own_half" --connections 128 --timeout 2s --warmup "$WARMUP" --duration "$DURATION" \
  --check-scores "$dir/scores-a.json,$dir/scores-b.json" --check-tolerance 0
wait "$writer"
metrics "$dir/metrics-after.txt"
stop_server

# (c) a master killed by PID at half the 20% server's saturation; the killed node is started again afterwards.
dir=$results/failover
mkdir -p "$dir"
start_recserve "$dir/recserve.log" "$results/repo-redis" --embedding-cache-bytes $((table_bytes * 20 / 100))
load "$dir/warm" --rate "$own_half" --connections 128 --timeout 2s --warmup 0s --duration "$WARMUP"
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
stop_server
# Back to 3 + 3: the killed node rejoins as its former replica's replica.
scripts/redis-cluster.sh restart "$cluster" "$(python -c 'import json, sys; print(json.load(open(sys.argv[1]))["victim"])' "$dir/kill.json")"

# (d) a master blocked by DEBUG SLEEP under load; requests with a deadline of SLOW_DEADLINE_MS.
dir=$results/slow
mkdir -p "$dir"
start_recserve "$dir/recserve.log" "$results/repo-redis" --embedding-cache-bytes $((table_bytes * 20 / 100)) \
  --default-deadline-ms "$SLOW_DEADLINE_MS"
metrics "$dir/metrics-before.txt"
(
  sleep "$(python -c "print(float('${WARMUP%s}') + $SLOW_AT)")"
  for port in $(tr ',' '\n' <<<"$nodes" | cut -d: -f2); do
    if redis-cli -p "$port" role 2>/dev/null | head -1 | grep -q master; then victim=$port; break; fi
  done
  python -c "import json; print(json.dumps({'victim': $victim, 'sleep_s': $SLEEP_S}))" > "$dir/sleep.json"
  redis-cli -p "$victim" DEBUG SLEEP "$SLEEP_S" >/dev/null
) &
sleeper=$!
load "$dir/open" --rate "$own_half" --connections 128 --timeout 2s --warmup "$WARMUP" --duration "${SLOW_S}s"
wait "$sleeper"
metrics "$dir/metrics-after.txt"
stop_server

python - "$results" "$table_bytes" "$SLOW_DEADLINE_MS" <<'EOF'
import json, sys
from pathlib import Path

sys.path.insert(0, "scripts/lib")
import bench

results, table_bytes, deadline_ms = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])

def read_metrics(path):
    return bench.samples(Path(path).read_text())

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
print("| path | saturation (closed loop) | open loop offered | p50 | p99 | failed | hit ratio | tier fetch p50 / p99 | rows a fetch | recload CPU |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for config in ("mapped", "cache-5", "cache-20"):
    d = results / config
    closed, open_ = run(d / "closed"), run(d / "open")
    hits = delta(d, 'recserve_embedding_cache_lookups_total{model="realistic-int8",result="hit"}')
    misses = delta(d, 'recserve_embedding_cache_lookups_total{model="realistic-int8",result="miss"}')
    ratio = f"{hits / (hits + misses):.3f}" if hits + misses else "—"
    lat = open_["latency_ms"] or {}
    failed = open_["requests"]["scheduled"] - open_["requests"]["ok"]
    fetch, per_batch = "—", "—"
    if config != "mapped":
        name = "recserve_embedding_tier_fetch_duration_seconds"
        f50, f99 = quantile(d, name, 0.5), quantile(d, name, 0.99)
        batches = delta(d, name + "_count")
        if f50 is not None:
            fetch = f"{f50 * 1e3:.2f} / {f99 * 1e3:.2f} ms"
        if batches:
            per_batch = f"{delta(d, 'recserve_embedding_tier_rows_fetched_total') / batches:.0f}"
    print(f"| {config} | {closed['achieved_rps']:.0f}/s | {open_['offered_rps']:.0f}/s | {lat.get('p50_ms', 0):.2f} ms | "
          f"{lat.get('p99_ms', 0):.2f} ms | {failed} | {ratio} | {fetch} | {per_batch} | {cpu(d / 'closed')}, {cpu(d / 'open')} |")

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
c = open_["score_check"]
print(f"updates, every answer checked (warm-up included): {c['answers']} answers, {c['candidates']} candidate scores; "
      f"{c['matched'][0]} matched C21 as published (A), {c['matched'][1]} matched C21 updated (B) (largest "
      f"difference {c['worst_match']:.1e}); {c['mismatched']} matched neither (torn or default rows), in "
      f"{c['answers_mismatched']} answers; {c['unreadable']} unreadable; writer flipped {writer['distinct_rows']} rows"
      + (" writing TORN rows" if writer["torn"] else ""))
torn = c["mismatched"] + c["unreadable"]

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

d = results / "slow"
sleep = json.load(open(d / "sleep.json"))
open_ = run(d / "open")
defaulted = delta(d, "recserve_embedding_unfetched_default_total")
timeouts = delta(d, 'recserve_embedding_tier_errors_total{kind="timeout",model="realistic-int8"}')
skipped = delta(d, 'recserve_embedding_tier_errors_total{kind="skipped",model="realistic-int8"}')
a, b = read_metrics(d / "metrics-before.txt"), read_metrics(d / "metrics-after.txt")
def bucket(le):
    return sum(v - a.get(k, 0.0) for k, v in b.items()
               if k.startswith("recserve_request_duration_seconds_bucket{") and 'model="realistic-int8"' in k and f'le="{le}"' in k)
over = bucket("+Inf") - bucket(f"{deadline_ms / 1000:g}")
lat = open_["latency_ms"] or {}
print(f"slow node: master {sleep['victim']} blocked {sleep['sleep_s']} s by DEBUG SLEEP under {open_['offered_rps']:.0f}/s for "
      f"{open_['duration_s']:.0f} s, deadline {deadline_ms} ms: {open_['requests']['scheduled']} scheduled, "
      f"{open_['requests']['ok']} answered 200, {open_['requests']['scheduled'] - open_['requests']['ok']} failed "
      f"{open_['errors']}; {defaulted:.0f} ids read default rows ({timeouts:.0f} rows timed out, {skipped:.0f} skipped "
      f"by an open breaker); latency p50 {lat.get('p50_ms', 0):.2f} ms, p99 {lat.get('p99_ms', 0):.2f} ms, max "
      f"{lat.get('max_ms', 0):.2f} ms (from the scheduled send); the server counted {over:.0f} requests longer than "
      f"the deadline; recload CPU {cpu(d / 'open')}")
if torn:
    sys.exit(f"bench-redis-tier: {torn} candidate scores of (b) matched neither version of their rows")
EOF
