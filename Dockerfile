# One image for every role: web (gunicorn), worker, beat and the migrate step. It installs
# the wheel built from this checkout with the pinned versions of deploy/constraints.txt,
# exactly as tests/deploy/test_stack.py does, and runs from /srv/openonce, outside the
# installed package.

FROM python:3.12-slim AS build
WORKDIR /src
COPY . .
RUN pip install --no-cache-dir --constraint deploy/constraints.txt setuptools \
    && pip wheel --no-deps --no-build-isolation --wheel-dir /dist .

FROM python:3.12-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    DJANGO_SETTINGS_MODULE=openonce_site.settings.production \
    OPENONCE_STATE_DIR=/srv/openonce
COPY --from=build /dist /dist
COPY deploy/constraints.txt /dist/constraints.txt
RUN pip install --no-cache-dir --constraint /dist/constraints.txt \
        "$(ls /dist/openonce-*.whl)[server]" \
    && useradd --system --home-dir /srv/openonce --create-home openonce
WORKDIR /srv/openonce
# Hashed, compressed static files for WhiteNoise, collected into the image (they change
# only with the code). collectstatic reads no secret: a throwaway key satisfies the
# production settings' start-up check.
RUN OPENONCE_SECRET_KEY="build-only-$(python -c 'import secrets; print(secrets.token_urlsafe(64))')" \
    OPENONCE_DATABASE=/tmp/collectstatic.db \
    django-admin collectstatic --noinput \
    && rm -f /tmp/collectstatic.db*
USER openonce
EXPOSE 8000
# Plain HTTP on 8000 inside the network, behind the proxy (docker-compose.yml).
ENV OPENONCE_TLS=proxy
CMD ["gunicorn", "openonce_site.wsgi", "--bind", "0.0.0.0:8000", "--workers", "3", "--graceful-timeout", "30"]
