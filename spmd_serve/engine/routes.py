"""Which HTTP worker owns which request, on rank 0's hub (engine/frontend_hub.py).

A request is known to the engine by its req_id (unique over all workers: that is the 409 rule)
and to its worker by the worker's own number `n` (engine/wire.py).  `Routes` maps both ways, so
that outputs go to their worker under its number, a worker's abort names the engine's request,
and a worker that goes away leaves the list of its requests to abort.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from typing import Generic, TypeVar

Owner = TypeVar("Owner", bound=Hashable)  # a worker's connection


class Routes(Generic[Owner]):
    def __init__(self) -> None:
        self._owner: dict[str, tuple[Owner, int]] = {}  # req_id -> (owner, its number)
        self._by_owner: dict[Owner, dict[int, str]] = {}

    def __len__(self) -> int:
        return len(self._owner)

    def __contains__(self, req_id: object) -> bool:
        return req_id in self._owner

    def __iter__(self) -> Iterator[str]:
        return iter(self._owner)

    def connect(self, owner: Owner) -> None:
        self._by_owner[owner] = {}

    def connected(self, owner: Owner) -> bool:
        return owner in self._by_owner

    def owners(self) -> list[Owner]:
        return list(self._by_owner)

    def add(self, owner: Owner, n: int, req_id: str) -> None:
        self._owner[req_id] = (owner, n)
        self._by_owner[owner][n] = req_id

    def get(self, req_id: str) -> tuple[Owner, int] | None:
        return self._owner.get(req_id)

    def pop(self, req_id: str) -> None:
        """The request finished: forget it."""
        owner, n = self._owner.pop(req_id)
        self._by_owner[owner].pop(n, None)

    def pop_number(self, owner: Owner, n: int) -> str | None:
        """The worker aborted its request `n`: its req_id, or None if it is gone already."""
        req_id = self._by_owner[owner].pop(n, None)
        if req_id is not None:
            del self._owner[req_id]
        return req_id

    def disconnect(self, owner: Owner) -> list[str]:
        """The worker went away: the req_ids it had in flight, forgotten."""
        requests = self._by_owner.pop(owner, {})
        for req_id in requests.values():
            del self._owner[req_id]
        return list(requests.values())
