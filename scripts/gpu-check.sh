#!/usr/bin/env bash
# The GPU check: one run on a lent GPU machine (python3 with torch 2.11.0+cu130 and
# transformers, no Rust toolchain, no network, at most 64 MiB carried) that writes one JSON
# report. Two steps:
#
#   scripts/gpu-check.sh bundle       here, with the toolchain: writes target/gpu-check/
#       specd            stripped release binary
#       llama1b_shape    stripped bench binary (model/benches/llama1b_shape.rs)
#       fixtures/        the model tests' tiny Hugging Face checkpoints (target/fixtures)
#       gpu_check.py     the stages (scripts/gpu_check.py)
#       bench_prompts.txt  specd bench's built-in prompts, which transformers is given too
#       bundle.json      commit, date, file sizes
#     and fails, printing the size, when the bundle exceeds 64 MiB.
#
#   scripts/gpu-check.sh run [--quick]   there, with target/gpu-check carried along
#                                        (run's `carry: ["target/gpu-check"]`):
#       points the binaries at that python's torch lib/, then runs every stage with its own
#       time budget (scripts/gpu_check.py says which) and writes $OUT/gpu-check.json
#       ($OUT defaults to /tmp) and the progress log $OUT/gpu-check.log. The whole run stays
#       within 8 minutes. Exit 0 when every stage ran, 1 when one failed or was skipped
#       (except, on a CPU, a stage skipped because it needs CUDA).
#
# A dry run of the whole thing on a CPU, which proves the report's shape and runs every
# measurement a CPU can (`make test` runs it; about a minute on 2 cores):
#   GPU_DEVICE=cpu scripts/gpu-check.sh run --quick
#
# Overrides: GPU_DEVICE (default cuda:0), PYTHON (default python3), OUT, GPU_CHECK_QUICK=1
# (same as --quick), GPU_CHECK_TIMEOUT_S (the run's hard limit: 475 s, 720 s with --quick),
# GPU_CHECK_MAX_MIB (the bundle's limit, 64), GPU_CHECK_BUDGET_S (the stages' total, 460 s;
# half as much again with --quick on a CPU).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUNDLE="$ROOT/target/gpu-check"

# The executable cargo's JSON messages (stdin) name for a target of this kind and name.
executable() {
  python3 -c '
import json, sys
kind, name = sys.argv[1:]
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    t = m.get("target") or {}
    if m.get("reason") == "compiler-artifact" and m.get("executable") and t.get("name") == name and kind in t.get("kind", []):
        print(m["executable"])' "$1" "$2"
}

