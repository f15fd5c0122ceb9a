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
    first, cuda, nccl, rest = ours.split("\n", 3)
    assert first.startswith(f"brigade (Python) {brigade.__version__}: ")
    assert "libbrigade.so" in first
    # What the package carries: the CUDA module (path and architectures, or
    # why not) and the NCCL library; then brigade-info's own output.
    assert cuda.startswith("CUDA module: "), cuda
    assert nccl.startswith("NCCL library"), nccl
    assert rest == theirs
    assert "BRIGADE_PORT" in rest and "BRIGADE_DEBUG_SUBSYS" in rest


def test_nccl_path():
    """--nccl-path prints the NCCL library's path alone, or says why there is
    none (exit 1)."""
    r = subprocess.run([sys.executable, "-m", "brigade.info", "--nccl-path"],
                       capture_output=True, text=True)
    if r.returncode == 0:
        path = r.stdout.strip()
        assert os.path.exists(path) and "nccl" in os.path.basename(path), path
    else:
        assert r.returncode == 1 and "no NCCL-compatible library" in r.stderr, r.stderr


def test_version_and_errors():
    assert brigade.version() == "%d.%d.%d" % brigade._capi.VERSION
    e = brigade.Error(brigade.Status.ERR_TIMEOUT, "rank 1 did not answer", "brg_allreduce")
    assert e.status is brigade.Status.ERR_TIMEOUT and e.message == "rank 1 did not answer"
    assert str(e) == "brg_allreduce: ERR_TIMEOUT: rank 1 did not answer"
    assert isinstance(e, RuntimeError)
