# Written by hand: the console's four roles as groups with their permissions.

from django.db import migrations


def create_roles(apps, schema_editor):
    # The role table lives in console.roles so the migration and the tests agree; it
    # only touches auth and contenttypes models, whose shape these migrations pin.
    from console.roles import sync_roles

    sync_roles(apps)


class Migration(migrations.Migration):
    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("console", "0002_permissions"),
    ]

    # Groups are kept on rollback: people may already be assigned to them.
    operations = [migrations.RunPython(create_roles, migrations.RunPython.noop)]
