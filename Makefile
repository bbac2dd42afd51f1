# dflash-lifecycle: deploy, stop and relaunch a DFlash training run in Proxmox LXC containers.
# `make help` lists the targets.

SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV ?= .venv
# the controller's venv on the system Python: Debian builds it with PGO and LTO, and ansible-playbook
# uses 7 to 9 % less CPU on it than on a plain source build such as pyenv's (bench/controller_python.py)
PYTHON ?= $(SYSTEM_PYTHON)
# the newest ansible-core runs on Python 3.12+ (pyenv has one on the project's machines)
VENV_NEXT ?= .venv-next
PYTHON_NEXT ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3.12) $(shell command -v python3.12))
# PyTorch (with accelerate and DeepSpeed) for the GPU check's CPU mode, the real-format checks of the
# checkpoint imitations (safetensors) and the launchers in the testbed's CTs, which bind it at its own
# path; pip takes a local wheel where find-links has one
VENV_TORCH ?= .venv-torch
SYSTEM_PYTHON ?= /usr/bin/python3
TORCH_PIP_ARGS ?= torch==2.13.0 numpy safetensors==0.8.0 accelerate==1.15.0
DEEPSPEED_PIP_ARGS ?= deepspeed==0.19.8
INVENTORY ?= inventory/testbed
TESTBED_INVENTORY ?= inventory/testbed
HOST ?=
PYTEST_ARGS ?=
FILE ?=
EXTRA ?=

BIN := $(CURDIR)/$(VENV)/bin
export PATH := $(BIN):$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
TESTBED := $(BIN)/python tests/testbed/testbed.py -i $(TESTBED_INVENTORY)

.PHONY: help setup host-packages venv venv-next venv-torch gpu-check gpu-check-wheels testbed-up testbed-down testbed-status demo test test-unit lint ping bench metrics-targets dashboard \
        restart check stop start push rollback pve-hooks status logs throughput host-required

help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | \
	  awk -F':.*## ' '{printf "  make %-16s %s\n", $$1, $$2}'
	@echo "  variables:"
	@echo "    INVENTORY=$(INVENTORY)   inventory of the jobs (inventory/production for real nodes)"
	@echo "    HOST=...                 CTs of a job: a host, group or pattern; required by restart, stop,"
	@echo "                             start, push and rollback; status, check, ping, logs, throughput"
	@echo "                             default to every trainer CT"
	@echo "    NO_GRACEFUL=wait_for_checkpoint|fail|proceed   a stop when SIGINT cannot checkpoint"
	@echo "    CANARY=report|fail|rollback   a redeploy whose new run is slower than the old one by more"
	@echo "                             than CANARY_THRESHOLD per cent (-5): report, fail, roll back"
	@echo "    EXTRA='-e k=v ...'       extra ansible-playbook arguments"
	@echo "    LINES=50                 log lines of make logs"
	@echo "    VENV=$(VENV)"

setup: host-packages venv ## install the Debian packages and the Python venv (idempotent)

host-packages: ## apt: lxc, tini, openssh-server, python3 ... (only what is missing)
	@tests/testbed/install-host-packages.sh

venv: $(VENV)/.installed $(VENV)/.controller-exit ## the controller's venv from requirements.txt

$(VENV)/.installed: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements.txt
	touch $@

# $(call install-pth,VENV,FILE): FILE into VENV's site-packages, where each start of its Python runs it
install-pth = cp $(2) "$$($(1)/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/dflash_$(notdir $(2))"

# under make test its processes skip the interpreter's final collections at exit (docs/testbed.md, "Fast exits")
$(VENV)/.controller-exit: tests/testbed/controller_exit.pth $(VENV)/.installed
	$(call install-pth,$(VENV),$<)
	touch $@

venv-next: $(VENV_NEXT)/.installed ## a second venv with the newest ansible-core (Python 3.12)

