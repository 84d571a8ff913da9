#!/usr/bin/env bash
# Build dependencies for a GPU machine that has nvcc, CMake and Python but none of our Debian
# libraries and no package registry (see README, "For developers").
#
#   scripts/gpu-deps.sh gather   here (Debian with apt): download the .deb files of HDF5, GSL,
#                                inih, jansson, Criterion and the dependencies a base CUDA image
#                                lacks into .deps/debs (ignored by git; carry .deps/debs, not the
#                                unpacked prefix, to the GPU machine)
#   scripts/gpu-deps.sh unpack   there: dpkg -x every .deb into .deps/prefix and print the
#                                CMAKE_PREFIX_PATH / PKG_CONFIG_PATH / LD_LIBRARY_PATH settings
#   scripts/gpu-deps.sh build    there: unpack (once), configure build-gpu and build (no runs)
#   scripts/gpu-deps.sh env      the environment settings of the unpacked prefix (for eval)
#   scripts/gpu-deps.sh test     there: unpack, configure build-gpu against the prefix (for the
#                                GPU's architecture, or CUDA_ARCHS; -Werror only with WERROR=ON:
#                                CI enforces it, another gcc may warn elsewhere), build, run
#                                `ctest -L gpu` and bench_gpu_engine $BENCH_ARGS
#
# "A base image" is taken to hold what every Debian/Ubuntu system has (Priority required or
# important) and the C toolchain nvcc needs (gcc, libc6-dev, ...); everything else is gathered.
# .deps/debs must stay under 64 MiB: the device tool carries at most that much.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
deps="$root/.deps"
debs="$deps/debs"
prefix="$deps/prefix"
max_mib=64

wanted=(libhdf5-dev libdeflate-dev zlib1g-dev libgsl-dev libinih-dev libjansson-dev libcriterion-dev)
# Present on any image that can run nvcc (toolchain, C library), or not needed to build and link
# moesim: Fortran / C++ / MPI HDF5 bindings, the -dev halves of libraries libhdf5 only needs at
# run time (libcurl's chain: their shared libraries are gathered, ld finds them through
# LD_LIBRARY_PATH), packaging tools.
base_re='^(libc6|libc6-dev|libc-dev-bin|linux-libc-dev|libgcc-s1|libgcc-.*-dev|gcc(-[0-9]+)?(-base)?|cpp(-[0-9]+)?|g\+\+.*|libstdc\+\+.*|binutils.*|libbinutils|libctf.*|libgprofng.*|libcrypt1|libcrypt-dev|libnsl.*|libtirpc.*|libasan.*|libubsan.*|liblsan.*|libtsan.*|libitm.*|libatomic1|libgomp1|libquadmath0|libcc1-0|libhwasan0|rpcsvc-proto|libisl23|libmpc3|libmpfr6|gfortran.*|libgfortran-.*-dev|libhdf5-fortran.*|libhdf5-hl-fortran.*|libhdf5-cpp.*|libhdf5-hl-cpp.*|hdf5-helpers|libhdf5-mpi.*|libhdf5-openmpi.*|libhdf5-mpich.*|.*openmpi.*|.*mpich.*|libjpeg.*-dev|libturbojpeg.*|.*-doc|debconf|dpkg|dpkg-dev|perl.*|libperl.*|libdpkg-perl|make|patch|xz-utils|bzip2|pkg-config|pkgconf.*|libpkgconf3|install-info|sensible-utils|netbase|libcurl4-openssl-dev|libcurl4-gnutls-dev|libssl-dev|libkrb5-dev|krb5-multidev|comerr-dev|libldap-dev|libldap2-dev|libidn2-dev|libbrotli-dev|libnghttp2-dev|libpsl-dev|librtmp-dev|libssh2-1-dev|libgnutls.*-dev|nettle-dev|libgmp-dev|libgmpxx4ldbl|libp11-kit-dev|libtasn1-6-dev|libunistring-dev|libzstd-dev|libgssrpc4|libkadm5.*|libkdb5.*)$'

gather() {
    command -v apt-get >/dev/null || { echo "gpu-deps: gather needs apt-get (Debian)" >&2; exit 2; }
    mkdir -p "$debs"
    local names
    names=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
                --no-breaks --no-replaces --no-enhances "${wanted[@]}" |
            grep -v '^ ' | grep -v '^<' | sed 's/:any$//' | sort -u)
    local keep=()
    for n in $names; do
        [[ $n =~ $base_re ]] && continue
        prio=$(apt-cache show "$n" 2>/dev/null | awk '/^Priority:/ {print $2; exit}')
        [[ $prio == required || $prio == important ]] && continue
        keep+=("$n")
    done
    echo "gpu-deps: ${#keep[@]} packages: ${keep[*]}"
    (cd "$debs" && apt-get download "${keep[@]}" >/dev/null)
    local mib
    mib=$(du -sm "$debs" | cut -f1)
    echo "gpu-deps: $(ls "$debs" | wc -l) .deb files, ${mib} MiB in $debs (carry .deps/debs)"
    if [ "$mib" -ge "$max_mib" ]; then
        echo "gpu-deps: $debs is ${mib} MiB, over the ${max_mib} MiB the device tool carries" >&2
        exit 1
    fi
}

