"""The sharding examples in deploy/ (Slurm job array, Kubernetes Indexed Job): the manifest passes
Kubernetes' own schema, the scripts parse, and the grader command each one runs is one that
``python -m grader`` accepts, with the shard index each scheduler gives. No cluster is run here."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from grader import course
from grader.autograde import parse_shard
from grader.cli import build_parser

DEPLOY = course.repo_root() / "deploy"


def _manifest() -> dict:
    return yaml.safe_load((DEPLOY / "grade-shards.k8s.yaml").read_text())


def test_kubernetes_manifest_passes_the_schema():
    kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is not installed")
    job = _manifest()
    kubernetes_validate.validate(job, desired_version="1.32", strict=True)
    broken = _manifest()
    broken["spec"]["completionMod"] = broken["spec"].pop("completionMode")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, desired_version="1.32", strict=True)


def test_kubernetes_pods_run_one_shard_each():
    job = _manifest()
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    container = spec["template"]["spec"]["containers"][0]
    command = " ".join(container["args"])
    n = spec["completions"]
    for index in range(n):
        argv = shlex.split(command.replace("$(JOB_COMPLETION_INDEX)", str(index)))
        assert argv[:3] == ["python", "-m", "grader"]
        args = build_parser().parse_args(argv[3:])
        assert parse_shard(args.shard) == (index, n)
        assert args.out.endswith(f"shard-{index}")


def test_slurm_script_parses_and_runs_one_shard_per_task():
    script = DEPLOY / "grade-shards.sbatch"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    line = re.search(r"^exec (.+?)$\n(.+)$", text, re.M)
    command = (line.group(1).rstrip("\\") + " " + line.group(2)).strip()
    env = {"SUBMISSIONS": "subs", "OUT": "grading", "SHARD": "3", "SHARDS": "8", "SLURM_CPUS_PER_TASK": "2"}
    expanded = re.sub(r"\$\{?(\w+)(?::-\w+)?\}?", lambda m: env[m.group(1)], command)
    argv = shlex.split(expanded)
    assert argv[:3] == [".venv/bin/python", "-m", "grader"]
    args = build_parser().parse_args(argv[3:])
    assert parse_shard(args.shard) == (3, 8) and args.out == "grading/shard-3" and args.workers == 2
