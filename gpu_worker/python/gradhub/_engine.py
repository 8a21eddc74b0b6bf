"""Loads gradhub._C, the C++ engine, or says exactly why it cannot.

The rest of the package (report, checkpoints) is standard library only and imports anywhere;
only gradhub.distributed and gradhub.DistributedDataParallel need the engine. The extension
links the libtorch it was built against, so it loads only under the torch that shares it:
  1. torch is imported first: its libraries (libtorch, libc10) and pybind11 type registry must
     be in the process before _C resolves its symbols against them.
  2. Before _C is touched, the running torch's version and C++ ABI flag are compared with the
     ones it was built against (_build_info.py, written by CMake, which built _C only after
     checking that /usr/bin/python3's torch and the libtorch it links are one build: the same
     library file). A different torch (a pip wheel in a venv, a CUDA build on a GPU node)
     would load with undefined symbols or, worse, load and crash, so that is refused with
     both versions named.
"""

_engine = None


class EngineUnavailableError(ImportError):
    """gradhub._C cannot be used in this interpreter; the message says why."""


def load():
    """The gradhub._C module; EngineUnavailableError naming the reason when it cannot load."""
    global _engine
    if _engine is not None:
        return _engine
    try:
        import torch
    except ImportError as error:
        raise EngineUnavailableError(
            f"gradhub's engine needs torch, which does not import here: {error}") from error
    try:
        from . import _build_info
    except ImportError:
        raise EngineUnavailableError(
            "gradhub's engine (gradhub._C) is not built here: this copy of the gradhub module "
            "has no _build_info.py (make build writes both)") from None
    abi = bool(torch._C._GLIBCXX_USE_CXX11_ABI)
    if _build_info.TORCH_VERSION != torch.__version__ or _build_info.CXX11_ABI != abi:
        raise EngineUnavailableError(
            f"gradhub's engine was built against torch {_build_info.TORCH_VERSION} "
            f"(CXX11 ABI {int(_build_info.CXX11_ABI)}) but this interpreter runs torch "
            f"{torch.__version__} (CXX11 ABI {int(abi)}) from {torch.__file__}")
    try:
        from . import _C
    except ImportError as error:
        raise EngineUnavailableError(
            f"gradhub's engine (gradhub._C) did not load under torch {torch.__version__}: "
            f"{error}. It is built with gradhub (make build) against the libtorch of "
            "/usr/bin/python3's torch; on a node without it the rest of the gradhub module "
            "still works") from error
    _engine = _C
    return _engine
