#!/usr/bin/python
# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: trainer_process
short_description: Start the trainer in its own session and wait until it is healthy
version_added: 0.1.0
author: DFlash lifecycle maintainers (@dflash-lifecycle)
description:
  - Runs inside the CT. Refuses to start when a trainer already runs (O(pidfile) alive, or a
    process matching O(pattern)) or when O(checkpoint_dir) has less than O(min_free_gb) free.
    Then it waits, at most O(gpu_free_timeout) seconds, until the GPUs the run needs (O(gpus))
    are free - their memory, by nvidia-smi, below O(gpu_free_threshold_mib) and no process of
    the CT holding one of O(device_paths) - and fails naming each GPU, its used memory and its
    holders when they are not.
  - Starts O(command) with setsid, SIGINT/SIGTERM/SIGHUP/SIGQUIT at their default dispositions
    and an empty signal mask (so the staged stop's SIGINT reaches the trainer's KeyboardInterrupt
    handler), stdin from /dev/null, stdout and stderr appended to O(log_file) after rotating the
    old ones, and a new run identity C(DFLASH_RUN_ID) in its environment, which every process of
    the run inherits (M(dflash.lifecycle.staged_stop) stops exactly those). The command is
    expected to exec the trainer, so the pidfile (C(PID STARTTIME RUN_ID), written with
    O_NOFOLLOW in a root-only directory) names the Python process itself.
  - Before the refusal checks it prepares the run in the same call (one round trip for the whole
    launch) - O(run_dir) must be a real directory owned by root and not writable by group or
    others (created C(0700) when missing; a symlink, even one planted to a world-writable place,
    is refused and nothing is written); O(wrapper_script) and O(secrets_env) are written there as
    C(trainer.sh) (C(0700)) and C(secrets.env) (C(0600)) through files opened with O_NOFOLLOW and
    renamed into place; O(create_dirs) are created C(0755).
  - With O(stop_first), it first stops the running trainer in stages, exactly as
    M(dflash.lifecycle.staged_stop) with those options does, and starts the new one only when
    that stop succeeded - the stop and the launch in one call inside the CT, with no controller
    round trip between the old run's end and the new one's start. C(redeploy.yml) does this for a
    CT that runs alone.
  - Outside check mode, everything from O(stop_first)'s first signal to the new run's health runs
    as one transaction in a detached worker in the CT (own session, stdio on /dev/null) - a
    controller that is killed, cancelled or loses its connection at any moment leaves the worker
    to finish. While it works, a keeper process renews the job's lock (the C(lock_*) options) every
    third of O(lock_ttl). It records the change, its phases and its outcome in O(change_record);
    when nobody can read its result any more (the module process on the controller's connection is
    gone, or its standard output has no reader), it marks the record's C(controller) V(gone) and gives
    the lock back.
  - With O(stage_models), after the stop and before the start, it stages each model that is
    missing from shared memory or differs from its persistent copy, exactly as
    M(dflash.lifecycle.model_stage) does.
  - With O(rollback_on_failure), a launch that fails is rolled back in the same worker - the failed
    trainer stopped (SIGTERM, then SIGKILL, to its tree) if it still runs, C(current) and
    C(previous) set back to what they were, and the release of before relaunched, resuming from
    the newest checkpoint; RV(rollback) says what it did. The task still fails, with the launch's
    error.
  - With O(activate), once the refusal checks passed it points the release directory's
    C(current) at the given release, in the same call (see M(dflash.lifecycle.trainer_release)
    V(activate)); C(redeploy.yml) activates the pushed release this way, saving a round trip.
  - Healthy means a progress line - a step number (O(step_regex)) and a throughput figure
    (O(throughput_patterns)) - and, for a launcher's agent, every rank its command line asks for
    running, and the process still alive O(health_seconds) after it, with no
    Python traceback in its log. A trainer that dies, or prints a traceback while it tears down,
    fails the task with the traceback or the tail of its log. The failed attempt's log is set
    aside as C(LOG.failed) and the older logs move back, so failed attempts never rotate the
    last good run's log away.
