# `cmake --install`: the headers, the libraries (static and, with
# SIMBA_BUILD_SHARED, shared), the CMake package (find_package(simba CONFIG))
# and the pkg-config file (pkg-config simba). The CLI, its man page and its
# bash completion are installed by tools/CMakeLists.txt.
#
# Components (for CPack's packages, cmake/SimbaPackaging.cmake):
#   runtime  the simba command, its man page and completion
#   libs     the shared libraries
#   dev      headers, static libraries, .so links, CMake package, simba.pc
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(SIMBA_CMAKE_INSTALL_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/simba)

# simba_values_of_built_backends(<out> "backend=value"...): the values of the
# backends this build has, in the order given (pkg-config modules here,
# Debian packages in SimbaPackaging.cmake).
function(simba_values_of_built_backends out)
  set(values "")
  foreach(pair IN LISTS ARGN)
    string(REPLACE "=" ";" pair "${pair}")
    list(GET pair 0 backend)
    list(GET pair 1 value)
    if(backend IN_LIST SIMBA_BUILTIN_BACKENDS)
      list(APPEND values ${value})
    endif()
  endforeach()
  set(${out} ${values} PARENT_SCOPE)
endfunction()

# Headers: the core's, and each built backend's (a header of a backend not
# built would declare functions no library defines).
set(simba_header_excludes "")
foreach(backend sqlite redis postgres mysql zookeeper etcd)
  if(NOT backend IN_LIST SIMBA_BUILTIN_BACKENDS)
    list(APPEND simba_header_excludes PATTERN "${backend}.h" EXCLUDE PATTERN "${backend}_*.h" EXCLUDE)
  endif()
endforeach()
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/simba
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  COMPONENT dev
  FILES_MATCHING PATTERN "*.h" ${simba_header_excludes})

install(EXPORT simba-static-targets
  NAMESPACE simba::
  DESTINATION ${SIMBA_CMAKE_INSTALL_DIR}
  COMPONENT dev)
if(SIMBA_BUILD_SHARED)
  install(EXPORT simba-shared-targets
    NAMESPACE simba::
    DESTINATION ${SIMBA_CMAKE_INSTALL_DIR}
    COMPONENT dev)
endif()

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/simbaConfig.cmake.in
  ${PROJECT_BINARY_DIR}/package/simbaConfig.cmake
  INSTALL_DESTINATION ${SIMBA_CMAKE_INSTALL_DIR})
# 0.x: a new minor may break the API, so only the same minor is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/package/simbaConfigVersion.cmake
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMinorVersion)
install(FILES
  ${PROJECT_BINARY_DIR}/package/simbaConfig.cmake
  ${PROJECT_BINARY_DIR}/package/simbaConfigVersion.cmake
  ${PROJECT_SOURCE_DIR}/cmake/SimbaDependencies.cmake
  DESTINATION ${SIMBA_CMAKE_INSTALL_DIR}
  COMPONENT dev)

# pkg-config: shared by default; `pkg-config --static` adds what a static
# link needs. Libraries in link order: the umbrella, the backends, the core.
set(SIMBA_PC_LIBS "-lsimba")
set(simba_pc_requires "")
set(simba_pc_private "")
foreach(backend IN LISTS SIMBA_BUILTIN_BACKENDS)
  string(APPEND SIMBA_PC_LIBS " -lsimba_backend_${backend}")
endforeach()
if(SIMBA_WITH_SQLITE OR SIMBA_WITH_POSTGRES OR SIMBA_WITH_MYSQL)
  string(APPEND SIMBA_PC_LIBS " -lsimba_backend_sql")
endif()
string(APPEND SIMBA_PC_LIBS " -lsimba_core")
simba_values_of_built_backends(simba_pc_requires
  "sqlite=sqlite3" "redis=hiredis" "redis=libssl" "postgres=libpq" "mysql=libmariadb" "etcd=grpc++"
  "etcd=protobuf")
if("zookeeper" IN_LIST SIMBA_BUILTIN_BACKENDS)
  list(APPEND simba_pc_private -lzookeeper_mt)  # Debian's client ships no .pc
endif()
list(APPEND simba_pc_private -pthread)
list(JOIN simba_pc_requires ", " SIMBA_PC_REQUIRES_PRIVATE)
list(JOIN simba_pc_private " " SIMBA_PC_LIBS_PRIVATE)
# Relocatable: the prefix is found from where simba.pc lies (pkg-config's
# pcfiledir), so `cmake --install --prefix DIR` and the Debian package (/usr)
# both get a working file.
file(RELATIVE_PATH simba_pc_up "/p/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/p")
string(REGEX REPLACE "/$" "" simba_pc_up "${simba_pc_up}")
set(SIMBA_PC_PREFIX "\${pcfiledir}/${simba_pc_up}")
foreach(dir LIBDIR INCLUDEDIR)
  if(IS_ABSOLUTE "${CMAKE_INSTALL_${dir}}")
    set(SIMBA_PC_${dir} "${CMAKE_INSTALL_${dir}}")
  else()
    set(SIMBA_PC_${dir} "\${prefix}/${CMAKE_INSTALL_${dir}}")
  endif()
endforeach()
configure_file(${PROJECT_SOURCE_DIR}/cmake/simba.pc.in ${PROJECT_BINARY_DIR}/package/simba.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/package/simba.pc
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig
  COMPONENT dev)
