"""The Celery app: a default queue for bookkeeping and a ``gpu`` queue for model work.

Every value read from the environment comes through Django's settings (``CELERY_*``, mnesio_site/settings.py);
they are read lazily, since this module is imported while the settings module itself loads.
"""
from __future__ import annotations

import os

from celery import Celery
from celery.signals import celeryd_after_setup, worker_init, worker_process_init
from kombu import Queue

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mnesio_site.settings")

app = Celery("mnesio")
app.config_from_object("django.conf:settings", namespace="CELERY")

app.conf.update(
    task_queues=(Queue("default"), Queue("gpu")),
    task_default_queue="default",
    # Model work goes to the gpu queue, served by workers that hold the model; bookkeeping stays
    # on default. Erasure processing recompiles every affected cartridge, so it is model work too.
    task_routes={
        "cartridges.tasks.cartridge_compile_task": {"queue": "gpu"},
        "cartridges.tasks.cartridge_evaluate_task": {"queue": "gpu"},
        # auto-refresh: compile + gate + activation of a scope after appends (cartridges/services/refresh.py)
        "cartridges.tasks.cartridge_refresh_task": {"queue": "gpu"},
        "cartridges.tasks.cartridge_full_gate_task": {"queue": "gpu"},
        "cartridges.tasks.cartridge_answer_task": {"queue": "gpu"},
        "cartridges.tasks.routed_chunks_compile_task": {"queue": "gpu"},
        "memories.tasks.erasure_request_process_task": {"queue": "gpu"},
        "cartridges.tasks.cartridge_activate_task": {"queue": "default"},
        "cartridges.tasks.cartridge_blobs_sweep_task": {"queue": "default"},
        "cartridges.tasks.answer_requests_sweep_task": {"queue": "default"},
    },
    # Acknowledge only after the task finished: a worker killed mid-compile leaves the
    # message unacked, so the broker delivers it again (tasks are idempotent, see cartridges.tasks).
    task_acks_late=True,
    # A task whose worker process died (kill -9, OOM) is rejected back onto the queue
    # instead of being acked and silently dropped.
    task_reject_on_worker_lost=True,
    # One message at a time per worker process: a compile takes minutes, and prefetched
    # messages would sit behind it (and be held hostage by a worker that dies).
    worker_prefetch_multiplier=1,
    # Redis's visibility timeout (broker_transport_options) comes from settings: CELERY_VISIBILITY_TIMEOUT.
    # Keep trying to reach the broker on start instead of exiting (Redis restarts).
    broker_connection_retry_on_startup=True,
    # Task arguments are ids, never plaintext; JSON keeps them inspectable.
    task_serializer="json",
    accept_content=["json"],
    result_serializer="json",
    # Results are only for callers that wait; expire them so Redis does not grow.
    result_expires=3600,
    # Report STARTED so operators can see running compiles.
    task_track_started=True,
    # A worker recycles a child after many tasks to bound memory growth from model work.
    worker_max_tasks_per_child=200,
    # Logging is Django's LOGGING (JSON lines with the request and task ids, core/observability.py): the worker
    # keeps it instead of installing its own plain handler on the root logger.
    worker_hijack_root_logger=False,
)

# Periodic work (run `celery -A mnesio_site beat` next to the workers).
app.conf.beat_schedule = {
    # The reconciler for lost broker messages: an erasure request left `requested`/`keys_shredded` past
    # its grace period (memories.services.erasure_requeue_grace_s) is sent again; processing is idempotent.
    "erasure-requests-requeue": {
        "task": "memories.tasks.erasure_requests_requeue_task",
        "schedule": 300.0,
        # a run that waited past the next one is redundant: no pile-up while no worker consumes `default`
        "options": {"queue": "default", "expires": 290},
    },
    # Answer requests never collected expire (MNESIO_ANSWER_REQUEST_TTL_S): a sealed question and answer
    # must not outlive their caller's interest, an erasure or a master-key rotation's retired key.
    "answer-requests-sweep": {
        "task": "cartridges.tasks.answer_requests_sweep_task",
        "schedule": 300.0,
        "options": {"queue": "default", "expires": 290},
    },
}

app.autodiscover_tasks()


@worker_init.connect
def master_key_refuse_unknown(**kwargs: object) -> None:
    """Refuse to start a worker whose master key does not open the keys already stored, naming the variable.

    A worker with the wrong key would fail every task that opens a key and, worse, wrap new keys (answer
    requests, blob keys) that the right processes can never open. It checks before the pool forks, then
    closes its connection (a forked child must not share it).
    """
    import logging

    import django
    from django.db import DatabaseError, connections

    django.setup()
    from memories.crypto import MasterKeyUnavailable
    from memories.keyring import master_key_verify

    try:
        report = master_key_verify()
    except DatabaseError as exc:
        # the database is down or not migrated: start anyway (like the broker, it may come back); the check
        # before each process's first wrap (memories.keyring.master_key_verify_once) still refuses to write
        logging.getLogger("mnesio").warning("master key not verified at worker start: %s", type(exc).__name__)
        return
    finally:
        connections.close_all()
    if not report.ok:
        import sys

        print(f"mnesio worker refused to start: {report.message()}", file=sys.stderr, flush=True)
        raise SystemExit(f"refused to start: {MasterKeyUnavailable.__name__}: `MNESIO_MASTER_KEY` does not open the stored keys")


_GPU_WORKER = [False]  # set before the pool forks; every process of the worker inherits it


@celeryd_after_setup.connect
def gpu_worker_note(sender: object = None, instance: object = None, **kwargs: object) -> None:
    """Remember whether this worker consumes the gpu queue (after -Q is applied, before the pool forks)."""
    queues = getattr(getattr(getattr(getattr(instance, "app", None), "amqp", None), "queues", None), "consume_from", None) or {}
    _GPU_WORKER[0] = "gpu" in queues


@worker_process_init.connect
def gpu_worker_warm(**kwargs: object) -> None:
    """Load the active configuration's model in each process of a gpu worker as it starts, so that the first task
    (an auto-refresh a user waits for) does not pay for it. ``MNESIO_WORKER_WARMUP=false`` turns it off; a failure
    is logged and the first task loads the model itself. Default-queue workers stay model-free."""
    import logging

    from django.conf import settings
    from django.db import connections

    if not _GPU_WORKER[0] or not settings.MNESIO_WORKER_WARMUP:
        return

    log = logging.getLogger("cartridges")
    try:
        from cartridges import engine
        from cartridges.selectors import active_configuration

        config = active_configuration()
        engine.backend_for(config)
        log.info("gpu worker process warmed: model loaded for configuration %s", config.key())
    except Exception as exc:  # the database or the model store may be down at start; the first task retries
        log.warning("gpu worker process not warmed (%s); the first task loads the model", type(exc).__name__)
    finally:
        connections.close_all()
