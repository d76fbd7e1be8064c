#!/usr/bin/env bash
# kvpool developer entry point: installs the dependencies (Debian 12 packages), builds, and
#   ./scripts/dev.sh run    starts kvpoold in the foreground with the embedded defaults
#   ./scripts/dev.sh test   runs the whole test suite with ctest (after scripts/python_env.sh)
#   ./scripts/dev.sh build  only installs and builds
#   ./scripts/dev.sh package  builds the Debian packages (cpack -G DEB) into $BUILD_DIR
# Environment: BUILD_DIR (default build), CTEST_ARGS (extra ctest arguments, e.g. "-L unit"),
# KVPOOL_SKIP_INSTALL=1 to skip apt-get (dependencies already present).
set -euo pipefail

cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
JOBS=$(nproc)

# Debian 12 packages kvpool builds and tests with (see ../shared/BUILD-NOTES.md).
PACKAGES=(
  build-essential cmake ninja-build pkg-config
  libboost-dev libboost-system-dev libgflags-dev libgoogle-glog-dev librocksdb-dev
  libprotobuf-dev protobuf-compiler libssl-dev libxxhash-dev libabsl-dev nlohmann-json3-dev
  libsystemd-dev libgtest-dev libbenchmark-dev libyaml-cpp-dev
  libucx-dev ucx-utils libhiredis-dev redis-server etcd-server
  python3 python3-matplotlib python3-venv python3-dev python3-pip
)

install_deps() {
  if [[ "${KVPOOL_SKIP_INSTALL:-0}" == 1 ]]; then return; fi
  local missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]} == 0)); then
    echo "dev.sh: all ${#PACKAGES[@]} packages present"
    return
  fi
  echo "dev.sh: installing ${missing[*]}"
  local sudo=()
  if [[ $(id -u) != 0 ]]; then sudo=(sudo); fi
  "${sudo[@]}" apt-get update -q
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
}

build() {
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
  cmake --build "$BUILD_DIR" -j "$JOBS"
}

case "${1:-}" in
  run)
    install_deps
    build
    shift
    mkdir -p kvpool-data
    echo "dev.sh: starting kvpoold (Ctrl-C stops it; try '$BUILD_DIR/client/kvpool status' in another shell)"
    exec "$BUILD_DIR/daemon/kvpoold" --data_dir=kvpool-data "$@"
    ;;
  test)
    install_deps
    # The Python venvs (.venv/<name>, the kvpool wheel installed in each) that the python-labelled
    # tests run in; fast when nothing changed. Their requirements (GBs of downloads: torch, the
    # engines) install while the C++ tree builds; the wheel and its installs follow the build.
    mkdir -p "$BUILD_DIR"
    scripts/python_env.sh --requirements-only >"$BUILD_DIR/python_env.log" 2>&1 &
    requirements_pid=$!
    build
    if ! wait "$requirements_pid"; then
      cat "$BUILD_DIR/python_env.log"
      echo "dev.sh: installing the Python requirements failed (log above)" >&2
      exit 1
    fi
    cat "$BUILD_DIR/python_env.log"
    scripts/python_env.sh
    # Integration tests start their own daemons on temp dirs: safe to run two at a time.
    # shellcheck disable=SC2086
    ctest --test-dir "$BUILD_DIR" --output-on-failure -j 2 ${CTEST_ARGS:-}
    ;;
  build)
    install_deps
    build
    ;;
  package)
    # The Debian packages (kvpool, libkvpool0, libkvpool-dev) into $BUILD_DIR; see README "Install".
    install_deps
    build
    (cd "$BUILD_DIR" && cpack -G DEB)
    ls "$BUILD_DIR"/*.deb
    ;;
  *)
    echo "usage: $0 run [kvpoold flags] | test | build | package" >&2
    exit 2
    ;;
esac
