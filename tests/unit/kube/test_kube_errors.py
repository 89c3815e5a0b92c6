"""The HTTP library's errors become gpushare's own (kube.port), whatever the body says."""

from __future__ import annotations

import httpx2
import pytest

from gpushare.kube.lightkube_api import _mapped, _translate
from gpushare.kube.port import (
    Conflict,
    Forbidden,
    Gone,
    KubeError,
    NotFound,
    Unauthorized,
    Unreachable,
)

URL = "https://127.0.0.1:6443/apis/scheduling.alibabacloud.com/v1alpha1/resourcepolicies"


def _status_error(code: int, body: str) -> httpx2.HTTPStatusError:
    request = httpx2.Request("GET", URL)
    response = httpx2.Response(code, text=body, request=request)
    return httpx2.HTTPStatusError(f"HTTP {code}", request=request, response=response)


def test_a_plain_text_404_for_an_absent_crd_is_not_found() -> None:
    """The apiserver answers a group it does not serve with text, not a Status."""
    err = _translate(_status_error(404, "404 page not found\n"), "list resourcepolicies")
    assert isinstance(err, NotFound)
    assert str(err) == "list resourcepolicies: 404 page not found"


@pytest.mark.parametrize(
    ("code", "kind"),
    [(409, Conflict), (410, Gone), (403, Forbidden), (401, Unauthorized), (500, KubeError)],
)
def test_other_plain_answers_map_by_code(code: int, kind: type[KubeError]) -> None:
    err = _translate(_status_error(code, ""), "watch resourcepolicies")
    assert type(err) is kind
    assert "watch resourcepolicies" in str(err)


def test_an_unread_streamed_body_gives_the_reason_phrase() -> None:
    request = httpx2.Request("GET", URL)

    async def chunks():  # type: ignore[no-untyped-def]
        yield b"404 page not found"

    response = httpx2.Response(404, content=chunks(), request=request)
    err = _translate(httpx2.HTTPStatusError("404", request=request, response=response), "watch")
    assert isinstance(err, NotFound) and str(err) == "watch: Not Found"


def test_every_call_maps_through_one_place_and_keeps_the_cause() -> None:
    """The port's callers see gpushare's tree; a person debugging still sees the library's."""

    original = _status_error(409, "")
    with pytest.raises(Conflict) as raised, _mapped("annotate pod a/b"):
        raise original
    assert raised.value.__cause__ is original
    with pytest.raises(Unreachable, match="get node n: ConnectError"), _mapped("get node n"):
        raise httpx2.ConnectError("refused")
    with pytest.raises(ValueError), _mapped("not a library error"):
        raise ValueError("passes through")


def test_no_call_catches_library_errors_by_hand() -> None:
    """One exception map: the try/except per call is gone and stays gone."""
    import inspect

    import gpushare.kube.lightkube_api as module

    source = inspect.getsource(module)
    assert source.count("except _LIBRARY_ERRORS") == 1
    assert "except (ApiError" not in source
