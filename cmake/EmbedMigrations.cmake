# cmake -DOUTPUT=file.cc -DFILES="a.sql;b.sql" -P EmbedMigrations.cmake
# Writes BuiltinMigrations() with each file's text as a raw string literal.
set(delimiter "gradhub_sql")
set(body "")
foreach(file IN LISTS FILES)
  get_filename_component(base "${file}" NAME_WE)
  if(NOT base MATCHES "^([0-9][0-9][0-9][0-9])_([a-z0-9_]+)$")
    message(FATAL_ERROR "migration ${file}: name must be NNNN_lowercase_name.sql")
  endif()
  math(EXPR version "${CMAKE_MATCH_1}")
  set(name "${CMAKE_MATCH_2}")
  file(READ "${file}" sql)
  string(FIND "${sql}" ")${delimiter}\"" clash)
  if(NOT clash EQUAL -1)
    message(FATAL_ERROR "migration ${file} contains the embedding delimiter")
  endif()
  string(APPEND body "      {${version}, \"${name}\", R\"${delimiter}(${sql})${delimiter}\"},\n")
endforeach()
file(WRITE "${OUTPUT}.tmp" "// Generated from migrations/*.sql by cmake/EmbedMigrations.cmake.\n"
  "#include \"services/common/db/migrator.h\"\n\n"
  "namespace gradhub::db {\n\n"
  "const std::vector<Migration>& BuiltinMigrations() {\n"
  "  static const std::vector<Migration> migrations = {\n${body}  };\n"
  "  return migrations;\n}\n\n"
  "}  // namespace gradhub::db\n")
file(RENAME "${OUTPUT}.tmp" "${OUTPUT}")
