// The comm layer's one check of MPI return codes: throws trident::Error with
// file:line, the call and MPI's own message. Private to src/comm.
#pragma once
#include <mpi.h>

#include <string>

#include "trident/core/error.hpp"

namespace trident::detail {

inline void mpi_check(int rc, const char* call, const char* file, int line) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw_error(file, line, std::string(call) + " failed: " + std::string(msg, size_t(len)));
}

}  // namespace trident::detail

#define MPI_CHECK(call) ::trident::detail::mpi_check((call), #call, __FILE__, __LINE__)
