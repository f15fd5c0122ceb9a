"""python -m brigade.info prints what brigade-info prints, and the package's
version and error helpers agree with the library."""
import os
import subprocess
import sys

import brigade


def test_info_matches_brigade_info():
    exe = os.environ.get("BRIGADE_INFO")
    if not exe:
        import pytest

        pytest.skip("BRIGADE_INFO is not set (meson test sets it)")
    ours = subprocess.run([sys.executable, "-m", "brigade.info"], capture_output=True,
                          text=True, check=True).stdout
    theirs = subprocess.run([exe], capture_output=True, text=True, check=True).stdout
    first, rest = ours.split("\n", 1)
    assert first.startswith(f"brigade (Python) {brigade.__version__}: ")
    assert "libbrigade.so" in first
    assert rest == theirs
    assert "BRIGADE_PORT" in rest and "BRIGADE_DEBUG_SUBSYS" in rest


def test_version_and_errors():
    assert brigade.version() == "%d.%d.%d" % brigade._capi.VERSION
    e = brigade.Error(brigade.Status.ERR_TIMEOUT, "rank 1 did not answer", "brg_allreduce")
    assert e.status is brigade.Status.ERR_TIMEOUT and e.message == "rank 1 did not answer"
    assert str(e) == "brg_allreduce: ERR_TIMEOUT: rank 1 did not answer"
    assert isinstance(e, RuntimeError)
