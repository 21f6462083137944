"""Socket calls beyond the suite's programs whose answers must be the kernel's
(progs/calls.py): TCP Fast Open's sendto/sendmsg with MSG_FASTOPEN, which canal
refused with EPIPE; splice(2) between canal sockets and pipes, which read
end-of-file from a canal socket and lost what it wrote into one. The same lines
natively and under canal, short-circuited and through canald."""

import pytest

from canal_harness import serving_canald


@pytest.mark.parametrize("mode", ["shortcut", "no-shortcut"])
def test_calls_answer_as_the_kernel(canal_bin, procs, python, progs, mode):
    argv = [python, progs / "calls.py"]
    native = procs.run(argv, timeout=60, name="calls-native")
    assert native.returncode == 0 and native.stdout.endswith("done\n"), native.describe()
    assert "fastopen sendto -> 15" in native.stdout, native.describe()
    with serving_canald(canal_bin, procs, args=["--no-shortcut"] if mode == "no-shortcut" else []) as d:
        r = d.run(argv, timeout=60, name="calls-canal")
        assert r.returncode == 0, r.describe()
        assert r.stdout == native.stdout, f"natively:\n{native.stdout}\nunder canal ({mode}):\n{r.stdout}"
