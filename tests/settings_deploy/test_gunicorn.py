"""The production web process for real: gunicorn with deploy/gunicorn.conf.py,
production settings, static files from whitenoise after collectstatic, HTTPS
redirect except for the scrape endpoint."""

import http.client
import json
import socket
import subprocess
import sys
import time

import pytest

from tests.settings_deploy.test_check_deploy import production_env
from tests.support.procs import ROOT, Proc

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SCRAPE_TOKEN = "gunicorn-test-scrape-token"


def get(port, path, **headers):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", path, headers={"Host": "pilot.example.com", **headers})
    response = conn.getresponse()
    body = response.read()
    conn.close()
    return response, body


@pytest.fixture
def web(tmp_path):
    port = free_port()
    env = production_env(DATABASE_URL=f"sqlite:///{tmp_path}/db.sqlite3",
                         DJANGO_STATIC_ROOT=str(tmp_path / "static"), PORT=str(port),
                         PILOT_BIND_HOST="127.0.0.1", WEB_CONCURRENCY="2",
                         PILOT_METRICS_TOKEN=SCRAPE_TOKEN)
    env.pop("REDIS_URL")
    for args in (["migrate", "-v0"], ["createcachetable"], ["collectstatic", "--noinput", "-v0"]):
        subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, check=True,
                       timeout=120, capture_output=True)
    proc = Proc(f"gunicorn-{port}", [sys.executable, "-m", "gunicorn", "-c",
                                     "deploy/gunicorn.conf.py", "pilot.wsgi"], env).start()
    deadline = time.monotonic() + 30
    while True:
        try:
            get(port, "/metrics")
            break
        except OSError:
            if time.monotonic() > deadline or not proc.alive:
                pytest.fail("gunicorn did not start:\n" + proc.log()[-3000:])
            time.sleep(0.2)
    yield port, tmp_path / "static"
    proc.stop()


def test_gunicorn_serves_hashed_static_files_and_metrics_behind_a_tls_proxy(web):
    port, static_root = web
    manifest = json.loads((static_root / "staticfiles.json").read_text())["paths"]
    hashed = manifest["admin/css/base.css"]
    assert hashed != "admin/css/base.css"
    response, body = get(port, f"/static/{hashed}", **{"X-Forwarded-Proto": "https",
                                                       "Accept-Encoding": "gzip"})
    assert response.status == 200
    assert "immutable" in response.getheader("Cache-Control")
    assert response.getheader("Content-Encoding") == "gzip"
    assert response.getheader("Strict-Transport-Security") == "max-age=31536000"
    # Plain HTTP is sent to HTTPS, except the scrape endpoint.
    response, _ = get(port, "/admin/login/")
    assert response.status == 301
    assert response.getheader("Location") == "https://pilot.example.com/admin/login/"
    response, body = get(port, "/admin/login/", **{"X-Forwarded-Proto": "https"})
    assert response.status == 200
    assert response.getheader("Strict-Transport-Security") == "max-age=31536000"
    assert "Secure" in response.getheader("Set-Cookie")
    # Production without a token would answer 403 (workflows/observability/views.py).
    response, body = get(port, "/metrics", Authorization=f"Bearer {SCRAPE_TOKEN}")
    assert response.status == 200
    assert b'pilot_tasks{state="pending"} 0.0' in body
    assert b"pilot_database_up 1.0" in body
