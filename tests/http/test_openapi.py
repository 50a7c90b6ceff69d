"""`GET /openapi.json` (CONTRACT.md §4): the document matches the live routes and is valid
OpenAPI, and schemathesis, driven by it, finds no 5xx and no undocumented status code.

The big schemathesis run is against the in-process Harness (real IOServer, fake engine: fast and
deterministic); a small one runs against `mpirun -n 2 spmd_serve` on the demo model, where real
tokenisation, chat template and limits apply.  Streaming is left out of both (a schema variant
whose `stream` can only be false, plus a filter for the negative cases that flip it).
"""

from __future__ import annotations

import copy
import math
from typing import Any

import jsonschema_rs
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, assume, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from spmd_serve.frontend.server.app import make_service_app
from spmd_serve.frontend.server.openapi import openapi_document
from spmd_serve.frontend.server.settings import IOSettings
from tests.support.fakes import Harness, assert_healthy
from tests.support.server_process import ServerProcess

# Small budgets keep every fake generation a few milliseconds long.
SETTINGS = {"max_seq_len": 64, "max_dec_len": 8, "model_max_len": 80}
SHORT_TIMEOUT_S = 5.0  # a native `timeout` under this may legitimately end in 504


@pytest.fixture(scope="module")
def harness():
    h = Harness(step_s=0.0005, **SETTINGS)
    yield h
    h.close()


def fetch(base: str) -> dict[str, Any]:
    r = requests.get(base + "/openapi.json", timeout=10)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("application/json")
    return r.json()


# ---- (a) the document ------------------------------------------------------------------------
def test_document_is_valid_openapi_and_every_schema_is_valid_json_schema(harness):
    doc = fetch(harness.base)
    assert doc == openapi_document(harness.server.settings)  # served as built, JSON-clean
    schemathesis.openapi.from_dict(doc).validate()  # the OpenAPI 3.1 meta-schema
    for name, schema in doc["components"]["schemas"].items():
        assert jsonschema_rs.meta.is_valid(schema), name


def test_paths_are_exactly_the_service_routes(harness):
    h = harness
    app = make_service_app(h.client, h.tokenizer, h.server.settings)
    routes = {rule.matcher.regex.pattern.rstrip("$") for rule in app.wildcard_router.rules}
    # the document's templated path for the route's group
    assert set(fetch(h.base)["paths"]) == {r.replace("(.+)", "{name}") for r in routes}


def test_each_get_answers_as_documented(harness):
    doc = fetch(harness.base)
    for path, ops in doc["paths"].items():
        if "get" not in ops:
            continue
        r = requests.get(harness.base + path.replace("{name}", "default"), timeout=10)
        assert r.status_code == 200, path
        if "content" not in ops["get"]["responses"]["200"]:  # (documented as no body: /health_generate)
            assert r.content == b"", path
            continue
        content = ops["get"]["responses"]["200"]["content"]
        if "text/plain" in content:  # (SGLang's /flush_cache)
            assert r.headers["Content-Type"].startswith("text/plain") and r.text, path
            continue
        schema = content["application/json"]["schema"]
        validator = jsonschema_rs.validator_for({**schema, "components": doc["components"]})
        validator.validate(r.json())
        assert "head" not in ops or requests.head(harness.base + path, timeout=10).ok


def test_limits_and_names_come_from_the_settings(harness):
    schemas = fetch(harness.base)["components"]["schemas"]
    native = schemas["NativeRequest"]["properties"]
    assert native["max_dec_len"]["maximum"] == SETTINGS["max_dec_len"]
    assert native["input_ids"]["maxItems"] == SETTINGS["max_seq_len"]
    assert schemas["ChatCompletionRequest"]["properties"]["model"]["enum"] == ["default"]


def test_api_key_adds_security_and_401():
    without, keyed = openapi_document(IOSettings()), openapi_document(IOSettings(api_key="k"))
    chat, models = "/v1/chat/completions", "/v1/models"
    assert "401" not in without["paths"][chat]["post"]["responses"]
    assert "securitySchemes" not in without["components"]
    assert "401" in keyed["paths"][chat]["post"]["responses"]
    assert keyed["paths"][models]["get"]["security"] == [{"bearer": []}]
    assert "security" not in keyed["paths"]["/health"]["get"]  # probes stay open
    h = Harness(api_key="k", **SETTINGS)
    try:
        doc = fetch(h.base)  # the document itself needs no key
        r = requests.post(h.base + "/v1/completions", json={"model": "default", "prompt": "a"}, timeout=10)
        assert r.status_code == 401
        assert "401" in doc["paths"]["/v1/completions"]["post"]["responses"]
    finally:
        h.close()


