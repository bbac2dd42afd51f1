# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a CT wrote, as the controller takes it (docs/security.md).

A module's answer from a CT is written by whatever runs there as root: the trainer's packages can
replace the CT's python3, and with it every module's result, its framing included. ansible-core
2.19 templates none of it, but it shows its warnings, deprecations and failure message raw to the
terminal and AWX, it finds a JSON object after any text that comes before it
(``_filter_non_json_lines``), and the project's own code reads its fields. So every answer of this
collection's modules from a CT goes through ``AnswerCheck`` first (plugin_utils/ct_action.py
CTModuleAction), and ansible-core parses only what the check gave:

- the output must be one JSON object with nothing but whitespace around it; anything else (a line
  before it, a byte after it, no object at all) fails the CT's task with one line naming the CT and
  none of the output is used;
- the object is capped as a whole (bytes, values, keys, depth), and a number that is not finite
  (``NaN``, ``Infinity``, ``1e999``) or a key given twice is refused;
- every key must be what cleaning leaves of it (no control or format character, no template
  opener), so that no key becomes another one's name; no key may be one of ansible-core's internal
  ones (``_ansible_*``, or ``__ansible_type`` outside the warnings, deprecations and exception that
  ansible-core's own modules encode with it);
- then its fields are checked against the module's documented result (its RETURN, with the fields
  every module may return): a field of another type than documented fails the task with one line
  naming the field, and none of the answer is used;
