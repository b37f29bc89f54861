// Built with nothing but `pkg-config --cflags --libs simba` (install_test.sh).
#include <iostream>

#include "simba/contend_service.h"
#include "simba/locker.h"

int main(int argc, char** argv) {
  const char* uri = argc > 1 ? argv[1] : "memory://pkg-config";
  auto factory = simba::MutexContendServiceFactory::open(uri);
  if (!factory.ok()) {
    std::cerr << factory.status() << "\n";
    return 1;
  }
  auto locker = simba::Locker::create(**factory, "pkg-config-job").value();
  if (auto held = locker->try_acquire(); !held.ok() || !*held) {
    std::cerr << "not acquired\n";
    return 1;
  }
  std::cout << "pkg-config build holds the lock with token " << locker->fencing_token() << "\n";
  return 0;
}
