# dflash-lifecycle: deploy, stop and relaunch a DFlash training run in Proxmox LXC containers.
# `make help` lists the targets.

SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV ?= .venv
PYTHON ?= python3
INVENTORY ?= inventory/testbed
TESTBED_INVENTORY ?= inventory/testbed
HOST ?= all
PYTEST_ARGS ?=
EXTRA ?=

BIN := $(CURDIR)/$(VENV)/bin
export PATH := $(BIN):$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
TESTBED := $(BIN)/python tests/testbed/testbed.py -i $(TESTBED_INVENTORY)

.PHONY: help setup host-packages venv testbed-up testbed-down testbed-status demo test lint ping bench \
        restart check stop start push rollback status logs

help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | \
	  awk -F':.*## ' '{printf "  make %-16s %s\n", $$1, $$2}'
	@echo "  variables: INVENTORY=$(INVENTORY) HOST=$(HOST) VENV=$(VENV)"

setup: host-packages venv ## install the Debian packages and the Python venv (idempotent)

host-packages: ## apt: lxc, tini, openssh-server, python3 ... (only what is missing)
	@tests/testbed/install-host-packages.sh

venv: $(VENV)/.installed ## the controller's venv from requirements.txt

$(VENV)/.installed: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements.txt
	touch $@

testbed-up: setup ## bring up the local testbed (2 sshd nodes on loopback, 4 LXC CTs)
	$(TESTBED) up

testbed-down: venv ## remove everything the testbed created
	$(TESTBED) down

testbed-status: venv ## nodes, CTs and pct invocation counts of the testbed
	$(TESTBED) status

demo: testbed-up ## the main job against the testbed: seed CT 200 with a running trainer, then redeploy
	$(BIN)/ansible-playbook -i $(TESTBED_INVENTORY) playbooks/testbed_seed.yml
	$(BIN)/ansible-playbook -i $(TESTBED_INVENTORY) redeploy.yml -l ct200

ping: venv ## ansible.builtin.ping every CT of HOST through the pct connection
	$(BIN)/ansible -i $(INVENTORY) '$(HOST)' -m ansible.builtin.ping

test: setup ## unit and integration tests (brings the testbed up, and down if it was not up)
	$(BIN)/python -m pytest $(PYTEST_ARGS) tests

bench: setup ## the benchmark tables (stop latency, push cost, redeploy cost, scale, check mode)
	$(BIN)/python bench/stop_latency.py
	$(BIN)/python bench/push_cost.py
	$(BIN)/python bench/redeploy_bench.py

lint: venv ## ansible-lint (production profile)
	$(BIN)/ansible-lint --offline --profile production

# -- the jobs (HOST: a host, group or pattern; INVENTORY: inventory/production for real nodes)
# NO_GRACEFUL=wait_for_checkpoint|fail|proceed: what a stop does when SIGINT cannot checkpoint
PLAYBOOK := $(BIN)/ansible-playbook -i $(INVENTORY) -l '$(HOST)' $(EXTRA) \
  $(if $(NO_GRACEFUL),-e trainer_stop_no_graceful=$(NO_GRACEFUL))
# ansible-playbook exits 0 when a limit matches nothing; a job that touches nothing must not.
HOST_GUARD = @$(BIN)/ansible -i $(INVENTORY) '$(HOST)' --list-hosts 2>/dev/null | grep -q 'hosts ([1-9]' \
  || { echo "HOST=$(HOST) matches no host of $(INVENTORY)" >&2; exit 2; }

restart: venv ## redeploy HOST: push, staged stop (checkpoint), activate, launch
	$(HOST_GUARD)
	$(PLAYBOOK) redeploy.yml

check: venv ## dry run of the redeploy of HOST: shows the command line and the stop ladder
	$(HOST_GUARD)
	$(PLAYBOOK) redeploy.yml --check --diff

stop: venv ## stop the trainer of HOST, checkpoint first
	$(HOST_GUARD)
	$(PLAYBOOK) playbooks/stop.yml

start: venv ## launch the trainer of HOST (current release, preflight first)
	$(HOST_GUARD)
	$(PLAYBOOK) playbooks/start.yml

push: venv ## push the code of HOST as a new release (not activated)
	$(HOST_GUARD)
	$(PLAYBOOK) playbooks/push.yml

rollback: venv ## switch HOST back to its previous release and relaunch it
	$(HOST_GUARD)
	$(PLAYBOOK) playbooks/rollback.yml

status: venv ## per CT: running, PID, uptime, release, last tok/s, latest checkpoint
	$(HOST_GUARD)
	$(PLAYBOOK) playbooks/status.yml

logs: venv ## tail the trainer log of HOST (LINES=50)
	$(BIN)/ansible -i $(INVENTORY) '$(HOST)' -m ansible.builtin.command \
	  -a 'tail -n $(or $(LINES),50) /workspace/logs/train.log'
