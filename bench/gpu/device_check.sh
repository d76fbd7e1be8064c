#!/usr/bin/env bash
# bench/gpu/device_check.sh: the GPU side of kvpool's kernels, in one run (target < 8 minutes).
#
# 1. Builds kernels/ with CUDA (-DKVPOOL_KERNELS_ONLY=ON: needs only CMake, nvcc and a C++20
#    compiler; no RocksDB, UCX, Boost or GoogleTest) for the card's own architecture.
# 2. Runs kvpool-kernel-check: every CUDA kernel against its CPU twin on fresh random inputs of
#    several shapes (copies byte exact; quantize bit exact, its padding included; dequantize
#    within 1e-6 relative, expected bit exact; scores within 1e-4 relative; selection identical to the twin's on the same scores;
#    outputs poisoned twice so an unwritten byte shows; no NaN), then times each kernel with CUDA
#    events (median after warm-up) beside a device-to-device copy of the same bytes.
# 3. Runs kvpool-device-copy-check: the client's device-buffer copies (kernels/device_copy.h)
#    between device memory and a registered shared mapping, as a same-node client maps the host
#    arena, checked byte exact and timed beside cudaMemcpyAsync from cudaMallocHost memory.
# 4. Where bench/gpu/bundle.sh packed .gpu-bundle/ (kvpoold and kvpool-gpu-tier-check built
#    here with their shared libraries; the GPU machine cannot build the daemon), runs
#    kvpool-gpu-tier-check: kvpoold's gpu tier end to end (a put from device memory placed in
#    the gpu tier, gets device to device by CUDA IPC beside cudaMemcpy D2D, gets from the host
#    arena beside cudaMemcpy H2D from cudaMallocHost, device views borrowed, a second process
#    reading by CUDA IPC; with a second GPU that reaches the first, a get onto it peer to peer
#    beside cudaMemcpy between the two), every block checked byte for byte.
# 5. Where the bundle holds nccl_link_test (transport/nccl_link.h, built with NCCL), runs it
#    with the machine's own libnccl: a single-rank link sending blocks to itself (bytes
#    compared), a transfer nobody completes aborted by its deadline and a new link working after
#    it, and two ranks (on one GPU NCCL is expected to refuse them by their deadline: two ranks
#    need two GPUs). kvpoold's daemon-to-daemon gpu links (daemon/gpu_links.h, --nccl) run on
#    these links; between two daemons they need two GPUs.
# 6. Prints the short tables last: paste them into docs/BENCHMARKS.md with the date and the card.
# With the bundle's checks to run too, the kernel check runs its --quick shapes. A failed build
# skips steps 2-3 only.
#
# Usage: bench/gpu/device_check.sh [--quick] [kvpool-kernel-check flags]
# Env:   KVPOOL_GPU_BUILD_DIR (default /tmp/kvpool-gpu-check), CUDA_ARCH (default: the card's),
#        OUT (if set, the logs and table are written there as the checks run),
#        KVPOOL_REQUIRE_GPU_BUNDLE=1 (a missing .gpu-bundle fails the run instead of skipping
#        its check).
# Exit:  0 all checks pass, 1 a check failed, 2 build or device problem.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${KVPOOL_GPU_BUILD_DIR:-/tmp/kvpool-gpu-check}"
START=$SECONDS
LIMIT=480  # seconds for the whole run

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "device_check: no NVIDIA GPU visible (nvidia-smi failed)" >&2
  exit 2
fi
CARD="$(nvidia-smi --query-gpu=name,memory.total,driver_version,compute_mode --format=csv,noheader | head -1)"
ARCH="${CUDA_ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')}"
NVCC="$(command -v nvcc || true)"
[ -z "$NVCC" ] && [ -x /usr/local/cuda/bin/nvcc ] && NVCC=/usr/local/cuda/bin/nvcc
echo "device_check: $(date -u +%Y-%m-%dT%H:%MZ) card: $CARD (sm_$ARCH), nvcc: $([ -n "$NVCC" ] && "$NVCC" --version | tail -1)"

