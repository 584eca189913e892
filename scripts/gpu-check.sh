#!/usr/bin/env bash
# GPU check for the lent GPU machine (no Rust toolchain there; python3 with torch 2.11.0+cu130).
#
# Two steps:
#   scripts/gpu-check.sh bundle   # here, with the toolchain: writes target/gpu-check/
#                                 #   specd                  stripped release binary
#                                 #   verify_vs_decode       stripped criterion bench binary
#                                 #   fixtures/              tiny HF checkpoints (from the test cache)
#   scripts/gpu-check.sh run      # on the GPU machine, with target/gpu-check carried along:
#                                 #   1. points the binaries at that python's torch lib/
#                                 #   2. scores every fixture with `specd logits` on cpu and cuda:0
#                                 #      (f32) and compares: max |Δlogit| <= 1e-3, same argmax
#                                 #   3. times verify-6 against decode-1 on the 100M random Llama
#                                 #      (f32 on cuda:0) and prints the bench summary line
# Results go to stdout and, when $OUT is set, to $OUT/gpu-check.txt.
# Overrides: SPECD_BIN, BENCH_BIN, FIXTURES, PYTHON, GPU_DEVICE (default cuda:0).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUNDLE="$ROOT/target/gpu-check"

bundle() {
  export LIBTORCH_USE_PYTORCH=1 VIRTUAL_ENV="$ROOT/.venv" PATH="$ROOT/.venv/bin:$PATH"
  local target="${CARGO_TARGET_DIR:-$ROOT/target}"
  mkdir -p "$BUNDLE"
  (cd "$ROOT" && cargo build --release -p specd)
  local bench_json
  bench_json="$(cd "$ROOT" && cargo bench -p specd-model --bench verify_vs_decode --no-run --message-format=json)"
  local bench_bin
  bench_bin="$(printf '%s\n' "$bench_json" | python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "verify_vs_decode":
        print(m["executable"])')"
  strip -o "$BUNDLE/specd" "$target/release/specd"
  strip -o "$BUNDLE/verify_vs_decode" "$bench_bin"
  # The model tests make the fixtures; reuse their cache.
  local fixtures="$ROOT/target/fixtures/model-v1"
  if [[ ! -f "$fixtures/VERSION" ]]; then
    "${SPECD_PYTHON:-$ROOT/.venv/bin/python}" "$ROOT/scripts/make_fixtures.py" "$fixtures"
  fi
  rm -rf "$BUNDLE/fixtures"
  cp -r "$fixtures" "$BUNDLE/fixtures"
  du -sh "$BUNDLE"/*
}

run() {
  local py="${PYTHON:-python3}"
  local specd="${SPECD_BIN:-$BUNDLE/specd}"
  local bench="${BENCH_BIN:-$BUNDLE/verify_vs_decode}"
  local fixtures="${FIXTURES:-$BUNDLE/fixtures}"
  local dev="${GPU_DEVICE:-cuda:0}"
  local torch_lib
  torch_lib="$("$py" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')"
  export LD_LIBRARY_PATH="$torch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  local report="${OUT:-/tmp}/gpu-check.txt"
  : > "$report"
  log() { echo "$*" | tee -a "$report"; }
  log "torch: $("$py" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count())')"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$report"
  local work
  work="$(mktemp -d)"
  local status=0
  local tokens="1,17,5,42,9,88,3,64,12,77,30,2,50,61"
  for dir in "$fixtures"/*/; do
    local name
    name="$(basename "$dir")"
    "$specd" logits --model "$dir" --tokens "$tokens" --device cpu --json > "$work/$name.cpu.json"
    if ! "$specd" logits --model "$dir" --tokens "$tokens" --device "$dev" --json > "$work/$name.gpu.json" 2> "$work/$name.err"; then
      log "FAIL $name: $dev scoring failed: $(cat "$work/$name.err")"
      status=1
      continue
    fi
    if ! "$py" - "$work/$name.cpu.json" "$work/$name.gpu.json" "$name" "$dev" <<'PY' | tee -a "$report"; then
import json, sys
cpu = json.load(open(sys.argv[1]))["logits"]
gpu = json.load(open(sys.argv[2]))["logits"]
name, dev = sys.argv[3], sys.argv[4]
assert len(cpu) == len(gpu), "row counts differ"
diff = max(abs(a - b) for r, s in zip(cpu, gpu) for a, b in zip(r, s))
same_argmax = all(r.index(max(r)) == s.index(max(s)) for r, s in zip(cpu, gpu))
ok = diff <= 1e-3 and same_argmax
print(f"{'ok  ' if ok else 'FAIL'} {name}: {dev} vs cpu f32, {len(cpu)} positions, max |dlogit| = {diff:.3e}, same argmax = {same_argmax}")
sys.exit(0 if ok else 1)
PY
      status=1
    fi
  done
  log "bench: verify-6 vs decode-1, random 100M Llama, f32, context 256, on $dev"
  SPECD_BENCH_DEVICE="$dev" "$bench" --bench --warm-up-time 1 --measurement-time 3 2>&1 \
    | grep -E "summary:|time:|^llama" | tee -a "$report" || status=1
  SPECD_BENCH_DEVICE=cpu "$bench" --bench --warm-up-time 1 --measurement-time 3 2>&1 \
    | grep -E "summary:" | tee -a "$report" || status=1
  rm -rf "$work"
  log "gpu-check: $([[ $status == 0 ]] && echo PASS || echo FAIL)"
  return "$status"
}

case "${1:-}" in
  bundle) bundle ;;
  run) run ;;
  *) echo "usage: $0 bundle|run" >&2; exit 2 ;;
esac
