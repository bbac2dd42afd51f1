# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""HF transformers Trainer's checkpoint-N/ directories.

Python 3.8 compatible; the rules come from the framework's source, named on the class.
"""

from __future__ import annotations

import json
import os

from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint import checkpoint_files
from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint.layouts.base import Layout


class HFTrainer(Layout):
    name = "hf_trainer"
    title = "HF transformers Trainer"
    source = ("transformers src/transformers/trainer.py _save_checkpoint (model, tokenizer, "
              "training_args.bin, optimizer.pt, scheduler.pt, rng_state.pth, then "
              "trainer_state.json, then _rotate_checkpoints); trainer_utils.get_last_checkpoint")
    entry = r"^checkpoint-(\d+)$"
    marker = "trainer_state.json"
    resume_rule = "the highest checkpoint-N, unchecked (get_last_checkpoint)"

    def marker_problems(self, directory, name, path, files):
        found = super().marker_problems(directory, name, path, files)
        if found:
            return found
        try:
            with open(os.path.join(path, self.marker), "rb") as handle:
                step = json.loads(handle.read()).get("global_step")
        except (OSError, ValueError, AttributeError):
            return []  # the file check reports it
        if step != self.step(name, path):
            found.append(f"trainer_state.json says global_step {step}, not {self.step(name, path)}")
        index = os.path.join(path, "model.safetensors.index.json")
        if os.path.exists(index):
            found.extend(checkpoint_files.sharded_problems(index, files))
        return found

    def resume_pick(self, directory, infos):
        ranked = sorted(infos, key=lambda n: infos[n]["step"])
        return (ranked[-1] if ranked else None), self.resume_rule
