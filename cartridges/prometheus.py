"""Prometheus exposition through prometheus_client: the ``kv_metrics()`` figures, plus answer-latency histograms.

The figures of ``cartridges.metrics.kv_metrics()`` come from the database, so any process can report them: a
collector turns one such dict into metric families on a per-request registry. Answer latency is kept as
process-level histograms, observed where an answer is recorded, which sum across processes: with
``PROMETHEUS_MULTIPROC_DIR`` set (gunicorn or Celery prefork) each process writes its samples there and the
scrape reads them all back; otherwise the scrape reports this process's own.

Scrapes also get the request-latency histogram per route (``mnesio_http_request_duration_seconds``,
core.observability) and ``mnesio_queue_depth{queue}``: the messages waiting in the broker for ``gpu`` and
``default``, read at scrape time (0 on the embedded default, where tasks run in-process). A broker that does
not answer leaves that family without samples (and a warning in the log) rather than failing the scrape.
No memory text, question or answer ever appears here: only counts, ids, sizes and timings.
"""
from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from prometheus_client import CollectorRegistry, Histogram, generate_latest, multiprocess
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.registry import Collector

from core.observability import HTTP_REQUEST_DURATION
from kvengine import ANSWER_MODES

log = logging.getLogger("cartridges")

# The text format scrapers and the existing dashboards read (version 0.0.4).
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
MODES = ANSWER_MODES  # defined once, in the engine
# 5 ms (a warm cartridge's first token on a GPU) to 60 s (a long text re-read on CPU), roughly x2-x2.5 per step.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0)

# Not in prometheus_client's global registry: each scrape builds its own (see registry_for()).
ANSWER_TTFT = Histogram(
    "mnesio_answer_ttft_seconds", "Time to the first answer token, per mode, observed by the answering process.",
    ["mode"], buckets=LATENCY_BUCKETS, registry=None,
)
ANSWER_TOTAL = Histogram(
    "mnesio_answer_total_seconds", "Total answer time, per mode, observed by the answering process.",
    ["mode"], buckets=LATENCY_BUCKETS, registry=None,
)
for _mode in MODES:  # both modes are exposed from the start, at zero, so rate() has a series to work on
    ANSWER_TTFT.labels(mode=_mode)
    ANSWER_TOTAL.labels(mode=_mode)


def answer_observe(*, mode: str, ttft_s: float | None, total_s: float) -> None:
    """Count one recorded answer in the latency histograms of this process."""
    if ttft_s is not None:
        ANSWER_TTFT.labels(mode=mode).observe(ttft_s)
    ANSWER_TOTAL.labels(mode=mode).observe(total_s)


class KvMetricsCollector(Collector):
    """The metric families of one ``kv_metrics()`` dict (names kept from the hand-written exposition)."""

    def __init__(self, data: dict[str, Any]):
        self.data = data

    def collect(self) -> Iterator[Metric]:
        data = self.data
        info = InfoMetricFamily("mnesio_kv_configuration", "The active KV configuration (value is always 1).",
                                labels=["backend", "model", "dtype", "quant", "device"])
        config = data.get("configuration")
        if config:
            info.add_metric([str(config[k]) for k in ("backend", "model", "dtype", "quant", "device")], {})
        yield info
        yield GaugeMetricFamily("mnesio_log_head", "The newest position in the memory log.", value=data["log_head"])
        yield from self._scopes(data["scopes"])

        gate = CounterMetricFamily("mnesio_gate_evaluations", "Gate evaluations by outcome.", labels=["outcome"])
        gate.add_metric(["passed"], data["gate"]["passed"])
        gate.add_metric(["failed"], data["gate"]["failed"])
        yield gate

        latency = GaugeMetricFamily(
            "mnesio_answer_latency_seconds",
            f"Answer latency percentiles over the last {data['latency']['window']} answers per mode "
            "(the histograms mnesio_answer_*_seconds sum across processes).",
            labels=["mode", "measure", "quantile"],
        )
        answers = GaugeMetricFamily("mnesio_answer_latency_window_answers", "Answers in the latency window, per mode.",
                                    labels=["mode"])
        for mode in MODES:
            summary = data["latency"][mode]
            answers.add_metric([mode], summary["count"])
            for measure in ("ttft", "total"):
                for p, quantile in (("50", "0.5"), ("95", "0.95")):
                    value = summary[f"{measure}_p{p}_s"]
                    if value is not None:
                        latency.add_metric([mode, measure, quantile], value)
        yield latency
        yield answers

        versions = GaugeMetricFamily("mnesio_cartridge_versions", "Cartridge versions by state.", labels=["state"])
        for state in ("compiled", "active", "failed", "destroyed"):
            versions.add_metric([state], data["versions"][state])
        yield versions

        blobs = GaugeMetricFamily("mnesio_cartridge_blobs", "Stored (not destroyed) cartridge blobs per quant.",
                                  labels=["quant"])
        blob_bytes = GaugeMetricFamily("mnesio_cartridge_blob_bytes", "Bytes of stored cartridge blobs per quant.",
                                       labels=["quant"])
        for row in data["sizes_by_quant"]:
            blobs.add_metric([row["quant"]], row["count"])
            blob_bytes.add_metric([row["quant"]], row["total_bytes"])
        yield blobs
        yield blob_bytes

        erasures = GaugeMetricFamily("mnesio_erasure_requests", "Erasure requests by status.", labels=["status"])
        for status in ("pending", "done", "failed"):
            erasures.add_metric([status], data["erasures"][status])
        yield erasures
        asks = data.get("asks")
        if asks is not None:
            yield GaugeMetricFamily("mnesio_answer_slots_held", "Answer slots this web process holds now.",
                                    value=asks["in_flight"])
            yield GaugeMetricFamily("mnesio_answer_slots_limit", "MNESIO_MAX_WAITING_ASKS of this process.",
                                    value=asks["limit"])
            yield GaugeMetricFamily("mnesio_async_asks_pending", "Async asks this web process filed that wait for "
                                    "an answer.", value=asks["async_pending"])

    @staticmethod
    def _scopes(rows: list[dict[str, Any]]) -> Iterator[Metric]:
        """Per-scope families; the active version's figures only for scopes that have one."""
        def family(name: str, help_text: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, help_text, labels=["scope"])

        activated = family("mnesio_scope_activated", "1 if the scope has ever had a version activated.")
        serving = family("mnesio_scope_serving", "1 if the scope's active version matches the active configuration.")
        lag = family("mnesio_scope_lag_memories", "Memories of the scope appended after its active version's head.")
        lag_s = family("mnesio_scope_lag_seconds", "Age of the scope's oldest memory its active cartridge does not serve (0: none).")
        head = family("mnesio_scope_active_log_head", "Log head the scope's active version was compiled at.")
        tokens = family("mnesio_scope_active_tokens", "Tokens in the scope's active cartridge.")
        size = family("mnesio_scope_active_size_bytes", "Blob size of the scope's active cartridge.")
        age = family("mnesio_scope_active_age_seconds", "Age of the scope's active cartridge version.")
        for row in rows:
            scope, version = [row["scope"]], row["active_version"]
            activated.add_metric(scope, 1 if row["activated_version_id"] else 0)
            serving.add_metric(scope, 1 if row["serving"] else 0)
            lag.add_metric(scope, row["lag"])
            lag_s.add_metric(scope, float(row.get("lag_s") or 0.0))
            if version:
                head.add_metric(scope, version["log_head"])
                tokens.add_metric(scope, version["num_tokens"])
                size.add_metric(scope, version["size_bytes"])
                age.add_metric(scope, float(version["age_s"]))
        yield from (activated, serving, lag, lag_s, head, tokens, size, age)


