"""The gradhub package where its engine (gradhub._C) cannot load: a node without the build's
extension, or with a torch other than the one it was built against. `import gradhub` and the
standard-library part (report) must keep working; gradhub.distributed must raise ImportError
(EngineUnavailableError) saying why, before the extension is touched.

Each case runs a fresh /usr/bin/python3 on a copy of the built package (the gradhub on this
test's PYTHONPATH, build/python/gradhub) in a temporary directory, altered as the case needs."""

import json
import os
import shutil
import subprocess
import textwrap

import gradhub

PACKAGE = os.path.dirname(gradhub.__file__)
INTERPRETER = "/usr/bin/python3"


def _engine_files(name):
    return name.startswith("_C.") and name.endswith(".so") or name.startswith("_build_info.")


def _copy_without_engine(tmp_path):
    """tmp_path/gradhub: the built package less _C*.so and _build_info.py."""
    target = tmp_path / "gradhub"
    shutil.copytree(PACKAGE, target,
                    ignore=lambda _, names: [n for n in names
                                             if _engine_files(n) or n == "__pycache__"])
    return target


def _python(tmp_path, code):
    """Runs `code` in a fresh interpreter whose only gradhub is tmp_path's; its last stdout
    line is JSON."""
    env = dict(os.environ, PYTHONPATH=str(tmp_path), PYTHONDONTWRITEBYTECODE="1")
    done = subprocess.run([INTERPRETER, "-c", textwrap.dedent(code)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"exit {done.returncode}\nstdout:\n{done.stdout}\n" \
                                 f"stderr:\n{done.stderr}"
    return done.stdout.splitlines()


# What each case's interpreter prints: whether gradhub imported without torch, and what
# `import gradhub.distributed` raised.
_TRY_DISTRIBUTED = """
    import json, sys
    import gradhub
    torch_by_gradhub = "torch" in sys.modules
    gradhub.report(7, 0.5)
    try:
        import gradhub.distributed
        raised = None
    except ImportError as error:
        raised = {"type": type(error).__name__, "message": str(error)}
    try:
        gradhub.DistributedDataParallel
        ddp = None
    except ImportError as error:
        ddp = type(error).__name__
    print(json.dumps({"torch_by_gradhub": torch_by_gradhub, "raised": raised, "ddp": ddp,
                      "c_loaded": "gradhub._C" in sys.modules,
                      "file": gradhub.__file__}))
"""


def test_built_package_has_the_engine():
    # The other cases remove these files from a copy: they must be there to start with.
    names = os.listdir(PACKAGE)
    assert any(n.startswith("_C.") and n.endswith(".so") for n in names), names
    assert "_build_info.py" in names, names


def test_without_engine_gradhub_imports_and_distributed_says_why(tmp_path):
    _copy_without_engine(tmp_path)
    lines = _python(tmp_path, _TRY_DISTRIBUTED)
    result = json.loads(lines[-1])
    assert result["file"].startswith(str(tmp_path))
    assert result["torch_by_gradhub"] is False, "import gradhub must stay standard library only"
    assert lines[0] == '{"event":"progress","step":7,"loss":0.5}'
    assert result["raised"] is not None, "import gradhub.distributed should have failed"
    assert result["raised"]["type"] == "EngineUnavailableError"
    assert "not built here" in result["raised"]["message"]
    assert "_build_info.py" in result["raised"]["message"]
    assert result["ddp"] == "EngineUnavailableError"
    assert result["c_loaded"] is False


def test_engine_built_for_another_torch_is_refused_before_it_loads(tmp_path):
    package = _copy_without_engine(tmp_path)
    (package / "_build_info.py").write_text('TORCH_VERSION = "0.0.1+elsewhere"\n'
                                            "CXX11_ABI = True\n")
    # A stand-in for the extension that leaves a mark if anything imports it.
    marker = tmp_path / "c_was_imported"
    (package / "_C.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    lines = _python(tmp_path, _TRY_DISTRIBUTED)
    result = json.loads(lines[-1])
    message = result["raised"]["message"]
    assert result["raised"]["type"] == "EngineUnavailableError"
    assert "0.0.1+elsewhere" in message, message
    torch_version = subprocess.run([INTERPRETER, "-c", "import torch; print(torch.__version__)"],
                                   capture_output=True, text=True, check=True).stdout.strip()
    assert torch_version in message, message
    assert not marker.exists(), "gradhub._C was imported despite the version mismatch"
    assert result["c_loaded"] is False


def test_engine_unavailable_error_is_an_import_error():
    # Scripts catch ImportError to fall back to torch's DDP.
    from gradhub import _engine
    assert issubclass(_engine.EngineUnavailableError, ImportError)
