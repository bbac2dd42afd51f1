#!/usr/bin/env bash
# ansible-test sanity on the collection, as Automation Hub judges it: every test, import
# included, with ansible-test's own pinned tool versions in its own virtual environments.
# ansible-test bootstraps pip into them with a get-pip script from ci-files.testing.ansible.com,
# or from ~/.ansible/test/cache when one is there; that host may be out of reach where PyPI is
# not, so the bootstrap here (tests/sanity/get_pip.py) runs pip from pip's own wheel.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
python=${1:?usage: run.sh PYTHON (the venv python with ansible-core)}
version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
# the pip ansible-test puts into its virtual environments, for this ansible-core and Python
pip_version=$("$python" -c 'from types import SimpleNamespace
from ansible_test._internal.python_requirements import get_venv_packages
print(get_venv_packages(SimpleNamespace(version="'"$version"'"))["pip"])')
cache="$HOME/.ansible/test/cache"
mkdir -p "$cache"
bootstrap="$cache/get_pip_${pip_version//./_}.py"
[ -f "$bootstrap" ] || cp "$repo/tests/sanity/get_pip.py" "$bootstrap"
ls "$cache"/pip-"$pip_version"-py3-none-any.whl > /dev/null 2>&1 \
  || "$python" -m pip download --quiet --disable-pip-version-check --no-deps -d "$cache" "pip==$pip_version"
cd "$repo/collections/ansible_collections/dflash/lifecycle"
exec "$(dirname "$python")/ansible-test" sanity --local --python "$version" --requirements
