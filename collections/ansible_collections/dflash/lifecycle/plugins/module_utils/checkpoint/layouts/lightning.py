# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""PyTorch Lightning's ModelCheckpoint files and last.ckpt.

Python 3.8 compatible; the rules come from the framework's source, named on the class.
"""

from __future__ import annotations

import os
import re
import signal

from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint import checkpoint_files
from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint.layouts.base import Layout


class Lightning(Layout):
    name = "lightning"
    title = "PyTorch Lightning ModelCheckpoint"
    source = ("lightning src/lightning/pytorch/callbacks/model_checkpoint.py (epoch=E-step=S.ckpt, "
              "last.ckpt a link or a copy); fabric/utilities/cloud_io.py _atomic_save (torch.save "
              "through an fsspec transaction: a temporary file moved into place)")
    entry = r"^(?!last(-v\d+)?\.ckpt$).*\.ckpt$"
    dirs = False
    aliases = ("last.ckpt", "last-v*.ckpt")
    pointer = "last.ckpt"
    # Lightning's SIGTERM handler only sets a flag: the batch and a save in it finish
    save_survives = frozenset({signal.SIGTERM})
    resume_rule = "last.ckpt (ckpt_path='last'); otherwise only the path given"

    def step(self, name, path):
        match = re.search(r"(?:^|[-_])step=(\d+)", name)
        if match:
            return int(match.group(1))
        return checkpoint_files.pickled_int(path, "global_step")

    def pointer_names(self, directory, name, info):
        last = os.path.join(directory, self.pointer)
        if os.path.islink(last):
            return checkpoint_files.read_pointer(directory, self.pointer) == name
        if os.path.isfile(last):  # a copy of the newest save: the same step
            return checkpoint_files.pickled_int(last, "global_step") == info["step"]
        return None

    def resume_pick(self, directory, infos):
        last = os.path.join(directory, self.pointer)
        if os.path.islink(last):
            return checkpoint_files.read_pointer(directory, self.pointer), "the checkpoint last.ckpt links to"
        if os.path.isfile(last):
            return self.pointer, "last.ckpt (a copy of the newest save)"
        return None, "none: without last.ckpt Lightning resumes only from the path given"
