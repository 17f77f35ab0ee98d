"""The ledger as every Django app of the project reads and reaches it.

The console, the daemon (``reconciler``) and the notifier share this app, so none of them
imports another's models or the project package (``openonce_site``):

* ``ledger.models``: the ledger's tables mapped for reading (unmanaged; the core owns them);
* ``ledger.clients``: the one ``OpenOnce`` client, ``Reconciler`` and ``Grace`` per process,
  through which every change is made (ARCHITECTURE.md invariant 1);
* ``ledger.apps``: the core's schema applied on every ``migrate``, and no Django SQLite
  connection across a ``fork``;
* ``ledger.logsafe`` and ``ledger.net``: the web helpers the console and the project both
  use (one-line log records, the client address behind trusted proxies).

This app imports no other app of the project (tests/core/test_state_table.py checks it).
"""