env_lines() {
    local triplet=x86_64-linux-gnu
    echo "export CMAKE_PREFIX_PATH=$prefix/usr\${CMAKE_PREFIX_PATH:+:\$CMAKE_PREFIX_PATH}"
    echo "export PKG_CONFIG_PATH=$prefix/usr/lib/$triplet/pkgconfig:$prefix/usr/lib/pkgconfig:$prefix/usr/share/pkgconfig\${PKG_CONFIG_PATH:+:\$PKG_CONFIG_PATH}"
    echo "export LD_LIBRARY_PATH=$prefix/usr/lib/$triplet:$prefix/usr/lib/$triplet/hdf5/serial\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
    echo "export PKG_CONFIG_SYSROOT_DIR="
}

# The gathered libraries come from Debian 12 and need glibc >= 2.35 (libgsl's newest symbol
# version, checked with objdump -T): Ubuntu 22.04 and later, Debian 12 and later.
glibc_need=2.35

unpack() {
    ls "$debs"/*.deb >/dev/null 2>&1 || { echo "gpu-deps: no .deb in $debs (run gather first)" >&2; exit 2; }
    local have
    have=$( (ldd --version 2>/dev/null || true) | head -1 | grep -o '[0-9]\+\.[0-9]\+$' || true)
    if [ -n "$have" ] && [ "$(printf '%s\n' "$glibc_need" "$have" | sort -V | head -1)" != "$glibc_need" ]; then
        echo "gpu-deps: the gathered libraries need glibc >= $glibc_need, this machine has $have" >&2
        exit 1
    fi
    rm -rf "$prefix"
    mkdir -p "$prefix"
    for d in "$debs"/*.deb; do
        if command -v dpkg >/dev/null; then
            dpkg -x "$d" "$prefix"
        else # no dpkg: a .deb is an ar archive holding data.tar.*
            local tmp
            tmp=$(mktemp -d)
            (cd "$tmp" && ar x "$d" && tar -xf data.tar.* -C "$prefix")
            rm -rf "$tmp"
        fi
    done
    # .pc files and CMake configs name /usr as their prefix: point them at ours
    grep -rl --include='*.pc' '^prefix=/usr' "$prefix" 2>/dev/null |
        xargs -r sed -i "s|^prefix=/usr|prefix=$prefix/usr|"
    # -dev symlinks are absolute (/usr/lib/...): make them relative to the prefix
    find "$prefix" -type l | while read -r l; do
        t=$(readlink "$l")
        if [[ $t == /* ]]; then ln -sfn "$prefix$t" "$l"; fi
    done
    touch "$prefix/.unpacked"
    echo "gpu-deps: unpacked into $prefix; set:"
    env_lines
}

build() {
    command -v nvcc >/dev/null || export PATH="/usr/local/cuda/bin:$PATH"
    # the GPU's own architecture (CMake's "native" needs CMake >= 3.24); 90 (H100/H200) otherwise
    local arch
    arch=$( (nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null || true) | head -1 | tr -d '. ')
    arch=${CUDA_ARCHS:-${arch:-90}}
    # unpacked once per machine: unpacking again would touch every header and rebuild everything
    [ -f "$prefix/.unpacked" ] || unpack >/dev/null
    eval "$(env_lines)"
    # only our .pc files: a half-installed system copy must not shadow them
    export PKG_CONFIG_LIBDIR="$PKG_CONFIG_PATH"
    local lib="$prefix/usr/lib/x86_64-linux-gnu"
    # FindHDF5 without h5cc on PATH: Debian's serial layout named directly
    cmake -S "$root" -B "$root/build-gpu" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOESIM_CUDA=ON \
        -DMOESIM_WERROR="${WERROR:-OFF}" -DCMAKE_CUDA_ARCHITECTURES="$arch" \
        -DCMAKE_CUDA_COMPILER="$(command -v nvcc)" \
        -DHDF5_ROOT="$prefix/usr" -DHDF5_NO_FIND_PACKAGE_CONFIG_FILE=ON \
        -DHDF5_C_INCLUDE_DIR="$prefix/usr/include/hdf5/serial" \
        -DHDF5_hdf5_LIBRARY_RELEASE="$lib/hdf5/serial/libhdf5.so" \
        -DGSL_INCLUDE_DIR="$prefix/usr/include" -DGSL_LIBRARY="$lib/libgsl.so" \
        -DGSL_CBLAS_LIBRARY="$lib/libgslcblas.so"
    # TARGETS (e.g. "moesim"): build only those (scripts/gpu-first-run.sh); default everything
    # shellcheck disable=SC2086
    cmake --build "$root/build-gpu" -j "$(nproc)" ${TARGETS:+--target $TARGETS}
}

run_test() {
    build
    ctest --test-dir "$root/build-gpu" -L gpu --output-on-failure
    # BENCH_ARGS, e.g. "--layers 2 --gen 32", shortens the decode part
    # shellcheck disable=SC2086
    "$root/build-gpu/bench/bench_gpu_engine" ${BENCH_ARGS:-}
}

case "${1:-}" in
gather) gather ;;
unpack) unpack ;;
build) build ;;
env) env_lines ;;
test) run_test ;;
*)
    echo "usage: scripts/gpu-deps.sh gather|unpack|build|env|test" >&2
    exit 2
    ;;
esac
