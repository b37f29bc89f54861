# `cpack -G DEB` (run in the build directory): three Debian packages, named
# as Debian names its own:
#   simba          the command line, its man page and bash completion
#   libsimba<ABI>  the shared libraries
#   libsimba-dev   headers, static libraries, the CMake package, simba.pc
# Their dependencies on the client libraries (libhiredis0.14, libpq5,
# libmariadb3, libzookeeper-mt2, libsqlite3-0, ...) are computed by
# dpkg-shlibdeps from what the binaries really link; the -dev package names
# the client -dev packages a static link needs. tests/install/deb_test.sh
# checks them.
set(CPACK_PACKAGE_NAME simba)
set(CPACK_PACKAGE_VENDOR "Simba for C++")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
  "distributed mutual exclusion: leader election and locks with leases and fencing tokens")
set(CPACK_PACKAGE_DESCRIPTION
  "Simba for C++ elects a leader among copies of a service and locks by key, with leases, fencing tokens and loss signals, over SQLite, PostgreSQL, MySQL/MariaDB, Redis, ZooKeeper and etcd; one URI picks the store.")
set(SIMBA_PACKAGE_MAINTAINER "Simba for C++ developers <simba@localhost>" CACHE STRING
  "The Maintainer field of the Debian packages")
set(CPACK_PACKAGE_CONTACT "${SIMBA_PACKAGE_MAINTAINER}")
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL runtime libs dev)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_RELEASE 1)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_ENABLE_COMPONENT_DEPENDS ON)
set(CPACK_DEBIAN_PACKAGE_HOMEPAGE "")

set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME simba)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SECTION utils)
set(CPACK_DEBIAN_LIBS_PACKAGE_NAME libsimba${SIMBA_SOVERSION})
set(CPACK_DEBIAN_LIBS_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_DEV_PACKAGE_NAME libsimba-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)

# What a static link (or find_package's find_dependency) needs besides.
simba_values_of_built_backends(simba_dev_depends
  "sqlite=libsqlite3-dev" "redis=libhiredis-dev" "redis=libssl-dev" "postgres=libpq-dev"
  "mysql=libmariadb-dev" "zookeeper=libzookeeper-mt-dev" "etcd=libgrpc++-dev" "etcd=libprotobuf-dev")
list(APPEND simba_dev_depends pkg-config)
list(JOIN simba_dev_depends ", " CPACK_DEBIAN_DEV_PACKAGE_DEPENDS)

include(CPack)
cpack_add_component(runtime DISPLAY_NAME "simba command line"
  DESCRIPTION "The simba command: run or elect a job under a distributed mutex, status, force-release, dashboard")
cpack_add_component(libs DISPLAY_NAME "Simba shared libraries")
cpack_add_component(dev DISPLAY_NAME "Simba development files" DEPENDS libs)
