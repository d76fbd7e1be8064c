#!/usr/bin/env bash
# Python environments for kvpool's tests and benches.
#
#   scripts/python_env.sh [--requirements-only] [name...]
#                                       default: every python/requirements/<name>.txt
#
# --requirements-only stops after the requirements (the network-bound part, which needs no
# wheel), so it can run while the C++ tree builds (scripts/dev.sh test does).
#
# Builds the kvpool wheel once (pip wheel ./python -> build/wheels; the extension's CMake build
# directory build/python/<wheel tag> persists, so a rebuild is incremental) and, for each name,
# makes .venv/<name> (python3 -m venv), installs python/requirements/<name>.txt, then the optional
# python/requirements/<name>.nodeps.txt with `pip install --no-deps` (for a package whose declared
# deps are not wanted, e.g. an engine installed only for one interface module), and then the
# wheel itself: a plain install, not an editable one, which proves the package works in a fresh
# venv with nothing else from the build tree. Idempotent: the wheel is rebuilt only when a
# source it is built from changed, a venv reinstalls only what changed (pip's cache does the
# rest).
#
# Environment: PYTHON (default python3), KVPOOL_WITH_CUDA (AUTO, ON, OFF; passed to the build),
# KVPOOL_PIP_ARGS (extra pip install arguments, e.g. an index URL).
# To add a venv: write python/requirements/<name>.txt (pinned versions), run this script with
# <name>, and register its tests in tests/python.cmake (kvpool_add_pytest ... VENV <name>).
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
PYTHON=${PYTHON:-python3}
REQUIREMENTS_ONLY=0
if [[ ${1:-} == --requirements-only ]]; then
  REQUIREMENTS_ONLY=1
  shift
fi
WHEEL_DIR=$ROOT/build/wheels
LOCK=/tmp/kvpool-build.lock
read -r -a PIP_ARGS <<<"${KVPOOL_PIP_ARGS:-}"

log() { echo "python_env.sh: $*"; }
die() { echo "python_env.sh: $*" >&2; exit 1; }

if (($# == 0)); then
  set --
  for f in python/requirements/*.txt; do
    [[ $f == *.nodeps.txt ]] || set -- "$@" "$(basename "$f" .txt)"
  done
fi
for name in "$@"; do
  [[ -f python/requirements/$name.txt ]] || die "no python/requirements/$name.txt"
done

"$PYTHON" -c 'import venv, ensurepip' 2>/dev/null ||
  die "$PYTHON cannot make venvs (Debian: apt-get install python3-venv)"

# Most venvs carry the same torch and nvidia-* wheels (~5 GB each); installed side by side they
# filled a CI machine's disk. After each install, identical files in the venvs' lib/ trees become
# hard links (util-linux hardlink). pip replaces a file by unlinking it or renaming a new one over
# it, never by writing into it, so a later install in one venv leaves the others whole. Only lib/:
# this script's own stamp files beside it are rewritten in place (and written by write_stamp,
# through a rename, in any case). Mode and owner must still match; times may not.
dedupe_venvs() {
  if ! command -v hardlink >/dev/null; then
    log "no hardlink (Debian: util-linux >= 2.38): venvs keep their own copies of shared files"
    return
  fi
  local summary
  if ! summary=$(hardlink --ignore-time "$ROOT"/.venv/*/lib 2>&1); then
    log "hardlink failed; venvs keep their own copies of shared files: $summary"
    return
  fi
  log ".venv: $(grep -E '^(Linked|Saved):' <<<"$summary" | tr -s ' ' | paste -sd ';' -)"
}

# Writes a stamp file through a rename, never into a file that may have other names.
write_stamp() {
  echo "$2" >"$1.tmp"
  mv -f "$1.tmp" "$1"
}

# --- one venv per requirements file (first: it needs the network, not the wheel) ------------
for name in "$@"; do
  venv=$ROOT/.venv/$name
  req=python/requirements/$name.txt
  t0=$(date +%s)
  if [[ ! -x $venv/bin/python ]]; then
    log "creating $venv"
    "$PYTHON" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip "${PIP_ARGS[@]}"
  fi
  nodeps=python/requirements/$name.nodeps.txt
  req_hash=$(cat "$req" $([[ -f $nodeps ]] && echo "$nodeps") | sha256sum | cut -d' ' -f1)
  if [[ $(cat "$venv/.kvpool-requirements.sha256" 2>/dev/null) != "$req_hash" ]]; then
    log "$name: installing $req"
    "$venv/bin/python" -m pip install -q -r "$req" "${PIP_ARGS[@]}"
    if [[ -f $nodeps ]]; then
      log "$name: installing $nodeps (--no-deps)"
      "$venv/bin/python" -m pip install -q --no-deps -r "$nodeps" "${PIP_ARGS[@]}"
    fi
    write_stamp "$venv/.kvpool-requirements.sha256" "$req_hash"
    dedupe_venvs
  fi
  log "$name: requirements ready in $(($(date +%s) - t0)) s"
done
((REQUIREMENTS_ONLY)) && exit 0

# --- the wheel, once -------------------------------------------------------------------------
# Everything the wheel is built from: the package, and the C++ it bundles.
src_hash() {
  git ls-files -z -c -o --exclude-standard -- python include common kernels transport client \
    cmake CMakeLists.txt ':!python/tests' |
    sort -z | xargs -0 sha256sum 2>/dev/null | sha256sum | cut -d' ' -f1
}
mkdir -p "$WHEEL_DIR"
stamp=$WHEEL_DIR/.kvpool-src.sha256
want=$(src_hash)-${KVPOOL_WITH_CUDA:-AUTO}-$("$PYTHON" -c 'import sys; print(sys.implementation.cache_tag)')
wheel=$(ls -t "$WHEEL_DIR"/kvpool-*.whl 2>/dev/null | head -1 || true)
if [[ -n $wheel && -f $stamp && $(cat "$stamp") == "$want" ]]; then
  log "wheel up to date: $wheel"
else
  log "building the wheel (waits for $LOCK while another build runs)"
  t0=$(date +%s)
  rm -f "$WHEEL_DIR"/kvpool-*.whl
  flock "$LOCK" "$PYTHON" -m pip wheel ./python -w "$WHEEL_DIR" --no-deps -q "${PIP_ARGS[@]}"
  wheel=$(ls -t "$WHEEL_DIR"/kvpool-*.whl | head -1)
  echo "$want" >"$stamp"
  log "built $wheel in $(($(date +%s) - t0)) s"
fi
wheel_hash=$(sha256sum "$wheel" | cut -d' ' -f1)

# --- the wheel into each venv ------------------------------------------------------------------
for name in "$@"; do
  venv=$ROOT/.venv/$name
  t0=$(date +%s)
  if [[ $(cat "$venv/.kvpool-wheel.sha256" 2>/dev/null) != "$wheel_hash" ]]; then
    log "$name: installing $(basename "$wheel")"
    "$venv/bin/python" -m pip install -q --force-reinstall --no-deps "$wheel" "${PIP_ARGS[@]}"
    write_stamp "$venv/.kvpool-wheel.sha256" "$wheel_hash"
  fi
  # The proof: kvpool imports from the venv's site-packages, not from the source tree.
  (cd / && "$venv/bin/python" -c 'import kvpool, kvpool.kernels, sys
assert "site-packages" in kvpool.__file__, kvpool.__file__
print("python_env.sh: '"$name"': kvpool", kvpool.__version__, "from", kvpool.__file__)')
  log "$name ready in $(($(date +%s) - t0)) s: $venv"
done
