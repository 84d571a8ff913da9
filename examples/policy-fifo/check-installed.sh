#!/usr/bin/env bash
# The template plug-in built out of the tree, as a user would: moesim installed into a scratch
# prefix (cmake --install), then this folder built by its Makefile and by its CMakeLists.txt
# against the installed header and moesim.pc, and both results run by `moesim sim`.
# usage: check-installed.sh BUILD_DIR MOESIM WORKDIR
set -euo pipefail
build=$1 moesim=$2 work=$3
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
cmake --install "$build" --prefix "$work/prefix" >"$work/install.log"
export PKG_CONFIG_PATH=$work/prefix/lib/pkgconfig
cp "$here/fifo.c" "$here/Makefile" "$here/CMakeLists.txt" "$work/"
make -s -C "$work" >"$work/make.log" 2>&1 || { cat "$work/make.log" >&2; exit 1; }
cmake -S "$work" -B "$work/cmake-build" >"$work/cmake.log" 2>&1 &&
    cmake --build "$work/cmake-build" >>"$work/cmake.log" 2>&1 ||
    { cat "$work/cmake.log" >&2; exit 1; }
"$moesim" trace synth --model olmoe-1b-7b --requests 1 --prompt-len 4 --gen-len 8 -o "$work/t.h5" \
    >/dev/null
for so in "$work/policy-fifo.so" "$work/cmake-build/policy-fifo.so"; do
    [[ $(nm -D --defined-only "$so" | awk '$2 != "A" {print $3}') == moesim_policy ]] ||
        { echo "$so exports more than moesim_policy" >&2; exit 1; }
    "$moesim" sim --trace "$work/t.h5" --hw rtx3090-pcie3 --policy-lib "$so" --json \
        --set memory.budget_gb=2.5 | grep -q '"policy": "fifo"'
done
echo "the template plug-in builds against the installed moesim (Makefile and CMake) and runs"
