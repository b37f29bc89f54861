// Links only simba::backend_sqlite (and, through it, simba::core): a SQLite
// backend made from its options, under a factory, elects this process.
//   sqlite_only PATH
#include <chrono>
#include <future>
#include <iostream>

#include "simba/backends/sqlite.h"
#include "simba/contend_service.h"
#include "simba/contender.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: sqlite_only PATH\n";
    return 2;
  }
  simba::SqliteOptions options;
  options.path = argv[1];
  auto backend = simba::new_sqlite_backend(options);
  if (!backend.ok()) {
    std::cerr << backend.status() << "\n";
    return 1;
  }
  auto factory = simba::MutexContendServiceFactory::create(*backend);
  if (!factory.ok()) {
    std::cerr << factory.status() << "\n";
    return 1;
  }
  std::promise<std::uint64_t> elected;
  auto contender = simba::make_contender(
      "consumer-leader",
      [&](const simba::MutexState& s) { elected.set_value(s.after.fencing_token); },
      [](const simba::MutexState&) {});
  auto service = (*factory)->create_contend_service(contender);
  if (!service.ok() || !(*service)->start().ok()) {
    std::cerr << "could not start the contend service\n";
    return 1;
  }
  auto token = elected.get_future();
  if (token.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    std::cerr << "not elected within 10 s\n";
    return 1;
  }
  std::cout << "elected with fencing token " << token.get() << "\n";
  return (*service)->stop().ok() ? 0 : 1;
}
