#!/usr/bin/env bash
# `make fuzz`: builds the libFuzzer targets (tests/fuzz/fuzz_documents.cc) with clang, ASan and
# UBSan in build-fuzz/, then runs each for FUZZ_SECONDS (default 60) from a seed corpus:
# examples/, presets/, reproductions/, tests/data/, tests/fuzz/seeds/ and, when present, the published PipeDream
# profiles ($HYBRIDPLAN_PIPEDREAM_PROFILES or ../shared/data/pipedream-profiles).
# Prints executions/s, total runs and findings per target; exits 1 if any target found something
# (its reproducer is in build-fuzz/artifacts/; rerun it with `build-fuzz/bin/fuzz_<t> <file>`).
# Usage: scripts/fuzz.sh [target ...]   targets: graph cluster job plan pipedream (default: all)
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZ_SECONDS=${FUZZ_SECONDS:-60}
JOBS=${JOBS:-2}
BUILD=build-fuzz
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(graph cluster job plan pipedream)

CXX_CLANG=${FUZZ_CXX:-$(command -v clang++ || true)}
if [ -z "$CXX_CLANG" ]; then
  echo "fuzz: clang++ not found (Debian: apt-get install clang, or HYBRIDPLAN_FUZZ_DEPS=1 scripts/install-deps.sh)" >&2
  exit 2
fi
if [ ! -f "$BUILD/build.ninja" ]; then
  CXX="$CXX_CLANG" cmake -S . -B "$BUILD" -G Ninja -DHYBRIDPLAN_FUZZ=ON -DHYBRIDPLAN_WITH_TORCH=OFF \
    -DHYBRIDPLAN_BUILD_PYTHON=OFF -DHYBRIDPLAN_BUILD_TESTS=OFF >/dev/null
fi
cmake --build "$BUILD" -j "$JOBS" --target "${targets[@]/#/fuzz_}"

profiles=${HYBRIDPLAN_PIPEDREAM_PROFILES:-../shared/data/pipedream-profiles}
json_seeds=(examples presets reproductions tests/data)
mkdir -p "$BUILD/artifacts"
summary="$BUILD/summary.txt"
printf '%-10s %8s %10s %10s %8s  %s\n' target seconds runs execs/s corpus findings | tee "$summary"
failed=0
for t in "${targets[@]}"; do
  corpus="$BUILD/corpus/$t"     # grows across runs; libFuzzer writes new inputs here only
  mkdir -p "$corpus"
  seeds=()
  dict=tests/fuzz/json.dict
  case "$t" in
    pipedream)
      dict=tests/fuzz/pipedream.dict
      seeds=(tests/fuzz/seeds/pipedream)
      [ -d "$profiles" ] && seeds+=("$profiles") ;;
    plan) seeds=(tests/fuzz/seeds/plan "${json_seeds[@]}") ;;
    *) seeds=("${json_seeds[@]}") ;;
  esac
  log="$BUILD/fuzz_$t.log"
  # -timeout: one input taking > 10 s is a hang (a finding); -rss_limit_mb: a memory blow-up is
  # one too; -max_len 65536 lets the largest seed (inception_v3, 64 KB) in whole.
  set +e
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$BUILD/bin/fuzz_$t" -max_total_time="$FUZZ_SECONDS" -timeout=10 -rss_limit_mb=2048 \
    -max_len=65536 -dict="$dict" -print_final_stats=1 -artifact_prefix="$BUILD/artifacts/$t-" \
    "$corpus" "${seeds[@]}" >"$log" 2>&1
  rc=$?
  set -e
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  files=$(find "$corpus" -type f | wc -l)
  finding="none"
  if [ "$rc" -ne 0 ]; then
    failed=1
    finding="rc=$rc: $(grep -m1 -E 'ERROR: |FUZZ FINDING|runtime error|Test unit written' "$log" || echo "see $log")"
  fi
  printf '%-10s %8s %10s %10s %8s  %s\n' "$t" "$FUZZ_SECONDS" "${runs:-?}" "${rate:-?}" "$files" "$finding" | tee -a "$summary"
done
[ "$failed" -eq 0 ] || { echo "fuzz: findings above; logs in $BUILD/fuzz_<target>.log" >&2; exit 1; }
