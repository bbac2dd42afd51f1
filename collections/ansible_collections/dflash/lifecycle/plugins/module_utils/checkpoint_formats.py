# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a checkpoint of each training framework is, read from its own files (Python 3.8
compatible, standard library only: the CT has a bare Python). Each layout is a small object
that answers the same questions: is this entry of the directory a checkpoint, what is its
step, is it complete (and why not), is its save over, which one would the trainer's own resume
pick, and on which signals does the trainer save (or finish a save it is writing). The stop,
the launch and the status ask these objects; no framework's name appears anywhere else.

Completeness never rests on a quiet directory: it is the layout's own marker (the file it writes
last, or the pointer it moves last), and every file structurally valid for its kind
(module_utils/checkpoint_files.py). The rules come from each framework's source, named on its class.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import signal

from ansible_collections.dflash.lifecycle.plugins.module_utils import checkpoint_files

# not checkpoints: where the launch moves an incomplete one the resume would pick (never deleted),
# and where a gang's CTs leave the marks that prove they share the directory (preflight.py)
MOVED_ASIDE, GANG_MARKS = ".incomplete", ".dflash-gang"


class Layout:
    """One framework's way of saving. Subclasses set the class attributes and override the
    questions that differ."""

    name = ""
    title = ""
    source = ""
    entry = None            # regex of a checkpoint's name; group 1 its step
    dirs = True             # checkpoints are directories (else files)
    marker = None           # file a checkpoint directory holds once its save finished
    required = ()           # files (or alternatives, as tuples) a complete checkpoint holds
    aliases = ()            # names beside the checkpoints that are not checkpoints (globs)
    pointer = None          # a file or link naming the checkpoint the resume loads
    saves_on = frozenset()  # signals whose handler writes a checkpoint
    save_survives = frozenset()  # signals during which a save in progress still finishes
    resume_rule = ""
    # whether complete means the save is over: its last write is the marker, a rename into place
    # or DCP's .metadata; where it is not, the pointer is the mark, or only a quiet directory tells
    marks_completion = True

    def claims(self, name, path, is_dir):
        if is_dir != self.dirs or self.is_alias(name):
            return False
        return bool(self.entry and re.match(self.entry, name))

    def is_alias(self, name):
        return any(fnmatch.fnmatch(name, pat) for pat in self.aliases)

    def step(self, name, path):
        match = re.match(self.entry, name) if self.entry else None
        return int(match.group(1)) if match and match.group(1) else None

    def sort_key(self, name, info):
        return (info["step"] if info["step"] is not None else -1, info["mtime"])

    def marker_problems(self, directory, name, path, files):
        """Problems beyond the files themselves: the layout's own marker, and (whatever the
        layout) torch.distributed.checkpoint data without the .metadata DCP renames into place last."""
        found = checkpoint_files.dcp_problems(path, files)
        if self.marker and self.marker not in files:
            found.append(f"no {self.marker} ({self.title} writes it last: the save did not finish)")
        for need in self.required:
            options = need if isinstance(need, tuple) else (need,)
            if not any(_present(files, option) for option in options):
                found.append(f"no {' or '.join(options)}")
        return found

    def pointed(self, directory):
        """The entry the layout's pointer names, or None."""
        return checkpoint_files.read_pointer(directory, self.pointer) if self.pointer else None

    def pointer_names(self, directory, name, info):
        """Whether the layout's pointer designates checkpoint name: True or False, None when the
        layout keeps no pointer or none is there yet."""
        if not self.pointer or not os.path.lexists(os.path.join(directory, self.pointer)):
            return None
        return self.pointed(directory) == name

    def save_over(self, directory, name, info):
        """Whether the save of the complete checkpoint name is over: the pointer names it (True)
        or another (False); without a pointer, True where the layout marks completion, None where
        only a quiet directory can tell."""
        named = self.pointer_names(directory, name, info)
        if named is not None:
            return named
        return True if self.marks_completion else None

    def resume_pick(self, directory, infos):
        """(name, words): the checkpoint the trainer's own resume loads, or (None, words)."""
        pointed = self.pointed(directory)
        if pointed is not None:
            return pointed, f"the one {self.pointer} names"
        ranked = sorted(infos, key=lambda n: self.sort_key(n, infos[n]))
        return (ranked[-1] if ranked else None), self.resume_rule

    def evidence(self, directory, listing):
        """Why directory looks like this layout (its checkpoints by name), or None."""
        claimed = [n for n, is_dir in listing.items() if self.claims(n, os.path.join(directory, n), is_dir)]
        if not claimed:
            return None
        return f"{len(claimed)} entr{'y' if len(claimed) == 1 else 'ies'} like {claimed[0]}"

    def describe(self):
        return {"name": self.name, "title": self.title, "saves_on": sorted(s.name for s in self.saves_on),
                "save_survives": sorted(s.name for s in self.save_survives)}


def _present(files, pattern):
    return any(fnmatch.fnmatch(f, pattern) for f in files)


class StepDirs(Layout):
    name = "step_dirs"
    title = "step_N/ directories renamed into place, a latest pointer"
    source = ("this project's example trainer (tests/testbed/example_trainer): step_N/ written "
              "as .tmp-step_N-PID, renamed into place, then latest; it saves in its "
              "KeyboardInterrupt handler")
    entry = r"^step_(\d+)$"
    aliases = ("latest",)
    pointer = "latest"
    saves_on = frozenset({signal.SIGINT})
    save_survives = frozenset({signal.SIGINT})  # the handler writes the interrupted step again
    resume_rule = "the highest step_N (no latest pointer)"


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


