# One image for every streamrec role (pass builder, pserver, trainer, Airflow tasks, serving).
FROM python:3.11-slim-bookworm
WORKDIR /app
COPY pyproject.toml README.md ./
COPY streamrec streamrec
COPY streaming streaming
COPY trainers trainers
COPY serving_export serving_export
COPY demo demo
COPY configs configs
COPY dags dags
RUN pip install --no-cache-dir -e ".[airflow]"
ENV STREAMREC_CONFIG=/app/configs/pipeline.docker.yaml
