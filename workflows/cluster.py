"""PILOT's own django-q2 cluster: which one it is and how it is configured.

PILOT's messages go to the cluster (the broker queue) named
PILOT_Q_CLUSTER_NAME. In the standalone project that is the default cluster,
`Q_CLUSTER["name"]`. In a host project it is an `ALT_CLUSTERS` entry, so
PILOT's requirements apply to PILOT's workers and never to the host's own
tasks (docs/embedding.md):

    Q_CLUSTER = {"name": "mysite", "orm": "default", ...,          # the host's
                 "ALT_CLUSTERS": {"pilot": {"timeout": 1800, "retry": 1860,
                                            "max_attempts": 1, "ack_failures": True,
                                            "save_limit": -1}}}

django-q2 applies an ALT_CLUSTERS entry to a process started with
`Q_CLUSTER_NAME=pilot` (`manage.py run_workers` sets it), merged over the main
configuration (django_q.conf.Conf); `cluster_conf` computes the same merge so
the system checks (workflows.checks) judge the configuration PILOT's workers
will really run with. tests/unit/test_cluster.py pins the merge to
django-q2's own.

An ALT_CLUSTERS entry must not change the broker: web processes enqueue
PILOT's messages through the main configuration's broker (only the queue name
differs), so a broker of its own would never see them.
"""

from __future__ import annotations

from django.conf import settings

from workflows.conf import pilot_settings

# PILOT's ORM broker (workflows/broker.py): Q_CLUSTER's broker_class beside "orm".
ORM_BROKER_CLASS = "workflows.broker.OrmBroker"

# Keys that choose django-q2's broker (django_q.brokers.get_broker).
BROKER_KEYS = ("redis", "django_redis", "orm", "sqs", "iron_mq", "mongo", "broker_class")


def cluster_name() -> str:
    """The django-q2 cluster (and broker queue) PILOT's messages go to."""
    return str(pilot_settings.PILOT_Q_CLUSTER_NAME)


def _main() -> dict:
    q = getattr(settings, "Q_CLUSTER", None)
    return dict(q) if isinstance(q, dict) else {}


def cluster_is_default() -> bool:
    """True when PILOT's cluster is the project's default django-q2 cluster."""
    main, name = _main(), cluster_name()
    return name in (main.get("name", "default"), main.get("cluster_name"))


def alt_entry() -> dict | None:
    """PILOT's ALT_CLUSTERS entry as written (None if there is none)."""
    alt = _main().get("ALT_CLUSTERS")
    entry = alt.get(cluster_name()) if isinstance(alt, dict) else None
    return dict(entry) if isinstance(entry, dict) else None


def cluster_conf() -> dict | None:
    """The configuration PILOT's workers run with (django-q2's merge of the
    ALT_CLUSTERS entry over Q_CLUSTER), or None when PILOT's cluster is
    neither the default one nor an ALT_CLUSTERS entry."""
    main = _main()
    if cluster_is_default():
        main.pop("ALT_CLUSTERS", None)
        return main
    entry = alt_entry()
    if entry is None:
        return None
    main.pop("ALT_CLUSTERS", None)
    entry.pop("name", None)
    entry.pop("cluster_name", None)
    return {**main, **entry, "cluster_name": cluster_name()}


def recommended_entry() -> dict:
    """The ALT_CLUSTERS entry a host project should add (for the checks' hints)."""
    return {"timeout": 1800, "retry": 1860, "max_attempts": 1, "ack_failures": True,
            "save_limit": -1}


def worker_environment() -> dict[str, str]:
    """What a `qcluster` process needs in its environment to be PILOT's cluster."""
    return {"Q_CLUSTER_NAME": cluster_name()}
