"""docker-compose.yml parses and runs every service (it cannot be started here: no Docker engine)."""

from __future__ import annotations

import yaml

from tests.support.procs import REPO

MODULES = {
    "scheduler": "services.scheduler",
    "pending-registry": "services.pending_registry",
    "telemetry-agent": "services.telemetry_agent",
    "notifier": "services.notifier",
    "gateway-http": "gateway_http",
}


def test_compose_names_every_service_and_postgres() -> None:
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    services = compose["services"]
    assert set(MODULES) | {"postgres"} <= set(services)
    for name, module in MODULES.items():
        assert services[name]["command"] == ["python", "-m", module], name
        env = services[name]["environment"]
        for db in ("SCHEDULER", "PENDING", "NOTIFIER", "GATEWAY"):
            assert env[f"TASKGATE_{db}_DB_URL"].startswith("postgresql://")
    assert services["gateway-http"]["ports"] == ["127.0.0.1:8080:8080"]
    assert (REPO / "Dockerfile").exists() and (REPO / "deploy" / "postgres-init.sql").exists()


def test_compose_turns_on_internal_tls_secrets_and_healthchecks() -> None:
    services = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
    assert services["init"]["command"][-3:] == ["admin", "secrets", "init"]
    for name in MODULES:
        service = services[name]
        env = service["environment"]
        assert env["TASKGATE_TLS_CLIENT_AUTH"] == "true", name
        for key in ("TASKGATE_TLS_CERT_FILE", "TASKGATE_TLS_KEY_FILE", "TASKGATE_TLS_CA_FILE", "TASKGATE_SECRETS_DIR"):
            assert env[key].startswith("/run/taskgate/"), (name, key)
        assert any(v.startswith("secrets:/run/taskgate/secrets") for v in service["volumes"]), name
        assert service["restart"] == "unless-stopped", name
        assert service["healthcheck"]["test"], name
        assert service["depends_on"]["init"]["condition"] == "service_completed_successfully", name


def test_compose_scrapes_every_service_metrics_port() -> None:
    from libs.settings import Settings

    services = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
    prometheus = services["prometheus"]
    assert "./deploy/prometheus.yml:/etc/prometheus/prometheus.yml:ro" in prometheus["volumes"]
    assert prometheus["ports"] == ["127.0.0.1:9090:9090"]
    config = yaml.safe_load((REPO / "deploy" / "prometheus.yml").read_text())
    targets = {t for job in config["scrape_configs"] for c in job["static_configs"] for t in c["targets"]}
    defaults = Settings()
    ports = {
        "scheduler": defaults.scheduler_metrics_port,
        "pending-registry": defaults.pending_metrics_port,
        "telemetry-agent": defaults.telemetry_metrics_port,
        "notifier": defaults.notifier_metrics_port,
        "gateway-http": defaults.gateway_metrics_port,
    }
    assert targets == {f"{name}:{port}" for name, port in ports.items()}
    for name in MODULES:
        # Inside its container a service's /metrics must be reachable from the prometheus one.
        assert services[name]["environment"]["TASKGATE_METRICS_HOST"] == "0.0.0.0", name