class Custom(Layout):
    """A layout described by the user: pattern (glob), marker, step_regex and pointer."""

    name = "custom"
    title = "custom"
    source = "the checkpoint_custom settings"
    resume_rule = "the pointer's entry, else the highest step, unchecked"

    def __init__(self, settings):
        settings = settings or {}
        self.pattern = settings.get("pattern")
        if not self.pattern:
            raise InvalidLayout("checkpoint_custom.pattern: required with checkpoint_format=custom")
        self.marker = settings.get("marker") or None
        self.marks_completion = self.marker is not None
        self.pointer = settings.get("pointer") or None
        self.aliases = (self.pointer,) if self.pointer else ()
        self.step_regex = settings.get("step_regex") or None
        try:
            if self.step_regex and re.compile(self.step_regex).groups < 1:
                raise InvalidLayout(f"checkpoint_custom.step_regex: {self.step_regex!r} has no group for the step")
        except re.error as err:
            raise InvalidLayout(f"checkpoint_custom.step_regex: {err}") from None
        self.title = f"custom ({self.pattern})"

    def claims(self, name, path, is_dir):
        return not self.is_alias(name) and fnmatch.fnmatch(name, self.pattern)

    def step(self, name, path):
        match = re.search(self.step_regex, name) if self.step_regex else None
        return int(match.group(1)) if match else None


class InvalidLayout(ValueError):
    """A checkpoint format setting is wrong; the message names the setting."""


LAYOUTS = (StepDirs(), HFTrainer(), Lightning(), DeepSpeed(), DCP(), SpecForgeScripts(), SpecForge())
NAMES = ("auto",) + tuple(layout.name for layout in LAYOUTS) + ("custom",)
SAVES_ON = ("auto", "request", "SIGINT", "SIGTERM", "none")
# the options of every module that reads a checkpoint directory (doc fragment
# dflash.lifecycle.checkpoint_format)
ARGUMENT_SPEC = {
    "checkpoint_format": {"type": "str", "choices": list(NAMES), "default": "auto"},
    "checkpoint_custom": {"type": "dict", "options": {
        "pattern": {"type": "str", "required": True},
        "marker": {"type": "str"},
        "step_regex": {"type": "str"},
        "pointer": {"type": "str"},
    }},
}


def layout(name, custom=None):
    """The layout called name (None for auto); InvalidLayout for an unknown name."""
    if name == "auto":
        return None
    if name == "custom":
        return Custom(custom)
    for candidate in LAYOUTS:
        if candidate.name == name:
            return candidate
    raise InvalidLayout(f"checkpoint_format: {name!r} is not one of {', '.join(NAMES)}")


def listing(directory):
    """{name: is a directory} of what directory holds, without temporary names' filter."""
    found = {}
    try:
        names = os.listdir(directory)
    except OSError:
        return found
    for name in names:
        if name in (MOVED_ASIDE, GANG_MARKS):
            continue
        found[name] = os.path.isdir(os.path.join(directory, name)) and not os.path.islink(
            os.path.join(directory, name))
    return found


def recognise(directory, held=None):
    """(layout, reason) that the directory's entries show, or (None, reason) when none does.
    Several matching: the one that claims the most entries."""
    held = listing(directory) if held is None else held
    scored = []
    for candidate in LAYOUTS:
        words = candidate.evidence(directory, held)
        if words:
            claimed = sum(1 for n, d in held.items() if candidate.claims(n, os.path.join(directory, n), d))
            scored.append((claimed, -LAYOUTS.index(candidate), candidate, words))
    if not scored:
        shown = ", ".join(sorted(held)[:8]) + (" ..." if len(held) > 8 else "")
        return None, (f"no known checkpoint layout in {directory} (it holds {shown})" if held
                      else f"{directory} holds no checkpoint yet")
    scored.sort(reverse=True)
    best = scored[0]
    reason = f"auto: {best[3]}"
    if len(scored) > 1:
        reason += " (also like " + ", ".join(s[2].name for s in scored[1:]) + ")"
    return best[2], reason


def saves_on(setting, chosen):
    """(signals the trainer saves on, signals a save in progress survives, words) from the
    trainer_run_saves_on setting and the layout; (None, None, words) when unknown."""
    if setting and setting not in ("auto", "request"):
        signals = frozenset() if setting == "none" else frozenset({signal.Signals[setting]})
        survives = signals | (chosen.save_survives if chosen else frozenset())
        return signals, survives, f"saves_on={setting}"
    # saves_on=request: the stop request comes first (module_utils/stop_request.py); the signals
    # after a request not taken are the layout's
    setting = setting or "auto"
    if chosen is None:
        return None, None, f"saves_on={setting}, and the checkpoint layout is not known yet"
    words = (f"a {chosen.title} trainer saves on " + "/".join(sorted(s.name for s in chosen.saves_on))
             if chosen.saves_on else f"a {chosen.title} trainer saves nothing on a signal")
    return chosen.saves_on, chosen.saves_on | chosen.save_survives, f"saves_on={setting}: {words}"
