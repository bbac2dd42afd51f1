"""pip bootstrap for ansible-test's sanity virtual environments.

ansible-test bootstraps pip into each new virtual environment with a get-pip script it
downloads from ci-files.testing.ansible.com, or takes from ~/.ansible/test/cache/ when one is
there ("The bootstrap script can be manually downloaded and saved to ..."). That host is not
reachable here; PyPI is. This script does what get-pip.py does with pip's own wheel (fetched
from PyPI beside it by `make lint`): it runs pip from the wheel to install the packages
ansible-test asks for (pip==<version> ...) into the interpreter that runs it.
"""

import glob
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    version = os.path.splitext(os.path.basename(__file__))[0].split("_", 2)[2].replace("_", ".")
    wheels = glob.glob(os.path.join(HERE, f"pip-{version}-py3-none-any.whl"))
    if not wheels:
        sys.exit(f"no pip {version} wheel in {HERE}: run `make lint`, which downloads it")
    sys.path.insert(0, wheels[0])
    from pip._internal.cli.main import main as pip_main  # noqa: PLC0415  (from the wheel just put on the path)

    # get-pip.py's own flags: this bootstrap installs neither setuptools nor wheel anyway
    args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
    sys.exit(pip_main(["install", "--upgrade", "--force-reinstall", *args]))


if __name__ == "__main__":
    main()
