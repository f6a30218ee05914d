"""Where alerts go once the tick has decided one is due (``AlertRaised``).

- **Google Cloud**: the event itself is the delivery: the publisher puts every
  ``mtc.alerts.raised.v1`` on the ``mtc-alerts`` Pub/Sub topic (its family), where a person's
  subscription (email, chat, PagerDuty through a push endpoint) picks it up.
- **Locally**: ``MTC_ALERT_WEBHOOK`` (a URL) gets each alert as a JSON POST
  (:func:`payload`), from a background thread, with a per-try timeout and retries with
  backoff, so a slow or dead webhook never holds up the control loop (the bus only queues
  it). A process that exits waits at most ``flush_s`` for what is still queued.
- **The console**: ``GET /alerts.json`` lists the alerts (``services.observability.http``).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import queue
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from shared.domain.events import AlertRaised, Envelope

log = logging.getLogger("mtc.alerts")
WEBHOOK_ENV = "MTC_ALERT_WEBHOOK"


def payload(envelope: Envelope) -> dict[str, Any]:
    """The webhook body: the alert's fields, its CloudEvent id and time."""
    event = envelope.event
    assert isinstance(event, AlertRaised)
    return {"id": envelope.id, "time": envelope.time, "type": envelope.type, **event.to_dict()}


def post_json(url: str, body: Mapping[str, Any], timeout_s: float) -> int:
    data = json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="POST",
                                     headers={"Content-Type": "application/json",
                                              "User-Agent": "mtc-alerts"})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return int(response.status)


class WebhookSink:
    """POSTs alerts to ``url`` from one daemon thread: ``tries`` attempts each, ``timeout_s``
    per try, backoff doubling from ``backoff_s``; a 2xx is delivered, a 4xx other than 408
    and 429 is not retried. At most ``max_queued`` wait; beyond that the newest is dropped
    with a warning (the reminder sends it again)."""

    def __init__(self, url: str, *, timeout_s: float = 2.0, tries: int = 3,
                 backoff_s: float = 0.5, max_queued: int = 1000, flush_s: float = 5.0,
                 post: Callable[[str, Mapping[str, Any], float], int] = post_json) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"{WEBHOOK_ENV} must be an http(s) URL, got {url!r}")
        self.url = url
        self.timeout_s, self.tries, self.backoff_s = timeout_s, tries, backoff_s
        self.flush_s = flush_s
        self._post = post
        self._queue: queue.Queue[dict[str, Any]] = queue.Queue(max_queued)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.delivered = 0
        self.failed = 0

    def send(self, body: dict[str, Any]) -> None:
        """Queue one alert; returns at once."""
        try:
            self._queue.put_nowait(body)
        except queue.Full:
            log.warning("alert webhook queue full; dropped %s %s", body.get("kind"),
                        body.get("target"))
            return
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="mtc-alert-webhook",
                                                daemon=True)
                self._thread.start()

    def __call__(self, envelope: Envelope, _outcomes: Any = None) -> None:
        """A bus listener: every delivered ``AlertRaised`` goes to the webhook."""
        if isinstance(envelope.event, AlertRaised):
            self.send(payload(envelope))

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait (at most ``timeout_s``, default ``flush_s``) until the queue is empty."""
        deadline = time.monotonic() + (self.flush_s if timeout_s is None else timeout_s)
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)
        return not self._queue.unfinished_tasks

    def _run(self) -> None:
        while True:
            try:
                body = self._queue.get(timeout=1.0)
            except queue.Empty:
                return
            try:
                self._deliver(body)
            finally:
                self._queue.task_done()

    def _deliver(self, body: dict[str, Any]) -> None:
        delay = self.backoff_s
        for attempt in range(1, self.tries + 1):
            try:
                status = self._post(self.url, body, self.timeout_s)
                if 200 <= status < 300:
                    self.delivered += 1
                    return
                error = f"HTTP {status}"
                retry = status in (408, 429) or status >= 500
            except urllib.error.HTTPError as exc:
                error, retry = f"HTTP {exc.code}", exc.code in (408, 429) or exc.code >= 500
            except (OSError, ValueError) as exc:  # refused, timed out, DNS
                error, retry = str(exc), True
            if not retry or attempt == self.tries:
                self.failed += 1
                log.warning("alert webhook %s: %s %s not delivered after %d tries: %s",
                            self.url, body.get("kind"), body.get("target"), attempt, error)
                return
            time.sleep(delay)
            delay *= 2


_sinks: dict[str, WebhookSink] = {}


def webhook_from_env(env: Mapping[str, str] | None = None) -> WebhookSink | None:
    """The process's sink for ``MTC_ALERT_WEBHOOK`` (one per URL, flushed at exit); None
    when unset. Built on first use, never at import."""
    url = (os.environ if env is None else env).get(WEBHOOK_ENV, "").strip()
    if not url:
        return None
    sink = _sinks.get(url)
    if sink is None:
        sink = _sinks[url] = WebhookSink(url)
        atexit.register(sink.flush)
    return sink
