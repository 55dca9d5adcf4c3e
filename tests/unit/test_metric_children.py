"""app.metrics keeps each label set's child: labels() answers the same child
prometheus_client made, counts land where they did, and remove()/clear()
are honoured (a removed child is not answered again)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from app.metrics import Counter, Gauge, Histogram


def test_labels_answers_the_child_prometheus_made() -> None:
    registry = CollectorRegistry()
    c = Counter("kept_total", "doc", ["route", "status"], registry=registry)
    first = c.labels("/a", "201")
    assert c.labels("/a", "201") is first
    assert c.labels(route="/a", status="201") is first  # keyword labels: the same child
    assert c.labels("/a", 201) is first  # prometheus_client's str() of the values
    first.inc()
    c.labels("/a", "201").inc(2)
    c.labels("/b", "404").inc()
    assert registry.get_sample_value("kept_total", {"route": "/a", "status": "201"}) == 3
    assert registry.get_sample_value("kept_total", {"route": "/b", "status": "404"}) == 1

    c.remove("/a", "201")
    assert registry.get_sample_value("kept_total", {"route": "/a", "status": "201"}) is None
    again = c.labels("/a", "201")
    assert again is not first
    again.inc()
    assert registry.get_sample_value("kept_total", {"route": "/a", "status": "201"}) == 1
    c.clear()
    assert b"kept_total{" not in generate_latest(registry)
    assert c.labels("/a", "201") is not again


def test_gauges_and_histograms_keep_their_children_too() -> None:
    registry = CollectorRegistry()
    g = Gauge("kept_gauge", "doc", ["task"], registry=registry)
    h = Histogram("kept_seconds", "doc", ["wf"], buckets=(0.1, 1), registry=registry)
    assert g.labels("t") is g.labels("t") and h.labels("w") is h.labels("w")
    g.labels("t").set(5)
    h.labels("w").observe(0.5)
    assert registry.get_sample_value("kept_gauge", {"task": "t"}) == 5
    assert registry.get_sample_value("kept_seconds_bucket", {"wf": "w", "le": "1.0"}) == 1
    assert registry.get_sample_value("kept_seconds_bucket", {"wf": "w", "le": "0.1"}) == 0
