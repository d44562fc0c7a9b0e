"""The primitives every failure path goes through (``bounded``, ``peer_failure``,
``is_comm_failure``): one line, torch's C++ source paths and boilerplate cut, only
communication failures turned into RankTimeoutError (a bug keeps its traceback)."""

import pytest
import torch.distributed as dist

from merak_exec.mesh import RankTimeoutError, bounded, is_comm_failure, peer_failure

GLOO = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection "
        "closed by peer [127.0.0.1]:40578. This is typically caused by a remote worker "
        "crashing. Check the logs of the remote worker before reporting an error\nmore")


def test_a_peer_failure_is_one_line_naming_rank_action_and_peer():
    e = peer_failure("the loss all-reduce over the pipeline", [3], 5.0, RuntimeError(GLOO))
    text = str(e)
    assert isinstance(e, RankTimeoutError) and "\n" not in text
    assert text.startswith("merak_exec: rank ")
    assert " failed in the loss all-reduce over the pipeline with rank 3 " in text
    assert "with rank 3 (timeout 5 s): Connection closed by peer [127.0.0.1]:40578;" in text
    assert "/__w/" not in text and "This is typically" not in text


def test_a_plain_timeout_says_so():
    text = str(peer_failure("x", [1, 2], 2.0, None))
    assert "with ranks 1, 2 (timeout 2 s): timed out;" in text


@pytest.mark.parametrize("error, comm", [
    (dist.DistBackendError("anything"), True),
    (RuntimeError(GLOO), True),
    (RuntimeError("Timed out waiting 3000ms for recv operation to complete"), True),
    (RuntimeError("mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)"), False),
    (RankTimeoutError("merak_exec: rank 0 failed in x"), False),
    (ValueError("Connection closed by peer"), False),
])
def test_only_communication_failures_count(error, comm):
    assert is_comm_failure(error) is comm


def test_bounded_turns_a_lost_peer_into_one_line_and_leaves_bugs_alone():
    with pytest.raises(RankTimeoutError) as e, bounded("saving the checkpoint"):
        raise dist.DistNetworkError(GLOO)
    assert "failed in saving the checkpoint" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(KeyError), bounded("saving the checkpoint"):
        raise KeyError("a bug keeps its traceback")


def test_bounded_sees_through_dcp_checkpoint_exceptions():
    from torch.distributed.checkpoint.api import CheckpointException

    lost = CheckpointException("save", {1: (dist.DistBackendError(GLOO), None)})
    with pytest.raises(RankTimeoutError, match="failed in loading the checkpoint .*: "
                                               "Connection closed by peer") as e, \
            bounded("loading the checkpoint"):
        raise lost
    assert "\n" not in str(e.value)
    other = CheckpointException("save", {1: (OSError("No space left on device"), None)})
    with pytest.raises(CheckpointException), bounded("saving the checkpoint"):
        raise other
