"""Network faults on loopback for tests: a TCP proxy that, on command, accepts and never answers.

:class:`HangProxy` forwards bytes both ways between its clients and an
upstream (the local cluster's kube-apiserver; TLS passes through untouched,
so a kubeconfig pointing at the proxy authenticates as it would directly).
:meth:`HangProxy.hang` makes it the API server a half-open connection or a
wedged instance looks like to a client: connections stay open, what
clients send is read and dropped, nothing comes back, and new connections
are accepted and treated the same way. Without an upstream it hangs from
the start: a server that accepts and never answers.
"""

from __future__ import annotations

import socket
import threading


class HangProxy:
    """A loopback TCP proxy to ``upstream`` (``(host, port)``; None: hang from the start).

    Attributes:
        port: the port it listens on (127.0.0.1).
        accepted: connections accepted so far.
        hanging: set once it stopped forwarding.
    """

    def __init__(self, upstream: tuple[str, int] | None = None):
        self.upstream = upstream
        self.hanging = threading.Event()
        if upstream is None:
            self.hanging.set()
        self.accepted = 0
        self._closed = threading.Event()
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True, name="hang-proxy").start()

    @property
    def address(self) -> str:
        """``127.0.0.1:PORT``."""
        return f"127.0.0.1:{self.port}"

    def hang(self) -> None:
        """From now on forward nothing, either way, on open and new connections; keep every socket open."""
        self.hanging.set()

    def close(self) -> None:
        """Stop listening and close every connection."""
        self._closed.set()
        with self._lock:
            socks, self._socks = [self._listener, *self._socks], []
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def __enter__(self) -> "HangProxy":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _keep(self, s: socket.socket) -> None:
        with self._lock:
            self._socks.append(s)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self.accepted += 1
            self._keep(client)
            if self.hanging.is_set() or self.upstream is None:
                threading.Thread(target=self._pump, args=(client, None), daemon=True).start()
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=10)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            self._keep(server)
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket | None) -> None:
        """Copy ``src`` to ``dst`` until either closes; once hanging (or with no ``dst``), read and drop."""
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if dst is None or self.hanging.is_set():
                    continue  # swallowed: the peer waits for an answer that never comes
                dst.sendall(data)
        except OSError:
            pass
        if not self.hanging.is_set() and dst is not None:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
