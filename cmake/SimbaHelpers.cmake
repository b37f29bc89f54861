# Compile settings shared by every Simba target: C++20, warnings (as errors
# when SIMBA_WERROR), the debug information chosen by SIMBA_DEBUG_INFO and the
# sanitizers chosen by SIMBA_SANITIZE. Applied per target; the global
# CMAKE_CXX_FLAGS are never touched.

if(SIMBA_SANITIZE STREQUAL "")
  set(_simba_sanitize_flags "")
elseif(SIMBA_SANITIZE STREQUAL "address,undefined" OR SIMBA_SANITIZE STREQUAL "thread")
  set(_simba_sanitize_flags -fsanitize=${SIMBA_SANITIZE} -fno-omit-frame-pointer)
  if(SIMBA_SANITIZE STREQUAL "address,undefined")
    list(APPEND _simba_sanitize_flags -fno-sanitize-recover=undefined)
  endif()
else()
  message(FATAL_ERROR "SIMBA_SANITIZE must be '', 'address,undefined' or 'thread', not '${SIMBA_SANITIZE}'")
endif()

if(SIMBA_DEBUG_INFO STREQUAL "lines")
  # After the build type's -g on the command line, so it wins.
  set(_simba_debug_flags $<$<CONFIG:RelWithDebInfo>:-g1>)
elseif(SIMBA_DEBUG_INFO STREQUAL "full")
  set(_simba_debug_flags "")
else()
  message(FATAL_ERROR "SIMBA_DEBUG_INFO must be 'lines' or 'full', not '${SIMBA_DEBUG_INFO}'")
endif()

