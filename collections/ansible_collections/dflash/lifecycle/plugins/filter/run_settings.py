# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters over the DFlash run's settings (plugin_utils/run_settings.py holds the rules)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.dflash.lifecycle.plugins.plugin_utils import run_settings


def _filter_errors(function):
    def wrapped(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except run_settings.SettingsError as err:
            raise AnsibleFilterError(str(err)) from None
    wrapped.__name__ = function.__name__
    wrapped.__doc__ = function.__doc__
    return wrapped


class FilterModule:
    """dflash_argv, dflash_gpus_needed, dflash_env_pairs, dflash_launcher_env."""

    def filters(self):
        return {"dflash_argv": _filter_errors(run_settings.argv),
                "dflash_launcher_env": _filter_errors(run_settings.launcher_env),
                "dflash_gpus_needed": _filter_errors(run_settings.gpus_needed),
                "dflash_env_pairs": _filter_errors(run_settings.env_pairs)}