$(VENV_NEXT)/.installed: requirements-next.txt
	@test -n "$(PYTHON_NEXT)" || { echo "no Python 3.12 found: make ... PYTHON_NEXT=/path/to/python3.12" >&2; exit 2; }
	$(PYTHON_NEXT) -m venv $(VENV_NEXT)
	$(VENV_NEXT)/bin/pip install --quiet --disable-pip-version-check -r requirements-next.txt
	touch $@

venv-torch: $(VENV_TORCH)/.installed $(VENV_TORCH)/.torch-exit ## PyTorch, accelerate, DeepSpeed for the GPU check's CPU mode and the testbed's CTs

# the system python3, which the testbed's CTs run too: they get this venv for torchrun
$(VENV_TORCH)/.installed:
	$(SYSTEM_PYTHON) -m venv $(VENV_TORCH)
	$(VENV_TORCH)/bin/pip install --quiet --disable-pip-version-check $(TORCH_PIP_ARGS)
	# DeepSpeed's launcher runs on the CPU; its ops are built only when used (never here)
	DS_BUILD_OPS=0 $(VENV_TORCH)/bin/pip install --quiet --disable-pip-version-check --no-build-isolation $(DEEPSPEED_PIP_ARGS)
	touch $@

# its processes skip the interpreter's final collections at exit (docs/testbed.md, "Fast exits")
$(VENV_TORCH)/.torch-exit: tests/testbed/torch_exit.pth $(VENV_TORCH)/.installed
	$(call install-pth,$(VENV_TORCH),$<)
	touch $@

gpu-check: venv venv-torch ## the GPU check's four scenarios in CPU mode (make test runs them too)
	$(BIN)/python bench/gpu_check.py --cpu --trainer-python $(VENV_TORCH)/bin/python

# The GPU machine has Python 3.12 with PyTorch and no network: ansible-core and what it needs
# travel there as wheels, the versions of this venv.
GPU_WHEELS = ansible-core cffi cryptography jinja2 markupsafe packaging pycparser pyyaml resolvelib
gpu-check-wheels: venv ## ansible-core and its dependencies as Python 3.12 wheels in .whl, for the GPU machine
	rm -rf .whl
	$(BIN)/pip download --quiet --disable-pip-version-check --only-binary=:all: --no-deps -d .whl \
	  --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform any \
	  $$($(BIN)/pip freeze | grep -iE '^($(subst $() ,|,$(GPU_WHEELS)))==')
	@ls .whl | wc -l | xargs printf '%s wheels in .whl\n'

testbed-up: setup ## bring up the local testbed (2 sshd nodes on loopback, 4 LXC CTs)
	$(TESTBED) up

testbed-down: venv ## remove everything the testbed created
	$(TESTBED) down

testbed-status: venv ## nodes, CTs and pct invocation counts of the testbed
	$(TESTBED) status

demo: testbed-up ## the main job against the testbed: seed CT 200 with a running trainer, then redeploy
	$(BIN)/ansible-playbook -i $(TESTBED_INVENTORY) playbooks/testbed_seed.yml
	$(BIN)/ansible-playbook -i $(TESTBED_INVENTORY) redeploy.yml -l ct200


# the three venvs are built side by side (pip mostly waits on unpacking and building wheels), and
# beside them apt installs the rest of the host's packages (on a fresh machine apt mostly waits on
# downloads and dpkg): only python3 and its venv module come first, the venvs are made with them;
# tests/run-all.sh runs that set-up and starts lint and sanity once the controller's venv is built;
# FILE=... runs only those test files or node ids, on as many workers as files (up to 4), each
# integration file with a testbed of its own: the loop of a change to one area
# the controller's Python processes of the tests skip the final collections at exit (tests/testbed/controller_exit.pth)
test: export DFLASH_TEST_FAST_EXIT = 1
test: ## lint, sanity, every test, the GPU check's CPU mode; FILE='a.py b.py' runs only those
	@tests/testbed/install-host-packages.sh python3 python3-venv
