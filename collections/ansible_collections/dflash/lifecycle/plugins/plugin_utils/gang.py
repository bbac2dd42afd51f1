# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A gang: the CTs of one training run across nodes, a torchrun agent in each (controller side).

The gang is the inventory group that ``trainer_run_gang`` names (set once, as that group's
variable; the group a child of ``dflash_gangs``); each CT's place in it is ``trainer_run_gang_rank`` (0 .. N-1) and its address, as the
gang's other CTs reach it, ``trainer_run_gang_address``. From them come torchrun's ``--nnodes``,
the rendezvous endpoint (rank 0's address and ``trainer_run_gang_port``), each launch's
rendezvous id and, for the static rendezvous, each CT's ``--node-rank``. With c10d (torchrun's
elastic rendezvous) torch itself orders the nodes, by the address each gives as
``--local-addr`` (``dynamic_rendezvous.py``: the participants sorted): which CT's ranks log and
save is then read from the processes, never assumed.

A gang is redeployed as one: every phase runs on every CT, and a CT that fails a phase fails the
others right after it (``barrier``), before the next phase touches anything. Everything here is
pure: the filters (plugins/filter/gang.py) hand it the members' registered results.
"""

from __future__ import annotations

import hashlib
import time

from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint import checkpoint_verdict
from ansible_collections.dflash.lifecycle.plugins.module_utils.gang_agreement import (
    _ok, _why, checkpoint_problems, gang_checkpoint)
from ansible_collections.dflash.lifecycle.plugins.module_utils.launch import launchers
from ansible_collections.dflash.lifecycle.plugins.plugin_utils import canary as throughput_canary

RENDEZVOUS = ("c10d", "static")
# the group every gang's group is a child of: a job limited to one gang runs it in one batch
GANGS_GROUP = "dflash_gangs"
# what a CT of a gang says of itself (identity)
IDENTITY = ("trainer_run_gang", "trainer_run_gang_rank", "trainer_run_gang_address", "trainer_run_gang_port",
            "trainer_run_gang_rendezvous", "trainer_run_launcher", "trainer_run_launcher_options")
# the launcher options a gang sets itself
DERIVED = ("nnodes", "node_rank", "rdzv_backend", "rdzv_endpoint", "rdzv_id", "local_addr", "master_addr",
           "master_port", "standalone")
# what every CT of a gang sets alike, besides its dflash_* flags: one run, one release, one
# launcher (the environment may differ: NCCL_SOCKET_IFNAME, for one)
AGREED = ("trainer_code_src", "trainer_run_launcher", "trainer_run_launcher_options", "trainer_run_python",
          "trainer_run_script", "trainer_run_checkpoint_dir", "trainer_run_checkpoint_format",
          "trainer_run_saves_on", "trainer_run_gang_rendezvous", "trainer_run_gang_port")
NOT_AGREED = ("dflash_env", "dflash_secret_env")


class GangError(ValueError):
    """A gang setting is wrong; the message names the variable."""


def agreed_names(names):
    """The variables of names whose values every CT of a gang must share."""
    return sorted(n for n in names if n in AGREED or (n.startswith("dflash_") and n not in NOT_AGREED))


def identity(host, values, groups, gpus_given):
    """What one CT of a gang says of itself, checked (validate_settings returns it): {name, rank,
    address, port, rendezvous, agreed}. values: the CT's variables, templated (trainer_run_gang*,
    the launcher's, and agreed_names()'s). GangError names the first bad variable."""
    name = str(values["trainer_run_gang"])
    if host not in (groups or {}).get(name, []):
        raise GangError(f"trainer_run_gang: {name} is not an inventory group that holds {host} (a gang is the "
                        "group of its CTs, and names itself: trainer_run_gang set as the group's variable)")
    if host not in (groups or {}).get(GANGS_GROUP, []):
        raise GangError(f"trainer_run_gang: the group {name} of {host} must be a child of group {GANGS_GROUP} "
                        "(a job limited to the gang then runs it in one batch)")
    rank = values.get("trainer_run_gang_rank")
    if isinstance(rank, bool) or not str(rank).isdigit():
        raise GangError(f"trainer_run_gang_rank: {host} of gang {name} needs its node rank, an integer >= 0, "
                        f"got {rank!r}")
    rendezvous = values.get("trainer_run_gang_rendezvous", "c10d")
    if rendezvous not in RENDEZVOUS:
        raise GangError(f"trainer_run_gang_rendezvous: one of {', '.join(RENDEZVOUS)}, got {rendezvous!r}")
    port = values.get("trainer_run_gang_port", 29500)
    if isinstance(port, bool) or not str(port).isdigit() or not 0 < int(port) < 65536:
        raise GangError(f"trainer_run_gang_port: a TCP port, got {port!r}")
    address = str(values.get("trainer_run_gang_address") or "").strip()
    if address and (any(c.isspace() for c in address) or "/" in address):
        raise GangError(f"trainer_run_gang_address: an address or a host name, got {address!r}")
    launcher = values.get("trainer_run_launcher", "python")
    if launcher != "torchrun":
        raise GangError(f"trainer_run_launcher: a gang ({name}) runs as one torchrun job across its CTs; "
                        f"{host} has {launcher!r}")
    options = values.get("trainer_run_launcher_options") or {}
    for option in DERIVED:
        if option in options:
            raise GangError(f"trainer_run_launcher_options.{option}: set by the gang {name} itself "
                            "(its size, ranks, rendezvous): remove it")
    ranks = options.get("nproc_per_node")
    if isinstance(ranks, bool) or not str(ranks).isdigit():
        raise GangError(f"trainer_run_launcher_options.nproc_per_node: a gang's CTs each run a known number of "
                        f"ranks (an integer), got {ranks!r}")
    try:
        per_rank = launchers.gpus_per_rank("nproc_per_node", int(ranks), int(gpus_given))
    except launchers.LauncherError as err:
        raise GangError(f"{err} (on {host})") from None
    agreed = {n: values[n] for n in agreed_names(values)}
    return {"name": name, "rank": int(rank), "address": address, "port": int(port), "rendezvous": rendezvous,
            "ranks": int(ranks), "gpus_per_rank": per_rank, "agreed": agreed}


def members_problems(name, checked, job_hosts):
    """The gang's problems as a whole, one line each: a CT left out of the job or split from the
    others by the serial, ranks given twice or missing, rank 0 (or, under c10d, any CT) without
    an address, settings that differ. checked: {member: its validate_settings result, or None
    when it has none (another batch of the job, or not in the job)}."""
    found = []
    left_out = [h for h in checked if h not in job_hosts]
    if left_out:
        found.append(f"{', '.join(left_out)} of gang {name} not in this job (--limit): a gang is redeployed "
                     f"whole; name its group (HOST={name})")
    split = [h for h, r in checked.items() if h in job_hosts and r is None]
    if split:
        found.append(f"redeploy_serial splits gang {name} ({len(checked)} CTs): {', '.join(split)} would run "
                     "in another batch; give a serial of whole gangs, its CTs next to each other in the inventory")
    failed = [h for h, r in checked.items() if r is not None and (r.get("failed") or not r.get("gang"))]
    if failed:
        found.append(f"the settings of {', '.join(failed)} failed (above)")
    identities = {h: r["gang"] for h, r in checked.items() if r is not None and not r.get("failed") and r.get("gang")}
    return found + _identity_problems(name, identities, len(checked))


def _identity_problems(name, known, size):
    found = []
    if not known:
        return found
    by_rank = {}
    for host, ident in sorted(known.items()):
        by_rank.setdefault(ident["rank"], []).append(host)
    for rank, hosts in sorted(by_rank.items()):
        if len(hosts) > 1:
            found.append(f"trainer_run_gang_rank: {rank} is given to {' and '.join(hosts)} of gang {name}")
    if len(known) == size:
        missing = sorted(set(range(size)) - set(by_rank))
        if missing:
            found.append(f"trainer_run_gang_rank: gang {name} has {size} CTs, ranks "
                         f"{', '.join(map(str, sorted(by_rank)))}: rank {', '.join(map(str, missing))} missing "
                         "(0 .. N-1, each once)")
    first = by_rank.get(0, [None])[0]
    if first is not None and not known[first]["address"]:
        found.append(f"trainer_run_gang_address: missing on {first}, rank 0 of gang {name}: the other CTs reach "
                     "the rendezvous there")
    if any(i["rendezvous"] == "c10d" for i in known.values()):
        blank = [h for h, i in sorted(known.items()) if not i["address"] and h != first]
        if blank:
            found.append(f"trainer_run_gang_address: missing on {', '.join(blank)} of gang {name}: under the c10d "
                         "rendezvous every CT gives its address (--local-addr), as torch orders the nodes by it")
    reference = known.get(first) or next(iter(known.values()))
    reference_host = first or next(iter(known))
    for host, ident in sorted(known.items()):
        if host == reference_host:
            continue
        for var in sorted(set(reference["agreed"]) | set(ident["agreed"])):
            mine, theirs = reference["agreed"].get(var), ident["agreed"].get(var)
            if mine != theirs:
                found.append(f"{var}: {host} has {_short(theirs)}, {reference_host} {_short(mine)}: the CTs of gang "
                             f"{name} run one job and set it alike (only trainer_run_gang_rank and "
                             "trainer_run_gang_address differ)")
                break
    return found


def _short(value):
    text = "unset" if value is None else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def plan(host, identities, holder=""):
    """This CT's part of the gang: {name, rendezvous, size, rank, members (by rank), first,
    endpoint, address, ranks, gpus_per_rank, rdzv_id}. identities as members_problems' (all known)."""
    mine = identities[host]
    ordered = sorted(identities, key=lambda h: identities[h]["rank"])
    first = identities[ordered[0]]
    address = first["address"]
    endpoint = f"[{address}]:{first['port']}" if ":" in address else f"{address}:{first['port']}"
    digest = hashlib.sha256(f"{mine['name']} {holder}".encode()).hexdigest()[:12]
    return {"name": mine["name"], "rendezvous": mine["rendezvous"], "size": len(ordered), "rank": mine["rank"],
            "members": ordered, "first": ordered[0], "endpoint": endpoint, "address": mine["address"],
            "ranks": mine["ranks"], "gpus_per_rank": mine["gpus_per_rank"], "rdzv_id": f"{mine['name']}-{digest}"}


