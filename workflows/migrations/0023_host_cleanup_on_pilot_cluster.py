"""The daily cleanup schedule (0005) runs on PILOT's own django-q2 cluster.

django-q2 gives a schedule without a `cluster` to the project's default
cluster only. In a host project that is the host's cluster (with the host's
timeout), not PILOT's: a host without a qcluster of its own never cleaned up.
Pointing the row at PILOT_Q_CLUSTER_NAME makes `run_workers` run it, in the
standalone project as in a host (docs/embedding.md, "Cleanup"). Catching up
after downtime is a cluster setting (`catch_up`), off in the standalone
project and in the ALT_CLUSTERS entry docs/embedding.md shows; with it on, the
cleanup (idempotent) runs once per missed day.
"""

from django.db import migrations

NAME = "pilot.cleanup_tasks"


def to_pilots_cluster(apps, schema_editor):
    from workflows.cluster import cluster_name

    apps.get_model("django_q", "Schedule").objects.filter(name=NAME).update(
        cluster=cluster_name())


def to_the_default_cluster(apps, schema_editor):
    apps.get_model("django_q", "Schedule").objects.filter(name=NAME).update(cluster=None)


class Migration(migrations.Migration):
    dependencies = [("workflows", "0022_run_after_and_priority")]

    operations = [migrations.RunPython(to_pilots_cluster, to_the_default_cluster)]