options:
  command:
    description: The argv to run, typically C([/bin/sh, <wrapper script>]).
    type: list
    elements: str
    required: true
  cwd:
    description: Working directory.
    type: path
    default: /
  pidfile:
    description: Where to write C(PID STARTTIME).
    type: path
    required: true
  pattern:
    description: Regex on the full command line of an already running trainer.
    type: str
  stop_first:
    description:
      - The options of M(dflash.lifecycle.staged_stop), validated as that module validates them,
        without its C(lock_*) options (this module's own lock covers the stop too). When set, the stop runs
        first and the launch only when it succeeded; a failed stop fails the task with RV(stop)
        and starts nothing. Ignored in check mode, where the launch reports what it would do.
    type: dict
  refuse_busy:
    description:
      - Refuse when a trainer runs or a GPU is held. A check run of a redeploy turns this off, as
        its stop phase would have stopped the trainer first.
    type: bool
    default: true
  device_paths:
    description: Device files of the GPUs the run uses; a process of the CT holding one means the GPUs are busy.
    type: list
    elements: str
    default: []
  gpus:
    description:
      - Indexes of the GPUs the run uses, as nvidia-smi numbers them (CUDA's too with
        C(CUDA_DEVICE_ORDER=PCI_BUS_ID)). Before the start the launch waits, at most
        O(gpu_free_timeout) seconds, until each uses at most O(gpu_free_threshold_mib) MiB, since
        the driver frees a stopped run's memory some time after its processes are gone and a run
        started before that dies with CUDA out-of-memory. A process of the CT holding one of
        O(device_paths) is refused at once, without a wait. Empty skips the memory check (the
        device files are still checked).
    type: list
    elements: int
    default: []
  nvidia_smi:
    description: The nvidia-smi command, by absolute path (the NVIDIA driver installs it in C(/usr/bin)).
    type: path
    default: /usr/bin/nvidia-smi
  gpu_free_threshold_mib:
    description: Used memory, in MiB, under which a GPU counts as free (an idle GPU shows a few MiB).
    type: int
    default: 1024
  gpu_free_timeout:
    description:
      - Seconds the launch waits for the GPUs to be free; then it fails naming each GPU, its used
        memory and its holders, and starts nothing. A check run looks once and does not wait.
    type: float
    default: 60
  run_dir:
    description: Root-only directory of O(wrapper_script), O(secrets_env) and usually O(pidfile).
    type: path
  wrapper_script:
    description: Content of C(trainer.sh) in O(run_dir); unchanged content is not rewritten.
    type: str
  secrets_env:
    description:
      - Content of C(secrets.env) in O(run_dir) (C(NAME=value) lines the wrapper sources). Kept out
        of the task's output and logs (no_log).
    type: str
  create_dirs:
    description: Directories the run writes to (log, checkpoints), created when missing.
    type: list
    elements: path
    default: []
  release_base:
    description:
      - >-
        The release directory, to name the release C(current) points to in the line the launch
        writes at the head of the run's log (C(dflash-lifecycle: launch of release <id> (run
        <run id>))); with O(activate), its release is named. The throughput chart reads it.
    type: path
  stage_models:
    description:
      - Models to stage into shared memory between the stop and the start, as
        M(dflash.lifecycle.model_stage) does with the same options; only those missing or
        different are copied. A staging that fails starts nothing (and, with O(rollback_on_failure),
        the release of before is relaunched).
    type: dict
    suboptions: &stage_models
      models:
        description: Each target path in shared memory, mapped to its persistent copy.
        type: dict
        required: true
      reserve_gb:
        description: Memory (GB) kept free beside the model in the CT's memory cgroup.
        type: float
        default: 32
      workers:
        description: Files copied at once.
        type: int
        default: 4
      progress_file:
        description: Where the copy's progress goes (default C(stage.progress.json) in O(run_dir)).
        type: path
  rollback_on_failure:
    description:
      - Roll a failed launch back in the same detached worker, whatever happens to the controller
        (the description above); C(redeploy.yml) sets it for a CT that runs alone.
      - The relaunch is the run as it was - the release of before and the settings of the run's last healthy
        launch, which the CT keeps (C(run.json)), read before this launch - never this call's options, which
        may be what failed; the result's C(rollback.relaunch.settings) names them and the options this call
        changed.
    type: bool
    default: false
  settings_from:
    description:
      - Whose settings this launch runs on. V(job) - the options given. V(last_launch) - those of the run's
        last healthy launch that the CT keeps (C(run.json)), as a relaunch of it (its wrapper, its command,
        its environment; this call's lifecycle and gang health places), resuming from the newest checkpoint.
        V(launch_before_last) - those of the launch before that one (after a healthy launch the job rejects,
        the canary or a gang failing elsewhere). C(redeploy.yml)'s rescue from the controller uses them.
      - Where the CT keeps no such launch, the options given; the result's C(settings) says which it was.
    type: str
    choices: [job, last_launch, launch_before_last]
    default: job
  rollback_launch:
    description:
      - What the relaunch of O(rollback_on_failure) changes - a gang's CTs meet in a rendezvous of
        their own there, so its wrapper (the next launch attempt's) and the files of its health.
    type: dict
    suboptions:
      wrapper_script:
        description: The wrapper the relaunch writes in place of O(wrapper_script).
        type: str
        required: true
      gang_health_dir:
        description: The relaunch's O(gang_health) directory.
        type: path
  gang_stop:
    description:
      - A CT of a gang - after O(stop_first), the gang's CTs judge their stop together, through
        small files in this directory of the checkpoint directory they share
        (C(module_utils/gang_agreement.py)), before any launches - every member stopped, and
        the gang's checkpoint complete as every member sees it once all have stopped. A stop phase
        that fails starts nothing new - with every CT's run gone and one complete checkpoint every CT
        sees, the release of before is relaunched from it (O(rollback_launch)); otherwise the gang is
        down, and RV(rollback) says why.
    type: dict
    suboptions:
      name:
        description: The gang's name, for the messages.
        type: str
        required: true
      dir:
        description: The directory of this job's agreement, in the shared checkpoint directory.
        type: path
        required: true
      me:
        description: This CT's name among O(gang_stop.members).
        type: str
        required: true
      members:
        description: Every CT of the gang.
        type: list
        elements: str
        required: true
      wait:
        description: How long a member waits for another's word, seconds (the longest stop and a margin).
        type: float
        default: 960
      on_missing_checkpoint:
        description: V(fail) - no new sound checkpoint where a signal could save fails the stop phase; V(proceed) accepts the loss.
        type: str
        default: fail
  change_record:
    description:
      - The CT's record of this change (holder, start, phase, outcome, whether the controller saw
        the end), on the CT's disk so that it outlives C(/run).
    type: path
    default: /var/lib/dflash/last-change.json
  lifecycle:
    description:
      - What the CT's Proxmox hook needs to stop this run and bring it back with no controller
        (the C(pre-stop) and C(post-start) phases of the project's hookscript). After a healthy
        start the launch keeps, in O(lifecycle.dir) on the CT's disk, the run's spec (these
        options, the stop's and the models to stage; mode 0600, it holds the run's secrets), the
        code of this collection that launched it, and the C(hook) command the node's hookscript
        runs in the CT. Unset, nothing is kept and the hook does nothing in this CT.
    type: dict
    suboptions:
      dir:
        description: The CT's lifecycle directory, root-only, on its disk (it must outlive C(/run)).
        type: path
      stop:
        description: M(dflash.lifecycle.staged_stop)'s options for the hook's stop before Proxmox stops the CT.
        type: dict
        default: {}
      stage_models:
        description: The models to stage into shared memory before the hook's relaunch, as O(stage_models).
        type: dict
        suboptions: *stage_models
      lock_path:
        description: The CT's redeploy lock, which the hook holds while it stops or relaunches the run.
        type: path
      gang_base:
        description:
          - Set by a relaunch without a job (the hook's, the supervisor's) - the gang's place of the job that
            launched the run, under which its members meet after a CT restart. A job's launch leaves it unset.
        type: path
      rounds_dir:
        description:
          - Set by a relaunch without a job - where the supervisor counts the run's ends (O(supervise)). A job's
            launch leaves it unset and the count begins afresh.
        type: path
      round:
        description: Set by the supervisor's relaunch - the run's generation since the job's launch.
        type: int
  supervise:
    description:
      - The run's supervisor, with O(lifecycle.dir) set. Once the launch is healthy and its result delivered,
        the detached worker that started the trainer becomes its supervisor (an exec of the agent kept in
        O(lifecycle.dir) - the trainer stays its child, so its exit status reaches it). It needs no change to
        the trainer and outlives the controller.
      - A B(crash) (the trainer's main process ends with a non-zero status or by a signal, with no stop asked for)
        is recorded - the status or signal, the traceback from its log, the newest complete checkpoint - and
        the run relaunched after a back-off, exactly as the launch's own relaunch does (the model restaged,
        the GPUs waited for, resuming from the newest checkpoint).
      - A B(hang) (no progress line, and no beat of the stop request's helper, for longer than the timeout
        learned from the run's own intervals; never while a save is being written) has its diagnostics kept
        first, then the run is stopped by the staged stop of O(lifecycle.stop) and relaunched.
      - A stop someone asks for (M(dflash.lifecycle.staged_stop) with its C(lifecycle_dir), the Proxmox hook)
        is never taken for a crash. A gang is supervised as one. Unset, no supervisor runs.
      - docs/supervise.md has the whole contract.
    type: dict
    suboptions:
      restart:
        description: V(on-failure) restarts a crashed or hung run; V(never) records it and leaves it down.
        type: str
        choices: [never, on-failure]
        default: on-failure
      backoff_s:
        description: The wait before the first restart within the crash-loop window; it doubles with each one.
        type: float
        default: 10
      backoff_max_s:
        description: The longest wait between restarts.
        type: float
        default: 360
      crash_loop_restarts:
        description: After this many restarts within O(supervise.crash_loop_window_s), the next end leaves the run down.
        type: int
        default: 5
      crash_loop_window_s:
        description: The window of the crash-loop count, seconds.
        type: float
        default: 3600
      hang_floor_s:
        description: The shortest hang timeout, seconds.
        type: float
        default: 300
      hang_factor:
        description: The hang timeout is this many times the longest interval the run has shown between beats.
        type: float
        default: 5
      webhook:
        description: An http(s) URL that gets a C(POST) of a JSON event on a crash, a hang, a crash loop and a run left down.
        type: str
      webhook_timeout_s:
        description: The webhook's timeout; its POST runs in a process of its own and never holds a restart up.
        type: float
        default: 3
      webhook_ct:
        description: The CT's inventory name, the C(ct) of its events and of their C(X-Dflash-CT) header.
        type: str
      webhook_key:
        description:
          - The CT's own key (hex) for its events' C(X-Dflash-Signature) (HMAC-SHA256 of C(<timestamp>.<body>)),
            derived from the team's secret and O(supervise.webhook_ct) by the
            P(dflash.lifecycle.webhook_key#filter) filter; unset, the events are not signed.
        type: str
  metrics:
    description:
      - The run's metrics for Prometheus, with O(lifecycle.dir) set - served over HTTP at C(/metrics) on
        O(metrics.listen) by a process of the agent kept in O(lifecycle.dir) (C(agent.zip metrics)), which
        this launch and each post-start of the Proxmox hook start when none serves. It outlives the run's
        stops, so a run stopped on purpose reads as down and wanted stopped.
      - Only counts, figures and the release, layout and launcher's names are served, never a setting.
        Who the CT is comes from Prometheus's target labels (C(make metrics-targets)).
      - The run's supervisor starts the process again when it dies, and counts it.
      - docs/monitoring.md lists every metric, the scrape configuration and the alert rules.
    type: dict
    suboptions:
      listen:
        description: The address and port to serve on, V(HOST:PORT) (V([::]:9733) for IPv6).
        type: str
        required: true
      canary_threshold_pct:
        description:
          - The redeploy canary's threshold (C(redeploy_canary_threshold)), served as
            C(dflash_canary_threshold_ratio) for the throughput alert.
        type: float
      exposed_steps_limit:
        description:
          - The steps past the newest complete checkpoint that a crash may lose before it is alerted on,
            served as C(dflash_checkpoint_exposed_steps_limit).
        type: int
      gpu_roles:
        description:
          - The GPUs of each role of the run (V(target), V(drafter)) by their index, served with the UUIDs
            nvidia-smi gave the launch's wait for free GPUs as C(dflash_run_gpu_info), which joins the run
            with DCGM's metrics of those GPUs.
        type: dict
        default: {}
  activate:
    description:
      - Point C(current) at a release just before the start, after the refusal checks. Check mode
        only reports whether C(current) would move. A failed start leaves it switched; the result's
        RV(activated) says whether it moved, so the caller can switch back. A release that failed
        to start is recorded in C(<base>/launch-failures.json) (cleared by a healthy start of it),
        and M(dflash.lifecycle.trainer_release) never rolls back to it.
    type: dict
    suboptions:
      base:
        description: Release directory in the CT.
        type: path
        required: true
      release:
        description: Id of an installed release.
        type: str
        required: true
      legacy_links:
        description: Paths to turn into symlinks to a file of the current release (C(path), C(target)).
        type: list
        elements: dict
        default: []
  log_file:
    description: Log of the run.
    type: path
    required: true
  model_dirs:
    description:
      - Model directories the run reads, each with its C(config.json). Every launch refuses to start
        without them (unless O(stage_models) stages one first), the CT's own relaunches (the Proxmox hook's,
        the supervisor's) included, as the preflight does.
      - Every launch also refuses to start when root in the CT cannot write O(checkpoint_dir), the directory
        of O(log_file), O(run_dir), O(lifecycle.dir) or where O(stage_models) stages a model; the refusal
        names the directory, its owner as the CT sees it and the fix (an unprivileged CT's mount point from
        the node shows as C(nobody)).
    type: list
    elements: path
    default: []
  log_keep:
    description: Old logs kept (C(log.1) ... C(log.N)).
    type: int
    default: 5
  checkpoint_dir:
    description: Checkpoint directory; with O(min_free_gb), the free space there is checked before the start.
    type: path
  min_free_gb:
    description: Free space O(checkpoint_dir) needs, in GiB; 0 skips the check.
    type: float
    default: 0
  resume_auto:
    description:
      - Append O(resume_args) to O(command) when the trainer's own resume rule (its
        O(checkpoint_format)) picks a complete checkpoint in O(checkpoint_dir) at the moment of the
        start (the wrapper passes its arguments on to the trainer). Decided here, in the CT, so the
        checkpoint a stop just wrote counts, the first one of a young run included.
    type: bool
    default: false
  resumes:
    description:
      - The trainer resumes from O(checkpoint_dir) whatever O(resume_auto) says (its resume flag is
        in O(command) or the wrapper). Then, as with O(resume_auto), what its resume rule would
        load is checked first (O(incomplete_checkpoint)).
    type: bool
    default: false
  incomplete_checkpoint:
    description:
      - When the checkpoint the trainer's resume rule picks is incomplete (HF's picks the highest
        C(checkpoint-N) unchecked, and would load a half-written one, skipping its missing
        optimizer state in silence) - V(move_aside) moves it to
        C(<checkpoint_dir>/.incomplete/<name>-<UTC time>), never deleted, and looks again (the rule
        then picks the one before; RV(moved_aside) lists what moved); V(fail) refuses to start.
      - A pick named by the layout's pointer (DeepSpeed's C(latest), Lightning's C(last.ckpt)) is
        never moved, since the pointer would then name nothing - the launch refuses instead.
    type: str
    choices: [move_aside, fail]
    default: move_aside
  resume_args:
    description: The arguments that make the trainer resume from its latest checkpoint.
    type: list
    elements: str
    default: [--resume]
  gang:
    description:
      - The run is one CT's part of a gang - one torchrun job across CTs. Healthy means every rank
        its agent starts runs (they start once the rendezvous has every CT of the gang), and still
        runs O(health_seconds) later; the CT that holds global rank 0 (C(RANK=0) in a worker's
        environment), whose ranks log, must show a progress line as well, and its throughput
        window is read. The others report RV(logs_progress) false and no throughput.
    type: bool
    default: false
  gang_health:
    description:
      - For a CT of a gang - where its CTs tell each other how their launch goes, a directory they
        share (the checkpoint directory's C(.dflash-gang/<rendezvous id>)). This CT writes its
        state there (C(starting), C(healthy), or C(failed:) and why); while it waits for health it
        reads the others', and stops waiting within a second when one failed (its rendezvous
        would never complete), failing with that CT and its cause named (C(peer)).
    type: dict
    suboptions:
      dir:
        description: The shared directory.
        type: path
        required: true
      me:
        description: This CT's name in the gang.
        type: str
        required: true
      members:
        description: Every CT of the gang.
        type: list
        elements: str
        required: true
  health_seconds:
    description:
      - How long the trainer must stay alive after its first progress line to count as healthy (a
        crash in the step after it, or CUDA/NCCL tearing down after a traceback, shows here).
    type: float
    default: 5
  step_regex:
    description: Regex whose first group is the step number of a progress line.
    type: str
    default: \bstep[\s:=#]*(\d+)\b
    aliases: [health_regex]
  throughput_patterns:
    description:
      - Regexes of the throughput figure, tried in order; each has a group named C(value) and may
        have a group named C(unit) (V(K) or V(M)). The defaults read C(tok/s 14210.5),
        C(tokens/s=14.2K), C(17021.1 tok/s) and C(14.0K tok/s).
    type: list
    elements: str
    default:
      - \btok(?:en)?s?/s\s*[=:]?\s*(?P<value>\d+(?:\.\d+)?)\s*(?P<unit>[KkMm](?![A-Za-z]))?
      - (?P<value>\d+(?:\.\d+)?)\s*(?P<unit>[KkMm])?\s*tok(?:en)?s?/s\b
  profile_line_regex:
    description: Regex of the lines holding the trainer's per-stage telemetry (ProfileStats).
    type: str
    default: ProfileStats
  profile_stage_regex:
    description:
      - Regex of one stage in such a line; groups named C(stage), C(avg) and optionally C(max),
        in milliseconds. The default reads C(drafter avg 40.10ms max 45.20ms).
    type: str
    default: (?P<stage>[A-Za-z_][\w.-]*) avg (?P<avg>\d+(?:\.\d+)?)\s*ms max (?P<max>\d+(?:\.\d+)?)\s*ms
  throughput_lines:
    description:
      - Once healthy, wait until the run has logged this many progress lines after the first
        O(throughput_warmup_lines), and report their median throughput and per-stage timings
        (RV(throughput); the redeploy's canary compares it with the run it replaced). 0 reports none.
    type: int
    default: 5
  throughput_warmup_lines:
    description: Progress lines at the start of the run left out of RV(throughput) (warm-up).
    type: int
    default: 1
  throughput_timeout:
    description: Seconds the wait for those lines may take; what is there then is reported (C(complete=false)).
    type: float
    default: 300
  progress_file:
    description:
      - While it waits for health and throughput, the launch writes its progress here about once a
        second (its action plugin sets it in O(run_dir) and shows it on the controller once a wait
        passes 10 seconds).
    type: path
  health_timeout:
    description: Seconds to wait for health.
    type: float
    default: 300
extends_documentation_fragment:
  - dflash.lifecycle.checkpoint_format
  - dflash.lifecycle.redeploy_lease
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
attributes:
  action:
    support: none
  async:
    support: none
  bypass_host_loop:
    support: none
  check_mode:
    support: full
    details: >-
      Checks O(run_dir), runs the refusal checks and reports what it would write and start;
      writes and starts nothing.
  diff_mode:
    support: none
  platform:
    support: full
    platforms: posix
"""

EXAMPLES = r"""
- name: Start the trainer
  dflash.lifecycle.trainer_process:
    command: [/bin/sh, /run/dflash/trainer.sh]
    pidfile: /run/dflash/trainer.pid
    pattern: train_dflash_pipeline[.]py
    device_paths: [/dev/nvidia0, /dev/nvidia1]
    log_file: /workspace/logs/train.log

- name: Write the wrapper and the secrets, create the directories, then start
  dflash.lifecycle.trainer_process:
    run_dir: /run/dflash
    wrapper_script: "{{ lookup('ansible.builtin.template', 'trainer.sh.j2') }}"
    secrets_env: "HF_TOKEN={{ vault_hf_token | ansible.builtin.quote }}\n"
    create_dirs: [/workspace/logs, /workspace/checkpoints]
    command: [/bin/sh, /run/dflash/trainer.sh]
    pidfile: /run/dflash/trainer.pid
    log_file: /workspace/logs/train.log
- name: Point current at the pushed release and start it, in one round trip
  dflash.lifecycle.trainer_process:
    activate:
      base: /opt/dflash
      release: 3f2a9c0d1e2b4a5f
    command: [/bin/sh, /run/dflash/trainer.sh]
    pidfile: /run/dflash/trainer.pid
    log_file: /workspace/logs/train.log
"""

RETURN = r"""
stop:
  description: >-
    The result of the stop of O(stop_first), as M(dflash.lifecycle.staged_stop) returns it
    (C(failed) true when it did not end as asked; then nothing was started).
  returned: when O(stop_first) is set, outside check mode
  type: dict
staged:
  description: The staging of O(stage_models) - C(changed), C(models) (as M(dflash.lifecycle.model_stage) returns them) and C(msg).
  returned: when O(stage_models) is set, outside check mode
  type: dict
rollback:
  description: >-
    What O(rollback_on_failure) did after the failed launch: C(stop) (the failed trainer's stop, when it
    still ran), C(restored) (C(current), C(previous), C(changed)), C(relaunch) (the relaunch's result,
    as this module returns it) and C(msg); C(failed) and C(msg) when a step of it failed.
  returned: when the launch failed with O(rollback_on_failure)
  type: dict
activated:
  description: Whether O(activate) moved C(current) (C(changed)), and C(current) and C(previous) after it.
  returned: when O(activate) is set and the refusal checks passed
  type: dict
  sample: {changed: true, current: 3f2a9c0d1e2b4a5f, previous: 0388a82fa6a8d99c}
lock:
  description: >-
    The redeploy lock this task ran under (holder, since and expires as epoch seconds,
    taken_over_from, msg, released), also when it failed after taking it.
  returned: when O(lock_holder) is set
  type: dict
pid:
  description: PID of the trainer (the Python process).
  returned: success
  type: int
argv:
  description: >-
    The command line the trainer runs with, read from the process once healthy; null when it
    exited right after its first progress line.
  returned: success
  type: list
  elements: str
  sample: [/usr/bin/python3, -u, /opt/dflash/current/train_dflash_pipeline.py, --resume]
first_progress_s:
  description: Seconds from the start to the first progress line (the trainer's start-up).
  returned: success
  type: float
healthy_after_s:
  description: Seconds from the start until it counted as healthy.
  returned: success
  type: float
gpu_wait:
  description: >-
    How long the launch waited for the GPUs to be free (C(waited_s)), what held them when it
    began (C(held_at_start), null when they were free), and each GPU's used MiB when it went on
    (C(gpus)); on failure C(waited_s), C(busy) and C(holders).
  returned: when O(refuse_busy) is true and the run directory was prepared
  type: dict
  sample: {waited_s: 2.6, held_at_start: "GPU 5: 30000 of 81559 MiB used (threshold 1024 MiB)", gpus: {"5": 3}}
written:
  description: Files and directories of the run that were written or created.
  returned: always
  type: list
  elements: str
progress_line:
  description: The first progress line.
  returned: success
  type: str
tokens_per_s:
  description: The throughput figure of the first progress line, in tokens per second.
  returned: success
  type: float
throughput:
  description: >-
    The run's median tok/s over O(throughput_lines) progress lines after its warm-up
    (C(tokens_per_s), null when it logged none; the whole value null for a CT of a gang whose ranks
    do not log), how many there were (C(lines), C(complete)), the
    steps they span, each stage's median average and largest maximum in ms (C(stages)), and the
    seconds waited for them (C(waited_s)).
  returned: success
  type: dict
  sample: {tokens_per_s: 14210.5, lines: 5, complete: true, first_step: 300, last_step: 500,
           stages: {drafter: {avg_ms: 40.1, max_ms: 45.2}}, waited_s: 12.4}
step:
  description: The step number of the first progress line.
  returned: success
  type: int
resumed:
  description: Whether O(resume_auto) found a checkpoint and added O(resume_args).
  returned: when the trainer was started
  type: bool
launcher:
  description: >-
    For a trainer started through a launcher (the command's agent is torchrun, accelerate or the
    DeepSpeed launcher) - as M(dflash.lifecycle.staged_stop) RV(dflash.lifecycle.staged_stop#module:launcher)
    reads it (its workers, the deadline it keeps, its restarts), and C(ranks), the ranks its command
    line asks for; healthy means every one of them runs. Null for a plain trainer. For a CT of a
    gang (O(gang)), C(ranks_env) lists each worker with its global rank as well.
  returned: when the trainer was started
  type: dict
logs_progress:
  description: >-
    For a CT of a gang (O(gang)): whether its ranks include global rank 0, the rank that logs (its
    progress lines and throughput are the gang's); false for the others, which report no
    throughput.
  returned: when O(gang) is set and the trainer was started
  type: bool
resume:
  description: >-
    What the trainer's resume rule loads at the start (after any move aside) - C(name), C(path),
    C(step), C(complete), C(problems) and the C(rule); C(name) null when it loads nothing.
  returned: when the trainer resumes (O(resumes) or O(resume_auto)) and O(checkpoint_dir) is set
  type: dict
  sample: {name: checkpoint-500, path: /workspace/checkpoints/checkpoint-500, step: 500, complete: true,
           problems: [], rule: "the highest checkpoint-N, unchecked (get_last_checkpoint)"}
moved_aside:
  description: >-
    Incomplete checkpoints the resume would have loaded, moved aside before the start - C(name),
    C(to) (null in check mode) and the C(problems) that made it incomplete.
  returned: when the trainer resumes and O(checkpoint_dir) is set
  type: list
  elements: dict
  sample: [{name: checkpoint-600, to: /workspace/checkpoints/.incomplete/checkpoint-600-20261201T101500,
            problems: ["no trainer_state.json (HF transformers Trainer writes it last: the save did not finish)"]}]
run_id:
  description: The run identity (C(DFLASH_RUN_ID)) every process of the run carries.
  returned: when the trainer was started
  type: str
running:
  description: Whether the trainer that failed its health check is still running (tearing down, or no progress in time).
  returned: when the started trainer was not healthy
  type: bool
failed_log:
  description: Where the failed attempt's log was set aside.
  returned: when the started trainer was not healthy
  type: str
traceback:
  description: The Python traceback the trainer printed.
  returned: when the trainer printed one
  type: list
  elements: str
log_tail:
  description: Last lines of the log when the trainer was not healthy.
  returned: failure
  type: list
  elements: str
"""

from ansible_collections.dflash.lifecycle.plugins.module_utils import leased
from ansible_collections.dflash.lifecycle.plugins.module_utils.agent import launch_options, main as agent


def main():
    module = leased.LeasedModule(phase="launch", argument_spec=launch_options.ARGUMENT_SPEC, supports_check_mode=True)
    problems = launch_options.problems(module.params)
    if problems:
        module.fail_json(msg="; ".join(problems) + "; nothing was stopped or started")
    try:
        result = agent.launch(module.params, module.check_mode, module.warn, module.worker_lease(),
                              module.params["lock_unlock"])
    except launch_options.LaunchFailed as err:
        module.fail_json(msg=err.msg, **err.details)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
