"""PILOT's index names start with `pilot_` (issue 30, F2): index names are
schema-wide (and Django checks them across all models, models.E030), so a host
model with an index called `task_created_idx` collided with PILOT's. Four names
are shortened to stay within Django's 30 characters. Constraint names are
unchanged: renaming one rebuilds it (docs/embedding.md, "Names")."""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('workflows', '0023_host_cleanup_on_pilot_cluster'),
    ]

    operations = [
        migrations.RenameIndex(
            model_name='demoledger',
            new_name='pilot_demoledger_task_idx',
            old_name='demoledger_task_idx',
        ),
        migrations.RenameIndex(
            model_name='demoorder',
            new_name='pilot_demoorder_batch_idx',
            old_name='demoorder_batch_idx',
        ),
        migrations.RenameIndex(
            model_name='pilotschedule',
            new_name='pilot_schedule_due_idx',
            old_name='schedule_due_idx',
        ),
        migrations.RenameIndex(
            model_name='task',
            new_name='pilot_task_owner_created_idx',
            old_name='task_owner_created_idx',
        ),
        migrations.RenameIndex(
            model_name='task',
            new_name='pilot_task_state_created_idx',
            old_name='task_state_created_idx',
        ),
        migrations.RenameIndex(
            model_name='task',
            new_name='pilot_task_wf_created_idx',
            old_name='task_workflow_created_idx',
        ),
        migrations.RenameIndex(
            model_name='task',
            new_name='pilot_task_created_idx',
            old_name='task_created_idx',
        ),
        migrations.RenameIndex(
            model_name='task',
            new_name='pilot_task_due_idx',
            old_name='task_due_idx',
        ),
        migrations.RenameIndex(
            model_name='task',
            new_name='pilot_task_lease_expiry_idx',
            old_name='task_lease_expiry_idx',
        ),
        migrations.RenameIndex(
            model_name='task',
            new_name='pilot_task_pending_enq_idx',
            old_name='task_pending_enqueued_idx',
        ),
        migrations.RenameIndex(
            model_name='task',
            new_name='pilot_task_expires_idx',
            old_name='task_expires_idx',
        ),
        migrations.RenameIndex(
            model_name='task',
            new_name='pilot_task_finished_idx',
            old_name='task_finished_idx',
        ),
        migrations.RenameIndex(
            model_name='taskreplay',
            new_name='pilot_replay_at_idx',
            old_name='replay_at_idx',
        ),
        migrations.RenameIndex(
            model_name='tasktransition',
            new_name='pilot_transition_task_at_idx',
            old_name='transition_task_at_idx',
        ),
        migrations.RenameIndex(
            model_name='tasktransition',
            new_name='pilot_transition_at_idx',
            old_name='transition_at_idx',
        ),
        migrations.RenameIndex(
            model_name='webhookdelivery',
            new_name='pilot_delivery_due_idx',
            old_name='delivery_due_idx',
        ),
        migrations.RenameIndex(
            model_name='webhookdelivery',
            new_name='pilot_delivery_claimed_idx',
            old_name='delivery_claimed_idx',
        ),
        migrations.RenameIndex(
            model_name='webhookdelivery',
            new_name='pilot_delivery_sent_idx',
            old_name='delivery_sent_idx',
        ),
        migrations.RenameIndex(
            model_name='webhookdelivery',
            new_name='pilot_delivery_owed_owner_idx',
            old_name='delivery_owed_owner_idx',
        ),
        migrations.RenameIndex(
            model_name='webhookdelivery',
            new_name='pilot_delivery_owed_ep_idx',
            old_name='delivery_owed_endpoint_idx',
        ),
        migrations.RenameIndex(
            model_name='webhookdelivery',
            new_name='pilot_delivery_detached_idx',
            old_name='delivery_detached_idx',
        ),
        migrations.RenameIndex(
            model_name='webhookendpoint',
            new_name='pilot_endpoint_failing_idx',
            old_name='webhook_endpoint_failing_idx',
        ),
    ]
