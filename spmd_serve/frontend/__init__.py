"""The front end: every public socket of the server, run on an IO thread of each HTTP worker
process (`spmd_serve.http_worker`; PUSH_MODE_HTTP_WORKERS of them on the master node), which
reaches rank 0's engine through an `EngineClient` (`engine.remote_client` over INTER_PROC_PORT; the
in-process `engine.client` in the tests with a fake engine).

Packages, lowest first; each imports only from the ones above it in this list:

* `text`   - tokenizer, chat templates, detokenizer, stop strings (no protocol, no tornado);
* `common` - what every protocol shares: `ProtocolError` and `Limits`, the POST base handler,
             `Generation` (one engine request), the liveness rules;
* `native`, `openai`, `triton` - one package per protocol (`triton` carries native requests, so
             it imports `native`; no other protocol imports another);
* `server` - the leaf: the IO thread and its apps, `IOSettings`, health, metrics, OpenAPI,
             the peer watch; it wires the protocols together.

`tests/test_frontend_layers.py` checks these rules and that there is no import cycle.
"""
