"""The runs' metrics as Prometheus sees them (docs/monitoring.md): a real Prometheus - Debian's
package - scrapes the CTs of a testbed of this module's own on their NICs, with the scrape job of
monitoring/prometheus/prometheus.yml, the target list `make metrics-targets` writes from the
inventory, and the alert rules of monitoring/prometheus/dflash-rules.yml. Only the intervals are
shorter (1 s), and every rule's `for` is 0 s: the rules' timing is promtool's to test
(tests/unit/test_monitoring_files.py), their conditions are tested here against the world.

Prometheus runs in the testbed's cluster network namespace, where the CTs' NICs are (10.77.6.x);
the test asks it through a helper process in that namespace. Nothing leaves namespaces the testbed
made. The CTs: ct500 (privileged) and ct501 (unprivileged, as Proxmox creates one), each running the
example trainer under its supervisor."""

import json
import os
import shlex
import subprocess
import time
import urllib.parse

import pytest
import yaml

from testlib import REPO, OwnTestbed, make_testbed_inventory, tool_env, wait_for

import pct as pct_mod  # tests/testbed, on the path testlib set

STATE = "/var/lib/dflash-testbed/monitoring"
LOOPBACK = "127.77.6"
NET = "10.77.6"
CTS = {"ct500": ("mn1", 500, f"{NET}.10"), "ct501": ("mn1", 501, f"{NET}.11")}
PORT = 9733
FAULT = "/tmp/dflash-fault"  # the example trainer's DFLASH_TEST_FAULT_FILE, in each CT
MONITORING = os.path.join(REPO, "monitoring")
SCRAPE = os.path.join(MONITORING, "prometheus", "prometheus.yml")
RULES = os.path.join(MONITORING, "prometheus", "dflash-rules.yml")
DASHBOARD = os.path.join(MONITORING, "grafana", "dflash-runs.json")
PROMETHEUS = "127.0.0.1:9090"  # the namespace's own loopback

# one process in the namespace that fetches each URL it reads, one JSON line per answer
ASKER = r"""
import json, sys, urllib.request
for line in sys.stdin:
    try:
        body = json.loads(urllib.request.urlopen(line.strip(), timeout=10).read().decode())
    except Exception as err:
        body = {"status": "error", "error": repr(err)}
    sys.stdout.write(json.dumps(body) + "\n")
    sys.stdout.flush()
"""


