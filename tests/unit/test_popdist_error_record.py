"""popdist's excepthook installs only when asked, once (the record itself: tests/parallel)."""

from __future__ import annotations

import sys

import pytest

from popdist import error_record

pytestmark = pytest.mark.unit


def test_install_only_when_asked_and_only_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "excepthook", sys.__excepthook__)
    assert error_record.install_if_asked({}) is False
    assert sys.excepthook is sys.__excepthook__
    assert error_record.install_if_asked({"POPDIST_ERROR_RECORD": "1"}) is True
    assert error_record.install_if_asked({"POPDIST_ERROR_RECORD": "1"}) is True
    assert sys.excepthook is error_record.excepthook
    assert error_record._previous is sys.__excepthook__  # not itself: no loop
