# Real servers for the tests of the server backends, run by ctest fixtures.
#
# simba_add_server_fixture(name [SCRIPT kind] [ARGS redis-server/... args...])
# Adds the ctest tests server_<name>_start (FIXTURES_SETUP <name>) and
# server_<name>_stop (FIXTURES_CLEANUP <name>), labelled <name>, which run
# scripts/servers/<kind>.sh (kind: SCRIPT, default <name>) start|stop on the
# directory
# ${SIMBA_TEST_SERVERS_DIR}/<name> (below). ARGS go to the server after the
# script's own options (so they may override them). A test that needs the
# server says `FIXTURES <name>` to simba_add_test; it finds the server's uri
# in $SIMBA_TEST_SERVERS_DIR/<name>/uri (see testing/test_servers.h).
#
# `ctest -L <name>` runs the fixture with the tests; any other selection that
# includes a test requiring it pulls the start and stop tests in as well.
# Where the shared test servers keep their data: in memory (/dev/shm) when
# the machine has it. The servers stay what they are (fsync on, durable across
# a kill of the process); only the disk under them is RAM. On a shared CI disk
# an fsync now and then stalls for seconds, which lapses the short leases the
# tests hold (a Redis reply timeout, an etcd or ZooKeeper lease lost in a
# 1-2 s window) while nothing is wrong with Simba or the server. One folder
# per build tree, so repeated runs reuse it rather than pile up.
# Benchmarks that measure a store keep their own servers on disk.
if(NOT DEFINED SIMBA_TEST_SERVERS_DIR)
  string(MD5 _simba_build_hash "${PROJECT_BINARY_DIR}")
  string(SUBSTRING "${_simba_build_hash}" 0 12 _simba_build_hash)
  execute_process(COMMAND test -d /dev/shm -a -w /dev/shm RESULT_VARIABLE _simba_no_shm)
  if(_simba_no_shm EQUAL 0)
    set(_simba_servers_default /dev/shm/simba-test-servers-${_simba_build_hash})
  else()
    set(_simba_servers_default ${PROJECT_BINARY_DIR}/test-servers)
  endif()
  set(SIMBA_TEST_SERVERS_DIR ${_simba_servers_default} CACHE PATH
    "Where the tests' shared servers keep their data (default: in /dev/shm)")
endif()

function(simba_add_server_fixture name)
  cmake_parse_arguments(S "" "SCRIPT" "ARGS" ${ARGN})
  if(NOT S_SCRIPT)
    set(S_SCRIPT ${name})
  endif()
  set(script ${PROJECT_SOURCE_DIR}/scripts/servers/${S_SCRIPT}.sh)
  if(NOT EXISTS ${script})
    message(FATAL_ERROR "simba_add_server_fixture(${name}): no ${script}")
  endif()
  set(dir ${SIMBA_TEST_SERVERS_DIR}/${name})
  add_test(NAME server_${name}_start COMMAND bash ${script} start ${dir} ${S_ARGS})
  # The owner is ctest itself (the script's parent): if ctest is interrupted
  # and never runs the cleanup test, the script's watchdog stops the server.
  set_tests_properties(server_${name}_start PROPERTIES
    FIXTURES_SETUP ${name}
    LABELS ${name}
    TIMEOUT 120
    ENVIRONMENT SIMBA_SERVER_OWNER_PID=parent)
  add_test(NAME server_${name}_stop COMMAND bash ${script} stop ${dir})
  set_tests_properties(server_${name}_stop PROPERTIES
    FIXTURES_CLEANUP ${name}
    LABELS ${name}
    TIMEOUT 60)
endfunction()
