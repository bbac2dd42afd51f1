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
(module_utils/checkpoint/checkpoint_files.py). The rules come from each framework's source, named on
its class: one file per layout under module_utils/checkpoint/layouts/.
"""

from __future__ import annotations

import os
import signal

from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint.layouts.base import InvalidLayout
from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint.layouts.custom import Custom
from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint.layouts.dcp import DCP
from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint.layouts.deepspeed import DeepSpeed
from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint.layouts.hf_trainer import HFTrainer
from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint.layouts.lightning import Lightning
from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint.layouts.specforge import SpecForge, SpecForgeScripts
from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint.layouts.step_dirs import StepDirs

# not checkpoints: where the launch moves an incomplete one the resume would pick (never deleted),
# and where a gang's CTs leave the marks that prove they share the directory (preflight.py)
MOVED_ASIDE, GANG_MARKS = ".incomplete", ".dflash-gang"

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
    # saves_on=request: the stop request comes first (module_utils/stop/stop_request.py); the signals
    # after a request not taken are the layout's
    setting = setting or "auto"
    if chosen is None:
        return None, None, f"saves_on={setting}, and the checkpoint layout is not known yet"
    words = (f"a {chosen.title} trainer saves on " + "/".join(sorted(s.name for s in chosen.saves_on))
             if chosen.saves_on else f"a {chosen.title} trainer saves nothing on a signal")
    return chosen.saves_on, chosen.saves_on | chosen.save_survives, f"saves_on={setting}: {words}"
