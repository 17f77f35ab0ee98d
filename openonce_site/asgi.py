"""ASGI entry point (``uvicorn openonce_site.asgi:application``): production settings
unless DJANGO_SETTINGS_MODULE says otherwise, exactly like ``wsgi.py``."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "openonce_site.settings.production")

from django.core.asgi import get_asgi_application

application = get_asgi_application()
