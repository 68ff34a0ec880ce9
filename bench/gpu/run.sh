#!/usr/bin/env bash
# Predicted vs measured on a machine with one CUDA GPU, in one script of a few minutes:
#   1. builds the planner (hybridplan._C and the CLI) against that machine's Python and torch;
#   2. profiles the built-in models on CUDA (node sums vs whole steps, bench/gpu/profile_cuda.py)
#      and branchy_cnn with its batch curve for planning;
#   3. calibrates the machine at world size 1 with NCCL (python -m hybridplan calibrate);
#   4. validates data-parallel plans of branchy_cnn at per-replica batches 16..256 on the GPU
#      (python -m hybridplan validate: predicted beside measured per term, peak memory);
#   5. compares the fake profile priced for this GPU (its device model from from_config's
#      table) with a real profile, node by node (bench/bench_fake_profile.py);
# and writes everything to $OUT (or out/gpu): results.md (with date and device), the graph,
# the calibrated cluster and validate.json.
#   bash bench/gpu/prepare.sh                      # here first: the headers it carries
#   run: bash bench/gpu/run.sh   carry: [".gpu-deps"]
# HYBRIDPLAN_GPU_DRY_RUN=1 runs the same steps on the CPU (to check the script without a GPU).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT_DIR=${OUT:-out/gpu}
mkdir -p "$OUT_DIR"
PY=${PYTHON:-python3}
DRY=${HYBRIDPLAN_GPU_DRY_RUN:-0}
DEVICE=cuda
[ "$DRY" = 1 ] && DEVICE=cpu
LOG="$OUT_DIR/run.log"
exec > >(tee "$LOG") 2>&1
started=$(date +%s)
echo "== $(date -u '+%Y-%m-%d %H:%M UTC') on $(hostname)"
"$PY" - <<'PY'
import torch
print("torch", torch.__version__, "cuda", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")
PY
if [ "$DRY" != 1 ] && ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "SKIPPED: no CUDA device here (HYBRIDPLAN_GPU_DRY_RUN=1 runs the steps on the CPU)"
  exit 0
fi

echo "== 1. build the planner against this torch"
BUILD=build-gpu
PREFIX="$PWD/.gpu-deps;$("$PY" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')"
[ -f "$BUILD/build.ninja" ] || cmake -S . -B "$BUILD" -G Ninja -DHYBRIDPLAN_WITH_TORCH=OFF \
  -DHYBRIDPLAN_BUILD_TESTS=OFF -DCMAKE_PREFIX_PATH="$PREFIX" \
  -DPython3_EXECUTABLE="$(command -v "$PY")" > "$OUT_DIR/cmake.log"
cmake --build "$BUILD" -j "$(nproc)" --target _C hybridplan > "$OUT_DIR/build.log"
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
export HYBRIDPLAN_CLI="$PWD/$BUILD/bin/hybridplan"

echo "== 2. profile on $DEVICE"
"$PY" bench/gpu/profile_cuda.py --batch 64 --repeats 20 --out-dir "$OUT_DIR"
"$PY" -m hybridplan profile hybridplan.models:branchy_cnn --batch-size 256 --device "$DEVICE" \
  --repeats 20 --quiet --out "$OUT_DIR/branchy_cnn.graph.json"

echo "== 3. calibrate (world size 1)"
"$PY" -m torch.distributed.run --standalone --nproc-per-node 1 -m hybridplan calibrate \
  --graph "$OUT_DIR/branchy_cnn.graph.json" --batch 64 --repeats 20 \
  --out "$OUT_DIR/cluster.json"

echo "== 4. validate data-parallel plans at several batches"
cat > "$OUT_DIR/job.json" <<'JSON'
{"schema_version": 1, "kind": "hybridplan.job", "per_replica_batch": [16, 32, 64, 128, 256]}
JSON
"$PY" -m hybridplan validate --graph "$OUT_DIR/branchy_cnn.graph.json" \
  --cluster "$OUT_DIR/cluster.json" --job "$OUT_DIR/job.json" \
  --model hybridplan.models:branchy_cnn --devices 1 --plans 5 --steps 30 --warmup 10 \
  --out-dir "$OUT_DIR" > "$OUT_DIR/validate-table.md"

echo "== 5. fake profile (device model) vs real profile"
FAKE_MODEL=auto
[ "$DRY" = 1 ] && FAKE_MODEL=cpu
"$PY" bench/bench_fake_profile.py --device "$DEVICE" --device-model "$FAKE_MODEL" \
  --batch 64 --repeats 20 > "$OUT_DIR/fake-profile.md"

{
  echo "# hybridplan on $( [ "$DRY" = 1 ] && echo "CPU (dry run)" || "$PY" -c 'import torch; print(torch.cuda.get_device_name(0))')"
  echo
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(hostname), torch $("$PY" -c 'import torch; print(torch.__version__)'), $(( $(date +%s) - started )) s (bench/gpu/run.sh)"
  echo
  cat "$OUT_DIR/validate-table.md"
  echo
  echo "## Fake profile vs real profile"
  echo
  cat "$OUT_DIR/fake-profile.md"
} > "$OUT_DIR/results.md"
cat "$OUT_DIR/results.md"
