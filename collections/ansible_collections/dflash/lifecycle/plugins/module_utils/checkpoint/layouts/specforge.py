# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""SpecForge's two ways of saving: its scripts' epoch_N_step_M/ and its trainer's.

Python 3.8 compatible; the rules come from the framework's source, named on the class.
"""

from __future__ import annotations

import os
import re

from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint import checkpoint_files
from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint.layouts.base import Layout


class SpecForgeScripts(Layout):
    name = "specforge_scripts"
    title = "SpecForge scripts/train_*.py (epoch_E_step_S)"
    source = ("SpecForge scripts/train_dflash.py, train_eagle3.py save_checkpoint "
              "(training_state.pt, then save_pretrained: config.json, model.safetensors, then "
              "a copy of the model code; no marker); specforge/utils.py get_last_checkpoint")
    entry = r"^epoch_(\d+)(?:_step_(\d+))?$"
    required = ("training_state.pt", "config.json", ("model.safetensors", "model.safetensors.index.json",
                                                     "pytorch_model.bin"))
    resume_rule = "the highest (epoch, step), unchecked (get_last_checkpoint)"
    # no marker: the model code is copied after the weights
    marks_completion = False

    def step(self, name, path):
        match = re.match(self.entry, name)
        return int(match.group(2)) if match and match.group(2) else None

    def sort_key(self, name, info):
        match = re.match(self.entry, name)
        return (int(match.group(1)), int(match.group(2) or 0))

    def marker_problems(self, directory, name, path, files):
        found = super().marker_problems(directory, name, path, files)
        index = os.path.join(path, "model.safetensors.index.json")
        if os.path.exists(index):
            found.extend(checkpoint_files.sharded_problems(index, files))
        return found


class SpecForge(Layout):
    name = "specforge"
    title = "SpecForge CheckpointManager ({run_id}-stepN, {run_id}-latest)"
    source = ("SpecForge specforge/training/checkpoint.py CheckpointManager.save (rank files and "
              "training_state.pt each torch.save to a .tmp and renamed, then the {run_id}-latest "
              "link); resolve_resume_dir, latest_dir")
    entry = r"^.+-step(\d+)$"
    marker = "training_state.pt"
    aliases = ("*-latest", "*-best", "*.best_meta.json")
    resume_rule = "the *-latest link, else the highest step holding training_state.pt"

    @staticmethod
    def latest_links(directory):
        try:
            return sorted(n for n in os.listdir(directory) if n.endswith("-latest")
                          and os.path.islink(os.path.join(directory, n)))
        except OSError:
            return []

    def pointer_names(self, directory, name, info):
        links = [n for n in self.latest_links(directory) if name.startswith(n[:-len("latest")])]
        return checkpoint_files.read_pointer(directory, links[0]) == name if links else None

    def resume_pick(self, directory, infos):
        links = self.latest_links(directory)
        if len(links) == 1:
            return checkpoint_files.read_pointer(directory, links[0]), f"the one {links[0]} links to"
        done = [n for n in infos if not infos[n]["problems"]]
        ranked = sorted(done, key=lambda n: infos[n]["step"])
        return (ranked[-1] if ranked else None), self.resume_rule
