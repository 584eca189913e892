#!/usr/bin/env bash
# The demo behind `make demo`, until the trained demo model pair lands (issue #5): the exact
# rule and the cost model on the design's numbers, then all three roles as real gRPC servers
# on loopback (`specd up`) driven by two small *table* models whose p and q are written out
# in JSON, a streamed generation, and a statistical audit of the output law.
set -euo pipefail
specd=${SPECD_BIN:-./target/release/specd}
dir=target/demo
mkdir -p "$dir"

echo "== 1. The exact rule on the design's worked example (200 000 simulated rounds) =="
"$specd" rule --target 0.6,0.3,0.1 --draft 0.5,0.25,0.25 --simulate 200000 --seed 7
echo
echo "== 2. When does drafting pay? =="
"$specd" cost --gamma 2 --alpha 0.5 --target-ms 100 --draft-ms 20
echo

# A 4-word language: the target prefers some continuations, the draft guesses roughly.
cat > "$dir/target.json" <<'JSON'
{"vocab_size": 4, "tokens": ["the", "draft", "target", "agrees"],
 "default": [0.4, 0.3, 0.2, 0.1],
 "rules": [{"suffix": [0], "probs": [0.05, 0.5, 0.4, 0.05]},
           {"suffix": [1], "probs": [0.1, 0.1, 0.2, 0.6]},
           {"suffix": [2], "probs": [0.1, 0.1, 0.1, 0.7]},
           {"suffix": [3], "probs": [0.7, 0.1, 0.1, 0.1]}]}
JSON
cat > "$dir/draft.json" <<'JSON'
{"vocab_size": 4, "tokens": ["the", "draft", "target", "agrees"],
 "default": [0.25, 0.25, 0.25, 0.25],
 "rules": [{"suffix": [0], "probs": [0.1, 0.45, 0.35, 0.1]},
           {"suffix": [3], "probs": [0.55, 0.15, 0.15, 0.15]}]}
JSON

echo "== 3. specd up: target node, draft node and coordinator over gRPC on loopback =="
"$specd" up --target-model "$dir/target.json" --draft-model "$dir/draft.json" --listen 127.0.0.1:0 \
  >"$dir/up.out" 2>"$dir/up.log" &
up=$!
trap 'kill $up 2>/dev/null || true; wait $up 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  grep -q '^listening on ' "$dir/up.out" 2>/dev/null && break
  kill -0 $up 2>/dev/null || { cat "$dir/up.log"; exit 1; }
  sleep 0.1
done
addr=$(sed -n 's/^listening on //p' "$dir/up.out")
echo "coordinator listening on $addr (node logs in $dir/up.log)"
echo
echo "== 4. A streamed generation (γ = 4, T = 1, seed 3) =="
"$specd" generate --endpoint "http://$addr" --prompt "the" --max-new-tokens 24 --gamma 4 --seed 3 --stream
echo
echo "== 5. Audit: 5 000 speculative vs 5 000 target-only 3-token continuations =="
"$specd" audit --endpoint "http://$addr" --prompt "the" --tokens 3 --samples 5000
