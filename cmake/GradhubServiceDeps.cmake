# What the services need on top of what a node's programs need (GradhubNodeDeps): libpq and
# cpp-httplib.
set(GRADHUB_NODE_DEPS_REQUIRED ON)
include(GradhubNodeDeps)
find_package(PostgreSQL REQUIRED)
# cpp-httplib for REST: Debian ships it as a shared library described by pkg-config.
find_package(PkgConfig REQUIRED)
pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)