class Prometheus:
    """The module's Prometheus, on the scrape job and rules of the repository."""

    def __init__(self, workdir, netns, targets):
        config = yaml.safe_load(open(SCRAPE, encoding="utf-8"))
        job = config["scrape_configs"][0]
        job.update(scrape_interval="1s", scrape_timeout="1s")
        job["file_sd_configs"] = [{"files": [str(targets)], "refresh_interval": "1s"}]
        # the shipped rules and the target list's (make metrics-targets wrote them beside the list)
        config["rule_files"] = []
        for source in (RULES, targets.parent / "dflash-targets.rules.yml"):
            rules = yaml.safe_load(open(source, encoding="utf-8"))
            for group in rules["groups"]:
                group["interval"] = "1s"
                for rule in group["rules"]:
                    rule.pop("for", None)
            rules_path = workdir / f"rules-{len(config['rule_files'])}.yml"
            rules_path.write_text(yaml.safe_dump(rules))
            config["rule_files"].append(str(rules_path))
        config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = open(workdir / "prometheus.log", "w", encoding="utf-8")
        self.proc = subprocess.Popen(["ip", "netns", "exec", netns, "prometheus", f"--config.file={workdir}/prometheus.yml",
                                      f"--storage.tsdb.path={workdir}/data", f"--web.listen-address={PROMETHEUS}"],
                                     stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.asker = subprocess.Popen(["ip", "netns", "exec", netns, "python3", "-u", "-c", ASKER], text=True,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.started, self.netns, self.workdir = time.time(), netns, workdir
        try:
            wait_for("Prometheus ready", lambda: self.get("/api/v1/status/runtimeinfo").get("status") == "success", 60,
                     lambda: open(workdir / "prometheus.log", encoding="utf-8").read()[-3000:])
        except BaseException:
            self.close()  # the fixture never holds a Prometheus that did not start: end ours here
            raise

    def get(self, path, **params):
        self.asker.stdin.write(f"http://{PROMETHEUS}{path}?{urllib.parse.urlencode(params)}\n")
        self.asker.stdin.flush()
        line = self.asker.stdout.readline()
        return {"status": "error", "error": "no answer"} if not line else json.loads(line)

    def query(self, expr):
        answer = self.get("/api/v1/query", query=expr)
        assert answer.get("status") == "success", (expr, answer)
        return answer["data"]["result"]

    def by_ct(self, expr):
        """{ct: value} of an instant query."""
        return {sample["metric"].get("ct"): float(sample["value"][1]) for sample in self.query(expr)}

    def firing(self, alert):
        """The CTs alert fires for now."""
        return {sample["metric"].get("ct") for sample in self.query(f'ALERTS{{alertname="{alert}",alertstate="firing"}}')}

    def wait(self, what, condition, timeout=120):
        return wait_for(what, condition, timeout, lambda: json.dumps(self.get("/api/v1/alerts"))[-3000:])

    def close(self):
        for proc in (self.asker, self.proc):
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.log.close()


class Bed(OwnTestbed):
    def __init__(self, inventory):
        super().__init__(inventory, {host: (node, vmid) for host, (node, vmid, _address) in CTS.items()})

    def make(self, target, host, extra=None):
        args = ["make", target, f"HOST={host}", f"INVENTORY={self.inventory}"]
        if extra:
            args.append(f"EXTRA=-e {shlex.quote(json.dumps(extra))}")
        res = subprocess.run(args, cwd=REPO, env=tool_env(), capture_output=True, text=True, check=False,
                             stdin=subprocess.DEVNULL, timeout=600)
        assert res.returncode == 0, f"make {target} HOST={host}: {res.stdout[-5000:]}{res.stderr[-2000:]}"
        return res

    def trainer(self, host):
        return self.sh(host, "cat /run/dflash/trainer.pid 2>/dev/null || true").split()[:1]


@pytest.fixture(scope="module")
def monitored(tmp_path_factory):
    root = tmp_path_factory.mktemp("monitoring")
    # no metrics_target: the target list takes each CT's address from its Proxmox configuration (net0)
    cts = {host: {"pve_node": node, "ansible_pct_vmid": vmid, "testbed_net0": f"name=eth0,bridge=vmbr0,ip={address}/24"}
           for host, (node, vmid, address) in CTS.items()}
    cts["ct501"]["testbed_unprivileged"] = True
    # a crash loop within seconds: the back-off from 1 s, left down after 2 restarts; the model restaged
    # into /dev/shm after the CT restart of test 12
    settings = {"trainer_launch_supervise_backoff_s": 1, "trainer_launch_supervise_crash_loop_restarts": 2,
                "dflash_env": {"PYTHONUNBUFFERED": "1", "DFLASH_TEST_FAULT_FILE": FAULT},
                "trainer_model_stage": {"/dev/shm/models/target": "/workspace/models/target"},
                "trainer_model_stage_reserve_gb": 0.05}
    inventory = make_testbed_inventory(str(root / "inventory"), STATE, {"mn1": f"{LOOPBACK}.1"}, cts, settings)
    bed = Bed(inventory)
    bed.bed.up_fresh()
    prometheus = None
    try:
        netns = pct_mod.cluster_netns(STATE)
        subprocess.run(["ip", "-n", netns, "link", "set", "lo", "up"], check=True)
        subprocess.run(["ip", "-n", netns, "addr", "replace", f"{NET}.254/24", "dev", "vmbr0"], check=True)
        seeded = bed.live.playbook("-i", inventory, os.path.join(REPO, "playbooks", "testbed_seed.yml"),
                                   "-e", "seed_hosts=dflash_trainers", check=False)
        assert seeded.returncode == 0, seeded.stdout[-4000:]
        for host in CTS:  # the model's persistent copy, which a CT restart leaves
            bed.sh(host, "mkdir -p /workspace/models && cp -a /dev/shm/models/target /workspace/models/target")
        bed.make("restart", "dflash_trainers")
        targets = root / "targets" / "dflash-trainers.json"
        bed.make("metrics-targets", "dflash_trainers", {"metrics_targets_path": str(targets)})
        prometheus = Prometheus(root, netns, targets)
        yield bed, prometheus, targets
    finally:
        if prometheus is not None:
            prometheus.close()
        bed.bed.down()


def test_1_prometheus_scrapes_every_ct_by_the_inventorys_target_list(monitored):
    """make metrics-targets writes one entry per CT, labelled from the inventory, at the address
    Proxmox gives its NIC (never its name: DNS would decide who answers); Prometheus scrapes both CTs
    on their NICs and sees each run up, wanted, training, with its release and launcher."""
    bed, prometheus, targets = monitored
    listed = json.loads(targets.read_text())
    assert sorted(listed, key=lambda e: e["labels"]["ct"]) == [
        {"targets": [f"{NET}.10:{PORT}"], "labels": {"ct": "ct500", "vmid": "500", "node": "mn1"}},
        {"targets": [f"{NET}.11:{PORT}"], "labels": {"ct": "ct501", "vmid": "501", "node": "mn1"}}], listed
    prometheus.wait("both CTs scraped", lambda: prometheus.by_ct('up{job="dflash-trainers"}') == {"ct500": 1, "ct501": 1})
    assert prometheus.by_ct("dflash_run_up") == {"ct500": 1, "ct501": 1}
    assert prometheus.by_ct("dflash_run_wanted_running") == {"ct500": 1, "ct501": 1}
    assert prometheus.by_ct("dflash_supervisor_up") == {"ct500": 1, "ct501": 1}
    first = prometheus.by_ct("dflash_run_step")
    prometheus.wait("the steps go on", lambda: all(v > first[ct] for ct, v in prometheus.by_ct("dflash_run_step").items()))
    assert all(v > 0 for v in prometheus.by_ct("dflash_run_tokens_per_second").values())
    assert all(0 < v < 20 for v in prometheus.by_ct("dflash_run_loss").values())
    info = {s["metric"]["ct"]: s["metric"] for s in prometheus.query("dflash_run_info")}
    for host in CTS:
        release = bed.sh(host, "readlink /opt/dflash/current").strip().split("/")[-1]
        assert (info[host]["release"], info[host]["launcher"], info[host]["layout"]) == (release, "python", "step_dirs"), info
        assert info[host]["vmid"] == str(CTS[host][1]) and info[host]["node"] == "mn1"
    # the testbed's make restart replaced the seeded run: a redeploy, its GPU idle measured, its stop
    # (the first in the CT: no launch of ours had kept anything there) at SIGINT, nothing lost
    assert prometheus.by_ct("dflash_redeploys_total") == {"ct500": 1, "ct501": 1}
    assert prometheus.by_ct("dflash_last_stop_stage") == {"ct500": 1, "ct501": 1}
    assert prometheus.by_ct("dflash_last_stop_steps_lost") == {"ct500": 0, "ct501": 0}
    assert all(0 < v < 60 for v in prometheus.by_ct("dflash_redeploy_gpu_idle_seconds").values())


def test_2_no_proxmox_hook_is_alerted_until_make_pve_hooks_sets_it(monitored):
    bed, prometheus, _targets = monitored
    prometheus.wait("DflashNoProxmoxHook for both", lambda: prometheus.firing("DflashNoProxmoxHook") == {"ct500", "ct501"})
    bed.make("pve-hooks", "ct500")
    prometheus.wait("the hook seen in ct500", lambda: prometheus.by_ct("dflash_pve_hook_present") == {"ct500": 1, "ct501": 0})
    prometheus.wait("DflashNoProxmoxHook for ct501 alone", lambda: prometheus.firing("DflashNoProxmoxHook") == {"ct501"})


def test_3_a_kill_9_counts_a_restart_after_a_crash_and_the_run_comes_back(monitored):
    bed, prometheus, _targets = monitored
    before = prometheus.by_ct('dflash_supervisor_restarts_total{cause="crash"}')["ct500"]
    started = prometheus.by_ct("dflash_run_start_time_seconds")["ct500"]
    pid = bed.trainer("ct500")[0]
    bed.sh("ct500", f"kill -KILL {pid}")
    prometheus.wait("a restart after the crash", lambda: prometheus.by_ct(
        'dflash_supervisor_restarts_total{cause="crash"}').get("ct500") == before + 1)
    prometheus.wait("ct500 up again, a new trainer", lambda: prometheus.by_ct("dflash_run_up").get("ct500") == 1
                    and prometheus.by_ct("dflash_run_start_time_seconds").get("ct500", 0) > started)
    assert prometheus.by_ct('dflash_supervisor_ends_total{kind="crash"}')["ct500"] == 1
    assert bed.trainer("ct500")[0] != pid


def test_4_a_hang_is_declared_alerted_and_the_run_relaunched(monitored):
    bed, prometheus, _targets = monitored
    bed.sh("ct500", f"echo hang > {FAULT}")
    prometheus.wait("DflashHang", lambda: "ct500" in prometheus.firing("DflashHang"), 180)
    assert prometheus.by_ct('dflash_supervisor_ends_total{kind="hang"}')["ct500"] == 1
    assert prometheus.by_ct("dflash_supervisor_hang_timeout_seconds")["ct500"] >= 10
    prometheus.wait("ct500 relaunched after the hang", lambda: prometheus.by_ct(
        'dflash_supervisor_restarts_total{cause="hang"}').get("ct500") == 1 and prometheus.by_ct("dflash_run_up").get("ct500") == 1)
    # the hang's stop, SIGINT first: the trainer, asleep in Python, saved
    stop = prometheus.by_ct("dflash_last_stop_stage")
    assert stop["ct500"] == 1 and prometheus.by_ct("dflash_last_stop_steps_lost")["ct500"] == 0


def test_5_a_redeploy_counts_and_its_stop_is_shown(monitored):
    bed, prometheus, _targets = monitored
    before = prometheus.by_ct("dflash_redeploys_total")["ct500"]
    bed.make("restart", "ct500")
    prometheus.wait("the redeploy counted", lambda: prometheus.by_ct("dflash_redeploys_total").get("ct500") == before + 1)
    assert prometheus.by_ct("dflash_last_stop_stage")["ct500"] == 1  # SIGINT
    assert prometheus.by_ct("dflash_last_stop_steps_lost")["ct500"] == 0
    assert prometheus.by_ct("dflash_last_stop_failed")["ct500"] == 0
    assert 0 < prometheus.by_ct("dflash_last_stop_duration_seconds")["ct500"] < 60
    # a job's launch counts afresh: the restarts of the run it replaced are not the new run's
    prometheus.wait("the new run's supervisor, counting afresh", lambda: prometheus.by_ct(
        "sum by (ct) (dflash_supervisor_restarts_total)").get("ct500") == 0)


def test_6_after_make_stop_the_run_is_down_and_wanted_stopped_and_no_alert_says_otherwise(monitored):
    bed, prometheus, _targets = monitored
    bed.make("stop", "ct501")
    prometheus.wait("ct501 down and wanted stopped", lambda: prometheus.by_ct("dflash_run_up").get("ct501") == 0
                    and prometheus.by_ct("dflash_run_wanted_running").get("ct501") == 0)
    assert prometheus.by_ct('up{job="dflash-trainers"}')["ct501"] == 1  # its metrics outlive the run
    # several evaluations of every rule, each of which would fire at once
    evaluated = time.time()
    prometheus.wait("5 s of evaluations", lambda: time.time() - evaluated > 5)
    assert "ct501" not in prometheus.firing("DflashRunDown")
    assert "ct501" not in prometheus.firing("DflashSupervisorGone")
    assert "ct501" not in prometheus.firing("DflashCrashLoop")
    assert prometheus.by_ct("dflash_supervisor_state == 1")["ct501"] == 1  # stood down, said as such
    assert prometheus.query('dflash_supervisor_state{ct="ct501"} == 1')[0]["metric"]["state"] == "stood_down"


def test_7_a_crash_at_every_start_fires_the_crash_loop_and_run_down_alerts(monitored):
    bed, prometheus, _targets = monitored
    bed.make("start", "ct501")
    prometheus.wait("ct501 up again", lambda: prometheus.by_ct("dflash_run_up").get("ct501") == 1)
    bed.sh("ct501", f"echo crash-at-start > {FAULT}")
    bed.sh("ct501", f"kill -KILL {bed.trainer('ct501')[0]}")
    try:
        prometheus.wait("DflashCrashLoop for ct501", lambda: "ct501" in prometheus.firing("DflashCrashLoop"), 180)
        prometheus.wait("the supervisor gave up", lambda: prometheus.query(
            'dflash_supervisor_state{ct="ct501",state="down"} == 1'), 180)
        assert "ct501" in prometheus.firing("DflashRunDown")
        assert "ct500" not in prometheus.firing("DflashCrashLoop") | prometheus.firing("DflashRunDown")
        # a redeploy that fails the same way: its stop marks the run stopped, its launch fails and
        # leaves it down; no one wanted that, so the run stays wanted and the run-down alert holds
        failed = subprocess.run(["make", "restart", "HOST=ct501", f"INVENTORY={bed.inventory}"], cwd=REPO, env=tool_env(),
                                capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL, timeout=600)
        assert failed.returncode != 0, failed.stdout[-3000:]
        assert json.loads(bed.sh("ct501", "cat /var/lib/dflash/lifecycle/run.json"))["left_down"]["why"], failed.stdout[-3000:]
        evaluated = time.time()
        prometheus.wait("3 s of evaluations after the failed redeploy", lambda: time.time() - evaluated > 3)
        assert prometheus.by_ct("dflash_run_wanted_running")["ct501"] == 1
        assert "ct501" in prometheus.firing("DflashRunDown")
    finally:
        bed.sh("ct501", f"rm -f {FAULT}")


def dashboard_queries():
    """Every query of the dashboard - its panels' targets and its annotations - as Prometheus takes
    it: every node, gang and CT chosen (All), Grafana's rate interval 1m, a range of an hour."""
    board = json.load(open(DASHBOARD, encoding="utf-8"))
    found = [(panel["title"], target["expr"]) for panel in board["panels"] for target in panel.get("targets", [])]
    found += [(f"annotation {a['name']}", a["expr"]) for a in board["annotations"]["list"]]
    return [(title, expr.replace("$ct", ".*").replace("$node", ".*").replace("$gang", ".*").replace("$__rate_interval", "1m")
             .replace("$__range", "1h")) for title, expr in found]


def test_8_every_query_of_the_dashboard_returns_data(monitored):
    """Over the module's run, as Grafana asks (a range query), each query returns series: the runs,
    their throughput, steps and loss, the steps exposed, the restarts, the stops and redeploys."""
    _bed, prometheus, _targets = monitored
    queries = dashboard_queries()
    assert len(queries) >= 15, queries
    empty = []
    for title, expr in queries:
        answer = prometheus.get("/api/v1/query_range", query=expr, start=prometheus.started, end=time.time(), step="2s")
        assert answer.get("status") == "success", (title, expr, answer)
        if not answer["data"]["result"]:
            empty.append((title, expr))
    assert not empty, empty
    # the CT variable's label_values(dflash_run_up, ct)
    values = prometheus.get("/api/v1/label/ct/values", **{"match[]": "dflash_run_up"})
    assert values["data"] == ["ct500", "ct501"], values
    # and the alerts fire where they should, nowhere else: ct501's crash loop has it down though wanted, it
    # has no hook, and ct500's hang was declared within 15 minutes (the throughput alert is left out:
    # the example trainer's figure moves with the machine's load, as a real regression would)
    firing = {(s["metric"]["alertname"], s["metric"]["ct"]) for s in prometheus.query('ALERTS{alertstate="firing"}')}
    assert firing - {("DflashThroughputRegression", "ct500"), ("DflashThroughputRegression", "ct501")} == {
        ("DflashCrashLoop", "ct501"), ("DflashRunDown", "ct501"), ("DflashNoProxmoxHook", "ct501"),
        ("DflashHang", "ct500")}, firing
    # the steps exposed never passed a save interval (500) and a progress line (50): the checkpoints are
    # listed again once a save lands, not a minute later with its steps still counted as exposed
    exposed = prometheus.get("/api/v1/query_range", query="max(dflash_run_steps_since_checkpoint)",
                             start=prometheus.started, end=time.time(), step="1s")
    highest = max(float(value) for series in exposed["data"]["result"] for _at, value in series["values"])
    assert highest <= 550, (highest, exposed["data"]["result"])
    if os.environ.get("DFLASH_MONITORING_SCREENSHOTS"):
        screenshots(prometheus, os.environ["DFLASH_MONITORING_SCREENSHOTS"])


def screenshots(prometheus, directory):
    """docs/monitoring.md's pictures: Prometheus's own graph and alerts pages, in Debian's chromium
    (headless, in the namespace, no network of its own beyond it)."""
    minutes = int((time.time() - prometheus.started) / 60) + 1
    graph = urllib.parse.urlencode({"g0.expr": "dflash_run_tokens_per_second", "g0.tab": "0",
                                    "g0.range_input": f"{minutes}m", "g0.stacked": "0", "g0.show_exemplars": "0"})
    for name, page in (("monitoring-tokens.png", f"graph?{graph}"), ("monitoring-alerts.png", "classic/alerts")):
        subprocess.run(["ip", "netns", "exec", prometheus.netns, "chromium", "--headless", "--no-sandbox", "--disable-gpu",
                        "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update",
                        "--disable-sync", f"--user-data-dir={prometheus.workdir}/chromium", "--hide-scrollbars",
                        "--window-size=1400,900", "--virtual-time-budget=8000",
                        f"--screenshot={os.path.join(os.path.abspath(directory), name)}", f"http://{PROMETHEUS}/{page}"],
                       check=True, capture_output=True, timeout=120)


HOSTILE = r"""
import http.server, sys
body = sys.argv[1].replace("\\n", "\n").encode()
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.HTTPServer(("0.0.0.0", 9733), Handler).serve_forever()
"""


def serve_in_ct501(bed, body, before=None):
    """ct501's root ends its metrics process (or the server of before, a PID) and serves body on the
    metrics port instead; returns the PID of its server."""
    found = bed.sh("ct501", "cat /var/lib/dflash/lifecycle/metrics.pid 2>/dev/null || true").split()
    for pid in ([found[0]] if found else []) + ([before] if before else []):
        bed.sh("ct501", f"kill {pid}; while kill -0 {pid} 2> /dev/null; do sleep 0.1; done", check=False)
    bed.sh("ct501", "rm -f /var/lib/dflash/lifecycle/metrics.pid")
    return bed.sh("ct501", f"python3 -c {shlex.quote(HOSTILE)} {shlex.quote(body)} > /dev/null 2>&1 & echo $!").strip()


def test_9_a_ct_that_serves_another_cts_labels_or_too_much_speaks_only_for_itself(monitored):
    """ct501's root serves metrics that claim to be ct500's, with labels of its own choosing and a
    metric of its own: they stay ct501's (honor_labels: false, the CT's own labels renamed
    exported_*), its other labels and metric are dropped (metric_relabel_configs), and ct500's run is
    still up. Serving more samples than
    the job's sample_limit fails the scrape: DflashMetricsDown's condition, and nothing stored."""
    bed, prometheus, _targets = monitored
    server = serve_in_ct501(bed, 'dflash_run_up{ct="ct500",vmid="500",node="mn1",severity="page",team="ml"} 0\\n'
                                 'evil_up{ct="ct500"} 1\\n')
    prometheus.wait("ct501's lie scraped", lambda: prometheus.query('dflash_run_up{exported_ct="ct500"}'))
    lie = prometheus.query('dflash_run_up{exported_ct="ct500"}')
    assert [(s["metric"]["ct"], s["metric"]["vmid"], s["value"][1]) for s in lie] == [("ct501", "501", "0")], lie
    # a label of the CT's own choosing never reaches an alert's labels, and no metric but the project's is kept
    assert "severity" not in lie[0]["metric"] and "team" not in lie[0]["metric"], lie
    assert not prometheus.query('{__name__="evil_up"}') and not prometheus.query('{__name__=~"dflash_.+",team!=""}')
    assert prometheus.by_ct('dflash_run_up{exported_ct=""}').get("ct500") == 1
    # 600 series the scrape job keeps (a label of the exporter's own, each value another series)
    flood = "\\n".join(f"dflash_supervisor_state{{state=\"s{i}\"}} {i}" for i in range(600)) + "\\n"
    server = serve_in_ct501(bed, flood, server)
    prometheus.wait("ct501's scrape failed by its sample limit", lambda: prometheus.by_ct(
        'up{job="dflash-trainers"}') == {"ct500": 1, "ct501": 0})
    assert not prometheus.query('dflash_supervisor_state{ct="ct501",state=~"s[0-9]+"}')
    bed.sh("ct501", f"kill {server}")


def test_10_no_ct_drops_out_of_the_target_list_and_one_missing_from_prometheus_is_alerted(monitored):
    """make metrics-targets with HOST is refused and leaves the list whole; a list without ct501 (one
    written by hand, or by a version that took HOST) fires DflashTargetMissing for it, from the rules
    the whole list's run wrote; writing the list again ends it."""
    bed, prometheus, targets = monitored
    whole = targets.read_text()
    refused = subprocess.run(["make", "metrics-targets", "HOST=ct501", f"INVENTORY={bed.inventory}",
                              f"EXTRA=-e {shlex.quote(json.dumps({'metrics_targets_path': str(targets)}))}"],
                             cwd=REPO, env=tool_env(), capture_output=True, text=True, check=False,
                             stdin=subprocess.DEVNULL, timeout=600)
    said = " ".join(refused.stdout.split())
    assert refused.returncode != 0 and "make metrics-targets writes every trainer CT of the inventory" in said, said[-3000:]
    assert "would drop ct500 from Prometheus" in said and targets.read_text() == whole
    targets.write_text(json.dumps([entry for entry in json.loads(whole) if entry["labels"]["ct"] == "ct500"]))
    prometheus.wait("DflashTargetMissing for ct501", lambda: prometheus.firing("DflashTargetMissing") == {"ct501"})
    bed.make("metrics-targets", "dflash_trainers", {"metrics_targets_path": str(targets)})
    prometheus.wait("ct501 a target again, nothing missing", lambda: "ct501" in prometheus.by_ct('up{job="dflash-trainers"}')
                    and not prometheus.firing("DflashTargetMissing"))


def test_11_a_killed_metrics_process_comes_back_by_itself_counted(monitored):
    bed, prometheus, _targets = monitored
    pid = bed.sh("ct500", "cut -d' ' -f1 /var/lib/dflash/lifecycle/metrics.pid").strip()
    bed.sh("ct500", f"kill -KILL {pid}")
    prometheus.wait("ct500's metrics process started again by its supervisor", lambda: prometheus.by_ct(
        "dflash_metrics_restarts_total").get("ct500") == 1 and prometheus.by_ct('up{job="dflash-trainers"}').get("ct500") == 1)
    assert bed.sh("ct500", "cut -d' ' -f1 /var/lib/dflash/lifecycle/metrics.pid").strip() != pid
    status = " ".join(bed.make("status", "ct500").stdout.split())
    assert "the supervisor started it again 1 time(s) since the launch" in status, status[-3000:]


def test_12_the_totals_add_up_over_a_crash_a_hang_a_redeploy_and_a_proxmox_stop(monitored):
    """ct500 crashed (test 3), hung (test 4) and was redeployed (test 5); now Proxmox shuts its CT down
    and starts it (the hook set in test 2): the run comes back, and each way down has its GPU idle
    counted under its cause, with its steps lost (none for the stops that saved)."""
    bed, prometheus, _targets = monitored
    before = prometheus.by_ct('dflash_gpu_idle_seconds_total{cause="proxmox"}').get("ct500")
    started = prometheus.by_ct("dflash_run_start_time_seconds")["ct500"]
    node, vmid = bed.cts["ct500"]
    bed.live.ssh(node, f"pct shutdown {vmid}", check=True, timeout=300)
    bed.live.ssh(node, f"pct start {vmid}", check=True, timeout=300)
    prometheus.wait("ct500 back after Proxmox's stop, its idle counted", lambda: prometheus.by_ct(
        "dflash_run_start_time_seconds").get("ct500", 0) > started and prometheus.by_ct(
        'dflash_gpu_idle_seconds_total{cause="proxmox"}').get("ct500", 0) > (before or 0), 240)
    idle = {cause: prometheus.by_ct(f'dflash_gpu_idle_seconds_total{{cause="{cause}"}}')["ct500"]
            for cause in ("crash", "hang", "redeploy", "proxmox", "stop")}
    assert all(idle[cause] > 0 for cause in ("crash", "hang", "redeploy", "proxmox")) and idle["stop"] == 0, idle
    lost = {cause: prometheus.by_ct(f'dflash_steps_lost_total{{cause="{cause}"}}')["ct500"]
            for cause in ("crash", "hang", "redeploy", "proxmox")}
    # the hang's stop, the redeploy's and Proxmox's saved at SIGINT; the kill -9 lost what it ran past its checkpoint
    assert lost["hang"] == lost["redeploy"] == lost["proxmox"] == 0 and lost["crash"] >= 0, lost
    assert prometheus.by_ct("increase(dflash_run_tokens_total[5m])")["ct500"] > 0
