# One image for every role: web (gunicorn), worker, beat and the migrate step.
FROM python:3.12-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY openonce_core ./openonce_core
COPY openonce_site ./openonce_site
COPY console ./console
COPY reconciler ./reconciler
COPY templates ./templates
COPY manage.py ./
RUN pip install --no-cache-dir ".[server]" \
    && DJANGO_SETTINGS_MODULE=openonce_site.settings.dev python manage.py collectstatic --noinput
RUN useradd --system openonce
USER openonce
EXPOSE 8000
CMD ["gunicorn", "openonce_site.wsgi", "--bind", "0.0.0.0:8000", "--workers", "3"]
