"""The scale bench's count of every client's writes, parsed from the API server's own metrics."""

from __future__ import annotations

from bench.scale_bench import write_counts


def sample(verb: str, resource: str, value: int, *, subresource: str = "", code: str = "200",
           family: str = "apiserver_request_total") -> str:
    """One line as kube-apiserver 1.34 writes it (labels in its order)."""
    return (f'{family}{{code="{code}",component="apiserver",dry_run="",group="",resource="{resource}",'
            f'scope="resource",subresource="{subresource}",verb="{verb}",version="v1"}} {value}')


METRICS = "\n".join([
    "# HELP apiserver_request_total [STABLE] Counter of apiserver requests",
    "# TYPE apiserver_request_total counter",
    sample("POST", "pods", 12, code="201"),
    sample("POST", "pods", 3, code="409"),  # refused as existing: a request all the same
    sample("POST", "pods", 7, subresource="binding", code="201"),
    sample("PATCH", "pods", 5, subresource="status"),
    sample("PUT", "leases", 40),
    sample("LIST", "pods", 9),
    sample("WATCH", "pods", 4),
    sample("DELETE", "pods", 2),
    sample("POST", "pods", 100, family="apiserver_request_total_other"),  # another family, same prefix
]) + "\n"


def test_writes_are_counted_by_verb_and_resource_summed_over_codes_and_reads_left_out() -> None:
    assert write_counts(METRICS) == {
        ("create", "pods"): 15, ("create", "pods/binding"): 7, ("patch", "pods/status"): 5,
        ("update", "leases"): 40, ("delete", "pods"): 2,
    }
