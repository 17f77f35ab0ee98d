"""An IMAP4rev1 server over TLS on 127.0.0.1 (a free port): the commands the sent-folder
client sends, in IMAP's wire format, and the ways mail servers fail.

Speaks CAPABILITY, LOGIN, LIST (plain, and ``RETURN (SPECIAL-USE)`` when it advertises
LIST-EXTENDED), EXAMINE/SELECT, UID SEARCH HEADER, UID FETCH of header fields, NOOP and
LOGOUT. Mailboxes hold (uid, Message-ID) pairs; ``special_use`` names the mailbox marked
``\\Sent`` (None: no mailbox is marked). HEADER search matches substrings, as real
servers do.

Faults: ``password`` (a wrong one gets ``NO [AUTHENTICATIONFAILED]``), ``drop_after_login``
(the connection closes mid-session), ``delay`` before every answer, ``capabilities``;
``greeting`` instead of the ``* OK`` one (a ``* BYE`` closes the connection);
``login_refusal``, a tagged answer every LOGIN gets instead of OK (``NO [UNAVAILABLE] ...``,
Gmail's ``NO [ALERT] Too many simultaneous connections. (Failure)``); ``max_sessions``,
Dovecot's per-user connection limit (``mail_max_userip_connections``): a LOGIN beyond it
gets ``* BYE Maximum number of connections from user+IP exceeded`` and the connection
closes. ``sessions`` counts the logged-in connections open now, ``peak_sessions`` the most
at once. ``index_lag``: a message ``add_sent`` files is found by SEARCH only that many
seconds later on ``clock`` (a provider's sent store indexing asynchronously).
Its certificate comes from ``tests.support.tls.make_pki``.
"""

from __future__ import annotations

import re
import socket
import socketserver
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any

from .tls import LocalPKI

_ARG = re.compile(r'"((?:[^"\\]|\\.)*)"|\(([^)]*)\)|(\S+)')


def _args(text: str) -> list[str]:
    out = []
    for quoted, group, atom in _ARG.findall(text):
        if quoted or (not group and not atom):
            out.append(re.sub(r"\\(.)", r"\1", quoted))
        elif group:
            out.append(f"({group})")
        else:
            out.append(atom)
    return out


def _quote(name: str) -> str:
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


