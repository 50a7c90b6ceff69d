"""The OpenAI-compatible API (CONTRACT.md §4): request parsing (`protocol`), response objects
and chunks (`format`), and the tornado routes with the request's life (`handlers`).

Imports `frontend.common` and never another protocol package or `frontend.server`.
"""
