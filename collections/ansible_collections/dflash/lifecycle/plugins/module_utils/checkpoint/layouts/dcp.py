# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""torch.distributed.checkpoint's step-N/ directories and their .metadata.

Python 3.8 compatible; the rules come from the framework's source, named on the class.
"""

from __future__ import annotations

import os

from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint import checkpoint_files
from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint.layouts.base import Layout


class DCP(Layout):
    name = "dcp"
    title = "torch.distributed.checkpoint (torchtitan)"
    source = ("torch/distributed/checkpoint/filesystem.py _FileSystemWriter.finish (data files "
              "__R_I.distcp in place, then .metadata.tmp renamed to .metadata); torchtitan "
              "components/checkpointer/dcp.py (step-N, the highest step with .metadata loads)")
    entry = r"^step-(\d+)$"
    resume_rule = "the highest step-N holding .metadata"

    def marker_problems(self, directory, name, path, files):
        return checkpoint_files.dcp_problems(path, files) if checkpoint_files.has_dcp_metadata(files) else [checkpoint_files.NO_DCP_METADATA]

    def resume_pick(self, directory, infos):
        done = [n for n in infos if os.path.exists(os.path.join(directory, n, ".metadata"))]
        ranked = sorted(done, key=lambda n: infos[n]["step"])
        return (ranked[-1] if ranked else None), self.resume_rule
