#!/usr/bin/env bash
# One-command, idempotent, non-interactive set-up of everything the project needs:
#   Open MPI (Debian packages), .venv (Python 3.11) with torch 2.13.0 (CPU) and the
#   project in editable mode with its extras (examples, dev, lightning), and Horovod
#   0.28.1 built from its sdist with the C++17 patch into a wheel cached outside the
#   repository; as root, openssh-server and iproute2 for the multi-host test tier,
#   Slurm (slurm-wlm: slurmctld, slurmd and the clients) for the Slurm test tier, Grid
#   Engine (gridengine-master, -exec, -client; no cell, no daemon started) for the Grid
#   Engine test tier, and chromium with chromium-driver for the status page's browser test.
# A second run only checks: it takes seconds and rebuilds nothing.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

PYTHON="${PYTHON:-python3.11}"
VENV="$ROOT/.venv"
TORCH_VERSION="2.13.0"
HOROVOD_VERSION="0.28.1"
# Our build of Horovod carries scripts/horovod-idle-cycle.patch; its wheel's version says so
# (0.28.1+popdist3) and a change to the patch takes a new label, so that a cached or
# installed wheel without it is rebuilt.
HOROVOD_LOCAL="popdist3"
CACHE_ROOT="${POPDIST_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/popdist}"

log() { printf '[setup] %s\n' "$*"; }
WORK_DIRS=()
cleanup() { for d in "${WORK_DIRS[@]}"; do rm -rf "$d"; done; }
trap cleanup EXIT
# pip, quiet, without the noise of this machine's pip.conf pointing at absent local indexes.
vpip() {
    "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@" 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
}
die() { printf '[setup] error: %s\n' "$*" >&2; exit 1; }
# apt-get install, quiet and non-interactive; the package lists are updated once per run.
APT_UPDATED=0
apt_install() {
    export DEBIAN_FRONTEND=noninteractive
    if [ "$APT_UPDATED" = 0 ]; then
        apt-get update -qq
        APT_UPDATED=1
    fi
    apt-get install -y -qq "$@" >/dev/null
}

# --- 1. Open MPI -------------------------------------------------------------------
ensure_mpi() {
    if command -v mpirun >/dev/null 2>&1 && [ -e /usr/include/x86_64-linux-gnu/mpi/mpi.h -o -n "$(command -v mpicc || true)" ]; then
        return
    fi
    local cmd="apt-get update && apt-get install -y openmpi-bin libopenmpi-dev"
    if [ "$(id -u)" != 0 ]; then
        die "Open MPI is missing; install it with: sudo sh -c '$cmd'"
    fi
    log "installing Open MPI: $cmd"
    apt_install openmpi-bin libopenmpi-dev
}

# --- 1b. sshd and ip, for the multi-host test tier (tests/multihost) --------------------
# The tier makes hosts out of network namespaces, each with its own sshd. Without root it
# cannot run at all, so nothing is installed and the tier says why it skips.
ensure_multihost_tools() {
    local missing=()
    command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ] || missing+=(openssh-server)
    command -v ssh >/dev/null 2>&1 || missing+=(openssh-client)
    command -v ip >/dev/null 2>&1 || missing+=(iproute2)
    [ "${#missing[@]}" = 0 ] && return
    if [ "$(id -u)" != 0 ]; then
        log "not root: the multi-host test tier will be skipped (it needs ${missing[*]} and root)"
        return
    fi
    log "installing ${missing[*]} for the multi-host test tier"
    apt_install "${missing[@]}"
}

# --- 1c. Slurm, for the Slurm test tier (tests/slurm) ------------------------------------
# The tier starts its own two-node cluster (slurmctld + two slurmd) on this machine; the
# daemons are not enabled as services. Without root nothing is installed and the tier says
# why it skips.
ensure_slurm() {
    local have=1 name
    for name in slurmctld slurmd sinfo salloc sbatch srun scontrol; do
        command -v "$name" >/dev/null 2>&1 || [ -x "/usr/sbin/$name" ] || have=0
    done
    [ "$have" = 1 ] && return
    if [ "$(id -u)" != 0 ]; then
        log "not root: the Slurm test tier will be skipped (it needs slurm-wlm and root)"
        return
    fi
    log "installing slurm-wlm for the Slurm test tier"
    apt_install slurm-wlm
}

