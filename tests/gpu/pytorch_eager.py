#!/usr/bin/env python3
"""Reference for gpu_check's step: PyTorch eager, same MLP, batch and optimizer on cuda:0."""
import statistics
import time

import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(784, 1024), torch.nn.ReLU(),
                            torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                            torch.nn.Linear(1024, 10)).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
x = torch.randn(64, 784, device="cuda")
y = torch.randint(10, (64,), device="cuda")
times = []
for step in range(200):
    start = time.perf_counter()
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    loss.item()
    times.append(time.perf_counter() - start)
print(f"step_ms {1000 * statistics.median(times[50:]):.4f}")