function(simba_target_settings target)
  target_compile_features(${target} PUBLIC cxx_std_20)
  set_target_properties(${target} PROPERTIES CXX_EXTENSIONS OFF)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow
    -Wnon-virtual-dtor -Wold-style-cast -Wcast-align -Woverloaded-virtual
    -Wnull-dereference -Wimplicit-fallthrough)
  if(SIMBA_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
  # GCC 12 at -O3 (Release) reports -Wrestrict on std::string concatenation
  # inside libstdc++ (GCC bug 105329), a false positive we cannot fix.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_GREATER_EQUAL 12
     AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
    target_compile_options(${target} PRIVATE -Wno-restrict)
  endif()
  if(_simba_debug_flags)
    target_compile_options(${target} PRIVATE ${_simba_debug_flags})
  endif()
  if(_simba_sanitize_flags)
    target_compile_options(${target} PRIVATE ${_simba_sanitize_flags})
    target_link_options(${target} PUBLIC ${_simba_sanitize_flags})
  endif()
endfunction()

# simba_add_test(NAME name SOURCES ... LIBS ... LABELS ... [FIXTURES ...])
# One gtest binary; every TEST becomes its own ctest test carrying LABELS.
# FIXTURES names server fixtures (simba_add_server_fixture in
# cmake/SimbaServers.cmake) that every test requires; the tests then get
# SIMBA_TEST_SERVERS_DIR, where those servers' uri files are.
function(simba_add_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "SOURCES;LIBS;LABELS;FIXTURES" ${ARGN})
  add_executable(${T_NAME} ${T_SOURCES})
  simba_target_settings(${T_NAME})
  # Tests assert a pointer is non-null and then dereference it; at -O3 GCC
  # cannot see the assertion and warns. The warning stays on for the library.
  target_compile_options(${T_NAME} PRIVATE -Wno-null-dereference)
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} GTest::gtest GTest::gmock GTest::gtest_main)
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  gtest_discover_tests(${T_NAME}
    TEST_LIST ${T_NAME}_TESTS
    NO_PRETTY_VALUES
    PROPERTIES TIMEOUT ${T_TIMEOUT}
    DISCOVERY_TIMEOUT 60)
  # Labels, fixtures and locks are set by a script of our own that ctest reads
  # after the discovered tests: gtest_discover_tests splits list-valued
  # PROPERTIES, so "unit;sqlite" would reach ctest as the label "unit" alone.
  set(extra_props "")
  set(fixtures ${T_FIXTURES})
  if("cluster" IN_LIST T_LABELS)
    list(APPEND fixtures simba_topology_first)
  endif()
  if(fixtures)
    string(APPEND extra_props " FIXTURES_REQUIRED \"${fixtures}\"")
  endif()
  if(T_FIXTURES)
    string(APPEND extra_props " ENVIRONMENT \"SIMBA_TEST_SERVERS_DIR=${SIMBA_TEST_SERVERS_DIR}\"")
  endif()
  # Tests of a multi-node topology (label cluster: a Redis Cluster of six
  # servers, a ZooKeeper ensemble of three JVMs, ...) take turns: two at once
  # on CI's two cores starved each other (a Redis Cluster test took 40-60 s
  # beside another, 10-15 s alone; a ZooKeeper session took 3 s to move off
  # a paused member beside a second ensemble), while the other job runs the
  # single-server tests. A high COST starts them first (ctest runs tests of
  # equal cost in number order, and with no timings of an earlier run, as
  # in a fresh clone, every cost is equal): numbered last, they left the
  # stage's last ~4 minutes to one job. ctest sorts by COST only within a
  # level of dependencies, and the tests that need a server (a fixture)
  # come a level before those that need none: the no-op fixture
  # simba_topology_first (tests/CMakeLists.txt) puts these on that level.
  if("cluster" IN_LIST T_LABELS)
    string(APPEND extra_props " RESOURCE_LOCK simba_topology COST 1000")
  endif()
  set(labels_file ${CMAKE_CURRENT_BINARY_DIR}/${T_NAME}_labels.cmake)
  # Scale tests measure how much one process gets through a store while the
  # machine is otherwise quiet (1,000 renewals per ttl on two I/O threads): a
  # second store-heavy test beside them on 2 cores makes leases lapse, so
  # they run alone (RUN_SERIAL).
  file(WRITE ${labels_file}
    "if(${T_NAME}_TESTS)\n"
    "  set_tests_properties(\${${T_NAME}_TESTS} PROPERTIES LABELS \"${T_LABELS}\"${extra_props})\n"
    "  foreach(simba_test IN LISTS ${T_NAME}_TESTS)\n"
    "    if(simba_test MATCHES \"ThousandServices|TenThousand\")\n"
    "      set_tests_properties(\${simba_test} PROPERTIES RUN_SERIAL TRUE)\n"
    "    endif()\n"
    "  endforeach()\n"
    "endif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${labels_file})
endfunction()

# simba_add_suite_objects(NAME name SOURCE file [DEFINITIONS ...])
# A conformance suite's TESTs (testing/*_conformance.cc), compiled once for
# every store's test binary to link: an OBJECT library, so its objects go
# into each binary whole and every TEST registers. (Compiled per store, the
# three suites cost CI's cold build minutes of the same work.)
function(simba_add_suite_objects)
  cmake_parse_arguments(S "" "NAME;SOURCE" "DEFINITIONS" ${ARGN})
  add_library(${S_NAME} OBJECT ${S_SOURCE})
  simba_target_settings(${S_NAME})
  target_compile_options(${S_NAME} PRIVATE -Wno-null-dereference)
  target_compile_definitions(${S_NAME} PRIVATE ${S_DEFINITIONS})
  target_link_libraries(${S_NAME} PUBLIC simba simba_testing GTest::gtest GTest::gmock)
endfunction()

# simba_add_unavailable_test(NAME name LABELS labels WHY text)
# A test this machine cannot run (a tool is missing) is still registered: it
# reports Skipped (exit 77) and says what to install, and under CI a skipped
# test fails the run (scripts/test.sh). Nothing is left out silently.
function(simba_add_unavailable_test)
  cmake_parse_arguments(U "" "NAME;LABELS;WHY" "" ${ARGN})
  add_test(NAME ${U_NAME} COMMAND sh -c "echo \"$0\" >&2; exit 77" "${U_NAME}: ${U_WHY}")
  set_tests_properties(${U_NAME} PROPERTIES LABELS "${U_LABELS}" SKIP_RETURN_CODE 77)
endfunction()
