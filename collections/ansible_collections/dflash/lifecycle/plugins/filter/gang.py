# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters over a gang, the CTs of one run across nodes (plugin_utils/gang.py holds the rules).

Each reads what the gang's members registered (their validate_settings result, the results of
a phase) through hostvars: a filter runs on one CT, the gang is all of them.
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.dflash.lifecycle.plugins.module_utils import gang_agreement
from ansible_collections.dflash.lifecycle.plugins.plugin_utils import gang as gangs
from ansible_collections.dflash.lifecycle.plugins.plugin_utils.untrusted import reading_answers

# the result each phase registers
PHASE_RESULTS = {"release": "trainer_code_manifest", "preflight": "trainer_preflight_result",
                 "push": "trainer_code_installed", "rollback": "trainer_code_rolled_back", "stop": "trainer_stop_result",
                 "launch": "trainer_launch_result"}
# what every CT reads once a phase has ended on all of them (trainer_info)
AFTER_PHASE = {"stop": "trainer_run_gang_stopped", "launch": "trainer_run_gang_running"}


def _var(hostvars, host, name):
    try:
        variables = hostvars[host]
    except KeyError:
        return None
    return variables[name] if name in variables else None


def _members(host, hostvars, groups):
    checked = _var(hostvars, host, "trainer_run_checked") or {}
    identity = checked.get("gang")
    if not identity:
        raise AnsibleFilterError(f"{host}: not a CT of a gang, or its settings were not checked "
                                 "(dflash.lifecycle.validate_settings)")
    return identity["name"], list((groups or {}).get(identity["name"], []))


def gang_plan(host, hostvars, groups, holder=""):
    """This CT's part in its gang (plugin_utils/gang.py plan), from the members' checked settings."""
    name, members = _members(host, hostvars, groups)
    checked = {m: _var(hostvars, m, "trainer_run_checked") for m in members}
    problems = gangs.members_problems(name, checked, members)
    if problems:
        raise AnsibleFilterError(f"gang {name}: " + "; ".join(problems))
    return gangs.plan(host, {m: r["gang"] for m, r in checked.items()}, holder)


def gang_launcher_options(gang, options, attempt=1):
    """The torchrun options of this CT's launch in the gang (its size, rendezvous, address)."""
    return gangs.launcher_options(gang, options, int(attempt))


def gang_barrier(host, hostvars, groups, phase, job_hosts=None, on_missing_checkpoint="fail", check_mode=False):
    """The lines that stop the gang after phase (empty: it goes on): for settings, the gang as a
    whole (job_hosts: the hosts of the job, ansible_play_hosts_all); for a later phase, the
    member whose result is missing or failed, and what the members must agree on after it."""
    name, members = _members(host, hostvars, groups)
    if phase == "settings":
        checked = {m: _var(hostvars, m, "trainer_run_checked") for m in members}
        return gangs.members_problems(name, checked, list(job_hosts or []))
    if phase not in PHASE_RESULTS:
        raise AnsibleFilterError(f"gang_barrier: phase {phase!r} is not one of settings, {', '.join(PHASE_RESULTS)}")
    plan = gang_plan(host, hostvars, groups)
    results = {m: _var(hostvars, m, PHASE_RESULTS[phase]) for m in plan["members"]}
    # what every CT read once the phase had ended on all of them: whether its run still runs (launch),
    # what it sees of the shared checkpoint directory (stop)
    read = AFTER_PHASE.get(phase)
    after = {m: _var(hostvars, m, read) for m in plan["members"]} if read else None
    return gangs.phase_problems(plan, results, phase, bool(check_mode), on_missing_checkpoint, after)


def gang_throughput(gang, hostvars, which):
    """The gang's throughput figures, from the CT whose ranks log: which is before (the running
    run's, from the preflight) or after (the new run's, from its launch; the failed one's when
    the rescue relaunched)."""
    if which == "before":
        results = {m: _var(hostvars, m, "trainer_preflight_result") for m in gang["members"]}
        key = "throughput_before"
    else:
        results = {m: _var(hostvars, m, "rescue_failed_launch") or _var(hostvars, m, "trainer_launch_result")
                   for m in gang["members"]}
        key = "throughput"
    member = gangs.logging_member(results, key)
    return results[member][key] if member else None


def gang_report(host, hostvars, groups, holder="", check_mode=False):
    """The gang's report lines (plugin_utils/gang.py report), from each member's summary; a gang
    stopped by its settings says why in one line; check mode says what a redeploy would do."""
    try:
        plan = gang_plan(host, hostvars, groups, holder)
    except AnsibleFilterError as err:
        return [f"not redeployed as a gang: {err}"]
    summaries = {m: _var(hostvars, m, "redeploy_ct_summary") or {} for m in plan["members"]}
    # the stop of the launch's own call (a redeploy), else of the stop's task
    stops = {m: _var(hostvars, m, "rescue_first_stop") or (_var(hostvars, m, "trainer_launch_result") or {}).get("stop")
             or _var(hostvars, m, "trainer_stop_result") for m in plan["members"]}
    return gangs.report(plan, summaries, stops, bool(check_mode), _var(hostvars, host, "rescue_first_margin")
                        or _var(hostvars, host, "trainer_stop_signal_margin"))


def gang_relaunchable(host, hostvars, groups):
    """Whether the gang whose stop phase failed can run again from its checkpoint
    (module_utils/gang_agreement.py relaunchable): {relaunch, checkpoint, why}."""
    plan = gang_plan(host, hostvars, groups)
    members = plan["members"]
    return gang_agreement.relaunchable({m: _var(hostvars, m, "trainer_stop_result") for m in members},
                                       {m: _var(hostvars, m, AFTER_PHASE["stop"]) for m in members})


def gang_stop_report(host, hostvars, groups):
    """The gang's stop in a line (plugin_utils/gang.py stop_report), from each member's stop result."""
    plan = gang_plan(host, hostvars, groups)
    return gangs.stop_report(plan, {m: _var(hostvars, m, "trainer_stop_result") for m in plan["members"]},
                             _var(hostvars, host, "trainer_stop_signal_margin"))


class FilterModule:
    """gang_plan, gang_launcher_options, gang_barrier, gang_throughput, gang_report, gang_relaunchable,
    gang_stop_report."""

    def filters(self):
        # the filters that read the CTs' answers (the others read the inventory)
        return {"gang_plan": gang_plan, "gang_launcher_options": gang_launcher_options,
                "gang_barrier": reading_answers(gang_barrier), "gang_throughput": reading_answers(gang_throughput),
                "gang_report": reading_answers(gang_report), "gang_relaunchable": reading_answers(gang_relaunchable),
                "gang_stop_report": reading_answers(gang_stop_report)}
