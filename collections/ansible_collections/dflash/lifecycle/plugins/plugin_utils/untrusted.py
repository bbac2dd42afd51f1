# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a CT wrote, as the controller takes it (docs/security.md).

A module's answer from a CT is written by whatever runs there as root: the trainer's packages can
replace the CT's python3, and with it every module's result. ansible-core 2.19 templates none of
it, but it shows its warnings, deprecations and failure message raw to the terminal and AWX, and
the project's own code reads its fields. So every answer of this collection's modules from a CT
comes through here first (plugin_utils/payload_cache.py CachedPayloadAction):

- checked against the module's documented result (its RETURN, with the fields every module may
  return): a field of another type than documented fails the CT's task with one line naming the
  field, and none of the answer is used;
- its strings (and keys) cleaned for a person to see: no control or format character, no template
  opener, each capped (module_utils/node/installed_hookscript.py ``printable``, the node's rule);
- ``ansible_facts``, which none of these modules returns, dropped.

The filters that read those answers deeper than their documented types go (a stop's checkpoint
inside a launch's result) fail with one line naming the filter and the CT's field, never with a
traceback (reading_answers).
"""

from __future__ import annotations

import ast
import functools
import json
import os

import yaml
from ansible.errors import AnsibleFilterError

from ansible_collections.dflash.lifecycle.plugins.module_utils.node.installed_hookscript import printable

MODULES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "modules")
STRING_CHARS = 20000
KEY_CHARS = 200
OUTPUT_CHARS = 1 << 20
# what any module may return, beside its own RETURN
COMMON = {"changed": {"type": "bool"}, "failed": {"type": "bool"}, "skipped": {"type": "bool"},
          "msg": {"type": "str"}, "rc": {"type": "int"}, "exception": {"type": "str"},
          # a message, or (ansible-core 2.19's modules) a mapping that holds one
          "warnings": {"type": "list"}, "deprecations": {"type": "list"},
          "invocation": {"type": "dict"}}
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


def cleaned(value):
    """value with every string and key cleaned for a person to see."""
    if isinstance(value, str):
        return printable(value, STRING_CHARS, lines=True)
    if isinstance(value, dict):
        return {printable(key, KEY_CHARS) if isinstance(key, str) else key: cleaned(item) for key, item in value.items()}
    if isinstance(value, list):
        return [cleaned(item) for item in value]
    return value


DEEPER = "nested deeper than any answer of the module"


def taken_output(module, output, host):
    """A module's output (its stdout) from CT host as ansible-core may parse it: the answer checked
    and cleaned (taken), as JSON; output that is not one JSON mapping cleaned as text, so that what
    ansible-core says of it (junk around the JSON, a failed parse) shows nothing raw."""
    try:
        answer = json.loads(output)
    except RecursionError:
        return json.dumps(_malformed(module, host, DEEPER))
    except ValueError:
        return printable(output, OUTPUT_CHARS, lines=True)
    return json.dumps(taken(module, answer, host))


def _malformed(module, host, why):
    return {"failed": True, "malformed": True,
            "msg": f"{printable(host, KEY_CHARS)}: the answer of dflash.lifecycle.{module} from the CT is malformed "
                   f"({printable(why)}); none of it is used"}


def taken(module, result, host):
    """A module's answer from CT host as the controller may use it: checked and cleaned, or one
    failure that names the CT, the module and the field, holding nothing of the answer."""
    try:
        check_answer(module, result)
        result = cleaned(result)
    except Malformed as err:
        return _malformed(module, host, err)
    except RecursionError:
        return _malformed(module, host, DEEPER)
    result.pop("ansible_facts", None)
    return result


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