def launcher_options(gang, options, attempt=1):
    """The torchrun options of this CT's launch in the gang: the run's own, and the gang's size,
    rendezvous (backend, endpoint, an id per launch attempt: the relaunch after a failure joins
    a rendezvous of its own), this CT's address, and its node rank under the static rendezvous
    (c10d orders the nodes itself and ignores --node-rank)."""
    chosen = dict(options or {})
    chosen.update(nnodes=gang["size"], rdzv_backend=gang["rendezvous"], rdzv_endpoint=gang["endpoint"],
                  rdzv_id=f"{gang['rdzv_id']}-{attempt}")
    if gang["rendezvous"] == "static":
        chosen["node_rank"] = gang["rank"]
    if gang["address"]:
        chosen["local_addr"] = gang["address"]
    return chosen


def phase_problems(gang, results, phase, check_mode=False, on_missing_checkpoint="fail", after=None):
    """What stops the gang after a phase, one line each: a member whose result of the phase is
    missing or failed, and what the gang must agree on after it. results: {member: its
    registered result of the phase, or None}; after: {member: what trainer_info read on it once
    the phase had ended on every member, or None} - after the launch whether its run still
    runs, after the stop what it sees of the shared checkpoint directory."""
    what = {"release": "build the release", "preflight": "pass its preflight", "push": "install the release",
            "rollback": "switch back to its previous release", "stop": "stop", "launch": "launch"}[phase]
    found = [_why(h, r, what) for h, r in results.items() if not _ok(r)]
    if phase == "launch":
        found += [_ended(h, results[h], read) for h, read in (after or {}).items()
                  if _ok(results[h]) and _ok(read) and not read.get("skipped") and (
                      not read.get("running") or read.get("run_id") != results[h].get("run_id")
                      or read.get("traceback"))]
    if found:
        return found
    if phase == "release":
        releases = {h: r.get("release") for h, r in results.items()}
        if len(set(releases.values())) > 1:
            found.append("the release differs: " + ", ".join(f"{h} {r}" for h, r in releases.items())
                         + " (trainer_code_src must be the same code for every CT)")
    elif phase == "rollback":
        previous = {h: r.get("rolled_back_to") for h, r in results.items()}
        if len(set(previous.values())) > 1:
            found.append("the previous release differs: " + ", ".join(f"{h} {r}" for h, r in previous.items())
                         + " (the CTs of a gang run one release; roll them forward with redeploy.yml instead)")
    elif phase == "preflight":
        found += _listing_problems(gang, results)
    elif phase == "stop" and not check_mode:
        found += checkpoint_problems(results, on_missing_checkpoint, after)
    return found


