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
# the CTs the dashboard shows (a multi-value variable, All by default)
CTS = 'ct=~"$ct"'
# a run is a gang, or a CT that runs alone: named by its gang, else by its CT
RUN = (f'label_replace({{metric}}{{{{{CTS},gang=""}}}}, "gang", "$1", "ct", "(.+)") '
       f'or {{metric}}{{{{{CTS},gang!=""}}}}')


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
        figure("Steps lost at the last stops", "none", f"sum(dflash_last_stop_steps_lost{{{CTS}}})",
               "The steps the last stop of each CT lost: logged, and in no checkpoint."),
        figure("GPU idle of the last redeploys", "s", f"max(dflash_redeploy_gpu_idle_seconds{{{CTS}}})",
               "The longest GPU idle of the CTs' last redeploys: from the stop's start to the new run's first progress line."),
        series("Tokens per second, by run", "none",
               query("max by (gang) ({})".format(RUN.format(metric="dflash_run_tokens_per_second")), "{{gang}}"),
               description="The last progress line's throughput of each run: a gang's, or a CT's that runs alone."),
        series("Tokens per second, by CT", "none", query(f"dflash_run_tokens_per_second{{{CTS}}}"),
               query(f"dflash_redeploy_tokens_per_second{{{CTS}}}", "{{ct}} at its last redeploy", "B"),
               description="Each CT's throughput, and the figure its last redeploy measured (the canary's after)."),
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
             .with_variable(dashboard.QueryVariable("ct").label("CT").datasource(DATASOURCE)
                            .query("label_values(dflash_run_up, ct)").multi(True).include_all(True)
                            .all_value(".*"))
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