ifeq ($(strip $(FILE)),)
	tests/run-all.sh $(BIN) $(CURDIR)/$(VENV_NEXT)/bin $(CURDIR)/$(VENV_TORCH)/bin/python $(PYTEST_ARGS)
else
	@$(MAKE) --no-print-directory -j3 host-packages venv venv-torch
	DFLASH_TORCH_PYTHON=$(CURDIR)/$(VENV_TORCH)/bin/python $(BIN)/python -m pytest -p no:cacheprovider \
	  $(if $(filter-out 1,$(words $(FILE))),-n $$(( $(words $(FILE)) < 4 ? $(words $(FILE)) : 4 )) --dist loadfile) \
	  $(PYTEST_ARGS) $(FILE) < /dev/null
endif

# no testbed: the unit tests of the project and of the collection (those that start real trainers
# on the host included), spread test by test over 4 workers
test-unit: venv venv-torch ## the unit tests alone, without the testbed
	DFLASH_TORCH_PYTHON=$(CURDIR)/$(VENV_TORCH)/bin/python $(BIN)/python -m pytest -p no:cacheprovider \
	  -n 4 --dist worksteal $(PYTEST_ARGS) tests/unit collections/ansible_collections/dflash/lifecycle/tests/unit < /dev/null

bench: setup venv-torch ## the benchmark tables (first progress against the hand procedure, stop latency, the stop after the trainer's own checkpoint, the stop request against SIGINT, checkpoint check, launcher stop, gang redeploy, push cost, redeploy cost, scale, check mode, model staging against the disk, Proxmox's stop and start with the hookscript, the run's supervisor, the check of a CT's answer, the run's metrics, the metrics' server against a slow client, the payload's bytecode, the controller's Python, the controller's poll while a task waits)
	$(BIN)/python bench/first_progress.py
	$(BIN)/python bench/stop_latency.py
	$(BIN)/python bench/own_checkpoint_stop.py
	$(BIN)/python bench/stop_request.py
	$(BIN)/python bench/checkpoint_check.py
	$(BIN)/python bench/launcher_stop.py
	$(BIN)/python bench/gang_redeploy.py
	$(BIN)/python bench/push_cost.py
	$(BIN)/python bench/redeploy_bench.py
	$(BIN)/python bench/model_stage.py
	$(BIN)/python bench/pve_hooks.py
	$(BIN)/python bench/supervise.py
	$(BIN)/python bench/answer_check.py
	$(BIN)/python bench/metrics_cost.py
	$(BIN)/python bench/scrape_server.py
	$(BIN)/python bench/payload_bytecode.py
	$(BIN)/python bench/controller_python.py
	$(BIN)/python bench/poll_interval.py

lint: venv ## ansible-lint (production profile) and ansible-test sanity on the collection
	$(BIN)/ansible-lint --offline --profile production
	tests/sanity/run.sh $(BIN)/python

# -- the jobs (HOST: a host, group or pattern of INVENTORY; inventory/production for real nodes)
# The CTs a target works on: HOST, or every trainer CT for the read-only targets.
CTS = $(or $(HOST),dflash_trainers)
# A job runs limited to HOST's trainer CTs: a HOST that selects none (a node's name, a typo) or an
# inventory that cannot be read (ansible.cfg: any_unparsed_is_failed) fails ansible-playbook
# before it touches anything, never a job that touches nothing and exits 0, or every CT. Only a
# job that failed so runs the guard, which names that cause and turns it into exit 2: a job that
# ran pays nothing for it (the guard is an ansible start-up, 0.34 s of CPU). `ansible` takes the
# limit the same way (a pattern alone that matches nothing exits 0).
LIMIT = '$(CTS):&dflash_trainers'
PLAYBOOK = $(BIN)/ansible-playbook -i $(INVENTORY) -l $(LIMIT) $(EXTRA) \
  $(if $(NO_GRACEFUL),-e trainer_stop_no_graceful=$(NO_GRACEFUL)) \
  $(if $(CANARY),-e redeploy_canary_policy=$(CANARY)) \
  $(if $(CANARY_THRESHOLD),-e redeploy_canary_threshold=$(CANARY_THRESHOLD))

