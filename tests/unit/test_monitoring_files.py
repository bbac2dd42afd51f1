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
    assert res.returncode == 0 and "SUCCESS: 11 rules found" in res.stdout, res.stdout + res.stderr


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


def rules_of(path=RULES):
    return [rule for group in yaml.safe_load(open(path, encoding="utf-8"))["groups"] for rule in group["rules"]]


def rule_exprs():
    """{alert or recording rule's name: its expressions}."""
    found = {}
    for rule in rules_of():
        found.setdefault(rule.get("alert") or rule["record"], []).append(rule["expr"])
    return {name: " or ".join(exprs) for name, exprs in found.items()}


def dashboard_exprs():
    board = json.load(open(DASHBOARD, encoding="utf-8"))
    return [target["expr"] for panel in board["panels"] for target in panel.get("targets", [])] + [
        a["expr"] for a in board["annotations"]["list"]] + [v["query"] for v in board["templating"]["list"] if v.get("query")]


def test_the_alerts_the_issue_asks_for_are_there():
    assert set(rule_exprs()) == {"DflashRunDown", "DflashCrashLoop", "DflashHang", "DflashThroughputRegression",
                                 "DflashCheckpointExposed", "DflashSupervisorGone", "DflashNoProxmoxHook", "DflashMetricsDown",
                                 "DflashGpusIdle", "dflash:run_gpu_utilization:max"}


def test_every_alert_has_a_runbook_in_the_docs():
    """Its runbook_url points at a section of docs/runbooks.md (GitHub's anchor of its heading), the
    target list's alert included."""
    from ansible_collections.dflash.lifecycle.plugins.filter.monitoring import RUNBOOKS, prometheus_target, \
        prometheus_target_rules

    with open(os.path.join(REPO, "docs", "runbooks.md"), encoding="utf-8") as handle:
        anchors = {re.sub(r"[^a-z0-9 -]", "", line[3:].strip().lower()).replace(" ", "-")
                   for line in handle if line.startswith("## ")}
    generated = prometheus_target_rules([prometheus_target("ct200", 200, "pve1", "10.0.0.2:9733")])
    alerts = [rule for rule in rules_of() if "alert" in rule] + generated["groups"][0]["rules"]
    for rule in alerts:
        url = rule["annotations"].get("runbook_url", "")
        assert url == f"{RUNBOOKS}#{rule['alert'].lower()}" and rule["alert"].lower() in anchors, (rule["alert"], url)


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


def test_promtool_fires_for_a_ct_of_the_target_list_that_prometheus_does_not_scrape(tmp_path):
    """The rules make metrics-targets writes beside its list (the prometheus_target_rules filter):
    ct501 is in the list, Prometheus scrapes ct500 alone; after 5 minutes DflashTargetMissing fires
    for ct501, and never for ct500."""
    from ansible_collections.dflash.lifecycle.plugins.filter.monitoring import prometheus_target, prometheus_target_rules

    entries = [prometheus_target(ct, vmid, "mn1", "0.0.0.0:9733", addresses=[address])
               for ct, vmid, address in (("ct500", 500, "10.77.6.10"), ("ct501", 501, "10.77.6.11"))]
    rules = prometheus_target_rules(entries)
    (tmp_path / "targets.rules.yml").write_text(yaml.safe_dump(rules))
    annotations = {key: value.replace("{{ $labels.ct }}", "ct501")
                   for key, value in rules["groups"][0]["rules"][0]["annotations"].items()}
    tests = {"rule_files": ["targets.rules.yml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [{"series": 'up{job="dflash-trainers",ct="ct500",vmid="500",node="mn1",instance="10.77.6.10:9733"}',
                          "values": "1x20"}],
        "alert_rule_test": [
            {"eval_time": "4m", "alertname": "DflashTargetMissing", "exp_alerts": []},
            {"eval_time": "10m", "alertname": "DflashTargetMissing", "exp_alerts": [{
                "exp_labels": {"severity": "critical", "job": "dflash-trainers", "ct": "ct501"},
                "exp_annotations": annotations}]}]}]}
    (tmp_path / "targets.test.yml").write_text(yaml.safe_dump(tests))
    res = promtool("test", "rules", "targets.test.yml", cwd=str(tmp_path))
    assert res.returncode == 0 and "SUCCESS" in res.stdout, res.stdout + res.stderr


def test_the_grafana_provisioning_files_hold_the_data_source_and_the_dashboard():
    """What a team drops into /etc/grafana/provisioning: a Prometheus data source of the type the
    dashboard's variable asks for, and a file provider; the dashboard has its node, gang and CT
    variables and a current schemaVersion (Grafana 11's)."""
    grafana = os.path.join(REPO, "monitoring", "grafana", "provisioning")
    sources = yaml.safe_load(open(os.path.join(grafana, "datasources", "dflash.yml"), encoding="utf-8"))
    providers = yaml.safe_load(open(os.path.join(grafana, "dashboards", "dflash.yml"), encoding="utf-8"))
    board = json.load(open(DASHBOARD, encoding="utf-8"))
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert sources["apiVersion"] == 1 and [s["type"] for s in sources["datasources"]] == [variables["datasource"]["query"]]
    (provider,) = providers["providers"]
    assert provider["type"] == "file" and provider["options"]["path"].startswith("/")
    assert board["schemaVersion"] >= 39 and "style" not in board
    assert [name for name in variables] == ["datasource", "node", "gang", "ct"]
    panels = [expr for expr in dashboard_exprs() if "dflash_" in expr and not expr.startswith("label_values")]
    assert panels and all(f'{name}=~"${name}"' in expr for expr in panels for name in ("ct", "node", "gang"))
