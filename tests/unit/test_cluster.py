"""workflows.cluster computes the configuration PILOT's workers run with the
way django-q2 does (django_q.conf.Conf, read in a fresh process started with
Q_CLUSTER_NAME as `run_workers` starts qcluster)."""

import json
import subprocess
import sys

import pytest
from django.test import override_settings

from workflows.cluster import cluster_conf, cluster_is_default
from workflows.management.commands.run_workers import qcluster_environment

HOST_Q = {"name": "mysite", "orm": "default", "timeout": 60, "retry": 90, "workers": 1,
          "ALT_CLUSTERS": {"pilot": {"timeout": 300, "retry": 360, "max_attempts": 1,
                                     "ack_failures": True, "save_limit": -1, "workers": 3},
                           "reports": {"timeout": 5}}}

CONF_FIELDS = {"TIMEOUT": "timeout", "RETRY": "retry", "MAX_ATTEMPTS": "max_attempts",
               "ACK_FAILURES": "ack_failures", "SAVE_LIMIT": "save_limit",
               "WORKERS": "workers", "CLUSTER_NAME": "cluster_name", "PREFIX": "name",
               "ORM": "orm"}


def django_q_conf(q_cluster: dict, cluster: str) -> dict:
    script = (
        "import json, sys\n"
        "from django.conf import settings\n"
        "settings.configure(Q_CLUSTER=json.loads(sys.argv[1]), INSTALLED_APPS=[])\n"
        "from django_q.conf import Conf\n"
        f"print(json.dumps({{k: getattr(Conf, k) for k in {sorted(CONF_FIELDS)!r}}}))\n")
    done = subprocess.run([sys.executable, "-c", script, json.dumps(q_cluster)],
                          env={"Q_CLUSTER_NAME": cluster, "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=60, check=True)
    return json.loads(done.stdout)


@pytest.mark.parametrize("q_cluster, name", [
    (HOST_Q, "pilot"),
    ({"name": "pilot", "orm": "default", "timeout": 30, "retry": 40, "max_attempts": 1}, "pilot"),
], ids=["alt-cluster", "default-cluster"])
def test_the_merge_is_django_q2s(q_cluster, name):
    theirs = django_q_conf(q_cluster, name)
    with override_settings(Q_CLUSTER=q_cluster, PILOT_Q_CLUSTER_NAME=name):
        ours = cluster_conf()
    defaults = {"max_attempts": 0, "ack_failures": False, "save_limit": 250,
                "cluster_name": ours.get("name")}
    for conf_name, key in CONF_FIELDS.items():
        if key == "workers" and key not in ours:
            continue  # django-q2 derives it from the CPU count
        assert theirs[conf_name] == ours.get(key, defaults.get(key)), conf_name


def test_a_cluster_that_is_neither_default_nor_alt_is_none():
    with override_settings(Q_CLUSTER={"name": "mysite", "orm": "default"},
                           PILOT_Q_CLUSTER_NAME="pilot"):
        assert cluster_conf() is None
        assert not cluster_is_default()


def test_run_workers_starts_qcluster_as_pilots_cluster():
    with override_settings(PILOT_Q_CLUSTER_NAME="pilot-x"):
        assert qcluster_environment()["Q_CLUSTER_NAME"] == "pilot-x"