def _ended(host, launched, read):
    """A CT whose run ended (or, its agent tearing down, printed a traceback) after its launch was
    healthy, with the exception its log names."""
    lines = read.get("traceback") or read.get("log_tail") or []
    how = "printed a traceback (its agent tearing down)" if read.get("running") else "ended"
    return (f"{host}: its run (PID {launched.get('pid')}) {how} after its launch was healthy"
            + (f": {lines[-1].strip()}" if lines else ""))


def _listing_problems(gang, results):
    """Every CT that will resume must see the same checkpoint directory (a mount point on shared
    storage; copies that differ would make the ranks resume from different states). Proved by
    the marks each CT's preflight wrote and read there (gang_marks): listings of a live run's
    directory, taken on two CTs at two moments, differ by a save or a rotation in between. The
    listings only name the difference when a mark is missing."""
    found = []
    first = gang["first"]
    listings = {h: ((r.get("checkpoint") or {}).get("listing") or {}) for h, r in results.items()}
    for host, result in results.items():
        marks = (result.get("checkpoint") or {}).get("gang_marks") or {}
        if not marks.get("checked") or not marks.get("missing"):
            continue
        words = _listing_words(first, listings.get(first, {}), host, listings[host]) if host != first else ""
        found.append(f"{host} does not see the marks of {', '.join(marks['missing'])} in {marks['dir']} within "
                     f"{marks['waited_s']}s" + (f" ({words})" if words else "")
                     + ": the CTs of a gang resume from one directory (a mount point on shared storage)")
    return found


