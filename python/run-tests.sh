#!/usr/bin/env bash
# The Python package's tests (python/tests), run by ctest (test python_package): makes a venv
# under the build folder with numpy, h5py, pandas and pytest from PyPI (once; later runs reuse
# it), then runs pytest with the build's moesim CLI and libmoesim. Exits 77 (skipped) with the
# reason on stderr when the venv cannot be made (no python3 venv module, no network to PyPI).
# usage: run-tests.sh BUILD_DIR MOESIM LIBMOESIM POLICY_PLUGIN
set -uo pipefail
build=$1 moesim=$2 libmoesim=$3 plugin=$4
here=$(cd "$(dirname "$0")" && pwd)
venv=$build/python-venv
case ${MOESIM_SANITIZED:-OFF} in ON | TRUE | 1 | YES | on | true | yes)
    echo "python tests skipped: this is the sanitizer build (python3 cannot load an" \
         "ASan-instrumented libmoesim); the plain build runs them" >&2
    exit 77 ;;
esac
if [[ ! -x $venv/bin/pytest ]]; then
    rm -rf "$venv"
    if ! python3 -m venv "$venv" >"$build/python-venv.log" 2>&1 ||
        ! "$venv/bin/pip" install --disable-pip-version-check -q numpy h5py pandas pytest \
            >>"$build/python-venv.log" 2>&1; then
        echo "python tests skipped: cannot make a venv with numpy, h5py, pandas and pytest" \
             "from PyPI (log: $build/python-venv.log: $(tail -n 1 "$build/python-venv.log"))" >&2
        rm -rf "$venv"
        exit 77
    fi
fi
export MOESIM_BIN=$moesim MOESIM_LIB=$libmoesim MOESIM_POLICY_PLUGIN=$plugin
export PYTHONPATH=$here${PYTHONPATH:+:$PYTHONPATH}
exec "$venv/bin/pytest" -q -p no:cacheprovider "$here/tests"
