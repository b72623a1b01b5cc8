#!/usr/bin/env bash
# Installs the Debian packages kolo's tests need, when missing. Idempotent and
# non-interactive; `cargo xtask test` works after it on a fresh machine.
set -euo pipefail

# The default (threads) build needs no system library. kolo-mpi needs an MPI
# (OpenMPI: mpirun, mpicc, headers) and libclang for rsmpi's bindgen;
# kolo-ucx needs UCX's headers and pkg-config file (and libclang for its
# own bindgen) to build, and UCX's libraries to run.
# The Python package's tests need a Python with venv and pip.
needed=(openmpi-bin libopenmpi-dev libclang-dev clang libucx-dev pkg-config python3-venv python3-pip)

missing=()
for pkg in "${needed[@]+"${needed[@]}"}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo_cmd apt-get update -qq
  $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
  $sudo_cmd apt-get clean
fi
