"""`spmd_serve bench`: an asyncio load generator for OpenAI-compatible servers and spmd_serve's
native and gRPC protocols, with vLLM's metric definitions (metrics.py), synthetic prompts of exact
token lengths (prompts.py), one module per concern: backends.py (a request per protocol),
runner.py (concurrency, Poisson arrivals, sweeps, the server's step phases), report.py (table,
JSON, PNG plots) and cli.py (the command line)."""
