#!/usr/bin/env bash
# llama.cpp CPU baseline for the specd demo pair: build llama.cpp from the copy vendored in the
# llama-cpp-python sdist (PyPI is reachable here, GitHub is not), convert Hugging Face checkpoints
# to GGUF, and time them with llama-bench.
#
# Usage: scripts/llama_cpp_bench.sh <command> [args]
#   build                 download llama-cpp-python==$LLAMA_CPP_PY_VERSION (sdist, no deps), unpack
#                         it, and build llama.cpp's CPU backend (Release, GGML_NATIVE=ON, no CUDA,
#                         LLAMA_CURL=OFF, server off; targets llama-bench, llama-completion (the
#                         old llama-cli; the new llama-cli comes only with the server), llama-simple,
#                         llama-speculative[-simple]: those present) under nice -n 19 with -j$JOBS.
#                         cmake comes from PATH, else from PyPI into $LLAMA_CPP_DIR/tools-venv.
#   convert [HF_DIR...]   convert models/demo/target and models/demo/draft (and any HF_DIR given)
#                         to GGUF in f32 and bf16: $LLAMA_CPP_DIR/gguf/<name>-<dtype>.gguf, where
#                         <name> is demo-target / demo-draft for the demo pair, else the basename.
#   bench GGUF...         llama-bench, tg128 (decode) and pp$PP (prefill) at -t 1 and -t 2, -r $REPS.
#                         Prints the CPU, llama-bench's table (t/s = tokens/s), then one JSON line
#                         per run (dtype from the file name's -f32/-bf16/... suffix):
#                         {"model":..,"dtype":..,"threads":..,"test":..,"tokens_per_s":..,"stddev":..}
#                         llama-bench's log: $LLAMA_CPP_DIR/bench/<name>.stderr.
#   all                   build, convert, then bench demo-target bf16 and f32.
#   -h, --help            this text.
#
# Environment: LLAMA_CPP_DIR (work dir, default target/llama-cpp), SPECD_PYTHON (default
# .venv/bin/python), LLAMA_CPP_PY_VERSION (default 0.3.36), JOBS (default 2), REPS (default 3),
# PP (default 256), THREADS (default "1 2"), OUTTYPES (default "f32 bf16").
# Idempotent: the download, unpack, configure, build and each conversion are skipped when done.
set -euo pipefail

cd "$(dirname "$0")/.."
DIR=${LLAMA_CPP_DIR:-target/llama-cpp}
PY=${SPECD_PYTHON:-.venv/bin/python}
VERSION=${LLAMA_CPP_PY_VERSION:-0.3.36}   # 0.3.36 is on PyPI (the newest when this was written)
JOBS=${JOBS:-2}
REPS=${REPS:-3}
PP=${PP:-256}
THREADS=${THREADS:-1 2}
OUTTYPES=${OUTTYPES:-f32 bf16}
SRC=$DIR/llama_cpp_python-$VERSION/vendor/llama.cpp
BUILD=$DIR/build
BIN=$BUILD/bin

usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }
log() { echo "== $*" >&2; }

build() {
  mkdir -p "$DIR"
  local sdist
  sdist=$(ls "$DIR"/llama_cpp_python-"$VERSION".tar.gz 2>/dev/null || true)
  if [ -z "$sdist" ]; then
    # --no-binary llama-cpp-python rather than :all:: pip prepares the sdist's metadata, which
    # installs its build backend (scikit-build-core, cmake, ninja) in an isolated env, and with
    # :all: it compiles cmake itself from source (tens of minutes). Only the sdist is kept.
    log "pip download llama-cpp-python==$VERSION (sdist)"
    "$PY" -m pip download --no-deps --no-binary llama-cpp-python -d "$DIR" "llama-cpp-python==$VERSION"
    sdist=$DIR/llama_cpp_python-$VERSION.tar.gz
  fi
  if [ ! -f "$SRC/CMakeLists.txt" ]; then
    log "unpack $sdist"
    tar -xzf "$sdist" -C "$DIR"
  fi
  [ -f "$SRC/CMakeLists.txt" ] || { echo "no vendored llama.cpp in $SRC" >&2; exit 1; }

  local cmake
  if command -v cmake >/dev/null; then
    cmake=$(command -v cmake)
  else
    cmake=$DIR/tools-venv/bin/cmake
    if [ ! -x "$cmake" ]; then
      log "cmake from PyPI into $DIR/tools-venv"
      "$PY" -m venv "$DIR/tools-venv"
      "$DIR/tools-venv/bin/python" -m pip install -q cmake
    fi
  fi

  if [ ! -f "$BUILD/CMakeCache.txt" ]; then
    log "configure ($cmake)"
    nice -n 19 "$cmake" -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
      -DGGML_NATIVE=ON -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DLLAMA_CURL=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=OFF \
      -DBUILD_SHARED_LIBS=OFF
  fi
  local targets=() t
  local have
  have=$("$cmake" --build "$BUILD" --target help 2>/dev/null || true)
  for t in llama-bench llama-cli llama-completion llama-simple llama-speculative llama-speculative-simple; do
    if grep -qE "(^|[ .])$t(\$|[ :])" <<<"$have"; then targets+=("$t"); else log "no target $t in this llama.cpp"; fi
  done
  log "build ${targets[*]} (nice -n 19, -j$JOBS)"
  local t0=$SECONDS
  nice -n 19 "$cmake" --build "$BUILD" --config Release -j "$JOBS" --target "${targets[@]}"
  log "build done in $((SECONDS - t0)) s; binaries in $BIN"
}

