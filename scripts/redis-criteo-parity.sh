#!/usr/bin/env bash
# Criteo-scale parity of the Redis tier: the criteo-kaggle benchmark model (`synth --preset criteo-kaggle`: 26 int8
# tables, 33.76M rows, 0.84 GB) published to a local Redis Cluster of 3 masters + 3 replicas
# (scripts/redis-cluster.sh) and served from the tier must score SAMPLES generated rank requests (1 user x 100
# candidates, recload's Zipf(1.05) ids) exactly as the same version served from its mapped files: `recload check
# --tolerance 0`, twice (the first pass fetches most rows from the cluster, the second reads many from the cache).
# The Redis-tier copy has `unfetched = "unavailable"`, so a row not fetched fails its request instead of reading a
# default row. Prints the requests and scores compared, the publish time and rate, the cluster's memory (per node
# `used_memory` before and after, keys, bytes per row above the row's own bytes) and the servers' RSS; writes it all
# to target/redis-criteo/summary.json.
#
# Usage: scripts/redis-criteo-parity.sh [SYNTH_REPO]
#   SYNTH_REPO: a `synth --preset criteo-kaggle` output holding criteo-kaggle-int8 (else one is written to
#   target/redis-criteo/synth: about 4 minutes and 4.9 GB of memory at peak).
# Environment: SAMPLES [1000]
# Memory: the cluster holds about 2 x 4.5 GB (masters and replicas), the mapped server 0.9 GB.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

SAMPLES=${SAMPLES:-1000}
results=$root/target/redis-criteo
model=criteo-kaggle-int8

log() { echo "redis-criteo-parity: $*" >&2; }
die() { echo "redis-criteo-parity: error: $*" >&2; exit 1; }

# shellcheck source=env.sh
source scripts/env.sh
command -v redis-server >/dev/null || die "redis-server is not installed (apt-get install redis-server)"
mkdir -p "$results"
rm -rf "$results/cluster" "$results/repo-mapped" "$results/repo-redis" "$results/run"
mkdir -p "$results/run"

log "building recserve and recload (release)"
cargo build --release --quiet -p recserve -p recload --bins
recserve_bin=$root/target/release/recserve
recload_bin=$root/target/release/recload

