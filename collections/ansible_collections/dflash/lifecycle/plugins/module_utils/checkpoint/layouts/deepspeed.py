# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""DeepSpeed's global_stepN/ tags and its latest file.

Python 3.8 compatible; the rules come from the framework's source, named on the class.
"""

from __future__ import annotations

import os
import re

from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint import checkpoint_files
from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint.layouts.base import Layout


class DeepSpeed(Layout):
    name = "deepspeed"
    title = "DeepSpeed save_checkpoint"
    source = ("DeepSpeed deepspeed/runtime/engine.py save_checkpoint, _save_checkpoint, "
              "_save_zero_checkpoint, _copy_recovery_script (model and optimizer states in "
              "the tag's directory, zero_to_fp32.py beside it, then latest); load_checkpoint "
              "reads latest")
    entry = r"^global_step(\d+)$"
    aliases = ("latest", "latest_universal", "zero_to_fp32.py")
    pointer = "latest"
    required = ("*model_states.pt",)
    resume_rule = "the tag latest names (no latest: nothing)"
    # in place, with quiet gathers between files: only latest, written last, says a save is over
    marks_completion = False

    def save_over(self, directory, name, info):
        return bool(self.pointer_names(directory, name, info))

    def claims(self, name, path, is_dir):
        if not is_dir or self.is_alias(name):
            return False
        if re.match(self.entry, name):
            return True
        try:  # a custom tag: a directory holding model states
            return any(f.endswith("model_states.pt") for f in os.listdir(path))
        except OSError:
            return False

    def step(self, name, path):
        step = super().step(name, path)
        if step is not None:
            return step
        try:
            states = sorted(f for f in os.listdir(path) if f.endswith("model_states.pt"))
        except OSError:
            return None
        return checkpoint_files.pickled_int(os.path.join(path, states[0]), "global_steps") if states else None

    def marker_problems(self, directory, name, path, files):
        found = super().marker_problems(directory, name, path, files)
        pointed = self.pointed(directory)
        named = os.path.join(directory, pointed) if pointed else None
        # latest is written last: a tag newer than the one it names did not finish (a latest cut
        # short names no tag, and says nothing of them)
        if not found and pointed != name and named and os.path.isdir(named) and \
                checkpoint_files.newest_mtime(path) > checkpoint_files.newest_mtime(named):
            found.append(f"latest names {pointed}, not {name} (DeepSpeed writes latest last: the save "
                         "did not finish)")
        return found

    def resume_pick(self, directory, infos):
        pointed = self.pointed(directory)
        return pointed, self.resume_rule if pointed is None else "the tag latest names"
