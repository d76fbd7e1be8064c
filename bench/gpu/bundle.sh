#!/usr/bin/env bash
# bench/gpu/bundle.sh: packs what bench/gpu/device_check.sh needs to run kvpoold's gpu tier on a
# GPU machine that cannot build it (no RocksDB, UCX, Boost or protobuf there): kvpoold and
# kvpool-gpu-tier-check from a CUDA build of this tree, stripped, with the shared libraries they
# load that are not part of the C runtime, and UCX's transport modules; and nccl_link_test
# (transport/nccl_link.h) where this build has NCCL. libnccl itself (~200 MB) is left out: the
# device check uses the GPU machine's own.
#
# Usage: bench/gpu/bundle.sh [BUILD_DIR (default: build)]
# Writes <repo>/.gpu-bundle/{bin,lib} (git-ignored). Pass it along to the GPU machine (the device
# tool's `carry`); device_check.sh finds it there and runs the check with it.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${1:-$ROOT/build}"
OUT="$ROOT/.gpu-bundle"

BINARIES=(daemon/kvpoold bench/kvpool-gpu-tier-check)
TARGETS=(kvpoold kvpool_gpu_tier_check)
if grep -q "nccl_link_test" <<<"$(cmake --build "$BUILD" --target help 2>/dev/null)"; then
  BINARIES+=(transport/nccl_link_test)
  TARGETS+=(nccl_link_test)
fi
cmake --build "$BUILD" --target "${TARGETS[@]}" >/dev/null
rm -rf "$OUT"
mkdir -p "$OUT/bin" "$OUT/lib"
for b in "${BINARIES[@]}"; do
  strip -o "$OUT/bin/$(basename "$b")" "$BUILD/$b"
done

# The C runtime (glibc, libstdc++, libgcc) stays the machine's own, which must be as new as this
# one's; so does the GPU driver's libcuda.
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libstdc\+\+|libgcc_s|libcuda\.so|libnccl\.so)'
missing="$(for b in "$OUT"/bin/*; do ldd "$b"; done | awk '/not found/ {print $1}' |
  grep -Ev '^(libcuda|libnccl)\.so' || true)"
if [ -n "$missing" ]; then
  echo "bundle.sh: libraries not found here: $missing" >&2
  exit 1
fi
for b in "$OUT"/bin/*; do
  ldd "$b" | awk '$3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  if [[ ! "$name" =~ $skip ]]; then cp -L "$path" "$OUT/lib/$name"; fi
done
# libucs loads its transports (libuct_*.so.0, ...) from ucx/ beside itself.
UCX_MODULES="$(dirname "$(ldconfig -p | awk '/libucs.so.0 /{print $NF; exit}')")/ucx"
if [ -d "$UCX_MODULES" ]; then
  mkdir -p "$OUT/lib/ucx"
  cp -L "$UCX_MODULES"/*.so.0 "$OUT/lib/ucx/"
fi
echo "$(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet HEAD -- . ':!.gpu-bundle' || echo -dirty)" >"$OUT/COMMIT"
du -sh "$OUT"
