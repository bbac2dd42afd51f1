"""plugins/callback/lock_on_cancel.py: on SIGINT or SIGTERM, the locks of the CTs where no call
that may signal has started are given back first, then ansible-core's own handler runs; the CTs
whose stop or launch began keep theirs, for their worker."""

import signal
from types import SimpleNamespace

from ansible_collections.dflash.lifecycle.plugins.callback.lock_on_cancel import CallbackModule


def _host(name):
    return SimpleNamespace(get_name=lambda: name)


def _task(action, **args):
    return SimpleNamespace(action=action, args=args)


def _result(host, action, result):
    return SimpleNamespace(_host=_host(host), _task=_task(action), _result=result)


LOCK = {"holder": "root@vm ansible-playbook pid 7", "released": False}
ARGS = {"invocation": {"module_args": {"lock_path": "/run/dflash/redeploy.lock"}}}


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
        callback.v2_runner_on_ok(_result(host, "dflash.lifecycle.trainer_preflight", dict(ARGS, lock=LOCK, launch=None)))
    callback.v2_runner_on_start(_host("ct201"), _task("dflash.lifecycle.trainer_process"))  # its stop may have begun
    callback.v2_runner_on_ok(_result("ct300", "dflash.lifecycle.redeploy_lock",
                                     {"invocation": {"module_args": {"state": "released"}}}))  # given back already
    signal_handlers = {}
    monkeypatch.setattr(signal, "signal", signal_handlers.setdefault)  # the handlers it puts back
    callback._on_signal(signal.SIGTERM, None)
    assert released == [("ct200", LOCK["holder"], "/run/dflash/redeploy.lock")]
    assert handled == [signal.SIGTERM]
    assert "ct200: SIGTERM before the first signal: given back" in shown
    assert any(line.startswith("ct201: SIGTERM after this job's stop or launch began") for line in shown)
