"""What every gpushare ``/metrics`` server exports besides its own series.

Each process (extender, device plugin, webhook) owns one ``ExportRegistry``. It differs from
prometheus-client's ``CollectorRegistry`` in two ways:

- ``gpushare_build_info{component, version, python} 1``, so a dashboard can tell which version
  runs where, and a rollout that left old pods behind shows as two versions at once;
- no ``_created`` series. prometheus-client adds one per counter, histogram and summary child
  (the Unix time it was made). Prometheus stores each as a series of its own that nothing here
  queries, doubling the series count of every counter. The client's switch for it
  (``disable_created_metrics``) is process-wide state; dropping the samples in the registry
  keeps the choice with the registry, so tests and processes cannot change one another's output.
  The filter covers both ways a registry is read: a full ``collect`` and the ``name[]``-restricted
  view that prometheus-client's own HTTP server serves (the device plugin's).
"""

from __future__ import annotations

import platform
from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector, RestrictedRegistry

from gpushare import __version__

BUILD_INFO = "gpushare_build_info"

_WITH_CREATED = frozenset({"counter", "histogram", "summary"})
"""Metric types prometheus-client gives a ``_created`` sample."""


def without_created(metric: Metric) -> Metric:
    """The same family without its ``_created`` samples (a copy; the original is untouched)."""
    if metric.type not in _WITH_CREATED:
        return metric
    created = metric.name + "_created"
    copy = Metric(metric.name, metric.documentation, metric.type, metric.unit)
    copy.samples = [s for s in metric.samples if s.name != created]
    return copy


class BuildInfo(Collector):
    """``gpushare_build_info``: always 1, the facts are in the labels."""

    def __init__(self, component: str) -> None:
        self._labels = {
            "component": component,
            "version": __version__,
            "python": platform.python_version(),
        }

    @property
    def labels(self) -> dict[str, str]:
        """The labels the series carries."""
        return dict(self._labels)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            BUILD_INFO,
            "1, labelled with the component, the gpushare version and the Python version",
            labels=list(self._labels),
        )
        family.add_metric(list(self._labels.values()), 1.0)
        yield family


class _RestrictedExport(RestrictedRegistry):
    def collect(self) -> Iterable[Metric]:
        return map(without_created, super().collect())


class ExportRegistry(CollectorRegistry):
    """A registry with the build info and without ``_created`` series; see the module docstring."""

    def __init__(self, component: str) -> None:
        # collectors that compute their families when scraped name no series up front; without
        # this a ``name[]`` query would leave them out entirely
        super().__init__(support_collectors_without_names=True)
        self.build_info = BuildInfo(component)
        self.register(self.build_info)

    def collect(self) -> Iterable[Metric]:
        return map(without_created, super().collect())

    def restricted_registry(self, names: Iterable[str]) -> RestrictedRegistry:
        return _RestrictedExport(names, self)


WATCH_REFUSED_HELP = (
    "1 while the API server refuses this list or watch (reason forbidden: 403, RBAC lacks the "
    "verb; unauthorized: 401; failing: {n} failures in a row); no series while none is"
)


def watch_refused_family(
    name: str,
    refusals: Iterable[tuple[str, str, str]],
    *,
    labels: tuple[tuple[str, str], ...] = (),
    failing_after: int = 5,
) -> GaugeMetricFamily:
    """``name{<labels>, resource, verb, reason} 1`` per refused step (kube.watchhealth), with
    the process's own ``labels`` (the device plugin's ``node``) first."""
    family = GaugeMetricFamily(
        name,
        WATCH_REFUSED_HELP.format(n=failing_after),
        labels=[*(k for k, _ in labels), "resource", "verb", "reason"],
    )
    for resource, verb, reason in refusals:
        family.add_metric([*(v for _, v in labels), resource, verb, reason], 1.0)
    return family
