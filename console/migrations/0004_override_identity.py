# Written by hand: the permission to commit a receipt whose identity contradicts the
# effect's (journaled with its reason), given to the admin role.

from django.db import migrations


def sync(apps, schema_editor):
    from console.roles import sync_roles

    sync_roles(apps)


class Migration(migrations.Migration):
    dependencies = [
        ("console", "0003_roles"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="effect",
            options={
                "default_permissions": (),
                "managed": False,
                "permissions": [
                    (
                        "view_ledger",
                        "Can read effects, journals, provider capabilities and reconciler health",
                    ),
                    ("approve_effect", "Can approve or deny effects that wait for approval"),
                    (
                        "resolve_effect",
                        "Can resolve UNKNOWN and human-review effects as happened or not",
                    ),
                    ("cancel_effect", "Can cancel effects that have not started"),
                    (
                        "override_rearm",
                        "Can re-arm an effect although its provider says a miss is not evidence",
                    ),
                    (
                        "override_identity",
                        "Can commit a receipt that names another effect's identity, with a reason",
                    ),
                    ("export_audit", "Can read and export the operator audit log"),
                ],
            },
        ),
        migrations.RunPython(sync, migrations.RunPython.noop),
    ]
