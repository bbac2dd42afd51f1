"""plugin_utils/untrusted.py: a module's answer from a CT is one JSON object with nothing around it,
within bounds, its keys clean, checked against its RETURN (and the answers it holds against
theirs), cleaned for a person to see, and never carries facts; anything else fails the CT's task
with one line naming the CT, the module and what is wrong, holding nothing of the answer."""

import json

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.dflash.lifecycle.plugins.plugin_utils import untrusted

TEMPLATE = "{{ lookup('ansible.builtin.pipe', 'id') }}"


def taken(module, answer, host="ct200"):
    return untrusted.AnswerCheck(module, host).taken(answer)


def output(module, text, host="ct1", stderr="", rc=0):
    """What the controller takes of module's output text."""
    return untrusted.AnswerCheck(module, host).answer(text, stderr, rc)


def malformed(module, why, host="ct1"):
    return dict(failed=True, malformed=True,
                msg=f"{host}: the answer of dflash.lifecycle.{module} from the CT is malformed ({why}); none of it is used")


def test_a_well_formed_answer_is_kept_with_its_strings_cleaned_and_no_facts():
    answer = {"changed": False, "pid": 42, "running": True, "uptime_s": 3, "msg": f"line 1\nline 2 \x1b[31m{TEMPLATE}",
              "log_tail": ["\x1b]0;owned\x07step 1", "{% raw %}", "a\u2028ct201: ok"], "release": {"current": "abc\u202e"},
              "warnings": ["w\x1b[2J"], "ansible_facts": {"ansible_python_interpreter": "/tmp/evil"}, "extra": 1}
    assert taken("trainer_info", answer) == {
        "changed": False, "pid": 42, "running": True, "uptime_s": 3,
        "msg": "line 1\nline 2 [31m{ { lookup('ansible.builtin.pipe', 'id') }}",
        "log_tail": ["]0;ownedstep 1", "{ % raw %}", "act201: ok"], "release": {"current": "abc"},
        "warnings": ["w[2J"], "extra": 1}


@pytest.mark.parametrize("module, answer, field", [
    ("trainer_info", {"pid": "42"}, "pid: str where the module documents int"),
    ("trainer_info", {"running": 1}, "running: int where the module documents bool"),
    ("trainer_info", {"uptime_s": True}, "uptime_s: bool where the module documents float"),
    ("trainer_info", {"log_tail": ["a", 3]}, "log_tail[1]: int where the module documents str"),
    ("trainer_info", {"lock": ["holder"]}, "lock: list where the module documents dict"),
    ("trainer_preflight", {"checks": ["x"]}, "checks[0]: str where the module documents dict"),
    ("trainer_preflight", {"msg": {"a": 1}}, "msg: dict where the module documents str"),
    ("trainer_preflight", {"warnings": "w"}, "warnings: str where the module documents list"),
    # an answer it holds, checked against its own module's RETURN
    ("trainer_preflight", {"launch": {"pid": "1"}}, "launch.pid: str where the module documents int"),
    ("trainer_process", {"stop": {"cpu_s": "x"}}, "stop.cpu_s: str where the module documents float"),
    ("trainer_process", {"rollback": {"relaunch": {"stop": {"timeline": {}}}}},
     "rollback.relaunch.stop.timeline: dict where the module documents list"),
    ("trainer_preflight", {"launch": ["x"]}, "launch: list where the module documents dict"),
])
def test_a_field_of_another_type_fails_with_one_line_naming_the_ct_module_and_field(module, answer, field):
    assert taken(module, dict(answer, secret="kept nowhere")) == malformed(module, field, "ct200")


@pytest.mark.parametrize("text, why", [
    # what ansible-core's _filter_non_json_lines would skip, and then decode unchecked
    ('ok\n{"pid": "forged", "msg": "\\u001b[2J\\u007b{ x }}"}', "text before its JSON object"),
    ('\x1b]0;owned\x07{"pid": 1}', "text before its JSON object"),
    ('{"pid": 1}\n[]\n{"pid": 2}', "text after its JSON object"),
    ('{"pid": 1}x', "text after its JSON object"),
    ("[1]", "no JSON object"),
    ("Traceback: no answer, but words", "no JSON object"),
    ('{"pid": 1', "not JSON: Expecting ',' delimiter at character 9"),
    # the keys: given twice, changed by cleaning, ansible-core's own
    ('{"pid": 1, "pid": 2}', "the key 'pid' given twice"),
    ('{"pid\\u200b": "forged"}', "the key 'pid\\u200b', which cleaning changes"),
    ('{"lock": {"h\\u001bx": 1}}', "the key 'h\\x1bx', which cleaning changes"),
    ('{"{{ x }}": 1}', "the key '{ { x }}', which cleaning changes"),
    ('{"_ansible_no_log": true}', "the key '_ansible_no_log', one of ansible-core's own"),
    ('{"lock": {"__ansible_type": "Event", "msg": "m"}}', "the key '__ansible_type', one of ansible-core's own"),
    # numbers that are not finite
    ('{"uptime_s": NaN}', "NaN, a number that is not finite"),
    ('{"uptime_s": -Infinity}', "-Infinity, a number that is not finite"),
    ('{"uptime_s": 1e999}', "1e999, a number that is not finite"),
])
def test_output_that_is_not_exactly_one_clean_json_object_fails_with_one_line_and_nothing_of_it(text, why):
    assert output("trainer_info", text) == malformed("trainer_info", why)


