#!/usr/bin/env bash
# The Hugging Face recorder's tests (python/tests_record_hf), run by ctest.
#   run-record-hf-tests.sh list          the fast suite's test python_record_hf_skipped: names
#                                        every recorder test and exits 77 (skipped): they need
#                                        torch and transformers, several GB from PyPI
#   run-record-hf-tests.sh run BUILD_DIR MOESIM LIBMOESIM
#                                        the slow test python_record_hf: makes a venv under the
#                                        build folder with the pinned torch and transformers
#                                        (once; later runs reuse it), then runs pytest. Exits 77
#                                        with the reason when the venv cannot be made.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tests=$here/tests_record_hf/test_record_hf.py
# the versions these tests pass with (torch from PyPI: its Linux wheel brings the CUDA packages)
pins=(torch==2.15.0 transformers==5.24.0 safetensors==0.8.0 numpy h5py pytest)

if [[ ${1-} == list ]]; then
    names=$(grep -oE '^def (test_[a-z0-9_]+)' "$tests" | cut -c5- | tr '\n' ' ')
    echo "skipped (need torch and transformers; the slow test python_record_hf runs them:" \
         "ctest -L slow -R python_record_hf): $names" >&2
    exit 77
fi
build=$2 moesim=$3 libmoesim=$4
venv=$build/recorder-venv
case ${MOESIM_SANITIZED:-OFF} in ON | TRUE | 1 | YES | on | true | yes)
    echo "recorder tests skipped: this is the sanitizer build (python3 cannot load an" \
         "ASan-instrumented libmoesim); the plain build runs them" >&2
    exit 77 ;;
esac
stamp=$venv/.pins
if [[ ! -x $venv/bin/pytest || $(cat "$stamp" 2>/dev/null) != "${pins[*]}" ]]; then
    rm -rf "$venv"
    start=$SECONDS
    if ! python3 -m venv "$venv" >"$build/recorder-venv.log" 2>&1 ||
        ! "$venv/bin/pip" install --disable-pip-version-check --progress-bar off "${pins[@]}" \
            >>"$build/recorder-venv.log" 2>&1; then
        echo "recorder tests skipped: cannot make a venv with ${pins[*]} from PyPI" \
             "(log: $build/recorder-venv.log: $(tail -n 1 "$build/recorder-venv.log"))" >&2
        rm -rf "$venv"
        exit 77
    fi
    echo "${pins[*]}" >"$stamp"
    echo "recorder venv made in $((SECONDS - start)) s: $(du -sh "$venv" | cut -f1)" >&2
fi
export MOESIM_BIN=$moesim MOESIM_LIB=$libmoesim
export PYTHONPATH=$here${PYTHONPATH:+:$PYTHONPATH}
exec "$venv/bin/pytest" -v -rs -p no:cacheprovider "$here/tests_record_hf"
