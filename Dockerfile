# One image for every taskgate process; the compose file picks the module per container.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app
COPY requirements.lock pyproject.toml README.md ./
RUN pip install --no-cache-dir -r requirements.lock
COPY . .
RUN pip install --no-cache-dir --no-deps -e . && useradd --create-home --uid 10001 taskgate \
    && mkdir -p /data /run/taskgate/secrets && chown taskgate /data /run/taskgate/secrets
USER taskgate
ENV TASKGATE_DATA_DIR=/data TASKGATE_LOG_FORMAT=json
# Overridden per service in docker-compose.yml.
CMD ["python", "-m", "services.scheduler"]
