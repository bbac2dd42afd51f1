"""plugins/callback/lock_on_cancel.py: on SIGINT or SIGTERM, the CTs whose launch call began and
whose result has not reached the job are told that the job was cancelled, the locks of the CTs
where no call that may signal has started are given back, then ansible-core's own handler runs;
the CTs whose stop or launch began keep their locks, for their worker. The lock named is the one
the job's own task arguments name, never what the CT's answer says, and it reaches `ansible`
untemplated."""

import os
import signal
import subprocess
import sys
from types import SimpleNamespace

import yaml

from ansible_collections.dflash.lifecycle.plugins.callback import lock_on_cancel
from ansible_collections.dflash.lifecycle.plugins.callback.lock_on_cancel import CallbackModule


def _host(name):
    return SimpleNamespace(get_name=lambda: name)


def _task(action, **args):
    return SimpleNamespace(action=action, args=args)


def _result(host, action, result, **args):
    return SimpleNamespace(_host=_host(host), _task=_task(action), _result=result, _task_fields={"args": args})


HOLDER = "root@vm ansible-playbook pid 7"
# what a CT's answer may say: a forged holder and path, never used
TEMPLATE = "{{ lookup('ansible.builtin.pipe', 'touch /tmp/dflash-pwned-callback') }}"
LOCK = {"holder": TEMPLATE, "released": False}
ARGS = {"invocation": {"module_args": {"lock_path": TEMPLATE, "lock_holder": TEMPLATE}}}
OWN = {"lock_holder": HOLDER, "lock_path": "/run/dflash/redeploy.lock"}


def _cancelled(monkeypatch, callback, signum, failing=()):
    """callback's handling of signum, its `ansible` runs recorded (hosts, state, holder, path) and
    answered (failing: the hosts whose call fails); returns (shown, runs, handled)."""
    shown, runs, handled = [], [], []
    monkeypatch.setattr(callback._display, "display", shown.append)
    monkeypatch.setattr(callback, "_run_ansible", lambda hosts, state, holder, path: runs.append(
        (hosts, state, holder, path)) or {host: ("unreachable" if host in failing else None) for host in hosts})
    callback.previous = {signal.SIGINT: lambda signum, frame: handled.append(signum),
                         signal.SIGTERM: lambda signum, frame: handled.append(signum)}
    monkeypatch.setattr(signal, "signal", {}.setdefault)  # the handlers it puts back
    callback._on_signal(signum, None)
    return shown, runs, handled


def _preflights(callback, hosts):
    for host in hosts:
        callback.v2_runner_on_start(_host(host), _task("dflash.lifecycle.trainer_preflight", launch="{{ x }}"))
        # the preflight's checks only (no launch in its result): nothing sent
        callback.v2_runner_on_ok(_result(host, "dflash.lifecycle.trainer_preflight", dict(ARGS, lock=LOCK, launch=None),
                                         **OWN))


def test_only_the_cts_no_stop_began_on_are_released_then_ansible_cores_handler_runs(monkeypatch):
    callback = CallbackModule()
    _preflights(callback, ("ct200", "ct201", "ct202", "ct300"))
    callback.v2_runner_on_start(_host("ct201"), _task("dflash.lifecycle.trainer_process"))  # its stop may have begun
    callback.v2_runner_on_start(_host("ct202"), _task("dflash.lifecycle.staged_stop"))  # a stop: no launch
    callback.v2_runner_on_ok(_result("ct300", "dflash.lifecycle.redeploy_lock", {}, state="released",
                                     holder=HOLDER))  # given back already
    shown, runs, handled = _cancelled(monkeypatch, callback, signal.SIGTERM)
    assert runs == [(["ct201"], "cancelled", HOLDER, "/run/dflash/redeploy.lock"),
                    (["ct200"], "released", HOLDER, "/run/dflash/redeploy.lock")]
    assert handled == [signal.SIGTERM]
    assert "ct200: SIGTERM before the first signal: nothing was touched, the lock is given back" in shown
    assert any(line.startswith("ct201: SIGTERM after this job's stop or launch began") and
               "the CT's record says that this job did not see the end" in line for line in shown)
    assert any(line.startswith("ct202: SIGTERM after this job's stop or launch began") and
               line.endswith("`make status` says how it ended") for line in shown)


