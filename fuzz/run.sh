#!/usr/bin/env bash
# Runs every fuzz target (or the ones named) for SECONDS each (default 60),
# one after another, niced, on the corpus in corpus/<target> (new inputs
# that reach new coverage are added there; minimize with
# `cargo +nightly fuzz cmin -a -s none <target>` before committing).
# A crash leaves its input in artifacts/<target>/; the script goes on with
# the next target and exits non-zero at the end, naming the targets that
# failed.
#
#   fuzz/run.sh [SECONDS] [TARGET...]
#
# Needs the nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`).
# Built with debug assertions (`-a`: an integer overflow is a crash) and
# without a sanitizer (`-s none`: the code under test is safe Rust, and
# AddressSanitizer would halve the executions on a small machine).
set -euo pipefail
cd "$(dirname "$0")"
seconds=${1:-60}
shift || true
if [ $# -gt 0 ]; then
    targets=("$@")
else
    mapfile -t targets < <(cargo +nightly fuzz list)
fi
flags=(-a -s none)
nice -n 19 cargo +nightly fuzz build "${flags[@]}"
failed=()
for target in "${targets[@]}"; do
    mkdir -p "corpus/$target"
    echo "=== $target: ${seconds}s"
    if ! nice -n 19 cargo +nightly fuzz run "${flags[@]}" "$target" "corpus/$target" -- \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
        -print_final_stats=1; then
        failed+=("$target")
    fi
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "failed: ${failed[*]} (inputs in fuzz/artifacts/<target>/)" >&2
    exit 1
fi
