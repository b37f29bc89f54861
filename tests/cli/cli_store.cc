// Names the store a CLI test binary runs cli_e2e_test.cc's tests on: built
// into each store's binary with SIMBA_CLI_STORE set (tests/CMakeLists.txt).
#include <string_view>

#ifndef SIMBA_CLI_STORE
#error "SIMBA_CLI_STORE must name the store (\"sqlite\", \"redis\", ...)"
#endif

namespace simba::testing {

std::string_view cli_store_of_this_binary() { return SIMBA_CLI_STORE; }

}  // namespace simba::testing