def _listing_words(first, reference, host, listing):
    only_first = sorted(set(reference) - set(listing))
    only_here = sorted(set(listing) - set(reference))
    differ = sorted(n for n in set(reference) & set(listing) if reference[n] != listing[n])
    words = [f"only on {first}: {', '.join(only_first)}" if only_first else "",
             f"only on {host}: {', '.join(only_here)}" if only_here else "",
             "differ: " + ", ".join(f"{n} ({_entry(reference[n])} on {first}, {_entry(listing[n])} on {host})"
                                    for n in differ) if differ else ""]
    return "; ".join(w for w in words if w)


def _entry(entry):
    size, complete = entry
    return f"{size} bytes, {'complete' if complete else 'incomplete'}"


def skew(results):
    """The stop's signals over the gang: {skew_ms, first, order [(host, offset ms)], spare [host,
    s] or None}, from the wall-clock moment each CT's stop sent its first signal (the nodes'
    clocks: NTP keeps them within milliseconds), and the CT that was ready the least time before
    the gang's moment; None when fewer than two sent one."""
    stops = {h: r for h, r in results.items() if isinstance(r, dict) and r.get("signalled_at")}
    if len(stops) < 2:
        return None
    order = sorted(((h, r["signalled_at"]) for h, r in stops.items()), key=lambda item: item[1])
    start = order[0][1]
    spares = [(h, r["signal_spare_s"]) for h, r in stops.items() if r.get("signal_spare_s") is not None]
    # a stop request taken: the step at which each CT's ranks acknowledged it
    steps = {h: ((r.get("request") or {}).get("acknowledged") or {}).get("step") for h, r in stops.items()}
    return {"skew_ms": round((order[-1][1] - start) * 1000, 1), "first": order[0][0],
            "order": [[h, round((t - start) * 1000, 1)] for h, t in order],
            "spare": list(min(spares, key=lambda item: item[1])) if spares else None,
            "by_request": all((r.get("stopped_by") or {}).get("scope") == "request" for r in stops.values()),
            "steps": {h: step for h, step in sorted(steps.items()) if step is not None}}