def test_a_launch_whose_result_came_is_not_marked_and_a_failed_call_is_said(monkeypatch):
    """A launch whose result reached the job was shown: the CT's record stays as the CT wrote it.
    One whose result never came is marked, one `ansible` run for the hosts of one holder; a CT that
    could not be told is named, with why, and so is a lock that could not be given back."""
    callback = CallbackModule()
    _preflights(callback, ("ct200", "ct201", "ct202", "ct203"))
    for host in ("ct200", "ct201", "ct202"):
        callback.v2_runner_on_start(_host(host), _task("dflash.lifecycle.trainer_process"))
    # ct200's launch failed, its result shown, its lock kept (a failed launch gives nothing back)
    callback.v2_runner_on_failed(_result("ct200", "dflash.lifecycle.trainer_process", dict(ARGS, lock=LOCK), **OWN))
    shown, runs, handled = _cancelled(monkeypatch, callback, signal.SIGINT, failing=("ct202", "ct203"))
    assert runs == [(["ct201", "ct202"], "cancelled", HOLDER, "/run/dflash/redeploy.lock"),
                    (["ct203"], "released", HOLDER, "/run/dflash/redeploy.lock")]
    assert handled == [signal.SIGINT]
    assert any(line.startswith("ct200: SIGINT after") and line.endswith("`make status` says how it ended")
               for line in shown)
    assert any(line.startswith("ct202: SIGINT after") and "could not be told that this job did not see the end "
               "(unreachable)" in line for line in shown)
    assert "ct203: SIGINT before the first signal: the lock could not be given back (unreachable); it ends with " \
        "its lease" in shown


def test_only_the_hosts_own_line_of_ansibles_output_says_how_its_call_went():
    output = ("ct200 | CHANGED => {\"changed\": true, \"note\": \"ct201 | SUCCESS => {}\"}\n"
              "ct201 | FAILED! => {\"msg\": \"change_record: \\u001b[31m\"}\n"
              "ct2010 | SUCCESS => {}\n")
    assert lock_on_cancel.host_outcome(output, "ct200") is None
    assert lock_on_cancel.host_outcome(output, "ct201").startswith("ct201 | FAILED! => ")
    assert lock_on_cancel.host_outcome(output, "ct202") == "no answer"
    assert lock_on_cancel.host_outcome("ct202 | UNREACHABLE! => {}\n", "ct202") == "ct202 | UNREACHABLE! => {}"
    # a line separator inside a CT's answer does not start a line that reads as another CT's outcome
    forged = "ct201 | FAILED! => {\"msg\": \"x\u2028ct200 | SUCCESS => {}\"}\n"
    assert lock_on_cancel.host_outcome(forged, "ct200") == "no answer"


def test_the_release_call_takes_its_values_as_unsafe_extra_variables(tmp_path):
    """The holder and path reach `ansible -a` only as !unsafe extra variables: a template in them stays
    text (ansible-core 2.19 templates -a and -e values otherwise)."""
    extra = tmp_path / "release.yml"
    extra.write_text(lock_on_cancel.release_vars(TEMPLATE + ' "quoted" \\ \n', "/run/dflash/redeploy.lock"))
    assert yaml.safe_load(extra.read_text().replace("!unsafe ", "")) == {
        "dflash_cancel_holder": TEMPLATE + ' "quoted" \\ \n', "dflash_cancel_path": "/run/dflash/redeploy.lock"}
    shown = subprocess.run(
        [f"{sys.prefix}/bin/ansible", "localhost", "-c", "local", "-e", f"ansible_python_interpreter={sys.executable}",
         "-m", "ansible.builtin.debug", "-a", '{"msg": "{{ dflash_cancel_holder }} {{ dflash_cancel_path }}"}',
         "-e", f"@{extra}"], capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL)
    assert "dflash-pwned-callback" in shown.stdout and shown.returncode == 0, shown.stdout + shown.stderr
    assert not os.path.exists("/tmp/dflash-pwned-callback")
