"""The calibration gate of validation/collective_accuracy.py, run as a test."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "validation"))

collective_accuracy = pytest.importorskip("collective_accuracy")
DATA = collective_accuracy.load_series.__defaults__[0]


@pytest.mark.skipif(not DATA.exists(), reason="shared calibration data not present")
def test_all_reduce_mape_within_targets():
    rows = collective_accuracy.errors(collective_accuracy.FIT_SERIES)
    assert collective_accuracy.mape(rows) <= collective_accuracy.MAPE_ALL
    assert collective_accuracy.mape(rows, collective_accuracy.LARGE_BYTES) <= collective_accuracy.MAPE_LARGE
