"""A daemon's Prometheus samples, read from the metrics endpoint its log names: memd and modeld log
"<daemon> metrics on http://HOST:PORT/metrics" at start when run with --metrics-port."""

import re
import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def metric_samples(log_text: str, daemon: str) -> list:
    """Every sample the daemon's endpoint serves now (name, labels, value)."""
    url = re.search(rf"{daemon} metrics on (http://\S+/metrics)", log_text).group(1)
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]
