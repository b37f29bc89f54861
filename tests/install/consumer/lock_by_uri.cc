// Takes the mutex named on the command line in the store the URI names,
// prints its fencing token, and releases it: what a user's first program does.
//   lock_by_uri URI MUTEX
#include <chrono>
#include <iostream>

#include "simba/contend_service.h"
#include "simba/locker.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: lock_by_uri URI MUTEX\n";
    return 2;
  }
  auto factory = simba::MutexContendServiceFactory::open(argv[1]);
  if (!factory.ok()) {
    std::cerr << factory.status() << "\n";
    return 1;
  }
  auto locker = simba::Locker::create(**factory, argv[2]);
  if (!locker.ok()) {
    std::cerr << locker.status() << "\n";
    return 1;
  }
  if (simba::Status s = (*locker)->acquire(std::chrono::seconds(10)); !s.ok()) {
    std::cerr << s << "\n";
    return 1;
  }
  std::cout << "held " << argv[2] << " with fencing token " << (*locker)->fencing_token() << "\n";
  if (simba::Status s = (*locker)->release(); !s.ok()) {
    std::cerr << s << "\n";
    return 1;
  }
  return 0;
}
