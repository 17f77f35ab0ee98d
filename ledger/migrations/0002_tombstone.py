# Written by hand: the read model of the retention's key tombstones (schema v5; indexed
# by effect id in v7). State only, like 0001: the core owns the table.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("ledger", "0001_initial")]

    operations = [
        migrations.CreateModel(
            name="Tombstone",
            fields=[
                (
                    "pk",
                    models.CompositePrimaryKey(
                        "tool",
                        "idempotency_key",
                        blank=True,
                        editable=False,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
                ("tool", models.TextField()),
                ("idempotency_key", models.TextField()),
                ("effect_id", models.TextField()),
                ("state", models.TextField()),
                ("args_fingerprint", models.TextField()),
                ("created_at", models.FloatField()),
                ("archived_at", models.FloatField()),
                ("archive", models.TextField()),
            ],
            options={
                "db_table": "openonce_tombstones",
                "managed": False,
                "default_permissions": (),
            },
        ),
    ]
