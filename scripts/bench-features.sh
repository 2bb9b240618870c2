#!/usr/bin/env bash
# What tracing, the access log, TLS and inference tokens cost when they are on (issue 34): the same rank requests
# (100 candidates, `/v1` JSON over HTTP/1.1) to one model served with each configuration in turn,
#   plain       nothing on (the default)
#   tracing     --otlp-endpoint to a real OTLP/gRPC receiver this script starts (examples/otlp_receiver.rs, the
#               tracing tests' receiver as a process), --trace-sample-ratio TRACE_RATIO (recload sends no
#               traceparent, so the server samples the traces it starts at that ratio)
#   access-log  --access-log-sample-ratio ACCESS_LOG_RATIO --log-format json (the lines go to the server's log file)
#   tls         --tls-cert/--tls-key (a CA and a certificate for localhost made here with openssl); recload speaks
#               https:// with --tls-ca, its handshakes made before the clock
#   tls-token   tls and --inference-tokens-file; recload sends the token (--token-file)
# in interleaved rounds (every configuration once per round, in that order), each on a freshly started server.
# Per configuration and round: `recload sweep` for the highest rate at p99 <= each bound of SLA (rates RATES,
# --refine REFINE), then `recload run` at FIXED_RATE (default: half of the first configuration's max rate in round
# 1, at the first bound of SLA that it met) for its p99, with the server's /metrics before and after it: its CPU
# per request by thread role (recserve_thread_cpu_seconds_total), where the time goes whatever the machine's load.
# recload on CPU 0 (with the OTLP receiver), the server alone on CPU 1 (`--executors 1 --intra-op-threads 1`);
# beside every run recload's CPU and the machine's steal (scripts/lib/step.py), and the load average before each
# server start. Writes every report into RESULTS and the table, median and worst of the rounds (never the best),
# into DOC between the section's markers (scripts/bench_features_report.py).
#
# Usage: scripts/bench-features.sh [MODEL-DIR...]
#   MODEL-DIR  a model's directory (REPO/NAME) [default: models/demo/deepfm and REPOSITORY/realistic-int8; REPOSITORY
#              is written as scripts/bench-realistic.sh writes it when missing]. Needs release builds:
#              cargo build --release -p recserve -p recload --bins; and the receiver, cargo build --example
#              otlp_receiver (a debug build serves 1% of the traces easily; --release builds every dev-dependency)
# Environment (defaults in brackets): REPOSITORY [target/bench-repo] RESULTS [target/bench-features] ROUNDS [3]
#   CONFIGS [plain tracing access-log tls tls-token] RATES [200:40000:x1.25] REFINE [3] SLA [5ms,20ms] STEP_WARMUP [1s]
#   STEP_DURATION [3s] FIXED_RATE [half of plain's round-1 max] WARMUP [2s] DURATION [10s] CANDIDATES [100]
#   CONNECTIONS [64] TRACE_RATIO [0.01] ACCESS_LOG_RATIO [0.01] DOC [docs/benchmarks.md; empty: do not write]
#   RECEIVER [target/debug/examples/otlp_receiver, else target/release/examples/otlp_receiver]
set -euo pipefail
cd "$(dirname "$0")/.."
REPOSITORY=${REPOSITORY:-target/bench-repo}
RESULTS=${RESULTS:-$PWD/target/bench-features}
ROUNDS=${ROUNDS:-3}
CONFIGS=${CONFIGS:-plain tracing access-log tls tls-token}
RATES=${RATES:-200:40000:x1.25}
REFINE=${REFINE:-3}
SLA=${SLA:-5ms,20ms}
STEP_WARMUP=${STEP_WARMUP:-1s}
STEP_DURATION=${STEP_DURATION:-3s}
FIXED_RATE=${FIXED_RATE:-}
WARMUP=${WARMUP:-2s}
DURATION=${DURATION:-10s}
CANDIDATES=${CANDIDATES:-100}
CONNECTIONS=${CONNECTIONS:-64}
TRACE_RATIO=${TRACE_RATIO:-0.01}
ACCESS_LOG_RATIO=${ACCESS_LOG_RATIO:-0.01}
DOC=${DOC-docs/benchmarks.md}
RECEIVER=${RECEIVER:-}
if [ -z "$RECEIVER" ]; then
  RECEIVER=target/debug/examples/otlp_receiver
  [ -x "$RECEIVER" ] || RECEIVER=target/release/examples/otlp_receiver
fi