mkdir -p "$BUILD"
BUNDLE="$ROOT/.gpu-bundle"
# Logs go where they come back (OUT) as they are written: a run cut off by the device call's
# limit still returns everything it printed.
LOGS="$BUILD"
if [ -n "${OUT:-}" ] && [ -d "${OUT}" ]; then LOGS="$OUT"; fi
# Seconds kept for the checks after the kernel check.
COPY_SECONDS=100
TIER_SECONDS=120
NCCL_SECONDS=60
LATER=$COPY_SECONDS
[ -f "$BUNDLE/bin/kvpool-gpu-tier-check" ] && LATER=$((LATER + TIER_SECONDS))
[ -f "$BUNDLE/bin/nccl_link_test" ] && LATER=$((LATER + NCCL_SECONDS))
KERNEL_ARGS=("$@")
# With the bundle's checks to run as well, the kernel check runs its quick shapes (the same
# checks, smaller timed sizes), so that everything fits the run's 8 minutes.
if [ "$LATER" -gt "$COPY_SECONDS" ] && [[ " $* " != *" --quick "* ]]; then
  KERNEL_ARGS=(--quick "$@")
fi

# A build that fails skips the kernel and copy checks, not the bundle's (they need no build).
RC=0
COPY_RC=-1
BUILT=0
LOG="$LOGS/kernel_check.log"
COPY_LOG="$LOGS/device_copy_check.log"
GEN=()
command -v ninja >/dev/null 2>&1 && GEN=(-G Ninja)
if [ -z "$NVCC" ]; then
  echo "device_check: nvcc not found (PATH or /usr/local/cuda/bin)" | tee "$LOG" >&2
elif ! cmake -S "$ROOT" -B "$BUILD" "${GEN[@]}" -DKVPOOL_KERNELS_ONLY=ON -DKVPOOL_WITH_CUDA=ON \
    -DKVPOOL_BUILD_TESTS=OFF -DKVPOOL_BUILD_BENCH=OFF -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_COMPILER="$NVCC" -DCMAKE_CUDA_ARCHITECTURES="$ARCH" >"$BUILD.cmake.log" 2>&1; then
  cp "$BUILD.cmake.log" "$LOGS"/ 2>/dev/null
  tail -50 "$BUILD.cmake.log" >&2
  echo "device_check: cmake configure failed" | tee "$LOG" >&2
elif ! cmake --build "$BUILD" -j"$(nproc)" --target kvpool-kernel-check kvpool-device-copy-check \
    >"$BUILD.build.log" 2>&1; then
  cp "$BUILD.build.log" "$LOGS"/ 2>/dev/null
  tail -50 "$BUILD.build.log" >&2
  echo "device_check: build failed" | tee "$LOG" >&2
else
  BUILT=1
  echo "device_check: built in $((SECONDS - START)) s"
fi

if [ "$BUILT" = 1 ]; then
  REMAINING=$((LIMIT - (SECONDS - START) - LATER))
  [ "$REMAINING" -lt 60 ] && REMAINING=60
  timeout "$REMAINING" "$BUILD/kernels/kvpool-kernel-check" "${KERNEL_ARGS[@]}" 2>&1 | tee "$LOG"
  RC=${PIPESTATUS[0]}
  if [ "$RC" -eq 124 ]; then
    echo "device_check: kvpool-kernel-check timed out after ${REMAINING} s" >&2
  fi
  timeout "$COPY_SECONDS" "$BUILD/kernels/kvpool-device-copy-check" 2>&1 | tee "$COPY_LOG"
  COPY_RC=${PIPESTATUS[0]}
  [ "$COPY_RC" -eq 124 ] && echo "device_check: kvpool-device-copy-check timed out after ${COPY_SECONDS} s" >&2
  # 0 passed, 1 a check failed; a timeout or a crash is a device problem (2).
  [ "$RC" -gt 1 ] && RC=2
  [ "$COPY_RC" -gt 1 ] && COPY_RC=2
else
  RC=2
  echo "device_check: not built: the copy check is skipped" >"$COPY_LOG"
fi

