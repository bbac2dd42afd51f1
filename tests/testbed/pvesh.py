#!/usr/bin/python3
"""Stand-in for Proxmox VE's ``pvesh`` on a testbed node, for the calls the project makes:

    pvesh get /cluster/resources --type vm --output-format json
    pvesh get /cluster/status --output-format json
    pvesh get /storage/<storage> --output-format json

Faithful to pve-manager ``PVE/API2/Cluster.pm`` ``resources`` (what it lists for a container:
``id`` ``lxc/<vmid>``, ``type`` ``lxc``, ``vmid``, ``name``, ``node``, ``status``, ``tags`` as the
config's semicolon-separated string, ``template``, ``maxmem``, ``maxcpu``, ``uptime``) and to
``pvesh``'s ``--output-format json`` (one JSON array on stdout). The answer covers every node
of the cluster, as pmxcfs shows every node's ``/etc/pve/nodes/<node>/lxc`` to each of them: this
copy reads its sibling nodes' directories of the testbed's state. An unknown path or option fails
as the real tool does (``No 'get' handler defined for '<path>'``, exit 255).

``/cluster/status`` is pve-manager ``PVE/API2/Cluster.pm`` ``get_status``: a ``cluster`` entry, then
one ``node`` entry per member of the node's ``/etc/pve/.members`` (``id`` ``node/<name>``, ``name``,
``nodeid``, ``local`` 1 for this node, ``online``, ``ip`` - what PVE::Cluster::remote_node_ip gives
a migration), which the testbed writes as pmxcfs keeps it.

``/storage/<storage>`` is pve-storage ``PVE/API2/Storage/Config.pm`` ``read``: the storage's
options from storage.cfg (``content`` and ``nodes`` as comma-separated strings), or
``storage '<id>' does not exist``. The testbed's nodes share one file system, so each node keeps
its own copy of the cluster's storage.cfg, its ``dir`` storages' paths under its own directory.
"""

import json
import os
import sys

import pct  # the node's stand-in beside this file (bin/pct.py; tests/testbed/pct.py in the repository)

DIE_EXIT = 255


def resources(nodes_root):
    found = []
    for name in sorted(os.listdir(nodes_root)):
        node = pct.Node(os.path.join(nodes_root, name))
        for vmid in node.vmids():
            conf = node.load_config(vmid)
            running = node.check_running(vmid)
            found.append({
                "id": f"lxc/{vmid}", "type": "lxc", "vmid": vmid, "name": conf.get("hostname", f"CT{vmid}"),
                "node": name, "status": "running" if running else "stopped", "tags": conf.get("tags", ""),
                "template": 0, "maxmem": int(conf.get("memory", 512)) * 1024 * 1024,
                "maxcpu": int(conf.get("cores", 1)), "uptime": 1 if running else 0,
            })
    return found


def storage(node_dir, storeid, options):
    """pvesh get /storage/<storeid>: its options, as JSON with --output-format json."""
    scfg = pct.Node(node_dir).storage_config().get(storeid)
    if scfg is None:
        sys.stderr.write(f"storage '{storeid}' does not exist\n")
        return DIE_EXIT
    if options.get("--output-format") == "json":
        sys.stdout.write(json.dumps(scfg) + "\n")
    else:
        for key, value in sorted(scfg.items()):
            sys.stdout.write(f"{key}: {value}\n")
    return 0


def status(node_dir):
    """pvesh get /cluster/status: the cluster and its members, from the node's .members."""
    with open(os.path.join(node_dir, "etc/pve/.members"), encoding="utf-8") as handle:
        members = json.load(handle)
    cluster = members["cluster"]
    found = [{"type": "cluster", "id": "cluster", "nodes": cluster["nodes"], "version": cluster["version"],
              "name": cluster["name"], "quorate": cluster["quorate"]}]
    for name, member in members["nodelist"].items():
        found.append({"type": "node", "id": f"node/{name}", "name": name, "nodeid": member["id"],
                      "local": 1 if name == members["nodename"] else 0, "online": member["online"],
                      "ip": member["ip"], "level": ""})
    return found


def main(argv):
    os.environ["PATH"] = pct.CLI_PATH
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    options = dict(zip(argv[2::2], argv[3::2]))
    if len(argv) >= 2 and argv[0] == "get" and argv[1].startswith("/storage/"):
        return storage(here, argv[1][len("/storage/"):], options)
    if argv[:2] == ["get", "/cluster/status"] and set(options) <= {"--output-format"}:
        sys.stdout.write(json.dumps(status(here)) + "\n")
        return 0
    if argv[:2] != ["get", "/cluster/resources"]:
        sys.stderr.write(f"No '{argv[0] if argv else ''}' handler defined for '{argv[1] if len(argv) > 1 else ''}'\n")
        return DIE_EXIT
    unknown = sorted(set(options) - {"--type", "--output-format"})
    if unknown:
        sys.stderr.write(f"400 Parameter verification failed.\n{unknown[0][2:]}: property is not defined in "
                         "schema and the schema does not allow additional properties\n")
        return DIE_EXIT
    if options.get("--type", "vm") != "vm":  # the testbed has no storage, node or sdn resources to list
        sys.stderr.write(f"400 Parameter verification failed.\ntype: value '{options['--type']}' does not have a "
                         "value in the enumeration 'vm, storage, node, sdn'\n")
        return DIE_EXIT
    listed = resources(os.path.dirname(here))
    if options.get("--output-format") == "json":
        sys.stdout.write(json.dumps(listed) + "\n")
    else:
        for item in listed:
            sys.stdout.write(f"{item['id']:<12} {item['node']:<8} {item['status']:<8} {item['name']}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
