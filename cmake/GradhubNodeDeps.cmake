# What a node's programs (gradhub-agent, gradhub-trainer) need besides the engine: gRPC and
# protobuf (the agent protocol, the store, checkpoint and telemetry clients), Abseil, OpenSSL
# (TLS, sha256), ISA-L (CRC-32C of checkpoint chunks), yaml-cpp (job specs) and zlib (gzipped
# datasets). No PostgreSQL, no HTTP
# server, no Prometheus: those are the services'.
#
# GRADHUB_NODE_DEPS_REQUIRED on: each one is REQUIRED (the full build). Off (a GPU node's
# build, -DGRADHUB_BUILD_SERVICES=OFF): each is looked for, GRADHUB_BUILD_NODE says whether all
# were found, and the configure step names what is missing and the Debian packages with it.
set(_gradhub_required "")
if(GRADHUB_NODE_DEPS_REQUIRED)
  set(_gradhub_required REQUIRED)
endif()
find_package(Protobuf ${_gradhub_required})
find_package(gRPC CONFIG ${_gradhub_required})
find_package(absl CONFIG ${_gradhub_required})
find_program(GRADHUB_GRPC_CPP_PLUGIN grpc_cpp_plugin ${_gradhub_required})
find_package(OpenSSL ${_gradhub_required})
find_package(yaml-cpp ${_gradhub_required})
find_package(ZLIB ${_gradhub_required})
find_library(GRADHUB_ISAL_LIBRARY isal ${_gradhub_required})
find_path(GRADHUB_ISAL_INCLUDE_DIR isa-l/crc.h ${_gradhub_required})

set(_gradhub_node_missing "")
foreach(_dep Protobuf gRPC absl OpenSSL yaml-cpp ZLIB)
  if(NOT ${_dep}_FOUND)
    list(APPEND _gradhub_node_missing ${_dep})
  endif()
endforeach()
if(NOT GRADHUB_GRPC_CPP_PLUGIN)
  list(APPEND _gradhub_node_missing grpc_cpp_plugin)
endif()
if(NOT GRADHUB_ISAL_LIBRARY OR NOT GRADHUB_ISAL_INCLUDE_DIR)
  list(APPEND _gradhub_node_missing ISA-L)
endif()

if(_gradhub_node_missing)
  set(GRADHUB_BUILD_NODE OFF)
  message(WARNING
    "gradhub: not building gradhub-agent and gradhub-trainer, only the engine: missing "
    "${_gradhub_node_missing}. On Debian or Ubuntu (also a CUDA base image): apt-get install "
    "protobuf-compiler libprotobuf-dev protobuf-compiler-grpc libgrpc++-dev libabsl-dev "
    "libssl-dev libisal-dev libyaml-cpp-dev zlib1g-dev")
else()
  set(GRADHUB_BUILD_NODE ON)
endif()
