"""torch.distributed with the "symm" backend: a data-parallel step as DDP does it by hand.

    torchrun --nproc-per-node 4 examples/torch/train_step.py

CPU tensors run on symm's host backend (no GPU needed); on GPUs, select each rank's device with
``torch.cuda.set_device(LOCAL_RANK)`` and use CUDA tensors.
"""

import torch
import torch.distributed as dist

import symm.torch  # noqa: F401  (registers the "symm" backend)

dist.init_process_group("symm")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = torch.nn.Linear(16, 4)
for parameter in model.parameters():  # every rank starts from rank 0's weights
    dist.broadcast(parameter.data, src=0)

torch.manual_seed(rank)  # each rank its own batch
inputs, targets = torch.randn(8, 16), torch.randn(8, 4)
torch.nn.functional.mse_loss(model(inputs), targets).backward()
for parameter in model.parameters():  # average the gradients
    dist.all_reduce(parameter.grad, op=dist.ReduceOp.AVG)

checksum = torch.tensor([sum(p.grad.sum().item() for p in model.parameters())])
gathered = torch.empty(world)
dist.all_gather_into_tensor(gathered, checksum)
assert torch.allclose(gathered, gathered[0].expand(world)), gathered  # every rank agrees
dist.barrier()
if rank == 0:
    print(f"{world} ranks agree on the averaged gradients (checksum {gathered[0].item():.6f})")
dist.destroy_process_group()