class FakeImapServer:
    def __init__(
        self,
        pki: LocalPKI,
        *,
        username: str = "prober@example.com",
        password: str = "app-password",
        mailboxes: dict[str, list[str]] | None = None,
        special_use: str | None = "Sent Items",
        capabilities: str = "IMAP4rev1 LIST-EXTENDED SPECIAL-USE AUTH=PLAIN",
        index_lag: float = 0.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.pki = pki
        self.username = username
        self.password = password
        self.mailboxes = mailboxes if mailboxes is not None else {"INBOX": [], "Sent Items": []}
        self.special_use = special_use
        self.capabilities = capabilities
        self.index_lag = index_lag
        self.clock = clock
        # (mailbox, uid) -> when SEARCH starts finding it; messages not listed: at once.
        self._searchable_at: dict[tuple[str, int], float] = {}
        self.delay = 0.0
        self.drop_after_login = False
        self.login_refusal: str | None = None
        self.greeting: str | None = None  # instead of "* OK ...": e.g. a "* BYE ..." and hang up
        self.max_sessions: int | None = None
        self.sessions = 0
        self.peak_sessions = 0
        self.lock = threading.Lock()
        self.commands: list[str] = []  # every command line, passwords masked
        self.logins = 0
        self._server: socketserver.ThreadingTCPServer | None = None

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> FakeImapServer:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.pki.cert_file, self.pki.key_file)
        fake = self

        class Handler(socketserver.StreamRequestHandler):
            # An answer is several small writes: without TCP_NODELAY each waits for the
            # client's delayed ACK (tens of ms), as no real IMAP server makes it wait.
            disable_nagle_algorithm = True

            def setup(self) -> None:
                try:
                    self.request = context.wrap_socket(self.request, server_side=True)
                except (ssl.SSLError, OSError):
                    self.request.close()  # the client refused our certificate
                    raise
                super().setup()

            def handle(self) -> None:
                logged_in = [False]
                try:
                    fake._session(self.rfile, self.wfile, logged_in)
                finally:
                    if logged_in[0]:
                        with fake.lock:
                            fake.sessions -= 1

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a refused handshake or a hung-up client is part of the tests

        self._server = Server(("127.0.0.1", 0), Handler)
        server = self._server
        threading.Thread(
            target=lambda: server.serve_forever(poll_interval=0.01), daemon=True
        ).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeImapServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.server_address[1])

    def add_sent(self, message_id: str, mailbox: str | None = None) -> int:
        box = mailbox or self.special_use or "Sent"
        with self.lock:
            self.mailboxes.setdefault(box, []).append(message_id)
            uid = len(self.mailboxes[box])
            self._searchable_at[(box, uid)] = self.clock() + self.index_lag
            return uid

    # -- the protocol -------------------------------------------------------------------

    def _session(self, rfile: Any, wfile: Any, logged_in: list[bool]) -> None:
        def send(line: str | bytes) -> None:
            if self.delay:
                time.sleep(self.delay)
            wfile.write(line if isinstance(line, bytes) else (line + "\r\n").encode())
            wfile.flush()

        if self.greeting is not None:
            send(self.greeting)
            if self.greeting.startswith("* BYE"):
                return
        else:
            send(f"* OK [CAPABILITY {self.capabilities}] fake IMAP ready")
        selected: str | None = None
        while True:
            try:
                raw = rfile.readline()
            except (OSError, ssl.SSLError):
                return
            if not raw:
                return
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            tag, _, rest = line.partition(" ")
            command, _, tail = rest.partition(" ")
            command = command.upper()
            masked = line if command != "LOGIN" else f"{tag} LOGIN {tail.split(' ')[0]} ***"
            with self.lock:
                self.commands.append(masked)
            if command == "CAPABILITY":
                send(f"* CAPABILITY {self.capabilities}")
                send(f"{tag} OK CAPABILITY completed")
            elif command == "NOOP":
                send(f"{tag} OK NOOP completed")
            elif command == "LOGIN":
                user, password = [*_args(tail), "", ""][:2]
                with self.lock:
                    self.logins += 1
                if user != self.username or password != self.password:
                    send(f"{tag} NO [AUTHENTICATIONFAILED] Invalid credentials (Failure)")
                    continue
                if self.login_refusal is not None:
                    send(f"{tag} {self.login_refusal}")
                    continue
                with self.lock:
                    full = self.max_sessions is not None and self.sessions >= self.max_sessions
                    if not full:
                        self.sessions += 1
                        self.peak_sessions = max(self.peak_sessions, self.sessions)
                        logged_in[0] = True
                if full:
                    send(
                        "* BYE Maximum number of connections from user+IP exceeded"
                        f" (mail_max_userip_connections={self.max_sessions})"
                    )
                    return
                if self.drop_after_login:
                    send(f"{tag} OK LOGIN completed")
                    return  # hang up: the next command finds a closed connection
                send(f"{tag} OK LOGIN completed")
            elif command == "LIST":
                special = "RETURN (SPECIAL-USE)" in tail.upper()
                for name in sorted(self.mailboxes):
                    flags = ["\\HasNoChildren"]
                    if name == self.special_use and (special or "SPECIAL-USE" in self.capabilities):
                        flags.append("\\Sent")
                    send(f'* LIST ({" ".join(flags)}) "/" {_quote(name)}')
                send(f"{tag} OK LIST completed")
            elif command in ("SELECT", "EXAMINE"):
                name = (_args(tail) or [""])[0]
                if name not in self.mailboxes:
                    send(f"{tag} NO [NONEXISTENT] Unknown Mailbox: {name}")
                    continue
                selected = name
                send(f"* {len(self.mailboxes[name])} EXISTS")
                mode = "READ-ONLY" if command == "EXAMINE" else "READ-WRITE"
                send(f"{tag} OK [{mode}] {command} completed")
            elif command == "UID":
                self._uid(tag, tail, selected, send)
            elif command == "LOGOUT":
                send("* BYE fake IMAP logging out")
                send(f"{tag} OK LOGOUT completed")
                return
            else:
                send(f"{tag} BAD unknown command {command}")

    def _uid(self, tag: str, tail: str, selected: str | None, send: Any) -> None:
        if selected is None:
            send(f"{tag} BAD no mailbox selected")
            return
        sub, _, rest = tail.partition(" ")
        messages = self.mailboxes[selected]
        if sub.upper() == "SEARCH":
            args = _args(rest)
            needle = args[-1].lower() if args else ""
            now = self.clock()
            hits = [
                str(i + 1)
                for i, m in enumerate(messages)
                if needle in m.lower() and self._searchable_at.get((selected, i + 1), now) <= now
            ]
            send("* SEARCH" + "".join(f" {h}" for h in hits))
            send(f"{tag} OK SEARCH completed")
        elif sub.upper() == "FETCH":
            uid = int(rest.split(" ")[0])
            header = f"Message-ID: {messages[uid - 1]}\r\n\r\n".encode()
            intro = f"* {uid} FETCH (UID {uid} BODY[HEADER.FIELDS (MESSAGE-ID)] {{{len(header)}}}"
            send(intro.encode() + b"\r\n" + header + b")\r\n")
            send(f"{tag} OK FETCH completed")
        else:
            send(f"{tag} BAD unknown UID command")


def free_port() -> int:
    """A port nothing listens on (to test a refused connection)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
