"""The launch's own inputs: the rendezvous port and a failed start.

A hosted store (merak_exec.launch) holds its port from before any rank starts, so no
other process can take it in between (the EADDRINUSE race of picking a free port and
binding it later); a rank whose start fails says so in one line, without torch's C++
frames; a launcher that binds its own port is retried with a fresh one only when it
lost that port.
"""

import errno
import os
import socket
import sys

import pytest

from merak_exec.launch import STORE_PORT, hosted_store, run_ranks
from support.launches import address_in_use, run_with_fresh_port


def _all_reduce_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    """Rendezvous on ``port``, all-reduce the ranks, write the sum."""
    import torch
    import torch.distributed as dist

    from merak_exec.mesh import init_distributed, loopback_env

    loopback_env(rank, world, port)
    os.environ["MERAK_TIMEOUT_S"] = "30"
    init_distributed(backend="gloo")
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    with open(os.path.join(out_dir, f"rank{rank}"), "w") as f:
        f.write(str(float(t)))
    os._exit(0)


def _start_only_worker(rank: int, world: int, port: int) -> None:
    """Rendezvous on ``port`` (with a short timeout) and stop."""
    from merak_exec.mesh import init_distributed, loopback_env

    loopback_env(rank, world, port)
    os.environ["MERAK_TIMEOUT_S"] = "5"
    init_distributed(backend="gloo")
    os._exit(0)


def test_hosted_store_holds_its_port_until_the_world_ends():
    with hosted_store(2) as env:
        port = int(env["MASTER_PORT"])
        assert env["TORCHELASTIC_USE_AGENT_STORE"] == "True"
        with socket.socket() as s, pytest.raises(OSError) as e:
            s.bind(("127.0.0.1", port))
        assert e.value.errno == errno.EADDRINUSE
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # released with the block


def test_ranks_rendezvous_on_the_hosted_store(tmp_path):
    codes = run_ranks(_all_reduce_worker, 2, (2, STORE_PORT, str(tmp_path)), timeout_s=120)
    assert codes == [0, 0]
    assert [float((tmp_path / f"rank{r}").read_text()) for r in range(2)] == [3.0, 3.0]


def test_a_lost_port_fails_the_start_in_one_line(capfd):
    # the old race, made certain: the port is taken before rank 0 binds it
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        codes = run_ranks(_start_only_worker, 1, (1, squatter.getsockname()[1]),
                          timeout_s=120)
    err = [ln for ln in capfd.readouterr().err.splitlines() if ln.strip()]
    assert codes == [1]
    assert len(err) == 1, err
    assert err[0].startswith("merak_exec.launch: rank 0 failed to start or communicate: ")
    assert address_in_use(err[0]) and "Traceback" not in err[0]


_FAKE_LAUNCHER = """
import sys
log, port, mode = sys.argv[1:]
with open(log, "a") as f:
    f.write(port + "\\n")
tries = len(open(log).read().split())
if mode == "lost-once" and tries == 1:
    sys.exit(print("EADDRINUSE: address already in use", file=sys.stderr) or 1)
sys.exit(0 if mode == "lost-once" else 3)
"""


@pytest.mark.parametrize("mode,code,tries", [("lost-once", 0, 2), ("fails", 3, 1)])
def test_fresh_port_retry_only_when_the_port_was_lost(tmp_path, mode, code, tries):
    log = tmp_path / "ports"
    r = run_with_fresh_port(lambda port: [sys.executable, "-c", _FAKE_LAUNCHER, str(log),
                                          str(port), mode])
    assert r.returncode == code
    assert len(log.read_text().split()) == tries  # retried only after losing the port
