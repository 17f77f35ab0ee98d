# Written by hand: the permission to see and clear sign-in lockouts from the console,
# given to the admin role, and the append-only record of every clearing.

from django.db import migrations

# Who cleared which name (and address), when and why. The console's own table, not the
# ledger's journal (a lockout is no effect); like the journal, the database refuses to
# change or delete a row (OWASP ASVS 16.4.2: the app cannot rewrite its audit records).
_POSTGRES = [
    """
    CREATE TABLE IF NOT EXISTS console_lockout_clearings (
        id bigserial PRIMARY KEY,
        at double precision NOT NULL,
        actor text NOT NULL,
        username text NOT NULL,
        address text NOT NULL DEFAULT '',
        reason text NOT NULL DEFAULT ''
    )
    """,
    """
    CREATE OR REPLACE FUNCTION console_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        RAISE EXCEPTION 'openonce: % is append-only', TG_TABLE_NAME;
    END $$
    """,
    "DROP TRIGGER IF EXISTS console_lockout_clearings_append_only ON console_lockout_clearings",
    """
    CREATE TRIGGER console_lockout_clearings_append_only
        BEFORE UPDATE OR DELETE ON console_lockout_clearings
        FOR EACH ROW EXECUTE FUNCTION console_refuse_change()
    """,
]
_SQLITE = [
    """
    CREATE TABLE IF NOT EXISTS console_lockout_clearings (
        id integer PRIMARY KEY AUTOINCREMENT,
        at real NOT NULL,
        actor text NOT NULL,
        username text NOT NULL,
        address text NOT NULL DEFAULT '',
        reason text NOT NULL DEFAULT ''
    )
    """,
    *(
        f"""
        CREATE TRIGGER IF NOT EXISTS console_lockout_clearings_{op.lower()}_refused
            BEFORE {op} ON console_lockout_clearings
        BEGIN SELECT RAISE(ABORT, 'openonce: console_lockout_clearings is append-only'); END
        """
        for op in ("UPDATE", "DELETE")
    ),
]


def sync(apps, schema_editor):
    from console.roles import sync_roles

    sync_roles(apps)


def create_record(apps, schema_editor):
    statements = _POSTGRES if schema_editor.connection.vendor == "postgresql" else _SQLITE
    # Straight to a cursor: the schema editor would read the PL/pgSQL "%" as a placeholder.
    with schema_editor.connection.cursor() as cursor:
        for statement in statements:
            cursor.execute(statement)


class Migration(migrations.Migration):
    dependencies = [
        ("console", "0004_override_identity"),
    ]

    # On rollback the groups and the record are kept: people may be assigned to the
    # groups, and an audit record is not the app's to delete.
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
                    ("clear_lockout", "Can see and clear sign-in lockouts"),
                ],
            },
        ),
        migrations.RunPython(sync, migrations.RunPython.noop),
        migrations.RunPython(create_record, migrations.RunPython.noop),
    ]
