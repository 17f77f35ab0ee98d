"""Who may do what in the console: the permissions and the four roles that bundle them.

Roles are Django groups, so an administrator assigns people with the ordinary auth tools
(``manage.py shell``, or any admin they install). The permissions live on the unmanaged
``console.Effect`` model (``Meta.permissions``); the data migration creates the groups
through ``sync_roles`` and tests call it again after a flush.
"""

from __future__ import annotations

from typing import Any

from django.apps import apps as global_apps

APP_LABEL = "console"

# codename -> what it lets a person do (the permission's name in the database).
PERMISSIONS: dict[str, str] = {
    "view_ledger": "Can read effects, journals, provider capabilities and reconciler health",
    "approve_effect": "Can approve or deny effects that wait for approval",
    "resolve_effect": "Can resolve UNKNOWN and human-review effects as happened or not",
    "cancel_effect": "Can cancel effects that have not started",
    "override_rearm": "Can re-arm an effect although its provider says a miss is not evidence",
    "override_identity": "Can commit a receipt that names another effect's identity, with a reason",
    "export_audit": "Can read and export the operator audit log",
    "clear_lockout": "Can see and clear sign-in lockouts",
}

VIEW = f"{APP_LABEL}.view_ledger"
APPROVE = f"{APP_LABEL}.approve_effect"
RESOLVE = f"{APP_LABEL}.resolve_effect"
CANCEL = f"{APP_LABEL}.cancel_effect"
OVERRIDE_REARM = f"{APP_LABEL}.override_rearm"
OVERRIDE_IDENTITY = f"{APP_LABEL}.override_identity"
EXPORT_AUDIT = f"{APP_LABEL}.export_audit"
CLEAR_LOCKOUT = f"{APP_LABEL}.clear_lockout"

# Approving and resolving are separate roles on purpose: the person who lets a refund run
# is not, by default, the one who decides what happened to it afterwards.
ROLES: dict[str, tuple[str, ...]] = {
    "viewer": ("view_ledger",),
    "operator": ("view_ledger", "resolve_effect", "cancel_effect"),
    "approver": ("view_ledger", "approve_effect"),
    "admin": tuple(PERMISSIONS),
}


def sync_roles(apps: Any = global_apps) -> None:
    """Create the permissions and the role groups, and set each group's permissions.

    ``apps`` is a migration's historical registry or the live one. Idempotent. The
    permissions are created here rather than left to ``post_migrate`` because that signal
    runs after every migration, too late for the groups that need them.
    """
    content_type_model = apps.get_model("contenttypes", "ContentType")
    permission_model = apps.get_model("auth", "Permission")
    group_model = apps.get_model("auth", "Group")
    content_type, _ = content_type_model.objects.get_or_create(app_label=APP_LABEL, model="effect")
    permissions = {}
    for codename, name in PERMISSIONS.items():
        permission, _ = permission_model.objects.get_or_create(
            content_type=content_type, codename=codename, defaults={"name": name}
        )
        permissions[codename] = permission
    for role, codenames in ROLES.items():
        group, _ = group_model.objects.get_or_create(name=role)
        group.permissions.set([permissions[c] for c in codenames])
