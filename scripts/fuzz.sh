#!/usr/bin/env bash
# The fuzz targets (fuzz/, docs in fuzz/README.md) on the stable toolchain: cargo-fuzz with
# `-s none` needs no nightly (only its sanitizers do, through -Zsanitizer).
#
#   scripts/fuzz.sh build              install cargo-fuzz if missing, build every target
#   scripts/fuzz.sh run [SECONDS]      build, then fuzz every target in turn for SECONDS in all
#                                      (default 60, split evenly); fails on the first crash
#   scripts/fuzz.sh run SECONDS TARGET one target for SECONDS
#
# Each target starts from its committed seeds (fuzz/seeds/TARGET, read only) and grows a corpus
# in fuzz/corpus/TARGET (ignored by git), which later runs start from too. A crash leaves its
# input in fuzz/artifacts/TARGET/; `cargo fuzz run -s none TARGET THAT_FILE` replays it.
set -euo pipefail
cd "$(dirname "$0")/.."

CARGO_FUZZ_VERSION=0.13.2
TARGETS=(http_body grpc_request node_messages)

install() {
    if [[ "$(cargo fuzz --version 2>/dev/null)" != "cargo-fuzz $CARGO_FUZZ_VERSION" ]]; then
        cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked
    fi
}

build() {
    install
    # The fuzz crate's own Cargo.lock is committed, with the workspace's versions; cargo fuzz
    # cannot pass --locked on, so a lock that would change fails here first.
    cargo metadata --locked --format-version 1 --manifest-path fuzz/Cargo.toml >/dev/null
    (cd fuzz && cargo fuzz build -s none)
}

run_target() {
    local target=$1 seconds=$2
    local dict=()
    [[ -f fuzz/$target.dict ]] && dict=("-dict=$target.dict")
    mkdir -p "fuzz/corpus/$target"
    echo "fuzz: $target for ${seconds}s"
    # One job; -timeout: an input that takes over 10 s is a hang, reported as a crash.
    (cd fuzz && cargo fuzz run -s none "$target" "corpus/$target" "seeds/$target" -- \
        -max_total_time="$seconds" -timeout=10 -print_final_stats=1 "${dict[@]}")
}

case "${1:-}" in
    build)
        build
        ;;
    run)
        seconds=${2:-60}
        build
        if [[ -n "${3:-}" ]]; then
            run_target "$3" "$seconds"
        else
            each=$((seconds / ${#TARGETS[@]}))
            ((each >= 1)) || { echo "fuzz: $seconds s is under a second per target" >&2; exit 2; }
            for target in "${TARGETS[@]}"; do
                run_target "$target" "$each"
            done
        fi
        ;;
    *)
        sed -n '2,12p' "$0" >&2
        exit 2
        ;;
esac
