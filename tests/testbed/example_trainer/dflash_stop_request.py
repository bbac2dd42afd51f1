# dflash-lifecycle's stop request, the trainer's side. MIT-0: copy this one file next to a
# training script and import it; it needs the standard library, and torch.distributed only when
# a process group is initialised.
"""A stop the trainer agrees to: the staged stop writes a request file, the trainer sees it at a
step boundary, saves, and exits 0; no signal is sent (docs/stop.md, "The stop request").

    from dflash_stop_request import StopRequest

    stop = StopRequest()             # at start-up: logs the line that announces it
    for step in range(start, total):
        train_step()
        if stop.should_stop(step):   # every rank answers the same at the same step
            path = save_checkpoint(step)
            stop.saved(path, step)
            sys.exit(0)

The launch sets DFLASH_STOP_REQUEST to the file's path; unset, should_stop() is always False.
should_stop() looks at the file (one stat) once every_steps steps or every_seconds seconds have
passed since its last look, whichever comes first. In a distributed run (torch.distributed
initialised, world size above 1) the ranks agree instead: at each look every rank reads its own
machine's file and one all-reduce (MAX) of a flag and of its mean step time tells all of them
whether any rank saw a request and when the next look is (every every_steps steps, or sooner,
down to every step, when the slowest rank's steps are long), so every rank stops at the same
step, whichever CT's request came first.

Each look also gives the run's supervisor a heartbeat: local rank 0 touches ``<path>.alive`` (one
utime), so a run that hangs between its progress lines is found by the beats that stopped.
"""

import json
import os
import sys
import time

ENVIRONMENT = "DFLASH_STOP_REQUEST"
LINE = "dflash-stop-request:"


def _log(line):
    print(line, flush=True)


class StopRequest:
    """The request channel of one process; create it before the first step."""

    def __init__(self, path=None, every_steps=10, every_seconds=1.0, log=_log):
        self.path = path if path is not None else os.environ.get(ENVIRONMENT) or None
        self.every_steps = max(1, int(every_steps))
        self.every_seconds = float(every_seconds)
        self.request = None  # the request taken, once should_stop() said True
        self._since = time.time()  # a request written before this process began is stale
        self._looked_at = (None, 0.0)  # (step, monotonic time) of the last look
        self._next_check = None  # in a process group: the step of the next look, agreed by all ranks
        self._log = log
        # one line per machine: each CT's log is written by its local rank 0
        self._logs = os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0")) == "0"
        if self.path and self._logs:
            self._log(f"{LINE} honoured path={self.path} pid={os.getpid()}")

    def _beat(self):
        """The supervisor's heartbeat: the mtime of <path>.alive is the last look."""
        if not self._logs:
            return
        beat = f"{self.path}.alive"
        try:
            os.utime(beat)
        except FileNotFoundError:
            try:
                open(beat, "a").close()
            except OSError:
                pass
        except OSError:
            pass

    def _read(self):
        """The request in the file, or None (absent, stale, half written or not ours)."""
        try:
            with open(self.path, encoding="utf-8") as handle:
                request = json.load(handle)
        except (OSError, ValueError):
            return None
        if not isinstance(request, dict) or not isinstance(request.get("requested_at"), (int, float)):
            return None
        return request if request["requested_at"] >= self._since else None

    @staticmethod
    def _process_group():
        # a process group is only initialised once its module is imported: never import it here
        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            return dist
        return None

    def should_stop(self, step):
        """Whether the run stops after this step (and saves first). Once True, always True."""
        if self.request is not None:
            return True
        if not self.path:
            return False
        dist = self._process_group()
        if dist is None:
            last_step, last_time = self._looked_at
            now = time.monotonic()
            if last_step is not None and step - last_step < self.every_steps and now - last_time < self.every_seconds:
                return False
            self._looked_at = (step, now)
            self._beat()
            request = self._read()
            if request is None:
                return False
        else:
            # every rank looks at the same steps, or the all-reduce would hang: the next one is
            # chosen from figures the all-reduce itself agreed on
            if self._next_check is not None and step < self._next_check:
                return False
            import torch

            self._beat()
            request = self._read()
            last_step, last_time = self._looked_at
            now = time.monotonic()
            per_step = (now - last_time) / (step - last_step) if last_step is not None and step > last_step else 0.0
            device = torch.device("cuda", torch.cuda.current_device()) \
                if dist.get_backend() == "nccl" else torch.device("cpu")
            agreed = torch.tensor([0.0 if request is None else 1.0, per_step], dtype=torch.float64, device=device)
            dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
            seen, slowest = agreed.tolist()
            self._looked_at = (step, now)
            # every every_steps steps, or every step once the slowest rank's steps take every_seconds
            self._next_check = step + max(1, min(self.every_steps, int(self.every_seconds / slowest)
                                                 if slowest > 0 else self.every_steps))
            if not seen:
                return False
            # a rank whose own CT's request is not there yet stops with the others
            request = request or {"id": "peer"}
        self.request = request
        if self._logs:
            self._log(f"{LINE} acknowledged id={request.get('id')} step={step}")
        return True

    def saved(self, checkpoint, step):
        """Say that the checkpoint of the stop is complete (call it once the save returned)."""
        if self._logs and self.request is not None:
            self._log(f"{LINE} saved id={self.request.get('id')} step={step} checkpoint={checkpoint}")
