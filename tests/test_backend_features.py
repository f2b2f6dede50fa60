"""The feature table by backend (kernels/features.py) says what the code does: the docs hold
the same table, doctor prints the column of the backend it finds, and the rows that name a
capability of `Kernel`/`KernelBackend` agree with what each backend's classes implement."""

from __future__ import annotations

from pathlib import Path

from slackinterp.doctor.backend_features import report
from slackinterp.kernels import features
from slackinterp.kernels.backend import Kernel
from slackinterp.kernels.gateway.backend import GatewayBackend, GatewayKernel
from slackinterp.kernels.local.backend import LocalBackend
from slackinterp.kernels.local.kernel import LocalKernel
from tests.conftest import make_settings

DOCS = Path(__file__).resolve().parent.parent / "docs" / "deployment.md"


def row(words: str) -> features.Feature:
    (found,) = [f for f in features.FEATURES if words in f.name]
    return found


def overrides(cls: type, name: str) -> bool:
    """Whether `cls` implements capability `name` itself (not the protocol's no-op)."""
    return getattr(cls, name) is not getattr(Kernel, name)


def test_the_docs_hold_the_same_table() -> None:
    assert features.markdown() in DOCS.read_text(encoding="utf-8")


def test_the_capability_rows_match_the_backends() -> None:
    for name, words in (
        ("hurry", "(`hurry`)"),
        ("take_blocked", "`take_blocked`"),
    ):
        feature = row(words)
        assert overrides(LocalKernel, name) == feature.works(features.LOCAL), name
        assert overrides(GatewayKernel, name) == feature.works(features.GATEWAY), name
    outlive = row("`files_outlive_it`")
    assert outlive.works(features.GATEWAY) is GatewayKernel.files_outlive_it(object())  # type: ignore[arg-type]
    shared = row("`shared_kernels`")
    assert shared.works(features.GATEWAY) is GatewayBackend.shared_kernels
    assert shared.works(features.LOCAL) is LocalBackend.shared_kernels
    # Both backends read a cell's usage; sql() works on both.
    assert overrides(GatewayKernel, "resources") and overrides(LocalKernel, "resources")
    assert row("(`resources`)").works(features.GATEWAY)
    assert row("`sql()`").works(features.GATEWAY) and row("`sql()`").works(features.LOCAL)


def test_doctor_prints_the_column_of_the_backend_it_finds(tmp_path: Path) -> None:
    gateway = report(make_settings(tmp_path, gateway_url="http://127.0.0.1:9"))
    assert "gateway backend" in gateway
    assert "✓ `sql()` and `%%sql`: the kernel's own connection" in gateway
    assert "✓ Network policy" in gateway and "when confined" in gateway
    assert len(gateway.splitlines()) == len(features.FEATURES) + 1
    local = report(make_settings(tmp_path))
    assert "local backend" in local and "✓ Network policy" in local
    assert "✗ Several bot replicas" in local
