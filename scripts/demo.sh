#!/usr/bin/env bash
# The demo behind `make demo`: the demo model pair (the one the repository ships in models/demo,
# checked against its SHA256SUMS at load; without it, one built here into models/demo-build),
# all three roles as real gRPC servers on loopback (`specd up`), a streamed completion of a
# code prompt, then the speedup over target-only decoding on that prompt.
set -euo pipefail
specd=${SPECD_BIN:-./target/release/specd}
models=${SPECD_DEMO_DIR:-models/demo}
work=target/demo
mkdir -p "$work"
# The target in bf16 where the CPU has bf16 instructions (AVX-512 BF16 or AMX): the demo
# target's passes read half the bytes, and on a 2-core AMD EPYC with AVX-512 BF16 and no AMX
# it decoded 1.7× faster than in f32 with a verify pass of 1.12 one-token passes (1.58 in
# f32; BENCHMARKS.md). Elsewhere f32, which libtorch does not emulate. SPECD_DTYPE and
# SPECD_DRAFT_DTYPE override.
if [ -z "${SPECD_DTYPE:-}" ]; then
  if grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo 2>/dev/null; then export SPECD_DTYPE=bf16; else export SPECD_DTYPE=f32; fi
  # The draft stays in f32, which the host engine runs (`--engine auto`: plain Rust, without
  # libtorch's cost per operation, which is most of a tiny draft's step).
  export SPECD_DRAFT_DTYPE=${SPECD_DRAFT_DTYPE:-f32}
fi

echo "== 1. The demo pair (a Llama target trained on Python sources, a draft distilled from it) =="
if [ -f "$models/target/config.json" ] && [ -f "$models/draft/config.json" ]; then
  echo "using $models$( [ -f "$models/card.json" ] && echo " (its figures and how it was made: $models/card.json)")"
else
  echo "no pair in $models: building one here (specd models demo --out models/demo-build; tens of minutes)"
  "$specd" models demo --out models/demo-build
  models=models/demo-build
fi
echo

echo "== 2. specd up: target node, draft node and coordinator over gRPC on loopback (target in $SPECD_DTYPE, draft in ${SPECD_DRAFT_DTYPE:-$SPECD_DTYPE}) =="
"$specd" up --target-model "$models/target" --draft-model "$models/draft" --listen 127.0.0.1:0 \
  --http-listen 127.0.0.1:0 --served-model-name demo >"$work/up.out" 2>"$work/up.log" &
up=$!
trap 'kill $up 2>/dev/null || true; wait $up 2>/dev/null || true' EXIT
for _ in $(seq 600); do
  grep -q '^listening on ' "$work/up.out" 2>/dev/null && break
  kill -0 $up 2>/dev/null || { cat "$work/up.log"; exit 1; }
  sleep 0.1
done
addr=$(sed -n 's/^listening on //p' "$work/up.out")
[ -n "$addr" ] || { echo "specd up did not start in time; see $work/up.log"; exit 1; }
http=$(sed -n 's|^OpenAI-compatible HTTP API on ||p' "$work/up.out")
echo "coordinator: gRPC on $addr, OpenAI-compatible HTTP on $http (logs in $work/up.log)"
echo

# The prompt is chosen so that the shipped target continues it for real at T = 0.8 (a test,
# specd/tests/shipped_pair.rs, checks it); the completion is checked here too.
prompt=$(cat scripts/demo_prompt.txt; printf x)
prompt=${prompt%x}
printf '%s' "$prompt" >"$work/prompt.txt"
echo "== 3. A streamed completion (T = 0.8, draft length chosen by the adaptive policy) =="
printf '%s' "$prompt"
"$specd" generate --endpoint "http://$addr" --prompt "$prompt" --max-new-tokens 128 --temperature 0.8 --seed 1 --stream \
  | tee "$work/completion.txt"
echo
if [ "$(wc -c <"$work/completion.txt")" -lt 40 ]; then
  echo "the completion stopped after $(wc -c <"$work/completion.txt") bytes: this pair does not continue its prompt (see $models/card.json)"
  exit 1
fi

echo "== 4. Speedup over target-only decoding on the same prompt (3 passes, interleaved) =="
"$specd" bench --endpoint "http://$addr" --prompts "$work/prompt.txt" --temperature 0.8 --max-new-tokens 128 --repeat 3
echo

echo "== 5. The same server through its OpenAI-compatible HTTP API (curl) =="
curl -sS "$http/completions" -H 'content-type: application/json' \
  -d '{"model": "demo", "prompt": "def fibonacci(n):\n", "max_tokens": 48, "temperature": 0}'
echo
