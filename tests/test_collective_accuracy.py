"""The calibration gate of validation/collective_accuracy.py, run as a test."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from validation import collective_accuracy, fit_collectives  # noqa: E402

DATA = collective_accuracy.load_series.__defaults__[0]


@pytest.mark.skipif(not DATA.exists(), reason="shared calibration data not present")
def test_all_reduce_mape_within_targets():
    rows = collective_accuracy.errors(collective_accuracy.FIT_SERIES)
    assert collective_accuracy.mape(rows) <= collective_accuracy.MAPE_ALL
    assert collective_accuracy.mape(rows, collective_accuracy.LARGE_BYTES) <= collective_accuracy.MAPE_LARGE


def test_validation_scripts_leave_no_subpackage_importable_at_top_level():
    # validation/ on sys.path made validation/kernels the top-level `kernels`, which
    # transformers >= 5.25 imports (its hub-kernels integration): config classes then failed.
    assert fit_collectives.PROTOCOLS and collective_accuracy.FIT_SERIES
    assert str(ROOT / "validation") not in [str(Path(p).resolve()) for p in sys.path if p]
    spec = importlib.util.find_spec("kernels")
    assert spec is None or ROOT / "validation" not in Path(spec.origin or "").resolve().parents
