#!/usr/bin/env python3
"""Checks, when an image is built, that its gradhub package can use its engine (gradhub._C)
under the image's /usr/bin/python3, the interpreter script ranks run:
  1. gradhub/_build_info.py names the torch that _C was built against: its version, C++ ABI
     flag and the real path of the libtorch_cpu it linked (CMake wrote it on the build host,
     after checking that host's python3-torch uses that very file).
  2. The image's torch must be that one: the same version and ABI flag, and its
     torch/lib/libtorch_cpu.so must resolve to the same file (Debian: python3-torch links
     libtorch1.13's /usr/lib/x86_64-linux-gnu/libtorch_cpu.so.1.13; the Dockerfiles pin both
     packages to the build host's versions, this proves the result).
  3. `import gradhub.distributed` loads _C: every symbol resolved against that torch.
Prints one line and exits 0, or names what differs and exits 1.
    PYTHONPATH=/usr/local/python python3 check_engine.py
"""

import os
import sys


def main():
    import torch
    from gradhub import _build_info
    linked = os.path.realpath(os.path.join(os.path.dirname(torch.__file__), "lib",
                                           "libtorch_cpu.so"))
    problems = []
    if _build_info.TORCH_VERSION != torch.__version__:
        problems.append(f"torch version: built against {_build_info.TORCH_VERSION}, "
                        f"the image has {torch.__version__}")
    if _build_info.CXX11_ABI != bool(torch._C._GLIBCXX_USE_CXX11_ABI):
        problems.append(f"CXX11 ABI: built with {int(_build_info.CXX11_ABI)}, "
                        f"the image's torch has {int(torch._C._GLIBCXX_USE_CXX11_ABI)}")
    if _build_info.LIBTORCH != linked:
        problems.append(f"libtorch_cpu: built against {_build_info.LIBTORCH}, "
                        f"the image's torch uses {linked}")
    if problems:
        print("gradhub engine check: FAILED: " + "; ".join(problems), file=sys.stderr)
        return 1
    import gradhub.distributed  # raises EngineUnavailableError saying why it cannot load
    print(f"gradhub engine check: gradhub._C loads under torch {torch.__version__} "
          f"({linked}), NCCL {'yes' if gradhub.distributed._C.HAS_NCCL else 'no'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
