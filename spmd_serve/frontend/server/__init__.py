"""An HTTP worker's IO server, the leaf of the front end: the IO thread and its tornado apps (`app`), its
settings (`settings`), the health routes (`health`), `/metrics` (`metrics_service`), the OpenAPI
document (`openapi`) and the watch over the node's other ranks (`peer_watch`).

It wires the protocol packages together; nothing in `frontend.common`, `frontend.text` or a
protocol package imports it.
"""
