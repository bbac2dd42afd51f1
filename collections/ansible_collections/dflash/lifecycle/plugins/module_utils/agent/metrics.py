# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The run's metrics for Prometheus, served over HTTP from the CT (Python 3.8 compatible, the
standard library only; docs/monitoring.md).

``python3 <lifecycle dir>/agent.zip metrics`` serves ``/metrics`` in Prometheus's text format on the
address the launch's ``metrics.listen`` option names (``trainer_launch_metrics_listen``). It is a
process of its own, not a thread of the run's supervisor: it must say that a run is down and wanted
stopped after the supervisor stood down with it, and that a supervisor is gone, which no supervisor
can say of itself. Each launch and each post-start of the Proxmox hook make sure one serves
(ensure); it outlives runs and stops, and ends with the CT.

A scrape reads what the CT keeps - the run's spec (run.json), the supervisor's state, the history
of its stops and redeploys (ct/history.py), the pidfile - and the log from where the last scrape
left it: nothing is asked of the trainer, and between scrapes the process sleeps in select(); no
client holds it (agent/scrape_server.py: a deadline per request, a cap on connections). The
checkpoint directory is listed at most once a minute. Labels name what the value is about (a cause,
a state); who the CT is - its name, vmid, node and gang - comes from Prometheus's target labels
(the inventory's file SD), never from the CT, so a CT cannot speak for another.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sys
import time

from ansible_collections.dflash.lifecycle.plugins.module_utils.agent import metrics_process, policy, scrape_server, supervision
from ansible_collections.dflash.lifecycle.plugins.module_utils.agent.launch_options import split_listen
from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint import checkpoint_files, checkpoints
from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import history, proctable, progress, run_spec, rundir
from ansible_collections.dflash.lifecycle.plugins.module_utils.launch import launchers

# the first scrape of a log reads its end only; later ones what was written since
TAIL_BYTES = 1 << 20
CHECKPOINT_TTL_S = 60.0
LOSS = re.compile(r"\bloss[\s:=]*(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)", re.IGNORECASE)
CAUSES = ("crash", "hang", "peer", "relaunch")
# the supervisor's states (agent/supervision.py saves them in words), as a Prometheus state set
STATES = ("watching", "backing_off", "relaunching", "relaunched", "stopping", "hung", "down", "stood_down",
          "finished", "gone")
# every label the exporter serves: the shipped scrape job stores these and the target's alone
# (monitoring/prometheus/prometheus.yml metric_relabel_configs)
LABELS = ("release", "layout", "launcher", "state", "cause", "kind", "gpu", "uuid", "role")
# the tokens are the trainer's throughput integrated between scrapes: at most this many seconds of it
# between two (a process started again, a scrape missed), and only while its last progress line is
# younger than the supervisor's hang timeout (else TOKENS_FRESH_S): a hung run trains no tokens
TOKENS_STEP_MAX_S = 60.0
TOKENS_FRESH_S = 300.0
ACTIVE = ("watching", "backing_off", "relaunching", "relaunched", "stopping", "hung")

# name, type, help: every metric served, in the order served (docs/monitoring.md lists them)
METRICS = (
    ("dflash_run_info", "gauge", "The run's release, checkpoint layout and launcher (value 1)."),
    ("dflash_run_up", "gauge", "1 while the trainer of the run's pidfile runs."),
    ("dflash_run_wanted_running", "gauge",
     "1 when the run is wanted running (a run a failed job left down included), 0 when it was stopped on purpose."),
    ("dflash_run_supervised", "gauge", "1 when the run was launched with a supervisor."),
    ("dflash_run_start_time_seconds", "gauge", "When the running trainer started."),
    ("dflash_run_step", "gauge", "The step of the last progress line."),
    ("dflash_run_tokens_per_second", "gauge", "The throughput of the last progress line."),
    ("dflash_run_loss", "gauge", "The loss of the last progress line, where it has one."),
    ("dflash_run_tokens_total", "counter",
     "Tokens the run trained: its throughput integrated over time at each scrape, while it logs progress (kept across launches)."),
    ("dflash_run_gpu_info", "gauge", "The GPUs the run was launched on (value 1), by index, nvidia-smi's UUID and role."),
    ("dflash_run_last_progress_timestamp_seconds", "gauge",
     "When the log was last written with a progress line in it (the age: time() minus this)."),
    ("dflash_checkpoint_newest_step", "gauge", "The step of the newest complete checkpoint."),
    ("dflash_checkpoint_newest_timestamp_seconds", "gauge", "When the newest complete checkpoint was written."),
    ("dflash_checkpoint_interval_steps", "gauge", "Steps between the two newest complete checkpoints."),
    ("dflash_checkpoint_exposed_steps_limit", "gauge",
     "The steps past the newest complete checkpoint a crash may lose before it is alerted on (the operator's)."),
    ("dflash_run_steps_since_checkpoint", "gauge",
     "Steps of the last progress line past the newest complete checkpoint: what a crash now would lose."),
    ("dflash_supervisor_up", "gauge", "1 while the run's supervisor runs."),
    ("dflash_supervisor_state", "gauge", "The supervisor's state (1 for the state it is in); gone: it died while active."),
    ("dflash_supervisor_restarts_total", "counter", "Relaunches by the supervisor since the job's launch, by the end they followed."),
    ("dflash_supervisor_ends_total", "counter",
     "Ends of the run the supervisor saw since the job's launch, by kind: crash, hang, peer (a gang member's), relaunch (failed)."),
    ("dflash_supervisor_hang_timeout_seconds", "gauge", "The silence the supervisor takes for a hang, learned from the run."),
    ("dflash_last_stop_timestamp_seconds", "gauge", "When the last stop that ended a trainer ended."),
    ("dflash_last_stop_duration_seconds", "gauge", "How long the last stop took."),
    ("dflash_last_stop_stage", "gauge", "What ended the last stop's trainer: 0 the stop request, N the ladder's Nth signal."),
    ("dflash_last_stop_steps_lost", "gauge", "The steps the last stop lost: logged, and in no checkpoint."),
    ("dflash_last_stop_failed", "gauge", "1 when the last stop did not end the run as asked."),
    ("dflash_redeploys_total", "counter", "Launches that replaced a running trainer."),
    ("dflash_redeploy_timestamp_seconds", "gauge", "When the last redeploy's new run was healthy."),
    ("dflash_redeploy_gpu_idle_seconds", "gauge",
     "The last redeploy's GPU idle: from its stop's start to the new run's first progress line."),
    ("dflash_redeploy_tokens_per_second", "gauge", "The throughput the last launch measured on the new run (the canary's after)."),
    ("dflash_canary_threshold_ratio", "gauge", "The canary's threshold as a ratio (-0.05: 5 per cent slower is a regression)."),
    ("dflash_pve_hook_present", "gauge",
     "1 when the Proxmox hook was set on the CT since its start, or ran at its start; 0: a stop of the CT loses the checkpoint."),
    ("dflash_ct_start_time_seconds", "gauge", "When the CT started (its init)."),
    ("dflash_steps_lost_total", "counter",
     "Steps logged and in no checkpoint, lost by stops and crashes, by cause (kept across launches and CT restarts)."),
    ("dflash_gpu_idle_seconds_total", "counter",
     "Seconds from the run going down to the next run's first progress line, by why it went down (kept across launches)."),
    ("dflash_metrics_restarts_total", "counter", "Starts of the metrics process by the run's supervisor since the job's launch."),
)


class LogFollower:
    """The last progress line of a log, read from where the last call left it."""

    def __init__(self):
        self.key, self.offset, self.reader = None, 0, None
        self.step = self.figure = self.loss = self.at = None

    def follow(self, path, launch):
        try:
            st = os.stat(path)
        except OSError:
            return self
        key = (path, st.st_ino, launch.get("step_regex"), tuple(launch.get("throughput_patterns") or ()))
        if key != self.key or st.st_size < self.offset:
            self.__init__()
            self.key, self.offset = key, max(0, st.st_size - TAIL_BYTES)
            self.reader = progress.LogReader(launch.get("step_regex") or progress.STEP_REGEX,
                                             launch.get("throughput_patterns") or progress.THROUGHPUT_PATTERNS)
        if st.st_size - self.offset > TAIL_BYTES:  # more than a scrape's worth: the end is what counts
            self.offset = st.st_size - TAIL_BYTES
        if st.st_size == self.offset:
            return self
        try:
            with open(path, "rb") as handle:
                handle.seek(self.offset)
                data = handle.read(st.st_size - self.offset)
        except OSError:
            return self
        whole = data[:data.rfind(b"\n") + 1]  # a line still being written is read once it ends
        self.offset += len(whole)
        for line in whole.decode("utf-8", "replace").splitlines():
            point = self.reader.progress(line)
            if point is not None:
                loss = LOSS.search(line)
                self.step, self.figure, self.at = point[0], point[1], st.st_mtime
                self.loss = float(loss.group(1)) if loss else None
        return self


class Collector:
    """The samples of one CT's run, from its lifecycle directory."""

    def __init__(self, directory):
        self.directory = directory
        self.log = LogFollower()
        self.checkpoints = (None, 0.0, None, False, {})  # (key, when listed, directory mtime, a save under way, facts)
        self.trainer = (None, {})  # ((pid, starttime), {launcher, started})
        self.tokens = history.read_tokens(directory)  # (tokens, when last added to)

    def _checkpoint_facts(self, launch, now):
        """The newest complete checkpoint's step and age, and the interval. Listed again when the
        directory changed (a save's new entry, its rename into place), while the last listing saw a
        save under way (its files land inside its entry), and every CHECKPOINT_TTL_S: the steps
        since the checkpoint are the log's of now less the checkpoint's, and a listing kept after a
        save landed would count the steps it saved as exposed (a whole TTL of them)."""
        key = (launch.get("checkpoint_dir"), launch.get("checkpoint_format"),
               json.dumps(launch.get("checkpoint_custom"), sort_keys=True))
        changed = checkpoint_files.mtime_ns(key[0]) if key[0] else None
        cached_key, listed_at, cached_changed, saving, facts = self.checkpoints
        if key == cached_key and changed == cached_changed and not saving and now - listed_at < CHECKPOINT_TTL_S:
            return facts
        facts, saving = {}, False
        if key[0]:
            try:
                directory = checkpoints.Directory(key[0], key[1] or "auto", launch.get("checkpoint_custom"))
                infos = directory.entries()
                done = directory.complete(infos)
                chosen, _reason = directory.resolve()
                facts["layout"] = chosen.name if chosen else None
                if done:
                    facts.update(step=done[-1][1]["step"], mtime=done[-1][1]["mtime"])
                if len(done) > 1 and None not in (done[-1][1]["step"], done[-2][1]["step"]):
                    facts["interval"] = done[-1][1]["step"] - done[-2][1]["step"]
                # an incomplete entry changed lately is a save being written; an old one, a crash's leftover
                saving = any(not info["complete"] and now - info["mtime"] < CHECKPOINT_TTL_S for info in infos.values())
            except Exception:  # an unreadable directory, a layout that no longer fits: no figure, no crash
                facts = {}
        self.checkpoints = (key, now, changed, saving, facts)
        return facts

    def _trainer_facts(self, entry):
        identity = (entry.pid, entry.starttime) if entry is not None else None
        if identity is None or not proctable.alive(identity):
            return None
        if self.trainer[0] != identity:
            launcher = launchers.recognise(proctable.read_argv(entry.pid))
            proc = proctable.read_process(entry.pid)
            self.trainer = (identity, {"launcher": launcher.name if launcher else "python",
                                       "started": proctable.start_wall_time(proc) if proc else None})
        return self.trainer[1]

    def samples(self, now=None):
        """[(name, labels, value)] of the run now; a figure not known is left out."""
        now = time.time() if now is None else now
        spec = run_spec.read(self.directory) or {}
        launch = spec.get("launch") or {}
        out = []

        def add(name, value, **labels):
            if value is not None:
                out.append((name, labels, float(value)))

        trainer = self._trainer_facts(supervision.read_pidfile(launch["pidfile"]) if launch.get("pidfile") else None)
        found = self._checkpoint_facts(launch, now)
        state = policy.read_state(self.directory) or {}
        if spec:
            add("dflash_run_info", 1, release=str(spec.get("release") or ""), layout=str(found.get("layout") or ""),
                launcher=(trainer or {}).get("launcher") or "")
            add("dflash_run_up", trainer is not None)
            # a run a failed job left down is not one someone wanted stopped (run_spec.left_down)
            add("dflash_run_wanted_running", spec.get("wanted") == "running" or bool(spec.get("left_down")))
            add("dflash_run_supervised", policy.policy_of(launch) is not None)
        add("dflash_run_start_time_seconds", (trainer or {}).get("started"))
        if launch.get("log_file"):
            log = self.log.follow(launch["log_file"], launch)
            add("dflash_run_step", log.step)
            add("dflash_run_tokens_per_second", log.figure)
            add("dflash_run_loss", log.loss)
            add("dflash_run_last_progress_timestamp_seconds", log.at)
            if log.step is not None and found.get("step") is not None:
                add("dflash_run_steps_since_checkpoint", max(0, log.step - found["step"]))
            add("dflash_run_tokens_total", self._tokens(now, log if trainer is not None else None,
                                                        state.get("learned") or {}))
        add("dflash_checkpoint_newest_step", found.get("step"))
        add("dflash_checkpoint_newest_timestamp_seconds", found.get("mtime"))
        add("dflash_checkpoint_interval_steps", found.get("interval"))
        self._supervisor(add, launch, state)
        record = history.read(self.directory)
        stop = record.get("stop") or {}
        add("dflash_last_stop_timestamp_seconds", stop.get("at"))
        add("dflash_last_stop_duration_seconds", stop.get("duration_s"))
        add("dflash_last_stop_stage", stop.get("stage"))
        add("dflash_last_stop_steps_lost", stop.get("steps_lost"))
        add("dflash_last_stop_failed", stop.get("failed") if stop else None)
        redeploys = record.get("redeploys") or {}
        add("dflash_redeploys_total", int(redeploys.get("count") or 0))
        add("dflash_redeploy_timestamp_seconds", redeploys.get("at"))
        add("dflash_redeploy_gpu_idle_seconds", redeploys.get("gpu_idle_s"))
        launched = (rundir.read_launch_record(launch["pidfile"]) or {}) if launch.get("pidfile") else {}
        add("dflash_redeploy_tokens_per_second", launched.get("tokens_per_s"))
        given = launch.get("metrics") or {}
        uuids = launched.get("gpu_uuids") or {}
        for role, gpus in sorted((given.get("gpu_roles") or {}).items()):
            for gpu in gpus:
                add("dflash_run_gpu_info", 1, gpu=str(gpu), uuid=str(uuids.get(str(gpu)) or ""), role=str(role))
        totals = record.get("totals") or {}
        for cause in history.CAUSES:
            add("dflash_steps_lost_total", float((totals.get("steps_lost") or {}).get(cause) or 0), cause=cause)
            add("dflash_gpu_idle_seconds_total", float((totals.get("gpu_idle_s") or {}).get(cause) or 0), cause=cause)
        add("dflash_checkpoint_exposed_steps_limit", given.get("exposed_steps_limit"))
        threshold = given.get("canary_threshold_pct")
        add("dflash_canary_threshold_ratio", None if threshold is None else float(threshold) / 100.0)
        booted = ct_start_time()
        add("dflash_pve_hook_present", hook_present(history.hook_marker(self.directory), record.get("post_start_at"), booted))
        add("dflash_ct_start_time_seconds", booted)
        return out

    def _supervisor(self, add, launch, state):
        pid, start = state.get("supervisor"), state.get("supervisor_start")
        alive = bool(pid) and start is not None and proctable.alive((pid, start))
        add("dflash_supervisor_up", alive)
        if not state:
            return
        named = state_name(state.get("state") or "", alive)
        for name in STATES:
            add("dflash_supervisor_state", name == named, state=name)
        restarts = state.get("restarts_by_cause") or {}
        for cause in CAUSES:
            add("dflash_supervisor_restarts_total", int(restarts.get(cause) or 0), cause=cause)
        ends = state.get("ends_by_kind") or {}
        for kind in CAUSES:
            add("dflash_supervisor_ends_total", int(ends.get(kind) or 0), kind=kind)
        add("dflash_metrics_restarts_total", int(state.get("metrics_restarts") or 0))
        learned, rules = state.get("learned") or {}, policy.policy_of(launch)
        # what the supervisor takes for a hang now: before its first beats, the run's start-up bound
        add("dflash_supervisor_hang_timeout_seconds", learned.get("timeout_s") or (
            policy.hang_timeout(rules, learned.get("gaps"), float(launch.get("health_timeout") or 300)) if rules else None))

    def _tokens(self, now, log, learned):
        """The run's tokens so far, with its throughput since the last scrape added while it logs
        progress (log: None while no trainer runs; learned: the supervisor's learned gaps, whose
        hang bound says how old a figure may be); kept in the lifecycle directory."""
        tokens, at = self.tokens
        fresh = learned.get("timeout_s") or TOKENS_FRESH_S
        if log is not None and log.figure is not None and log.at is not None and now - log.at < fresh and at:
            tokens += log.figure * min(max(0.0, now - at), TOKENS_STEP_MAX_S)
            history.write_tokens(self.directory, tokens, now)
        self.tokens = (tokens, now)
        return tokens

    def render(self, now=None):
        return render(self.samples(now))


def state_name(words, alive):
    """The state-set name of the supervisor's state in words (agent/supervision.py's)."""
    words = words.lower()
    name = next((name for name in STATES if words.startswith(name.replace("_", " "))), None)
    return "gone" if name in ACTIVE and not alive else name


def hook_present(marker, post_start_at, booted):
    """Whether the Proxmox hook guards the CT: set by `make pve-hooks` (and not taken off), and, when
    the CT started after that, its post-start ran at that start. The marker's time is when it was
    written (history.hook_marker's written_at: the node's clock, as booted is)."""
    if not marker or not marker.get("installed"):
        return False
    if booted is None:
        return True
    return max(float(marker.get("written_at") or 0), float(post_start_at or 0)) >= booted - 1


def ct_start_time():
    proc = proctable.read_process(1)
    return proctable.start_wall_time(proc) if proc else None


def label_value(value):
    """value as a label's value is quoted in Prometheus's text format, and in a PromQL string literal."""
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render(samples):
    """Prometheus's text format (0.0.4) of samples, with HELP and TYPE of each metric served."""
    by_name = {}
    for name, labels, value in samples:
        by_name.setdefault(name, []).append((labels, value))
    lines = []
    for name, kind, text in METRICS:
        if name not in by_name:
            continue
        lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
        for labels, value in by_name[name]:
            label_text = ",".join(f'{key}="{label_value(val)}"' for key, val in sorted(labels.items()))
            lines.append(f"{name}{{{label_text}}} {value!r}" if label_text else f"{name} {value!r}")
    return "\n".join(lines) + "\n"


# -- the server -----------------------------------------------------------------------------------

def serve(directory):
    """The exporter's loop (``agent.zip metrics``): bind the spec's address, keep the pidfile, serve
    until a signal ends it. Returns the exit status (1: nothing to serve, or the address is taken)."""
    listen = metrics_process.listen_of(run_spec.read(directory))
    if not listen:
        sys.stderr.write("metrics: the run's spec names no metrics.listen: nothing to serve\n")
        return 1
    host, port = split_listen(listen)
    collector = Collector(directory)
    collector.render()  # every import a scrape needs, done now: agent.zip may be replaced later

    def respond(method, path):
        if method != "GET":
            return 405, b"dflash-lifecycle: GET /metrics\n", "text/plain"
        if path.split("?")[0] != "/metrics":
            return 404, b"dflash-lifecycle: the run's metrics are at /metrics\n", "text/plain"
        return 200, collector.render().encode(), "text/plain; version=0.0.4; charset=utf-8"

    try:
        listener = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
    except OSError as err:
        sys.stderr.write(f"metrics: cannot listen on {listen}: {err}\n")
        return 1
    me = proctable.read_process(os.getpid())
    rundir.write_atomic(os.path.join(directory, metrics_process.PIDFILE),
                        f"{os.getpid()} {me.starttime} {listen} {metrics_process.agent_stamp(directory)}\n", 0o644)
    signal.signal(signal.SIGTERM, _ended)
    scrape_server.ScrapeServer(listener, respond).serve_forever()
    return 0


def _ended(*_args):
    raise SystemExit(0)  # an ordinary exit on SIGTERM: the listening socket closed
