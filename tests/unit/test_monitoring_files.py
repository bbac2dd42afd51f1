"""The monitoring's shipped files hold together (docs/monitoring.md): promtool checks the rules and
runs their unit tests, and checks the scrape configuration; the dashboard is what its code builds
(never edited by hand); the rules and the dashboard name only metrics the CT's agent serves, and
docs/monitoring.md lists every one of them. What they say about the world is
tests/integration/test_monitoring.py's, on a real Prometheus."""

import json
import os
import re
import subprocess
import sys

import pytest
import yaml

from testlib import REPO

from ansible_collections.dflash.lifecycle.plugins.module_utils.agent import metrics

PROMETHEUS = os.path.join(REPO, "monitoring", "prometheus")
RULES = os.path.join(PROMETHEUS, "dflash-rules.yml")
DASHBOARD = os.path.join(REPO, "monitoring", "grafana", "dflash-runs.json")
SERVED = {name for name, _kind, _help in metrics.METRICS}
NAME = re.compile(r"\b(dflash_[a-z_]+)\b")


def promtool(*args, cwd=PROMETHEUS):
    return subprocess.run(["promtool", *args], cwd=cwd, capture_output=True, text=True, check=False, timeout=120)


def test_promtool_checks_the_rules():
    res = promtool("check", "rules", RULES)
    assert res.returncode == 0 and "SUCCESS: 8 rules found" in res.stdout, res.stdout + res.stderr


def test_promtool_runs_the_rules_unit_tests():
    res = promtool("test", "rules", "dflash-rules.test.yml")
    assert res.returncode == 0 and "SUCCESS" in res.stdout, res.stdout + res.stderr


def test_the_scrape_configuration_checks(tmp_path):
    """The documented job, its rule file where the configuration names it (here: in tmp_path)."""
    config = yaml.safe_load(open(os.path.join(PROMETHEUS, "prometheus.yml"), encoding="utf-8"))
    config["rule_files"] = [RULES]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    res = promtool("check", "config", str(tmp_path / "prometheus.yml"))
    assert res.returncode == 0, res.stdout + res.stderr
    job = config["scrape_configs"][0]
    assert job["job_name"] == "dflash-trainers" and job["honor_labels"] is False and job["sample_limit"] >= 2 * len(SERVED) + 20


def test_the_scrape_job_stores_only_the_projects_metrics_and_labels():
    """The labels kept are the target's, what honor_labels renamed, and every label the exporter
    serves; the metrics kept are the exporter's (Prometheus anchors both regexes)."""
    job = yaml.safe_load(open(os.path.join(PROMETHEUS, "prometheus.yml"), encoding="utf-8"))["scrape_configs"][0]
    keep, labelkeep = job["metric_relabel_configs"]
    assert (keep["action"], keep["source_labels"]) == ("keep", ["__name__"])
    assert all(re.fullmatch(keep["regex"], name) for name in SERVED)
    assert not any(re.fullmatch(keep["regex"], name) for name in ("up", "node_cpu_seconds_total", "evil_dflash_x"))
    assert labelkeep["action"] == "labelkeep"
    target = ("job", "instance", "ct", "vmid", "node", "gang")
    kept = {name for name in target + tuple(f"exported_{t}" for t in target) + metrics.LABELS + ("__name__",)}
    assert all(re.fullmatch(labelkeep["regex"], name) for name in kept)
    assert not any(re.fullmatch(labelkeep["regex"], name) for name in ("team", "severity", "exported_team", "le", "ct_"))


def rule_exprs():
    rules = yaml.safe_load(open(RULES, encoding="utf-8"))
    return {rule["alert"]: rule["expr"] for group in rules["groups"] for rule in group["rules"]}


def dashboard_exprs():
    board = json.load(open(DASHBOARD, encoding="utf-8"))
    return [target["expr"] for panel in board["panels"] for target in panel.get("targets", [])] + [
        a["expr"] for a in board["annotations"]["list"]] + [v["query"] for v in board["templating"]["list"] if v.get("query")]


def test_the_alerts_the_issue_asks_for_are_there():
    assert set(rule_exprs()) == {"DflashRunDown", "DflashCrashLoop", "DflashHang", "DflashThroughputRegression",
                                 "DflashCheckpointExposed", "DflashSupervisorGone", "DflashNoProxmoxHook", "DflashMetricsDown"}


@pytest.mark.parametrize("source", ["rules", "dashboard"])
def test_only_metrics_the_agent_serves_are_named(source):
    exprs = rule_exprs().values() if source == "rules" else dashboard_exprs()
    named = {name for expr in exprs for name in NAME.findall(expr)}
    assert named and named <= SERVED, named - SERVED


def test_the_dashboard_is_what_its_code_builds():
    res = subprocess.run([sys.executable, os.path.join(REPO, "monitoring", "grafana", "dashboard.py"), "--check"],
                         capture_output=True, text=True, check=False, timeout=120)
    assert res.returncode == 0, res.stderr


def test_the_docs_list_every_metric_served():
    with open(os.path.join(REPO, "docs", "monitoring.md"), encoding="utf-8") as handle:
        listed = set(re.findall(r"^\| `(dflash_[a-z_]+)", handle.read(), re.M))
    assert listed == SERVED, (SERVED - listed, listed - SERVED)
