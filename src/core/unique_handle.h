// A C client library's handle owned like any other pointer: freed by the
// library's own function when the owner goes.
//
//   using PgResult = UniqueHandle<PGresult, PQclear>;
//   PgResult result(PQexec(conn, "SELECT 1"));   // PQclear(result) at the end
#ifndef SIMBA_CORE_UNIQUE_HANDLE_H_
#define SIMBA_CORE_UNIQUE_HANDLE_H_

#include <memory>

namespace simba::internal {

template <auto Free>
struct FreeWith {
  template <typename T>
  void operator()(T* handle) const {
    (void)Free(handle);
  }
};

template <typename T, auto Free>
using UniqueHandle = std::unique_ptr<T, FreeWith<Free>>;

}  // namespace simba::internal

#endif  // SIMBA_CORE_UNIQUE_HANDLE_H_
