# Compiler settings shared by every target.
if(GRADHUB_USE_CCACHE)
  find_program(GRADHUB_CCACHE ccache)
  if(GRADHUB_CCACHE)
    set(CMAKE_C_COMPILER_LAUNCHER "${GRADHUB_CCACHE}")
    set(CMAKE_CXX_COMPILER_LAUNCHER "${GRADHUB_CCACHE}")
  endif()
endif()

add_compile_options(-Wall -Wextra -Wno-unused-parameter)

# Every component library and binary lands in the same place so tests find the binaries.
set(CMAKE_RUNTIME_OUTPUT_DIRECTORY "${CMAKE_BINARY_DIR}/bin")
