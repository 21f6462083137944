"""splice(2) between canal sockets and pipes (progs/splice.py): without the library's
hook a splice from a canal socket read end-of-file and one into it wrote into its dummy
descriptor, where the bytes were lost. The program's lines — 300,000 bytes each way
hash-checked, the non-blocking cases, the kernel's errors — must be the same natively
and under canal, short-circuited and through canald."""

import pytest

from canal_harness import serving_canald


@pytest.mark.parametrize("mode", ["shortcut", "no-shortcut"])
def test_splice_moves_every_byte_as_natively(canal_bin, procs, python, progs, mode):
    argv = [python, progs / "splice.py"]
    native = procs.run(argv, timeout=60, name="splice-native")
    assert native.returncode == 0 and native.stdout.endswith("done\n"), native.describe()
    assert "300000 bytes intact" in native.stdout, native.describe()
    with serving_canald(canal_bin, procs, args=["--no-shortcut"] if mode == "no-shortcut" else []) as d:
        r = d.run(argv, timeout=60, name="splice-canal")
        assert r.returncode == 0, r.describe()
        assert r.stdout == native.stdout, f"natively:\n{native.stdout}\nunder canal ({mode}):\n{r.stdout}"