# --- 1d. Grid Engine, for the Grid Engine test tier (tests/gridengine) -------------------
# The tier makes its own cell on namespace hosts (tests/support/gridengine_cluster.py). The
# packages configure no cell (debconf: no automatic configuration) and start no daemon (a
# policy-rc.d while they install: neither Grid Engine's nor the mail server bsd-mailx pulls
# in). 15 packages, 57 MB installed, 12 MB downloaded. Without root nothing is installed and
# the tier says why it skips.
ensure_gridengine() {
    local have=1 name
    for name in sge_qmaster sge_execd sge_shepherd qsub qrsh qconf qacct spoolinit spooldefaults; do
        [ -x "/usr/lib/gridengine/$name" ] || have=0
    done
    [ "$have" = 1 ] && return
    if [ "$(id -u)" != 0 ]; then
        log "not root: the Grid Engine test tier will be skipped (it needs gridengine-* and root)"
        return
    fi
    log "installing gridengine-master, gridengine-exec and gridengine-client for the Grid Engine test tier"
    debconf-set-selections <<'EOF'
gridengine-common shared/gridengineconfig boolean false
gridengine-common shared/gridenginecell string default
gridengine-common shared/gridenginemaster string localhost
EOF
    apt_install_no_start gridengine-master gridengine-exec gridengine-client
}

# apt_install with no service started by the packages' scripts: invoke-rc.d asks
# /usr/sbin/policy-rc.d, and 101 means "not allowed". One already there is left as it is.
apt_install_no_start() {
    local policy=/usr/sbin/policy-rc.d
    if [ -e "$policy" ]; then
        apt_install "$@"
        return
    fi
    printf '#!/bin/sh\n# scripts/setup.sh: no service starts while it installs\nexit 101\n' > "$policy"
    chmod 755 "$policy"
    WORK_DIRS+=("$policy")  # removed at exit, however the run ends
    apt_install "$@"
    rm -f "$policy"
}

# --- 1e. Chromium, for the status page's browser test (tests/launch/test_status_page.py) ----
# Headless, driven by selenium (dev extras). Without root nothing is installed and the test
# says why it skips.
ensure_browser() {
    local missing=()
    command -v chromium >/dev/null 2>&1 || missing+=(chromium)
    command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
    [ "${#missing[@]}" = 0 ] && return
    if [ "$(id -u)" != 0 ]; then
        log "not root: the status page's browser test will be skipped (it needs ${missing[*]})"
        return
    fi
    log "installing ${missing[*]} for the status page's browser test"
    apt_install "${missing[@]}"
}

# --- 2. Python environment ---------------------------------------------------------
ensure_venv() {
    command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
    "$PYTHON" -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version' \
        || die "Python 3.11 is required (set PYTHON=/path/to/python3.11)"
    if [ ! -x "$VENV/bin/python" ]; then
        log "creating $VENV"
        "$PYTHON" -m venv "$VENV"
    fi
    if ! "$VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; then
        log "installing torch==$TORCH_VERSION (CPU build)"
        vpip install "torch==$TORCH_VERSION"
    fi
    # The editable install is re-done only when pyproject.toml (or the mode below) changed
    # since the last one. Compat mode puts the checkout on sys.path with a plain .pth line.
    # setuptools' default for this flat layout installs an import hook instead, which every
    # Python start in the venv imports (pathlib, importlib.util, urllib.parse, ...): 15-25 ms
    # a start on 2 cores, paid by poprun and by every instance, where a user's pip install
    # of the wheel pays nothing (issue 33).
    local stamp="$VENV/.popdist-pyproject.sha"
    local want
    want="$(sha256sum pyproject.toml | cut -d' ' -f1) compat"
    if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
        log "installing the project (editable) with extras [examples,dev,lightning]"
        vpip install setuptools wheel
        vpip install --config-settings editable_mode=compat -e ".[examples,dev,lightning]"
        echo "$want" > "$stamp"
    fi
    # The project's bytecode, as a non-editable pip install writes it: where
    # PYTHONDONTWRITEBYTECODE is set no run writes it, and every poprun would compile itself
    # (about 60 ms a launch). Files already up to date are left alone.
    "$VENV/bin/python" -m compileall -q poprun popdist popdist_torch popdist_lightning _popdist_poptorch >/dev/null
}

# --- 3. Horovod --------------------------------------------------------------------
# Horovod is our build (its version label), its torch extension imports and it was built
# with MPI and Gloo (what `horovodrun --check-build` reports, in a fifth of its time);
# prints the versions.
horovod_ok() {
    WANT="$HOROVOD_VERSION+$HOROVOD_LOCAL" "$VENV/bin/python" - <<'PY' 2>/dev/null
import os
import sys
from importlib.metadata import version

import horovod.torch as hvd
import torch
if version("horovod") != os.environ["WANT"] or not (hvd.mpi_built() and hvd.gloo_built()):
    sys.exit(1)
print(f"torch {torch.__version__}, horovod {version('horovod')}")
PY
}