# The converter needs gguf (the vendored gguf-py, via PYTHONPATH; its own deps numpy, pyyaml,
# tqdm), torch, transformers, safetensors, and sentencepiece: the Llama converter imports it
# before looking for a tokenizer.model, even for a BPE tokenizer.json. Install only what is missing.
convert_deps() {
  local missing=() m
  for m in numpy torch transformers yaml tqdm tokenizers safetensors sentencepiece; do
    "$PY" -c "import $m" 2>/dev/null || missing+=("$m")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    missing=("${missing[@]/yaml/pyyaml}")
    log "pip install ${missing[*]} into $PY's environment"
    "$PY" -m pip install -q "${missing[@]}"
  fi
}

# The demo tokenizer is byte-level BPE with GPT-2's split regex (pre_tokenizer ByteLevel,
# use_regex true, no normalizer). convert_hf_to_gguf.py identifies a BPE pre-tokenizer by a
# hash of how it tokenizes a test text, and refuses hashes it has not been given
# ("BPE pre-tokenizer was not recognized"); its documented remedy is to add the model to
# convert_hf_to_gguf_update.py, which downloads reference tokenizers from the Hub (not
# reachable here). A hash is only the vocabulary's fingerprint: the pre-tokenizer itself is
# "gpt-2" (llama.cpp's LLAMA_VOCAB_PRE_TYPE_GPT2, the regex of ByteLevel use_regex=true).
# So, without editing the vendored converter, the wrapper below runs it with
# get_vocab_base_pre answering "gpt-2" when the original raises on an unknown hash, and only
# when tokenizer.json's pre_tokenizer is exactly that plain ByteLevel one.
CONVERT_WRAPPER='
import json, os, runpy, sys
conv = sys.argv[1]; sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(os.path.abspath(conv)))
from conversion import base
orig = base.TextModel.get_vocab_base_pre
def get_vocab_base_pre(self, tokenizer):
    try:
        return orig(self, tokenizer)
    except NotImplementedError:
        with open(os.path.join(self.dir_model, "tokenizer.json"), encoding="utf-8") as f:
            tj = json.load(f)
        pre = tj.get("pre_tokenizer") or {}
        if pre.get("type") == "ByteLevel" and pre.get("use_regex", True) and not tj.get("normalizer"):
            base.logger.warning("unknown BPE pre-tokenizer hash, but tokenizer.json has the plain GPT-2 ByteLevel pre-tokenizer: writing tokenizer.ggml.pre = gpt-2")
            return "gpt-2"
        raise
base.TextModel.get_vocab_base_pre = get_vocab_base_pre
runpy.run_path(conv, run_name="__main__")
'

convert_one() {
  local hf=$1 name=$2 t out
  for t in $OUTTYPES; do
    out=$DIR/gguf/$name-$t.gguf
    if [ -s "$out" ] && [ "$out" -nt "$hf/model.safetensors" ]; then log "have $out"; continue; fi
    log "convert $hf -> $out"
    PYTHONPATH="$SRC/gguf-py${PYTHONPATH:+:$PYTHONPATH}" \
      "$PY" -c "$CONVERT_WRAPPER" "$SRC/convert_hf_to_gguf.py" "$hf" --outtype "$t" --outfile "$out.tmp"
    mv "$out.tmp" "$out"
  done
}

convert() {
  [ -f "$SRC/convert_hf_to_gguf.py" ] || { echo "no $SRC/convert_hf_to_gguf.py: run '$0 build' first" >&2; exit 1; }
  mkdir -p "$DIR/gguf"
  convert_deps
  convert_one models/demo/target demo-target
  convert_one models/demo/draft demo-draft
  local hf
  for hf in "$@"; do convert_one "${hf%/}" "$(basename "${hf%/}")"; done
  ls -l "$DIR"/gguf/*.gguf
}

bench() {
  [ $# -gt 0 ] || { echo "bench: give one or more .gguf files" >&2; exit 2; }
  [ -x "$BIN/llama-bench" ] || { echo "no $BIN/llama-bench: run '$0 build' first" >&2; exit 1; }
  mkdir -p "$DIR/bench"
  grep -m1 'model name' /proc/cpuinfo || true
  # Other work on the machine skews the figures, the -t 2 ones most: show the load.
  echo "cpus: $(nproc), load average: $(cut -d' ' -f1-3 /proc/loadavg)"
  local g name err
  for g in "$@"; do
    [ -f "$g" ] || { echo "no such gguf: $g" >&2; exit 1; }
    name=$(basename "$g" .gguf)
    err=$DIR/bench/$name.stderr
    # The raw table (md) goes to stdout; the same results as JSON lines go to stderr, which
    # also holds llama-bench's log, so they are kept in $err and summarised below.
    "$BIN/llama-bench" -m "$g" -t "${THREADS// /,}" -p "$PP" -n 128 -r "$REPS" -o md -oe jsonl 2>"$err" \
      || { cat "$err" >&2; exit 1; }
    grep '^{' "$err" | "$PY" -c '
import json, re, sys
name = sys.argv[1]
m = re.search(r"-(f32|f16|bf16|q[0-9]\w*)$", name, re.I)
for line in sys.stdin:
    r = json.loads(line)
    test = "pp%d" % r["n_prompt"] if r["n_gen"] == 0 else "tg%d" % r["n_gen"]
    print(json.dumps({"model": name, "dtype": m.group(1).lower() if m else r.get("model_type", ""),
                      "threads": r["n_threads"], "test": test,
                      "tokens_per_s": round(r["avg_ts"], 1), "stddev": round(r["stddev_ts"], 1)},
                     separators=(",", ":")))
' "$name"
  done
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  build) build ;;
  convert) convert "$@" ;;
  bench) bench "$@" ;;
  all) build; convert "$@"; bench "$DIR/gguf/demo-target-bf16.gguf" "$DIR/gguf/demo-target-f32.gguf" ;;
  -h|--help|help) usage ;;
  *) usage >&2; exit 2 ;;
esac
