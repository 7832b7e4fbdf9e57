"""Fixtures shared by the test modules at this level."""

from __future__ import annotations

import pytest

import statebound as sb


@pytest.fixture(params=["memory", "sqlite"])
def store(request, tmp_path):
    """A fresh store of each embedded kind: the MemoryStore, and SQLite on a file (closed after).
    A module or class that defines its own ``store`` uses that one instead."""
    if request.param == "memory":
        yield sb.MemoryStore()
    else:
        with sb.SQLiteStore(tmp_path / "store.db") as s:
            yield s


@pytest.fixture
def otel():
    """``(tracer, exporter)``: an OpenTelemetry SDK tracer whose finished spans the in-memory
    exporter keeps (skipped where the SDK is not installed)."""
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("test"), exporter