def test_the_check_sees_exactly_what_ansible_core_parses():
    # JSON escapes become ESC and { only once decoded: the check cleans the decoded strings
    answer = output("trainer_info", ' \n{"pid": 1, "cmdline": "a\\u001bb \\u007b{ x }}"}\r\n')
    assert answer == {"pid": 1, "cmdline": "ab { { x }}"}
    # ansible-core 2.19's own encoding of warnings and deprecations is kept for it to decode
    warned = '{"warnings": [{"event": {"msg": "w\\u001b", "__ansible_type": "Event"}, "__ansible_type": "WarningSummary"}]}'
    assert output("trainer_info", warned) == {"warnings": [{"event": {"msg": "w", "__ansible_type": "Event"},
                                                            "__ansible_type": "WarningSummary"}]}
    # types are checked after the keys: a key that cleaning would make "pid" is refused, never taken as pid
    assert output("trainer_info", '{"pid\\u2028": "x"}')["malformed"] is True


@pytest.mark.parametrize("answer, why", [
    ({"log_lines": ["x"] * (untrusted.ANSWER_VALUES + 1)}, f"more than {untrusted.ANSWER_VALUES} values"),
    ({"lock": {f"k{i}": 1 for i in range(untrusted.ANSWER_KEYS + 1)}}, f"more than {untrusted.ANSWER_KEYS} keys"),
])
def test_an_answer_larger_than_any_of_the_modules_is_malformed(answer, why):
    assert taken("trainer_info", answer, "ct1") == malformed("trainer_info", why)
    text = json.dumps({"log_lines": ["x" * 1000] * (untrusted.ANSWER_BYTES // 1000)})
    assert output("trainer_info", text) == malformed("trainer_info", f"more than {untrusted.ANSWER_BYTES} characters")


@pytest.mark.parametrize("warning", [{"__ansible_type": "Nope"}, {"__ansible_type": "Event"},
                                     {"__ansible_type": "WarningSummary", "event": {"msg": 3, "__ansible_type": "Event"}}])
def test_warnings_that_ansible_cores_decoder_would_raise_for_fail_here_in_one_line(warning):
    from ansible.module_utils.common.json import Direction, get_module_decoder

    check = untrusted.AnswerCheck("trainer_info", "ct1", get_module_decoder("legacy", Direction.MODULE_TO_CONTROLLER))
    assert check.taken({"warnings": [warning]}) == malformed("trainer_info", "warnings not of ansible-core's own form")
    good = {"__ansible_type": "WarningSummary", "event": {"msg": "w", "__ansible_type": "Event"}}
    assert check.taken({"warnings": [good]}) == {"warnings": [good]}


def test_no_answer_is_said_with_the_exit_status_and_the_end_of_stderr_cleaned():
    said = output("trainer_info", "\n", stderr="/bin/sh: 1: python3: not found \x1b[2J {{ x }}\n", rc=127)
    assert said == {"failed": True, "rc": 127, "msg": "ct1: dflash.lifecycle.trainer_info gave no answer in the CT "
                                                      "(exit status 127)",
                    "module_stderr": "/bin/sh: 1: python3: not found [2J { { x }}\n"}


def test_an_answer_nested_deeper_than_any_of_the_modules_is_malformed_not_a_crash():
    deep = '{"lock": ' * 5000 + "1" + "}" * 5000
    why = f"nested deeper than {untrusted.ANSWER_DEPTH} levels"
    assert output("trainer_info", deep) == malformed("trainer_info", why)
    nested = inner = {}
    for depth in range(3000):
        inner["lock" if depth == 0 else "x"] = {}
        inner = inner["lock" if depth == 0 else "x"]
    assert taken("trainer_info", nested, "ct1") == malformed("trainer_info", why)
    seventeen = 1
    for _level in range(untrusted.ANSWER_DEPTH):
        seventeen = [seventeen]
    assert taken("trainer_info", {"lock": {"a": seventeen[0]}}, "ct1")["malformed"] is True
    assert taken("trainer_info", {"lock": {"a": seventeen[0][0]}}, "ct1") == {"lock": {"a": seventeen[0][0]}}


def test_every_module_that_runs_in_a_ct_documents_what_it_returns():
    for module in ("trainer_preflight", "trainer_process", "staged_stop", "trainer_info", "trainer_release",
                   "model_stage", "redeploy_lock"):
        documented = untrusted.documented(module)
        assert set(untrusted.COMMON) <= set(documented) and len(documented) > len(untrusted.COMMON), module


def test_a_filter_reading_answers_fails_with_one_line_on_a_shape_it_does_not_read():
    def report(summary):
        return summary["stop"]["checkpoint"].get("new")

    guarded = untrusted.reading_answers(report)
    assert guarded({"stop": {"checkpoint": {"new": "x"}}}) == "x"
    with pytest.raises(AnsibleFilterError, match=r"^report: an answer from a CT is not of the shape its module "
                                                 r"documents \(AttributeError: 'list' object has no attribute 'get'\)"):
        guarded({"stop": {"checkpoint": ["\x1b[2J"]}})