def _skew_words(spread, margin=None):
    """The skew, and the margin left before the gang's moment against the time the slowest CT
    needed (margin: signal_moment's {margin_s, measured_s}, measured_s None when it was set)."""
    if not spread:
        return "skew of the signals sent not known (fewer than two CTs sent a signal)"
    # the spread of the moments the CTs' stops sent their signal or wrote their request, not of the
    # ranks' own handlers (those run a step boundary or a C call later, each on its own)
    how, sent = ("requested", "requests written") if spread.get("by_request") else ("signalled", "signals sent")
    words = f"stop {how} together (skew of the {sent} {spread['skew_ms']} ms, {spread['first']} first"
    steps = spread.get("steps") or {}
    if len(set(steps.values())) == 1:
        words += f"; the ranks of every CT stopped at step {next(iter(steps.values()))}"
    elif steps:
        words += "; the ranks stopped at DIFFERENT steps: " + ", ".join(f"{h} {step}" for h, step in steps.items())
    if margin and margin.get("margin_s") is not None:
        words += f"; margin {margin['margin_s']} s, " + (
            "redeploy_gang_signal_margin" if margin.get("measured_s") is None
            else f"2x the measured start of the stop, {margin['measured_s']} s")
        if spread.get("spare"):
            host, spare = spread["spare"]
            words += (f", the slowest CT ({host}) ready {spare} s before the moment" if spare >= 0
                      else f", {host} ready only {-spare} s after the moment (its signal went late)")
    return words + ")"


def stop_report(gang, stops, margin=None):
    """A gang's stop in one line (playbooks/stop.yml; each CT's own stop has its line): the skew,
    each CT's first signal against the first one's, the gang's one checkpoint (gang_checkpoint),
    and the CTs whose own stop ended before it was complete (the barrier after the stop has
    proved that every CT sees it). stops: {member: its stop result}; margin: as _skew_words."""
    spread = skew(stops)
    line = f"gang {gang['name']} ({gang['size']} CTs): {_skew_words(spread, margin)}"
    if spread:
        line += " (" + ", ".join(f"{h} +{offset} ms" for h, offset in spread["order"]) + ")"
    missing = [h for h in gang["members"] if not isinstance(stops.get(h), dict)]
    if missing:
        line += f", no stop result from {', '.join(missing)}"
    newest = gang_checkpoint(stops)
    if newest is None:
        return line + ", NO new checkpoint"
    early = [h for h, r in stops.items() if isinstance(r, dict) and (r.get("checkpoint") or {}).get("newest") != newest]
    return line + f", checkpoint {newest}" + (
        f" ({', '.join(early)}: its own stop ended before that save was complete)" if early else "")


def logging_member(results, key):
    """The member whose result of key has throughput figures (the CT whose ranks log), or None."""
    for host, result in results.items():
        figures = (result or {}).get(key) if isinstance(result, dict) else None
        if isinstance(figures, dict) and figures.get("tokens_per_s") is not None:
            return host
    return None


