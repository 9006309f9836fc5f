# PILOT, standalone: one image for the web, worker and dispatcher processes
# (compose.yaml starts them; docs/operations.md, "Docker"). The dependencies
# come from requirements.lock, every file checked against its hash.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    DJANGO_STATIC_ROOT=/app/staticfiles \
    PROMETHEUS_MULTIPROC_DIR=/run/pilot-metrics

WORKDIR /app
COPY requirements.lock ./
RUN pip install --require-hashes -r requirements.lock

COPY manage.py ./
COPY pilot ./pilot
COPY workflows ./workflows
COPY deploy ./deploy
# Static files, hashed and compressed, served by whitenoise from the image.
RUN DJANGO_SECRET_KEY=collectstatic-only-not-a-secret-0123456789abcdefghij \
    python manage.py collectstatic --noinput --verbosity 0 \
 && useradd --system --uid 10001 --home-dir /app pilot \
 && mkdir -p /run/pilot-metrics && chown pilot /run/pilot-metrics

USER pilot
# Inside a container gunicorn listens on every interface of the container (only
# its published port reaches it: compose.yaml publishes it on 127.0.0.1); outside
# one, deploy/gunicorn.conf.py binds 127.0.0.1 unless PILOT_BIND_HOST says otherwise.
ENV PILOT_BIND_HOST=0.0.0.0
EXPOSE 8000
# The web process; compose.yaml runs the same image as `run_workers` and
# `run_dispatcher`, and `migrate` once before them.
CMD ["gunicorn", "-c", "deploy/gunicorn.conf.py", "pilot.wsgi"]