ensure_build_tools() {
    local missing=()
    command -v cmake >/dev/null 2>&1 || missing+=(cmake)
    command -v g++ >/dev/null 2>&1 || missing+=(g++)
    command -v make >/dev/null 2>&1 || missing+=(make)
    [ "${#missing[@]}" = 0 ] && return
    local cmd="apt-get update && apt-get install -y ${missing[*]}"
    [ "$(id -u)" = 0 ] || die "building Horovod needs ${missing[*]}; install with: sudo sh -c '$cmd'"
    log "installing build tools: $cmd"
    apt_install "${missing[@]}"
}

build_horovod_wheel() {
    local dest="$1" work
    work="$(mktemp -d)"
    WORK_DIRS+=("$work")
    log "building Horovod $HOROVOD_VERSION against torch $TORCH_VERSION (about 4 minutes on 2 cores)"
    vpip download --no-deps --no-binary :all: \
        -d "$work" "horovod==$HOROVOD_VERSION"
    tar -xzf "$work"/horovod-"$HOROVOD_VERSION".tar.gz -C "$work"
    local src="$work/horovod-$HOROVOD_VERSION"
    # Current torch headers need C++17; Horovod 0.28.1 pins C++14.
    sed -i 's/CMAKE_CXX_STANDARD 14/CMAKE_CXX_STANDARD 17/; s/-std=c++14/-std=c++17/g' \
        "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
    grep -q 'CMAKE_CXX_STANDARD 17' "$src/CMakeLists.txt" || die "the C++17 patch did not apply to Horovod's CMakeLists.txt"
    # An idle rank sleeps until a tensor is queued, a waiting rank backs off and blocks, and
    # idle cycles re-anchor the background thread's clock where the ranks leave their
    # coordination together: without them, an idle or waiting instance busy-waits.
    local patch="$ROOT/scripts/horovod-idle-cycle.patch"
    if command -v git >/dev/null 2>&1; then  # the ceiling: never a repository around $work
        (cd "$src" && GIT_CEILING_DIRECTORIES="$work" git apply "$patch")
    else
        patch -d "$src" -p1 --quiet < "$patch"
    fi || die "scripts/horovod-idle-cycle.patch did not apply to Horovod $HOROVOD_VERSION"
    vpip install cloudpickle psutil pyyaml packaging cffi
    (
        cd "$src"
        export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
               HOROVOD_LOCAL_VERSION="$HOROVOD_LOCAL" \
               HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
               CMAKE_POLICY_VERSION_MINIMUM=3.5 \
               MAKEFLAGS="-j$(nproc)" HOROVOD_BUILD_PARALLEL="$(nproc)"
        # The system cmake (3.25) accepts Horovod's old cmake_minimum_required.
        export PATH="/usr/bin:$PATH"
        "$VENV/bin/python" -m pip --disable-pip-version-check wheel --no-deps --no-build-isolation \
            -w "$work/dist" . > "$work/build.log" 2>&1 \
            || { tail -40 "$work/build.log" >&2; die "the Horovod build failed (log above)"; }
    )
    mkdir -p "$dest"
    local tmp
    tmp="$(mktemp -d "$dest/.tmp.XXXXXX")"
    cp "$work"/dist/horovod-*.whl "$tmp/"
    mv "$tmp"/horovod-*.whl "$dest/"   # rename into place: a cache entry is whole or absent
    rmdir "$tmp"
}

ensure_horovod() {
    if VERSIONS="$(horovod_ok)"; then
        return
    fi
    local pyver key dest
    pyver="$("$VENV/bin/python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
    key="horovod-$HOROVOD_VERSION+$HOROVOD_LOCAL-torch-$TORCH_VERSION-$pyver"
    dest="$CACHE_ROOT/wheels/$key"
    if ! ls "$dest"/horovod-*.whl >/dev/null 2>&1; then
        ensure_build_tools
        build_horovod_wheel "$dest"
    else
        log "using the cached Horovod wheel in $dest"
    fi
    vpip install --no-deps --force-reinstall "$dest"/horovod-*.whl
    vpip install cloudpickle psutil pyyaml packaging cffi
    VERSIONS="$(horovod_ok)" || die "Horovod is installed but lacks PyTorch, MPI or Gloo support"
}

VERSIONS=""
ensure_mpi
ensure_multihost_tools
ensure_slurm
ensure_gridengine
ensure_browser
ensure_venv
ensure_horovod
log "ready: $VERSIONS, $(mpirun --version | head -1)"
