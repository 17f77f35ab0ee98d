"""Console URLs. Permissions (console.*): every page needs view_ledger; approve and deny
need approve_effect; resolve-* need resolve_effect (an override also override_rearm);
cancel needs cancel_effect; the audit log and its exports need export_audit; the sign-in
lockouts page and clearing a lockout need clear_lockout. A run's timeline and the effects
list's exports need view_ledger, as the list does.

The site's URLconf sets ``handler403 = "console.views.permission_denied"``: a refusal is
logged as one line, not a traceback."""

from django.urls import path

from . import lockouts, views

urlpatterns = [
    path("", views.queue, name="queue"),
    path("effects/", views.effect_list, name="effects"),
    # Before effects/<id>/: "effects.csv" is no effect id.
    path("effects.csv", views.effects_export, {"fmt": "csv"}, name="effects-csv"),
    path("effects.json", views.effects_export, {"fmt": "json"}, name="effects-json"),
    path("run/", views.run_timeline, name="run"),
    path("effects/bulk/", views.bulk_preview, name="bulk"),
    path("effects/bulk/apply/", views.bulk_apply, name="bulk-apply"),
    path("effects/<str:effect_id>/", views.effect_detail, name="effect"),
    path("effects/<str:effect_id>/approve/", views.approve, name="approve"),
    path("effects/<str:effect_id>/deny/", views.deny_effect, name="deny"),
    path(
        "effects/<str:effect_id>/resolve-happened/",
        views.resolve_happened,
        name="resolve-happened",
    ),
    path(
        "effects/<str:effect_id>/resolve-not-happened/",
        views.resolve_not_happened,
        name="resolve-not-happened",
    ),
    path("effects/<str:effect_id>/cancel/", views.cancel, name="cancel"),
    path(
        "effects/<str:effect_id>/journal.csv",
        views.effect_journal_export,
        {"fmt": "csv"},
        name="effect-journal-csv",
    ),
    path(
        "effects/<str:effect_id>/journal.json",
        views.effect_journal_export,
        {"fmt": "json"},
        name="effect-journal-json",
    ),
    path("capabilities/", views.capabilities, name="capabilities"),
    path("reconciler/", views.reconciler_panel, name="reconciler"),
    path("audit/", views.audit, name="audit"),
    path("audit.csv", views.audit_export, {"fmt": "csv"}, name="audit-csv"),
    path("audit.json", views.audit_export, {"fmt": "json"}, name="audit-json"),
    path("lockouts/", lockouts.lockouts, name="lockouts"),
    path("lockouts/clear/", lockouts.clear, name="lockout-clear"),
]