synth=${1:-$results/synth}
if [ ! -f "$synth/$model/1/model.toml" ]; then
  [ $# -eq 0 ] || die "$synth has no $model/1/model.toml (write one with python -m recserve_models synth --preset criteo-kaggle --out DIR)"
  log "writing the model (synth --preset criteo-kaggle, about 4 minutes)"
  python -m recserve_models synth --preset criteo-kaggle --requests 8 --out "$synth" >/dev/null
fi
synth=$(cd "$synth" && pwd)

cluster=$results/cluster
# shellcheck source=lib/server-process.sh
source scripts/lib/server-process.sh
trap 'stop_server; scripts/redis-cluster.sh stop "$cluster"' EXIT
nodes=$(scripts/redis-cluster.sh start "$cluster")
ports=$(tr ',' '\n' <<<"$nodes" | cut -d: -f2)

# The mapped repository, and the Redis one: the same version with every table in the Redis tier.
mkdir -p "$results/repo-mapped" "$results/repo-redis/$model/1"
ln -sfn "$synth/$model" "$results/repo-mapped/$model"
for f in "$synth/$model/1/"*; do
  [ "$(basename "$f")" = model.toml ] || ln -sfn "$f" "$results/repo-redis/$model/1/$(basename "$f")"
done
sed 's/^default_row = \(.*\)$/default_row = \1\ntier = "redis"\nunfetched = "unavailable"/' \
  "$synth/$model/1/model.toml" > "$results/repo-redis/$model/1/model.toml"

memory() { # OUT: per node: port role used_memory used_memory_rss keys
  for port in $ports; do
    info=$(redis-cli -p "$port" info memory)
    printf '%s %s %s %s %s\n' "$port" "$(redis-cli -p "$port" role | head -1)" \
      "$(grep '^used_memory:' <<<"$info" | cut -d: -f2 | tr -d '\r')" \
      "$(grep '^used_memory_rss:' <<<"$info" | cut -d: -f2 | tr -d '\r')" \
      "$(redis-cli -p "$port" dbsize)"
  done > "$1"
}
memory "$results/run/memory-before.txt"

log "publishing $model to the cluster at $nodes"
/usr/bin/time -f '%e %M' -o "$results/run/publish.time" \
  python -m recserve_models publish "$results/repo-redis/$model/1" --redis "$nodes" 2> "$results/run/publish.log"
# The replicas have every row once each master's replication offset is its replica's.
for _ in $(seq 600); do
  behind=0
  for port in $ports; do
    info=$(redis-cli -p "$port" info replication)
    if grep -q 'role:master' <<<"$info"; then
      offset=$(grep '^master_repl_offset:' <<<"$info" | cut -d: -f2 | tr -d '\r')
      grep -q "offset=$offset," <<<"$info" || behind=1
    fi
  done
  [ $behind = 0 ] && break
  sleep 1
done
memory "$results/run/memory-after.txt"

start_recserve() { # LOG REPO FLAGS... → server_pid, url (not pinned)
  local log=$1 repo=$2 port
  shift 2
  port=$(free_port)
  url=http://127.0.0.1:$port
  start_server "$log" "$url/health/ready" "$recserve_bin" serve --repository "$repo" --http-addr "127.0.0.1:$port" \
    --grpc-addr "127.0.0.1:$(free_port)" --redis-url "$nodes" "$@"
}
check() { # ARGS...
  "$recload_bin" check --url "$url" --model "$model" --repository "$results/repo-mapped" --samples "$SAMPLES" "$@"
}

log "scores from the mapped files"
start_recserve "$results/run/mapped.log" "$results/repo-mapped"
check --save "$results/run/mapped-scores.json" >&2
mapped_rss=$(server_rss_mib)
stop_server

log "the same requests from the Redis tier, twice, tolerance 0"
start_recserve "$results/run/redis.log" "$results/repo-redis"
check --expect "$results/run/mapped-scores.json" --tolerance 0 --json "$results/run/pass-1.json" >&2
scrape "$url/metrics" "$results/run/metrics-1.txt"
check --expect "$results/run/mapped-scores.json" --tolerance 0 --json "$results/run/pass-2.json" >&2
scrape "$url/metrics" "$results/run/metrics-2.txt"
redis_rss=$(server_rss_mib)
stop_server

python - "$results" "$synth/$model/1/model.toml" "$mapped_rss" "$redis_rss" <<'EOF'
import json, sys, tomllib
from pathlib import Path

results, toml, mapped_rss, redis_rss = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
run = results / "run"
spec = tomllib.load(open(toml, "rb"))
width = {"fp32": lambda d: 4 * d, "fp16": lambda d: 2 * d, "int8": lambda d: d + 8}
rows = sum(t["rows"] for t in spec["tables"])
row_bytes = sum(t["rows"] * width[t["storage"]](t["dim"]) for t in spec["tables"])

def memory(name):
    out = {}
    for line in open(run / name):
        port, role, used, rss, keys = line.split()
        out[port] = {"role": role, "used_memory": int(used), "used_memory_rss": int(rss), "keys": int(keys)}
    return out

before, after = memory("memory-before.txt"), memory("memory-after.txt")
masters = [p for p, m in after.items() if m["role"] == "master"]
added = {p: after[p]["used_memory"] - before[p]["used_memory"] for p in after}
master_bytes = sum(added[p] for p in masters)
keys = sum(after[p]["keys"] for p in masters)
wall, peak_kib = open(run / "publish.time").read().split()
passes = [json.load(open(run / f"pass-{i}.json")) for i in (1, 2)]

def sample(path, name):
    return sum(float(l.rsplit(" ", 1)[1]) for l in open(path) if l.startswith(name))

hits = [sample(run / f"metrics-{i}.txt", 'recserve_embedding_cache_lookups_total{model="criteo-kaggle-int8",result="hit"}') for i in (1, 2)]
misses = [sample(run / f"metrics-{i}.txt", 'recserve_embedding_cache_lookups_total{model="criteo-kaggle-int8",result="miss"}') for i in (1, 2)]
fetched = [sample(run / f"metrics-{i}.txt", "recserve_embedding_tier_rows_fetched_total") for i in (1, 2)]
summary = {
    "tables": len(spec["tables"]), "rows": rows, "row_bytes": row_bytes,
    "publish_s": float(wall), "publish_rows_per_s": rows / float(wall), "publisher_peak_rss_mib": int(peak_kib) // 1024,
    "keys_on_masters": keys,
    "used_memory_added_masters": master_bytes,
    "used_memory_added_all_nodes": sum(added.values()),
    "used_memory_rss_all_nodes": sum(m["used_memory_rss"] for m in after.values()),
    "bytes_per_row_on_a_master": master_bytes / keys if keys else None,
    "overhead_per_row": (master_bytes - row_bytes) / keys if keys else None,
    "nodes": after,
    "passes": [{"samples": p["samples"], "scores": p["scores"], "worst_abs_diff": p["worst_abs_diff"]} for p in passes],
    "pass_hit_ratio": [hits[0] / (hits[0] + misses[0]), (hits[1] - hits[0]) / (hits[1] - hits[0] + misses[1] - misses[0])],
    "rows_fetched": [fetched[0], fetched[1] - fetched[0]],
    "mapped_server_rss_mib": mapped_rss, "redis_server_rss_mib": redis_rss,
}
json.dump(summary, open(results / "summary.json", "w"), indent=2)
print(f"{summary['tables']} int8 tables, {rows:,} rows, {row_bytes / 1e9:.3f} GB of rows")
print(f"publish: {float(wall):.0f} s ({rows / float(wall):,.0f} rows/s, one Python process, peak RSS "
      f"{summary['publisher_peak_rss_mib']} MiB)")
print(f"cluster memory added: masters {master_bytes / 2**30:.2f} GiB for {keys:,} keys = {master_bytes / keys:.1f} B per row "
      f"({summary['overhead_per_row']:.1f} B above the row's own bytes); all 6 nodes {sum(added.values()) / 2**30:.2f} GiB "
      f"(used_memory_rss {summary['used_memory_rss_all_nodes'] / 2**30:.2f} GiB)")
for port, m in sorted(after.items()):
    print(f"  node {port} {m['role']}: {m['keys']:,} keys, used_memory {m['used_memory'] / 2**30:.2f} GiB, rss {m['used_memory_rss'] / 2**30:.2f} GiB")
for i, p in enumerate(passes, 1):
    print(f"pass {i}: {p['samples']} requests, {p['scores']:,} scores bit-identical to the mapped files (largest "
          f"difference {p['worst_abs_diff']}), cache hit ratio {summary['pass_hit_ratio'][i - 1]:.3f}, "
          f"{summary['rows_fetched'][i - 1]:,.0f} rows fetched")
print(f"server RSS: mapped files {mapped_rss} MiB, Redis tier {redis_rss} MiB (cache up to 256 MiB)")
EOF
