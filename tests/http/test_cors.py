"""Pages of another origin may call the service port (server/cors.py), as vLLM's defaults allow:
a browser's preflight is answered without the API key, and every answer to a request that names
an Origin (results, streams, errors, unknown paths) says that any origin may read it."""

from __future__ import annotations

import json

import requests

ORIGIN = {"Origin": "http://ui.example"}


def test_a_preflight_is_answered_on_every_endpoint_without_the_key(make_server):
    srv = make_server(api_key="s3cret")
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/no/such/path"):
        r = requests.options(
            srv.base + path,
            headers={
                **ORIGIN,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization, content-type",
            },
            timeout=10,
        )
        assert r.status_code == 204, (path, r.status_code, r.text)
        assert r.headers["Access-Control-Allow-Origin"] == "*"
        assert "POST" in r.headers["Access-Control-Allow-Methods"].split(", ")
        assert r.headers["Access-Control-Allow-Headers"] == "authorization, content-type"
        assert int(r.headers["Access-Control-Max-Age"]) > 0
        assert r.content == b""
    # the key still guards the request itself
    r = requests.post(srv.base + "/v1/completions", json={"model": "m", "prompt": "a"}, headers=ORIGIN, timeout=10)
    assert r.status_code == 401 and r.headers["Access-Control-Allow-Origin"] == "*"


def test_a_plain_options_request_lists_the_methods(srv):
    r = requests.options(srv.url, timeout=10)
    assert r.status_code == 204 and r.headers["Allow"] == "GET, POST, OPTIONS"
    assert "Access-Control-Allow-Origin" not in r.headers and "Access-Control-Allow-Methods" not in r.headers


def test_answers_name_any_origin_only_when_asked(srv):
    body = {"text": "hi", "max_dec_len": 3}
    plain = requests.post(srv.url, json=body, timeout=10)
    assert plain.status_code == 200 and "Access-Control-Allow-Origin" not in plain.headers
    cross = requests.post(srv.url, json=body, headers=ORIGIN, timeout=10)
    assert cross.status_code == 200 and cross.headers["Access-Control-Allow-Origin"] == "*"
    assert cross.json()["result"] == plain.json()["result"]
    with requests.post(srv.url, json={**body, "stream": True}, headers=ORIGIN, stream=True, timeout=10) as r:
        assert r.headers["Access-Control-Allow-Origin"] == "*"
        assert json.loads(list(r.iter_lines())[-1])["is_end"] == 1
    bad = requests.post(srv.url, json={"text": 5}, headers=ORIGIN, timeout=10)
    assert bad.status_code == 400 and bad.headers["Access-Control-Allow-Origin"] == "*"
    models = requests.get(srv.base + "/v1/models", headers=ORIGIN, timeout=10)
    assert models.status_code == 200 and models.headers["Access-Control-Allow-Origin"] == "*"
