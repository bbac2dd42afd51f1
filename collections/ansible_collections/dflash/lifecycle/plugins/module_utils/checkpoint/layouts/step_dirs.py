# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""This project's own layout: the example trainer's step_N/ directories.

Python 3.8 compatible; the rules come from the framework's source, named on the class.
"""

from __future__ import annotations

import signal

from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint.layouts.base import Layout


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
