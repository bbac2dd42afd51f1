"""plugin_utils/untrusted.py: a module's answer from a CT is checked against its RETURN (and the
answers it holds against theirs), cleaned for a person to see, and never carries facts; a forgery
fails the CT's task with one line naming the CT, the module and the field."""

import json

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.dflash.lifecycle.plugins.plugin_utils import untrusted

TEMPLATE = "{{ lookup('ansible.builtin.pipe', 'id') }}"


def test_a_well_formed_answer_is_kept_with_its_strings_cleaned_and_no_facts():
    answer = {"changed": False, "pid": 42, "running": True, "uptime_s": 3, "msg": f"line 1\nline 2 \x1b[31m{TEMPLATE}",
              "log_tail": ["\x1b]0;owned\x07step 1", "{% raw %}"], "release": {"current": "abc\u202e"},
              "warnings": ["w\x1b[2J"], "ansible_facts": {"ansible_python_interpreter": "/tmp/evil"}, "extra\x1b": 1}
    taken = untrusted.taken("trainer_info", answer, "ct200")
    assert taken == {"changed": False, "pid": 42, "running": True, "uptime_s": 3,
                     "msg": "line 1\nline 2 [31m{ { lookup('ansible.builtin.pipe', 'id') }}",
                     "log_tail": ["]0;ownedstep 1", "{ % raw %}"], "release": {"current": "abc"},
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
    taken = untrusted.taken(module, dict(answer, secret="kept nowhere"), "ct200")
    assert taken == {"failed": True, "malformed": True,
                     "msg": f"ct200: the answer of dflash.lifecycle.{module} from the CT is malformed ({field}); "
                            "none of it is used"}


def test_output_that_is_not_one_json_mapping_is_cleaned_as_text_and_a_list_is_malformed():
    junk = "junk \x1b[2J {{ x }}\n" + json.dumps({"changed": False})
    assert untrusted.taken_output("trainer_info", junk, "ct1") == "junk [2J { { x }}\n{\"changed\": false}"
    assert json.loads(untrusted.taken_output("trainer_info", "[1]", "ct1"))["msg"].startswith(
        "ct1: the answer of dflash.lifecycle.trainer_info from the CT is malformed (the answer: list where the module "
        "returns a mapping)")
    assert json.loads(untrusted.taken_output("trainer_info", '{"pid": 1, "cmdline": "a\\u001bb"}', "ct1")) == \
        {"pid": 1, "cmdline": "ab"}


def test_an_answer_nested_deeper_than_python_reads_is_malformed_not_a_crash():
    deep = '{"lock": ' * 5000 + "1" + "}" * 5000
    assert json.loads(untrusted.taken_output("trainer_info", deep, "ct1")) == {
        "failed": True, "malformed": True,
        "msg": "ct1: the answer of dflash.lifecycle.trainer_info from the CT is malformed (nested deeper than any "
               "answer of the module); none of it is used"}
    nested = inner = {}
    for depth in range(3000):
        inner["lock" if depth == 0 else "x"] = {}
        inner = inner["lock" if depth == 0 else "x"]
    assert "nested deeper than any answer of the module" in untrusted.taken("trainer_info", nested, "ct1")["msg"]


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
