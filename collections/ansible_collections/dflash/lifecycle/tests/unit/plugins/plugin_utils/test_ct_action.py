"""plugin_utils/ct_action.py: the controller owns the takeover - the job's code is taken as the job
gave it, never templated, and refused unless it is 12 hex digits; a lock refusal is written by the
controller from the lock's checked fields, the CT's words quoted as its word, and the command to
take the lock over only with a code the controller checked."""

import pytest
from ansible.errors import AnsibleActionFail

from ansible_collections.dflash.lifecycle.plugins.plugin_utils.ct_action import checked_takeover, refusal_words

HELD = {"holder": "root@vm ansible-playbook pid 15973", "since": 1765000000.0, "expires": 1765000060.0,
        "renewed": 1765000030.0, "phase": "stop", "worker_pid": None, "takeover_code": "0123456789ab",
        "ct_state": "the trainer PID 812 runs since 2025-12-06 05:46:40 UTC"}


def test_a_code_of_twelve_hex_digits_is_taken_and_none_is_none():
    assert checked_takeover({"redeploy_lock_takeover": "0123456789ab"}) == "0123456789ab"
    assert checked_takeover({}) is None and checked_takeover({"redeploy_lock_takeover": ""}) is None


@pytest.mark.parametrize("given", ["{{ lookup('ansible.builtin.pipe', 'touch /tmp/x') }}", "$(touch /tmp/x)",
                                   "0123456789AB", "0123456789ab\n", "0123456789abc", "root@vm run 1", 123456789012,
                                   "\x1b]0;owned\x07"])
def test_anything_else_is_refused_naming_the_variable_and_shown_as_data(given):
    with pytest.raises(AnsibleActionFail) as refused:
        checked_takeover({"redeploy_lock_takeover": given})
    message = str(refused.value)
    assert message.startswith("redeploy_lock_takeover: ") and "is not a lock's takeover code (12 hex digits" in message
    assert "it was not templated" in message
    assert "\x1b" not in message and "\n" not in message and "{{" not in message


def test_the_refusal_is_the_controllers_with_its_own_command_and_the_cts_words_quoted():
    words = refusal_words("ct200", HELD, now=1765000040.0)
    assert words == (
        "ct200: the CT is being redeployed by 'root@vm ansible-playbook pid 15973' (as its lock file says) since "
        "2025-12-06 05:46:40 UTC, last phase 'stop'; its lease runs until 2025-12-06 05:47:40 UTC, renewed 10 s ago. "
        "It is free once the lease ends, unless renewed. If that job is known to be gone, take the lock over with its "
        "takeover code: -e redeploy_lock_takeover=0123456789ab. Now in this CT, as it says: 'the trainer PID 812 runs "
        "since 2025-12-06 05:46:40 UTC'.")


@pytest.mark.parametrize("code", ["$(curl x|sh)", "{{ lookup('pipe', 'id') }}", "0123456789AB", None])
def test_a_forged_code_is_never_given_as_a_command(code):
    forged = dict(HELD, takeover_code=code, holder="x -e redeploy_lock_takeover=$(id) \x1b[2J")
    words = refusal_words("ct200", forged, now=1765000040.0)
    assert "take the lock over" not in words and "$(curl" not in words and "{{" not in words and "\x1b" not in words
    # what the CT wrote is shown quoted, as its word
    assert "by 'x -e redeploy_lock_takeover=$(id) \\x1b[2J' (as its lock file says)" in words


def test_a_live_worker_keeps_its_lock_and_no_command_is_given():
    words = refusal_words("ct200", dict(HELD, worker_pid=4242), now=1765000040.0)
    assert "Its worker in the CT (PID 4242) is alive and keeps the lease" in words and "-e " not in words


def test_times_the_ct_wrote_out_of_range_are_said_as_unknown():
    words = refusal_words("ct200", dict(HELD, since=1e300, expires=None, renewed=None), now=1765000040.0)
    assert "since an unknown time" in words and "until an unknown time" in words
