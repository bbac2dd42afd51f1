"""Each module's AnsiballZ payload against another commit's, side by side in one run.

The payload is what ansible-core's own build (executor/module_common.py modify_module) makes of
a module: its text and every module_utils file its imports reach. A change of the layout of
module_utils (packages by concern) must ship no file a module does not import: the table
prints, per module, the payload's bytes and its files of this collection's module_utils, for
the work tree and for the commit given (a git worktree made for the run and removed after).

    .venv/bin/python bench/payload_size.py [--against REV]     (default: HEAD~1)
"""

import argparse
import base64
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLUGINS = os.path.join("collections", "ansible_collections", "dflash", "lifecycle", "plugins")
OWN = "ansible_collections/dflash/lifecycle/plugins/module_utils/"


def built_payloads(tree, module_compression="ZIP_STORED"):
    """{module: (its AnsiballZ wrapper, the payload zip in it, base64)} of every module of the
    collection in tree that sends one, as ansible-core builds it (modify_module's default
    compression unless given). The collection loader is bound to one tree per process."""
    from ansible.executor import module_common
    from ansible.template import Templar
    from ansible.utils.collection_loader._collection_finder import _AnsibleCollectionFinder

    _AnsibleCollectionFinder(paths=[os.path.join(tree, "collections")])._install()
    modules = os.path.join(tree, PLUGINS, "modules")
    found = {}
    for name in sorted(f[:-3] for f in os.listdir(modules) if f.endswith(".py") and f != "__init__.py"):
        built = module_common.modify_module(
            module_name=f"dflash.lifecycle.{name}", module_path=os.path.join(modules, name + ".py"), module_args={},
            templar=Templar(loader=None), task_vars={"ansible_python_interpreter": "/usr/bin/python3"},
            module_compression=module_compression)
        match = re.search(rb"zip_data='([A-Za-z0-9+/=]+)'", built.b_module_data)
        if match:  # else its action plugin does the work on the controller (pct_push): nothing is sent
            found[name] = (built.b_module_data, match.group(1))
    return found


def measure(tree):
    """{module: {bytes, module_utils: [paths]}} of every module of the collection in tree (run in
    a process of its own: the collection loader is bound to one tree per process)."""
    found = {}
    for name, (wrapper, zip_data) in built_payloads(tree).items():
        with zipfile.ZipFile(io.BytesIO(base64.b64decode(zip_data))) as payload:
            names = payload.namelist()
        found[name] = {"bytes": len(wrapper),
                       "module_utils": sorted(n[len(OWN):] for n in names if n.startswith(OWN) and n.endswith(".py")
                                              and not n.endswith("__init__.py"))}
    return found


def in_process(tree):
    with tempfile.TemporaryDirectory() as local_tmp:
        env = dict(os.environ, ANSIBLE_LOCAL_TEMP=local_tmp)
        out = subprocess.run([sys.executable, __file__, "--measure", tree], env=env, capture_output=True,
                             text=True, check=True).stdout
    return json.loads(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", default="HEAD~1")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure)))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        other = os.path.join(tmp, "other")
        subprocess.run(["git", "worktree", "add", "--detach", "-q", other, args.against], cwd=REPO, check=True)
        try:
            before = in_process(other)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", other], cwd=REPO, check=True)
    now = in_process(REPO)
    print(f"{'module':<20} {args.against + ' bytes':>14} {'now bytes':>10} {'ratio':>6} "
          f"{'module_utils files before':>26} {'now':>4}")
    for name in sorted(set(before) | set(now)):
        was, isn = before.get(name), now.get(name)
        if not was or not isn:
            print(f"{name:<20} {'-' if not was else was['bytes']:>14} {'-' if not isn else isn['bytes']:>10}")
            continue
        print(f"{name:<20} {was['bytes']:>14} {isn['bytes']:>10} {isn['bytes'] / was['bytes']:>6.3f} "
              f"{len(was['module_utils']):>26} {len(isn['module_utils']):>4}")
        # the same files, by their names without the package: a file shipped now that was not before
        plain = {os.path.basename(p) for p in isn["module_utils"]} - {os.path.basename(p) for p in was["module_utils"]}
        if plain:
            print(f"{'':<20} shipped now, not before: {', '.join(sorted(plain))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
