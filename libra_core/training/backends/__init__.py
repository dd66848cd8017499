"""Training backends: how one data-parallel replica reduces gradients and steps its optimizer.

`torch` (single process), `ddp` (torch.distributed all-reduce; gloo on CPU, NCCL on GPU) and
`deepspeed` (ZeRO-1/2) share the interface in base.py; registry.py builds one by name
(`training.backend`). Imports are lazy: importing this package does not import torch.
"""
