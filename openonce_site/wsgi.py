"""WSGI entry point for gunicorn: ``gunicorn openonce_site.wsgi``.

Production settings unless DJANGO_SETTINGS_MODULE says otherwise. The package's
``__init__`` imports the Celery app, which makes the same choice, so whichever module
runs first, no production server can fall back to the dev settings.
"""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "openonce_site.settings.production")

from django.core.wsgi import get_wsgi_application

application = get_wsgi_application()
