"""PyTorch's own ``DistributedTest`` cases on the ``symm`` backend, as PyTorch runs them for
gloo (``test/distributed/test_distributed_spawn.py``): a process per rank, spawned, the
process group made from a file store. Imported by ``test_torch_suite.py`` (in the parent and in
every spawned rank) with ``BACKEND=symm`` and ``WORLD_SIZE`` set, since the suite reads both
when it is imported.

symm is declared to the suite's feature sets: as a plugin backend (otherwise the suite finds
no such backend and skips every case) and as one with subgroups."""

from __future__ import annotations

import torch
from torch.testing._internal.common_distributed import DistTestCases
from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend

import symm.torch  # noqa: F401  (registers the backend in every rank process)

DistTestCases.backend_feature["plugin"].add("symm")
DistTestCases.backend_feature["subgroup"].add("symm")

#: The cases run: gloo passes each on CPU tensors. Named, not matched, so that a case renamed
#: or dropped by a later PyTorch fails the count instead of vanishing. Each spawns its ranks
#: anew (about 10 s on two cores), so the list holds one case per collective and variant; the
#: ``*_group`` cases need 8 ranks and are left out. The suite runs its CPU all-to-all cases
#: on MPI only and its object collectives on gloo and nccl by name (not on plugins), so none
#: of those can run here; ``torch_worker.py`` covers them.
CASES = [
    *(f"test_reduce_{op}" for op in ["sum", "product", "min", "max"]),
    "test_reduce_full_group_sum",
    "test_reduce_sum_twice",
    "test_gather_checks",
    "test_gather",
    "test_gather_full_group",
    "test_scatter_checks",
    "test_scatter",
    "test_scatter_full_group",
    "test_send_recv",
    "test_send_recv_with_tag",
    "test_isend",
    "test_irecv",
]


class SymmDistributedTest(TestDistBackend, DistributedTest._DistTestBase):
    """The suite's cases with a process per rank, spawned (as PyTorch's spawn test class)."""

    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()


def main() -> int:
    """Run :data:`CASES`; print what ran, was skipped and failed; 0 when every case ran and
    passed."""
    import sys
    import unittest

    suite = unittest.TestSuite(SymmDistributedTest(name) for name in CASES)
    result = unittest.TextTestRunner(stream=sys.stdout, verbosity=2).run(suite)
    skipped = [test.id() for test, _ in result.skipped]
    print(
        f"symm DistributedTest: ran {result.testsRun} of {len(CASES)}, skipped {len(skipped)}, "
        f"failures {len(result.failures)}, errors {len(result.errors)}",
        flush=True,
    )
    for name in skipped:
        print(f"skipped: {name}", flush=True)
    ok = result.testsRun == len(CASES) and not skipped and result.wasSuccessful()
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
