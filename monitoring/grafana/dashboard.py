#!/usr/bin/env python3
"""The Grafana dashboard of the DFlash training runs, built with Grafana's own grafana-foundation-sdk
(docs/monitoring.md). `make dashboard` writes dflash-runs.json beside this file; the tests build it
again and compare, so the JSON is never edited by hand, and evaluate every query in it on a real
Prometheus that scrapes the testbed's CTs (tests/integration/test_monitoring.py).

    python monitoring/grafana/dashboard.py [--check]
"""

from __future__ import annotations

import json
import os
import sys

from grafana_foundation_sdk.builders import dashboard, prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DashboardCursorSync, DataSourceRef

OUTPUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dflash-runs.json")
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
# the CTs the dashboard shows: the node and gang variables narrow the CT variable's choices, and every
# query takes all three (multi-value, All by default; a CT of no gang has no gang label, which All's
# ".*" matches)
CTS = 'ct=~"$ct",node=~"$node",gang=~"$gang"'


def by_run(expr):
    """expr of the shown CTs' series (expr: a function of a selector's labels) with each series named
    by its run: a gang's CTs by their gang, a CT that runs alone by its name (as its gang label)."""
    alone, ganged = f'{{{CTS},gang=""}}', f'{{{CTS},gang!=""}}'
    return f'label_replace({expr(alone)}, "gang", "$1", "ct", "(.+)") or {expr(ganged)}'


def choice(name, label, values):
    """A variable of the shown CTs' labels: several values, All (any, a missing label too) by default."""
    return (dashboard.QueryVariable(name).label(label).datasource(DATASOURCE).query(values).multi(True)
            .include_all(True).all_value(".*"))


def query(expr, legend="{{ct}}", ref="A"):
    return prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(DATASOURCE)


def series(title, unit, *queries, description=None, width=12):
    panel = timeseries.Panel().title(title).unit(unit).datasource(DATASOURCE).height(8).span(width)
    for target in queries:
        panel = panel.with_target(target)
    return panel.description(description) if description else panel


def figure(title, unit, expr, description, width=6):
    return (stat.Panel().title(title).unit(unit).datasource(DATASOURCE).height(5).span(width)
            .with_target(query(expr)).description(description))