# The queues whose depth is reported (mnesio_site/celery.py declares them).
QUEUES = ("gpu", "default")
BROKER_TIMEOUT_S = 2.0


def queue_depths() -> dict[str, int] | None:
    """Messages waiting per Celery queue: 0s when tasks run in-process, None when the broker does not answer."""
    from celery import current_app
    from kombu.exceptions import OperationalError

    app = current_app._get_current_object()
    if app.conf.task_always_eager or not app.conf.broker_url:
        return {queue: 0 for queue in QUEUES}
    depths: dict[str, int] = {}
    conn = app.connection_for_read()
    try:
        conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0, timeout=BROKER_TIMEOUT_S)
        for queue in QUEUES:
            channel = conn.channel()  # a refused passive declare may close its channel: one per queue
            try:  # kombu's own count (Redis: every priority list of the queue)
                depths[queue] = channel.queue_declare(queue=queue, passive=True).message_count
            except conn.channel_errors:  # an empty queue has no list in Redis: nothing waits
                depths[queue] = 0
            finally:
                channel.close()
    except (OperationalError, *conn.connection_errors) as exc:
        log.warning("queue depth not read: the broker does not answer (%s)", type(exc).__name__)
        return None
    finally:
        conn.release()
    return depths


class QueueDepthCollector(Collector):
    """``mnesio_queue_depth{queue}`` at scrape time (see the module docstring)."""

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily("mnesio_queue_depth", "Messages waiting in the broker per Celery queue "
                                   "(gpu: model work; 0 when tasks run in-process).", labels=["queue"])
        for queue, depth in (queue_depths() or {}).items():
            family.add_metric([queue], depth)
        yield family


def registry_for(data: dict[str, Any], *, histograms: bool = True) -> CollectorRegistry:
    """A registry for one scrape: the ``kv_metrics()`` figures plus, with ``histograms``, the latency histograms
    (every process's in multiprocess mode, this one's otherwise)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(KvMetricsCollector(data))
    if histograms and settings.PROMETHEUS_MULTIPROC_DIR:
        multiprocess.MultiProcessCollector(registry, path=settings.PROMETHEUS_MULTIPROC_DIR)
    elif histograms:
        registry.register(ANSWER_TTFT)
        registry.register(ANSWER_TOTAL)
        registry.register(HTTP_REQUEST_DURATION)
    if histograms:  # the queues hold every scope's work: operators only, like the histograms
        registry.register(QueueDepthCollector())
    return registry


def render(data: dict[str, Any], *, histograms: bool = True) -> bytes:
    """Render a ``kv_metrics()`` dict and (with ``histograms``) the latency histograms as Prometheus text (0.0.4).

    The histograms count every scope's answers, so only operators get them: a client's view is its own scopes'.
    """
    return generate_latest(registry_for(data, histograms=histograms))
