"""The Celery app, configured from Django settings (the ``CELERY_`` names in base.py).

``celery -A openonce_site worker`` and ``beat`` are production daemons: without
DJANGO_SETTINGS_MODULE they run the production settings, which refuse to start without a
secret key and a ledger, never the dev settings with DEBUG on. Only ``manage.py`` (a
checkout's development tool) chooses the dev settings, and it does so before this module
is imported.
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "openonce_site.settings.production")

app = Celery("openonce")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["reconciler", "notifications"])