# The gpu tier check: it needs only the bundle.
TIER_LOG="$LOGS/gpu_tier_check.log"
TIER_RC=-1
if [ -f "$BUNDLE/bin/kvpool-gpu-tier-check" ]; then
  chmod +x "$BUNDLE"/bin/* 2>/dev/null || true
  echo "device_check: gpu tier check from .gpu-bundle built at $(cat "$BUNDLE/COMMIT" 2>/dev/null || echo '?')"
  LD_LIBRARY_PATH="$BUNDLE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" timeout "$TIER_SECONDS" \
    "$BUNDLE/bin/kvpool-gpu-tier-check" --kvpoold="$BUNDLE/bin/kvpoold" 2>&1 | tee "$TIER_LOG"
  TIER_RC=${PIPESTATUS[0]}
  [ "$TIER_RC" -eq 124 ] && echo "device_check: kvpool-gpu-tier-check timed out after ${TIER_SECONDS} s" >&2
  # 0 passed, 1 a check failed; anything else (no device, timeout, loader, no daemon) is a
  # setup problem.
  [ "$TIER_RC" -gt 1 ] && TIER_RC=2
else
  echo "device_check: no .gpu-bundle (run bench/gpu/bundle.sh where kvpoold builds, and carry it): the gpu tier check is skipped" | tee "$TIER_LOG"
  [ "${KVPOOL_REQUIRE_GPU_BUNDLE:-0}" = 1 ] && TIER_RC=2
fi

# The NCCL link's test, with this machine's libnccl (the bundle leaves it out: ~200 MB).
NCCL_LOG="$LOGS/nccl_link_test.log"
NCCL_RC=-1
if [ -f "$BUNDLE/bin/nccl_link_test" ]; then
  NCCL_DIR=""
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu \
    $(python3 -c 'import nvidia.nccl, os; print(os.path.join(nvidia.nccl.__path__[0], "lib"))' 2>/dev/null); do
    if [ -e "$d/libnccl.so.2" ]; then NCCL_DIR="$d"; break; fi
  done
  if [ -z "$NCCL_DIR" ]; then
    echo "device_check: no libnccl.so.2 on this machine: the NCCL link test is skipped" | tee "$NCCL_LOG"
  else
    echo "device_check: nccl_link_test with $NCCL_DIR/libnccl.so.2"
    LD_LIBRARY_PATH="$BUNDLE/lib:$NCCL_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" timeout "$NCCL_SECONDS" \
      "$BUNDLE/bin/nccl_link_test" 2>&1 | tee "$NCCL_LOG"
    NCCL_RC=${PIPESTATUS[0]}
    [ "$NCCL_RC" -eq 124 ] && echo "device_check: nccl_link_test timed out after ${NCCL_SECONDS} s" >&2
    [ "$NCCL_RC" -gt 1 ] && NCCL_RC=2
  fi
else
  echo "device_check: no nccl_link_test in .gpu-bundle: the NCCL link test is skipped" | tee "$NCCL_LOG"
fi

[ "$RC" -eq 0 ] && RC=$COPY_RC
[ "$RC" -eq 0 ] && [ "$TIER_RC" -gt 0 ] && RC=$TIER_RC
[ "$RC" -eq 0 ] && [ "$NCCL_RC" -gt 0 ] && RC=$NCCL_RC

TABLE="$LOGS/kernel_check_table.md"
{
  echo
  echo "GPU kernels, $(date -u +%Y-%m-%d), $CARD, sm_$ARCH (bench/gpu/device_check.sh; ratio = kernel / D2D copy bandwidth, both counting bytes read + written)"
  echo
  grep '^|' "$LOG"
  grep '^RESULT' "$LOG" || echo "RESULT: INCOMPLETE (exit $RC)"
  echo
  echo "Client device-buffer copies (kvpool-device-copy-check; ratio = copy / the same copy from cudaMallocHost memory)"
  echo
  grep '^|' "$COPY_LOG"
  grep '^RESULT' "$COPY_LOG" || echo "RESULT: INCOMPLETE (exit $COPY_RC)"
  echo
  echo "kvpoold's gpu tier end to end (kvpool-gpu-tier-check from .gpu-bundle)"
  echo
  grep '^|' "$TIER_LOG" || true
  grep '^RESULT' "$TIER_LOG" || echo "RESULT: NOT RUN or INCOMPLETE (exit $TIER_RC)"
  echo
  echo "NCCL link (nccl_link_test from .gpu-bundle, exit $NCCL_RC; -1: not run)"
  echo
  grep -E '^\[ +(OK|FAILED|SKIPPED) +\]|^one GPU:|^no libnccl|^device_check: no nccl' "$NCCL_LOG" || true
} >"$TABLE"
[ "$BUILT" = 1 ] && [ "$LOGS" != "$BUILD" ] && cp "$BUILD.build.log" "$LOGS"/ 2>/dev/null
echo "device_check: finished in $((SECONDS - START)) s, exit $RC"
cat "$TABLE"
exit "$RC"
