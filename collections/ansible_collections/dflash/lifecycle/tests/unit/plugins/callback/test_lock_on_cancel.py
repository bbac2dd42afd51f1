"""plugins/callback/lock_on_cancel.py: on SIGINT or SIGTERM, the locks of the CTs where no call
that may signal has started are given back first, then ansible-core's own handler runs; the CTs
whose stop or launch began keep theirs, for their worker. The lock given back is the one the job's
own task arguments name, never what the CT's answer says, and it reaches `ansible` untemplated."""

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


def test_only_the_cts_no_stop_began_on_are_released_then_ansible_cores_handler_runs(monkeypatch):
    callback = CallbackModule()
    shown, released, handled = [], [], []
    monkeypatch.setattr(callback._display, "display", shown.append)
    monkeypatch.setattr(callback, "_release", lambda host, holder, path: released.append((host, holder, path)) or "given back")
    callback.previous = {signal.SIGINT: lambda signum, frame: handled.append(signum),
                         signal.SIGTERM: lambda signum, frame: handled.append(signum)}
    for host in ("ct200", "ct201", "ct300"):
        callback.v2_runner_on_start(_host(host), _task("dflash.lifecycle.trainer_preflight", launch="{{ x }}"))
        # the preflight's checks only (no launch in its result): nothing sent
        callback.v2_runner_on_ok(_result(host, "dflash.lifecycle.trainer_preflight", dict(ARGS, lock=LOCK, launch=None),
                                         **OWN))
    callback.v2_runner_on_start(_host("ct201"), _task("dflash.lifecycle.trainer_process"))  # its stop may have begun
    callback.v2_runner_on_ok(_result("ct300", "dflash.lifecycle.redeploy_lock", {}, state="released",
                                     holder=HOLDER))  # given back already
    signal_handlers = {}
    monkeypatch.setattr(signal, "signal", signal_handlers.setdefault)  # the handlers it puts back
    callback._on_signal(signal.SIGTERM, None)
    assert released == [("ct200", HOLDER, "/run/dflash/redeploy.lock")]
    assert handled == [signal.SIGTERM]
    assert "ct200: SIGTERM before the first signal: given back" in shown
    assert any(line.startswith("ct201: SIGTERM after this job's stop or launch began") for line in shown)


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
