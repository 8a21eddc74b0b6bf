# What the services (not the engine) need: gRPC, protobuf, libpq, Abseil.
find_package(Protobuf REQUIRED)
find_package(gRPC CONFIG REQUIRED)
find_package(absl CONFIG REQUIRED)
find_package(PostgreSQL REQUIRED)
find_program(GRADHUB_GRPC_CPP_PLUGIN grpc_cpp_plugin REQUIRED)
find_package(OpenSSL REQUIRED)
find_package(yaml-cpp REQUIRED)
find_package(ZLIB REQUIRED)
# cpp-httplib for REST: Debian ships it as a shared library described by pkg-config.
find_package(PkgConfig REQUIRED)
pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)