def panels():
    return [
        figure("Runs up", "none", f"sum(dflash_run_up{{{CTS}}})",
               "CTs whose trainer runs now."),
        figure("Down and wanted", "none",
               f"count((dflash_run_up{{{CTS}}} == 0) and (dflash_run_wanted_running{{{CTS}}} == 1)) or vector(0)",
               "CTs whose run is down though no one stopped it: the DflashRunDown alert after 10 minutes."),
        figure("Steps lost in the time range", "none", f"sum(increase(dflash_steps_lost_total{{{CTS}}}[$__range]))",
               "Steps logged and in no checkpoint that stops and crashes lost within the dashboard's time range."),
        figure("GPU idle in the time range", "s", f"sum(increase(dflash_gpu_idle_seconds_total{{{CTS}}}[$__range]))",
               "Seconds from a run going down to its next run's first progress line, over the CTs, within the time range."),
        series("Tokens per second, by run", "none",
               query(f"max by (gang) ({by_run(lambda sel: 'dflash_run_tokens_per_second' + sel)})", "{{gang}}"),
               description="The last progress line's throughput of each run: a gang's, or a CT's that runs alone."),
        series("Tokens per second, by CT", "none", query(f"dflash_run_tokens_per_second{{{CTS}}}"),
               query(f"dflash_redeploy_tokens_per_second{{{CTS}}}", "{{ct}} at its last redeploy", "B"),
               description="Each CT's throughput, and the figure its last redeploy measured (the canary's after)."),
        series("Tokens trained per second, over Prometheus's window", "none",
               query(f"sum by (gang) ({by_run(lambda sel: f'rate(dflash_run_tokens_total{sel}[$__rate_interval])')})",
                     "{{gang}}"),
               description="The rate of each run's tokens counter: its throughput over the rate's window, not the "
                           "trainer's own."),
        series("Steps lost and GPU idle, by cause", "none",
               query(f"sum by (cause) (increase(dflash_steps_lost_total{{{CTS}}}[$__rate_interval]))",
                     "steps lost: {{cause}}"),
               query(f"sum by (cause) (increase(dflash_gpu_idle_seconds_total{{{CTS}}}[$__rate_interval]))",
                     "GPU idle s: {{cause}}", "B"),
               description="What stops, crashes, hangs, redeploys and Proxmox stops cost: the steps logged and in no "
                           "checkpoint, and the seconds until the next run's first progress line."),
        series("Steps per second", "none", query(f"deriv(dflash_run_step{{{CTS}}}[$__rate_interval]) > 0"),
               description="The step's rate of change: a run that resumes from a checkpoint goes back, and shows none."),
        series("Loss", "none", query(f"dflash_run_loss{{{CTS}}}"),
               description="The loss of the last progress line, where the trainer's log has one."),
        series("Steps exposed since the newest checkpoint", "none",
               query(f"dflash_run_steps_since_checkpoint{{{CTS}}}"),
               query(f"dflash_checkpoint_exposed_steps_limit{{{CTS}}}", "{{ct}} limit", "B"),
               query(f"dflash_checkpoint_interval_steps{{{CTS}}}", "{{ct}} between the newest checkpoints", "C"),
               description="What a crash now would lose; the DflashCheckpointExposed alert past the limit."),
        series("Seconds since the last progress line", "s",
               query(f"time() - dflash_run_last_progress_timestamp_seconds{{{CTS}}}"),
               query(f"dflash_supervisor_hang_timeout_seconds{{{CTS}}}", "{{ct}} hang timeout", "B"),
               description="The run's silence, against the silence its supervisor takes for a hang."),
        series("Supervisor restarts and ends", "none",
               query(f"sum by (ct, cause) (increase(dflash_supervisor_restarts_total{{{CTS}}}[$__rate_interval])) > 0",
                     "{{ct}} restart after a {{cause}}"),
               query(f"sum by (ct, kind) (increase(dflash_supervisor_ends_total{{{CTS}}}[$__rate_interval])) > 0",
                     "{{ct}} end: {{kind}}", "B"),
               description="Relaunches by the supervisor by the end they followed, and the ends it saw."),
        series("Supervisor state", "none", query(f"dflash_supervisor_state{{{CTS}}} == 1", "{{ct}} {{state}}"),
               description="watching, backing_off, relaunching, stopping, hung, down (it gave up), stood_down, "
                           "finished, gone (it died while it had a run to watch)."),
        (table.Panel().title("Runs").datasource(DATASOURCE).height(8).span(24)
         .with_target(query(f"dflash_run_info{{{CTS}}}").format("table").instant())
         .description("Each CT's release, checkpoint layout and launcher.")),
    ]


def build():
    board = (dashboard.Dashboard("DFlash training runs").uid("dflash-runs").tags(["dflash", "training"])
             .description("The DFlash training runs in Proxmox CTs, from the metrics each CT's agent serves "
                          "(dflash-lifecycle, docs/monitoring.md).")
             .refresh("30s").time("now-6h", "now").tooltip(DashboardCursorSync.CROSSHAIR)
             .with_variable(dashboard.DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
             .with_variable(choice("node", "Node", "label_values(dflash_run_up, node)"))
             .with_variable(choice("gang", "Gang", 'label_values(dflash_run_up{node=~"$node"}, gang)'))
             .with_variable(choice("ct", "CT", 'label_values(dflash_run_up{node=~"$node",gang=~"$gang"}, ct)'))
             .annotation(dashboard.AnnotationQuery().name("Stops").datasource(DATASOURCE).enable(True)
                         .icon_color("orange").expr(f"changes(dflash_last_stop_timestamp_seconds{{{CTS}}}[2m]) > 0"))
             .annotation(dashboard.AnnotationQuery().name("Redeploys").datasource(DATASOURCE).enable(True)
                         .icon_color("blue").expr(f"changes(dflash_redeploys_total{{{CTS}}}[2m]) > 0"))
             .annotation(dashboard.AnnotationQuery().name("Supervisor ends").datasource(DATASOURCE).enable(True)
                         .icon_color("red").expr(f"sum by (ct) (changes(dflash_supervisor_ends_total{{{CTS}}}[2m])) > 0")))
    for panel in panels():
        board = board.with_panel(panel)
    return board.build()


def render():
    return json.dumps(build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def main(argv):
    text = render()
    if argv[1:] == ["--check"]:
        with open(OUTPUT, encoding="utf-8") as handle:
            if handle.read() != text:
                sys.stderr.write(f"{OUTPUT} is not what {__file__} builds: make dashboard\n")
                return 1
        return 0
    with open(OUTPUT, "w", encoding="utf-8") as handle:
        handle.write(text)
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
