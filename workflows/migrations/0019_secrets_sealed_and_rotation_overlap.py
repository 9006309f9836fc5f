"""Secrets at rest and rotation with an overlap (issue 31, N1; docs/security.md).

- `ClientWebhook.secret` holds the signing secret sealed (workflows.accounts.vault,
  `fernet:…`): every existing plain `whsec_…` is sealed here, so each client keeps
  its secret and its receiver keeps verifying — nothing to reconfigure on upgrade.
  Backwards, the rows are opened again (with the same keys).
- `previous_secret` / `previous_until`: the secret a rotation replaced, which
  keeps signing beside the new one until then.
- `ApiToken.user` is no longer one-to-one: during a rotation's overlap a user
  has the new token and the old one, which carries an `expires_at`.
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


def seal_plain_secrets(apps, schema_editor):
    from workflows.accounts.vault import SEALED_PREFIX, secret_seal

    ClientWebhook = apps.get_model("workflows", "ClientWebhook")
    for hook in ClientWebhook.objects.exclude(secret__startswith=SEALED_PREFIX):
        ClientWebhook.objects.filter(pk=hook.pk).update(secret=secret_seal(hook.secret))


def open_sealed_secrets(apps, schema_editor):
    from workflows.accounts.vault import SEALED_PREFIX, secret_open

    ClientWebhook = apps.get_model("workflows", "ClientWebhook")
    for hook in ClientWebhook.objects.filter(secret__startswith=SEALED_PREFIX):
        ClientWebhook.objects.filter(pk=hook.pk).update(secret=secret_open(hook.secret))


class Migration(migrations.Migration):

    dependencies = [
        ('workflows', '0018_caps_count_undo_work'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name='apitoken',
            name='expires_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='clientwebhook',
            name='previous_secret',
            field=models.TextField(blank=True, db_default='', default=''),
        ),
        migrations.AddField(
            model_name='clientwebhook',
            name='previous_until',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name='apitoken',
            name='user',
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='pilot_api_tokens', to=settings.AUTH_USER_MODEL),
        ),
        migrations.AlterField(
            model_name='clientwebhook',
            name='secret',
            field=models.TextField(),
        ),
        migrations.RunPython(seal_plain_secrets, open_sealed_secrets),
    ]
