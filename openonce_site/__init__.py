"""The Django project: the operator console and the reconciler daemon on Celery."""

from .celery import app as celery_app

__all__ = ["celery_app"]