HOST_GUARD = hosts=$$(ANSIBLE_INVENTORY_UNPARSED_FAILED=1 $(BIN)/ansible -i $(INVENTORY) $(LIMIT) \
	            --list-hosts 2>&1) || { echo "$$hosts" >&2; echo "INVENTORY=$(INVENTORY) cannot be read (above)" >&2; exit 2; }; \
	  grep -q 'hosts ([1-9]' <<< "$$hosts" \
	  || { echo "HOST=$(CTS) selects no trainer CT (group dflash_trainers) of $(INVENTORY)" >&2; exit 2; }
# $(call guarded,JOB): JOB, and when it failed before it ran (exit 1: ansible's errors; a failed
# host is 2, an unreachable one 4), the guard; the guard's refusal (2) wins over JOB's status
guarded = $(1) || { job=$$?; [ $$job -ne 1 ] || ( $(HOST_GUARD) ) || exit 2; exit $$job; }

# The targets that change a CT take HOST explicitly: no default reaches every CT by accident.
host-required:
	@test -n "$(HOST)" || { echo "HOST is required: make $(MAKECMDGOALS) HOST=<CT, group or pattern of $(INVENTORY)>" >&2; exit 2; }

restart: host-required venv ## redeploy HOST: push, staged stop (checkpoint), activate, launch
	@$(call guarded,$(PLAYBOOK) redeploy.yml)

check: venv ## dry run of the redeploy of HOST: changes, drift to repair, command line, stop ladder
	@$(call guarded,$(PLAYBOOK) redeploy.yml --check --diff)

stop: host-required venv ## stop the trainer of HOST, checkpoint first
	@$(call guarded,$(PLAYBOOK) playbooks/stop.yml)

start: host-required venv ## launch the trainer of HOST (current release, preflight first)
	@$(call guarded,$(PLAYBOOK) playbooks/start.yml)

push: host-required venv ## push the code of HOST as a new release (not activated)
	@$(call guarded,$(PLAYBOOK) playbooks/push.yml)

rollback: host-required venv ## switch HOST back to its previous release and relaunch it
	@$(call guarded,$(PLAYBOOK) playbooks/rollback.yml)

pve-hooks: host-required venv ## the Proxmox hookscript on every node and on HOST's CTs: checkpoint before any CT stop, run back after its start
	@$(call guarded,$(PLAYBOOK) playbooks/pve_hooks.yml)

status: venv ## per CT: running, PID, uptime, release, drift, tok/s, checkpoint, lock
	@$(call guarded,$(PLAYBOOK) playbooks/status.yml)

logs: venv ## the last LINES (50) lines of the trainer log of HOST
	@$(call guarded,$(PLAYBOOK) playbooks/logs.yml $(if $(LINES),-e logs_lines=$(LINES)))

throughput: venv ## a text chart of the tok/s of HOST's run over its log
	@$(call guarded,$(PLAYBOOK) playbooks/throughput.yml)

metrics-targets: venv ## Prometheus's target list of every trainer CT that serves metrics (docs/monitoring.md)
	@$(call guarded,$(PLAYBOOK) playbooks/metrics_targets.yml)

dashboard: venv ## build the Grafana dashboard (monitoring/grafana/dflash-runs.json) from its code
	$(BIN)/python monitoring/grafana/dashboard.py

ping: venv ## ansible.builtin.ping every CT of HOST through the pct connection
	@$(call guarded,$(BIN)/ansible -i $(INVENTORY) dflash_trainers -l $(LIMIT) -m ansible.builtin.ping)
