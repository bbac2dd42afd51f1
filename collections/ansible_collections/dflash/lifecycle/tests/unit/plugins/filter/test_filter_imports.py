"""The filter files load no module_utils of their own: to find any one filter of the collection,
ansible-core loads every filter file of it in the worker of each task that names one, compiling
what they import from source (docs/performance.md, "Filters load lazily"). What they may import
as they load is what ansible-playbook's main process has imported before it forks the workers:
it loads each task's action plugin there. A filter that needs more imports it when it runs."""

import os
import subprocess
import sys

import ansible_collections

PLUGINS = os.path.join(os.path.dirname(os.path.abspath(__file__)), *[os.pardir] * 4, "plugins")

LOAD = """
import importlib, sys
from ansible.utils.collection_loader._collection_finder import _AnsibleCollectionFinder
_AnsibleCollectionFinder(paths=[sys.argv[1]])._install()
prefix = "ansible_collections.dflash.lifecycle.plugins."
before = set(sys.modules)
for name in sys.argv[2:]:
    importlib.import_module(prefix + name)
print("\\n".join(sorted(m[len(prefix):] for m in set(sys.modules) - before if m.startswith(prefix))))
"""


def loaded_by(kind):
    """The collection's modules that loading every plugin file of kind imports, in a fresh interpreter."""
    root = next(os.path.dirname(path) for path in ansible_collections.__path__
                if os.path.isdir(os.path.join(path, "dflash", "lifecycle")))
    names = sorted(f"{kind}.{name[:-3]}" for name in os.listdir(os.path.join(PLUGINS, kind)) if name.endswith(".py"))
    out = subprocess.run([sys.executable, "-c", LOAD, root, *names], capture_output=True, text=True, check=True).stdout
    return {module for module in out.split() if module.startswith(("module_utils.", "plugin_utils."))}


def test_the_filter_files_load_only_what_the_action_plugins_loaded_before_the_workers():
    by_filters, by_actions = loaded_by("filter"), loaded_by("action")
    assert by_actions, "the action plugins import no module_utils: this test no longer sees them"
    assert by_filters <= by_actions, sorted(by_filters - by_actions)
