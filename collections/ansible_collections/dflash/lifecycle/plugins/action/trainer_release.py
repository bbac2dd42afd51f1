# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin of dflash.lifecycle.trainer_release: ansible-core's normal action, the module's payload
kept from one run to the next (plugin_utils/payload_cache.py)."""

from __future__ import annotations

from ansible.plugins.action.normal import ActionModule as NormalAction

from ansible_collections.dflash.lifecycle.plugins.plugin_utils.payload_cache import CachedPayloadAction


class ActionModule(CachedPayloadAction, NormalAction):
    pass
