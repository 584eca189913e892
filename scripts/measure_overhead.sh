#!/usr/bin/env bash
# Coordinator + RPC overhead per round on loopback (BENCHMARKS.md, issue #4): `specd up` on
# the two V = 32 000 table models of make_overhead_models.py, then 300 tokens at γ = 5 per
# seed, sparse and dense. Overhead = (round wall − draft model time − target model time) / rounds.
# With --otlp, traces are on: exported to a counting OTLP receiver
# (`cargo build --release -p specd-telemetry --example otlp_sink` first).
# Usage: scripts/measure_overhead.sh [--otlp] [path to specd]   (run after `make build`)
set -euo pipefail
otlp=()
if [ "${1:-}" = --otlp ]; then otlp=(yes); shift; fi
specd=${1:-target/release/specd}
dir=$(mktemp -d)
trap 'kill "${up:-}" "${sink:-}" 2>/dev/null || true; rm -rf "$dir"' EXIT
python3 "$(dirname "$0")/make_overhead_models.py" "$dir"
tracing=()
if [ ${#otlp[@]} -gt 0 ]; then
  "$(dirname "$specd")/examples/otlp_sink" 127.0.0.1:0 >"$dir/sink.out" 2>"$dir/sink.err" &
  sink=$!
  for _ in $(seq 100); do grep -q "listening on" "$dir/sink.out" && break; sleep 0.1; done
  tracing=(--otlp-endpoint "http://$(sed -n 's/^listening on //p' "$dir/sink.out")")
fi
"$specd" up --target-model "$dir/target.json" --draft-model "$dir/draft.json" --listen 127.0.0.1:0 --http-listen off \
  "${tracing[@]}" >"$dir/up.out" 2>"$dir/up.err" &
up=$!
for _ in $(seq 100); do grep -q "listening on" "$dir/up.out" && break; sleep 0.2; done
endpoint="http://$(sed -n 's/^listening on //p' "$dir/up.out")"
for wire in sparse dense; do
  for seed in 1 2; do
    flag=(); [ "$wire" = dense ] && flag=(--dense)
    "$specd" generate --endpoint "$endpoint" --token-ids 1 --max-new-tokens 300 --gamma 5 --ignore-eos \
      --seed "$seed" --json "${flag[@]}" |
      python3 -c '
import json, sys
s = json.load(sys.stdin)["stats"]
n = s["rounds"]
over = (s["round_wall_ns"] - s["draft_ns"] - s["verify_ns"]) / n / 1e3
print("%-6s seed %s: %d rounds, accepted %d/%d, wall %.2f ms, draft %.2f ms, verify %.2f ms, overhead %.0f us, bytes to nodes %.0f / from nodes %.0f"
      % (sys.argv[1], sys.argv[2], n, s["accepted_tokens"], s["draft_tokens"], s["round_wall_ns"] / n / 1e6,
         s["draft_ns"] / n / 1e6, s["verify_ns"] / n / 1e6, over, s["wire_bytes_sent"] / n, s["wire_bytes_received"] / n))
' "$wire" "$seed"
  done
done
if [ ${#otlp[@]} -gt 0 ]; then sleep 6; echo "spans exported: $(tail -1 "$dir/sink.err")"; fi
