# The client library each backend links, found the same way when Simba is
# built and when a project uses an installed static Simba (simbaConfig.cmake
# includes this file): the imported targets they define are the names the
# static libraries' exported link interfaces refer to.
#
#   simba_find_client_library(<backend> <result-var>)
#
# sets <result-var> to TRUE when the backend's client library was found (or
# it needs none), else to a message naming the Debian package to install.
# Backends: sqlite redis postgres mysql zookeeper etcd (and sql, memory,
# which need nothing).
macro(simba_find_client_library _simba_backend _simba_result)
  set(${_simba_result} TRUE)
  if("${_simba_backend}" STREQUAL "sqlite")
    if(NOT TARGET SQLite::SQLite3)
      find_package(SQLite3 QUIET)
    endif()
    if(NOT TARGET SQLite::SQLite3)
      set(${_simba_result} "SQLite was not found: install the Debian package libsqlite3-dev")
    endif()
  elseif("${_simba_backend}" STREQUAL "redis")
    _simba_find_pkg_config(HIREDIS hiredis libhiredis-dev ${_simba_result})
    # TLS (rediss://) is Simba's own, over OpenSSL (core/net/tls_stream.cc):
    # hiredis 0.14 has none.
    if(${_simba_result} STREQUAL "TRUE")
      if(NOT TARGET OpenSSL::SSL)
        find_package(OpenSSL QUIET)
      endif()
      if(NOT TARGET OpenSSL::SSL)
        set(${_simba_result} "OpenSSL was not found: install the Debian package libssl-dev")
      endif()
    endif()
  elseif("${_simba_backend}" STREQUAL "postgres")
    _simba_find_pkg_config(LIBPQ libpq libpq-dev ${_simba_result})
  elseif("${_simba_backend}" STREQUAL "mysql")
    _simba_find_pkg_config(LIBMARIADB libmariadb libmariadb-dev ${_simba_result})
  elseif("${_simba_backend}" STREQUAL "zookeeper")
    if(NOT TARGET SimbaDeps::zookeeper_mt)
      find_path(SIMBA_ZOOKEEPER_INCLUDE_DIR zookeeper/zookeeper.h)
      find_library(SIMBA_ZOOKEEPER_MT_LIBRARY zookeeper_mt)
      if(SIMBA_ZOOKEEPER_INCLUDE_DIR AND SIMBA_ZOOKEEPER_MT_LIBRARY)
        add_library(SimbaDeps::zookeeper_mt UNKNOWN IMPORTED GLOBAL)
        set_target_properties(SimbaDeps::zookeeper_mt PROPERTIES
          IMPORTED_LOCATION "${SIMBA_ZOOKEEPER_MT_LIBRARY}"
          INTERFACE_INCLUDE_DIRECTORIES "${SIMBA_ZOOKEEPER_INCLUDE_DIR}")
      endif()
    endif()
    if(NOT TARGET SimbaDeps::zookeeper_mt)
      set(${_simba_result}
        "the ZooKeeper C client was not found: install the Debian package libzookeeper-mt-dev")
    endif()
  elseif("${_simba_backend}" STREQUAL "etcd")
    # etcd's gRPC API: protobuf (CMake's FindProtobuf) and gRPC++ (pkg-config).
    if(NOT TARGET protobuf::libprotobuf)
      find_package(Protobuf QUIET)
      if(TARGET protobuf::libprotobuf)
        # Seen by every directory (the tests and the bench link it too).
        set_target_properties(protobuf::libprotobuf PROPERTIES IMPORTED_GLOBAL TRUE)
      endif()
    endif()
    if(NOT TARGET protobuf::libprotobuf)
      set(${_simba_result} "protobuf was not found: install the Debian package libprotobuf-dev")
    else()
      _simba_find_pkg_config(GRPCXX grpc++ libgrpc++-dev ${_simba_result})
    endif()
  endif()
endmacro()

# A library found through pkg-config, as the imported target PkgConfig::<prefix>.
macro(_simba_find_pkg_config _simba_prefix _simba_module _simba_package _simba_result)
  if(NOT TARGET PkgConfig::${_simba_prefix})
    find_package(PkgConfig QUIET)
    if(PkgConfig_FOUND)
      pkg_check_modules(${_simba_prefix} QUIET IMPORTED_TARGET GLOBAL ${_simba_module})
    endif()
  endif()
  if(NOT TARGET PkgConfig::${_simba_prefix})
    set(${_simba_result}
      "${_simba_module} was not found: install the Debian packages pkg-config and ${_simba_package}")
  endif()
endmacro()
