#!/usr/bin/env bash
# Every check of `make test`: ansible-lint; ansible-test sanity and the GPU check's CPU mode
# side by side with pytest (those two are CPU-bound, the integration tests mostly wait on their
# trainers: in a row they would need half an hour of two CPUs); then the collection's unit
# tests and the pct plugin's under the newest ansible-core. Fails when any of them failed.
# Usage: tests/run-all.sh VENV_BIN VENV_NEXT_BIN TORCH_PYTHON [pytest arguments]
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:?usage: run-all.sh VENV_BIN VENV_NEXT_BIN TORCH_PYTHON [pytest arguments]}
next_bin=${2:?}
torch_python=${3:?}
shift 3
logs="$repo/artifacts/test"
rm -rf "$logs" && mkdir -p "$logs"
cd "$repo"

"$bin/ansible-lint" --offline --profile production || exit 1

tests/sanity/run.sh "$bin/python" > "$logs/sanity.log" 2>&1 &
sanity=$!
"$bin/python" bench/gpu_check.py --cpu --trainer-python "$torch_python" --work-dir "$logs/gpu-check" \
  --out "$logs/gpu_check.json" > "$logs/gpu-check.log" 2>&1 &
gpu_check=$!
# an interrupted run ends the two it started, by PID (the GPU check ends its trainers itself)
trap 'kill $sanity $gpu_check 2> /dev/null' INT TERM

# the checkpoint imitations are loaded with the real torch and safetensors of this venv
export DFLASH_TORCH_PYTHON="$torch_python"
# the integration tests mostly wait on their trainers: PYTEST_WORKERS modules run side by side,
# each worker on a testbed of its own (tests/conftest.py)
"$bin/python" -m pytest -n "${PYTEST_WORKERS:-3}" --dist loadfile "$@"
pytest_status=$?
"$next_bin/python" -m pytest "$@" collections/ansible_collections/dflash/lifecycle/tests/unit \
  tests/integration/test_connection_plugin.py
next_status=$?
wait $sanity
sanity_status=$?
wait $gpu_check
gpu_check_status=$?

echo "== ansible-test sanity (exit $sanity_status; $logs/sanity.log)"
if [ $sanity_status -ne 0 ]; then tail -n 60 "$logs/sanity.log"; else grep -c '^Running sanity test' "$logs/sanity.log" | xargs printf '%s sanity tests passed\n'; fi
echo "== GPU check, CPU mode (exit $gpu_check_status; $logs/gpu-check.log)"
tail -n 40 "$logs/gpu-check.log"
echo "== pytest $pytest_status, pytest (newest ansible-core) $next_status, sanity $sanity_status, GPU check $gpu_check_status"
[ $pytest_status -eq 0 ] && [ $next_status -eq 0 ] && [ $sanity_status -eq 0 ] && [ $gpu_check_status -eq 0 ]
