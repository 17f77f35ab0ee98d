# Written by hand: the ledger's read models, moved here from the console (console 0006).
#
# State only: the models are unmanaged, so this creates no table. The core owns the
# tables and their schema (openonce_core/_schema.py): console 0001 installed them, and
# every migrate brings them to the core's current version (ledger.apps.upgrade_ledger).

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = []

    operations = [
        migrations.CreateModel(
            name="Effect",
            fields=[
                ("id", models.TextField(primary_key=True, serialize=False)),
                ("tool", models.TextField()),
                ("idempotency_key", models.TextField()),
                ("scope", models.TextField(null=True)),
                ("state", models.TextField()),
                ("args_json", models.TextField()),
                ("args_fingerprint", models.TextField()),
                ("provider_key", models.TextField()),
                ("attempt", models.IntegerField()),
                ("max_attempts", models.IntegerField()),
                ("fence", models.BigIntegerField()),
                ("lease_owner", models.TextField(null=True)),
                ("lease_expires_at", models.FloatField(null=True)),
                ("approvals_required", models.IntegerField()),
                ("approval_ttl", models.FloatField(null=True)),
                ("execution_status", models.TextField(null=True)),
                ("execution_evidence_json", models.TextField(null=True)),
                ("verification_status", models.TextField(null=True)),
                ("verification_evidence_json", models.TextField(null=True)),
                ("result_json", models.TextField(null=True)),
                ("error_json", models.TextField(null=True)),
                ("created_at", models.FloatField()),
                ("updated_at", models.FloatField()),
                ("next_probe_at", models.FloatField(null=True)),
            ],
            options={
                "db_table": "openonce_effects",
                "managed": False,
                "default_permissions": (),
            },
        ),
        migrations.CreateModel(
            name="JournalEntry",
            fields=[
                ("seq", models.BigAutoField(primary_key=True, serialize=False)),
                (
                    "effect",
                    models.ForeignKey(
                        db_column="effect_id",
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="journal",
                        to="ledger.effect",
                    ),
                ),
                ("at", models.FloatField()),
                ("from_state", models.TextField(null=True)),
                ("to_state", models.TextField()),
                ("actor", models.TextField()),
                ("reason", models.TextField()),
                ("evidence_json", models.TextField(null=True)),
                ("action", models.TextField()),
            ],
            options={
                "db_table": "openonce_journal",
                "ordering": ["seq"],
                "managed": False,
                "default_permissions": (),
            },
        ),
        migrations.CreateModel(
            name="Approval",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                (
                    "effect",
                    models.ForeignKey(
                        db_column="effect_id",
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="approvals",
                        to="ledger.effect",
                    ),
                ),
                ("decision", models.TextField()),
                ("decided_by", models.TextField()),
                ("reason", models.TextField()),
                ("args_fingerprint", models.TextField()),
                ("at", models.FloatField()),
                ("expires_at", models.FloatField(null=True)),
            ],
            options={
                "db_table": "openonce_approvals",
                "ordering": ["id"],
                "managed": False,
                "default_permissions": (),
            },
        ),
    ]