- then its strings are cleaned for a person to see: no control, format or line separator
  character, no template opener, each capped (module_utils/node/installed_hookscript.py
  ``printable``, the node's rule); ``ansible_facts``, which none of these modules returns, dropped.

The filters that read those answers deeper than their documented types go (a stop's checkpoint
inside a launch's result) fail with one line naming the filter and the CT's field, never with a
traceback (reading_answers).
"""

from __future__ import annotations

import ast
import functools
import json
import math
import os

import yaml
from ansible.errors import AnsibleFilterError

from ansible_collections.dflash.lifecycle.plugins.module_utils.node.installed_hookscript import printable

MODULES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "modules")
STRING_CHARS = 20000
KEY_CHARS = 200
# what a CT may say at most when its module gave no answer (its standard error, cleaned)
STDERR_CHARS = 4000
# A whole answer: the largest this project's modules give is `make logs LINES=10000` (trainer_info
# reads at most the log's last MiB); a redeploy's launch with its stop and rollback is about 60 KB,
# about 3000 values, 800 keys and 8 levels deep (bench/answer_check.py)
ANSWER_BYTES = 8 << 20
ANSWER_VALUES = 100000
ANSWER_KEYS = 20000
ANSWER_DEPTH = 16
# JSON's whitespace: ansible-core takes the answer from the module's stdout as it is otherwise
JSON_SPACE = " \t\n\r"
# what any module may return, beside its own RETURN
COMMON = {"changed": {"type": "bool"}, "failed": {"type": "bool"}, "skipped": {"type": "bool"},
          "msg": {"type": "str"}, "rc": {"type": "int"},
          # a traceback's text, or (ansible-core 2.19's fail_json) an error summary holding one
          "exception": {"type": "raw"},
          # a message, or (ansible-core 2.19's modules) a mapping that holds one
          "warnings": {"type": "list"}, "deprecations": {"type": "list"},
          "invocation": {"type": "dict"},
          # the refusal of every module that takes the CT's lock (module_utils/ct/lock.py held_fields):
          # the controller writes its words from these (plugin_utils/ct_action.py)
          "lock_held": {"type": "dict", "contains": {
              "holder": {"type": "str"}, "since": {"type": "float"}, "expires": {"type": "float"},
              "renewed": {"type": "float"}, "phase": {"type": "str"}, "worker_pid": {"type": "int"},
              "takeover_code": {"type": "str"}, "ct_state": {"type": "str"}}}}
# the fields ansible-core's own module code encodes as its serializable types (``__ansible_type``)
ENCODED = ("warnings", "deprecations", "exception")
# the answers of one module held in another's, as its RETURN says ("as M(...) returns it")
HELD = {"trainer_preflight": {("launch",): "trainer_process"},
        "trainer_process": {("stop",): "staged_stop", ("rollback", "stop"): "staged_stop",
                            ("rollback", "relaunch"): "trainer_process"}}
TYPES = {"str": str, "path": str, "int": int, "float": (int, float), "bool": bool, "list": list, "dict": dict,
         "complex": dict}


class Malformed(ValueError):
    """An answer that is not what its module documents; the message names the field."""


@functools.lru_cache(maxsize=None)
def documented(module):
    """The fields module documents it returns (its RETURN), with the common ones."""
    with open(os.path.join(MODULES, f"{module}.py"), encoding="utf-8") as handle:
        tree = ast.parse(handle.read())
    text = next(node.value.value for node in tree.body if isinstance(node, ast.Assign)
                and getattr(node.targets[0], "id", None) == "RETURN")
    return dict(COMMON, **(yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}))


def _kind(value):
    return "null" if value is None else type(value).__name__


def _named(key):
    """A key a CT wrote, as a message may name it: ASCII, quoted, cleaned, short."""
    return printable(ascii(key), 80)


def check(value, spec, where):
    """Raises Malformed at the first part of value that is not of the type spec documents (None
    passes: a field without a value)."""
    kind = spec.get("type", "raw")
    if value is None or kind not in TYPES:
        return
    if not isinstance(value, TYPES[kind]) or (kind in ("int", "float") and isinstance(value, bool)):
        raise Malformed(f"{where}: {_kind(value)} where the module documents {kind}")
    if kind == "list" and spec.get("elements"):
        element = {"type": spec["elements"], "contains": spec.get("contains")}
        for index, item in enumerate(value):
            check(item, element, f"{where}[{index}]")
    elif kind in ("dict", "complex") and spec.get("contains"):
        for key, inner in spec["contains"].items():
            check(value.get(key), inner, f"{where}.{key}")


def check_answer(module, answer, where=""):
    """Raises Malformed at the first field of module's answer (and of the answers it holds) that is
    not of its documented type."""
    if not isinstance(answer, dict):
        raise Malformed(f"{where or 'the answer'}: {_kind(answer)} where the module returns a mapping")
    for key, spec in documented(module).items():
        check(answer.get(key), spec, where + key)
    for path, inner in HELD.get(module, {}).items():
        held = answer
        for key in path:
            held = held.get(key) if isinstance(held, dict) else None
        if held is not None:
            check_answer(inner, held, where + ".".join(path) + ".")


def _unique(pairs):
    """A JSON object's pairs as a dict, refusing a key given twice (the last would silently win)."""
    found = dict(pairs)
    if len(found) != len(pairs):
        seen = set()
        twice = next(key for key, _value in pairs if key in seen or seen.add(key))
        raise Malformed(f"the key {_named(twice)} given twice")
    return found


def _not_finite(word):
    raise Malformed(f"{word}, a number that is not finite")


def _finite(text):
    number = float(text)
    if not math.isfinite(number):
        raise Malformed(f"{printable(text, 40)}, a number that is not finite")
    return number


_DECODER = json.JSONDecoder(object_pairs_hook=_unique, parse_constant=_not_finite, parse_float=_finite)


def decoded(output):
    """The one JSON object output holds, with nothing but whitespace around it; raises Malformed
    saying what else is there."""
    if len(output) > ANSWER_BYTES:
        raise Malformed(f"more than {ANSWER_BYTES} characters")
    text = output.strip(JSON_SPACE)
    if not text.startswith("{"):
        raise Malformed("text before its JSON object" if "{" in text else "no JSON object")
    try:
        answer, end = _DECODER.raw_decode(text)
    except RecursionError:
        raise Malformed(f"nested deeper than {ANSWER_DEPTH} levels") from None
    except Malformed:
        raise
    except ValueError as err:  # json.JSONDecodeError: where it stopped, in our words, never the text
        raise Malformed(f"not JSON: {printable(err.msg, 80)} at character {err.pos}") from None
    if end != len(text):
        raise Malformed("text after its JSON object")
    return answer


def within_bounds(answer):
    """Raises Malformed when answer (decoded JSON) is larger than any answer of the project's
    modules, nests deeper, or has a key that cleaning would change or that names ansible-core's
    internals."""
    values = keys = 0
    stack = [(answer, 1, False)]
    while stack:
        value, depth, encoded = stack.pop()
        values += 1
        if values > ANSWER_VALUES:
            raise Malformed(f"more than {ANSWER_VALUES} values")
        if depth > ANSWER_DEPTH and isinstance(value, (dict, list)):
            raise Malformed(f"nested deeper than {ANSWER_DEPTH} levels")
        if isinstance(value, list):
            stack.extend((item, depth + 1, encoded) for item in value)
        elif isinstance(value, dict):
            keys += len(value)
            if keys > ANSWER_KEYS:
                raise Malformed(f"more than {ANSWER_KEYS} keys")
            for key, item in value.items():
                if printable(key, KEY_CHARS) != key:
                    raise Malformed(f"the key {_named(key)}, which cleaning changes")
                if key.startswith("_ansible") or (key == "__ansible_type" and not encoded):
                    raise Malformed(f"the key {_named(key)}, one of ansible-core's own")
                stack.append((item, depth + 1, encoded or (depth == 1 and key in ENCODED)))


def cleaned(value):
    """value with every string cleaned for a person to see (its keys are clean already)."""
    if isinstance(value, str):
        return printable(value, STRING_CHARS, lines=True)
    if isinstance(value, dict):
        return {key: cleaned(item) for key, item in value.items()}
    if isinstance(value, list):
        return [cleaned(item) for item in value]
    return value


class AnswerCheck:
    """The check of one module's answer from one CT: what ansible-core may parse of it is written
    here, and only here. decoder: ansible-core's JSON decoder of the module's answers (its
    serialization profile), which decodes the fields its own modules encode (ENCODED): those must
    decode, or the answer fails here rather than in ansible-core's parser, which raises for them."""

    def __init__(self, module, host, decoder=None):
        self.module = module
        self.host = printable(host, KEY_CHARS)
        self.decoder = decoder

    def failure(self, why):
        """The CT's task failed with one line naming the CT, the module and why; nothing of the
        answer in it."""
        return dict(failed=True, malformed=True,
                    msg=f"{self.host}: the answer of dflash.lifecycle.{self.module} from the CT is malformed "
                        f"({printable(why)}); none of it is used")

    def taken(self, answer):
        """A decoded answer as the controller may use it: checked and cleaned, or the failure."""
        try:
            within_bounds(answer)
            check_answer(self.module, answer)
        except Malformed as err:
            return self.failure(err)
        answer = cleaned(answer)
        answer.pop("ansible_facts", None)
        encoded = {key: answer[key] for key in ENCODED if key in answer}
        if encoded and self.decoder is not None:
            try:
                json.loads(json.dumps(encoded), cls=self.decoder)
            except Exception:  # noqa: BLE001  (whatever ansible-core's decoder raises for them)
                return self.failure(f"{', '.join(sorted(encoded))} not of ansible-core's own form")
        return answer

    def answer(self, stdout, stderr, rc):
        """The module's output (its stdout, stderr and exit status, as the connection gave them) as
        the controller may use it: the answer taken, or the failure. A module that wrote nothing (a
        crash before its answer, no interpreter) is said so, with its exit status and the end of its
        standard error cleaned."""
        if not stdout.strip(JSON_SPACE):
            said = {"failed": True, "rc": rc if isinstance(rc, int) else None,
                    "msg": f"{self.host}: dflash.lifecycle.{self.module} gave no answer in the CT (exit status {rc})"}
            if stderr.strip():
                said["module_stderr"] = printable(stderr[-4 * STDERR_CHARS:], STDERR_CHARS, lines=True)
            return said
        try:
            return self.taken(decoded(stdout))
        except Malformed as err:
            return self.failure(err)


def reading_answers(function):
    """A filter that reads CTs' answers: a part of one that is not of the shape it reads (a CT's
    forgery deeper than its module documents) fails the task with one line, never a traceback."""
    @functools.wraps(function)
    def guarded(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except (TypeError, AttributeError, KeyError, IndexError, ValueError, ArithmeticError) as err:
            if isinstance(err, AnsibleFilterError):
                raise
            raise AnsibleFilterError(f"{function.__name__}: an answer from a CT is not of the shape its module "
                                     f"documents ({printable(type(err).__name__ + ': ' + str(err))}); nothing of it "
                                     "is reported") from None
    return guarded
