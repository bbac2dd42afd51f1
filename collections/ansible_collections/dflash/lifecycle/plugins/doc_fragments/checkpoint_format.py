# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    """How the modules that read a checkpoint directory know what a checkpoint is there."""

    DOCUMENTATION = r"""
options:
  checkpoint_format:
    description:
      - The checkpoint layout of the trainer, which says which entries of the checkpoint
        directory are checkpoints, each one's step, when one is complete and which one the
        trainer's own resume loads (the layouts table of the project's C(docs/architecture.md)).
      - V(step_dirs) - C(step_N/) directories renamed into place and a C(latest) pointer (the
        project's example trainer). V(hf_trainer) - C(checkpoint-N/), complete once
        C(trainer_state.json) is written with C(global_step) N. V(lightning) - C(*.ckpt) files,
        C(last.ckpt) an alias. V(deepspeed) - C(global_stepN/) tags, complete once C(latest)
        names them. V(dcp) - torch.distributed.checkpoint / torchtitan C(step-N/), complete once
        C(.metadata) is there. V(specforge_scripts) - C(epoch_E_step_S/) of SpecForge's older
        scripts, complete when every file they write is there. V(specforge) - SpecForge's
        C({run_id}-stepN/), complete once C(training_state.pt) is renamed into place.
        V(custom) - O(checkpoint_custom).
      - V(auto) recognises the layout from what the directory holds and reports which one it
        chose, and why; until the directory holds a checkpoint, no layout is chosen.
      - Whatever the layout, every file must be whole for its kind - a C(torch.save) zip
        (C(.pt), C(.pth), C(.ckpt), a zip C(.bin)) with its end record and every entry inside
        the file, a C(.safetensors) file whose tensors end exactly at its end, JSON that parses.
        Only headers and tails are read.
    type: str
    choices: [auto, step_dirs, hf_trainer, lightning, deepspeed, dcp, specforge_scripts, specforge, custom]
    default: auto
  checkpoint_custom:
    description: The layout of O(checkpoint_format=custom).
    type: dict
    suboptions:
      pattern:
        description: Glob of one checkpoint's name (a file or a directory).
        type: str
        required: true
      marker:
        description: A file a checkpoint directory holds only once its save finished.
        type: str
      step_regex:
        description: Regex on a checkpoint's name whose first group is its step; without it, steps are not known.
        type: str
      pointer:
        description: A file (holding a checkpoint's name) or a link the trainer's resume follows; without it, the resume is taken to load the highest step.
        type: str
"""
