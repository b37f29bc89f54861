# Real servers for the tests of the server backends, run by ctest fixtures.
#
# simba_add_server_fixture(name [ARGS redis-server/... args...])
# Adds the ctest tests server_<name>_start (FIXTURES_SETUP <name>) and
# server_<name>_stop (FIXTURES_CLEANUP <name>), labelled <name>, which run
# scripts/servers/<name>.sh start|stop on the directory
# ${PROJECT_BINARY_DIR}/test-servers/<name>. ARGS go to the server after the
# script's own options (so they may override them). A test that needs the
# server says `FIXTURES <name>` to simba_add_test; it finds the server's uri
# in $SIMBA_TEST_SERVERS_DIR/<name>/uri (see testing/test_servers.h).
#
# `ctest -L <name>` runs the fixture with the tests; any other selection that
# includes a test requiring it pulls the start and stop tests in as well.
function(simba_add_server_fixture name)
  cmake_parse_arguments(S "" "" "ARGS" ${ARGN})
  set(script ${PROJECT_SOURCE_DIR}/scripts/servers/${name}.sh)
  if(NOT EXISTS ${script})
    message(FATAL_ERROR "simba_add_server_fixture(${name}): no ${script}")
  endif()
  set(dir ${PROJECT_BINARY_DIR}/test-servers/${name})
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
