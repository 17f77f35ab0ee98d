"""The console's permissions, on a proxy of the ledger's effect model.

The ledger's tables are mapped once, in the shared app (``ledger.models``), and read from
there. This proxy only carries what a person may decide in the console
(``console/roles.py``): its permissions keep the content type ``console.effect`` they have
had since the console's first migration, so existing groups and grants stay as they are.
"""

from __future__ import annotations

from ledger import models as ledger_models

from .roles import PERMISSIONS


class Effect(ledger_models.Effect):
    class Meta:
        proxy = True
        # Rows change only through the core, so Django's add/change/delete permissions
        # would mean nothing; the console's own permissions say what a person may decide.
        default_permissions = ()
        permissions = list(PERMISSIONS.items())
