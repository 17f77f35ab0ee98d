"""The whole behavioural suite in one namespace, for a module that runs it again elsewhere.

tests/core/test_pgbouncer.py imports it (``from behaviour.suite import *``) to run every
section on Postgres behind pgbouncer. Not collected itself: its name is not test_*.
"""

from .test_approvals import *  # noqa: F403
from .test_async import *  # noqa: F403
from .test_concurrency import *  # noqa: F403
from .test_construction import *  # noqa: F403
from .test_decisions import *  # noqa: F403
from .test_evidence import *  # noqa: F403
from .test_failure_classes import *  # noqa: F403
from .test_handler_context import *  # noqa: F403
from .test_keys import *  # noqa: F403
from .test_leases import *  # noqa: F403
from .test_ledger import *  # noqa: F403
from .test_replay import *  # noqa: F403
from .test_secrets import *  # noqa: F403
from .test_write_failures import *  # noqa: F403
