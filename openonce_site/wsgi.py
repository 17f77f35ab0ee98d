"""WSGI entry point for gunicorn: ``gunicorn openonce_site.wsgi``."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "openonce_site.settings.production")
application = get_wsgi_application()
