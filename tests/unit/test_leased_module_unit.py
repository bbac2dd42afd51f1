"""The redeploy lease carried by the CT-side modules (module_utils/leased.py), without Ansible's
executor: each call builds a LeasedModule from patched module arguments, as AnsiballZ would."""

import json
import os
from unittest import mock

import pytest
from ansible.module_utils import _internal
from ansible.module_utils.testing import patch_module_args

from ansible_collections.dflash.lifecycle.plugins.module_utils import leased


def call(capsys, args):
    """One module run: take the lease, then exit (or fail, when asked to); its JSON result."""
    # as in the CT: warnings go into the result (other tests here import controller code)
    with patch_module_args(args), mock.patch.object(_internal, "is_controller", False), \
            pytest.raises(SystemExit) as ended:
        module = leased.LeasedModule(argument_spec={"fail": {"type": "bool", "default": False}},
                                     supports_check_mode=True)
        if module.params["fail"]:
            module.fail_json(msg="the module's own failure")
        module.exit_json(changed=False, msg="done")
    result = json.loads(capsys.readouterr().out)
    assert ended.value.code == (1 if result.get("failed") else 0)
    return result


@pytest.fixture
def lock_path(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    return str(run_dir / "redeploy.lock")


def test_without_a_holder_the_lock_is_not_touched(capsys, lock_path):
    result = call(capsys, {"lock_path": lock_path})
    assert "lock" not in result and result["msg"] == "done"
    assert not os.path.exists(lock_path)


def test_the_first_call_takes_the_lock_a_later_one_renews_it_the_last_gives_it_back(capsys, lock_path):
    first = call(capsys, {"lock_path": lock_path, "lock_holder": "alice run 1", "lock_ttl": 60})
    assert first["lock"]["holder"] == "alice run 1" and first["lock"]["released"] is False
    assert json.load(open(lock_path, encoding="utf-8"))["holder"] == "alice run 1"
    renewed = call(capsys, {"lock_path": lock_path, "lock_holder": "alice run 1", "lock_ttl": 600})
    assert renewed["lock"]["since"] == first["lock"]["since"]
    assert renewed["lock"]["expires"] > first["lock"]["expires"]
    last = call(capsys, {"lock_path": lock_path, "lock_holder": "alice run 1", "lock_unlock": True})
    assert last["lock"]["released"] is True and not os.path.exists(lock_path)


def test_another_holder_fails_at_once_and_leaves_the_lock_alone(capsys, lock_path):
    call(capsys, {"lock_path": lock_path, "lock_holder": "awx job 42 (admin)"})
    other = call(capsys, {"lock_path": lock_path, "lock_holder": "bob run 2", "lock_unlock": True})
    assert other["failed"] and other["msg"].startswith("CT is being redeployed by awx job 42 (admin) since ")
    assert "lock" not in other  # it never held it, so an unlock after it must not run
    assert json.load(open(lock_path, encoding="utf-8"))["holder"] == "awx job 42 (admin)"


def test_a_failure_after_the_lock_was_taken_reports_it_and_keeps_it(capsys, lock_path):
    failed = call(capsys, {"lock_path": lock_path, "lock_holder": "alice run 1", "lock_unlock": True,
                           "fail": True})
    assert failed["failed"] and failed["msg"] == "the module's own failure"
    assert failed["lock"]["holder"] == "alice run 1" and failed["lock"]["released"] is False
    assert os.path.exists(lock_path)  # given back by the redeploy's unlock task, not here


def test_an_expired_lock_is_taken_over_with_a_warning(capsys, lock_path):
    with open(lock_path, "w", encoding="utf-8") as handle:
        json.dump({"holder": "awx job 7 (bob)", "since": 1, "expires": 2}, handle)
    result = call(capsys, {"lock_path": lock_path, "lock_holder": "alice run 1"})
    assert result["lock"]["taken_over_from"]["holder"] == "awx job 7 (bob)"
    assert "took over the expired lock of awx job 7 (bob)" in json.dumps(result["warnings"])


def test_a_live_lock_is_taken_over_only_by_its_takeover_code_never_by_a_holders_text(capsys, lock_path):
    from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import lock

    call(capsys, {"lock_path": lock_path, "lock_holder": "root@ctl run gone1"})  # its run died
    refused = call(capsys, {"lock_path": lock_path, "lock_holder": "bob run 2"})
    # the refusal gives the lock's fields, its takeover code among them (hex digits, never the holder's
    # text, which the CT wrote); the controller writes the words and the command (plugin_utils/ct_action.py)
    code = lock.takeover_code(json.load(open(lock_path, encoding="utf-8")))
    assert refused["lock_held"]["takeover_code"] == code and len(code) == 12
    assert refused["lock_held"]["holder"] == "root@ctl run gone1" and refused["lock_held"]["worker_pid"] is None
    assert "redeploy_lock_takeover" not in refused["msg"]
    # the holder's text is no takeover (it would be pasted into a job), nor is another lock's code
    for wrong_code, why in (("root@ctl run gone1", "is not a lock's takeover code (12 hex digits"),
                            ("{{ lookup('pipe', 'id') }}", "is not a lock's takeover code (12 hex digits"),
                            ("0123456789ab", "CT is being redeployed by root@ctl run gone1")):
        wrong = call(capsys, {"lock_path": lock_path, "lock_holder": "bob run 2", "lock_takeover": wrong_code})
        assert wrong["failed"] and why in wrong["msg"], wrong["msg"]
        assert json.load(open(lock_path, encoding="utf-8"))["holder"] == "root@ctl run gone1"
    taken = call(capsys, {"lock_path": lock_path, "lock_holder": "bob run 2", "lock_takeover": code})
    assert "failed" not in taken and taken["lock"]["taken_over_from"]["holder"] == "root@ctl run gone1"
    assert "took over the live (lock_takeover) lock of root@ctl run gone1" in json.dumps(taken["warnings"])
    assert json.load(open(lock_path, encoding="utf-8"))["holder"] == "bob run 2"


def test_a_planted_lock_file_of_other_types_holds_nothing(capsys, lock_path):
    """The CT's root writes the lock file: one that is not a lock this code writes is taken over."""
    for planted in ('["a"]', '{"holder": ["x"], "expires": 1e12}', '{"holder": "x", "expires": "never"}',
                    '{"holder": "x", "since": 1, "expires": 1e12, "worker": "1"}', "\u0000{"):
        with open(lock_path, "w", encoding="utf-8") as handle:
            handle.write(planted)
        taken = call(capsys, {"lock_path": lock_path, "lock_holder": "bob run 2"})
        assert "failed" not in taken and taken["lock"]["taken_over_from"]["holder"] == "unreadable lock file", planted


def crash(args, error=RuntimeError("a bug in the module")):
    """One module run whose work raises inside lock_given_back_on_a_crash (as trainer_preflight's)."""
    with patch_module_args(args), mock.patch.object(_internal, "is_controller", False), \
            pytest.raises(type(error)):
        module = leased.LeasedModule(argument_spec={}, supports_check_mode=True)
        with module.lock_given_back_on_a_crash():
            raise error


def test_a_crash_in_the_call_that_took_the_lock_gives_it_back_and_one_that_renewed_it_does_not(capsys, lock_path):
    """A crash leaves no result naming the lock, so the job's unlock cannot run: the call that took
    it gives it back, else every job is refused for the lease. A call that renewed it leaves it to
    its job (which gives it back by the result of the call that took it)."""
    crash({"lock_path": lock_path, "lock_holder": "alice run 1"})
    assert not os.path.exists(lock_path)
    call(capsys, {"lock_path": lock_path, "lock_holder": "alice run 2"})
    crash({"lock_path": lock_path, "lock_holder": "alice run 2"})
    assert json.load(open(lock_path, encoding="utf-8"))["holder"] == "alice run 2"


def test_a_call_that_goes_on_to_another_phase_records_it_in_the_lock(capsys, lock_path):
    """The preflight's call that launches too is in its launch: a refusal and `make status` say so."""
    with patch_module_args({"lock_path": lock_path, "lock_holder": "alice run 1", "lock_ttl": 60}), \
            mock.patch.object(_internal, "is_controller", False), pytest.raises(SystemExit):
        module = leased.LeasedModule(argument_spec={}, phase="preflight", supports_check_mode=True)
        assert json.load(open(lock_path, encoding="utf-8"))["phase"] == "preflight"
        module.enter_phase("launch")
        assert json.load(open(lock_path, encoding="utf-8"))["phase"] == "launch"
        module.exit_json(changed=False)
    result = json.loads(capsys.readouterr().out)
    assert result["lock"]["phase"] == "launch" and result["lock"]["holder"] == "alice run 1"
    refused = call(capsys, {"lock_path": lock_path, "lock_holder": "bob run 2"})
    assert "last phase: launch" in refused["msg"]