# ---- bodies that once gave a 500 (found while fuzzing) -----------------------------------------
BIG = "1" + "0" * 400  # a JSON integer beyond float's range
ODD_BODIES = [
    ("/v1/chat/completions", '{"text": "hi", "temperature": %s}' % BIG),
    ("/v1/chat/completions", '{"text": "hi", "timeout": %s}' % BIG),
    ("/v1/chat/completions", '{"text": "hi", "frequency_score": -1e400}'),  # json gives -inf
    ("/v1/completions", '{"model": "default", "prompt": "hi", "temperature": %s}' % BIG),
    (
        "/v1/chat/completions",
        '{"model": "default", "messages": [{"role": "user", "content": "hi"}], "temperature": %s}' % BIG,
    ),
    ("/v1/completions", '{"model": "default", "prompt": [%s]}' % BIG),  # decoded too early
    ("/v1/chat/completions", "[" * 100000 + "]" * 100000),  # RecursionError
    ("/v1/completions", '{"a": ' * 50000 + "1" + "}" * 50000),
    ("/v1/chat/completions", '{"text": "\\ud800 lone surrogate", "max_dec_len": 2}'),
    ("/v1/chat/completions", '{"req_id": "\\udfff", "text": 5}'),  # echoed in the error
    ("/v1/completions", '{"model": "default", "prompt": "\\ud800", "max_tokens": 2}'),
]


@pytest.mark.parametrize("path,body", ODD_BODIES, ids=range(len(ODD_BODIES)))
def test_odd_bodies_are_400(harness, path, body):
    r = requests.post(harness.base + path, data=body.encode(), timeout=10)
    assert r.status_code == 400, r.text
    assert r.json()


def test_a_surrogate_pair_is_fine(harness):
    body = b'{"text": "\\ud83d\\ude00", "max_dec_len": 2}'  # one emoji, escaped
    r = requests.post(harness.url, data=body, timeout=10)
    assert r.status_code == 200 and r.json()["tokens_all_num"] == 2


# ---- (b) schemathesis ------------------------------------------------------------------------
def no_server_error(ctx: Any, response: Any, case: Any) -> None:
    """not_a_server_error, except a 504 that the request's own short `timeout` asked for."""
    body = case.body if isinstance(case.body, dict) else {}
    t = body.get("timeout")
    if (
        response.status_code == 504
        and "model" not in body
        and isinstance(t, (int, float))
        and not isinstance(t, bool)
        and math.isfinite(t)
        and t < SHORT_TIMEOUT_S
    ):
        return None
    return not_a_server_error(ctx, response, case)


CHECKS = [no_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


def non_streaming(doc: dict[str, Any]) -> Any:
    """The document with `stream` pinned to false, loaded by schemathesis."""
    doc = copy.deepcopy(doc)
    for name in ("NativeRequest", "CompletionRequest", "ChatCompletionRequest", "ResponsesRequest", "MessagesRequest"):
        doc["components"]["schemas"][name]["properties"]["stream"] = {"enum": [False, None]}
    return schemathesis.openapi.from_dict(doc)


def fuzz(base: str, positive: int, negative: int, timeout: float) -> dict[str, int]:
    """Every operation of the server at `base` with `positive` schema-valid and `negative`
    schema-invalid cases (none for operations without a body: nothing to break); returns how
    many responses each (operation, status) got.
    Written with hypothesis directly: schemathesis' lazy pytest fixture loader does not work
    with pytest 9."""
    seen: dict[str, int] = {}
    for result in non_streaming(fetch(base)).get_all_operations():
        op = result.ok()
        modes = [(GenerationMode.POSITIVE, positive)]
        if op.body and negative:
            modes.append((GenerationMode.NEGATIVE, negative))
        for mode, n in modes:

            @given(case=op.as_strategy(generation_mode=mode))
            @settings(
                max_examples=n, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
            )
            def run(case: Any) -> None:
                # negative cases may still flip `stream` to true: streaming is not fuzzed here
                assume(not (isinstance(case.body, dict) and case.body.get("stream") is True))
                r = case.call_and_validate(base_url=base, checks=CHECKS, timeout=timeout)
                key = f"{op.label} {r.status_code}"  # noqa: B023  (run() is called right below)
                seen[key] = seen.get(key, 0) + 1

            run()
    return seen


POSTS = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/chat/completions/completions",
    "/v1/chat/completions/chat/completions",
    "/v1/responses",
    "/v1/messages",
)


def test_schemathesis_fake_engine(harness):
    seen = fuzz(harness.base, 40, 25, timeout=30)
    print(seen)
    assert sum(seen.values()) >= 250
    assert all(f"POST {p} 200" in seen for p in POSTS), seen  # not only refusals
    assert_healthy(harness)


@pytest.fixture(scope="module")
def real_server(served_tp2, tmp_path_factory):
    with ServerProcess(
        2, served_tp2, tmp_path_factory.mktemp("logs") / "server.log", MAX_SEQ_LEN="128", MAX_DEC_LEN="8"
    ) as srv:
        yield srv


@pytest.mark.mpi
def test_schemathesis_mpi_server(real_server):
    base = f"http://127.0.0.1:{real_server.http_port}"
    # ~1 in 4 schema-valid completions bodies is answered 200 here (the schema cannot say the prompt's
    # length in tokens or the vocabulary size): 12 drawn cases had a 3 % chance of none, which a schema
    # change once drew (session 61); 24 make it ~0.1 %
    seen = fuzz(base, 24, 8, timeout=60)
    print(seen)
    assert all(f"POST {p} 200" in seen for p in POSTS), seen
    assert real_server.proc.poll() is None, real_server.log()[-3000:]
    assert requests.get(base + "/v2/health/ready", timeout=10).status_code == 200
