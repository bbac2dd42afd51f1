# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The project's Proxmox hookscript on a node: where it goes, and what a CT's ``hookscript``
setting allows (Python 3.8 compatible; the decisions only, the pvesh and pct calls are the
module's).

A hookscript is a volume ``<storage>:snippets/<file>`` that pve-guest-common's
``check_hookscript`` resolves with ``PVE::Storage::path``: on a storage with a directory (dir, nfs,
cifs, cephfs, glusterfs) it is ``<path>/snippets/<file>``, on every node the CT may start on. A
storage the node cannot use (missing, disabled, restricted to other nodes, without the snippets
content) would make the CT's every start and stop warn, and a pre-start hookscript that is missing
aborts the start: each is refused before anything changes.
"""

from __future__ import annotations

import os
import pkgutil
import re

SCRIPT_NAME = "dflash-lifecycle-hook.py"
# the shell script of before 0.4.0, which took a gang's members from the CT: where a node still has
# it, the install makes it a link to the script above, and a CT that names it is set to the new name
LEGACY_SCRIPT_NAME = "dflash-lifecycle-hook.sh"
CHAIN_DIR = "dflash-lifecycle-hook.d"
VOLUME_RE = re.compile(r"^([a-z][a-z0-9\-_.]*[a-z0-9]):(snippets/[^/]+)$", re.IGNORECASE)


class Refused(Exception):
    """Nothing may change; the message names the variable or the setting at fault."""


def snippets_dir(storage, scfg, node):
    """The directory of storage's snippets on node, from its pvesh /storage/<id> options scfg (None:
    the storage does not exist); raises Refused naming why the node cannot hold the script."""
    if scfg is None:
        raise Refused(f"pve_hook_storage: storage '{storage}' does not exist in the cluster's storage.cfg")
    if str(scfg.get("disable", "0")) not in ("0", ""):
        raise Refused(f"pve_hook_storage: storage '{storage}' is disabled")
    nodes = [name for name in str(scfg.get("nodes") or "").split(",") if name]
    if nodes and node not in nodes:
        raise Refused(f"pve_hook_storage: storage '{storage}' is not available on node '{node}' (its nodes: "
                      f"{', '.join(nodes)}); the hookscript must be on every node a CT may run on")
    content = [kind for kind in str(scfg.get("content") or "").split(",") if kind]
    if "snippets" not in content:
        raise Refused(f"pve_hook_storage: storage '{storage}' does not hold snippets (content: "
                      f"{','.join(content) or 'none'}); add it with `pvesm set {storage} --content "
                      f"{','.join(content + ['snippets'])}`")
    if not scfg.get("path"):
        raise Refused(f"pve_hook_storage: storage '{storage}' (type {scfg.get('type')}) has no directory for snippets")
    return os.path.join(scfg["path"], "snippets")


def script_text():
    """The hookscript as the nodes get it: installed_hookscript.py whole, after its interpreter line
    (the module that installs it imports installed_hookscript, so its payload holds the file)."""
    return "#!/usr/bin/python3\n" + pkgutil.get_data(__package__, "installed_hookscript.py").decode()


def volume(storage, name=SCRIPT_NAME):
    return f"{storage}:snippets/{name}"


def is_ours(volid):
    """Whether a CT's hookscript setting names this project's script (or its legacy one), on any storage."""
    return bool(volid and VOLUME_RE.match(volid) and volid.rsplit("/", 1)[-1] in (SCRIPT_NAME, LEGACY_SCRIPT_NAME))


def plan_ct(vmid, current, ours, chain):
    """What to do with CT vmid's hookscript setting: (set_to or None, chain or None). current: its
    hookscript now; ours: this project's volume; chain: the volume the user asked to chain to, or
    None. Raises Refused for a hookscript of someone else's that chain does not name."""
    if chain is not None and not VOLUME_RE.match(chain):
        raise Refused(f"pve_hook_chain: '{chain}' is not a <storage>:snippets/<file> volume")
    if is_ours(chain):
        raise Refused(f"pve_hook_chain: '{chain}' is this project's own hookscript")
    if current is None or current == ours:
        return (None if current == ours else ours), chain
    if is_ours(current):  # the legacy script, or ours on another storage
        return ours, chain
    if chain == current:
        return ours, chain
    named = f" (pve_hook_chain: '{chain}' names another script)" if chain else ""
    raise Refused(
        f"CT {vmid} already has the hookscript {current}{named}: refused, it is not replaced. Chain to it (it runs "
        f"first, in every phase) with pve_hook_chain: {current} for this CT, or remove it with "
        f"`pct set {vmid} --delete hookscript`")