bundle() {
  local venv="${VIRTUAL_ENV:-$ROOT/.venv}"
  export LIBTORCH_USE_PYTORCH=1 VIRTUAL_ENV="$venv" PATH="$venv/bin:$PATH"
  local cargo="${CARGO:-cargo}"
  local started=$SECONDS
  # Both binaries come from the build `make test` makes (`cargo test --workspace --release`):
  # a workspace-wide selection with test targets unifies dependency features the way that
  # build does, so after the tests nothing but the bench binary is compiled (`cargo build
  # -p specd` resolves features otherwise and would rebuild the workspace's crates). The
  # one integration test named is the demo's, whose run needs the specd binary.
  local specd_bin bench_bin
  specd_bin="$(cd "$ROOT" && "$cargo" test --workspace --release --locked --no-run --test demo_pair \
    --message-format=json | executable bin specd)"
  bench_bin="$(cd "$ROOT" && "$cargo" bench --workspace --locked --no-run --bench llama1b_shape \
    --message-format=json | executable bench llama1b_shape)"
  if [[ -z "$specd_bin" || -z "$bench_bin" ]]; then
    echo "gpu-check bundle: cargo named no executable for specd ($specd_bin) or llama1b_shape ($bench_bin)" >&2
    return 1
  fi
  rm -rf "$BUNDLE"
  mkdir -p "$BUNDLE"
  strip -o "$BUNDLE/specd" "$specd_bin"
  strip -o "$BUNDLE/llama1b_shape" "$bench_bin"
  # The model tests make the fixtures (and name their version); reuse their cache.
  local version
  version="$(sed -n 's/^const FIXTURE_VERSION: &str = "\(.*\)";/\1/p' "$ROOT/model/tests/common/mod.rs")"
  local fixtures="$ROOT/target/fixtures/$version"
  if [[ ! -f "$fixtures/VERSION" ]]; then
    "${SPECD_PYTHON:-$venv/bin/python}" "$ROOT/scripts/make_fixtures.py" "$fixtures"
  fi
  cp -r "$fixtures" "$BUNDLE/fixtures"
  cp "$ROOT/scripts/gpu_check.py" "$BUNDLE/gpu_check.py"
  cp "$ROOT/specd/bench/prompts.txt" "$BUNDLE/bench_prompts.txt"
  python3 - "$BUNDLE" "$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)" \
    "$(git -C "$ROOT" status --porcelain 2>/dev/null | grep -qv '^??' && echo true || echo false)" \
    "$version" <<'PY'
import json, os, sys, time
root, commit, dirty, version = sys.argv[1:]
files = {}
for d, _, names in os.walk(root):
    for n in names:
        p = os.path.join(d, n)
        files[os.path.relpath(p, root)] = os.path.getsize(p)
json.dump({"commit": commit, "uncommitted_changes": dirty == "true", "fixtures": version,
           "built_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "bytes": sum(files.values()), "files": dict(sorted(files.items()))},
          open(os.path.join(root, "bundle.json"), "w"), indent=1)
PY
  local bytes max_mib="${GPU_CHECK_MAX_MIB:-64}"
  bytes="$(du -sb "$BUNDLE" | cut -f1)"
  local mib
  mib="$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1048576 }')"
  du -sh "$BUNDLE"/* | sed 's/^/  /'
  if (( bytes > max_mib * 1024 * 1024 )); then
    echo "gpu-check bundle: $BUNDLE is $mib MiB, over the $max_mib MiB that may be carried" >&2
    return 1
  fi
  echo "gpu-check bundle: $BUNDLE is $mib MiB (limit $max_mib MiB), made in $((SECONDS - started)) s"
}

run() {
  local quick="${GPU_CHECK_QUICK:-}"
  for arg in "$@"; do
    case "$arg" in
      --quick) quick=1 ;;
      *) echo "usage: $0 run [--quick]" >&2; exit 2 ;;
    esac
  done
  local py="${PYTHON:-python3}"
  local dev="${GPU_DEVICE:-cuda:0}"
  local out="${OUT:-/tmp}"
  mkdir -p "$out"
  if [[ ! -x "$BUNDLE/specd" ]]; then
    echo "gpu-check run: no bundle in $BUNDLE (run \`scripts/gpu-check.sh bundle\` where Rust is, and carry target/gpu-check)" >&2
    exit 2
  fi
  local torch_lib
  torch_lib="$("$py" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')"
  export LD_LIBRARY_PATH="$torch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # The demo trains on this machine's own Python sources.
  export SPECD_PYTHON="${SPECD_PYTHON:-$(command -v "$py")}"
  local limit="${GPU_CHECK_TIMEOUT_S:-$([[ -n "$quick" ]] && echo 720 || echo 475)}"
  local status=0
  timeout -k 10 "$limit" "$py" "$BUNDLE/gpu_check.py" "$BUNDLE" "$out/gpu-check.json" "$dev" ${quick:+--quick} \
    2> >(tee "$out/gpu-check.log" >&2) || status=$?
  echo "gpu-check: report in $out/gpu-check.json (exit $status)"
  return "$status"
}

case "${1:-}" in
  bundle) bundle ;;
  run) shift; run "$@" ;;
  *) echo "usage: $0 bundle | run [--quick]" >&2; exit 2 ;;
esac
