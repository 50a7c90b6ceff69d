"""Triton's KServe v2 gRPC API (CONTRACT.md §5): the wire shapes as pure functions (`codec`) and
the `grpc.aio` server with its servicer (`service`).  Every request carries a native request, so
this package imports `frontend.native` (its parser and session) besides `frontend.common`; it
never imports `frontend.openai` or `frontend.server`.
"""
