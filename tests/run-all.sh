#!/usr/bin/env bash
# Every check of `make test`, side by side: pytest on PYTEST_WORKERS workers (the integration
# tests mostly wait on their trainers), and beside it the CPU-bound rest - ansible-lint,
# ansible-test sanity, the GPU check's CPU mode, and the collection's unit tests and the pct
# plugin's under the newest ansible-core (on a testbed of its own). In a row they would need
# half an hour of two CPUs. Fails when any of them failed.
# The set-up runs here too: lint and sanity need only the controller's venv, so they start as soon
# as it is built, while the host's packages and the other two venvs are still being installed
# (a set-up that mostly waits on downloads and unpacking leaves a third of two CPUs idle).
# Usage: tests/run-all.sh VENV_BIN VENV_NEXT_BIN TORCH_PYTHON [pytest arguments]
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:?usage: run-all.sh VENV_BIN VENV_NEXT_BIN TORCH_PYTHON [pytest arguments]}
next_bin=${2:?}
torch_python=${3:?}
shift 3
logs="$repo/artifacts/test"
# ansible-core refuses to run when its stdin is non-blocking (a pipe a CI runner set O_NONBLOCK on is
# inherited by every job a test starts); no test reads stdin
exec < /dev/null
rm -rf "$logs" && mkdir -p "$logs"
cd "$repo"

# the checkpoint imitations are loaded with the real torch and safetensors of this venv
export DFLASH_TORCH_PYTHON="$torch_python"
# an interrupted run ends the ones it started, by PID (the GPU check ends its trainers itself;
# the pytest runs take their testbeds down)
trap 'kill ${setup:-} ${lint:-} ${sanity:-} ${gpu_check:-} ${next:-} 2> /dev/null' INT TERM
make --no-print-directory -j3 host-packages venv-next venv-torch &
setup=$!
make --no-print-directory venv || { kill $setup 2> /dev/null; wait $setup; exit 1; }
# lint and sanity wait on nothing but the CPU: at the lowest priority they take what the tests leave
# (the tests mostly wait on trainers for a minute at a time) instead of slowing their trainers
nice -n 19 "$bin/ansible-lint" --offline --profile production > "$logs/lint.log" 2>&1 &
lint=$!
nice -n 19 tests/sanity/run.sh "$bin/python" > "$logs/sanity.log" 2>&1 &
sanity=$!
if ! wait $setup; then
  kill $lint $sanity 2> /dev/null
  wait $lint $sanity
  echo "== the set-up failed (above): no test ran" >&2
  exit 1
fi
"$bin/python" bench/gpu_check.py --cpu --trainer-python "$torch_python" --work-dir "$logs/gpu-check" \
  --out "$logs/gpu_check.json" > "$logs/gpu-check.log" 2>&1 &
gpu_check=$!
DFLASH_TESTBED_WORKER=gw9 "$next_bin/python" -m pytest -p no:cacheprovider "$@" \
  collections/ansible_collections/dflash/lifecycle/tests/unit tests/integration/test_connection_plugin.py \
  > "$logs/pytest-next.log" 2>&1 &
next=$!

# the integration tests mostly wait on their trainers: PYTEST_WORKERS modules run side by side,
# each worker on a testbed of its own (tests/conftest.py); five keep two CPUs busy where four left
# them a third idle for minutes (docs/performance.md)
"$bin/python" -m pytest -n "${PYTEST_WORKERS:-5}" --dist loadfile --no-loadscope-reorder "$@"
pytest_status=$?
wait $next
next_status=$?
wait $lint
lint_status=$?
wait $sanity
sanity_status=$?
wait $gpu_check
gpu_check_status=$?

echo "== ansible-lint (exit $lint_status; $logs/lint.log)"
tail -n 5 "$logs/lint.log"
echo "== pytest under the newest ansible-core (exit $next_status; $logs/pytest-next.log)"
if [ $next_status -ne 0 ]; then tail -n 80 "$logs/pytest-next.log"; else tail -n 1 "$logs/pytest-next.log"; fi
echo "== ansible-test sanity (exit $sanity_status; $logs/sanity.log)"
if [ $sanity_status -ne 0 ]; then tail -n 60 "$logs/sanity.log"; else grep -c '^Running sanity test' "$logs/sanity.log" | xargs printf '%s sanity tests passed\n'; fi
echo "== GPU check, CPU mode (exit $gpu_check_status; $logs/gpu-check.log)"
tail -n 40 "$logs/gpu-check.log"
echo "== lint $lint_status, pytest $pytest_status, pytest (newest ansible-core) $next_status, sanity $sanity_status, GPU check $gpu_check_status"
[ $lint_status -eq 0 ] && [ $pytest_status -eq 0 ] && [ $next_status -eq 0 ] && [ $sanity_status -eq 0 ] && [ $gpu_check_status -eq 0 ]
