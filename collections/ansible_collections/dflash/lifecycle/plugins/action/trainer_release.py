# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin of dflash.lifecycle.trainer_release: ansible-core's normal action, with the CT's answer checked
before ansible-core reads it and the module's payload kept (plugin_utils/ct_action.py)."""

from __future__ import annotations

from ansible.plugins.action.normal import ActionModule as NormalAction

from ansible_collections.dflash.lifecycle.plugins.plugin_utils.ct_action import CTModuleAction


class ActionModule(CTModuleAction, NormalAction):
    pass