def plan_words(gang):
    """What a redeploy of the gang does, in words (check mode)."""
    ordered = ", ".join(f"{h} (rank {i})" for i, h in enumerate(gang["members"]))
    return (f"gang {gang['name']}: {gang['size']} CTs {ordered}; each phase on every CT before the next, a CT that "
            f"fails one fails them all; the stop signals every CT at one moment; each CT's torchrun agent joins "
            f"the {gang['rendezvous']} rendezvous at {gang['endpoint']} (id {gang['rdzv_id']}-1) with its "
            f"{gang['ranks']} ranks, {gang['gpus_per_rank']} GPU(s) each; the checkpoint is judged over every CT; a "
            "failed launch anywhere rolls every CT back")


def report(gang, summaries, stops, check_mode=False, margin=None):
    """The gang's lines: one for the gang (release, the stop's skew, the checkpoint and the loss,
    the CT whose ranks log and its tok/s, the canary of the gang's throughput), then one per CT (PID, ranks, health);
    in check mode what it would do. summaries: {member: its redeploy summary}; stops: {member:
    its stop result}; margin: as _skew_words."""
    members = gang["members"]
    if check_mode:
        return [plan_words(gang)] + [f"  {h}: {summaries.get(h, {}).get('command_line') or 'no command line'}"
                                     for h in members]
    releases = sorted({str(s.get("release")) for s in summaries.values()})
    spread = skew(stops)
    logger = next((h for h in members if (summaries.get(h) or {}).get("tokens_per_s") is not None), None)
    checkpoint = gang_checkpoint(stops)
    # the loss as the CT whose stop saw the gang's checkpoint written states it
    lost = next((checkpoint_verdict.lost_words(s) for s in summaries.values()
                 if s.get("checkpoint") == checkpoint and s.get("steps_lost") is not None), None)
    errors = [f"{h}: {'; '.join(summaries[h]['errors'])}" for h in members if (summaries.get(h) or {}).get("errors")]
    head = (f"gang {gang['name']} ({gang['size']} CTs, {gang['rendezvous']} rendezvous at {gang['endpoint']}): "
            f"release {', '.join(releases)}")
    if spread or any((s or {}).get("stopped_by") for s in summaries.values()):
        head += ", " + _skew_words(spread, margin)
    head += f", checkpoint {checkpoint}" if checkpoint else ", NO new checkpoint"
    if lost is not None:
        head += f" ({lost} steps lost)"
    running = [h for h in members if (summaries.get(h) or {}).get("pid")]
    if len(running) == len(members):
        head += f", every CT running; {logger or 'no CT'} logs" + (
            f" {summaries[logger]['tokens_per_s']} tok/s" if logger else "")
        if any((summaries.get(h) or {}).get("relaunched_after_stop") for h in members):
            head += " (the release of before, relaunched from its checkpoint after the stop phase failed)"
    else:
        head += (f", running on {len(running)} of {len(members)} CTs "
                 f"(NOT on {', '.join(h for h in members if h not in running)})")
        stopped_at = [s["stopped_at"] for s in summaries.values() if (s or {}).get("stopped_at")]
        if stopped_at:  # this job stopped the run and could not start it again
            head = (f"gang {gang['name']} is DOWN since {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(min(stopped_at)))} "
                    f"UTC, when this job stopped it: `make start HOST={gang['name']}` starts it again. " + head)
    # every CT's canary is the gang's (redeploy.yml: the throughput of the CT whose ranks log)
    canary = next((s["canary"] for s in summaries.values() if (s or {}).get("canary")), None)
    if canary:
        head += f"; canary: {throughput_canary.words(canary)}"
    lines = [head]
    if errors:
        lines.append("; ".join(errors))
    for host in members:
        data = summaries.get(host) or {}
        lines.append(f"  {host} (rank {members.index(host)}): "
                     + (f"PID {data['pid']}, {data.get('ranks') or '?'} ranks ({gang['gpus_per_rank']} GPU(s) each) "
                        f"healthy after {data.get('healthy_seconds')}s"
                        if data.get("pid") else "no trainer launched")
                     + (f", resumed from {data['resumed_from']}" if data.get("resumed_from") else ""))
    return lines
