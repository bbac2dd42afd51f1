"""The project as the Ansible ecosystem judges it: the execution environment's build context is
whole and its requirements are found, the AWX data imports on plain AWX, the collection's
metadata and changelog are in order, and no document points outside the repository."""

import os
import re
import subprocess

import yaml

from testlib import BIN, REPO, run_tool

COLLECTION = os.path.join(REPO, "collections", "ansible_collections", "dflash", "lifecycle")
# the variables infra.aap_configuration 3.x's dispatch role hands to its controller roles
# (roles/dispatch/defaults/main.yml, controller_configuration_dispatcher_roles)
CONTROLLER_VARS = {
    "controller_settings", "aap_organizations", "controller_instances", "controller_instance_groups",
    "controller_labels", "controller_credential_types", "controller_credentials",
    "controller_credential_input_sources", "controller_execution_environments", "aap_applications",
    "controller_notifications", "controller_projects", "controller_inventories",
    "controller_inventory_sources", "controller_hosts", "controller_bulk_hosts", "controller_templates",
    "controller_workflows", "controller_schedules", "controller_launch_jobs", "controller_workflow_launch_jobs",
}


def test_the_ee_build_context_copies_only_files_that_exist(tmp_path):
    context = tmp_path / "context"
    run_tool([os.path.join(BIN, "ansible-builder"), "create", "-f", "execution-environment.yml",
              "-c", str(context), "--output-filename", "Containerfile"])
    containerfile = (context / "Containerfile").read_text()
    sources = [line.split()[1] for line in containerfile.splitlines()
               if line.startswith(("COPY ", "ADD ")) and "--from=" not in line]
    assert sources and all((context / src).exists() for src in sources), sources
    base = re.search(r'EE_BASE_IMAGE="([^"]+)"', containerfile).group(1)
    assert ":" in base and not base.endswith(":latest"), base
    requirements = yaml.safe_load((context / "_build" / "requirements.yml").read_text())
    for entry in requirements["collections"]:  # installed from the context, under /build
        assert (context / "_build" / os.path.relpath(entry["name"], "/build") / "galaxy.yml").is_file()


def test_introspect_finds_the_collections_requirements():
    out = run_tool([os.path.join(BIN, "ansible-builder"), "introspect", "collections"]).stdout
    found = yaml.safe_load(out.split("\n", 1)[1])
    assert "openssh-client [platform:dpkg]  # from collection dflash.lifecycle" in found["system"]
    assert "openssh-clients [platform:rpm]  # from collection dflash.lifecycle" in found["system"]


def test_the_awx_import_runs_the_controller_roles_only_with_bounded_collections():
    with open(os.path.join(REPO, "awx", "job_templates.yml"), encoding="utf-8") as handle:
        data = yaml.safe_load(handle)
    objects = {k for k in data if not k.startswith("dflash_survey_") and k != "aap_configuration_dispatcher_roles"}
    assert objects <= CONTROLLER_VARS, objects - CONTROLLER_VARS
    dispatch = " ".join(data["aap_configuration_dispatcher_roles"].split())
    assert dispatch.endswith("+ controller_configuration_dispatcher_roles }}")
    assert "gateway_configuration_dispatcher_roles if import_gateway | default(false) | bool else []" in dispatch
    with open(os.path.join(REPO, "awx", "requirements.yml"), encoding="utf-8") as handle:
        wanted = {c["name"]: c["version"] for c in yaml.safe_load(handle)["collections"]}
    assert set(wanted) == {"infra.aap_configuration", "awx.awx"}
    assert all(">=" in v and "<" in v.replace("<=", "") for v in wanted.values()), wanted


def test_collection_metadata_license_and_changelog():
    with open(os.path.join(COLLECTION, "galaxy.yml"), encoding="utf-8") as handle:
        galaxy = yaml.safe_load(handle)
    assert galaxy["license"] == ["GPL-3.0-or-later"] and "repository" not in galaxy
    assert all(re.match(r"^.+ \(@[\w-]+\)$", author) for author in galaxy["authors"])
    for path in (os.path.join(REPO, "LICENSE"), os.path.join(COLLECTION, "LICENSE")):
        assert "GNU GENERAL PUBLIC LICENSE" in open(path, encoding="utf-8").read(200)
    subprocess.run([os.path.join(BIN, "antsibull-changelog"), "lint"], cwd=COLLECTION, check=True,
                   capture_output=True)


def test_the_collection_readme_lists_every_plugin():
    readme = open(os.path.join(COLLECTION, "README.md"), encoding="utf-8").read()
    names = []
    for kind in ("modules", "connection", "inventory", "lookup", "filter", "doc_fragments"):
        for name in sorted(os.listdir(os.path.join(COLLECTION, "plugins", kind))):
            stem, ext = os.path.splitext(name)
            if (kind == "filter") == (ext == ".yml") and ext in (".py", ".yml"):
                names.append(f"dflash.lifecycle.{stem}")
    missing = [n for n in names if f"`{n}`" not in readme]
    assert len(names) > 12 and not missing, missing


def test_no_file_points_outside_the_repository():
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    for rel in files:
        if not rel.endswith((".md", ".py", ".yml", ".j2")) or not os.path.exists(os.path.join(REPO, rel)):
            continue
        text = open(os.path.join(REPO, rel), encoding="utf-8").read()
        assert os.path.join(os.pardir, "shared") not in text, rel  # the builders' brief, not the users'
        if rel.endswith(".md"):
            for target in re.findall(r"\]\(([^)#]+)\)", text):
                if not re.match(r"^[a-z]+:", target):  # a relative link stays inside the repository
                    path = os.path.normpath(os.path.join(REPO, os.path.dirname(rel), target))
                    assert path.startswith(REPO + os.sep) and os.path.exists(path), (rel, target)