scripts/setup.sh
# shellcheck source=env.sh
source scripts/env.sh
if [ $# -gt 0 ]; then
  model_dirs=("$@")
else
  if [ ! -d "$REPOSITORY" ]; then
    echo "bench-features: writing the realistic models into $REPOSITORY (python -m recserve_models synth --preset realistic --split)" >&2
    python -m recserve_models synth --preset realistic --split --out "$REPOSITORY" >/dev/null
  fi
  model_dirs=(models/demo/deepfm "$REPOSITORY/realistic-int8")
fi
for bin in target/release/recserve target/release/recload "$RECEIVER"; do
  [ -x "$bin" ] || { echo "bench-features: no $bin: build it first (see the usage)" >&2; exit 1; }
done
# shellcheck source=lib/server-process.sh
source scripts/lib/server-process.sh
cpu_layout one || exit 1
rm -rf "$RESULTS"
mkdir -p "$RESULTS/tls"

# A CA, and the server's certificate for localhost (and 127.0.0.1) signed by it; the token file.
tls=$RESULTS/tls
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=bench-features-ca \
  -keyout "$tls/ca.key" -out "$tls/ca.crt" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=localhost -keyout "$tls/tls.key" \
  -out "$tls/tls.csr" 2>/dev/null
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' > "$tls/san.ext"
openssl x509 -req -in "$tls/tls.csr" -CA "$tls/ca.crt" -CAkey "$tls/ca.key" -CAcreateserial -days 2 \
  -extfile "$tls/san.ext" -out "$tls/tls.crt" 2>/dev/null
openssl rand -hex 24 > "$tls/tokens"

receiver_pid=""
stop_receiver() {
  if [ -n "$receiver_pid" ]; then
    kill "$receiver_pid" 2>/dev/null || true
    wait "$receiver_pid" 2>/dev/null || true
    receiver_pid=""
  fi
}
trap 'stop_server; stop_receiver' EXIT

# Starts the OTLP receiver on the client's CPU; sets otlp_url.
start_receiver() { # OUT-JSON LOG
  "${on_client[@]}" "$RECEIVER" --out "$1" > "$2" 2>&1 &
  receiver_pid=$!
  otlp_url=""
  for _ in $(seq 100); do
    otlp_url=$(head -n 1 "$2" 2>/dev/null || true)
    [ -n "$otlp_url" ] && return 0
    kill -0 "$receiver_pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "bench-features: the OTLP receiver did not start: $(cat "$2")" >&2
  exit 1
}

for model_dir in "${model_dirs[@]}"; do
  model=$(basename "$model_dir")
  ls "$model_dir"/*/model.toml > /dev/null 2>&1 || { echo "bench-features: no model at $model_dir" >&2; exit 1; }
  repo=$RESULTS/repo-$model
  mkdir -p "$repo"
  ln -sfn "$(cd "$model_dir" && pwd)" "$repo/$model"
  fixed=$FIXED_RATE
  for round in $(seq "$ROUNDS"); do
    for config in $CONFIGS; do
      out=$RESULTS/$model/$config
      mkdir -p "$out"
      http=$(free_port)
      grpc=$(free_port)
      server_flags=()
      client_flags=()
      scheme=http
      ready_cafile=""
      case $config in
        plain) ;;
        tracing)
          start_receiver "$out/received-$round.json" "$out/receiver-$round.log"
          server_flags=(--otlp-endpoint "$otlp_url" --trace-sample-ratio "$TRACE_RATIO") ;;
        access-log) server_flags=(--access-log-sample-ratio "$ACCESS_LOG_RATIO" --log-format json) ;;
        tls | tls-token)
          server_flags=(--tls-cert "$tls/tls.crt" --tls-key "$tls/tls.key")
          client_flags=(--tls-ca "$tls/ca.crt")
          scheme=https
          ready_cafile=$tls/ca.crt
          if [ "$config" = tls-token ]; then
            server_flags+=(--inference-tokens-file "$tls/tokens")
            client_flags+=(--token-file "$tls/tokens")
          fi ;;
        *) echo "bench-features: unknown configuration $config (CONFIGS)" >&2; exit 2 ;;
      esac
      echo "$round $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/load.txt"
      url="$scheme://localhost:$http"
      start_server "$out/server-$round.log" "$url/health/ready" target/release/recserve serve \
        --repository "$repo" --http-addr "127.0.0.1:$http" --grpc-addr "127.0.0.1:$grpc" --executors 1 \
        --intra-op-threads 1 "${server_flags[@]}"
      common=(--url "$url" "${client_flags[@]}" --model "$model" --repository "$repo" --candidates "$CANDIDATES"
        --seed 1 --pool 1000 --connections "$CONNECTIONS" --timeout 2s --quiet)
      python scripts/lib/step.py --out "$out/sweep-$round.step.json" -- "${on_client[@]}" target/release/recload \
        sweep "${common[@]}" --rates "$RATES" --sla "$SLA" --refine "$REFINE" --past-knee 0 \
        --warmup "$STEP_WARMUP" --duration "$STEP_DURATION" --json "$out/sweep-$round.json" > /dev/null
      if [ -z "$fixed" ]; then
        # Half of the first configuration's max rate (plain, in round 1) at the first bound it met, for every
        # configuration and round.
        fixed=$(python - "$out/sweep-$round.json" <<'PY'
import json, sys
met = [s["max_rps"] for s in json.load(open(sys.argv[1]))["sla"] if s["max_rps"] is not None]
if not met:
    sys.exit("bench-features: the first sweep met no bound of SLA at any rate: set FIXED_RATE")
print(round(met[0] / 2))
PY
)
        echo "$fixed" > "$RESULTS/$model/fixed-rate.txt"
      fi
      python scripts/lib/step.py --out "$out/round-$round.step.json" --metrics "$url/metrics" \
        --prom "$out/round-$round" ${ready_cafile:+--cafile "$ready_cafile"} -- "${on_client[@]}" target/release/recload \
        run "${common[@]}" --rate "$fixed" --warmup "$WARMUP" --duration "$DURATION" \
        --json "$out/round-$round.json" > /dev/null
      stop_server
      stop_receiver
    done
  done
done
echo "end $(cut -d' ' -f1-3 /proc/loadavg)" >> "$RESULTS/load-end.txt"

python scripts/bench_features_report.py "$RESULTS" --configs "$CONFIGS" --rounds "$ROUNDS" --sla "$SLA" \
  --rates "$RATES" --refine "$REFINE" --trace-ratio "$TRACE_RATIO" --access-log-ratio "$ACCESS_LOG_RATIO" \
  ${DOC:+--doc "$DOC"} | tee "$RESULTS/report.md"
