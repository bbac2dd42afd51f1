"""What the bytecode in a stored payload saves each module call in the CT, side by side in one run.

For each module of the collection that runs in the CT: its AnsiballZ payload as ansible-core builds
it (executor/module_common.py modify_module) and as the payload store keeps it, a .pyc beside each
source (plugins/plugin_utils/payload_cache.py with_bytecode). Each is imported by the CTs' Python
(/usr/bin/python3: the testbed's CTs run the host's) as AnsiballZ does, the payload zip first on
sys.path; the two are timed in alternation, RUNS times each, as the CPU time (user + system) of
the child processes. Prints per module the payload's bytes, the median CPU of an import and
their ratio.

    .venv/bin/python bench/payload_bytecode.py [--runs N] [--python /usr/bin/python3]
"""

import argparse
import base64
import os
import resource
import statistics
import subprocess
import sys
import tempfile

from payload_size import REPO, built_payloads  # beside this script


def import_cpu(python, payload_zip, module):
    """CPU seconds (user + system) of one import of module from payload_zip in a Python of its own."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([python, "-c", f"import sys; sys.path.insert(0, {payload_zip!r}); import {module}"],
                   check=True, stdin=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--python", default="/usr/bin/python3")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["ANSIBLE_LOCAL_TEMP"] = os.path.join(tmp, "local")
        from ansible import constants as C

        # what a run sends: the module_compression setting
        built = built_payloads(REPO, module_compression=C.DEFAULT_MODULE_COMPRESSION)
        from ansible_collections.dflash.lifecycle.plugins.plugin_utils import payload_cache

        print(f"{'module':<20} {'bytes':>8} {'with .pyc':>10} {'import ms':>10} {'with .pyc':>10} {'ratio':>6}")
        totals = [0.0, 0.0]
        for name, (_wrapper, zip_data) in built.items():
            paths = []
            for kind, data in (("plain", zip_data), ("pyc", payload_cache.with_bytecode(zip_data))):
                path = os.path.join(tmp, f"{name}-{kind}.zip")
                with open(path, "wb") as handle:
                    handle.write(base64.b64decode(data))
                paths.append(path)
            module = f"ansible_collections.dflash.lifecycle.plugins.modules.{name}"
            times = ([], [])
            for _ in range(args.runs):
                for index, path in enumerate(paths):
                    times[index].append(import_cpu(args.python, path, module))
            plain, compiled = (statistics.median(t) * 1000 for t in times)
            totals[0] += plain
            totals[1] += compiled
            sizes = [os.path.getsize(p) for p in paths]
            print(f"{name:<20} {sizes[0]:>8} {sizes[1]:>10} {plain:>10.1f} {compiled:>10.1f} {compiled / plain:>6.2f}")
        print(f"{'all, summed':<20} {'':>8} {'':>10} {totals[0]:>10.1f} {totals[1]:>10.1f} {totals[1] / totals[0]:>6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
