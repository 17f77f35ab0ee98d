# Written by hand: the ledger's read models moved to the shared app (ledger 0001).
#
# State only, nothing in the database changes: the models were unmanaged, and the
# console keeps a proxy of ledger.Effect named Effect for its permissions. Their content
# type stays console.effect (a proxy's permissions use its own), so existing groups and
# the grants of their members are kept as they are.

from django.db import migrations

# The console's permissions as of this migration (console/roles.py PERMISSIONS).
PERMISSIONS = [
    ("view_ledger", "Can read effects, journals, provider capabilities and reconciler health"),
    ("approve_effect", "Can approve or deny effects that wait for approval"),
    ("resolve_effect", "Can resolve UNKNOWN and human-review effects as happened or not"),
    ("cancel_effect", "Can cancel effects that have not started"),
    ("override_rearm", "Can re-arm an effect although its provider says a miss is not evidence"),
    (
        "override_identity",
        "Can commit a receipt that names another effect's identity, with a reason",
    ),
    ("export_audit", "Can read and export the operator audit log"),
    ("clear_lockout", "Can see and clear sign-in lockouts"),
]


class Migration(migrations.Migration):
    dependencies = [
        ("console", "0005_clear_lockout"),
        ("ledger", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(name="Approval"),
                migrations.DeleteModel(name="JournalEntry"),
                migrations.DeleteModel(name="Effect"),
                migrations.CreateModel(
                    name="Effect",
                    fields=[],
                    options={
                        "proxy": True,
                        "default_permissions": (),
                        "permissions": PERMISSIONS,
                        "indexes": [],
                        "constraints": [],
                    },
                    bases=("ledger.effect",),
                ),
            ],
        ),
    ]
