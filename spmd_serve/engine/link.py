"""The HTTP workers' connections as rank 0's engine thread sees them: `Link`, one non-blocking
socket with framed JSON messages (engine/wire.py) in and out, and `LinkPoller`, the listening
socket on 127.0.0.1 with every link and a wake-up pipe behind one `select`.

The engine thread must never block on a worker: `read()` takes what the kernel has, `send()`
queues the frame and writes what the socket accepts now, `flush()` writes more later (the hub
calls it on every turn and when the socket turns writable).  A worker that stops reading until
MAX_BACKLOG bytes wait for it is treated as gone: holding its outputs would grow rank 0 without
bound.
"""

from __future__ import annotations

import selectors
import socket

from spmd_serve.engine.wire import FrameDecoder, Message, WireError, encode

MAX_BACKLOG = 256 << 20  # bytes queued for one worker before it counts as stuck
_READ_CHUNK = 1 << 18


class LinkClosed(Exception):
    """The worker closed the connection, sent something that is not ours, or stopped reading."""


class Link:
    """A connected, authenticated or not yet authenticated, worker socket."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # a token is a few dozen bytes
        self.sock = sock
        self.worker: int | None = None  # set once its hello is accepted
        self.pid = 0
        self._decoder = FrameDecoder()
        self._out = bytearray()

    def fileno(self) -> int:
        return self.sock.fileno()

    @property
    def wants_write(self) -> bool:
        return bool(self._out)

    def read(self) -> list[Message]:
        """Every whole message the kernel holds now; LinkClosed at EOF or on a bad frame."""
        msgs: list[Message] = []
        while True:
            try:
                data = self.sock.recv(_READ_CHUNK)
            except (BlockingIOError, InterruptedError):
                return msgs
            except OSError as e:
                raise LinkClosed(str(e)) from None
            if not data:
                if msgs:  # deliver what came before the EOF; the next read reports it
                    return msgs
                raise LinkClosed("connection closed")
            try:
                msgs += self._decoder.feed(data)
            except WireError as e:
                raise LinkClosed(str(e)) from None
            if len(data) < _READ_CHUNK:
                return msgs

    def send(self, msg: Message) -> None:
        self._out += encode(msg)
        self.flush()

    def flush(self) -> None:
        """Write what the socket takes now; LinkClosed if the worker is gone or not reading."""
        while self._out:
            try:
                sent = self.sock.send(self._out)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as e:
                raise LinkClosed(str(e)) from None
            del self._out[:sent]
        if len(self._out) > MAX_BACKLOG:
            raise LinkClosed(f"{len(self._out)} bytes wait for a worker that does not read")

    def flush_blocking(self, timeout: float) -> None:
        """At shutdown: write everything queued, waiting at most `timeout` seconds."""
        try:
            self.sock.settimeout(timeout)
            self.sock.sendall(self._out)
            self._out.clear()
            self.sock.setblocking(False)
        except OSError:  # gone or closed already: nobody to tell
            pass

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class LinkPoller:
    """Accepts links on 127.0.0.1:port and tells which are readable or writable."""

    def __init__(self, port: int) -> None:
        self._listener = socket.create_server(("127.0.0.1", port))
        self.port: int = self._listener.getsockname()[1]
        self._wake_r, self._wake_w = socket.socketpair()
        self._sel = selectors.DefaultSelector()
        for s in (self._listener, self._wake_r, self._wake_w):
            s.setblocking(False)
        self._sel.register(self._listener, selectors.EVENT_READ)
        self._sel.register(self._wake_r, selectors.EVENT_READ)

    def wake(self) -> None:
        """From any thread or a signal handler: end a `poll` now."""
        try:
            self._wake_w.send(b"\0")
        except OSError:  # the pipe is full (a wake is pending anyway) or closed at shutdown
            pass

    def poll(self, timeout: float) -> tuple[list[Link], list[tuple[Link, int]]]:
        """(links accepted now, (link, selector events) of the others that have something)."""
        new: list[Link] = []
        ready: list[tuple[Link, int]] = []
        for key, events in self._sel.select(timeout):
            if key.fileobj is self._listener:
                new += self._accept()
            elif key.fileobj is self._wake_r:
                self._drain_wake()
            elif isinstance(key.fileobj, Link):
                ready.append((key.fileobj, events))
        return new, ready

    def update(self, link: Link) -> None:
        """Wait for the link to turn writable exactly while it has bytes queued."""
        self._sel.modify(link, selectors.EVENT_READ | (selectors.EVENT_WRITE if link.wants_write else 0))

    def forget(self, link: Link) -> None:
        self._sel.unregister(link)
        link.close()

    def close(self) -> None:
        self._sel.close()
        for s in (self._listener, self._wake_r, self._wake_w):
            s.close()

    def _accept(self) -> list[Link]:
        links: list[Link] = []
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return links
            links.append(Link(sock))
            self._sel.register(links[-1], selectors.EVENT_READ)

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass
