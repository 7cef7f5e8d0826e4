"""A daemon's Prometheus samples, read from the metrics endpoint its log names: memd and modeld log
"<daemon> metrics on http://HOST:PORT/metrics" at start when run with --metrics-port."""

import re
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from modeld.engine.metrics import SNAPSHOT_INTERVAL_S


def metric_samples(log_text: str, daemon: str) -> list:
    """Every sample the daemon's endpoint serves now (name, labels, value); modeld's once its front holds a snapshot
    its engine took after this call began (one is sent every SNAPSHOT_INTERVAL_S)."""
    if daemon == "modeld":
        time.sleep(3 * SNAPSHOT_INTERVAL_S)
    url = re.search(rf"{daemon} metrics on (http://\S+/metrics)", log_text).group(1)
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]
