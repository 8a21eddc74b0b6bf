# What the engine needs: libtorch (Debian's CPU build, or a CUDA one through Torch_DIR) and
# Gloo. Found at the top level because imported targets are visible only below the directory
# that finds them, and tests link the engine from a sibling directory.
find_package(Torch REQUIRED)
find_package(Gloo REQUIRED)
