#!/usr/bin/python3
"""Exports the model of deploy/examples/jobs/torchscript-mlp.yaml: an MLP for the 64 features
of scikit-learn's digits, scripted with TorchScript. gradhub-trainer loads it with
torch::jit::load and trains it like a built-in model; its forward takes a batch of inputs and
returns logits.

Usage: export_digits_mlp.py [OUTPUT]   (default: digits-mlp.pt beside this script)
"""
import os
import sys

import torch


class DigitsMlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = torch.nn.Linear(64, 64)
        self.out = torch.nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.hidden(x)))


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    output = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "digits-mlp.pt")
    torch.manual_seed(0)
    model = torch.jit.script(DigitsMlp())
    # Written beside, then renamed: a rank never reads half a file, and two exports at once
    # (two test runs) do not mix.
    partial = "%s.%d.tmp" % (output, os.getpid())
    model.save(partial)
    os.replace(partial, output)
    print(output)


if __name__ == "__main__":
    main()
