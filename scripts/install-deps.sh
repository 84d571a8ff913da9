#!/usr/bin/env bash
# Installs the Debian packages moesim builds and runs with, when any is missing. Idempotent and
# silent when everything is already there. The CUDA toolkit is not installed here: the CUDA code
# is built when nvcc is on PATH and skipped otherwise. With --fuzz, also what `make fuzz` needs.
set -euo pipefail

packages=(
    build-essential cmake pkg-config
    libhdf5-dev      # trace files
    libdeflate-dev   # trace chunks (de)compressed in parallel
    zlib1g-dev       # streamed deflate: trace import's .npz members, timelines (.json.gz, .pftrace)
    libgsl-dev       # random numbers, distributions, statistics
    libinih-dev      # INI configs
    libjansson-dev   # JSON in and out
    libcriterion-dev # tests
    gnuplot-nox      # figures
    valgrind         # bench/profile_sim.sh: the simulator's instruction profile (callgrind)
)
if [ "${1:-}" = "--fuzz" ]; then
    packages+=(clang libclang-rt-dev) # libFuzzer and the sanitizer runtimes (tests/fuzz)
fi

missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install-deps: installing ${missing[*]}" >&2
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
