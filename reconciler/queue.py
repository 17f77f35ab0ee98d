"""How many reconcile batches wait in the broker: the tick's backpressure and a metric.

The count is the broker's own (a passive queue declare through kombu): on Redis the length
of the ``openonce.batches`` list plus its priority lists (``openonce.batches\\x06\\x163``
and so on, which kombu adds for messages sent with a priority), under any
``global_keyprefix`` the transport options set. Messages a worker has taken but not yet
acknowledged are not counted: they are being worked on, not waiting.

``None`` means unknown — eager mode (tasks run inline, nothing is queued), or a broker
that could not be asked; callers then act as if the queue were short. It decides nothing
in the ledger (ARCHITECTURE.md, invariant 5): a wrong count only queues a batch too many
or one tick too few.
"""

from __future__ import annotations

import logging

from amqp.exceptions import ChannelError
from django.conf import settings
from kombu import Connection
from kombu.exceptions import KombuError

log = logging.getLogger("openonce.reconciler")

BATCH_QUEUE = "openonce.batches"
# Asked every tick and every scrape: a broker that does not answer within this is reported
# as unknown rather than holding up the tick (or the scrape) behind it.
CONNECT_TIMEOUT = 2.0


def depth() -> int | None:
    """Batches waiting in the ``openonce.batches`` queue; None when it cannot be known."""
    if getattr(settings, "CELERY_TASK_ALWAYS_EAGER", False):
        return None
    options = getattr(settings, "CELERY_BROKER_TRANSPORT_OPTIONS", None) or {}
    with Connection(
        settings.CELERY_BROKER_URL,
        connect_timeout=CONNECT_TIMEOUT,
        # A broker that accepts the connection and then never answers (a stopped Redis)
        # must not hold the tick either.
        transport_options={"socket_timeout": CONNECT_TIMEOUT, **options},
    ) as conn:
        try:
            conn.ensure_connection(
                max_retries=1, interval_start=0, interval_step=0, timeout=CONNECT_TIMEOUT
            )
            declared = conn.default_channel.queue_declare(queue=BATCH_QUEUE, passive=True)
        except ChannelError as exc:
            if str(exc.reply_code) == "404":
                # A passive declare of a queue the broker does not have: on Redis, a list
                # with no messages does not exist. Nothing waits.
                return 0
            _unreadable(exc)
            return None
        except (KombuError, *conn.connection_errors, *conn.channel_errors) as exc:
            _unreadable(exc)
            return None
    return int(declared.message_count)


def _unreadable(exc: BaseException) -> None:
    log.warning("could not read the depth of the %s queue: %r", BATCH_QUEUE, exc)
