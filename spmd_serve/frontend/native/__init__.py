"""The native protocol (CONTRACT.md §3): request parsing and the response shapes (`protocol`),
one request's life independent of its transport (`session`, also carried by `frontend.triton`),
and the tornado handler of `POST /v1/chat/completions` (`handler`).

Imports `frontend.common` and never another protocol package or `frontend.server`.
"""
